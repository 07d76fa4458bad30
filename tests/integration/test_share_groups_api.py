"""Share groups served by the group coordinator (KIP-932, issue 25 items 1, 4, 6), against
an in-process broker: ShareGroupHeartbeat (76) and ShareGroupDescribe (77) on the wire
(member epochs, fencing, assignment after the share-partitions' state is initialized,
session expiry, the group configs a group takes at once), the admin APIs 90-92, one group
id namespace with classic and consumer groups (each API's answer for a group of another
type, as Kafka 4.2), confluent-kafka's AdminClient (list, describe, delete, GROUP configs)
and a real ``ShareConsumer`` joining (it gets no records here: ShareFetch is not the
subject).

The share coordinator is replaced by ``FakePersister`` (in memory, every call recorded,
failures injectable), so that what the group coordinator asks of it is checked exactly.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupType, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kio.schema.errors import ErrorCode

from headrace.broker.share_config import share_group_config
from headrace.broker.share_persister import (
    UNINITIALIZED_START_OFFSET,
    InitializeEntry,
    ReadStateResult,
    Results,
    StateKey,
    StateSummary,
    WriteEntry,
)
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

OVERRIDES = {
    "group.share.min.session.timeout.ms": "500",
    "group.share.min.heartbeat.interval.ms": "100",
    "group.share.session.timeout.ms": "45000",
}


class FakePersister:
    """``share_persister.SharePersister`` in memory: the state epoch and start offset of
    each initialized share-partition; ``fail[key]`` answers that key's next calls with
    that error (until removed)."""

    def __init__(self) -> None:
        self.state: dict[StateKey, tuple[int, int]] = {}
        self.initialized: list[InitializeEntry] = []
        self.deleted: list[StateKey] = []
        self.fail: dict[StateKey, ErrorCode] = {}

    async def initialize_state(self, entries: list[InitializeEntry]) -> Results:
        errors = {}
        for e in entries:
            self.initialized.append(e)
            if e.key in self.fail:
                errors[e.key] = self.fail[e.key]
            else:
                self.state[e.key] = (e.state_epoch, e.start_offset)
        return Results(errors)

    async def read_state(self, keys: list[StateKey], leader_epoch: int
                         ) -> dict[StateKey, ReadStateResult]:
        return {k: ReadStateResult(ErrorCode.none, *self.state[k]) if k in self.state
                else ReadStateResult(ErrorCode.unknown_topic_or_partition) for k in keys}

    async def write_state(self, entries: list[WriteEntry]) -> Results:
        return Results()

    async def delete_state(self, keys: list[StateKey]) -> Results:
        errors = {k: self.fail[k] for k in keys if k in self.fail}
        for k in keys:
            if k not in errors:
                self.deleted.append(k)
                self.state.pop(k, None)
        return Results(errors)

    async def read_state_summary(self, keys: list[StateKey], leader_epoch: int = -1
                                 ) -> dict[StateKey, StateSummary]:
        return {k: StateSummary(ErrorCode.none, self.state[k][0], 0, self.state[k][1])
                if k in self.state else StateSummary(ErrorCode.none) for k in keys}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("sgapi"), OVERRIDES) as b:
        yield b
        assert not [x for x in b.stderr_lines if "Traceback" in x]  # no request crashed


@pytest.fixture
def persister(broker: InProcessBroker) -> Iterator[FakePersister]:
    fake = FakePersister()
    real = broker.call(lambda b: b.share_persister)
    broker.call(lambda b: setattr(b, "share_persister", fake))
    yield fake
    broker.call(lambda b: setattr(b, "share_persister", real))


@pytest.fixture
def wc(broker: InProcessBroker) -> Iterator[WireClient]:
    with WireClient.to(broker.bootstrap) as c:
        yield c


def make_topic(broker: InProcessBroker, name: str, partitions: int) -> uuid.UUID:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)
    return broker.call(lambda b: b.metadata.topic(name)).topic_id  # type: ignore[no-any-return]


def set_group_configs(broker: InProcessBroker, group: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = admin.incremental_alter_configs([ConfigResource(
        ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs.items()])])
    for fut in res.values():
        fut.result(10)


def hb(wc: WireClient, group: str, member: str, epoch: int,
       topics: list[str] | None = None, **extra: Any) -> Any:
    return wc.request(76, 1, {"group_id": group, "member_id": member, "member_epoch": epoch,
                              "rack_id": None, "subscribed_topic_names": topics, **extra})


def assigned(r: Any) -> dict[uuid.UUID, set[int]]:
    if r.assignment is None:
        return {}
    return {t.topic_id: set(t.partitions) for t in r.assignment.topic_partitions}


def until(fn: Callable[[], Any], what: str, timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def describe(wc: WireClient, group: str) -> Any:
    return wc.request(77, 1, {"group_ids": [group],
                              "include_authorized_operations": False}).groups[0]


def beat_until(wc: WireClient, group: str, member: str, epoch: int,
               want: dict[uuid.UUID, set[int]] | int | Callable[[int], bool],
               held: dict[uuid.UUID, set[int]] | None = None,
               ) -> tuple[int, dict[uuid.UUID, set[int]]]:
    """Heartbeat until the member holds ``want`` (an assignment, or a number of
    partitions; ``held`` is what it holds now); its epoch and assignment."""
    held = held or {}

    def step() -> bool:
        nonlocal epoch, held
        r = hb(wc, group, member, epoch)
        assert r.error_code == ErrorCode.none, r
        epoch = int(r.member_epoch)
        if r.assignment is not None:
            held = assigned(r)
        n = sum(map(len, held.values()))
        if isinstance(want, dict):
            return held == want
        return want(n) if callable(want) else n == want
    until(step, f"{member} to hold {want}")
    return epoch, held


def join_until_assigned(wc: WireClient, group: str, member: str, topic: str,
                        want: int | Callable[[int], bool],
                        ) -> tuple[int, dict[uuid.UUID, set[int]]]:
    """Join, then heartbeat until the member holds ``want`` partitions (the state of
    the share-partitions is initialized after the first heartbeat's answer)."""
    r = hb(wc, group, member, 0, [topic])
    assert r.error_code == ErrorCode.none, r
    return beat_until(wc, group, member, int(r.member_epoch), want, assigned(r))


# ---------------------------------------------------------------- heartbeat and describe


def test_join_initialize_assign_fence_leave(broker: InProcessBroker, persister: FakePersister,
                                            wc: WireClient, topic_name: str) -> None:
    tid = make_topic(broker, topic_name, 3)
    group, a, b = "hb-group", str(uuid.uuid4()), str(uuid.uuid4())
    r = hb(wc, group, a, 0, [topic_name])
    assert (r.error_code, r.member_id, r.member_epoch) == (ErrorCode.none, a, 1)
    # the broker's group.share.heartbeat.interval.ms
    assert r.heartbeat_interval == timedelta(milliseconds=5000)
    # nothing is assigned before the share coordinator initialized the state: the group
    # asks for every subscribed partition at the group epoch, start offset -1
    assert assigned(r) == {}
    until(lambda: len(persister.initialized) == 3, "initialization")
    assert {(e.key, e.state_epoch, e.start_offset) for e in persister.initialized} == {
        (StateKey(group, tid, p), 1, UNINITIALIZED_START_OFFSET) for p in range(3)}
    epoch, held = beat_until(wc, group, a, int(r.member_epoch), 3)
    assert held == {tid: {0, 1, 2}} and epoch > 1
    # a second member: the partitions are shared out, nothing initialized again
    # (the simple assignor gives each partition to one of them: b gets 1 or 2)
    _, held_b = join_until_assigned(wc, group, b, topic_name, lambda n: n in (1, 2))
    epoch, held = beat_until(wc, group, a, epoch, lambda n: n == 3 - len(held_b[tid]), held)
    assert held[tid] | held_b[tid] == {0, 1, 2} and not held[tid] & held_b[tid]
    d = describe(wc, group)
    assert d.error_code == ErrorCode.none and d.group_state == "Stable"
    assert {m.member_id for m in d.members} == {a, b}
    assert len(persister.initialized) == 3
    # epochs: ahead of the member's is fenced, an unknown member is unknown
    assert hb(wc, group, a, epoch + 5).error_code == ErrorCode.fenced_member_epoch
    assert hb(wc, group, str(uuid.uuid4()), 3).error_code == ErrorCode.unknown_member_id
    # a member leaves with epoch -1; leaving twice is an unknown member
    r = hb(wc, group, b, -1)
    assert (r.error_code, r.member_epoch) == (ErrorCode.none, -1)
    assert hb(wc, group, b, -1).error_code == ErrorCode.unknown_member_id
    # the one left holds every partition after its next heartbeats (the assignment is
    # sent only when it changed for the member)
    epoch, held = beat_until(wc, group, a, epoch, {tid: {0, 1, 2}}, held)
    assert hb(wc, group, a, -1).error_code == ErrorCode.none
    d = describe(wc, group)
    assert (d.group_state, list(d.members)) == ("Empty", [])


def test_invalid_heartbeats(broker: InProcessBroker, wc: WireClient, topic_name: str) -> None:
    make_topic(broker, topic_name, 1)
    m = str(uuid.uuid4())
    r = hb(wc, "", m, 0, [topic_name])
    assert r.error_code == ErrorCode.invalid_request
    for bad in (
        {"member": "", "epoch": 0, "topics": [topic_name]},          # no member id
        {"member": m, "epoch": 0, "topics": None},                   # a join without topics
        {"member": m, "epoch": 0, "topics": []},
        {"member": m, "epoch": -2, "topics": [topic_name]},          # below -1
    ):
        r = hb(wc, "bad-hb", bad["member"], bad["epoch"], bad["topics"])  # type: ignore[arg-type]
        assert r.error_code == ErrorCode.invalid_request, bad
    r = hb(wc, "bad-hb", m, 0, [topic_name], rack_id="")
    assert r.error_code == ErrorCode.invalid_request
    # nothing was made by the refused heartbeats; a first heartbeat with an epoch > 0 is
    # an unknown member
    assert describe(wc, "bad-hb").error_code == ErrorCode.group_id_not_found
    assert hb(wc, "bad-hb", m, 1).error_code == ErrorCode.unknown_member_id
    assert describe(wc, "bad-hb").error_code == ErrorCode.group_id_not_found


def test_a_failed_initialization_is_asked_again(broker: InProcessBroker,
                                                persister: FakePersister, wc: WireClient,
                                                topic_name: str) -> None:
    tid = make_topic(broker, topic_name, 1)
    group, m = "init-fails", str(uuid.uuid4())
    key = StateKey(group, tid, 0)
    persister.fail[key] = ErrorCode.coordinator_not_available
    r = hb(wc, group, m, 0, [topic_name])
    epoch = int(r.member_epoch)
    until(lambda: len(persister.initialized) == 1, "the first initialization")

    def beat() -> bool:
        nonlocal epoch
        r = hb(wc, group, m, epoch)
        epoch = int(r.member_epoch)
        assert assigned(r) == {}  # never assigned while its state is not initialized
        return len(persister.initialized) >= 2
    until(beat, "initialization asked for again after the failure")
    del persister.fail[key]
    beat_until(wc, group, m, epoch, {tid: {0}})
    assert persister.state[key] == (persister.initialized[-1].state_epoch, -1)
    assert hb(wc, group, m, -1).error_code == ErrorCode.none


def test_no_persister_means_nothing_assigned_and_admin_apis_unavailable(
        broker: InProcessBroker, persister: FakePersister, wc: WireClient,
        topic_name: str) -> None:
    make_topic(broker, topic_name, 1)
    group, m = "no-persister", str(uuid.uuid4())
    r = wc.request(91, 0, {"group_id": group, "topics": [{
        "topic_name": topic_name, "partitions": [{"partition_index": 0, "start_offset": 2}]}]})
    assert r.error_code == ErrorCode.none
    broker.call(lambda b: setattr(b, "share_persister", None))
    try:
        other = "no-persister-2"
        r = hb(wc, other, m, 0, [topic_name])
        assert r.error_code == ErrorCode.none
        for _ in range(5):  # never assigned: its state cannot be initialized
            r = hb(wc, other, m, int(r.member_epoch))
            assert r.error_code == ErrorCode.none and assigned(r) == {}
        assert hb(wc, other, m, -1).error_code == ErrorCode.none
        r = wc.request(90, 1, {"groups": [{"group_id": group, "topics": None}]})
        assert r.groups[0].error_code == ErrorCode.coordinator_not_available
        r = wc.request(91, 0, {"group_id": group, "topics": [{
            "topic_name": topic_name, "partitions": [{"partition_index": 0,
                                                      "start_offset": 0}]}]})
        assert r.error_code == ErrorCode.coordinator_not_available
        r = wc.request(92, 0, {"group_id": group, "topics": [{"topic_name": topic_name}]})
        assert r.error_code == ErrorCode.coordinator_not_available
    finally:
        broker.call(lambda b: setattr(b, "share_persister", persister))
    assert len(persister.initialized) == 1  # nothing reached the share coordinator


def test_session_expiry_and_group_configs_taken_at_once(
        broker: InProcessBroker, persister: FakePersister, wc: WireClient,
        topic_name: str) -> None:
    make_topic(broker, topic_name, 1)
    group, m = "expiring", str(uuid.uuid4())
    set_group_configs(broker, group, share_session_timeout_ms="1000",
                      share_heartbeat_interval_ms="300")
    r = hb(wc, group, m, 0, [topic_name])
    assert (r.error_code, r.heartbeat_interval) == (ErrorCode.none, timedelta(milliseconds=300))
    # the existing group takes a changed interval on its next heartbeat
    set_group_configs(broker, group, share_session_timeout_ms="1000",
                      share_heartbeat_interval_ms="200")
    r = hb(wc, group, m, int(r.member_epoch))
    assert r.heartbeat_interval == timedelta(milliseconds=200)
    values = broker.call(lambda b: share_group_config(b, group))
    assert values["share.session.timeout.ms"] == 1000
    assert values["share.delivery.count.limit"] == 5
    # no more heartbeats: the coordinator's tick fences the member after 1 s
    until(lambda: not describe(wc, group).members, "the session to expire")
    assert describe(wc, group).group_state == "Empty"
    assert hb(wc, group, m, int(r.member_epoch)).error_code == ErrorCode.unknown_member_id


# ---------------------------------------------------------------- one group id namespace


def test_other_group_types_and_share_groups_do_not_mix(
        broker: InProcessBroker, persister: FakePersister, wc: WireClient,
        topic_name: str) -> None:
    make_topic(broker, topic_name, 1)
    classic = "simple-committer"
    r = wc.request(8, 8, {"group_id": classic, "generation_id_or_member_epoch": -1,
                          "member_id": "", "group_instance_id": None, "topics": [{
                              "name": topic_name, "partitions": [{
                                  "partition_index": 0, "committed_offset": 3,
                                  "committed_leader_epoch": -1,
                                  "committed_metadata": None}]}]})
    assert r.topics[0].partitions[0].error_code == ErrorCode.none
    # an empty classic group of that id is not converted (Kafka: "is not a share group")
    r = hb(wc, classic, str(uuid.uuid4()), 0, [topic_name])
    assert r.error_code == ErrorCode.group_id_not_found
    assert r.error_message == f"Group {classic} is not a share group."
    d = describe(wc, classic)
    assert d.error_code == ErrorCode.group_id_not_found
    for api in (90,):
        r = wc.request(api, 1, {"groups": [{"group_id": classic, "topics": None}]})
        assert r.groups[0].error_code == ErrorCode.group_id_not_found
    r = wc.request(91, 0, {"group_id": classic, "topics": []})
    assert r.error_code == ErrorCode.group_id_not_found
    # a share group, with a member, then empty
    share, m = "a-share-group", str(uuid.uuid4())
    r = hb(wc, share, m, 0, [topic_name])
    assert r.error_code == ErrorCode.none
    for leave in (False, True):
        if leave:
            assert hb(wc, share, m, -1).error_code == ErrorCode.none
        r = wc.request(68, 0, {"group_id": share, "member_id": str(uuid.uuid4()),
                               "member_epoch": 0, "instance_id": None, "rack_id": None,
                               "rebalance_timeout": timedelta(seconds=30),
                               "subscribed_topic_names": [topic_name],
                               "server_assignor": None, "topic_partitions": []})
        assert r.error_code == ErrorCode.group_id_not_found, leave
        r = wc.request(11, 5, {"group_id": share, "session_timeout": timedelta(seconds=10),
                               "rebalance_timeout": timedelta(seconds=10), "member_id": "",
                               "group_instance_id": None, "protocol_type": "consumer",
                               "protocols": [{"name": "range", "metadata": b""}],
                               "reason": None})
        assert (r.error_code, r.member_id) == (ErrorCode.inconsistent_group_protocol, "")
        r = wc.request(15, 5, {"groups": [share], "include_authorized_operations": False})
        g = r.groups[0]
        assert (g.error_code, g.group_state, g.protocol_type, list(g.members)) == (
            ErrorCode.none, "Dead", "", [])
        r = wc.request(9, 8, {"groups": [{"group_id": share, "topics": [{
            "name": topic_name, "partition_indexes": [0]}]}], "require_stable": False})
        (g,) = r.groups
        assert g.error_code == ErrorCode.none
        assert [(p.committed_offset, p.error_code) for p in g.topics[0].partitions] == [
            (-1, ErrorCode.none)]
        r = wc.request(8, 8, {"group_id": share, "generation_id_or_member_epoch": -1,
                              "member_id": "", "group_instance_id": None, "topics": [{
                                  "name": topic_name, "partitions": [{
                                      "partition_index": 0, "committed_offset": 1,
                                      "committed_leader_epoch": -1,
                                      "committed_metadata": None}]}]})
        assert r.topics[0].partitions[0].error_code == ErrorCode.group_id_not_found
        r = wc.request(47, 0, {"group_id": share, "topics": [{
            "name": topic_name, "partitions": [{"partition_index": 0}]}]})
        assert r.error_code == ErrorCode.group_id_not_found
    # ListGroups v5: the type filter and the type in the answer
    r = wc.request(16, 5, {"states_filter": [], "types_filter": ["Share"]})
    listed = {g.group_id: g for g in r.groups}
    assert share in listed and classic not in listed
    assert (listed[share].group_type, listed[share].protocol_type,
            listed[share].group_state) == ("share", "share", "Empty")
    r = wc.request(16, 5, {"states_filter": [], "types_filter": ["classic", "consumer"]})
    names = {g.group_id for g in r.groups}
    assert classic in names and share not in names


# ---------------------------------------------------------------- admin APIs 90-92


def test_alter_describe_delete_offsets(broker: InProcessBroker, persister: FakePersister,
                                       wc: WireClient, topic_name: str) -> None:
    tid = make_topic(broker, topic_name, 2)
    group, m = "offsets-admin", str(uuid.uuid4())
    # altering a group that does not exist makes it (empty), as Kafka
    r = wc.request(91, 0, {"group_id": group, "topics": [{
        "topic_name": topic_name, "partitions": [
            {"partition_index": 0, "start_offset": 7},
            {"partition_index": 1, "start_offset": -5},
            {"partition_index": 9, "start_offset": 0}]}]})
    assert r.error_code == ErrorCode.none
    codes = {p.partition_index: p.error_code for p in r.responses[0].partitions}
    assert codes == {0: ErrorCode.none, 1: ErrorCode.invalid_request,
                     9: ErrorCode.unknown_topic_or_partition}
    assert [(e.key, e.start_offset) for e in persister.initialized] == [
        (StateKey(group, tid, 0), 7)]
    r = wc.request(90, 1, {"groups": [{"group_id": group, "topics": None}]})
    (t,) = r.groups[0].topics
    assert (t.topic_name, [(p.partition_index, p.start_offset) for p in t.partitions]) == (
        topic_name, [(0, 7)])
    # a member joins: partition 0 is initialized already, partition 1 is asked for with
    # offset -1; the group is not empty, so its offsets cannot change
    hb(wc, group, m, 0, [topic_name])
    until(lambda: len(persister.initialized) == 2, "partition 1's initialization")
    assert persister.initialized[1].key == StateKey(group, tid, 1)
    assert persister.initialized[1].start_offset == UNINITIALIZED_START_OFFSET
    r = wc.request(91, 0, {"group_id": group, "topics": [{
        "topic_name": topic_name, "partitions": [{"partition_index": 0,
                                                  "start_offset": 0}]}]})
    assert r.error_code == ErrorCode.non_empty_group
    r = wc.request(92, 0, {"group_id": group, "topics": [{"topic_name": topic_name}]})
    assert r.error_code == ErrorCode.non_empty_group
    assert hb(wc, group, m, -1).error_code == ErrorCode.none
    r = wc.request(92, 0, {"group_id": group, "topics": [{"topic_name": topic_name},
                                                        {"topic_name": "no-such"}]})
    assert r.error_code == ErrorCode.none
    assert {x.topic_name: x.error_code for x in r.responses} == {
        topic_name: ErrorCode.none, "no-such": ErrorCode.unknown_topic_or_partition}
    assert set(persister.deleted) == {StateKey(group, tid, 0), StateKey(group, tid, 1)}
    r = wc.request(90, 1, {"groups": [{"group_id": group, "topics": None}]})
    assert list(r.groups[0].topics) == []


# ---------------------------------------------------------------- AdminClient and a client


def test_admin_client_lists_describes_configures_and_deletes(
        broker: InProcessBroker, persister: FakePersister, wc: WireClient,
        topic_name: str) -> None:
    tid = make_topic(broker, topic_name, 1)
    group, m = "admin-share", str(uuid.uuid4())
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    join_until_assigned(wc, group, m, topic_name, 1)
    # the AdminClient lists consumer groups only (protocol type consumer or none, as
    # Kafka's Admin.listConsumerGroups): a share group is not one, whatever the filter
    for types in (None, {ConsumerGroupType.CONSUMER, ConsumerGroupType.CLASSIC}):
        listed = admin.list_consumer_groups(types=types).result(10)
        assert group not in {g.group_id for g in listed.valid}, types
    r = wc.request(16, 5, {"states_filter": ["stable"], "types_filter": []})
    assert (group, "share") in {(g.group_id, g.group_type) for g in r.groups}
    # DeleteGroups: not while a member is in it; then the state goes first
    with pytest.raises(Exception, match="NON_EMPTY_GROUP"):
        admin.delete_consumer_groups([group])[group].result(10)
    assert hb(wc, group, m, -1).error_code == ErrorCode.none
    admin.delete_consumer_groups([group])[group].result(10)
    assert persister.deleted == [StateKey(group, tid, 0)]
    assert describe(wc, group).error_code == ErrorCode.group_id_not_found
    # group configs: Kafka 4.2's share.* with the broker's bounds
    set_group_configs(broker, group, share_record_lock_duration_ms="20000",
                      share_auto_offset_reset="earliest")
    res = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)])
    configs = next(iter(res.values())).result(10)
    assert configs["share.record.lock.duration.ms"].value == "20000"
    assert configs["share.auto.offset.reset"].value == "earliest"
    assert configs["share.isolation.level"].value == "read_uncommitted"
    for name, value, reason in (
            ("share.record.lock.duration.ms", "70000", "group.share.max.record.lock"),
            ("share.session.timeout.ms", "100", "group.share.min.session.timeout.ms"),
            ("share.auto.offset.reset", "sometimes", "share.auto.offset.reset"),
            ("share.isolation.level", "dirty", "share.isolation.level"),
            ("share.delivery.count.limit", "3", "Unknown group config name")):
        with pytest.raises(Exception, match=reason):
            set_group_configs(broker, group, **{name.replace(".", "_"): value})
    values = broker.call(lambda b: share_group_config(b, group))
    assert values["share.record.lock.duration.ms"] == 20000


def test_a_share_consumer_joins_through_the_heartbeat(
        broker: InProcessBroker, persister: FakePersister, wc: WireClient,
        topic_name: str) -> None:
    tid = make_topic(broker, topic_name, 2)
    group = "real-client"
    c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                       "client.id": "sharer"})
    try:
        c.subscribe([topic_name])

        def joined() -> Any:
            c.poll(0.2)
            d = describe(wc, group)
            return d if d.members and d.members[0].assignment.topic_partitions else None
        d = until(joined, "the ShareConsumer to be assigned", 30)
        (member,) = d.members
        assert member.client_id == "sharer"
        assert list(member.subscribed_topic_names) == [topic_name]
        (tp,) = member.assignment.topic_partitions
        assert (tp.topic_id, tp.topic_name, sorted(tp.partitions)) == (tid, topic_name, [0, 1])
        assert {e.key for e in persister.initialized} == {
            StateKey(group, tid, p) for p in range(2)}
    finally:
        c.close()
    until(lambda: not describe(wc, group).members, "the consumer to leave the group")


# ---------------------------------------------------------------- authorization


def test_authorization_of_each_share_group_api(tmp_path_factory: pytest.TempPathFactory,
                                               topic_name: str) -> None:
    """KafkaApis' checks for 76, 77, 90, 91 and 92, with ACLs for the anonymous user: a
    (READ), b (nothing), c (DESCRIBE only) topics; groups sg-read (READ), sg-desc and
    sg-a (DESCRIBE), sg-del (DELETE), sg-none (nothing)."""
    from confluent_kafka.admin import AclOperation  # type: ignore[attr-defined]

    from headrace.security.acl import AclOperation as Op
    from tests.security_helpers import (
        ACL_AUTHORIZER,
        acl,
        listener_ports,
        plain_jaas,
        sasl_conf,
    )

    users = {"admin": "admin-secret"}
    overrides = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain_jaas(users),
        **ACL_AUTHORIZER, "super.users": "User:admin",
    }
    a, b, c = (f"{topic_name}-{x}" for x in "abc")
    with InProcessBroker(tmp_path_factory.mktemp("sgacl") / "data", overrides) as broker:
        fake = FakePersister()
        broker.call(lambda br: setattr(br, "share_persister", fake))
        ports = listener_ports(broker)  # type: ignore[arg-type]
        admin = AdminClient(sasl_conf(f"127.0.0.1:{ports['SASL_PLAINTEXT']}", "admin",
                                      users["admin"]))
        for f in admin.create_topics([NewTopic(t, 1, 1) for t in (a, b, c)]).values():
            f.result(15)
        grants = [acl(ResourceType.TOPIC, a, AclOperation.READ),
                  acl(ResourceType.TOPIC, c, AclOperation.DESCRIBE),
                  acl(ResourceType.GROUP, "sg-read", AclOperation.READ),
                  acl(ResourceType.GROUP, "sg-desc", AclOperation.DESCRIBE),
                  acl(ResourceType.GROUP, "sg-a", AclOperation.DESCRIBE),
                  acl(ResourceType.GROUP, "sg-del", AclOperation.DELETE)]
        for f in admin.create_acls(grants).values():
            f.result(15)
        with WireClient("127.0.0.1", ports["SASL_PLAINTEXT"]).sasl_plain(
                "admin", users["admin"]) as su:
            join_until_assigned(su, "sg-desc", str(uuid.uuid4()), b, 1)
            join_until_assigned(su, "sg-a", str(uuid.uuid4()), a, 1)
            for g in ("sg-del", "sg-read"):
                r = su.request(91, 0, {"group_id": g, "topics": [{
                    "topic_name": a, "partitions": [{"partition_index": 0,
                                                     "start_offset": 0}]}]})
                assert r.error_code == ErrorCode.none
        with WireClient("127.0.0.1", ports["PLAINTEXT"]) as anon:
            m = str(uuid.uuid4())
            # 76: READ on the group, DESCRIBE on every subscribed topic
            assert hb(anon, "sg-desc", m, 0, [a]).error_code == \
                ErrorCode.group_authorization_failed
            assert hb(anon, "sg-read", m, 0, [a, b]).error_code == \
                ErrorCode.topic_authorization_failed
            r = hb(anon, "sg-read", m, 0, [a])
            assert r.error_code == ErrorCode.none
            assert hb(anon, "sg-read", m, -1).error_code == ErrorCode.none
            # 77: DESCRIBE on each group (DELETE implies it); a group with a topic not
            # DESCRIBE-able assigned hides its members
            r = anon.request(77, 1, {"group_ids": ["sg-none", "sg-desc", "sg-a", "sg-del"],
                                     "include_authorized_operations": True})
            by = {g.group_id: g for g in r.groups}
            assert by["sg-none"].error_code == ErrorCode.group_authorization_failed
            assert by["sg-del"].error_code == ErrorCode.none
            assert by["sg-desc"].error_code == ErrorCode.topic_authorization_failed
            assert list(by["sg-desc"].members) == []
            assert by["sg-a"].error_code == ErrorCode.none and len(by["sg-a"].members) == 1
            assert by["sg-a"].authorized_operations == 1 << int(Op.DESCRIBE)
            r = anon.request(77, 1, {"group_ids": ["sg-a"],
                                     "include_authorized_operations": False})
            assert r.groups[0].authorized_operations == -2147483648
            # 90: DESCRIBE on the group and on each topic
            r = anon.request(90, 1, {"groups": [
                {"group_id": "sg-a", "topics": [{"topic_name": a, "partitions": [0]},
                                                {"topic_name": b, "partitions": [0]}]},
                {"group_id": "sg-none", "topics": None}]})
            g_a, g_none = r.groups
            assert {t.topic_name: t.partitions[0].error_code for t in g_a.topics} == {
                a: ErrorCode.none, b: ErrorCode.topic_authorization_failed}
            assert g_none.error_code == ErrorCode.group_authorization_failed
            # 91: READ on the group and on each topic (DESCRIBE is not enough)
            r = anon.request(91, 0, {"group_id": "sg-read", "topics": [
                {"topic_name": t, "partitions": [{"partition_index": 0, "start_offset": 1}]}
                for t in (a, c)]})
            assert {t.topic_name: t.partitions[0].error_code for t in r.responses} == {
                a: ErrorCode.none, c: ErrorCode.topic_authorization_failed}
            r = anon.request(91, 0, {"group_id": "sg-a", "topics": []})
            assert r.error_code == ErrorCode.group_authorization_failed
            # 92: DELETE on the group, READ on each topic
            r = anon.request(92, 0, {"group_id": "sg-read", "topics": [{"topic_name": a}]})
            assert r.error_code == ErrorCode.group_authorization_failed
            r = anon.request(92, 0, {"group_id": "sg-del", "topics": [
                {"topic_name": t} for t in (a, c)]})
            assert r.error_code == ErrorCode.none
            assert {x.topic_name: x.error_code for x in r.responses} == {
                a: ErrorCode.none, c: ErrorCode.topic_authorization_failed}
