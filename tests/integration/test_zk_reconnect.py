"""``ZkMetadataStore`` keeps following ZooKeeper across connection losses (issue 21, defect 4).

kazoo does not implement ZooKeeper's SetWatches: when its connection drops, even for a
moment and with the session kept, every watch is gone (the server drops a connection's
watches with the connection; kazoo clears its own and fires each with a NONE event). The
store must then read everything again, re-arming every watch, and tell its listeners what
changed meanwhile as ordinary change notifications; after an expired session it must
register again (``session_lost`` then ``session_restored``).

The store under test talks to a real ZooKeeper through a TCP proxy (``tests/tcpproxy.py``)
whose connections the test closes (a blip: kazoo reconnects through it with the same
session) or refuses for longer than the session timeout (an expiry). Another store, straight
to ZooKeeper, plays the controller and writes what the first one must see.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from kazoo.client import KazooState
from kazoo.handlers.threading import KazooTimeoutError

from headrace.cluster.zk_store import ZkMetadataStore
from headrace.cluster.zookeeper_server import ZooKeeperServer
from headrace.config import BrokerConfig
from headrace.metadata.store import BrokerInfo, PartitionState
from tests.tcpproxy import TcpProxy
from tests.zk import Recorder, zookeeper  # noqa: F401

pytestmark = pytest.mark.timeout(90)



def make_store(connect: str, node_id: int, session_ms: int) -> ZkMetadataStore:
    cfg = BrokerConfig.from_mapping({"zookeeper.connect": connect, "broker.id": node_id,
                                     "zookeeper.session.timeout.ms": session_ms,
                                     "zookeeper.connection.timeout.ms": 5000})
    return ZkMetadataStore(cfg, BrokerInfo(node_id, "127.0.0.1", 9000 + node_id),
                           asyncio.get_running_loop())


async def until(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not (v := pred()):
        assert loop.time() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.02)
    return v


@dataclass
class Rig:
    store: ZkMetadataStore  # broker 1, through the proxy
    controller: ZkMetadataStore  # broker 2, straight to ZooKeeper
    proxy: TcpProxy
    rec: Recorder
    connect: str  # ZooKeeper's connect string with the chroot (direct)
    epoch: int = 0
    epoch_version: int = 0

    def session_id(self) -> int:
        assert self.store.client is not None
        return int(self.store.client.client_id[0])

    async def session_when_connected(self) -> int:
        """``session_id`` once the store is connected again: kazoo has no client id while
        it reconnects, and a store can be at the newest state and still reconnecting after
        the last cut (CI, loaded: the assertion below read None)."""
        await until(lambda: self.store.client is not None
                    and self.store.client.client_id is not None, 10,
                    "the store's connection back")
        return self.session_id()

    def state(self, topic: str, p: int = 0) -> PartitionState:
        t = self.store.topic(topic)
        assert t is not None
        return t.partitions[p]

    async def write_state(self, topic: str, p: int, leader: int, leader_epoch: int,
                          isr: list[int]) -> None:
        """The controller's fenced write of one partition state (its current version)."""
        t = self.controller.topic(topic)
        assert t is not None
        st = t.partitions[p]
        new = PartitionState(list(st.replicas), leader, leader_epoch, isr, leader_epoch,
                             self.epoch, st.zk_version)
        result = await asyncio.to_thread(self.controller.write_partition_states,
                                         [(topic, p, new)], self.epoch, self.epoch_version)
        assert result[0] is not None, "the test's own write lost a race"
        await until(lambda: self.controller.topic(topic) is not None
                    and self.controller.topic(topic).partitions[p].leader_epoch  # type: ignore[union-attr]
                    == leader_epoch, 10, "the controller's own cache")

    async def controller_at(self, topic: str, parts: int, leader_epoch: int) -> None:
        """The controller's cache shows every partition of ``topic`` at ``leader_epoch``."""
        def done() -> bool:
            t = self.controller.topic(topic)
            return t is not None and all(t.partitions[p].leader_epoch == leader_epoch
                                         for p in range(parts))
        await until(done, 10, f"the controller's cache of {topic} at epoch {leader_epoch}")

    async def reconnected(self, accepted_before: int) -> None:
        """The store's client is connected again, through a new proxy connection."""
        await until(lambda: self.proxy.accepted > accepted_before and self.store.client
                    is not None and self.store.client.state == KazooState.CONNECTED,
                    15, "kazoo to reconnect through the proxy")


@pytest.fixture
async def rig(zookeeper: ZooKeeperServer) -> AsyncIterator[Rig]:  # noqa: F811
    root = f"/t-{uuid.uuid4().hex[:10]}"
    proxy = TcpProxy("127.0.0.1", zookeeper.port)
    store = make_store(proxy.address + root, 1, session_ms=4000)
    controller = make_store(zookeeper.connect_string + root, 2, session_ms=4000)
    rec = Recorder()
    store.add_listener(rec)
    try:
        await store.start()
        await controller.start()
        rig = Rig(store, controller, proxy, rec, zookeeper.connect_string + root)
        won = await asyncio.to_thread(controller.elect_controller, 2)
        assert won is not None
        rig.epoch, rig.epoch_version = won
        await asyncio.to_thread(controller.create_topic_znodes, "t", [[1, 2]], {},
                                uuid.uuid4())
        await until(lambda: controller.topic("t"), 10, "topic t (controller)")
        new = PartitionState([1, 2], 2, 0, [2, 1], 0, rig.epoch, -1)
        await asyncio.to_thread(controller.write_partition_states, [("t", 0, new)],
                                rig.epoch, rig.epoch_version)
        await until(lambda: store.topic("t") and rig.state("t").leader == 2, 10,
                    "the first state of t")
        # the controller's own cache too: its next write is conditional on the version
        # it holds (still -1, a create, when its notification comes after the store's)
        await until(lambda: (t := controller.topic("t")) is not None
                    and t.partitions[0].zk_version >= 0, 10, "the first state of t (controller)")
        await until(lambda: store.controller_id() == 2, 10, "the controller")
        yield rig
    finally:
        store.close()
        controller.close()
        proxy.close()


async def test_a_blip_keeps_the_session_and_every_watch(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """A connection drop shorter than the session timeout: afterwards a new leader, a new
    ISR, a new topic, a new broker and a new controller all reach the cache, as ordinary
    change notifications (the broker was never fenced)."""
    caplog.set_level(logging.INFO, logger="headrace.zookeeper")
    session = rig.session_id()
    before = rig.proxy.accepted
    assert rig.proxy.cut() >= 1
    await rig.reconnected(before)
    assert await rig.session_when_connected() == session, "the blip expired the session"
    rig.rec.events.clear()

    await rig.write_state("t", 0, leader=1, leader_epoch=1, isr=[1])
    await asyncio.to_thread(rig.controller.create_topic_znodes, "u", [[1]], {}, uuid.uuid4())
    third = make_store(rig.connect, 3, session_ms=4000)
    await third.start()
    try:
        await until(lambda: rig.state("t").leader == 1 and rig.state("t").isr == [1], 5,
                    "the new leader and ISR of t after the blip")
        await until(lambda: rig.store.topic("u"), 5, "topic u created after the blip")
        await until(lambda: rig.store.broker(3), 5, "broker 3 registered after the blip")
        await asyncio.to_thread(rig.controller.resign_controller, 2)
        await until(lambda: rig.store.controller_id() == -1, 5, "the controller resigning")
    finally:
        third.close()
    await until(lambda: rig.store.broker(3) is None, 5, "broker 3 gone")
    assert ("topic_changed", "t") in rig.rec.events
    assert ("topic_changed", "u") in rig.rec.events
    assert ("brokers_changed", None) in rig.rec.events
    assert ("controller_changed", -1) in rig.rec.events
    assert ("session_lost", None) not in rig.rec.events
    assert ("session_restored", None) not in rig.rec.events
    assert await rig.session_when_connected() == session
    # the registration survived the blip, untouched
    assert rig.controller.broker(1) is not None


async def test_what_changed_during_a_blip_is_told_once_after_it(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """Changes made while the store's connection is down (no watch can fire) reach it
    after the reconnect, each topic told as changed, with one log line per reconnect."""
    caplog.set_level(logging.INFO, logger="headrace.zookeeper")
    session = rig.session_id()
    rig.proxy.refuse()  # down, but far shorter than the session timeout
    try:
        await until(lambda: rig.store.client is not None
                    and rig.store.client.state == KazooState.SUSPENDED, 5, "SUSPENDED")
        rig.rec.events.clear()
        await rig.write_state("t", 0, leader=1, leader_epoch=1, isr=[1, 2])
        await asyncio.to_thread(rig.controller.create_topic_znodes, "v", [[1, 2]], {},
                                uuid.uuid4())
        await until(lambda: rig.controller.topic("v"), 5, "topic v (controller)")
        before = rig.proxy.accepted
    finally:
        rig.proxy.admit()
    await rig.reconnected(before)
    assert await rig.session_when_connected() == session
    await until(lambda: rig.state("t").leader == 1, 5, "the leader elected during the blip")
    await until(lambda: rig.store.topic("v"), 5, "the topic created during the blip")
    # and the watches are armed again: a change after the reconnect arrives too
    await rig.write_state("t", 0, leader=2, leader_epoch=2, isr=[2, 1])
    await until(lambda: rig.state("t").leader == 2, 5, "a leader elected after the blip")
    assert rig.rec.events.count(("topic_changed", "v")) >= 1
    assert ("session_restored", None) not in rig.rec.events
    resyncs = [r for r in caplog.records if "with the same session" in r.getMessage()]
    assert len(resyncs) == 1, [r.getMessage() for r in resyncs]


async def test_blips_racing_the_writes_never_leave_a_path_unwatched(rig: Rig) -> None:
    """Cut the connection again and again while the controller writes, so that watch
    events, reads and re-reads meet the disconnects at every point: the store always ends
    at the newest state and keeps following it."""
    session = rig.session_id()
    parts = 40
    await asyncio.to_thread(rig.controller.create_topic_znodes, "w",
                            [[1, 2]] * parts, {}, uuid.uuid4())
    await until(lambda: rig.controller.topic("w"), 10, "topic w (controller)")
    first = [("w", p, PartitionState([1, 2], 2, 0, [2, 1], 0, rig.epoch, -1))
             for p in range(parts)]
    await asyncio.to_thread(rig.controller.write_partition_states, first, rig.epoch,
                            rig.epoch_version)
    for round_ in range(1, 9):
        await rig.controller_at("w", parts, round_ - 1)
        t = rig.controller.topic("w")
        assert t is not None
        updates = [("w", p, PartitionState([1, 2], 1 + round_ % 2, round_, [1, 2], round_,
                                           rig.epoch, t.partitions[p].zk_version))
                   for p in range(parts)]
        write = asyncio.ensure_future(asyncio.to_thread(
            rig.controller.write_partition_states, updates, rig.epoch, rig.epoch_version))
        await asyncio.sleep(0.005 * round_)  # the cut lands at a different point each time
        rig.proxy.cut()
        assert all(r is not None for r in await write)
    await until(lambda: rig.store.topic("w") is not None and all(
        rig.state("w", p).leader_epoch == 8 for p in range(parts)), 10,
        "every partition of w at its newest state")
    assert await rig.session_when_connected() == session
    # still following: one more change to every partition
    await rig.controller_at("w", parts, 8)
    t = rig.controller.topic("w")
    assert t is not None
    updates = [("w", p, PartitionState([1, 2], 2, 9, [2], 9, rig.epoch,
                                       t.partitions[p].zk_version)) for p in range(parts)]
    await asyncio.to_thread(rig.controller.write_partition_states, updates, rig.epoch,
                            rig.epoch_version)
    await until(lambda: all(rig.state("w", p).leader_epoch == 9 for p in range(parts)), 5,
                "every partition of w following after the blips")


async def test_an_expired_session_registers_again_and_follows(rig: Rig) -> None:
    """An outage longer than the session timeout: the session expires, the registration
    vanishes and the controller elects another leader meanwhile; after the heal the store
    reports ``session_lost`` then ``session_restored``, is registered again, has the new
    state, and its watches are armed (a later change arrives)."""
    session = rig.session_id()
    rig.proxy.refuse()
    try:
        await until(lambda: rig.controller.broker(1) is None, 15,
                    "broker 1's registration to expire")
        await rig.write_state("t", 0, leader=2, leader_epoch=1, isr=[2])
        before = rig.proxy.accepted
    finally:
        rig.proxy.admit()
    await rig.reconnected(before)
    await until(lambda: ("session_restored", None) in rig.rec.events, 10, "session_restored")
    events = [e for e, _ in rig.rec.events]
    assert events.index("session_lost") < events.index("session_restored")
    assert await rig.session_when_connected() != session
    await until(lambda: rig.controller.broker(1), 10, "broker 1 registered again")
    assert rig.state("t").leader_epoch == 1
    await rig.write_state("t", 0, leader=1, leader_epoch=2, isr=[2, 1])
    await until(lambda: rig.state("t").leader == 1, 5, "a change after the new session")
    await asyncio.to_thread(rig.controller.create_topic_znodes, "x", [[1]], {}, uuid.uuid4())
    await until(lambda: rig.store.topic("x"), 5, "a topic created after the new session")



async def test_a_read_that_fails_is_read_again_not_forgotten(rig: Rig) -> None:
    """A read that fails without a disconnect (a slow server: kazoo's timeout) is retried
    until it succeeds; nothing it was to read is taken as watched meanwhile."""
    assert rig.store.client is not None
    client = rig.store.client
    real = client.get_async
    failed: list[str] = []

    def flaky(path: str, watch: Any = None) -> Any:
        if "/y/partitions/" in path and not failed:
            failed.append(path)
            raise KazooTimeoutError("injected: the server is slow")
        return real(path, watch=watch)

    client.get_async = flaky
    try:
        await asyncio.to_thread(rig.controller.create_topic_znodes, "y", [[1, 2], [2, 1]], {},
                                uuid.uuid4())
        await until(lambda: failed, 5, "the injected failure")
        await until(lambda: rig.store.topic("y"), 5, "topic y despite the failed read")
        await until(lambda: rig.controller.topic("y"), 5, "topic y (controller)")
        states = [("y", p, PartitionState([1, 2], 2, 0, [2, 1], 0, rig.epoch, -1))
                  for p in range(2)]
        await asyncio.to_thread(rig.controller.write_partition_states, states, rig.epoch,
                                rig.epoch_version)
        await until(lambda: all(rig.state("y", p).leader == 2 for p in range(2)), 5,
                    "the states of y")
        # the controller's own cache too, as the fixture waits for t's: its write below is
        # conditional on the version it holds (a loaded run lost this race)
        await until(lambda: (t := rig.controller.topic("y")) is not None and all(
            t.partitions[p].leader == 2 and t.partitions[p].zk_version >= 0
            for p in range(2)), 5, "the states of y (controller)")
        await rig.write_state("y", 1, leader=1, leader_epoch=1, isr=[1])
        await until(lambda: rig.state("y", 1).leader == 1, 5, "a later change of y-1")
    finally:
        client.get_async = real
