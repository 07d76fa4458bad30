"""The pure KIP-848 consumer group (issue 3 item 3): epochs, reconciliation, timers, fencing,
and its ``__consumer_offsets`` records (R-GRP-6/7): what each event writes, and a group
restored from them equals the original."""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from headrace.group.assignors import TopicInfo
from headrace.group.base import Group
from headrace.group.consumer_group import (
    TRANSITIONS,
    ConsumerGroup,
    ConsumerGroupSnapshot,
    Event,
    GroupState,
    HeartbeatResult,
    IllegalGroupEvent,
    MemberState,
)
from headrace.group.records import (
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupCurrentMemberAssignmentValue,
    ConsumerGroupMemberMetadataKey,
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    ConsumerGroupPartitionMetadataKey,
    ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupTargetAssignmentMetadataKey,
    GroupKey,
    decode_key,
    decode_value,
)

A = uuid.UUID(int=0xA)
B = uuid.UUID(int=0xB)
SESSION = 45_000
REBALANCE = 30_000


def topics(**sizes: int) -> dict[str, TopicInfo]:
    ids = {"a": A, "b": B}
    return {n: TopicInfo(ids.get(n, uuid.UUID(int=hash(n) & 0xFFFF)), k)
            for n, k in sizes.items()}


def new_group(**kw: Any) -> ConsumerGroup:
    counter = itertools.count()
    return ConsumerGroup("g", new_member_id=lambda: f"gen-{next(counter)}", **kw)


def owned_of(r: HeartbeatResult) -> list[tuple[uuid.UUID, list[int]]]:
    assert r.assignment is not None
    return [(t, list(ps)) for t, ps in r.assignment]


def parts(r: HeartbeatResult) -> set[tuple[uuid.UUID, int]]:
    assert r.assignment is not None
    return {(t, p) for t, ps in r.assignment for p in ps}


class Client:
    """A well-behaved consumer: owns exactly what it was last given, acks at once."""

    def __init__(self, group: ConsumerGroup, member_id: str, names: Sequence[str] = ("a",),
                 **join: Any) -> None:
        self.group = group
        self.member_id = member_id
        self.names = list(names)
        self.epoch = 0
        self.owned: set[tuple[uuid.UUID, int]] = set()
        self.join_kw = join

    def owned_list(self) -> list[tuple[uuid.UUID, list[int]]]:
        out: dict[uuid.UUID, list[int]] = {}
        for t, p in sorted(self.owned, key=lambda tp: (str(tp[0]), tp[1])):
            out.setdefault(t, []).append(p)
        return list(out.items())

    def beat(self, md: dict[str, TopicInfo], now_ms: int, **kw: Any) -> HeartbeatResult:
        if self.epoch == 0:
            args: dict[str, Any] = dict(rebalance_timeout_ms=REBALANCE,
                                        subscribed_topic_names=self.names,
                                        topic_partitions=[], **self.join_kw)
        else:
            args = dict(topic_partitions=self.owned_list())
        args.update(kw)
        r = self.group.heartbeat(member_id=self.member_id, member_epoch=self.epoch,
                                 topics=md, now_ms=now_ms, **args)
        if r.error_code is ErrorCode.none:
            self.member_id = r.member_id or self.member_id
            self.epoch = r.member_epoch
            if r.assignment is not None:
                self.owned = parts(r)
        return r


def settle(clients: list[Client], md: dict[str, TopicInfo], now_ms: int,
           rounds: int = 10) -> None:
    for _ in range(rounds):
        for c in clients:
            assert c.beat(md, now_ms).error_code is ErrorCode.none
    assert clients[0].group.state is GroupState.STABLE


def assert_disjoint_cover(clients: list[Client], md: dict[str, TopicInfo]) -> None:
    seen: set[tuple[uuid.UUID, int]] = set()
    for c in clients:
        assert not (seen & c.owned)
        seen |= c.owned
    subscribed = {n for c in clients for n in c.names}
    assert seen == {(md[n].topic_id, p) for n in subscribed if n in md
                    for p in range(md[n].num_partitions)}


# ---------------------------------------------------------------------- basics


def test_satisfies_group_protocol_and_starts_empty() -> None:
    g = new_group()
    assert isinstance(g, Group)
    assert (g.group_type, g.protocol_type, g.state_name) == ("consumer", "consumer", "Empty")
    assert g.is_empty()
    assert g.tick(10**9) is False


def test_first_member_gets_everything_and_group_is_stable() -> None:
    g = new_group(heartbeat_interval_ms=500)
    md = topics(a=3)
    r = g.heartbeat(member_id="m1", member_epoch=0, topics=md, now_ms=0,
                    rebalance_timeout_ms=REBALANCE, subscribed_topic_names=["a"],
                    topic_partitions=[], client_id="cid", client_host="/1.2.3.4")
    assert r.error_code is ErrorCode.none
    assert (r.member_id, r.member_epoch, r.heartbeat_interval_ms) == ("m1", 1, 500)
    assert owned_of(r) == [(A, [0, 1, 2])]
    assert g.state is GroupState.STABLE and (g.group_epoch, g.assignment_epoch) == (1, 1)
    # steady heartbeat: no assignment sent
    r = g.heartbeat(member_id="m1", member_epoch=1, topics=md, now_ms=100,
                    topic_partitions=[(A, [0, 1, 2])])
    assert (r.error_code, r.member_epoch, r.assignment) == (ErrorCode.none, 1, None)
    r = g.heartbeat(member_id="m1", member_epoch=1, topics=md, now_ms=200)
    assert (r.error_code, r.assignment) == (ErrorCode.none, None)


def test_v0_empty_member_id_is_generated_v1_requires_one() -> None:
    g = new_group()
    r = g.heartbeat(member_id="", member_epoch=0, topics=topics(a=1), now_ms=0,
                    rebalance_timeout_ms=1, subscribed_topic_names=["a"], topic_partitions=[],
                    api_version=0)
    assert (r.error_code, r.member_id) == (ErrorCode.none, "gen-0")
    r = g.heartbeat(member_id="", member_epoch=0, topics=topics(a=1), now_ms=0,
                    rebalance_timeout_ms=1, subscribed_topic_names=["a"], topic_partitions=[],
                    api_version=1)
    assert r.error_code is ErrorCode.invalid_request


@pytest.mark.parametrize(("kw", "code"), [
    ({"rebalance_timeout_ms": -1}, ErrorCode.invalid_request),
    ({"topic_partitions": None}, ErrorCode.invalid_request),
    ({"topic_partitions": [(A, [0])]}, ErrorCode.invalid_request),
    ({"subscribed_topic_names": None}, ErrorCode.invalid_request),
    ({"instance_id": ""}, ErrorCode.invalid_request),
    ({"rack_id": ""}, ErrorCode.invalid_request),
    ({"member_epoch": -3}, ErrorCode.invalid_request),
    ({"member_epoch": -2}, ErrorCode.invalid_request),  # static leave without instance id
    ({"server_assignor": "sticky"}, ErrorCode.unsupported_assignor),
    ({"subscribed_topic_regex": "a(("}, ErrorCode.invalid_regular_expression),
])
def test_bad_first_heartbeats_are_rejected_and_change_nothing(
    kw: dict[str, Any], code: ErrorCode,
) -> None:
    g = new_group()
    args: dict[str, Any] = dict(member_id="m", member_epoch=0, topics=topics(a=2), now_ms=0,
                                rebalance_timeout_ms=1, subscribed_topic_names=["a"],
                                topic_partitions=[])
    args.update(kw)
    r = g.heartbeat(**args)
    assert r.error_code is code and r.error_message
    assert g.is_empty() and g.group_epoch == 0 and g.state is GroupState.EMPTY


def test_join_with_regex_only_and_with_empty_subscription() -> None:
    g = new_group()
    md = {**topics(a=2, b=1), "__consumer_offsets": TopicInfo(uuid.UUID(int=99), 50)}
    r = g.heartbeat(member_id="m", member_epoch=0, topics=md, now_ms=0,
                    rebalance_timeout_ms=1, subscribed_topic_regex=".*", topic_partitions=[])
    assert parts(r) == {(A, 0), (A, 1), (B, 0)}  # internal topics excluded
    r = g.heartbeat(member_id="n", member_epoch=0, topics=md, now_ms=0,
                    rebalance_timeout_ms=1, subscribed_topic_names=[], topic_partitions=[])
    assert r.error_code is ErrorCode.none and r.assignment == ()


# ---------------------------------------------------------------------- reconciliation


def test_second_member_waits_for_revocation_then_gets_partitions() -> None:
    g = new_group()
    md = topics(a=4)
    c1, c2 = Client(g, "m1"), Client(g, "m2")
    c1.beat(md, 0)
    assert len(c1.owned) == 4 and c1.epoch == 1
    r = c2.beat(md, 10)
    # m2 is at the new target epoch but everything it should get is still owned by m1
    assert (r.member_epoch, r.assignment) == (2, ())
    assert g.members["m2"].state is MemberState.UNRELEASED_PARTITIONS
    assert g.state is GroupState.RECONCILING
    # m2's commit at its epoch is fine, m1 stays at epoch 1 until it revokes
    r = c1.beat(md, 20)
    assert r.member_epoch == 1 and len(parts(r)) == 2  # revoke two
    assert g.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    revoked = _revoked(g, "m1")
    # m2 cannot get them before m1 acknowledges
    assert c2.beat(md, 30).assignment is None
    # m1 heartbeats still owning the revoked partitions: no progress
    r = g.heartbeat(member_id="m1", member_epoch=1, topics=md, now_ms=40,
                    topic_partitions=[(A, [0, 1, 2, 3])])
    assert r.member_epoch == 1 and g.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    # ...or not saying what it owns: still no progress
    assert g.heartbeat(member_id="m1", member_epoch=1, topics=md, now_ms=45).member_epoch == 1
    r = c1.beat(md, 50)  # acknowledges: owned list without the revoked ones
    assert r.member_epoch == 2 and member_state(g, "m1") is MemberState.STABLE
    r = c2.beat(md, 60)
    assert parts(r) == revoked and r.member_epoch == 2
    assert g.state_name == "Stable"
    assert_disjoint_cover([c1, c2], md)


def member_state(g: ConsumerGroup, member_id: str) -> MemberState:
    return g.members[member_id].state


def _revoked(g: ConsumerGroup, member_id: str) -> set[tuple[uuid.UUID, int]]:
    return {(t, p) for t, ps in g.members[member_id].pending_revocation.items() for p in ps}


def test_three_members_six_partitions_converge_disjoint_and_covering() -> None:
    g = new_group()
    md = topics(a=6)
    clients = [Client(g, f"m{i}") for i in range(3)]
    for i, c in enumerate(clients):
        c.beat(md, i)
    settle(clients, md, 100)
    assert_disjoint_cover(clients, md)
    assert sorted(len(c.owned) for c in clients) == [2, 2, 2]
    assert {c.epoch for c in clients} == {g.group_epoch}


def test_range_assignor_chosen_by_members_matches_seed_004() -> None:
    g = new_group()
    md = topics(a=7)
    clients = [Client(g, f"consumer-{i}", server_assignor="range") for i in (3, 0, 4, 1, 2)]
    for c in clients:
        c.beat(md, 0)
    settle(clients, md, 10)
    assert g.assignor_name == "range"
    got = {c.member_id: sorted(p for _, p in c.owned) for c in clients}
    assert got == {"consumer-0": [0, 1], "consumer-1": [2, 3], "consumer-2": [4],
                   "consumer-3": [5], "consumer-4": [6]}


def test_default_assignor_is_first_configured() -> None:
    g = new_group(assignors="range,uniform")
    Client(g, "m").beat(topics(a=1), 0)
    assert g.assignor_name == "range"
    g2 = new_group(assignors="uniform")
    r = g2.heartbeat(member_id="m", member_epoch=0, topics=topics(a=1), now_ms=0,
                     rebalance_timeout_ms=1, subscribed_topic_names=["a"], topic_partitions=[],
                     server_assignor="range")
    assert r.error_code is ErrorCode.unsupported_assignor


def test_leave_frees_partitions_for_the_others() -> None:
    g = new_group()
    md = topics(a=4)
    c1, c2 = Client(g, "m1"), Client(g, "m2")
    c1.beat(md, 0)
    c2.beat(md, 0)
    settle([c1, c2], md, 10)
    epoch = g.group_epoch
    r = g.heartbeat(member_id="m2", member_epoch=-1, topics=md, now_ms=20)
    assert (r.error_code, r.member_id, r.member_epoch) == (ErrorCode.none, "m2", -1)
    assert g.group_epoch == epoch + 1 and set(g.members) == {"m1"}
    r = c1.beat(md, 30)
    assert len(parts(r)) == 4 and g.state is GroupState.STABLE
    # leaving again: unknown
    r = g.heartbeat(member_id="m2", member_epoch=-1, topics=md, now_ms=40)
    assert r.error_code is ErrorCode.unknown_member_id
    r = g.heartbeat(member_id="m1", member_epoch=-1, topics=md, now_ms=50)
    assert r.error_code is ErrorCode.none and g.state_name == "Empty"


def test_revoked_then_target_changes_again_advances_epoch() -> None:
    g = new_group()
    md = topics(a=6)
    c1, c2, c3 = Client(g, "m1"), Client(g, "m2"), Client(g, "m3")
    c1.beat(md, 0)
    c2.beat(md, 0)
    c1.beat(md, 1)  # m1 told to revoke 3
    assert g.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    c3.beat(md, 2)  # a third member: target changes while m1 is revoking
    r = c1.beat(md, 3)  # m1 acks the first revocation; it must now revoke more
    assert g.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    assert r.member_epoch == 2 and len(parts(r)) == 2
    settle([c1, c2, c3], md, 10)
    assert_disjoint_cover([c1, c2, c3], md)
    assert sorted(len(c.owned) for c in (c1, c2, c3)) == [2, 2, 2]


# ---------------------------------------------------------------------- fencing


def test_epoch_fencing_rules() -> None:
    g = new_group()
    md = topics(a=2)
    c1 = Client(g, "m1")
    c1.beat(md, 0)
    assert g.heartbeat(member_id="m1", member_epoch=5, topics=md,
                       now_ms=1).error_code is ErrorCode.fenced_member_epoch
    assert g.heartbeat(member_id="zz", member_epoch=1, topics=md,
                       now_ms=1).error_code is ErrorCode.unknown_member_id
    c2 = Client(g, "m2")
    c2.beat(md, 2)
    c1.beat(md, 3)  # revoking
    c1.beat(md, 4)  # acked: epoch 2
    assert c1.epoch == 2
    # the previous epoch is accepted when the owned list is within the assignment (lost
    # response) ...
    r = g.heartbeat(member_id="m1", member_epoch=1, topics=md, now_ms=5,
                    topic_partitions=c1.owned_list())
    assert r.error_code is ErrorCode.none and r.member_epoch == 2
    # ... but not with more than it is assigned, nor without an owned list
    assert g.heartbeat(member_id="m1", member_epoch=1, topics=md, now_ms=6,
                       topic_partitions=[(A, [0, 1])]).error_code is ErrorCode.fenced_member_epoch
    assert g.heartbeat(member_id="m1", member_epoch=1, topics=md,
                       now_ms=6).error_code is ErrorCode.fenced_member_epoch
    assert g.heartbeat(member_id="m1", member_epoch=0, topics=md, now_ms=7,
                       rebalance_timeout_ms=1, subscribed_topic_names=["a"],
                       topic_partitions=[]).error_code is ErrorCode.none  # rejoin


def test_rejoin_with_epoch_zero_gets_full_assignment_back() -> None:
    g = new_group()
    md = topics(a=3)
    c1 = Client(g, "m1")
    c1.beat(md, 0)
    epoch = g.group_epoch
    r = g.heartbeat(member_id="m1", member_epoch=0, topics=md, now_ms=5,
                    rebalance_timeout_ms=1, subscribed_topic_names=["a"], topic_partitions=[])
    assert len(parts(r)) == 3 and g.group_epoch == epoch and r.member_epoch == 1


# ---------------------------------------------------------------------- timers


def test_session_timeout_removes_member_and_reassigns() -> None:
    g = new_group(session_timeout_ms=1000)
    md = topics(a=4)
    c1, c2 = Client(g, "m1"), Client(g, "m2")
    c1.beat(md, 0)
    c2.beat(md, 0)
    settle([c1, c2], md, 0)
    assert g.tick(999) is False
    c1.beat(md, 900)  # m1 keeps its session alive
    assert g.tick(1000) is True  # m2's session expired
    assert set(g.members) == {"m1"}
    r = c1.beat(md, 1001)
    assert len(parts(r)) == 4
    assert g.heartbeat(member_id="m2", member_epoch=c2.epoch, topics=md,
                       now_ms=1002).error_code is ErrorCode.unknown_member_id
    assert g.tick(10_000) is True and g.state is GroupState.EMPTY


def test_rebalance_timeout_fences_member_that_does_not_revoke() -> None:
    g = new_group(session_timeout_ms=100_000)
    md = topics(a=4)
    c1, c2 = Client(g, "m1"), Client(g, "m2")
    c1.beat(md, 0)
    c2.beat(md, 0)
    r = g.heartbeat(member_id="m1", member_epoch=1, topics=md, now_ms=10,
                    topic_partitions=[(A, [0, 1, 2, 3])])
    assert g.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    assert len(parts(r)) == 2
    # keeps heartbeating without releasing
    g.heartbeat(member_id="m1", member_epoch=1, topics=md, now_ms=20_000,
                topic_partitions=[(A, [0, 1, 2, 3])])
    assert g.tick(10 + REBALANCE - 1) is False
    assert g.tick(10 + REBALANCE) is True
    assert set(g.members) == {"m2"}
    r = c2.beat(md, REBALANCE + 20)
    assert len(parts(r)) == 4
    r = g.heartbeat(member_id="m1", member_epoch=1, topics=md, now_ms=REBALANCE + 30)
    assert r.error_code is ErrorCode.unknown_member_id


# ---------------------------------------------------------------------- metadata


def test_topic_created_after_subscription_and_partitions_added() -> None:
    g = new_group()
    c1, c2 = Client(g, "m1"), Client(g, "m2")
    assert c1.beat({}, 0).assignment == ()
    c2.beat({}, 0)
    epoch = g.group_epoch
    md = topics(a=2)
    c1.beat(md, 10)
    assert g.group_epoch == epoch + 1
    settle([c1, c2], md, 20)
    assert_disjoint_cover([c1, c2], md)
    md = topics(a=6)
    settle([c1, c2], md, 30)
    assert_disjoint_cover([c1, c2], md)
    assert [len(c.owned) for c in (c1, c2)] == [3, 3]


def test_subscription_change_bumps_epoch_and_reassigns() -> None:
    g = new_group()
    md = topics(a=2, b=2)
    c1 = Client(g, "m1")
    c1.beat(md, 0)
    assert {t for t, _ in c1.owned} == {A}
    r = c1.beat(md, 1, subscribed_topic_names=["a", "b"])
    assert g.group_epoch == 2
    settle([c1], md, 2)
    assert {t for t, _ in c1.owned} == {A, B} and r.error_code is ErrorCode.none
    c1.beat(md, 3, subscribed_topic_names=["b"])
    settle([c1], md, 4)
    assert {t for t, _ in c1.owned} == {B}
    assert set(g.subscribed_topics) == {"b"}


# ---------------------------------------------------------------------- static members


def test_static_member_temporary_leave_and_rejoin_keeps_assignment() -> None:
    g = new_group(session_timeout_ms=1000)
    md = topics(a=4)
    c1 = Client(g, "m1", instance_id="i1")
    c2 = Client(g, "m2", instance_id="i2")
    c1.beat(md, 0)
    c2.beat(md, 0)
    settle([c1, c2], md, 0)
    before = set(c2.owned)
    epoch = g.group_epoch
    r = g.heartbeat(member_id="m2", member_epoch=-2, instance_id="i2", topics=md, now_ms=10)
    assert (r.error_code, r.member_epoch) == (ErrorCode.none, -2)
    assert g.group_epoch == epoch and g.state is GroupState.STABLE
    # another member id cannot take the instance while the static one is active
    r = g.heartbeat(member_id="x", member_epoch=0, instance_id="i1", topics=md, now_ms=11,
                    rebalance_timeout_ms=1, subscribed_topic_names=["a"], topic_partitions=[])
    assert r.error_code is ErrorCode.unreleased_instance_id
    # the restarted instance (new member id) takes over i2 without a rebalance
    r = g.heartbeat(member_id="m2b", member_epoch=0, instance_id="i2", topics=md, now_ms=20,
                    rebalance_timeout_ms=1, subscribed_topic_names=["a"], topic_partitions=[])
    assert r.error_code is ErrorCode.none and parts(r) == before
    assert g.group_epoch == epoch and set(g.members) == {"m1", "m2b"}
    # the old member id is gone
    assert g.heartbeat(member_id="m2", member_epoch=-1, topics=md,
                       now_ms=21).error_code is ErrorCode.unknown_member_id
    # a leave naming the instance with the wrong member id is fenced
    assert g.heartbeat(member_id="m1", member_epoch=-1, instance_id="i2", topics=md,
                       now_ms=22).error_code is ErrorCode.fenced_instance_id


def test_static_member_that_never_returns_expires() -> None:
    g = new_group(session_timeout_ms=1000)
    md = topics(a=2)
    c1 = Client(g, "m1", instance_id="i1")
    c1.beat(md, 0)
    g.heartbeat(member_id="m1", member_epoch=-2, instance_id="i1", topics=md, now_ms=10)
    assert not g.is_empty()
    assert g.tick(1010) is True and g.state is GroupState.EMPTY


# ---------------------------------------------------------------------- offsets


def test_validate_offset_commit_and_fetch() -> None:
    g = new_group()
    assert g.validate_offset_commit("", -1, None, 0) is ErrorCode.none  # empty group
    assert g.validate_offset_fetch(None, -1) is ErrorCode.none
    md = topics(a=2)
    c1 = Client(g, "m1")
    c1.beat(md, 0)
    assert g.validate_offset_commit("", -1, None, 0) is ErrorCode.unknown_member_id
    assert g.validate_offset_commit("m1", 1, None, 0) is ErrorCode.none
    assert g.validate_offset_commit("m1", 0, None, 0) is ErrorCode.stale_member_epoch
    assert g.validate_offset_commit("nobody", 1, None, 0) is ErrorCode.unknown_member_id
    assert g.validate_offset_fetch(None, -1) is ErrorCode.none
    assert g.validate_offset_fetch("m1", 1) is ErrorCode.none
    assert g.validate_offset_fetch("m1", 2) is ErrorCode.stale_member_epoch
    assert g.validate_offset_fetch("nobody", 1) is ErrorCode.unknown_member_id


# ---------------------------------------------------------------------- describe, dead


def test_describe() -> None:
    g = new_group()
    md = topics(a=2)
    Client(g, "m1", client_id="c", client_host="/h", rack_id="r1").beat(md, 0)
    d = g.describe()
    assert (d["group_state"], d["group_epoch"], d["assignment_epoch"], d["assignor_name"]) == (
        "Stable", 1, 1, "uniform")
    (m,) = d["members"]
    assert (m["member_id"], m["client_id"], m["client_host"], m["rack_id"]) == (
        "m1", "c", "/h", "r1")
    assert m["assignment"] == m["target_assignment"] == {
        "topic_partitions": [{"topic_id": A, "topic_name": "a", "partitions": (0, 1)}]}


def test_dead_group_refuses_every_event() -> None:
    g = new_group()
    md = topics(a=1)
    Client(g, "m1").beat(md, 0)
    with pytest.raises(IllegalGroupEvent):
        g.mark_dead()  # not empty
    assert g.state is GroupState.STABLE
    g.heartbeat(member_id="m1", member_epoch=-1, topics=md, now_ms=1)
    g.mark_dead()
    assert g.state_name == "Dead"
    with pytest.raises(IllegalGroupEvent):
        g.heartbeat(member_id="m1", member_epoch=0, topics=md, now_ms=2,
                    rebalance_timeout_ms=1, subscribed_topic_names=["a"], topic_partitions=[])
    with pytest.raises(IllegalGroupEvent):
        g.mark_dead()
    assert g.tick(10**9) is False


def test_transition_table_covers_every_event() -> None:
    assert set(TRANSITIONS) == set(Event)
    for legal, results in TRANSITIONS.values():
        assert GroupState.DEAD not in legal and GroupState.ASSIGNING not in legal
        assert results


# ---------------------------------------------------------------------- property


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["join", "leave", "beat", "ack-late", "grow",
                                           "tick"]),
                          st.integers(0, 4)), max_size=40),
       st.sampled_from(["uniform", "range"]))
def test_random_histories_never_double_own_and_converge(
    ops: list[tuple[str, int]], assignor: str,
) -> None:
    """Whatever members do, no partition is ever owned by two members, and once everybody
    heartbeats well the group is Stable with a disjoint covering assignment."""
    g = new_group(session_timeout_ms=10_000, assignors=f"{assignor}")
    h = History(g, topics(a=5, b=3))
    for op, i in ops:
        h.step(op, i)
        _assert_single_owner(g)
    for c in h.clients.values():
        c.epoch = c.epoch if c.member_id in g.members else 0
    live = list(h.clients.values())
    if live:
        settle(live, h.md, h.now + 1, rounds=12)
        assert_disjoint_cover(live, h.md)
    _assert_single_owner(g)


class History:
    """Random member behaviour applied to a group one operation at a time (the property
    tests): join, leave, static-leave (only members with an instance id, i % 3 == 0, when
    ``static``), beat, ack-late, grow (topic a gains a partition), tick (sessions expire)."""

    def __init__(self, g: ConsumerGroup, md: dict[str, TopicInfo], static: bool = False) -> None:
        self.g, self.md, self.static = g, md, static
        self.clients: dict[int, Client] = {}
        self.now = 0

    def step(self, op: str, i: int) -> None:
        g, md = self.g, self.md
        self.now += 100
        now = self.now
        c = self.clients.get(i)
        if op == "join" and c is None:
            self.clients[i] = Client(g, f"m{i}", names=["a", "b"] if i % 2 else ["a"],
                                     instance_id=f"i{i}" if self.static and i % 3 == 0
                                     else None)
            self.clients[i].beat(md, now)
        elif op == "leave" and c is not None:
            g.heartbeat(member_id=c.member_id, member_epoch=-1, topics=md, now_ms=now)
            del self.clients[i]
        elif op == "static-leave" and c is not None and c.join_kw.get("instance_id"):
            g.heartbeat(member_id=c.member_id, member_epoch=-2,
                        instance_id=c.join_kw["instance_id"], topics=md, now_ms=now)
            c.epoch = 0
        elif op == "beat" and c is not None:
            c.beat(md, now)
        elif op == "ack-late" and c is not None:
            # a slow consumer: heartbeats still owning everything it had (it applies the
            # response, as a real consumer does, and releases on a later heartbeat)
            c.beat(md, now, topic_partitions=[(t, [p]) for t, p in c.owned])
        elif op == "grow":
            self.md = {**md, "a": TopicInfo(A, md["a"].num_partitions + 1)}
        elif op == "tick":
            self.now += 20_000
            g.tick(self.now)
            self.clients = {k: v for k, v in self.clients.items() if v.member_id in g.members}


def _assert_single_owner(g: ConsumerGroup) -> None:
    seen: set[tuple[uuid.UUID, int]] = set()
    for m in g.members.values():
        mine = {(t, p) for src in (m.assigned, m.pending_revocation)
                for t, ps in src.items() for p in ps}
        assert not (seen & mine)
        seen |= mine



# ---------------------------------------------------------------------- persistence

Log = list[tuple[bytes, bytes | None]]


def decoded(records: Log) -> list[tuple[GroupKey, object]]:
    out: list[tuple[GroupKey, object]] = []
    for k, v in records:
        key = decode_key(k)
        assert key is not None
        out.append((key, decode_value(key, v)))
    return out


def restored(log: Log, now_ms: int, **kw: Any) -> ConsumerGroup:
    snapshot = ConsumerGroupSnapshot()
    for key, value in decoded(log):
        assert not isinstance(key, ConsumerGroupMetadataKey) or value is not None
        snapshot.replay(key, value)  # type: ignore[arg-type]
    g = new_group(**kw)
    g.restore(snapshot, now_ms)
    return g


def _norm(parts_: Any) -> dict[uuid.UUID, frozenset[int]]:
    return {t: frozenset(ps) for t, ps in parts_.items() if ps}


def persisted_state(g: ConsumerGroup) -> tuple[Any, ...]:
    """Everything Kafka persists of a group (no session deadlines)."""
    return (
        g.group_epoch, g.assignment_epoch, g.subscribed_topics, g.assignor_name, g.state,
        {mid: (m.instance_id, m.rack_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
               m.subscribed_topic_names, m.subscribed_topic_regex, m.server_assignor,
               m.member_epoch, m.previous_member_epoch, m.state, _norm(m.assigned),
               _norm(m.pending_revocation), m.revocation_deadline_ms is not None)
         for mid, m in g.members.items()},
        {mid: _norm(t) for mid, t in g.target.items() if mid in g.members},
    )


def test_join_writes_kafkas_records_in_kafkas_order() -> None:
    g = new_group()
    md = topics(a=2)
    c1 = Client(g, "m1", client_id="cid", client_host="/1.2.3.4")
    c1.beat(md, 0)
    records = decoded(g.take_records())
    assert [type(k) for k, _ in records] == [
        ConsumerGroupMemberMetadataKey, ConsumerGroupPartitionMetadataKey,
        ConsumerGroupMetadataKey, ConsumerGroupTargetAssignmentMemberKey,
        ConsumerGroupTargetAssignmentMetadataKey, ConsumerGroupCurrentMemberAssignmentKey]
    assert records[2][1] == ConsumerGroupMetadataValue(1)
    assert records[5][1] == ConsumerGroupCurrentMemberAssignmentValue(
        1, 0, 0, ((A, (0, 1)),), ())
    # a heartbeat that changes nothing writes nothing
    c1.beat(md, 100)
    assert g.take_records() == []


def test_member_removal_writes_tombstones_and_the_new_epoch() -> None:
    g = new_group()
    md = topics(a=4)
    c1, c2 = Client(g, "m1"), Client(g, "m2")
    c1.beat(md, 0)
    c2.beat(md, 0)
    settle([c1, c2], md, 1)
    g.take_records()
    g.heartbeat(member_id="m2", member_epoch=-1, topics=md, now_ms=5)
    records = decoded(g.take_records())
    keys = [k for k, _ in records]
    assert keys[:3] == [ConsumerGroupCurrentMemberAssignmentKey("g", "m2"),
                        ConsumerGroupTargetAssignmentMemberKey("g", "m2"),
                        ConsumerGroupMemberMetadataKey("g", "m2")]
    assert all(v is None for _, v in records[:3])
    assert (ConsumerGroupMetadataKey("g"), ConsumerGroupMetadataValue(g.group_epoch)) in records
    assert ConsumerGroupTargetAssignmentMemberKey("g", "m1") in keys
    # the session timeout removes the last member the same way
    g.tick(10**9)
    keys = [k for k, _ in decoded(g.take_records())]
    assert ConsumerGroupMemberMetadataKey("g", "m1") in keys and g.state is GroupState.EMPTY


def test_restore_equals_original_and_members_carry_on_without_rebalance() -> None:
    g = new_group(session_timeout_ms=1000)
    md = topics(a=6, b=2)
    log: Log = []
    clients = [Client(g, "m1", names=["a", "b"], rack_id="r1"), Client(g, "m2"),
               Client(g, "m3", instance_id="i3", server_assignor="range")]
    for c in clients:
        c.beat(md, 0)
        log += g.take_records()
    clients[0].beat(md, 1)  # m1 is told to revoke: UNREVOKED_PARTITIONS at load
    log += g.take_records()
    assert g.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    loaded = restored(log, 50_000, session_timeout_ms=1000)
    assert persisted_state(loaded) == persisted_state(g)
    # sessions restart at the load; the revoking member gets a fresh rebalance timeout
    assert {m.session_deadline_ms for m in loaded.members.values()} == {51_000}
    assert loaded.members["m1"].revocation_deadline_ms == 50_000 + REBALANCE
    # every member heartbeats with its old id and epoch: the restored group answers as the
    # original would have, and reaches the same state
    twins = [copy.copy(c) for c in clients]
    for c in twins:
        c.group = loaded
        c.owned = set(c.owned)
    for now in (50_001, 50_002, 50_003):
        for c, twin in zip(clients, twins, strict=True):
            assert twin.beat(md, now) == c.beat(md, now)
    assert persisted_state(loaded) == persisted_state(g)
    assert loaded.state is GroupState.STABLE
    assert_disjoint_cover(twins, md)
    # a stable member's heartbeat after a restore: no epoch bump, nothing to write
    loaded.take_records()
    again = restored(log + g.take_records(), 60_000, session_timeout_ms=1000)
    for c in twins:
        c.group = again
        r = c.beat(md, 60_001)
        assert r.error_code is ErrorCode.none and r.member_epoch == g.group_epoch
    assert again.group_epoch == g.group_epoch and again.take_records() == []


def test_static_leave_and_takeover_are_restored() -> None:
    g = new_group()
    md = topics(a=4)
    log: Log = []
    c1, c2 = Client(g, "m1", instance_id="i1"), Client(g, "m2", instance_id="i2")
    for c in (c1, c2, c1, c2):
        c.beat(md, 0)
        log += g.take_records()
    g.heartbeat(member_id="m2", member_epoch=-2, instance_id="i2", topics=md, now_ms=10)
    log += g.take_records()
    loaded = restored(log, 20)
    assert persisted_state(loaded) == persisted_state(g)
    assert loaded.members["m2"].member_epoch == -2
    r = g.heartbeat(member_id="m2b", member_epoch=0, instance_id="i2", topics=md, now_ms=20,
                    rebalance_timeout_ms=1, subscribed_topic_names=["a"], topic_partitions=[])
    assert r.error_code is ErrorCode.none
    records = g.take_records()
    keys = [k for k, _ in decoded(records)]
    assert ConsumerGroupMemberMetadataKey("g", "m2") in keys  # the old id's tombstone
    log += records
    assert persisted_state(restored(log, 30)) == persisted_state(g)


def test_failed_write_rewrites_the_whole_group_next_time() -> None:
    g = new_group()
    md = topics(a=4)
    log: Log = []
    c1, c2 = Client(g, "m1"), Client(g, "m2")
    c1.beat(md, 0)
    log += g.take_records()
    c2.beat(md, 0)
    log += g.take_records()
    g.heartbeat(member_id="m2", member_epoch=-1, topics=md, now_ms=5)
    g.take_records()  # lost: the append failed
    g.forget_written()
    c1.beat(md, 6)
    log += g.take_records()  # rewrites everything, with m2's tombstones
    loaded = restored(log, 10)
    assert set(loaded.members) == {"m1"}
    assert persisted_state(loaded) == persisted_state(g)


def test_tombstone_records_cover_every_key() -> None:
    g = new_group()
    md = topics(a=2)
    log: Log = []
    Client(g, "m1").beat(md, 0)
    log += g.take_records()
    tombstones = g.tombstone_records()
    assert all(v is None for _, v in tombstones)
    assert {k for k, _ in log} == {k for k, _ in tombstones}
    assert decode_key(tombstones[-1][0]) == ConsumerGroupMetadataKey("g")


@settings(max_examples=200, deadline=None)
@example([("join", 0), ("join", 1), ("beat", 0), ("static-leave", 0), ("beat", 1),
          ("beat", 0), ("tick", 0)], "uniform")
@given(st.lists(st.tuples(st.sampled_from(["join", "leave", "static-leave", "beat", "ack-late",
                                           "grow", "tick"]),
                          st.integers(0, 4)), max_size=30),
       st.sampled_from(["uniform", "range"]))
def test_random_histories_restore_to_the_same_group(
    ops: list[tuple[str, int]], assignor: str,
) -> None:
    """After any history, the group rebuilt from the records it produced (one batch per
    event) equals the group: members, epochs, target and current assignments."""
    g = new_group(session_timeout_ms=10_000, assignors=assignor)
    h = History(g, topics(a=5, b=3), static=True)
    log: Log = []
    for op, i in ops:
        h.step(op, i)
        log += g.take_records()
        assert persisted_state(restored(log, h.now, assignors=assignor)) == persisted_state(g)
