"""Two rules of ``ZkMetadataStore`` (R-REP-9) on an in-memory ZooKeeper: fast twins of
tests/integration/test_zk_store.py, which runs them on a real ZooKeeper JVM.

- Producer id blocks never overlap: a block is taken with a conditional write of
  ``/latest_producer_id_block`` (its znode version), so a broker that read the block before
  another broker took the next one reads again instead of handing out the same ids.
- A broker id still registered by an earlier session (a broker killed with -9: its ephemeral
  node lasts until the session expires) is waited out; a node of this broker's own session
  is its registration.

The fake holds only what these rules use: znodes with a version and an ephemeral owner, and
kazoo's exceptions for a missing node, an existing node and a stale version.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)

from headrace.cluster import zk_layout as L
from headrace.cluster.zk_store import ControllerMovedError, ZkMetadataStore
from headrace.config import BrokerConfig
from headrace.metadata.store import BrokerInfo, PartitionState


class FakeZooKeeper:
    """Znodes: path -> (data, version, ephemeral owner session or 0)."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[bytes, int, int]] = {}
        self.lock = threading.Lock()
        self.sequence = 0  # the next sequential node's number (one counter: enough here)
        self.zxid = 0  # the last write's
        self.mzxids: dict[str, int] = {}  # path -> the zxid of its last write


class FakeClient:
    """The part of ``KazooClient`` these rules call, for one session."""

    def __init__(self, zk: FakeZooKeeper, session_id: int) -> None:
        self.zk = zk
        self.client_id = (session_id, b"")
        self.after_get: Callable[[str], None] | None = None

    def _stat(self, version: int, owner: int, path: str = "") -> Any:
        return SimpleNamespace(version=version, ephemeralOwner=owner,
                               mzxid=self.zk.mzxids.get(path, 0))

    def get(self, path: str, watch: Any = None) -> tuple[bytes, Any]:
        with self.zk.lock:
            if path not in self.zk.nodes:
                raise NoNodeError()
            data, version, owner = self.zk.nodes[path]
        if self.after_get is not None:
            self.after_get(path)
        return data, self._stat(version, owner, path)

    def exists(self, path: str, watch: Any = None) -> Any:
        with self.zk.lock:
            if path not in self.zk.nodes:
                return None
            _, version, owner = self.zk.nodes[path]
            return self._stat(version, owner, path)

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False,
               makepath: bool = False, sequence: bool = False) -> str:
        with self.zk.lock:
            return self._create(path, value, ephemeral, makepath, sequence)

    def get_children(self, path: str, watch: Any = None) -> list[str]:
        with self.zk.lock:
            if path not in self.zk.nodes:
                raise NoNodeError()
            return [p[len(path) + 1:] for p in self.zk.nodes
                    if p.startswith(path + "/") and "/" not in p[len(path) + 1:]]

    def _create(self, path: str, value: bytes, ephemeral: bool, makepath: bool,
                sequence: bool = False) -> str:
        if sequence:
            path = f"{path}{self.zk.sequence:010d}"
            self.zk.sequence += 1
        if path in self.zk.nodes:
            raise NodeExistsError()
        parent = path.rsplit("/", 1)[0]
        if parent and parent not in self.zk.nodes:
            if not makepath:
                raise NoNodeError()
            self._create(parent, b"", False, True)
        self.zk.nodes[path] = (value, 0, self.client_id[0] if ephemeral else 0)
        return path

    def transaction(self) -> FakeTransaction:
        return FakeTransaction(self)

    def set(self, path: str, value: bytes, version: int = -1) -> Any:
        with self.zk.lock:
            return self._set(path, value, version)

    def _set(self, path: str, value: bytes, version: int) -> Any:
        if path not in self.zk.nodes:
            raise NoNodeError()
        _, current, owner = self.zk.nodes[path]
        if version != -1 and version != current:
            raise BadVersionError()
        self.zk.nodes[path] = (value, current + 1, owner)
        self.zk.zxid += 1
        self.zk.mzxids[path] = self.zk.zxid
        return self._stat(current + 1, owner, path)


class FakeTransaction:
    """kazoo's transaction: all or nothing; on a failure the failed operation's result is
    its exception, those before it RolledBackError, those after it RuntimeInconsistency."""

    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.ops: list[Callable[[], Any]] = []

    def check(self, path: str, version: int) -> None:
        def op() -> bool:
            stat = self.client.zk.nodes.get(path)
            if stat is None:
                raise NoNodeError()
            if stat[1] != version:
                raise BadVersionError()
            return True
        self.ops.append(op)

    def create(self, path: str, value: bytes = b"", sequence: bool = False) -> None:
        self.ops.append(lambda: self.client._create(path, value, False, False, sequence))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self.ops.append(lambda: self.client._set(path, value, version))

    def commit(self) -> list[Any]:
        zk = self.client.zk
        with zk.lock:
            before = dict(zk.nodes)
            results: list[Any] = []
            for i, op in enumerate(self.ops):
                try:
                    results.append(op())
                except KazooException as e:
                    zk.nodes = before
                    return ([RolledBackError() for _ in range(i)] + [e]
                            + [RuntimeInconsistency() for _ in self.ops[i + 1:]])
            return results

    def commit_async(self) -> Any:
        results = self.commit()
        return SimpleNamespace(get=lambda timeout=None: results)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def store(zk: FakeZooKeeper, node_id: int, session_id: int,
          loop: asyncio.AbstractEventLoop) -> ZkMetadataStore:
    cfg = BrokerConfig.from_mapping({"zookeeper.connect": "127.0.0.1:2181",
                                     "broker.id": node_id,
                                     "zookeeper.session.timeout.ms": 2000})
    s = ZkMetadataStore(cfg, BrokerInfo(node_id, "127.0.0.1", 9000 + node_id), loop)
    s.client = FakeClient(zk, session_id)  # type: ignore[assignment]
    return s


def controller_store(loop: asyncio.AbstractEventLoop) -> tuple[FakeZooKeeper, ZkMetadataStore]:
    """Broker 1's store, the controller at epoch 3 (``/controller_epoch`` version 7), with
    topic "t"'s znode."""
    zk = FakeZooKeeper()
    for path in ("/brokers", L.TOPICS, L.topic_path("t"), "/headrace", L.STATE_CHANGES):
        zk.nodes[path] = (b"", 0, 0)
    zk.nodes[L.CONTROLLER_EPOCH] = (b"3", 7, 0)
    return zk, store(zk, 1, 101, loop)


def test_producer_id_blocks_never_overlap_when_brokers_race(
        loop: asyncio.AbstractEventLoop) -> None:
    zk = FakeZooKeeper()
    a, b = store(zk, 1, 101, loop), store(zk, 2, 102, loop)
    blocks = [(a.allocate_producer_ids(10), 1000), (b.allocate_producer_ids(10), 1000)]
    # b takes the next block between a's read of the block and a's write of its own
    raced: list[int] = []

    def b_takes_one(path: str) -> None:
        if path == L.PRODUCER_ID_BLOCK and not raced:
            raced.append(b.allocate_producer_ids(1000))

    a.client.after_get = b_takes_one  # type: ignore[union-attr]
    blocks.append((a.allocate_producer_ids(1000), 1000))
    a.client.after_get = None  # type: ignore[union-attr]
    assert len(raced) == 1
    blocks.append((raced[0], 1000))
    blocks += [(a.allocate_producer_ids(5000), 5000), (b.allocate_producer_ids(1), 1000)]
    blocks.sort()
    assert blocks[0][0] == 0
    for (start, size), (nxt, _) in itertools.pairwise(blocks):
        assert nxt >= start + size, blocks  # no id handed out twice
    a.close()
    b.close()


def test_a_registration_left_by_an_earlier_session_is_waited_out(
        loop: asyncio.AbstractEventLoop) -> None:
    zk = FakeZooKeeper()
    path = L.broker_path(1)
    for parent in ("/brokers", path.rsplit("/", 1)[0]):
        zk.nodes[parent] = (b"", 0, 0)
    zk.nodes[path] = (b"{}", 0, 999)  # the killed broker's session, not yet expired
    s = store(zk, 1, 101, loop)
    expire = threading.Timer(0.3, lambda: zk.nodes.pop(path))  # its session expires
    expire.start()
    try:
        s._register()
    finally:
        expire.join()
    assert zk.nodes[path][2] == 101  # registered by this session
    s._register()  # this session's own node is its registration: at once
    assert zk.nodes[path][2] == 101
    s.close()


def test_new_states_of_a_deleted_topic_do_not_bring_its_znode_back(
        loop: asyncio.AbstractEventLoop) -> None:
    """A controller whose cache still has a deleted topic writes its partitions as new: no
    write, the answer None, and no empty /brokers/topics/T comes back; a live topic's new
    state is created; a deposed controller (another epoch version) writes nothing."""
    zk = FakeZooKeeper()
    for path in ("/brokers", L.TOPICS, L.topic_path("live"), "/headrace", L.STATE_CHANGES):
        zk.nodes[path] = (b"", 0, 0)
    zk.nodes[L.CONTROLLER_EPOCH] = (b"3", 7, 0)
    s = store(zk, 1, 101, loop)
    new = PartitionState([1], 1, 0, [1])
    assert s.write_partition_states([("gone", 0, new)], 3, 7) == [None]
    assert not [p for p in zk.nodes if p.startswith(L.topic_path("gone"))]
    assert s.write_partition_states([("live", 0, new)], 3, 7) == [0]
    assert L.state_path("live", 0) in zk.nodes
    # announced in the same transaction (how brokers learn of it: issue 21, defect 5)
    (change,) = [p for p in zk.nodes if p.startswith(L.STATE_CHANGES + "/")]
    assert L.decode_state_change(zk.nodes[change][0])[:3] == ("live", 0, 0)
    with pytest.raises(ControllerMovedError):
        s.write_partition_states([("live", 1, new)], 3, 6)
    assert L.state_path("live", 1) not in zk.nodes
    s.close()


def test_state_updates_go_in_batches_with_one_notification_and_a_refusal_alone(
        loop: asyncio.AbstractEventLoop) -> None:
    """The controller's updates of 250 states: three transactions (100, 100, 50), each
    with one notification naming its states and their new versions, instead of 250; a
    batch with one stale version is refused whole and tried again one partition at a time,
    so only that partition's answer is None (the controller re-reads it)."""
    zk, s = controller_store(loop)
    new = PartitionState([1, 2], 1, 0, [1, 2])
    assert s.write_partition_states([("t", p, new) for p in range(250)], 3, 7) == [0] * 250
    zk.nodes = {k: v for k, v in zk.nodes.items() if not k.startswith(L.STATE_CHANGES + "/")}
    moved = PartitionState([1, 2], 2, 1, [2], 1, -1, 0)
    stale = PartitionState([1, 2], 2, 1, [2], 1, -1, 5)  # someone wrote partition 120 first
    updates = [("t", p, stale if p == 120 else moved) for p in range(250)]
    assert s.write_partition_states(updates, 3, 7) == [None if p == 120 else 1
                                                       for p in range(250)]
    notes = sorted(p for p in zk.nodes if p.startswith(L.STATE_CHANGES + "/"))
    sizes = sorted(len(L.decode_state_changes(zk.nodes[n][0])) for n in notes)
    assert sizes == [1] * 99 + [50, 100]  # the refused batch's 99 others went alone
    announced = {(t, p): v for n in notes for t, p, v, _ in L.decode_state_changes(
        zk.nodes[n][0])}
    assert announced == {("t", p): 1 for p in range(250) if p != 120}
    s.close()


def test_the_controllers_own_updates_reach_its_cache_without_a_read(
        loop: asyncio.AbstractEventLoop) -> None:
    """The controller's broker takes the states it wrote into its own cache as soon as the
    write is answered, with the znode's version and zxid (as Kafka's controller sends its
    own broker LeaderAndIsr), instead of waiting to read its own notifications back; a
    notification of an older write that arrives afterwards changes nothing."""
    zk, s = controller_store(loop)
    new = PartitionState([1, 2], 1, 0, [1, 2])
    assert s.write_partition_states([("t", p, new) for p in range(3)], 3, 7) == [0] * 3
    moved = PartitionState([1, 2], 2, 1, [2], 1, -1, 0)
    assert s.write_partition_states([("t", p, moved) for p in range(3)], 3, 7) == [1] * 3
    s._read_state_changes = lambda: []  # type: ignore[method-assign]  # no read back
    loop.run_until_complete(asyncio.sleep(0))  # the loop's callbacks
    for p in range(3):
        got = s._states[("t", p)]
        assert (got.leader, got.leader_epoch, got.isr, got.zk_version) == (2, 1, [2], 1)
        assert s._state_mzxids[("t", p)] == zk.mzxids[L.state_path("t", p)] > 0
    # a late notification of the creation (version 0, an older zxid) is not applied
    s._apply([("state", ("t", 0, (1, 0, [1, 2], 3), 0, 0))])
    assert s._states[("t", 0)].leader == 2
    s.close()


def test_entity_configs_are_announced_and_applied_by_the_brokers_they_concern(
        loop: asyncio.AbstractEventLoop) -> None:
    """Issue 27 (fast twin of the cluster test): a dynamic default written by one broker is
    Kafka's JSON at /config/brokers/<default>, announced on /config/changes; another broker
    reads the notification and tells its listener; a broker's own configs
    (/config/brokers/1) concern only that broker, group configs every broker."""
    zk = FakeZooKeeper()
    one, two = store(zk, 1, 11, loop), store(zk, 2, 12, loop)
    one.client.create(L.CONFIG_CHANGES, b"", makepath=True)  # type: ignore[union-attr]
    two._new_changes(L.CONFIG_CHANGES, "config_changes")  # what broker 2 has seen: none
    one.change_entity_configs("brokers/<default>", {"message.max.bytes": "5000"})
    one.change_entity_configs("brokers/1", {"log.retention.ms": "1000"})
    one.change_entity_configs(L.group_entity("g 1"), {"consumer.session.timeout.ms": "50000"})
    data, _ = one.client.get("/config/brokers/<default>")  # type: ignore[union-attr]
    assert data == b'{"version":1,"config":{"message.max.bytes":"5000"}}'
    updates = two._read_config_changes()
    assert updates == [("entity_config", ("brokers/<default>", {"message.max.bytes": "5000"})),
                       ("entity_config", ("groups/g%201",
                                          {"consumer.session.timeout.ms": "50000"}))]
    told: list[str] = []
    two.add_listener(SimpleNamespace(entity_configs_changed=told.append))
    two._apply(updates)
    assert told == ["brokers/<default>", "groups/g%201"]
    assert two.entity_configs("brokers/<default>") == {"message.max.bytes": "5000"}
    assert two.entity_configs("brokers/1") == {}
    two._apply(updates)  # the same again: nothing changed, nobody told
    assert told == ["brokers/<default>", "groups/g%201"]


# ------------------------------------------------------------------ notifications read once
def test_a_notifications_states_are_read_as_the_state_znodes_are() -> None:
    """A broker reads the states of a notification straight into their fields (not
    re-encoded and parsed again: 20,000 of them after a failover); what it reads is what
    ``decode_state`` reads from the state znodes, in both notification formats, and a
    malformed state is an error in its place, not the loss of the others."""
    states = [PartitionState([1, 2, 3], 2, 7, [2, 3], 0), PartitionState([3, 1], -1, 4, [3], 0)]
    raw = [L.encode_state(s, 5) for s in states]
    many = L.encode_state_changes([("t", 0, 11, raw[0]), ("u", 3, 2, raw[1])])
    one = L.encode_state_change("t", 0, 11, raw[0])
    assert L.read_state_changes(many) == [
        ("t", 0, 11, L.decode_state("t-0", raw[0])), ("u", 3, 2, L.decode_state("u-3", raw[1]))]
    assert L.read_state_changes(many) == [
        (t, p, v, L.decode_state("s", b)) for t, p, v, b in L.decode_state_changes(many)]
    assert L.read_state_changes(one) == [("t", 0, 11, (2, 7, [2, 3], 5))]
    bad = (b'{"version":1,"changes":[{"topic":"t","partition":0,"zk_version":1,'
           b'"state":{"leader":"x","leader_epoch":1,"isr":[1]}},{"topic":"t","partition":1,'
           b'"zk_version":4,"state":{"leader":1,"leader_epoch":2,"isr":[1]}}]}')
    first, second = L.read_state_changes(bad)
    assert first[:3] == ("t", 0, 1) and isinstance(first[3], L.LayoutError)
    assert second == ("t", 1, 4, (1, 2, [1], -1))
    for broken in (b"[]", b'{"changes": [{"topic": "t"}]}', b"{", None):
        with pytest.raises(L.LayoutError):
            L.read_state_changes(broken)


def test_a_partition_states_copy_shares_no_list() -> None:
    # every field set apart from its default: a field added to PartitionState and not
    # to copy() fails here
    import dataclasses
    values: dict[str, Any] = {"replicas": [1, 2, 3], "isr": [2, 3]}
    for i, f in enumerate(dataclasses.fields(PartitionState)):
        values.setdefault(f.name, 100 + i)
    state = PartitionState(**values)
    c = state.copy()
    assert c == state and c is not state
    c.isr.append(1)
    c.replicas.remove(3)
    assert state.isr == [2, 3] and state.replicas == [1, 2, 3]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=20), st.integers(0, 10**6),
                          st.integers(0, 2**31 - 1), st.integers(-1, 5), st.integers(0, 2**31),
                          st.lists(st.integers(0, 10**6), max_size=5)), max_size=8))
def test_a_notification_is_encoded_as_its_parsed_document(
        changes: list[tuple[str, int, int, int, int, list[int]]]) -> None:
    """The states are spliced into the notification as the bytes ``encode_state`` made;
    the result is byte for byte the encoding of the parsed document (Kafka's tools and
    older brokers read it as JSON)."""
    import json
    items = [(t, p, v, L.encode_state(PartitionState([1], leader, epoch, isr), 3))
             for t, p, v, leader, epoch, isr in changes]
    reference = json.dumps({"version": 1, "changes": [
        {"topic": t, "partition": p, "zk_version": v, "state": json.loads(s)}
        for t, p, v, s in items]}, separators=(",", ":")).encode()
    assert L.encode_state_changes(items) == reference
    assert L.decode_state_changes(reference) == [(t, p, v, s) for t, p, v, s in items]
