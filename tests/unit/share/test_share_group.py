"""The pure KIP-932 share group (issue 25 item 4): ShareGroupHeartbeat rules, fencing, the
simple assignor, share-state initialization events, ShareGroupDescribe, and the
``__consumer_offsets`` records a restored group is rebuilt from.

Kafka's classes each test cites: GroupMetadataManager (shareGroupHeartbeat,
shareGroupLeave, throwIfShareGroupIsFull, throwIfShareGroupMemberEpochIsInvalid,
initializedAssignmentPending, subscribedTopicsChangeMap, initializeShareGroupState,
uninitializeShareGroupState), GroupCoordinatorService.throwIfShareGroupHeartbeatRequestIsInvalid,
ShareGroup, ShareGroupMember, ShareGroupAssignmentBuilder, SimpleAssignor (and its
SimpleAssignorTest), GroupCoordinatorRecordHelpers.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from headrace.group.assignors import TopicInfo
from headrace.share.group import (
    TRANSITIONS,
    Event,
    HeartbeatResult,
    IllegalGroupEvent,
    InitializeShareGroupState,
    PartitionAssignorError,
    ShareGroup,
    ShareGroupCurrentMemberAssignmentKey,
    ShareGroupCurrentMemberAssignmentValue,
    ShareGroupKey,
    ShareGroupMemberMetadataKey,
    ShareGroupMemberMetadataValue,
    ShareGroupMetadataKey,
    ShareGroupMetadataValue,
    ShareGroupSnapshot,
    ShareGroupState,
    ShareGroupStatePartitionMetadataKey,
    ShareGroupStatePartitionMetadataValue,
    ShareGroupTargetAssignmentMemberKey,
    ShareGroupTargetAssignmentMemberValue,
    ShareGroupTargetAssignmentMetadataKey,
    ShareGroupTargetAssignmentMetadataValue,
    ShareGroupValue,
    TopicPartitionsInfo,
    decode_key,
    decode_value,
    describe_unknown_group,
    encode_key,
    encode_value,
    metadata_hash,
    simple_assign,
)

T1, T2, T3, T4 = (uuid.UUID(int=i) for i in (1, 2, 3, 4))
TOPICS = {"t1": TopicInfo(T1, 3), "t2": TopicInfo(T2, 2), "t3": TopicInfo(T3, 1)}
SESSION = 45_000

Decoded = list[tuple[ShareGroupKey, ShareGroupValue | None]]


def hb(g: ShareGroup, mid: str, epoch: int, now: int = 0, names: Sequence[str] | None = None,
       topics: Mapping[str, TopicInfo] = TOPICS, **kw: Any) -> HeartbeatResult:
    return g.heartbeat(member_id=mid, member_epoch=epoch, topics=topics, now_ms=now,
                       subscribed_topic_names=names, **kw)


def complete(g: ShareGroup, event: InitializeShareGroupState | None, now: int = 0) -> None:
    assert event is not None
    g.state_initialized({t: ps for t, ps in event.topics}, now)


def join_ready(g: ShareGroup, mid: str, names: Sequence[str], now: int = 0,
               topics: Mapping[str, TopicInfo] = TOPICS,
               log: list[tuple[bytes, bytes | None]] | None = None) -> HeartbeatResult:
    """Join, let the share coordinator initialize what the join asked for, heartbeat;
    every record written goes to ``log``."""
    log = [] if log is None else log
    r = hb(g, mid, 0, now, names, topics)
    assert r.error_code is ErrorCode.none
    log += r.records
    if r.initialize is not None:
        ev = r.initialize
        log += g.state_initialized({t: ps for t, ps in ev.topics}, now)
    r = hb(g, mid, r.member_epoch, now, topics=topics)
    log += r.records
    return r


def decoded(records: Sequence[tuple[bytes, bytes | None]]) -> Decoded:
    out: Decoded = []
    for k, v in records:
        key = decode_key(k)
        assert key is not None
        out.append((key, decode_value(key, v)))
    return out


def parts(result: HeartbeatResult) -> dict[uuid.UUID, set[int]]:
    assert result.assignment is not None
    return {t: set(ps) for t, ps in result.assignment}


# ---------------------------------------------------------------------- validation


@pytest.mark.parametrize(("mid", "epoch", "names", "rack", "message"), [
    ("", 0, ["t1"], None, "MemberId can't be empty."),
    ("  ", 0, ["t1"], None, "MemberId can't be empty."),
    ("m", 0, ["t1"], "", "RackId can't be empty."),
    ("m", 0, None, None, "SubscribedTopicNames must be set in first request."),
    ("m", 0, [], None, "SubscribedTopicNames must be set in first request."),
    ("m", -2, None, None, "MemberEpoch is invalid."),
])
def test_invalid_requests_are_refused_and_change_nothing(
        mid: str, epoch: int, names: list[str] | None, rack: str | None, message: str) -> None:
    """KIP-932, GroupCoordinatorService.throwIfShareGroupHeartbeatRequestIsInvalid."""
    g = ShareGroup("g")
    r = hb(g, mid, epoch, names=names, rack_id=rack)
    assert (r.error_code, r.error_message) == (ErrorCode.invalid_request, message)
    assert r.records == () and r.initialize is None
    assert g.members == {} and g.group_epoch == 0 and g.state is ShareGroupState.EMPTY


# ---------------------------------------------------------------------- join and epochs


def test_join_uses_the_client_member_id_and_asks_for_state_initialization() -> None:
    """KIP-932 (4.2: the member id is generated by the client); GroupMetadataManager.
    shareGroupHeartbeat + maybeCreateInitializeShareGroupStateRequest: nothing is assigned
    before the share partitions' state is initialized; the join asks for all of them."""
    g = ShareGroup("g")
    r = hb(g, "client-uuid-1", 0, now=100, names=["t1", "t2"], client_id="c",
           client_host="/1.2.3.4")
    assert r.error_code is ErrorCode.none
    assert (r.member_id, r.member_epoch, r.heartbeat_interval_ms) == ("client-uuid-1", 1, 5000)
    assert r.assignment == ()  # joined: sent, but empty
    assert r.initialize == InitializeShareGroupState("g", 1, ((T1, (0, 1, 2)), (T2, (0, 1))))
    assert g.state is ShareGroupState.STABLE
    assert g.initializing[T1].partitions == {0, 1, 2} and g.initializing[T1].timestamp_ms == 100
    assert [type(k).__name__ for k, _ in decoded(r.records)] == [
        "ShareGroupMemberMetadataKey", "ShareGroupMetadataKey",
        "ShareGroupTargetAssignmentMemberKey", "ShareGroupTargetAssignmentMetadataKey",
        "ShareGroupCurrentMemberAssignmentKey", "ShareGroupStatePartitionMetadataKey"]
    recs = dict(decoded(r.records))
    assert recs[ShareGroupMemberMetadataKey("g", "client-uuid-1")] == (
        ShareGroupMemberMetadataValue(None, "c", "/1.2.3.4", ("t1", "t2")))
    assert recs[ShareGroupCurrentMemberAssignmentKey("g", "client-uuid-1")] == (
        ShareGroupCurrentMemberAssignmentValue(1, 0, 0, ()))
    sp = recs[ShareGroupStatePartitionMetadataKey("g")]
    assert isinstance(sp, ShareGroupStatePartitionMetadataValue)
    assert sp.initializing_topics == (TopicPartitionsInfo(T1, "t1", (0, 1, 2)),
                                      TopicPartitionsInfo(T2, "t2", (0, 1)))
    assert sp.initialized_topics == ()


def test_initialized_partitions_are_assigned_on_the_next_heartbeat() -> None:
    """GroupMetadataManager.initializeShareGroupState then initializedAssignmentPending:
    initialized partitions not in the target bump the group epoch and get assigned."""
    g = ShareGroup("g")
    r = hb(g, "m", 0, names=["t1"])
    recs = g.state_initialized({T1: [0, 1]}, 5)
    sp = dict(decoded(recs))[ShareGroupStatePartitionMetadataKey("g")]
    assert isinstance(sp, ShareGroupStatePartitionMetadataValue)
    assert sp.initializing_topics == (TopicPartitionsInfo(T1, "t1", (2,)),)
    assert sp.initialized_topics == (TopicPartitionsInfo(T1, "t1", (0, 1)),)
    r = hb(g, "m", 1, now=10)
    assert (r.member_epoch, g.group_epoch, g.assignment_epoch) == (2, 2, 2)
    assert parts(r) == {T1: {0, 1}}  # partition 2 is still initializing: not assignable
    assert r.initialize is None
    g.state_initialized({T1: [2]}, 20)
    r = hb(g, "m", 2, now=30)
    assert r.member_epoch == 3 and parts(r) == {T1: {0, 1, 2}}
    # nothing pending any more: a plain heartbeat changes nothing and writes nothing
    r = hb(g, "m", 3, now=40)
    assert (r.member_epoch, r.assignment, r.records, r.initialize) == (3, None, (), None)


def test_initialization_is_retried_after_the_retry_interval_or_a_failure() -> None:
    """GroupMetadataManager.subscribedTopicsChangeMap (group.share.initialize.retry.
    interval.ms 30000) and uninitializeShareGroupState."""
    g = ShareGroup("g")
    first = hb(g, "m", 0, now=0, names=["t3"]).initialize
    assert first is not None and first.topics == ((T3, (0,)),)
    assert hb(g, "m", 1, now=29_999).initialize is None
    again = hb(g, "m", 1, now=30_000).initialize
    assert again is not None and again.topics == ((T3, (0,)),)
    assert g.initializing[T3].timestamp_ms == 30_000
    g.state_initialize_failed({T3: [0]})
    assert T3 not in g.initializing
    retried = hb(g, "m", 1, now=30_001).initialize
    assert retried is not None and retried.topics == ((T3, (0,)),)


def test_subscription_change_bumps_the_epoch_and_assigns_directly() -> None:
    """ShareGroupAssignmentBuilder: no revocation phase — the member moves straight to its
    new target at the new epoch."""
    g = ShareGroup("g")
    join_ready(g, "m", ["t1"])
    assert g.members["m"].assigned == {T1: {0, 1, 2}}
    epoch = g.members["m"].member_epoch
    r = hb(g, "m", epoch, names=["t2"])
    assert r.member_epoch == epoch + 1 and r.assignment == ()  # t2 not initialized yet
    complete(g, r.initialize)
    r = hb(g, "m", r.member_epoch)
    assert parts(r) == {T2: {0, 1}}
    assert g.members["m"].previous_member_epoch == epoch + 1


def test_topic_metadata_change_bumps_the_epoch_and_initializes_new_partitions() -> None:
    """KIP-932: the group epoch bumps when a subscribed topic's metadata changes (Kafka's
    metadata hash); the new partitions are initialized, then assigned."""
    g = ShareGroup("g")
    r = join_ready(g, "m", ["t1"])
    epoch = r.member_epoch
    bigger = {**TOPICS, "t1": TopicInfo(T1, 4)}
    r = hb(g, "m", epoch, topics=bigger)
    assert r.member_epoch == epoch + 1
    assert r.initialize is not None and r.initialize.topics == ((T1, (3,)),)
    complete(g, r.initialize)
    r = hb(g, "m", r.member_epoch, topics=bigger)
    assert parts(r) == {T1: {0, 1, 2, 3}}


def test_a_deleted_topic_bumps_the_epoch_once() -> None:
    """KIP-932: deleting a subscribed topic changes the metadata (one epoch bump, its
    partitions leave the assignment); its initialized state does not bump it again."""
    g = ShareGroup("g")
    r = join_ready(g, "m", ["t1", "t3"])
    without_t3 = {n: i for n, i in TOPICS.items() if n != "t3"}
    r = hb(g, "m", r.member_epoch, topics=without_t3)
    assert r.member_epoch == 3 and parts(r) == {T1: {0, 1, 2}}
    r = hb(g, "m", 3, topics=without_t3)
    assert (r.member_epoch, r.records, g.group_epoch) == (3, (), 3)


def test_member_epochs_unknown_member_and_fencing() -> None:
    """GroupMetadataManager.throwIfShareGroupMemberEpochIsInvalid and ShareGroup.
    getOrMaybeCreateMember (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH)."""
    g = ShareGroup("g")
    join_ready(g, "m", ["t1"])
    m = g.members["m"]
    assert (m.member_epoch, m.previous_member_epoch) == (2, 1)
    assert hb(g, "ghost", 2).error_code is ErrorCode.unknown_member_id
    assert hb(g, "m", 3).error_code is ErrorCode.fenced_member_epoch
    assert hb(g, "m", 0, names=["t1"]).error_code is ErrorCode.fenced_member_epoch
    # the previous epoch is accepted: the response with the bumped epoch was lost
    r = hb(g, "m", 1)
    assert r.error_code is ErrorCode.none and r.member_epoch == 2
    assert (m.member_epoch, m.previous_member_epoch) == (2, 1)


def test_rejoin_with_epoch_zero_is_accepted_only_when_zero_is_the_previous_epoch() -> None:
    """throwIfShareGroupMemberEpochIsInvalid: a member whose join response was lost
    retries with epoch 0 (its previous epoch)."""
    g = ShareGroup("g")
    r = hb(g, "m", 0, names=["t1"])
    assert r.member_epoch == 1
    again = hb(g, "m", 0, names=["t1"])
    assert again.error_code is ErrorCode.none and again.member_epoch == 1
    assert again.assignment == ()  # epoch 0: the assignment is always sent


def test_group_max_size() -> None:
    """GroupMetadataManager.throwIfShareGroupIsFull (group.share.max.size)."""
    g = ShareGroup("g", max_size=2)
    hb(g, "a", 0, names=["t1"])
    hb(g, "b", 0, names=["t1"])
    r = hb(g, "c", 0, names=["t1"])
    assert r.error_code is ErrorCode.group_max_size_reached
    assert "maximum capacity of 2" in (r.error_message or "")
    assert hb(g, "c", 4).error_code is ErrorCode.group_max_size_reached
    assert set(g.members) == {"a", "b"}
    assert hb(g, "a", g.members["a"].member_epoch).error_code is ErrorCode.none


def test_assignment_is_sent_only_when_needed() -> None:
    """shareGroupHeartbeat: the assignment goes out on a join, a full request (topic names
    given) or when it changed."""
    g = ShareGroup("g")
    r = join_ready(g, "m", ["t1"])
    e = r.member_epoch
    assert hb(g, "m", e).assignment is None
    assert parts(hb(g, "m", e, names=["t1"])) == {T1: {0, 1, 2}}


# ---------------------------------------------------------------------- assignment in a group


def test_second_member_takes_its_share_at_once_and_the_first_on_its_heartbeat() -> None:
    """SimpleAssignor in the group: balance within one partition; every member gets its
    target directly on its own heartbeat (ShareGroupAssignmentBuilder)."""
    g = ShareGroup("g")
    join_ready(g, "a", ["t1", "t2"])
    assert g.members["a"].assigned == {T1: {0, 1, 2}, T2: {0, 1}}
    r = hb(g, "b", 0, names=["t1", "t2"])
    b_parts = parts(r)
    assert sum(len(ps) for ps in b_parts.values()) == 2
    # a still holds all five until it heartbeats; then it has the other three
    assert sum(len(ps) for ps in g.members["a"].assigned.values()) == 5
    ra = hb(g, "a", g.members["a"].member_epoch)
    a_parts = parts(ra)
    assert ra.member_epoch == g.assignment_epoch == r.member_epoch
    assert sum(len(ps) for ps in a_parts.values()) == 3
    every = {(t, p) for d in (a_parts, b_parts) for t, ps in d.items() for p in ps}
    assert len(every) == 5


def test_more_members_than_partitions_share_the_partitions() -> None:
    """KIP-932: a partition is shared by several members when members > partitions
    (SimpleHomogeneousAssignmentBuilder.desiredSharing)."""
    g = ShareGroup("g")
    join_ready(g, "a", ["t3"])
    hb(g, "b", 0, names=["t3"])
    hb(g, "c", 0, names=["t3"])
    for mid in "abc":
        hb(g, mid, g.members[mid].member_epoch)
    assert all(m.assigned == {T3: {0}} for m in g.members.values())


# ---------------------------------------------------------------------- leave and timeouts


def test_leave_removes_the_member_and_bumps_the_epoch() -> None:
    """GroupMetadataManager.shareGroupLeave / shareGroupFenceMember: tombstones for the
    member's three records, then the bumped group epoch; the response carries epoch -1."""
    g = ShareGroup("g")
    join_ready(g, "a", ["t1"])
    hb(g, "b", 0, names=["t1"])
    hb(g, "a", g.members["a"].member_epoch)
    assert len(g.members["a"].assigned[T1]) == 2
    epoch = g.group_epoch
    r = hb(g, "b", -1)
    assert (r.error_code, r.member_id, r.member_epoch) == (ErrorCode.none, "b", -1)
    assert g.group_epoch == epoch + 1 and set(g.members) == {"a"} and "b" not in g.target
    recs = decoded(r.records)
    assert recs[:3] == [(ShareGroupCurrentMemberAssignmentKey("g", "b"), None),
                        (ShareGroupTargetAssignmentMemberKey("g", "b"), None),
                        (ShareGroupMemberMetadataKey("g", "b"), None)]
    assert isinstance(recs[3][1], ShareGroupMetadataValue) and recs[3][1].epoch == epoch + 1
    # the target waits for a heartbeat, which gives a everything back
    r = hb(g, "a", g.members["a"].member_epoch)
    assert parts(r) == {T1: {0, 1, 2}} and g.assignment_epoch == g.group_epoch
    assert hb(g, "b", -1).error_code is ErrorCode.unknown_member_id
    assert hb(g, "a", -1).error_code is ErrorCode.none
    assert g.state is ShareGroupState.EMPTY


def test_session_timeout_with_a_manual_clock() -> None:
    """KIP-932 group.share.session.timeout.ms (45000): every heartbeat moves the deadline;
    an expired member is fenced like a leave (scheduleShareGroupSessionTimeout)."""
    g = ShareGroup("g")
    hb(g, "a", 0, now=0, names=["t1"])
    hb(g, "b", 0, now=10_000, names=["t1"])
    assert g.tick(44_999) .expired == ()
    hb(g, "a", g.members["a"].member_epoch, now=30_000)
    epoch = g.group_epoch
    t = g.tick(55_000, TOPICS)
    assert t.expired == ("b",) and set(g.members) == {"a"} and g.group_epoch == epoch + 1
    assert (ShareGroupMemberMetadataKey("g", "b"), None) in decoded(t.records)
    assert g.tick(74_999).expired == ()
    assert g.tick(75_000).expired == ("a",)
    assert g.state is ShareGroupState.EMPTY
    assert g.tick(80_000) == g.tick(80_000)  # nothing left: no records


# ---------------------------------------------------------------------- states and describe


def test_transitions_table_and_illegal_events() -> None:
    """ShareGroup.ShareGroupState (Empty, Stable, Dead); DeleteGroups needs an empty group
    (ShareGroup.validateDeleteGroup); a dead group takes no event."""
    assert TRANSITIONS[Event.DELETE][0] == {ShareGroupState.EMPTY}
    g = ShareGroup("g")
    hb(g, "a", 0, names=["t1"])
    with pytest.raises(IllegalGroupEvent):
        g.mark_dead()
    assert g.state is ShareGroupState.STABLE and "a" in g.members
    hb(g, "a", -1)
    tombstones = decoded(g.mark_dead())
    assert all(v is None for _, v in tombstones)
    assert tombstones[-2:] == [(ShareGroupStatePartitionMetadataKey("g"), None),
                               (ShareGroupMetadataKey("g"), None)]
    assert g.state is ShareGroupState.DEAD
    with pytest.raises(IllegalGroupEvent):
        hb(g, "a", 0, names=["t1"])
    with pytest.raises(IllegalGroupEvent):
        g.state_initialized({T1: [0]}, 0)
    with pytest.raises(IllegalGroupEvent):
        g.mark_dead()


def test_describe() -> None:
    """ShareGroupDescribeResponse's DescribedGroup fields (ShareGroup.asDescribedGroup,
    ShareGroupMember.asShareGroupDescribeMember); an unknown group: GROUP_ID_NOT_FOUND."""
    g = ShareGroup("g")
    join_ready(g, "m", ["t3"])
    hb(g, "m", g.members["m"].member_epoch, rack_id="r1", client_id="cli", client_host="/h")
    d = g.describe()
    assert {k: d[k] for k in ("group_id", "group_state", "group_epoch", "assignment_epoch",
                              "assignor_name")} == {
        "group_id": "g", "group_state": "Stable", "group_epoch": 2, "assignment_epoch": 2,
        "assignor_name": "simple"}
    assert d["members"] == [{
        "member_id": "m", "rack_id": "r1", "member_epoch": 2, "client_id": "cli",
        "client_host": "/h", "subscribed_topic_names": ("t3",),
        "assignment": {"topic_partitions": [
            {"topic_id": T3, "topic_name": "t3", "partitions": (0,)}]}}]
    assert describe_unknown_group("x")["error_code"] is ErrorCode.group_id_not_found


# ---------------------------------------------------------------------- records


def test_key_bytes_are_kafkas() -> None:
    """GroupCoordinatorRecordHelpers: int16 record type (ShareGroupMetadataKey 11,
    ShareGroupMemberMetadataKey 10, ...) then int16-length strings."""
    assert encode_key(ShareGroupMetadataKey("g")) == b"\x00\x0b\x00\x01g"
    assert encode_key(ShareGroupMemberMetadataKey("g", "m")) == b"\x00\x0a\x00\x01g\x00\x01m"
    assert encode_key(ShareGroupStatePartitionMetadataKey("g"))[:2] == b"\x00\x0f"
    assert encode_value(ShareGroupMetadataValue(7, -1)) == (
        b"\x00\x00" + b"\x00\x00\x00\x07" + b"\xff" * 8 + b"\x00")
    assert decode_key(b"\x00\x03\x00\x01g") is None  # a consumer-group key: not ours


_uuids = st.builds(uuid.UUID, int=st.integers(0, 2**128 - 1))
_names = st.text(max_size=8)
_tps = st.lists(st.tuples(_uuids, st.lists(st.integers(-2**31, 2**31 - 1), max_size=4)
                          .map(tuple)), max_size=3).map(tuple)
_infos = st.lists(st.builds(TopicPartitionsInfo, _uuids, _names,
                            st.lists(st.integers(0, 99), max_size=4).map(tuple)),
                  max_size=3).map(tuple)
_values = st.one_of(
    st.builds(ShareGroupMemberMetadataValue, st.none() | _names, _names, _names,
              st.lists(_names, max_size=3).map(tuple)),
    st.builds(ShareGroupMetadataValue, st.integers(-2**31, 2**31 - 1),
              st.integers(-2**63, 2**63 - 1)),
    st.builds(ShareGroupTargetAssignmentMetadataValue, st.integers(-2**31, 2**31 - 1)),
    st.builds(ShareGroupTargetAssignmentMemberValue, _tps),
    st.builds(ShareGroupCurrentMemberAssignmentValue, st.integers(-2**31, 2**31 - 1),
              st.integers(-2**31, 2**31 - 1), st.integers(-128, 127), _tps),
    st.builds(ShareGroupStatePartitionMetadataValue, _infos, _infos,
              st.lists(st.tuples(_uuids, _names), max_size=2).map(tuple)),
)
_KEY_FOR = {
    ShareGroupMemberMetadataValue: lambda: ShareGroupMemberMetadataKey("g", "m"),
    ShareGroupMetadataValue: lambda: ShareGroupMetadataKey("g"),
    ShareGroupTargetAssignmentMetadataValue: lambda: ShareGroupTargetAssignmentMetadataKey("g"),
    ShareGroupTargetAssignmentMemberValue: lambda: ShareGroupTargetAssignmentMemberKey("g", "m"),
    ShareGroupCurrentMemberAssignmentValue:
        lambda: ShareGroupCurrentMemberAssignmentKey("g", "m"),
    ShareGroupStatePartitionMetadataValue: lambda: ShareGroupStatePartitionMetadataKey("g"),
}


@settings(max_examples=200, deadline=None)
@given(_values)
def test_values_round_trip(value: ShareGroupValue) -> None:
    """The share-group record values (v0, flexible) decode to what was encoded."""
    key = _KEY_FOR[type(value)]()
    assert decode_key(encode_key(key)) == key
    assert decode_value(key, encode_value(value)) == value


def replay(records: Sequence[tuple[bytes, bytes | None]]) -> ShareGroupSnapshot:
    snap = ShareGroupSnapshot()
    for k, v in records:
        key = decode_key(k)
        assert key is not None
        snap.replay(key, decode_value(key, v))
    return snap


def state_of(g: ShareGroup) -> tuple[Any, ...]:
    return (g.group_epoch, g.assignment_epoch, g.metadata_hash, g.target,
            {m.member_id: (m.rack_id, m.client_id, m.client_host, m.subscribed_topic_names,
                           m.member_epoch, m.previous_member_epoch, m.assigned)
             for m in g.members.values()},
            {t: (e.name, e.partitions) for t, e in g.initialized.items()},
            {t: (e.name, e.partitions) for t, e in g.initializing.items()})


def test_replaying_the_records_rebuilds_the_group() -> None:
    """KIP-932: the share group's state lives in __consumer_offsets; replaying every record
    written (tombstones included) rebuilds it, and a member carries on at its epoch."""
    g = ShareGroup("g")
    log: list[tuple[bytes, bytes | None]] = []
    join_ready(g, "a", ["t1", "t2"], log=log)
    log += hb(g, "b", 0, names=["t1", "t3"], rack_id="r").records
    log += hb(g, "c", 0, now=1, names=["t2"]).records
    log += hb(g, "c", -1).records
    log += g.tick(SESSION + 1, TOPICS).records  # a and b expire ...
    join_ready(g, "d", ["t1"], now=SESSION + 2, log=log)  # ... d joins
    log += hb(g, "e", 0, now=SESSION + 3, names=["t3"]).records
    restored = ShareGroup("g")
    restored.restore(replay(log), now_ms=100_000)
    assert state_of(restored) == state_of(g)
    assert all(m.session_deadline_ms == 100_000 + SESSION for m in restored.members.values())
    d = restored.members["d"]
    assert d.member_epoch == 8 and restored.group_epoch == 9  # e joined after d's heartbeat
    r = hb(restored, "d", 8, now=100_001)
    assert (r.error_code, r.member_epoch, restored.group_epoch) == (ErrorCode.none, 9, 9)
    assert [type(k) for k, _ in decoded(r.records)] == [ShareGroupCurrentMemberAssignmentKey]
    assert hb(restored, "d", 9, now=100_002).records == ()


def test_a_target_outside_the_subscription_is_filtered() -> None:
    """ShareGroupAssignmentBuilder.filterAssignedPartitions: a member only ever gets
    partitions of topics it subscribes to, even when the stored target says otherwise."""
    snap = ShareGroupSnapshot(epoch=3, assignment_epoch=3, members={
        "m": ShareGroupMemberMetadataValue(None, "", "", ("t1",))},
        targets={"m": ((T1, (0, 1, 2)), (T2, (0,)))},
        current={"m": ShareGroupCurrentMemberAssignmentValue(2, 1, 0, ((T1, (0, 1, 2)),))})
    g = ShareGroup("g")
    g.restore(snap, 0)
    g.metadata_hash = metadata_hash({"t1": TOPICS["t1"]})  # as stored: no bump
    r = hb(g, "m", 2)
    assert r.member_epoch == 3 and g.members["m"].assigned == {T1: {0, 1, 2}}


def test_a_failed_append_is_written_again() -> None:
    """The shell's append failed: forget_written makes the next call write those records."""
    g = ShareGroup("g")
    first = hb(g, "a", 0, names=["t1"]).records
    g.forget_written()
    again = hb(g, "a", 1).records
    assert set(first) <= set(again)


# ---------------------------------------------------------------------- the simple assignor


def covered(assignment: Mapping[str, Mapping[uuid.UUID, frozenset[int]]]) -> set[Any]:
    return {(t, p) for parts_ in assignment.values() for t, ps in parts_.items() for p in ps}


def test_simple_assignor_empty_cases() -> None:
    """SimpleAssignorTest.testAssignWithEmptyMembers / testAssignWithNoSubscribedTopic /
    testAssignWithSubscribedToNonExistentTopic."""
    assert simple_assign({}, {T1: [0, 1, 2]}, {}) == {}
    assert simple_assign({"A": frozenset()}, {T1: [0, 1, 2]}, {}) == {"A": {}}
    with pytest.raises(PartitionAssignorError):
        simple_assign({"A": frozenset({T2})}, {T1: [0, 1, 2]}, {})


@pytest.mark.parametrize(("assignable", "expected"), [
    ({T1: [0, 1, 2], T3: [0, 1]}, 5),  # testAssignWithTwoMembersAndTwoTopicsHomogeneous
    ({T1: [0, 1, 2], T3: [0, 1]}, 5),  # ...WithAllowedMap (T3 has 3, only 0 and 1 allowed)
    ({T1: [0, 1, 2], T3: []}, 3),  # ...WithNonAssignableTopic
])
def test_simple_assignor_homogeneous(assignable: dict[uuid.UUID, list[int]],
                                     expected: int) -> None:
    """SimpleAssignorTest: two members, two topics, every assignable partition assigned,
    balanced within one."""
    subs = frozenset({T1, T3})
    out = simple_assign({"A": subs, "B": subs}, assignable, {})
    assert len(covered(out)) == expected
    sizes = sorted(sum(len(ps) for ps in p.values()) for p in out.values())
    assert sizes[-1] - sizes[0] <= 1


def test_simple_assignor_heterogeneous_examples() -> None:
    """SimpleAssignorTest.testAssignWithThreeMembersThreeTopicsHeterogeneous (+ the allowed
    map and non-assignable-topic variants, whose exact result we match) and
    testAssignWithOneMemberNoAssignedTopicHeterogeneous."""
    subs = {"A": frozenset({T1, T2}), "B": frozenset({T3}), "C": frozenset({T2, T3})}
    assert len(covered(simple_assign(subs, {T1: [0, 1, 2], T2: [0, 1, 2], T3: [0, 1]},
                                     {}))) == 8
    assert len(covered(simple_assign(subs, {T1: [0, 1], T2: [0, 2], T3: [1]}, {}))) == 5
    assert simple_assign(subs, {T1: [0, 1, 2], T2: [0, 1, 2], T3: []}, {}) == {
        "A": {T1: {0, 1, 2}, T2: {0, 2}}, "B": {}, "C": {T2: {1}}}
    assert simple_assign({"A": frozenset({T1, T2}), "B": frozenset()},
                         {T1: [0, 1, 2], T2: [0, 1]}, {}) == {
        "A": {T1: {0, 1, 2}, T2: {0, 1}}, "B": {}}


def test_simple_assignor_current_assignment_heterogeneous() -> None:
    """SimpleAssignorTest.testAssignWithCurrentAssignmentHeterogeneous."""
    first = simple_assign({"A": frozenset({T1, T2}), "B": frozenset({T3}),
                           "C": frozenset({T2, T3})},
                          {T1: [0, 1, 2], T2: [0, 1, 2], T3: [0, 1]}, {})
    assert len(covered(first)) == 8
    second = simple_assign(
        {"A": frozenset({T1, T2, T3}), "B": frozenset({T3, T4})},
        {T1: [0, 1, 2], T2: [0, 1, 2], T3: [0, 1], T4: [0]},
        {"A": {T1: frozenset({0, 1, 2}), T2: frozenset({0, 2})}, "B": {T3: frozenset({0, 1})}})
    assert len(covered(second)) == 9


SUBSCRIPTIONS = [frozenset({T1, T2, T3}), frozenset({T2}), frozenset({T3}),
                 frozenset({T1, T2})]
INCREMENTAL_TOPICS = {T1: list(range(12)), T2: list(range(8)), T3: list(range(4))}


def _check_sharing(out: Mapping[str, Mapping[uuid.UUID, frozenset[int]]],
                   subs: Mapping[str, frozenset[uuid.UUID]]) -> None:
    for t, ps in INCREMENTAL_TOPICS.items():
        n_subs = sum(1 for s in subs.values() if t in s)
        if not n_subs:
            continue
        sharing = -(-n_subs // len(ps))
        for p in ps:
            holders = [m for m, a in out.items() if p in a.get(t, ())]
            assert 1 <= len(holders) <= sharing
            assert all(t in subs[m] for m in holders)


@pytest.mark.parametrize("heterogeneous", [False, True])
def test_simple_assignor_incremental_members(heterogeneous: bool) -> None:
    """SimpleAssignorTest.testIncrementalAssignment{Increasing,Decreasing}Members
    {Homogeneous,Heterogeneous}: 24 partitions, members added one at a time up to 101 and
    removed again, the previous result as the current assignment each time; every partition
    assigned at every step, each to at most ceil(subscribers/partitions) members."""
    def sub(i: int) -> frozenset[uuid.UUID]:
        return SUBSCRIPTIONS[i % 4] if heterogeneous else frozenset({T1, T2, T3})

    subs: dict[str, frozenset[uuid.UUID]] = {}
    current: dict[str, Any] = {}
    for i in range(101):
        subs[f"M{i}"] = sub(i)
        current = simple_assign(subs, INCREMENTAL_TOPICS, current)
        assert len(covered(current)) == 24
        _check_sharing(current, subs)
    for i in range(100, 0, -1):
        del subs[f"M{i}"]
        current = simple_assign(subs, INCREMENTAL_TOPICS,
                                {m: a for m, a in current.items() if m in subs})
        assert len(covered(current)) == 24
        _check_sharing(current, subs)


def test_simple_assignor_is_sticky_when_a_member_joins() -> None:
    """SimpleAssignor: stickiness after balance — a new member takes partitions only from
    the others' surplus; nobody gets a partition it did not have except the newcomer."""
    subs = {m: frozenset({T1}) for m in "ABCD"}
    before = simple_assign(subs, {T1: list(range(8))}, {})
    after = simple_assign({**subs, "E": frozenset({T1})}, {T1: list(range(8))}, before)
    for m in "ABCD":
        assert after[m].get(T1, frozenset()) <= before[m][T1]
    assert sorted(len(a.get(T1, ())) for a in after.values()) == [1, 1, 2, 2, 2]


def test_simple_assignor_takes_over_shared_partitions_from_over_filled_members_first() -> None:
    """SimpleHomogeneousAssignmentBuilder.revokeOversharedPartitions: "prefer to revoke from
    overfilled members first", so the member holding only its share keeps it."""
    subs = {"A": frozenset({T1}), "B": frozenset({T1})}
    out = simple_assign(subs, {T1: [0, 1]}, {"A": {T1: frozenset({0, 1})},
                                              "B": {T1: frozenset({0})}})
    assert out == {"A": {T1: {1}}, "B": {T1: {0}}}


# ---------------------------------------------------------------------- property


MEMBERS = ["m0", "m1", "m2", "m3", "m4"]
NAMES = ["t1", "t2", "t3"]
_ops = st.lists(st.one_of(
    st.tuples(st.just("join"), st.sampled_from(MEMBERS),
              st.sets(st.sampled_from(NAMES), min_size=1).map(sorted)),
    st.tuples(st.just("heartbeat"), st.sampled_from(MEMBERS),
              st.none() | st.sets(st.sampled_from(NAMES), min_size=1).map(sorted)),
    st.tuples(st.just("leave"), st.sampled_from(MEMBERS), st.none()),
    st.tuples(st.just("time"), st.integers(1, 60_000), st.none()),
    st.tuples(st.just("initialized"), st.none(), st.none()),
), max_size=40)


def _check_target(g: ShareGroup) -> None:
    """Every initialized partition of a topic some live member subscribes to is in the
    target of at least one live member that subscribes to it; targets stay in
    subscriptions."""
    ids = {TOPICS[n].topic_id: n for n in TOPICS}
    for mid, target in g.target.items():
        assert mid in g.members
        assert all(ids[t] in g.members[mid].subscribed_topic_names for t in target)
    for t, e in g.initialized.items():
        subscribers = [m for m in g.members.values() if e.name in m.subscribed_topic_names]
        for p in e.partitions:
            if subscribers:
                assert any(p in g.target.get(m.member_id, {}).get(t, ()) for m in subscribers)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_random_joins_leaves_heartbeats_and_timeouts(ops: list[tuple[Any, Any, Any]]) -> None:
    """KIP-932 invariants under random joins, leaves, heartbeats, expiries and completed
    initializations: after every accepted heartbeat the target covers every initialized
    subscribed partition; a member's assignment is only of its subscribed topics; group,
    assignment and member epochs never go down; replaying the records rebuilds the group."""
    g = ShareGroup("g")
    now = 0
    log: list[tuple[bytes, bytes | None]] = []
    pending: list[InitializeShareGroupState] = []
    member_epochs: dict[str, int] = {}
    ids = {TOPICS[n].topic_id: n for n in TOPICS}
    for op, a, b in ops:
        before = (g.group_epoch, g.assignment_epoch)
        if op == "time":
            now += a
            t = g.tick(now, TOPICS)
            log += t.records
            for mid in t.expired:
                member_epochs.pop(mid)
        elif op == "initialized":
            if pending:
                ev = pending.pop(0)
                log += g.state_initialized({t: ps for t, ps in ev.topics}, now)
        else:
            member = g.members.get(a)
            if op == "join":
                epoch, names = (0, b)
            elif op == "leave":
                epoch, names = (-1, None)
            else:
                epoch, names = (member.member_epoch if member else 1), b
            r = hb(g, a, epoch, now, names)
            log += r.records
            if r.initialize is not None:
                pending.append(r.initialize)
            if r.error_code is ErrorCode.none and op != "leave":
                assert g.group_epoch == g.assignment_epoch == r.member_epoch
                _check_target(g)
                assert r.member_epoch >= member_epochs.get(a, 0)
                member_epochs[a] = r.member_epoch
            elif op == "leave" and r.error_code is ErrorCode.none:
                member_epochs.pop(a)
            elif member is None:
                assert r.error_code is ErrorCode.unknown_member_id or op == "join"
        assert (g.group_epoch, g.assignment_epoch) >= before
        for m in g.members.values():
            assert all(ids[t] in m.subscribed_topic_names for t in m.assigned)
            assert m.member_epoch <= g.group_epoch
    # every live member heartbeats once: the current assignments cover every initialized
    # partition of a subscribed topic
    for mid in sorted(g.members):
        log += hb(g, mid, g.members[mid].member_epoch, now).records
    if g.members:
        held = {(t, p) for m in g.members.values() for t, ps in m.assigned.items() for p in ps}
        for t, e in g.initialized.items():
            if e.name in g.subscribed_topic_names():
                assert {(t, p) for p in e.partitions} <= held
    restored = ShareGroup("g")
    restored.restore(replay(log), now)
    assert state_of(restored) == state_of(g)
