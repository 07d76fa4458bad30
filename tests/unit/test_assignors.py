"""Server-side KIP-848 assignors (R-GRP-5, issue 3 item 3): uniform and range."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.group.assignors import (
    ASSIGNORS,
    RANGE,
    UNIFORM,
    Assignment,
    MemberSubscription,
    TopicInfo,
    assignors_from_config,
)

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
T3 = uuid.UUID(int=3)
TOPIC_IDS = {"a": T1, "b": T2, "c": T3}


def subs(*topics: str) -> MemberSubscription:
    return MemberSubscription(frozenset(topics))


def flat(result: Assignment) -> dict[str, set[tuple[uuid.UUID, int]]]:
    return {m: {(t, p) for t, ps in a.items() for p in ps} for m, a in result.items()}


def counts(result: Assignment) -> dict[str, int]:
    return {m: len(tps) for m, tps in flat(result).items()}


def assert_exactly_once(members: Mapping[str, MemberSubscription],
                        topics: Mapping[str, TopicInfo], result: Assignment) -> None:
    assert set(result) == set(members)
    seen: dict[tuple[uuid.UUID, int], str] = {}
    for m, tps in flat(result).items():
        for tp in tps:
            assert tp not in seen, f"{tp} given to {seen[tp]} and {m}"
            seen[tp] = m
            name = next(n for n, i in topics.items() if i.topic_id == tp[0])
            assert name in members[m].topics, f"{m} got {name} without subscribing"
            assert 0 <= tp[1] < topics[name].num_partitions
    wanted = {(i.topic_id, p) for n, i in topics.items()
              if any(n in s.topics for s in members.values()) for p in range(i.num_partitions)}
    assert set(seen) == wanted


# ---------------------------------------------------------------------- range


def test_range_seed_004_seven_partitions_five_members() -> None:
    members = {f"consumer-{i}": subs("a") for i in range(5)}
    result = RANGE.assign(members, {"a": TopicInfo(T1, 7)}, {})
    assert {m: sorted(a.get(T1, ())) for m, a in result.items()} == {
        "consumer-0": [0, 1], "consumer-1": [2, 3], "consumer-2": [4], "consumer-3": [5],
        "consumer-4": [6],
    }


def test_range_sorts_members_by_member_id_not_insertion_order() -> None:
    members = {m: subs("a") for m in ["zeta", "alpha", "mu"]}
    result = RANGE.assign(members, {"a": TopicInfo(T1, 4)}, {})
    assert {m: sorted(a.get(T1, ())) for m, a in result.items()} == {
        "alpha": [0, 1], "mu": [2], "zeta": [3]}


def test_range_per_topic_with_different_subscriptions() -> None:
    members = {"m0": subs("a", "b"), "m1": subs("a", "b"), "m2": subs("b")}
    topics = {"a": TopicInfo(T1, 3), "b": TopicInfo(T2, 3)}
    result = RANGE.assign(members, topics, {})
    assert result == {
        "m0": {T1: frozenset({0, 1}), T2: frozenset({0})},
        "m1": {T1: frozenset({2}), T2: frozenset({1})},
        "m2": {T2: frozenset({2})},
    }


def test_range_more_members_than_partitions_leaves_some_empty() -> None:
    members = {f"m{i}": subs("a") for i in range(4)}
    result = RANGE.assign(members, {"a": TopicInfo(T1, 2)}, {})
    assert counts(result) == {"m0": 1, "m1": 1, "m2": 0, "m3": 0}


# ---------------------------------------------------------------------- uniform


def test_uniform_balances_one_topic() -> None:
    members = {f"m{i}": subs("a") for i in range(3)}
    result = UNIFORM.assign(members, {"a": TopicInfo(T1, 7)}, {})
    assert sorted(counts(result).values()) == [2, 2, 3]


def test_uniform_keeps_current_ownership() -> None:
    members = {"m0": subs("a"), "m1": subs("a")}
    current = {"m0": {T1: frozenset({1, 3})}, "m1": {T1: frozenset({0, 2})}}
    result = UNIFORM.assign(members, {"a": TopicInfo(T1, 4)}, current)
    assert result == current


def test_uniform_drops_partitions_of_unsubscribed_or_missing_topics() -> None:
    members = {"m0": subs("a"), "m1": subs("a")}
    current = {"m0": {T2: frozenset({0}), T1: frozenset({0, 1, 2, 3, 9})}}
    result = UNIFORM.assign(members, {"a": TopicInfo(T1, 4), "b": TopicInfo(T2, 1)}, current)
    assert_exactly_once(members, {"a": TopicInfo(T1, 4)}, result)
    assert counts(result) == {"m0": 2, "m1": 2}
    assert result["m0"][T1] < frozenset({0, 1, 2, 3})


def test_uniform_duplicate_claims_go_to_one_member() -> None:
    members = {"m0": subs("a"), "m1": subs("a")}
    current = {"m0": {T1: frozenset({0, 1})}, "m1": {T1: frozenset({1})}}
    result = UNIFORM.assign(members, {"a": TopicInfo(T1, 2)}, current)
    assert_exactly_once(members, {"a": TopicInfo(T1, 2)}, result)


def test_uniform_heterogeneous_subscriptions() -> None:
    # m2 only subscribes to b: it should get b's partitions before the others do
    members = {"m0": subs("a", "b"), "m1": subs("a", "b"), "m2": subs("b")}
    topics = {"a": TopicInfo(T1, 4), "b": TopicInfo(T2, 2)}
    result = UNIFORM.assign(members, topics, {})
    assert_exactly_once(members, topics, result)
    assert sorted(counts(result).values()) == [2, 2, 2]


def test_uniform_no_members_and_no_topics() -> None:
    assert UNIFORM.assign({}, {"a": TopicInfo(T1, 3)}, {}) == {}
    assert UNIFORM.assign({"m": subs("x")}, {}, {}) == {"m": {}}


def test_assignors_from_config() -> None:
    assert [a.name for a in assignors_from_config("uniform,range")] == ["uniform", "range"]
    assert [a.name for a in assignors_from_config(" range ")] == ["range"]
    with pytest.raises(ValueError, match="sticky"):
        assignors_from_config("uniform,sticky")
    with pytest.raises(ValueError):
        assignors_from_config(" , ")


# ---------------------------------------------------------------------- properties

member_ids = st.lists(st.text("abcdefgh", min_size=1, max_size=4), min_size=1, max_size=8,
                      unique=True)
partition_counts = st.fixed_dictionaries(
    {"a": st.integers(0, 20), "b": st.integers(0, 12), "c": st.integers(1, 5)})


# built once: a strategy constructed inside a composite is rebuilt (and its cache looked up)
# on every draw, which cost more than the assignors themselves
topic_sets = st.frozensets(st.sampled_from("abc"))
nonempty_topic_sets = st.frozensets(st.sampled_from("abc"), min_size=1)
# (topic, partition) pairs, drawn from one list: half the cost of tuples of two draws
current_picks = st.frozensets(
    st.sampled_from([(n, p) for n in "abc" for p in range(26)]), max_size=10)


@st.composite
def groups(draw: st.DrawFn, equal: bool = False) -> tuple[
    dict[str, MemberSubscription], dict[str, TopicInfo], dict[str, dict[uuid.UUID, frozenset[int]]]
]:
    ids = draw(member_ids)
    sizes = draw(partition_counts)
    topics = {n: TopicInfo(TOPIC_IDS[n], k) for n, k in sizes.items()}
    if equal:
        shared = draw(nonempty_topic_sets)
        members = {m: MemberSubscription(shared) for m in ids}
    else:
        members = {m: MemberSubscription(draw(topic_sets)) for m in ids}
    # an arbitrary (possibly invalid, overlapping) current assignment
    current: dict[str, dict[uuid.UUID, frozenset[int]]] = {}
    for m in ids:
        per: dict[uuid.UUID, set[int]] = {}
        for name, p in draw(current_picks):
            per.setdefault(TOPIC_IDS[name], set()).add(p)
        current[m] = {t: frozenset(ps) for t, ps in per.items()}
    return members, topics, current


@settings(max_examples=300, deadline=None)
@given(groups(), st.sampled_from(sorted(ASSIGNORS)))
def test_every_subscribed_partition_assigned_exactly_once(
    group: tuple[dict[str, MemberSubscription], dict[str, TopicInfo],
                 dict[str, dict[uuid.UUID, frozenset[int]]]],
    name: str,
) -> None:
    members, topics, current = group
    assert_exactly_once(members, topics, ASSIGNORS[name].assign(members, topics, current))


@settings(max_examples=300, deadline=None)
@given(groups(equal=True))
def test_uniform_balanced_within_one_with_equal_subscriptions(
    group: tuple[dict[str, MemberSubscription], dict[str, TopicInfo],
                 dict[str, dict[uuid.UUID, frozenset[int]]]],
) -> None:
    members, topics, current = group
    result = UNIFORM.assign(members, topics, current)
    c = counts(result).values()
    assert max(c) - min(c) <= 1


@settings(max_examples=300, deadline=None)
@given(groups())
def test_uniform_no_member_could_take_from_one_two_ahead(
    group: tuple[dict[str, MemberSubscription], dict[str, TopicInfo],
                 dict[str, dict[uuid.UUID, frozenset[int]]]],
) -> None:
    """Local balance with different subscriptions: no partition could move to a subscribed
    member holding two fewer partitions."""
    members, topics, current = group
    result = flat(UNIFORM.assign(members, topics, current))
    name_of = {i.topic_id: n for n, i in topics.items()}
    for tps in result.values():
        for receiver in members:
            if len(result[receiver]) + 1 < len(tps):
                assert not any(name_of[t] in members[receiver].topics for t, _ in tps)


@settings(max_examples=300, deadline=None)
@given(groups(equal=True), st.text("xyz", min_size=5, max_size=6))
def test_uniform_adding_a_member_moves_only_what_it_receives(
    group: tuple[dict[str, MemberSubscription], dict[str, TopicInfo],
                 dict[str, dict[uuid.UUID, frozenset[int]]]],
    newcomer: str,
) -> None:
    members, topics, _ = group
    before = UNIFORM.assign(members, topics, {})
    grown = {**members, newcomer: next(iter(members.values()))}
    after = UNIFORM.assign(grown, topics, before)
    assert_exactly_once(grown, topics, after)
    old, new = flat(before), flat(after)
    moved = sum(len(old[m] - new[m]) for m in members)
    assert moved == len(new[newcomer])  # nothing moves between existing members
    c = counts(after).values()
    assert max(c) - min(c) <= 1


@settings(max_examples=200, deadline=None)
@given(groups(equal=True))
def test_uniform_removing_a_member_moves_only_its_partitions(
    group: tuple[dict[str, MemberSubscription], dict[str, TopicInfo],
                 dict[str, dict[uuid.UUID, frozenset[int]]]],
) -> None:
    members, topics, _ = group
    before = UNIFORM.assign(members, topics, {})
    leaver = sorted(members)[0]
    rest = {m: s for m, s in members.items() if m != leaver}
    after = UNIFORM.assign(rest, topics, before)
    old, new = flat(before), flat(after)
    for m in rest:
        assert old[m] <= new[m]


@settings(max_examples=100, deadline=None)
@given(groups(), st.sampled_from(sorted(ASSIGNORS)))
def test_assignors_are_deterministic(
    group: tuple[dict[str, MemberSubscription], dict[str, TopicInfo],
                 dict[str, dict[uuid.UUID, frozenset[int]]]],
    name: str,
) -> None:
    members, topics, current = group
    a = ASSIGNORS[name].assign(members, topics, current)
    b = ASSIGNORS[name].assign(dict(reversed(list(members.items()))), topics, current)
    assert a == b
