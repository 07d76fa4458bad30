"""The controller's pure decisions (R-REP-1, R-REP-5..8): Kafka's assignment and election
rules, with property tests."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.cluster import controller as c
from headrace.metadata.store import PartitionState, TopicState


def topic(name: str, *states: PartitionState) -> TopicState:
    return TopicState(name, uuid.uuid4(), list(states))


def ps(replicas: list[int], leader: int, isr: list[int], epoch: int = 3) -> PartitionState:
    return PartitionState(replicas, leader, epoch, isr, epoch, 1, 7)


@given(n=st.integers(1, 9), rf=st.integers(1, 9), parts=st.integers(1, 60),
       seed=st.integers(0, 1000))
def test_assignment_distinct_and_leaders_balanced(n: int, rf: int, parts: int,
                                                  seed: int) -> None:
    brokers = [(b, None) for b in range(1, n + 1)]
    if rf > n:
        with pytest.raises(c.InvalidReplicationFactor, match="larger than available brokers"):
            c.assign_replicas(brokers, parts, rf, rng=random.Random(seed))
        return
    out = c.assign_replicas(brokers, parts, rf, rng=random.Random(seed))
    assert len(out) == parts
    assert all(len(r) == rf == len(set(r)) for r in out)
    leaders = Counter(r[0] for r in out)
    assert max(leaders.values()) - min(leaders.get(b, 0) for b in range(1, n + 1)) <= 1


@given(seed=st.integers(0, 1000), parts=st.integers(1, 40))
def test_rack_aware_assignment_spreads_racks(seed: int, parts: int) -> None:
    brokers = [(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c"), (6, "c")]
    out = c.assign_replicas(brokers, parts, 3, rng=random.Random(seed))
    rack = dict(brokers)
    for replicas in out:
        assert len({rack[b] for b in replicas}) == 3  # one replica per rack
        assert len(set(replicas)) == 3


def test_some_brokers_without_rack_is_refused() -> None:
    with pytest.raises(c.InvalidReplicaAssignment):
        c.assign_replicas([(1, "a"), (2, None)], 1, 1)


def test_leader_failure_elects_first_live_isr_replica_in_assignment_order() -> None:
    t = {"t": topic("t", ps([1, 2, 3], 1, [1, 2, 3]))}
    (d,) = c.on_brokers_changed(t, {2, 3}, lambda _: False)
    assert (d.state.leader, d.state.isr, d.state.leader_epoch) == (2, [2, 3], 4)
    assert d.state.zk_version == 7 and not d.unclean


def test_no_live_isr_member_keeps_partition_offline_unless_unclean() -> None:
    """Seed 002: unclean off: leader -1, the last in-sync replica stays in the ISR so that
    only it can lead again; unclean on: an out-of-sync live replica leads alone."""
    t = {"t": topic("t", ps([1, 2, 3], 1, [1]))}
    (off,) = c.on_brokers_changed(t, {2, 3}, lambda _: False)
    assert (off.state.leader, off.state.isr) == (-1, [1])
    (on,) = c.on_brokers_changed(t, {2, 3}, lambda _: True)
    assert (on.state.leader, on.state.isr, on.unclean) == (2, [2], True)
    # the offline partition, once its last ISR member is back: it leads again
    back = {"t": topic("t", off.state)}
    (d,) = c.on_brokers_changed(back, {1, 2, 3}, lambda _: False)
    assert (d.state.leader, d.state.isr) == (1, [1])


def test_dead_follower_leaves_isr_and_new_partitions_get_states() -> None:
    t = {"t": topic("t", ps([1, 2, 3], 1, [1, 2, 3]),
                    PartitionState([3, 1, 2], -1, -1, [], 0, -1, -1))}
    ds = {d.partition: d for d in c.on_brokers_changed(t, {1, 3}, lambda _: False)}
    assert ds[0].state.isr == [1, 3] and ds[0].state.leader_epoch == 3  # no new epoch
    assert (ds[1].state.leader, ds[1].state.isr, ds[1].state.leader_epoch) == (3, [3, 1], 0)


def test_nothing_to_do_when_all_is_well() -> None:
    t = {"t": topic("t", ps([1, 2, 3], 1, [1, 2, 3]))}
    assert c.on_brokers_changed(t, {1, 2, 3}, lambda _: False) == []


def test_controlled_shutdown_moves_leadership_and_shrinks_isr() -> None:
    t = {"t": topic("t", ps([1, 2, 3], 1, [1, 2, 3]), ps([2, 1, 3], 2, [2, 1, 3]),
                    ps([1], 1, [1]))}
    ds = {d.partition: d for d in c.controlled_shutdown(t, 1, {1, 2, 3})}
    assert (ds[0].state.leader, ds[0].state.isr) == (2, [2, 3])
    assert (ds[1].state.leader, ds[1].state.isr) == (2, [2, 3])
    assert 2 not in ds  # a single replica: nothing to move to
    assert c.leads(t, 1) == 1


def test_preferred_election() -> None:
    t = {"t": topic("t", ps([1, 2, 3], 2, [1, 2, 3]), ps([2, 3, 1], 2, [2, 3, 1]),
                    ps([1, 2, 3], 2, [2, 3]))}
    new = c.preferred_election(t["t"].partitions[0], {1, 2, 3})
    assert new is not None and new.leader == 1 and new.leader_epoch == 4
    assert c.preferred_election(t["t"].partitions[1], {1, 2, 3}) is None  # already
    assert c.preferred_election(t["t"].partitions[2], {1, 2, 3}) is None  # 1 not in ISR


@given(data=st.data())
def test_elections_never_pick_out_of_sync_replicas_when_clean(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 5))
    replicas = data.draw(st.permutations(list(range(1, n + 1))))
    isr = data.draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True))
    leader = data.draw(st.sampled_from(isr))
    live = set(data.draw(st.lists(st.sampled_from(replicas), unique=True)))
    t = {"t": topic("t", ps(list(replicas), leader, isr))}
    for d in c.on_brokers_changed(t, live, lambda _: False):
        assert d.state.leader == -1 or d.state.leader in isr
        assert d.state.isr  # never emptied
        assert set(d.state.isr) <= set(isr)


def test_reassignment_phases() -> None:
    """KIP-455: RS = target + old; finished once the target is in sync: the target, the
    ISR within it, the leader moved into it; a cancel goes back."""
    st = ps([1, 2], 1, [1, 2])
    r = c.start_reassignment(st, [2, 3])
    assert (r.replicas, r.adding, r.removing) == ([2, 3, 1], [3], [1])
    assert r.state.leader_epoch == st.leader_epoch + 1 and r.state.leader == 1
    assert c.finish_reassignment(r.state, [2, 3], {1, 2, 3}) is None  # 3 not in sync yet
    synced = replace(r.state, isr=[1, 2, 3])
    done = c.finish_reassignment(synced, c.reassignment_target(synced, [1]), {1, 2, 3})
    assert done is not None
    assert (done.replicas, done.leader, done.isr) == ([2, 3], 2, [2, 3])
    back = c.cancel_reassignment(r.state, [1], [3], {1, 2, 3})
    assert (back.replicas, back.leader, back.isr) == ([2, 1], 1, [1, 2])
    with pytest.raises(c.InvalidReplicaAssignment):
        c.start_reassignment(st, [2, 2])


# ---------------------------------------------------------------------- bounced brokers
def test_a_bounced_leader_is_a_failure_then_a_startup() -> None:
    """Kafka's bouncedBrokerIds: broker 1 re-registered (its broker epoch changed) while
    the controller still lists it live. What it led gets a new leader epoch (another in-sync
    replica, or offline when it was the last one: the next round elects it, newer epoch
    again); it leaves the ISRs it was in; never an unclean election (it is back)."""
    led = ps([1, 2, 3], 1, [1, 2, 3])
    alone = ps([1, 2, 3], 1, [1])
    follows = ps([2, 1, 3], 2, [2, 1, 3])
    elsewhere = ps([2, 3], 2, [2, 3])
    topics = {"t": topic("t", led, alone, follows, elsewhere)}
    out = {d.partition: d for d in c.on_brokers_bounced(
        topics, {1, 2, 3}, {1}, {1: 500, 2: 10, 3: 11}, lambda t, p: -1)}
    assert set(out) == {0, 1, 2}
    assert (out[0].state.leader, out[0].state.leader_epoch, out[0].state.isr) == (2, 4, [2, 3])
    assert (out[1].state.leader, out[1].state.leader_epoch, out[1].state.isr) == (-1, 4, [1])
    assert not out[1].unclean
    assert (out[2].state.leader, out[2].state.leader_epoch, out[2].state.isr) == (2, 3, [2, 3])
    assert all("registered again" in d.why for d in out.values())
    # the startup: the offline partition elects broker 1 at a newer epoch than it led
    after = c.on_brokers_changed({"t": topic("t", out[1].state)}, {1, 2, 3}, lambda t: False)
    assert [(d.state.leader, d.state.leader_epoch) for d in after] == [(1, 5)]


def test_a_registration_newer_than_the_state_is_a_bounce_nobody_saw() -> None:
    """A controller that started after the bounce never saw the broker epoch change: a
    leader or ISR member registered after the state's last write (czxid > mzxid) is
    handled as bounced; one registered before it, or an unknown mzxid, is not."""
    topics = {"t": topic("t", ps([1, 2, 3], 1, [1, 2, 3]), ps([2, 1, 3], 2, [2, 3]))}
    epochs = {1: 900, 2: 10, 3: 11}
    zxid = {("t", 0): 800, ("t", 1): 800}
    out = c.on_brokers_bounced(topics, {1, 2, 3}, set(), epochs, lambda t, p: zxid[(t, p)])
    assert [(d.partition, d.state.leader, d.state.leader_epoch) for d in out] == [(0, 2, 4)]
    assert c.on_brokers_bounced(topics, {1, 2, 3}, set(), epochs, lambda t, p: 950) == []
    assert c.on_brokers_bounced(topics, {1, 2, 3}, set(), epochs, lambda t, p: -1) == []
    assert c.bounced_replicas(ps([1, 2, 3], 2, [2, 3]), set(), epochs, 800) == set()
