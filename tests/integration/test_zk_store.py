"""``ZkMetadataStore`` against a real ZooKeeper (R-REP-9): registration, the cache kept by
watches, conditional ISR writes, controller fencing, producer id blocks, chroot, session
expiry."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import pytest
from kazoo.client import KazooClient

from headrace.cluster import zk_layout as L
from headrace.cluster.zk_store import ControllerMovedError, TopicExistsError, ZkMetadataStore
from headrace.cluster.zookeeper_server import ZooKeeperServer
from headrace.config import BrokerConfig
from headrace.metadata.store import BrokerInfo, MetadataError, PartitionState
from tests.zk import Recorder, chroot, zookeeper  # noqa: F401

pytestmark = pytest.mark.timeout(60)



def make_store(connect: str, node_id: int, session_ms: int = 4000) -> ZkMetadataStore:
    cfg = BrokerConfig.from_mapping({"zookeeper.connect": connect, "broker.id": node_id,
                                     "zookeeper.session.timeout.ms": session_ms,
                                     "zookeeper.connection.timeout.ms": 5000})
    return ZkMetadataStore(cfg, BrokerInfo(node_id, "127.0.0.1", 9000 + node_id),
                           asyncio.get_running_loop())


async def until(pred: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not (v := pred()):
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)
    return v


@pytest.fixture
async def pair(zookeeper: ZooKeeperServer) -> AsyncIterator[tuple[ZkMetadataStore, ...]]:  # noqa: F811
    connect = chroot(zookeeper)
    a, b = make_store(connect, 1), make_store(connect, 2)
    await a.start()
    await b.start()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


async def test_registration_and_topics_seen_through_watches(pair: tuple[ZkMetadataStore, ...]
                                                            ) -> None:
    a, b = pair
    rec = Recorder()
    b.add_listener(rec)
    await until(lambda: [x.node_id for x in a.live_brokers()] == [1, 2])
    assert a.cluster_id == b.cluster_id and len(a.cluster_id) == 22
    tid = uuid.uuid4()
    await asyncio.to_thread(a.create_topic_znodes, "t", [[1, 2], [2, 1]], {"retention.ms": "9"},
                            tid)
    t = await until(lambda: b.topic("t"))
    assert t.topic_id == tid and [p.replicas for p in t.partitions] == [[1, 2], [2, 1]]
    assert t.configs == {"retention.ms": "9"} and t.partitions[0].leader == -1
    assert b.topic_by_id(tid) is t
    assert ("topic_changed", "t") in rec.events
    with pytest.raises(TopicExistsError):
        await asyncio.to_thread(a.create_topic_znodes, "t", [[1]], {}, uuid.uuid4())

    # controller: elected, writes states fenced by its epoch
    won = await asyncio.to_thread(a.elect_controller, 1)
    assert won is not None and await asyncio.to_thread(b.elect_controller, 2) is None
    epoch, version = won
    states = [("t", 0, PartitionState([1, 2], 1, 0, [1, 2])),
              ("t", 1, PartitionState([2, 1], 2, 0, [2, 1]))]
    assert await asyncio.to_thread(a.write_partition_states, states, epoch, version) == [0, 0]
    await until(lambda: b.topic("t").partitions[1].leader == 2)  # type: ignore[union-attr]
    assert await until(lambda: b.controller_id() == 1) == 1

    # a leader's conditional ISR change; a stale version loses
    st = b.topic("t").partitions[0]  # type: ignore[union-attr]
    from dataclasses import replace

    v = await asyncio.to_thread(b.update_isr, "t", 0, replace(st, isr=[1]))
    assert v == st.zk_version + 1
    assert await asyncio.to_thread(b.update_isr, "t", 0, replace(st, isr=[2])) is None
    await until(lambda: a.topic("t").partitions[0].isr == [1])  # type: ignore[union-attr]

    # another controller takes over: the first one's writes are refused
    await asyncio.to_thread(a.resign_controller, 1)
    won2 = await asyncio.to_thread(b.elect_controller, 2)
    assert won2 is not None and won2[0] == epoch + 1
    st = a.topic("t").partitions[0]  # type: ignore[union-attr]
    with pytest.raises(ControllerMovedError):
        await asyncio.to_thread(a.write_partition_states, [("t", 0, st)], epoch, version)

    # deletion
    await asyncio.to_thread(b.delete_topic_znodes, "t", won2[1])
    await until(lambda: a.topic("t") is None)
    await until(lambda: ("topic_deleted", "t") in rec.events)


async def test_leaders_isr_changes_go_many_to_a_transaction(
        pair: tuple[ZkMetadataStore, ...]) -> None:
    """``update_isrs`` (the broker's ISR writer, Kafka's AlterPartitionManager): changes of
    many partitions in one transaction with one notification naming them all, which the
    other store's cache applies; a batch with one stale version is done again one by one,
    so the others still land and only the stale one loses (None)."""
    from headrace.cluster import zk_store

    a, b = pair
    n = zk_store.STATE_WRITE_BATCH + 5  # two transactions
    await asyncio.to_thread(a.create_topic_znodes, "many", [[1, 2]] * n, {}, uuid.uuid4())
    epoch, version = await asyncio.to_thread(a.elect_controller, 1)  # type: ignore[misc]
    states = [("many", i, PartitionState([1, 2], 1, 0, [1, 2])) for i in range(n)]
    assert await asyncio.to_thread(a.write_partition_states, states, epoch, version) == [0] * n
    await until(lambda: (t := b.topic("many")) and all(p.leader == 1 for p in t.partitions))
    zk = a._c()
    before = len(zk.get_children(L.STATE_CHANGES))
    parts = b.topic("many").partitions  # type: ignore[union-attr]
    items = [("many", i, replace(parts[i], isr=[1])) for i in range(n)]
    assert await asyncio.to_thread(b.update_isrs, items) == [1] * n
    assert len(zk.get_children(L.STATE_CHANGES)) - before == 2  # one per transaction
    await until(lambda: all(p.isr == [1] for p in a.topic("many").partitions))  # type: ignore[union-attr]

    # partition 3 changed meanwhile: its write loses, the others of its batch land
    parts = a.topic("many").partitions  # type: ignore[union-attr]
    stale = replace(parts[3], isr=[1, 2], zk_version=parts[3].zk_version - 1)
    items = [("many", i, replace(parts[i], isr=[1, 2])) for i in range(n)]
    items[3] = ("many", 3, stale)
    out = await asyncio.to_thread(b.update_isrs, items)
    assert out[3] is None and out[:3] + out[4:] == [2] * (n - 1)
    got = await until(lambda: (t := a.topic("many")) and all(
        p.zk_version == (1 if i == 3 else 2) for i, p in enumerate(t.partitions)) and t)
    assert [p.isr for p in got.partitions] == [[1, 2]] * 3 + [[1]] + [[1, 2]] * (n - 4)


async def test_the_controllers_creations_go_many_to_a_transaction(
        pair: tuple[ZkMetadataStore, ...]) -> None:
    """New partitions' states (the controller's creations) go STATE_WRITE_BATCH to a
    transaction with one notification, as its updates do: a topic of 1,000 partitions is
    10 notifications for every broker to list and read, not 1,000. A batch that finds a
    partition's node already there (left by an earlier attempt) is done again one by one,
    and every state is still created."""
    from headrace.cluster import zk_store

    a, b = pair
    n = zk_store.STATE_WRITE_BATCH + 5  # two transactions
    await asyncio.to_thread(a.create_topic_znodes, "born", [[1, 2]] * n, {}, uuid.uuid4())
    await asyncio.to_thread(a.create_topic_znodes, "half", [[1, 2]] * n, {}, uuid.uuid4())
    epoch, version = await asyncio.to_thread(a.elect_controller, 1)  # type: ignore[misc]
    zk = a._c()
    before = len(zk.get_children(L.STATE_CHANGES))
    states = [("born", i, PartitionState([1, 2], 1, 0, [1, 2])) for i in range(n)]
    assert await asyncio.to_thread(a.write_partition_states, states, epoch, version) == [0] * n
    assert len(zk.get_children(L.STATE_CHANGES)) - before == 2  # one per transaction
    await until(lambda: (t := b.topic("born")) and all(
        p.leader == 1 and p.isr == [1, 2] and p.zk_version == 0 for p in t.partitions))

    # an earlier attempt left partition 7's node (not its state): its batch of 100 is
    # refused whole and done one by one; the other batch is still one transaction
    zk.ensure_path(L.partition_path("half", 7))
    before = len(zk.get_children(L.STATE_CHANGES))
    states = [("half", i, PartitionState([1, 2], 2, 0, [2, 1])) for i in range(n)]
    assert await asyncio.to_thread(a.write_partition_states, states, epoch, version) == [0] * n
    assert len(zk.get_children(L.STATE_CHANGES)) - before == 1 + zk_store.STATE_WRITE_BATCH
    await until(lambda: (t := b.topic("half")) and all(p.leader == 2 for p in t.partitions))


async def test_producer_id_blocks_never_overlap(pair: tuple[ZkMetadataStore, ...]) -> None:
    a, b = pair
    firsts = await asyncio.gather(*[asyncio.to_thread(s.allocate_producer_ids, 1000)
                                    for s in (a, b, a, b, a, b)])
    blocks = sorted(firsts)
    assert all(y - x >= 1000 for x, y in itertools.pairwise(blocks))


async def test_stale_registration_is_waited_out_and_a_live_one_refused(
        zookeeper: ZooKeeperServer) -> None:  # noqa: F811
    connect = chroot(zookeeper)
    a = make_store(connect, 1, session_ms=2000)
    await a.start()
    # a live broker holds id 1: a second one waits for the node, then gives up
    dup = make_store(connect, 1, session_ms=2000)
    with pytest.raises(MetadataError):
        await dup.start()
    dup.close()
    a.close()
    # a broker killed with -9 leaves its ephemeral node until its session expires: a
    # restarted broker with the same id waits that out and registers
    hosts, root = connect.split("/", 1)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from kazoo.client import KazooClient\n"
        f"c = KazooClient(hosts='{hosts}/{root}', timeout=2.0); c.start()\n"
        f"c.create('{L.broker_path(1)}', b'{{}}', ephemeral=True)\n"
        "print('ok', flush=True); time.sleep(600)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        holder.kill()
        holder.wait(5)
        again = make_store(connect, 1, session_ms=2000)
        await asyncio.wait_for(again.start(), 20)
        assert [x.node_id for x in again.live_brokers()] == [1]
        again.close()
    finally:
        if holder.poll() is None:
            holder.kill()


async def test_session_expiry_is_reported_and_recovered(zookeeper: ZooKeeperServer  # noqa: F811
                                                        ) -> None:
    connect = chroot(zookeeper)
    s = make_store(connect, 5, session_ms=2000)
    rec = Recorder()
    s.add_listener(rec)
    await s.start()
    try:
        await asyncio.to_thread(s.create_topic_znodes, "x", [[5]], {}, uuid.uuid4())
        await until(lambda: s.topic("x"))
        # the standard trick: a second client on the same session, closed, expires it
        assert s.client is not None
        sid, pwd = s.client.client_id
        hosts, root = connect.split("/", 1)
        other = KazooClient(hosts=hosts + "/" + root, client_id=(sid, pwd))
        await asyncio.to_thread(other.start)
        await asyncio.to_thread(other.stop)
        await until(lambda: ("session_lost", None) in rec.events, 15)
        await until(lambda: ("session_restored", None) in rec.events, 15)
        # registered again, cache intact and watching
        check = KazooClient(hosts=hosts + "/" + root)
        await asyncio.to_thread(check.start)
        try:
            assert await asyncio.to_thread(check.exists, L.broker_path(5)) is not None
            await asyncio.to_thread(check.create, L.topic_path("y"),
                                    L.encode_topic(uuid.uuid4(), {0: [5]}))
        finally:
            await asyncio.to_thread(check.stop)
        await until(lambda: s.topic("y"))
        assert s.topic("x") is not None
    finally:
        s.close()


async def test_new_states_of_a_deleted_topic_do_not_bring_its_znode_back(
        pair: tuple[ZkMetadataStore, ...]) -> None:
    """A controller whose cache still had a deleted topic wrote its partitions as new, and the
    recursive create of their parent brought back /brokers/topics/T with no data (every
    broker then logged 'not JSON' for good). Now nothing is written and the write says so."""
    a, _ = pair
    await asyncio.to_thread(a.create_topic_znodes, "gone", [[1]], {}, uuid.uuid4())
    won = await asyncio.to_thread(a.elect_controller, 1)
    assert won is not None
    epoch, version = won
    await asyncio.to_thread(a.delete_topic_znodes, "gone", version)
    states = [("gone", 0, PartitionState([1], 1, 0, [1]))]
    assert await asyncio.to_thread(a.write_partition_states, states, epoch, version) == [None]
    assert a.client is not None
    assert await asyncio.to_thread(a.client.exists, L.topic_path("gone")) is None


async def test_states_arrive_by_notification_and_a_reader_behind_the_purge_reads_all(
        pair: tuple[ZkMetadataStore, ...], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 21, defect 5: no store watches a partition state znode; every state write (the
    controller's, a leader's ISR change) creates its notification in the same transaction,
    and stores follow them with one child watch. Notifications are removed past the newest
    STATE_CHANGES_KEPT; a store that had not read one removed meanwhile reads every state
    again instead of missing it."""
    import headrace.cluster.zk_store as zs

    a, b = pair
    caplog.set_level("INFO", logger="headrace.zookeeper")
    monkeypatch.setattr(zs, "STATE_CHANGES_KEPT", 3)
    monkeypatch.setattr(zs, "STATE_CHANGES_PURGE_EVERY", 1)
    await asyncio.to_thread(a.create_topic_znodes, "n", [[1, 2]] * 4, {}, uuid.uuid4())
    await until(lambda: b.topic("n"))
    won = await asyncio.to_thread(a.elect_controller, 1)
    assert won is not None
    epoch, version = won
    versions = []
    for p in range(4):  # one at a time: four notifications (together they would share one)
        versions += await asyncio.to_thread(
            a.write_partition_states, [("n", p, PartitionState([1, 2], 1, 0, [1, 2]))],
            epoch, version)
    assert versions == [0] * 4
    await until(lambda: all(p.leader == 1 for p in b.topic("n").partitions))  # type: ignore[union-attr]
    assert b.client is not None
    # stores watch the notifications' parent, never a state znode
    client = b.client

    def watched() -> list[str]:
        return [p for p, w in [*client._data_watchers.items(),
                               *client._child_watchers.items()] if w]

    # (a one-shot watch: re-armed by the read that follows its firing)
    await until(lambda: [p for p in watched() if p.endswith(L.STATE_CHANGES)])
    assert not [p for p in watched() if "/partitions/" in p], watched()
    kept = await asyncio.to_thread(b.client.get_children, L.STATE_CHANGES)
    assert len(kept) == 3  # the oldest removed

    # b stops reading notifications (its watch callback does nothing) while more states
    # are written and older notifications removed; when it reads again it reads all. The
    # switch waits for a read already under way in b's worker (swapping the method alone
    # let one started before it read the new states: loaded CI run 63)
    real = b._read_state_changes
    gate = threading.Lock()
    reading = [True]

    def gated() -> list[tuple[str, Any]]:
        with gate:
            if reading[0]:
                return real()
            b._children(L.STATE_CHANGES, "state_changes")  # re-arm only
            return []

    def switch(on: bool) -> None:
        with gate:
            reading[0] = on

    b._read_state_changes = gated  # type: ignore[method-assign]
    await asyncio.to_thread(switch, False)
    try:
        for p in range(4):
            # the version the write answered, not a's cache: a learns of its own writes by
            # the notifications too, and had not yet (loaded CI run 123: None, BadVersion)
            new = PartitionState([1, 2], 2, 1, [2, 1], 1, epoch, versions[p])
            assert (await asyncio.to_thread(a.write_partition_states, [("n", p, new)], epoch,
                                            version))[0] is not None
        await until(lambda: a.topic("n").partitions[3].leader == 2)  # type: ignore[union-attr]
        assert b.topic("n").partitions[0].leader == 1  # type: ignore[union-attr]
    finally:
        await asyncio.to_thread(switch, True)
    await until(lambda: all(p.leader == 2 for p in a.topic("n").partitions))  # type: ignore[union-attr]
    st = a.topic("n").partitions[0]  # type: ignore[union-attr]
    assert await asyncio.to_thread(a.update_isr, "n", 0, replace(st, isr=[2])) is not None
    await until(lambda: [(p.leader, p.isr) for p in b.topic("n").partitions]  # type: ignore[union-attr]
                == [(2, [2])] + [(2, [2, 1])] * 3)
    assert "reading every partition state again" in caplog.text


async def test_added_partitions_keep_the_znodes_replicas_and_wait_for_reassignments(
        pair: tuple[ZkMetadataStore, ...]) -> None:
    """CreatePartitions' write appends the new partitions to the topic znode as it is in
    ZooKeeper: a cache's older replicas for the existing partitions (a reassignment the
    controller just wrote) are not written back; and while a partition is being
    reassigned the topic cannot grow (Kafka's REASSIGNMENT_IN_PROGRESS)."""
    from headrace.cluster.zk_store import ReassignmentInProgressError

    a, b = pair
    won = await asyncio.to_thread(a.elect_controller, 1)
    assert won is not None
    await asyncio.to_thread(a.create_topic_znodes, "g", [[1, 2]], {}, uuid.uuid4())
    await until(lambda: b.topic("g"))
    # the controller starts a reassignment of g-0 to [2, 3]: RS [2, 3, 1]
    await asyncio.to_thread(a.write_topic_assignment, "g", {0: [2, 3, 1]}, {0: [3]},
                            {0: [1]}, won[1])
    with pytest.raises(ReassignmentInProgressError):
        await asyncio.to_thread(b.add_partition_znodes, "g", [[1, 2], [2, 1]])
    # completed: g-0 is [2, 3]; a broker whose cache still says [1, 2] adds g-1
    await asyncio.to_thread(a.write_topic_assignment, "g", {0: [2, 3]}, {}, {}, won[1])
    await asyncio.to_thread(b.add_partition_znodes, "g", [[1, 2], [2, 1]])
    t = await until(lambda: (t := a.topic("g")) is not None and len(t.partitions) == 2 and t)
    assert [p.replicas for p in t.partitions] == [[2, 3], [2, 1]]
    assert a.reassignments() == {}
