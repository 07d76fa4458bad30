"""Seed 002's replication scenarios on a real 3-broker cluster (R-REP-2..8, R-PROD-2).

Brokers are separate processes (``zookeeper.session.timeout.ms=3000``,
``replica.lag.time.max.ms=3000``: tests/clusterproc.py FAULT_TIMEOUTS) killed with
SIGKILL, paused with SIGSTOP and stopped with SIGTERM; every wait is a poll with a
deadline or a ZooKeeper watch. No automatic preferred-leader rebalance
(tests/cluster/conftest.py BASE_OVERRIDES): every election here is one a test causes.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from headrace.cluster import zk_layout as L
from tests.batches import make_batch
from tests.brokerproc import wait_until
from tests.cluster.test_replication import producer, read_all, segment_bytes
from tests.clusterproc import LAG_TIME_MS, Cluster
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]


def _metadata_view(cluster: Cluster, broker_id: int, topic: str) -> str:
    """Partition 0 of ``topic`` as broker ``broker_id`` answers Metadata for it."""
    try:
        with WireClient.to(cluster.brokers[broker_id].address, timeout_s=10.0) as wc:
            resp = wc.request(3, 9, {"topics": [{"name": topic}],
                                     "allow_auto_topic_creation": False})
        (t,) = resp.topics
        (p,) = [p for p in t.partitions if int(p.partition_index) == 0]
        return (f"leader {p.leader_id} epoch {p.leader_epoch} ISR {list(p.isr_nodes)} "
                f"error {p.error_code}")
    except Exception as e:  # a diagnosis, not the test: say what stopped it
        return f"no answer ({type(e).__name__}: {e})"


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def wire_produce(cluster: Cluster, broker_id: int, topic: str, values: list[bytes],
                 acks: int = -1) -> tuple[int, int]:
    """(error code, base offset) of one Produce v9 of ``values`` to partition 0 of
    ``topic``, sent to broker ``broker_id``."""
    now = int(time.time() * 1000)
    records = make_batch([(None, v, now, []) for v in values])
    # the socket waits longer than the Produce's own timeout: a Produce parked for
    # replication is answered REQUEST_TIMED_OUT by the broker, which the caller sees
    with WireClient.to(cluster.brokers[broker_id].address, timeout_s=30.0) as wc:
        resp = wc.request(0, 9, {"transactional_id": None, "acks": acks, "timeout": 10_000,
                                 "topic_data": [{"name": topic, "partition_data": [
                                     {"index": 0, "records": records}]}]})
    (p,) = resp.responses[0].partition_responses
    return int(p.error_code), int(p.base_offset)


def followers(cluster: Cluster, topic: str, leader: int) -> list[int]:
    return [int(r) for r in cluster.describe(topic)[0].replicas if int(r) != leader]


def _zk_state(cluster: Cluster, topic: str, partition: int = 0) -> tuple[int, list[int]]:
    """(leader, ISR) of a partition as its state znode has it."""
    path = L.state_path(topic, partition)
    leader, _, isr, _ = L.decode_state(path, cluster.zk().get(path)[0])
    return leader, isr


def _create_assigned(cluster: Cluster, topic: str, assignment: list[list[int]]) -> None:
    from confluent_kafka.admin import NewTopic

    admin = cluster.admin()  # referenced until the result is in
    admin.create_topics([NewTopic(topic, num_partitions=len(assignment),
                                 replica_assignment=assignment)])[topic].result(30)


def high_watermark(cluster: Cluster, broker_id: int, topic: str) -> int:
    """ListOffsets v7 latest, read_uncommitted, asked of ``broker_id``: the partition's
    high watermark as its leader has it."""
    with WireClient.to(cluster.brokers[broker_id].address) as wc:
        resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                            "timestamp": -1}]}]})
    (p,) = resp.topics[0].partitions
    assert p.error_code == ErrorCode.none, p
    return int(p.offset)


def produce_acked(cluster: Cluster, topic: str, values: list[bytes]) -> None:
    prod = producer(cluster)
    errors: list[Any] = []
    for v in values:
        prod.produce(topic, v, partition=0,
                     on_delivery=lambda e, m: errors.append(e) if e else None)
    assert prod.flush(60) == 0
    assert errors == []


def test_paused_follower_leaves_isr_and_rejoins(healthy: Cluster) -> None:
    """Seed 002 (ISR): a follower paused with SIGSTOP drops out of the ISR after the lag
    time; acks=all goes on with the other two (min.insync.replicas=2); after SIGCONT it
    catches up and rejoins."""
    cluster = healthy
    topic = _topic("pause")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    leader = cluster.wait_leader(topic, 0)
    f = followers(cluster, topic, leader)[0]
    produce_acked(cluster, topic, [b"before"] * 10)
    cluster.brokers[f].pause()
    t0 = time.monotonic()
    cluster.wait_isr(topic, 0, lambda isr: f not in isr, 30)
    assert time.monotonic() - t0 < 20
    produce_acked(cluster, topic, [b"during"] * 10)
    cluster.brokers[f].resume()
    cluster.wait_isr(topic, 0, lambda isr: isr == {1, 2, 3}, 60)
    produce_acked(cluster, topic, [b"after"] * 10)
    got = read_all(cluster, topic, 1, 30)
    assert got[0] == [b"before"] * 10 + [b"during"] * 10 + [b"after"] * 10


def test_two_of_three_down_refuses_acks_all_and_serves_reads(healthy: Cluster) -> None:
    """Seed 002 (可靠的broker): with two of three brokers down and min.insync.replicas=2,
    acks=all produce gets NOT_ENOUGH_REPLICAS while reads (and acks=1) continue."""
    cluster = healthy
    topic = _topic("minisr")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    leader = cluster.wait_leader(topic, 0)
    produce_acked(cluster, topic, [f"m{i}".encode() for i in range(20)])
    for f in followers(cluster, topic, leader):
        cluster.brokers[f].kill()
    cluster.wait_isr(topic, 0, lambda isr: isr == {leader}, 30)
    code, _ = wire_produce(cluster, leader, topic, [b"refused"])
    assert code == ErrorCode.not_enough_replicas
    code, offset = wire_produce(cluster, leader, topic, [b"acks1"], acks=1)
    assert code == ErrorCode.none and offset == 20
    got = read_all(cluster, topic, 1, 21)
    assert got[0] == [f"m{i}".encode() for i in range(20)] + [b"acks1"]


def _leader_alone_in_isr(cluster: Cluster, topic: str) -> tuple[int, list[int]]:
    """Pause both followers until the leader is alone in the ISR; returns (leader,
    followers), the followers still paused."""
    leader = cluster.wait_leader(topic, 0)
    fs = followers(cluster, topic, leader)
    for f in fs:
        cluster.brokers[f].pause()
    cluster.wait_isr(topic, 0, lambda isr: isr == {leader}, 30)
    return leader, fs


def test_unclean_off_keeps_partition_offline_until_the_leader_returns(healthy: Cluster
                                                                     ) -> None:
    """Seed 002 (unclean election), unclean.leader.election.enable=false: the leader dies
    while it alone is in sync; the partition stays offline rather than elect an
    out-of-sync replica, and when the leader returns nothing acknowledged is lost."""
    cluster = healthy
    topic = _topic("uncleanoff")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "1"})
    produce_acked(cluster, topic, [f"a{i}".encode() for i in range(10)])
    leader, fs = _leader_alone_in_isr(cluster, topic)
    code, _ = wire_produce(cluster, leader, topic, [f"b{i}".encode() for i in range(10)])
    assert code == ErrorCode.none  # acked by the leader alone (min.insync.replicas=1)
    cluster.brokers[leader].kill()
    for f in fs:
        cluster.brokers[f].resume()
    # The controller's verdict, awaited as events rather than watched for a while: once
    # ZooKeeper has the leader gone (its session expired), both followers registered and
    # the partition without a leader (the controller acted on the death), a probe topic
    # with one partition on each follower is created. Its two leaders are elected by a
    # controller that sees both followers alive, and every reconcile decides every
    # partition: that one left this partition offline rather than elect an out-of-sync
    # replica. Nothing later (no broker or topic change) makes it decide again.
    def verdict_due() -> bool:
        ids = {int(x) for x in cluster.zk().get_children(L.BROKER_IDS)}
        return ids == set(fs) and _zk_state(cluster, topic)[0] == -1

    wait_until(verdict_due, 40, 0.1, "the leader's death acted on, both followers back")
    probe = _topic("probe")
    _create_assigned(cluster, probe, [[fs[0]], [fs[1]]])
    for p in (0, 1):
        assert cluster.wait_leader(probe, p, timeout_s=30) == fs[p]
    assert _zk_state(cluster, topic)[0] == -1
    assert cluster.leader(topic, 0) == -1
    cluster.brokers[leader].start()
    assert cluster.wait_leader(topic, 0, timeout_s=40) == leader
    got = read_all(cluster, topic, 1, 20)
    assert got[0] == [f"a{i}".encode() for i in range(10)] + [f"b{i}".encode() for i in range(10)]


def test_unclean_on_elects_an_out_of_sync_replica_and_loses_exactly_its_gap(
        healthy: Cluster) -> None:
    """Seed 002 (unclean election) with unclean.leader.election.enable=true: an
    out-of-sync replica is elected; the records the old leader acknowledged alone are
    exactly what is lost; the old leader returns, truncates them, and every replica's log
    is then byte-identical."""
    cluster = healthy
    topic = _topic("uncleanon")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "1",
                                       "unclean.leader.election.enable": "true"})
    produce_acked(cluster, topic, [f"a{i}".encode() for i in range(10)])
    leader, fs = _leader_alone_in_isr(cluster, topic)
    code, _ = wire_produce(cluster, leader, topic, [f"lost{i}".encode() for i in range(5)])
    assert code == ErrorCode.none
    cluster.brokers[leader].kill()
    for f in fs:
        cluster.brokers[f].resume()
    new = cluster.wait_leader(topic, 0, ok=lambda x: x != leader, timeout_s=40)
    assert new in fs
    produce_acked(cluster, topic, [f"c{i}".encode() for i in range(5)])
    cluster.brokers[leader].start()
    cluster.wait_isr(topic, 0, lambda isr: isr == {1, 2, 3}, 60)
    got = read_all(cluster, topic, 1, 15)
    assert got[0] == [f"a{i}".encode() for i in range(10)] + [f"c{i}".encode() for i in range(5)]

    def identical() -> bool:
        logs = [segment_bytes(b.data_dir, topic, 0) for b in cluster.brokers.values()]
        return all(x == logs[0] for x in logs)

    wait_until(identical, 30, 0.2, "the returned leader to truncate and catch up")


def test_two_quick_failovers_leave_identical_logs(healthy: Cluster) -> None:
    """KIP-101 / KIP-279: two leader failovers in quick succession under acks=1 load;
    afterwards every replica's log is byte-identical (the segments compared) and no
    offset holds two different records."""
    cluster = healthy
    topic = _topic("twofail")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "1"})
    prod = producer(cluster, **{"enable.idempotence": False, "acks": "1"})
    for i in range(200):
        prod.produce(topic, f"x{i}".encode(), partition=0)
    prod.flush(30)
    first = cluster.wait_leader(topic, 0)
    for i in range(200, 400):
        prod.produce(topic, f"x{i}".encode(), partition=0)
    prod.poll(0)
    cluster.brokers[first].kill()
    second = cluster.wait_leader(topic, 0, ok=lambda x: x != first, timeout_s=30)
    for i in range(400, 600):
        prod.produce(topic, f"x{i}".encode(), partition=0)
    prod.poll(0)
    cluster.brokers[second].kill()
    cluster.brokers[first].start()
    cluster.wait_leader(topic, 0, ok=lambda x: x != second, timeout_s=30)
    for i in range(600, 800):
        prod.produce(topic, f"x{i}".encode(), partition=0)
    prod.flush(60)
    cluster.brokers[second].start()
    cluster.wait_isr(topic, 0, lambda isr: isr == {1, 2, 3}, 60)

    def identical() -> bool:
        logs = [segment_bytes(b.data_dir, topic, 0) for b in cluster.brokers.values()]
        return bool(logs[0]) and all(x == logs[0] for x in logs)

    wait_until(identical, 30, 0.2, "byte-identical replicas")
    got = read_all(cluster, topic, 1, 1)
    assert len(got[0]) == len(set(got[0]))  # no record twice (non-idempotent, so retries
    # may duplicate in principle; these batches were each sent once per leader)


def test_controller_failover_and_elections_continue(healthy: Cluster) -> None:
    """R-REP-9: kill -9 the controller: another broker takes over (a higher controller
    epoch in ZooKeeper) and leader elections continue."""
    cluster = healthy
    topic = _topic("ctrl")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    controller = wait_until(lambda: cluster.admin().list_topics(timeout=5).controller_id,
                            10, what="a controller")
    cluster.brokers[controller].kill()
    new_controller = wait_until(
        lambda: (c := cluster.admin().list_topics(timeout=5).controller_id) not in (
            -1, controller) and c, 30, 0.2, "a new controller")
    assert new_controller != controller
    cluster.brokers[controller].start()
    leader = cluster.wait_leader(topic, 0)
    cluster.brokers[leader].kill()
    assert cluster.wait_leader(topic, 0, ok=lambda x: x != leader, timeout_s=30) != leader
    produce_acked(cluster, topic, [b"after-elections"])


def test_session_expiry_fences_the_leader(healthy: Cluster) -> None:
    """A leader paused past the ZooKeeper session timeout is fenced: another replica
    leads; after SIGCONT the old leader answers NOT_LEADER_OR_FOLLOWER, rejoins as a
    follower, and nothing acknowledged is lost."""
    cluster = healthy
    topic = _topic("expire")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    produce_acked(cluster, topic, [f"e{i}".encode() for i in range(10)])
    leader = cluster.wait_leader(topic, 0)
    cluster.brokers[leader].pause()
    new = cluster.wait_leader(topic, 0, ok=lambda x: x != leader, timeout_s=30)
    path = L.state_path(topic, 0)
    zk_leader, new_epoch, _, _ = L.decode_state(path, cluster.zk().get(path)[0])
    produce_acked(cluster, topic, [f"f{i}".encode() for i in range(10)])
    cluster.brokers[leader].resume()
    cluster.wait_isr(topic, 0, lambda isr: isr == {1, 2, 3}, 60)
    t0 = time.monotonic()
    code, _ = wire_produce(cluster, leader, topic, [b"stale"])
    now_leader, now_epoch, now_isr, _ = L.decode_state(path, cluster.zk().get(path)[0])
    # what the resumed broker itself said of the partition, to read a failure by
    seen = (f"answered {ErrorCode(code).name} after {time.monotonic() - t0:.1f} s; "
            f"ZooKeeper: leader {now_leader} epoch {now_epoch} ISR {now_isr} (the pause's "
            f"election: {zk_leader} epoch {new_epoch}); broker {leader}'s Metadata: "
            f"{_metadata_view(cluster, leader, topic)}")
    if now_epoch == new_epoch:
        # the election the pause caused is the last one: the resumed broker must not lead
        assert (zk_leader, now_leader) == (new, new), seen
        assert code == ErrorCode.not_leader_or_follower, seen
    else:
        # a later election (a loaded machine can cost another broker its 3 s session):
        # the resumed broker answers as the state znode's leader of the newest epoch says
        assert now_epoch > new_epoch
        assert code == (ErrorCode.none if now_leader == leader
                        else ErrorCode.not_leader_or_follower), seen

    got = read_all(cluster, topic, 1, 21 if code == ErrorCode.none else 20)
    assert got[0][:20] == ([f"e{i}".encode() for i in range(10)]
                           + [f"f{i}".encode() for i in range(10)])
    assert got[0][20:] == ([b"stale"] if code == ErrorCode.none else [])


def test_controlled_shutdown_moves_leadership_before_exit(healthy: Cluster) -> None:
    """A controlled shutdown (SIGTERM): leadership is moved away while the broker is still
    registered, so the partition never waits for a dead leader. ZooKeeper watches on the
    partition's state and on the registered brokers see, in ZooKeeper's order, the new
    leader before the broker's registration goes (without a controlled shutdown the
    election follows the deregistration, whatever the session timeout)."""
    cluster = healthy
    topic = _topic("ctlshut")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    leader = cluster.wait_leader(topic, 0)
    zk = cluster.zk()
    events: list[str] = []
    watching = True

    @zk.DataWatch(L.state_path(topic, 0))
    def _state(data: bytes | None, stat: Any) -> bool:
        if data:
            events.append(f"leader {L.decode_state('state', data)[0]}")
        return watching

    @zk.ChildrenWatch(L.BROKER_IDS)
    def _ids(children: list[str]) -> bool:
        events.append("registered" if str(leader) in children else "deregistered")
        return watching

    try:
        assert cluster.brokers[leader].stop() == 0
        wait_until(lambda: "deregistered" in events, 10, 0.05, "the broker to deregister")
        new = cluster.wait_leader(topic, 0, ok=lambda x: x != leader, timeout_s=10)
    finally:
        watching = False
    moved = [i for i, e in enumerate(events)
             if e.startswith("leader ") and e not in (f"leader {leader}", "leader -1")]
    assert moved and moved[0] < events.index("deregistered"), events
    assert events[moved[0]] == f"leader {new}"
    assert any("controlled shutdown" in line for line in cluster.brokers[leader].log)
    cluster.brokers[leader].start()


def test_preferred_leader_comes_back(healthy: Cluster) -> None:
    """Preferred leader election: after the preferred replica (first in the assignment)
    restarts and catches up, leadership moves back to it (here on request, as
    ``headrace topics elect-leaders`` does)."""
    cluster = healthy
    topic = _topic("preferred")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    preferred = int(cluster.describe(topic)[0].replicas[0])
    assert cluster.wait_leader(topic, 0) == preferred
    cluster.brokers[preferred].kill()
    cluster.wait_leader(topic, 0, ok=lambda x: x != preferred, timeout_s=30)
    cluster.brokers[preferred].start()
    cluster.wait_isr(topic, 0, lambda isr: preferred in isr, 60)
    out = subprocess.run(
        [sys.executable, "-m", "headrace.cli", "topics", "elect-leaders", "--bootstrap-server",
         cluster.live_bootstrap(), "--topic", topic, "--partition", "0"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"{topic}-0: elected" in out.stdout
    assert cluster.wait_leader(topic, 0, ok=lambda x: x == preferred, timeout_s=30) == preferred


def test_reassignment_moves_a_partition_to_another_broker(healthy: Cluster) -> None:
    """KIP-455 (AlterPartitionReassignments / ListPartitionReassignments): a partition on
    brokers 1,2 moves to 2,3: broker 3 catches up, broker 1's replica is dropped (its
    directory removed), no record is lost and the new replica's log is the leader's."""
    from confluent_kafka.admin import NewTopic

    cluster = healthy
    topic = _topic("reassign")
    admin = cluster.admin()
    new = NewTopic(topic, num_partitions=1, replica_assignment=[[1, 2]])
    admin.create_topics([new])[topic].result(30)
    cluster.wait_leader(topic, 0)
    produce_acked(cluster, topic, [f"r{i}".encode() for i in range(500)])
    out = subprocess.run(
        [sys.executable, "-m", "headrace.cli", "topics", "reassign", "--bootstrap-server",
         cluster.live_bootstrap(), "--topic", topic, "--partition", "0", "--replicas", "2,3"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr

    def moved() -> bool:
        p = cluster.describe(topic).get(0)
        return p is not None and list(p.replicas) == [2, 3] and sorted(p.isrs) == [2, 3]

    wait_until(moved, 60, 0.2, "the reassignment to finish")
    listing = subprocess.run(
        [sys.executable, "-m", "headrace.cli", "topics", "reassignments",
         "--bootstrap-server", cluster.live_bootstrap()],
        capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and "No reassignment in progress." in listing.stdout
    wait_until(lambda: not (cluster.brokers[1].data_dir / f"{topic}-0").exists(), 30, 0.2,
               "broker 1 to drop its replica")
    produce_acked(cluster, topic, [b"after"])
    got = read_all(cluster, topic, 1, 501)
    assert got[0] == [f"r{i}".encode() for i in range(500)] + [b"after"]
    wait_until(lambda: segment_bytes(cluster.brokers[3].data_dir, topic, 0)
               == segment_bytes(cluster.brokers[2].data_dir, topic, 0), 30, 0.2,
               "broker 3's replica to equal broker 2's")
    # a cancel with nothing in progress is refused, as Kafka does
    cancel = subprocess.run(
        [sys.executable, "-m", "headrace.cli", "topics", "reassign", "--bootstrap-server",
         cluster.live_bootstrap(), "--topic", topic, "--partition", "0", "--cancel"],
        capture_output=True, text=True, timeout=60)
    assert cancel.returncode == 1 and "NO_REASSIGNMENT_IN_PROGRESS" in cancel.stderr


def _fetch_as(cluster: Cluster, broker_id: int, replica_id: int, topic: str,
              offset: int) -> int:
    """The error code of a Fetch v12 of partition 0 at ``offset`` claiming to come from
    replica ``replica_id``."""
    with WireClient.to(cluster.brokers[broker_id].address) as wc:
        resp = wc.request(1, 12, {
            "replica_id": replica_id, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""})
    (p,) = resp.responses[0].partitions
    return int(p.error_code)


def test_fetch_as_a_non_replica_cannot_move_the_high_watermark(healthy: Cluster) -> None:
    """A client claiming a replica id that is not one of the partition's replicas gets
    NOT_LEADER_OR_FOLLOWER and cannot make the leader count unreplicated records as
    committed (R-REP-4). A follower is paused (still in the ISR) and 3 records are
    produced with acks=1, so the high watermark stays below the log end; a Fetch at the
    log end as replica 99 leaves it where it was (ListOffsets latest = the high
    watermark), and it moves once the real follower replicates."""
    cluster = healthy
    topic = _topic("spoof")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "1"})
    produce_acked(cluster, topic, [b"committed"] * 5)
    leader = cluster.wait_leader(topic, 0)
    lagging = followers(cluster, topic, leader)[0]
    for _attempt in range(3):
        cluster.wait_isr(topic, 0, lambda isr: isr == {1, 2, 3}, 60)
        committed = high_watermark(cluster, leader, topic)
        cluster.brokers[lagging].pause()
        try:
            code, base = wire_produce(cluster, leader, topic, [b"unreplicated"] * 3, acks=1)
            assert code == ErrorCode.none
            log_end = base + 3
            before = high_watermark(cluster, leader, topic)
            spoofed = _fetch_as(cluster, leader, 99, topic, log_end)
            after = high_watermark(cluster, leader, topic)
            # conclusive only if the paused follower was in the ISR throughout: the leader
            # drops it (and may then advance the high watermark) only after ZooKeeper
            # has the smaller ISR, so it still being there now means it was before
            conclusive = lagging in _zk_state(cluster, topic)[1]
        finally:
            cluster.brokers[lagging].resume()
        if conclusive:
            break
    else:
        pytest.fail(f"the paused follower left the ISR (after {LAG_TIME_MS} ms) before the "
                    "checks ended, three times")
    assert before == committed < log_end
    assert spoofed == ErrorCode.not_leader_or_follower
    assert after == committed, "a non-replica's fetch moved the high watermark"
    wait_until(lambda: high_watermark(cluster, leader, topic) == log_end, 30, 0.05,
               "the high watermark to reach the log end once the follower replicates")


def test_produce_requests_pipeline_on_one_connection(healthy: Cluster) -> None:
    """Consecutive acks=all Produce requests on one connection are applied in order at
    once and wait for replication side by side (librdkafka sends one partition per
    request: served one at a time, a connection would write one partition per
    replication round trip); responses still come back in request order."""
    import select
    import struct

    from confluent_kafka import Consumer, TopicPartition

    cluster = healthy
    slow = _topic("pipe-rf3")
    fast = _topic("pipe-rf1")
    cluster.create_topic(slow, 1, 3)
    cluster.create_topic(fast, 3, 1)
    leader = cluster.wait_leader(slow, 0)
    cluster.wait_isr(slow, 0, lambda isr: isr == {1, 2, 3})
    fast_leaders = {p: cluster.wait_leader(fast, p) for p in range(3)}
    q = next(p for p, b in fast_leaders.items() if b == leader)
    f = followers(cluster, slow, leader)[0]
    now = int(time.time() * 1000)

    def produce(topic: str, partition: int, value: bytes) -> bytes:
        return wc.encode(0, 9, {"transactional_id": None, "acks": -1, "timeout": 30_000,
                                "topic_data": [{"name": topic, "partition_data": [
                                    {"index": partition,
                                     "records": make_batch([(None, value, now, [])])}]}]})

    watcher = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "pipe-watch"})
    cluster.brokers[f].pause()  # the RF 3 write now waits until f leaves the ISR
    try:
        with WireClient.to(cluster.brokers[leader].address, timeout_s=60) as wc:
            wc.send_raw(produce(slow, 0, b"waits") + produce(fast, q, b"behind it"))
            first, second = wc.correlation_id - 1, wc.correlation_id
            # the second request was applied while the first still waits for replication
            wait_until(lambda: watcher.get_watermark_offsets(
                TopicPartition(fast, q), timeout=2)[1] == 1, 3.0,
                what="the second Produce to be applied")
            readable, _, _ = select.select([wc.sock], [], [], 0)
            assert not readable, "a response came back before the first write replicated"
            cluster.brokers[f].resume()
            got = []
            for _ in range(2):
                frame = wc.recv_frame()
                (cid,) = struct.unpack(">i", frame[:4])
                got.append(cid)
            assert got == [first, second]
    finally:
        if cluster.brokers[f].paused:
            cluster.brokers[f].resume()
        watcher.close()
    assert read_all(cluster, slow, 1, 1)[0] == [b"waits"]


def _list_offsets(cluster: Cluster, broker_id: int, topic: str, partitions: int
                  ) -> dict[int, tuple[int, int]]:
    """ListOffsets v7 latest (the high watermark), read_uncommitted, asked of
    ``broker_id``: partition -> (error code, offset)."""
    with WireClient.to(cluster.brokers[broker_id].address, timeout_s=5) as wc:
        resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [
                {"partition_index": p, "current_leader_epoch": -1, "timestamp": -1}
                for p in range(partitions)]}]})
    return {int(p.partition_index): (int(p.error_code), int(p.offset))
            for p in resp.topics[0].partitions}


def _leader_epochs(cluster: Cluster, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """partition -> (leader, leader epoch) as the state znodes have them."""
    out = {}
    for p in range(partitions):
        path = L.state_path(topic, p)
        leader, epoch, _, _ = L.decode_state(path, cluster.zk().get(path)[0])
        out[p] = (leader, epoch)
    return out


def test_a_restarted_leader_never_serves_a_lower_high_watermark(healthy: Cluster) -> None:
    """Issue 21 (the simulation's ``reread_leads``, seed 27, on real processes): a leader
    is killed -9 and restarted at once while no controller has handled it (the test holds
    ``/controller``: a controller that is slow or gone). The restarted broker reads state
    znodes that still name it leader at the epoch its earlier process led; leading from
    that re-read would serve the high watermark of its checkpoint, below what it answered
    before in the same epoch. It waits instead (NOT_LEADER_OR_FOLLOWER) until a controller
    handles its new registration (a broker epoch newer than the states: Kafka's bounced
    broker) and gives each partition it led a new leader epoch. No ListOffsets answered by
    it, before or after, shows a high watermark below one it answered before."""
    from kazoo.exceptions import NoNodeError

    cluster = healthy
    topic = _topic("bounce")
    parts = 3
    ids = sorted(cluster.brokers)
    controller = wait_until(lambda: cluster.admin().list_topics(timeout=5).controller_id,
                            10, what="a controller")
    leader = next(b for b in ids if b != controller)
    others = [b for b in ids if b != leader]
    _create_assigned(cluster, topic, [[leader, *others]] * parts)
    for p in range(parts):
        cluster.wait_isr(topic, p, lambda isr: isr == set(ids), 30)
    prod = producer(cluster)
    for i in range(200):
        prod.produce(topic, f"v{i}".encode(), partition=i % parts)
    assert prod.flush(60) == 0
    before = _list_offsets(cluster, leader, topic, parts)
    assert all(code == ErrorCode.none and hw > 0 for code, hw in before.values()), before
    epochs_before = _leader_epochs(cluster, topic, parts)
    assert {ld for ld, _ in epochs_before.values()} == {leader}
    # no controller acts from here: the test's own session holds /controller (swapped in
    # one transaction, so no broker campaigns in between); the followers are paused (a
    # follower's fetch would lift a wrongly served high watermark at once)
    zk = cluster.zk()
    _, stat = zk.get(L.CONTROLLER)
    t = zk.transaction()
    t.delete(L.CONTROLLER, version=stat.version)
    t.create(L.CONTROLLER, L.encode_controller(99, int(time.time() * 1000)), ephemeral=True)
    assert not any(isinstance(r, Exception) for r in t.commit())
    released = False
    try:
        for b in others:
            cluster.brokers[b].pause()
        cluster.brokers[leader].kill()
        cluster.brokers[leader].start()  # registered (the old session expired): listening
        seen: list[tuple[int, int, int]] = []  # (partition, error, offset) answered
        deadline = time.monotonic() + LAG_TIME_MS / 1000 + 2
        while time.monotonic() < deadline:
            for p, (code, off) in _list_offsets(cluster, leader, topic, parts).items():
                seen.append((p, code, off))
            time.sleep(0.05)
        lower = [(p, off) for p, code, off in seen
                 if code == ErrorCode.none and off < before[p][1]]
        assert lower == [], (f"broker {leader} led from a re-read: high watermarks "
                             f"{sorted(set(lower))} "
                             f"below {before}")
        assert {code for _, code, _ in seen} == {ErrorCode.not_leader_or_follower}, seen
        # a controller again: it sees the restarted broker's registration newer than the
        # states naming it leader and gives each partition a new leader epoch
        with contextlib.suppress(NoNodeError):
            zk.delete(L.CONTROLLER)
        released = True
        for b in others:
            cluster.brokers[b].resume()
    finally:
        if not released:
            with contextlib.suppress(Exception):
                zk.delete(L.CONTROLLER)
            for b in others:
                if cluster.brokers[b].paused:
                    cluster.brokers[b].resume()
    wait_until(lambda: all(ld > 0 and e > epochs_before[p][1] for p, (ld, e) in
                           _leader_epochs(cluster, topic, parts).items()),
               60, 0.2, "a new leader epoch for every partition the restarted broker led")

    def served() -> bool:
        now = _leader_epochs(cluster, topic, parts)
        for p, (ld, _) in now.items():
            code, off = _list_offsets(cluster, ld, topic, parts)[p]
            if code != ErrorCode.none:
                return False
            assert off >= before[p][1], (p, off, before)
        return True

    wait_until(served, 60, 0.2, "every partition served by its new leader")
