"""The controller's state machines and event queue (``replication.controller``): every
(state, target) pair of both tables, legal and illegal, and every event kind, handled
incrementally (only the partitions of the brokers that changed are looked at)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from headrace.metadata.store import PartitionState
from headrace.replication import controller as c
from headrace.replication.controller import (
    PARTITION_TRANSITIONS,
    REPLICA_TRANSITIONS,
    BrokerChange,
    ControlledShutdown,
    Controller,
    InvalidTransitionError,
    IsrChange,
    LeaderAndIsr,
    PartitionPhase,
    ReplicaPhase,
    Startup,
    StateWritten,
    TopicChanged,
    TopicCreated,
    TopicDeleted,
    WriteRefused,
    WriteState,
)

P = PartitionPhase
R = ReplicaPhase

# Kafka's PartitionStateMachine / ReplicaStateMachine validPreviousStates, written out
KAFKA_PARTITION = {
    (P.NON_EXISTENT, P.NEW), (P.NEW, P.ONLINE), (P.ONLINE, P.ONLINE), (P.OFFLINE, P.ONLINE),
    (P.NEW, P.OFFLINE), (P.ONLINE, P.OFFLINE), (P.OFFLINE, P.OFFLINE),
    (P.OFFLINE, P.NON_EXISTENT),
}
KAFKA_REPLICA = {
    (R.NON_EXISTENT, R.NEW),
    *((s, R.ONLINE) for s in (R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_INELIGIBLE)),
    *((s, R.OFFLINE) for s in (R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_INELIGIBLE)),
    (R.OFFLINE, R.DELETION_STARTED), (R.DELETION_STARTED, R.DELETION_SUCCESSFUL),
    (R.OFFLINE, R.DELETION_INELIGIBLE), (R.DELETION_STARTED, R.DELETION_INELIGIBLE),
    (R.DELETION_SUCCESSFUL, R.NON_EXISTENT),
}
TP0 = ("t", 0)


@pytest.mark.parametrize(("current", "target"), list(itertools.product(P, P)))
def test_partition_transition_table(current: PartitionPhase, target: PartitionPhase) -> None:
    ctl = Controller(epoch=1)
    if current is not P.NON_EXISTENT:
        ctl.partition_phase[TP0] = current
    ok = ctl.move_partition(TP0, target)
    assert ok == ((current, target) in KAFKA_PARTITION)
    if ok:
        assert ctl.partition_phase[TP0] is target and not ctl.refused
    else:  # refused and nothing changed
        assert ctl.partition_phase.get(TP0, P.NON_EXISTENT) is current
        assert len(ctl.refused) == 1 and current.value in ctl.refused[0]
        with pytest.raises(InvalidTransitionError):
            c.check_transition(PARTITION_TRANSITIONS, current, target)


@pytest.mark.parametrize(("current", "target"), list(itertools.product(R, R)))
def test_replica_transition_table(current: ReplicaPhase, target: ReplicaPhase) -> None:
    ctl = Controller(epoch=1)
    if current is not R.NON_EXISTENT:
        ctl.replica_phase[(TP0, 1)] = current
    ok = ctl.move_replica(TP0, 1, target)
    assert ok == ((current, target) in KAFKA_REPLICA)
    if ok:
        assert ctl.replica_phase[(TP0, 1)] is target
    else:
        assert ctl.replica_phase.get((TP0, 1), R.NON_EXISTENT) is current
        with pytest.raises(InvalidTransitionError):
            c.check_transition(REPLICA_TRANSITIONS, current, target)


# ---------------------------------------------------------------------- events
def st(replicas: list[int], leader: int, epoch: int, isr: list[int], version: int
       ) -> PartitionState:
    return PartitionState(replicas, leader, epoch, isr, epoch, -1, version)


def started(states: dict[tuple[str, int], PartitionState], live: dict[int, int]
            ) -> tuple[Controller, list[object]]:
    ctl = Controller(epoch=3)
    ctl.enqueue(Startup(states, live))
    return ctl, list(ctl.run())


def writes(effects: list[object]) -> list[WriteState]:
    return [e for e in effects if isinstance(e, WriteState)]


def confirm(ctl: Controller, effects: list[object]) -> list[object]:
    """The shell: every write succeeds (version + 1)."""
    out: list[object] = []
    for w in writes(effects):
        ctl.enqueue(StateWritten(w.tp, PartitionState(
            list(w.state.replicas), w.state.leader, w.state.leader_epoch, list(w.state.isr),
            w.state.partition_epoch, -1, w.expected_version + 1)))
    out += ctl.run()
    return out


def test_startup_creates_new_partitions_then_sends_leader_and_isr() -> None:
    new = PartitionState([1, 2, 3], -1, -1, [], -1, -1, -1)
    ctl, eff = started({TP0: new}, {1: 11, 2: 12, 3: 13})
    [w] = writes(eff)
    assert (w.state.leader, w.state.isr, w.expected_version, w.controller_epoch) == (
        1, [1, 2, 3], -1, 3)
    assert ctl.partition_phase[TP0] is P.NEW
    sent = confirm(ctl, eff)
    assert ctl.partition_phase[TP0] is P.ONLINE
    assert sorted(e.broker for e in sent if isinstance(e, LeaderAndIsr)) == [1, 2, 3]


def test_broker_change_looks_only_at_its_partitions() -> None:
    states = {("t", i): st([i % 3 + 1, (i + 1) % 3 + 1], i % 3 + 1, 0,
                           [i % 3 + 1, (i + 1) % 3 + 1], 0) for i in range(6)}
    ctl, eff = started(states, {1: 11, 2: 12, 3: 13})
    assert not writes(eff)
    ctl.enqueue(BrokerChange({2: 12, 3: 13}))  # broker 1 died
    eff = ctl.run()
    touched = {w.tp for w in writes(eff)}
    assert touched == {tp for tp, s in states.items() if 1 in s.replicas}
    for w in writes(eff):
        assert 1 not in w.state.isr
        if states[w.tp].leader == 1:  # a new leader at the next epoch
            assert w.state.leader != 1 and w.state.leader_epoch == 1
        else:
            assert w.state.leader_epoch == 0  # only the ISR shrank
    for w in writes(eff):
        assert w.expected_version == 0


def test_bounced_broker_is_a_failure_then_a_start() -> None:
    ctl, _ = started({TP0: st([1, 2, 3], 1, 4, [1, 2, 3], 7)}, {1: 11, 2: 12, 3: 13})
    ctl.enqueue(BrokerChange({1: 21, 2: 12, 3: 13}))  # broker 1 restarted (new session)
    eff = ctl.run()
    [w] = writes(eff)
    assert (w.state.leader, w.state.leader_epoch, w.state.isr) == (2, 5, [2, 3])
    sent = confirm(ctl, eff)
    assert sorted(e.broker for e in sent if isinstance(e, LeaderAndIsr)) == [1, 2, 3]


def test_no_live_in_sync_replica_goes_offline_keeping_the_last_isr() -> None:
    ctl, _ = started({TP0: st([1, 2, 3], 1, 0, [1], 2)}, {1: 11, 2: 12, 3: 13})
    ctl.enqueue(BrokerChange({2: 12, 3: 13}))
    eff = ctl.run()
    [w] = writes(eff)
    assert (w.state.leader, w.state.isr) == (-1, [1])
    confirm(ctl, eff)
    assert ctl.partition_phase[TP0] is P.OFFLINE
    ctl.enqueue(BrokerChange({1: 31, 2: 12, 3: 13}))  # the last in-sync replica is back
    [w] = writes(ctl.run())
    assert (w.state.leader, w.state.isr) == (1, [1])


def test_unclean_election_when_allowed() -> None:
    ctl = Controller(epoch=1, unclean=True)
    ctl.enqueue(Startup({TP0: st([1, 2, 3], 1, 0, [1], 2)}, {1: 1, 2: 2, 3: 3}))
    ctl.run()
    ctl.enqueue(BrokerChange({2: 2, 3: 3}))
    [w] = writes(ctl.run())
    assert (w.state.leader, w.state.isr) == (2, [2])


def test_isr_change_updates_the_snapshot_if_newer() -> None:
    ctl, _ = started({TP0: st([1, 2, 3], 1, 0, [1, 2, 3], 2)}, {1: 11, 2: 12, 3: 13})
    assert ctl.run() == []
    ctl.enqueue(IsrChange(TP0, st([1, 2, 3], 1, 0, [1, 2], 3)))
    assert ctl.run() == [] and ctl.states[TP0].isr == [1, 2]
    ctl.enqueue(IsrChange(TP0, st([1, 2, 3], 1, 0, [1, 2, 3], 2)))  # older: ignored
    assert ctl.run() == [] and ctl.states[TP0].zk_version == 3


def test_write_refused_rereads_and_decides_again() -> None:
    ctl, _ = started({TP0: st([1, 2, 3], 1, 0, [1, 2, 3], 2)}, {1: 11, 2: 12, 3: 13})
    ctl.enqueue(BrokerChange({1: 11, 3: 13}))
    [w] = writes(ctl.run())
    assert w.expected_version == 2 and w.state.isr == [1, 3]
    ctl.enqueue(BrokerChange({1: 11, 3: 13}))  # a write in flight: nothing more decided
    assert writes(ctl.run()) == []
    # the leader had written the ISR meanwhile (version 3): refused, re-read, decided again
    ctl.enqueue(WriteRefused(TP0, st([1, 2, 3], 1, 0, [1, 2], 3)))
    [w] = writes(ctl.run())
    assert w.expected_version == 3 and w.state.isr == [1]


def test_topic_created_and_twice() -> None:
    ctl, _ = started({}, {1: 11, 2: 12})
    ctl.enqueue(TopicCreated("u", ((1, 2), (2, 1))))
    eff = ctl.run()
    assert [(w.tp, w.state.leader) for w in writes(eff)] == [(("u", 0), 1), (("u", 1), 2)]
    ctl.enqueue(TopicCreated("u", ((1, 2),)))
    assert ctl.run() == [] and ctl.refused == ["topic u partition 0 exists"]


def test_controlled_shutdown_moves_leadership_and_leaves_isrs() -> None:
    states = {("t", 0): st([1, 2, 3], 1, 0, [1, 2, 3], 0),
              ("t", 1): st([2, 1, 3], 2, 0, [2, 1, 3], 0),
              ("t", 2): st([2, 1], 2, 0, [2], 0)}
    ctl, _ = started(states, {1: 11, 2: 12, 3: 13})
    ctl.enqueue(ControlledShutdown(1))
    got = {w.tp: (w.state.leader, w.state.isr) for w in writes(ctl.run())}
    assert got == {("t", 0): (2, [2, 3]), ("t", 1): (2, [2, 3])}  # t-2: 1 not in its ISR
    # the sole in-sync replica keeps leading while it shuts down (not taken offline)
    ctl.enqueue(BrokerChange({1: 11, 2: 12, 3: 13}))
    assert all(w.tp != ("t", 2) for w in writes(ctl.run()))
    ctl2, _ = started({("t", 2): st([2, 1], 2, 0, [2], 0)}, {1: 11, 2: 12})
    ctl2.enqueue(ControlledShutdown(2))
    assert writes(ctl2.run()) == []
    ctl.enqueue(ControlledShutdown(9))
    assert ctl.run() == [] and "not live" in ctl.refused[-1]


def test_deposed_epoch_is_on_every_write() -> None:
    _, eff = started({TP0: PartitionState([1], -1, -1, [], -1, -1, -1)}, {1: 1})
    assert [w.controller_epoch for w in writes(eff)] == [3]


# ---------------------------------------------------------------------- the running cluster's
class Counting(Controller):
    """Counts the partitions decided (to prove an event looks only at its own)."""

    def __init__(self, epoch: int) -> None:
        super().__init__(epoch)
        self.decided: list[tuple[str, int]] = []

    def _decide(self, tp: tuple[str, int], down: frozenset[int] = frozenset()) -> list:  # type: ignore[override]
        self.decided.append(tp)
        return super()._decide(tp, down)


def test_a_broker_failure_decides_only_the_partitions_it_hosts() -> None:
    """3,000 partitions on brokers 2-4, 10 with broker 1: its failure decides the 10."""
    states = {("b", i): st([2 + i % 3, 2 + (i + 1) % 3, 2 + (i + 2) % 3], 2 + i % 3, 0,
                           [2, 3, 4], 0) for i in range(3000)}
    states |= {("a", i): st([1, 2, 3], 1, 0, [1, 2, 3], 0) for i in range(10)}
    ctl = Counting(epoch=3)
    ctl.enqueue(Startup(states, {1: 11, 2: 12, 3: 13, 4: 14}))
    assert writes(ctl.run()) == []
    ctl.decided.clear()
    ctl.enqueue(BrokerChange({2: 12, 3: 13, 4: 14}))
    eff = ctl.run()
    assert set(ctl.decided) == {("a", i) for i in range(10)}
    assert {w.tp for w in writes(eff)} == {("a", i) for i in range(10)}
    assert ctl.hosted[1] == {("a", i) for i in range(10)}


def test_a_refused_write_decides_that_partition_only() -> None:
    states = {("t", i): st([1, 2, 3], 1, 0, [1, 2, 3], 4) for i in range(50)}
    ctl = Counting(epoch=3)
    ctl.enqueue(Startup(states, {1: 11, 2: 12, 3: 13}))
    ctl.run()
    ctl.enqueue(BrokerChange({1: 11, 3: 13}))
    eff = ctl.run()
    assert len(writes(eff)) == 50
    ctl.decided.clear()
    ctl.enqueue(WriteRefused(("t", 7), st([1, 2, 3], 1, 0, [1, 2], 5)))
    [w] = writes(ctl.run())
    assert ctl.decided == [("t", 7)]
    assert (w.tp, w.expected_version, w.state.isr) == (("t", 7), 5, [1])


def test_startup_finds_a_bounce_it_did_not_see_by_the_state_zxid() -> None:
    """Broker 1 registered (epoch 900) after the state's last write (zxid 800): a bounce
    the new controller never saw: the failure half (another leader, never unclean), then
    on the written state the start. A registration older than the state is no bounce."""
    states = {("t", 0): st([1, 2, 3], 1, 4, [1, 2, 3], 7),
              ("t", 1): st([1, 2, 3], 1, 4, [1], 7),
              ("t", 2): st([1, 2, 3], 1, 4, [1, 2, 3], 7)}
    ctl = Controller(epoch=3, unclean=True)
    ctl.enqueue(Startup(states, {1: 900, 2: 12, 3: 13},
                        {("t", 0): 800, ("t", 1): 800, ("t", 2): 950}))
    eff = ctl.run()
    got = {w.tp: (w.state.leader, w.state.leader_epoch, w.state.isr) for w in writes(eff)}
    assert got == {("t", 0): (2, 5, [2, 3]), ("t", 1): (-1, 5, [1])}
    again = confirm(ctl, eff)
    [w] = writes(again)
    assert (w.tp, w.state.leader, w.state.leader_epoch) == (("t", 1), 1, 6)


def test_a_bounce_never_elects_uncleanly_a_death_may() -> None:
    ctl = Controller(epoch=1, unclean=True)
    ctl.enqueue(Startup({TP0: st([1, 2, 3], 1, 0, [1], 2)}, {1: 1, 2: 2, 3: 3}))
    ctl.run()
    ctl.enqueue(BrokerChange({1: 5, 2: 2, 3: 3}))  # broker 1 bounced: it may lead again
    [w] = writes(ctl.run())
    assert (w.state.leader, w.state.isr) == (-1, [1])
    ctl2 = Controller(epoch=1, unclean=True)
    ctl2.enqueue(Startup({TP0: st([1, 2, 3], 1, 0, [1], 2)}, {1: 1, 2: 2, 3: 3}))
    ctl2.run()
    ctl2.enqueue(BrokerChange({2: 2, 3: 3}))  # broker 1 died
    [w] = writes(ctl2.run())
    assert (w.state.leader, w.state.isr) == (2, [2])
    assert "UNCLEAN" in w.why


def test_unclean_election_per_topic_config() -> None:
    """The topic's ``unclean.leader.election.enable`` overrides the controller's default;
    turning it on elects the topic's offline partitions at once."""
    states = {("t", 0): st([1, 2], 1, 0, [1], 2), ("u", 0): st([1, 2], 1, 0, [1], 2)}
    ctl, _ = started(states, {1: 11, 2: 12})
    ctl.enqueue(TopicChanged("u", {0: states[("u", 0)]}, unclean=True))
    assert writes(ctl.run()) == []
    ctl.enqueue(BrokerChange({2: 12}))
    eff = ctl.run()
    got = {w.tp: (w.state.leader, w.state.isr) for w in writes(eff)}
    assert got == {("t", 0): (-1, [1]), ("u", 0): (2, [2])}
    confirm(ctl, eff)
    ctl.enqueue(TopicChanged("t", {0: ctl.states[("t", 0)]}, unclean=True))
    [w] = writes(ctl.run())
    assert (w.tp, w.state.leader, w.state.isr) == (("t", 0), 2, [2])


def test_topic_changed_creates_new_partitions_and_keeps_known_replicas() -> None:
    """New partitions are created from the topic as read; a known partition takes a newer
    state but keeps the controller's own replicas (it writes every reassignment): a
    notification of an older assignment, read after a reassignment completed, does not
    bring the removed replica back."""
    ctl, _ = started({("t", 0): st([1, 2], 1, 0, [1, 2], 3)}, {1: 11, 2: 12, 3: 13})
    new = PartitionState([3, 1], -1, -1, [], 0, -1, -1)
    ctl.enqueue(TopicChanged("t", {0: st([1, 2, 3], 1, 0, [1, 2], 3), 1: new}))
    [w] = writes(ctl.run())
    assert (w.tp, w.state.leader, w.state.isr, w.expected_version) == (
        ("t", 1), 3, [3, 1], -1)
    assert ctl.partition_phase[("t", 1)] is P.NEW
    assert ctl.states[("t", 0)].replicas == [1, 2] and ("t", 0) not in ctl.hosted.get(3, ())
    ctl.enqueue(TopicChanged("t", {0: st([1, 2, 3], 2, 1, [2, 1], 4)}))
    ctl.run()
    assert (ctl.states[("t", 0)].leader, ctl.states[("t", 0)].zk_version,
            ctl.states[("t", 0)].replicas) == (2, 4, [1, 2])
    ctl.enqueue(IsrChange(("t", 0), st([1, 2, 3], 2, 1, [2], 5)))
    ctl.run()
    assert ctl.states[("t", 0)].replicas == [1, 2] and ctl.states[("t", 0)].isr == [2]


def test_topic_deleted_leaves_no_trace_and_ignores_late_answers() -> None:
    ctl, _ = started({("t", 0): st([1, 2], 1, 0, [1, 2], 3)}, {1: 11, 2: 12})
    ctl.enqueue(BrokerChange({1: 11}))
    [w] = writes(ctl.run())
    ctl.enqueue(TopicDeleted("t"))
    assert ctl.run() == []
    assert not ctl.states and not ctl.partition_phase and not ctl.replica_phase
    assert not any(ctl.hosted.values()) and not ctl.in_flight and not ctl.refused
    ctl.enqueue(StateWritten(w.tp, replace(w.state, zk_version=4)))
    ctl.enqueue(WriteRefused(w.tp, None))
    assert ctl.run() == [] and not ctl.states
    # created again under the same name: new partitions from version -1
    ctl.enqueue(TopicChanged("t", {0: PartitionState([2, 1], -1, -1, [], 0, -1, -1)}))
    [w] = writes(ctl.run())
    assert (w.state.leader, w.state.isr, w.expected_version) == (1, [1], -1)


def test_a_shut_down_broker_that_bounces_may_lead_again() -> None:
    ctl, _ = started({TP0: st([1, 2], 1, 0, [1, 2], 3)}, {1: 11, 2: 12})
    ctl.enqueue(ControlledShutdown(1))
    eff = ctl.run()
    assert 1 in ctl.shutting_down
    confirm(ctl, eff)
    ctl.enqueue(BrokerChange({1: 21, 2: 12}))  # restarted within one notification
    ctl.run()
    assert ctl.shutting_down == set()


def test_startup_bounce_of_an_offline_partitions_last_replica_elects_it() -> None:
    """Seen in a real cluster: broker 2, the last in-sync replica of an offline partition,
    re-registered after the state's last write; the new controller's failure half has
    nothing to write (already offline), so the start elects it at once (a newer epoch)."""
    ctl = Controller(epoch=4)
    ctl.enqueue(Startup({TP0: st([2], -1, 3, [2], 9)}, {2: 900, 3: 13}, {TP0: 800}))
    [w] = writes(ctl.run())
    assert (w.state.leader, w.state.leader_epoch, w.state.isr) == (2, 4, [2])


def test_a_state_of_an_unknown_partition_is_ignored() -> None:
    ctl, _ = started({}, {1: 11})
    ctl.enqueue(IsrChange(("gone", 0), st([1], 1, 0, [1], 4)))
    assert ctl.run() == [] and not ctl.states and "unknown partition" in ctl.refused[-1]


def test_preferred_election_on_request_and_its_outcomes() -> None:
    """ElectLeaders / the admin znode, decided over the snapshot: leadership back to the
    first replica when it is live, in sync and not shutting down; each partition's outcome
    answers the request, and a refused write turns "elected" into "not available"."""
    states = {("t", 0): st([1, 2, 3], 2, 4, [1, 2, 3], 5),   # preferred 1 in sync: elected
              ("t", 1): st([1, 2, 3], 1, 0, [1, 2, 3], 0),   # leads already
              ("t", 2): st([3, 1, 2], 1, 2, [1, 2], 3),      # preferred 3 out of sync
              ("t", 3): st([2, 1, 3], 1, 2, [1, 2, 3], 3)}   # preferred 2 shutting down
    ctl, _ = started(states, {1: 11, 2: 12, 3: 13})
    ctl.shutting_down.add(2)
    ctl.enqueue(c.Elect((("t", 0), ("t", 1), ("t", 2), ("t", 3), ("u", 0))))
    [w] = writes(ctl.run())
    assert w.tp == ("t", 0) and (w.state.leader, w.state.leader_epoch, w.expected_version) \
        == (1, 5, 5) and w.state.isr == [1, 2, 3]
    assert ctl.outcomes == {("t", 0): "elected", ("t", 1): "not needed",
                            ("t", 2): "not available", ("t", 3): "not available",
                            ("u", 0): "unknown"}
    # another controller elected 3 meanwhile (1 out of the ISR): refused, nothing to decide
    ctl.enqueue(WriteRefused(("t", 0), st([1, 2, 3], 3, 5, [3, 2], 6)))
    assert writes(ctl.run()) == []
    assert ctl.outcomes[("t", 0)] == "not available"


def test_unclean_election_on_request_only_for_partitions_without_a_live_leader() -> None:
    states = {("t", 0): st([1, 2, 3], -1, 4, [1], 5),   # offline: 2 elected uncleanly
              ("t", 1): st([2, 3, 1], 2, 0, [2, 3], 0)}  # has a live leader
    ctl, _ = started(states, {2: 12, 3: 13})
    ctl.enqueue(c.Elect((("t", 0), ("t", 1)), preferred=False))
    [w] = writes(ctl.run())
    assert (w.tp, w.state.leader, w.state.isr, w.state.leader_epoch) == (("t", 0), 2, [2], 5)
    assert "UNCLEAN" in w.why
    assert ctl.outcomes == {("t", 0): "elected", ("t", 1): "not needed"}


def test_auto_rebalance_moves_leaders_back_past_the_imbalance_percentage() -> None:
    """Broker 1 is the first replica of 4 partitions and leads 1 of them (75% off its share,
    above 10%): the 2 whose preferred replica is in sync go back; broker 2 leads its only
    one (0%): nothing."""
    states = {("t", 0): st([1, 2], 1, 0, [1, 2], 0),
              ("t", 1): st([1, 2], 2, 1, [1, 2], 1),
              ("t", 2): st([1, 2], 2, 1, [1, 2], 1),
              ("t", 3): st([1, 2], 2, 1, [2], 1),
              ("t", 4): st([2, 1], 2, 0, [2, 1], 0)}
    ctl, _ = started(states, {1: 11, 2: 12})
    ctl.enqueue(c.Rebalance(10))
    ws = writes(ctl.run())
    assert sorted(w.tp for w in ws) == [("t", 1), ("t", 2)]
    assert all(w.state.leader == 1 and w.state.leader_epoch == 2 for w in ws)
    ctl2, _ = started(states, {1: 11, 2: 12})
    ctl2.enqueue(c.Rebalance(75))  # 75% is not above 75%: nothing
    assert writes(ctl2.run()) == []


# ---------------------------------------------------------------------- reassignment (KIP-455)
def test_reassignment_writes_the_assignment_first_and_completes_once_the_target_is_in_sync(
        ) -> None:
    """Kafka's onPartitionReassignment: the assignment (RS = target + leaving, adding and
    removing) before the state (RS, leader epoch bumped); nothing more while the adding
    replica is out of the ISR; once it is in, the state moves to the target (leader 1 is
    leaving: the first in-sync target replica leads) and, once written, the assignment
    without adding / removing; the leaving replica is deleted from the replica table."""
    ctl, _ = started({TP0: st([1, 2, 3], 1, 4, [1, 2, 3], 7)}, {1: 11, 2: 12, 3: 13, 4: 14})
    ctl.enqueue(c.Reassign(((TP0, (2, 3, 4)),)))
    eff = ctl.run()
    assert [type(e).__name__ for e in eff] == ["WriteAssignment", "WriteState"]
    a, w = eff
    assert isinstance(a, c.WriteAssignment) and isinstance(w, WriteState)
    assert (a.topic, a.assignment, a.adding, a.removing, a.controller_epoch) == (
        "t", {0: [2, 3, 4, 1]}, {0: [4]}, {0: [1]}, 3)
    assert (w.state.replicas, w.state.leader, w.state.leader_epoch, w.state.isr,
            w.expected_version) == ([2, 3, 4, 1], 1, 5, [1, 2, 3], 7)
    assert ctl.reassign_outcomes == {TP0: ("none", None)}
    after = confirm(ctl, eff)
    assert writes(after) == [] and not [e for e in after if isinstance(e, c.WriteAssignment)]
    assert sorted(e.broker for e in after if isinstance(e, LeaderAndIsr)) == [1, 2, 3, 4]
    assert ctl.replica_phase[(TP0, 4)] is R.ONLINE and TP0 in ctl.hosted[4]
    # an ISR change that leaves 4 out: still reassigning
    ctl.enqueue(IsrChange(TP0, st([2, 3, 4, 1], 1, 5, [1, 2], 9)))
    assert writes(ctl.run()) == []
    ctl.enqueue(IsrChange(TP0, st([2, 3, 4, 1], 1, 5, [1, 2, 3, 4], 10)))
    [done] = writes(ctl.run())
    assert (done.state.replicas, done.state.leader, done.state.leader_epoch, done.state.isr,
            done.why) == ([2, 3, 4], 2, 6, [2, 3, 4], "reassignment completed")
    assert TP0 in ctl.reassigning  # until the state is written
    final = confirm(ctl, [done])
    [a2] = [e for e in final if isinstance(e, c.WriteAssignment)]
    assert (a2.assignment, a2.adding, a2.removing) == ({0: [2, 3, 4]}, {}, {})
    assert ctl.reassigning == {} and (TP0, 1) not in ctl.replica_phase
    assert TP0 not in ctl.hosted[1] and TP0 in ctl.hosted[4]


def test_reassignment_requests_answered_per_partition_and_cancelled() -> None:
    states = {("t", 0): st([1, 2], 1, 0, [1, 2], 0), ("t", 1): st([2, 3], 2, 0, [2, 3], 0),
              ("t", 2): st([3, 1], 3, 0, [3, 1], 0)}
    ctl, _ = started(states, {1: 11, 2: 12, 3: 13})
    ctl.in_flight.add(("t", 2))  # a state write not answered yet
    ctl.enqueue(c.Reassign(((("t", 0), (2, 3)), (("t", 1), None), (("t", 2), (1, 2)),
                            (("t", 9), (1, 2)), (("t", 0), (1, 1)))))
    eff = ctl.run()
    assert ctl.reassign_outcomes[("t", 1)] == ("no_reassignment_in_progress", None)
    assert ctl.reassign_outcomes[("t", 2)][0] == "reassignment_in_progress"
    assert ctl.reassign_outcomes[("t", 9)] == ("unknown_topic_or_partition", None)
    assert ctl.reassign_outcomes[("t", 0)][0] == "invalid_replica_assignment"  # the last one
    ctl.enqueue(c.Reassign(((("t", 1), (2, 9)),)))  # broker 9 is not registered
    ctl.run()
    assert ctl.reassign_outcomes[("t", 1)][0] == "invalid_replica_assignment"
    # the valid first request for t-0 went out: [2, 3] from [1, 2]
    [w] = writes(eff)
    assert w.state.replicas == [2, 3, 1] and ctl.reassigning[("t", 0)] == ([3], [1])
    confirm(ctl, eff)
    # cancelled: back to the original replicas (RS minus adding, in RS's order, as Kafka's
    # ReplicaAssignment.originReplicas), the assignment without the reassignment
    ctl.enqueue(c.Reassign(((("t", 0), None),)))
    eff = ctl.run()
    [a] = [e for e in eff if isinstance(e, c.WriteAssignment)]
    [w] = writes(eff)
    assert (a.assignment, a.adding, a.removing) == ({0: [2, 1], 1: [2, 3], 2: [3, 1]}, {}, {})
    assert (w.state.replicas, w.state.leader, w.state.isr) == ([2, 1], 1, [1, 2])
    assert ctl.reassigning == {}


def test_a_new_target_replaces_the_reassignment_in_progress_from_the_original() -> None:
    ctl, _ = started({TP0: st([1, 2], 1, 0, [1, 2], 0)}, {1: 11, 2: 12, 3: 13, 4: 14})
    ctl.enqueue(c.Reassign(((TP0, (1, 3)),)))
    confirm(ctl, ctl.run())
    assert ctl.reassigning[TP0] == ([3], [2])
    ctl.enqueue(c.Reassign(((TP0, (1, 4)),)))
    eff = ctl.run()
    [w] = writes(eff)
    assert w.state.replicas == [1, 4, 2] and ctl.reassigning[TP0] == ([4], [2])
    [a] = [e for e in eff if isinstance(e, c.WriteAssignment)]
    assert (a.assignment, a.adding, a.removing) == ({0: [1, 4, 2]}, {0: [4]}, {0: [2]})


def test_a_new_controller_completes_a_reassignment_it_loaded() -> None:
    """Startup's reassignments (the topic znode's adding / removing): the target is in
    sync already, so the new controller completes it at once."""
    ctl = Controller(epoch=3)
    ctl.enqueue(Startup({TP0: st([2, 3, 1], 1, 4, [1, 2, 3], 7)}, {1: 11, 2: 12, 3: 13},
                        reassignments={TP0: ([3], [1])}))
    [w] = writes(ctl.run())
    assert (w.state.replicas, w.state.leader, w.why) == ([2, 3], 2, "reassignment completed")


def test_topic_deletion_stops_its_decisions_and_ends_its_reassignments() -> None:
    states = {("t", 0): st([1, 2], 1, 0, [1, 2], 0), ("u", 0): st([1, 2], 1, 0, [1, 2], 0)}
    ctl, _ = started(states, {1: 11, 2: 12, 3: 13})
    ctl.enqueue(c.Reassign(((("t", 0), (2, 3)),)))
    confirm(ctl, ctl.run())
    ctl.enqueue(c.DeletionRequested("t"))
    assert ctl.run() == [c.DeleteTopic("t", 3)]
    assert ctl.replica_phase[(("t", 0), 1)] is R.DELETION_STARTED
    assert ctl.reassigning == {}
    ctl.enqueue(c.DeletionRequested("t"))  # under way: nothing again
    assert ctl.run() == []
    # broker 1 dies: u-0 elects 2; t-0, being deleted, is not decided
    ctl.enqueue(BrokerChange({2: 12, 3: 13}))
    assert [w.tp for w in writes(ctl.run())] == [("u", 0)]
    ctl.enqueue(c.DeletionFailed("t"))  # the shell could not delete: asked again
    ctl.enqueue(c.DeletionRequested("t"))
    assert ctl.run() == [c.DeleteTopic("t", 3)]
    ctl.enqueue(TopicDeleted("t"))
    ctl.run()
    assert "t" not in ctl.deleting and ("t", 0) not in ctl.states
    ctl.enqueue(c.DeletionRequested("gone"))  # a topic it does not know: the request only
    assert ctl.run() == [c.DeleteTopic("gone", 3, known=False)] and "gone" not in ctl.deleting


def test_a_refused_reassignment_start_never_completes_to_a_wrong_target() -> None:
    """The assignment (RS [2, 3, 4, 1]) is written, the state write is refused (a leader's
    ISR change came first): decided again over RS, the target [2, 3, 4] is not in sync
    (4 is not in the ISR), so nothing completes: not [2, 3], what the old replicas minus
    the leaving one would say."""
    ctl, _ = started({TP0: st([1, 2, 3], 1, 4, [1, 2, 3], 7)}, {1: 11, 2: 12, 3: 13, 4: 14})
    ctl.enqueue(c.Reassign(((TP0, (2, 3, 4)),)))
    ctl.run()
    ctl.enqueue(WriteRefused(TP0, st([1, 2, 3], 1, 4, [1, 2, 3], 8)))
    assert writes(ctl.run()) == []
    assert ctl.states[TP0].replicas == [2, 3, 4, 1] and TP0 in ctl.hosted[4]
    ctl.enqueue(IsrChange(TP0, st([1, 2, 3], 1, 4, [1, 2, 3, 4], 9)))
    [w] = writes(ctl.run())
    assert (w.state.replicas, w.why) == ([2, 3, 4], "reassignment completed")


def test_without_leader_and_isr_the_decisions_are_the_same() -> None:
    """The ZooKeeper shell turns LeaderAndIsr effects off (its brokers read the state
    notifications): every write decided is the same, in the same order, through a
    startup, a death, a bounce and a return; only the LeaderAndIsr effects are gone."""
    states = {("t", i): st([i % 3 + 1, (i + 1) % 3 + 1, (i + 2) % 3 + 1], i % 3 + 1, 0,
                           [1, 2, 3], 0) for i in range(9)}
    states[("t", 9)] = PartitionState([1, 2, 3], -1, -1, [], -1, -1, -1)  # new
    runs = []
    for flag in (True, False):
        ctl = Controller(epoch=3, leader_and_isr=flag)
        ctl.enqueue(Startup({tp: s.copy() for tp, s in states.items()}, {1: 11, 2: 12, 3: 13}))
        log: list[object] = []
        for event in (None, BrokerChange({2: 12, 3: 13}), BrokerChange({1: 14, 2: 12, 3: 13}),
                      BrokerChange({1: 14, 2: 15, 3: 13})):
            if event is not None:
                ctl.enqueue(event)
            eff = list(ctl.run())
            eff += confirm(ctl, eff)
            log.append(eff)
        runs.append((log, ctl.states))
    (with_lai, states_with), (without, states_without) = runs
    assert any(isinstance(e, LeaderAndIsr) for eff in with_lai for e in eff)
    assert not any(isinstance(e, LeaderAndIsr) for eff in without for e in eff)
    assert [[e for e in eff if not isinstance(e, LeaderAndIsr)] for eff in with_lai] == without
    assert states_with == states_without
    assert sum(len(writes(eff)) for eff in without) > 10  # the events did decide things
