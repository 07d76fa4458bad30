"""The controller's partition and replica state machines and its event queue. PURE.

Kafka's ZooKeeper-mode controller (``PartitionStateMachine``, ``ReplicaStateMachine``,
``ControllerEventManager``) as plain objects: the shell turns ZooKeeper watches, broker
registrations and admin requests into events, ``Controller.run`` handles them one at a time
over its snapshot of the partition states and returns effects (conditional writes of a
partition state znode, LeaderAndIsr requests to brokers) for the shell to carry out.

Rules:

1. **Transitions are tables** (``PARTITION_TRANSITIONS``, ``REPLICA_TRANSITIONS``): each
   target state lists its valid previous states, as Kafka's ``validPreviousStates``. An
   invalid transition raises ``InvalidTransitionError`` and changes nothing; the controller
   records it in ``refused`` and goes on (Kafka logs it).
2. **Incremental events.** ``BrokerChange`` looks only at the partitions hosted on the
   brokers that left, came back or bounced (a new broker epoch: a failure followed by a
   start, Kafka's bounced brokers); ``IsrChange`` at one partition; ``TopicCreated`` at the
   new partitions; ``ControlledShutdown`` at the partitions hosted on one broker. Only
   ``Startup`` (the controller just won the election) reads everything, as Kafka's
   ``onControllerFailover``.
3. **Writes are conditional.** Every ``WriteState`` carries the znode version the decision
   was made on and the controller epoch (the shell's store refuses a write from a deposed
   controller). The snapshot changes only when the shell reports the write done
   (``StateWritten``); a refused write (``WriteRefused``) brings the znode's current state,
   which replaces the snapshot and is decided again — someone else decided, never
   overwrite.
4. **Elections** are ``cluster.controller``'s pure functions: ``offline_election`` for a
   partition whose leader left, ``initial_state`` for a new one, the controlled-shutdown
   move to the first other live in-sync replica. A dead follower leaves the ISR, never
   emptying it (the last in-sync replica stays so that only it may lead again).
5. **LeaderAndIsr** goes to the replicas of a partition once its new state is written, and
   to a broker that (re)starts for every partition it hosts.
6. **A bounce is a failure, then a start**: the failure half never elects uncleanly (the
   bounced replica is back and may lead again, at a newer epoch). ``Startup`` also finds
   the bounces the new controller cannot have seen happen: an ISR member or leader whose
   broker epoch (its registration's zxid) is newer than the state's last write
   (``state_zxids``; ``cluster.controller.bounced_replicas``).
7. **Topics**: ``TopicChanged`` brings a topic's states as read (new partitions, a newer
   state, its ``unclean.leader.election.enable``; a known partition's replicas stay the
   controller's own, rule 10), ``TopicDeleted``
   drops its partitions from every table and index. Unclean election is decided per
   topic (``unclean_topics``, else ``unclean``).
8. **Controlled shutdown**: a broker shutting down leads nothing another live in-sync
   replica can lead and leaves every ISR it is not alone in; it stops shutting down when
   its registration goes (it died or registered again).
9. **Elections on request** (``Elect``: ElectLeaders, the preferred-election admin znode)
   and the **auto rebalance** (``Rebalance``, Kafka's ``checkAndTriggerAutoLeaderRebalance``)
   decide over the same snapshot: a preferred election moves leadership to the first
   replica if it is live, in the ISR and not shutting down; an unclean election on
   request elects any live replica of a partition without a live leader. Each requested
   partition's outcome goes to ``outcomes`` (``elected`` until its write is refused, then
   ``not available``; ``not needed``, ``not available``, ``unknown``) for the shell to
   answer with.
10. **Reassignments** (KIP-455, Kafka's ``onPartitionReassignment``; ``Reassign``:
    AlterPartitionReassignments). Starting one writes the topic's assignment first
    (``WriteAssignment``: RS = target + the replicas leaving, with adding / removing) and
    then the partition's state (RS, the leader epoch bumped so every replica acts on it).
    The controller owns the reassignments in progress (``reassigning``: loaded at
    ``Startup``, changed only by its own decisions). Whenever a reassigning partition is
    decided again (its ISR changed, a broker came or went, a write was answered) and every
    target replica is in the ISR, it completes: the state first (replicas = target, the
    leader moved into the target), then, once written, the assignment without the
    partition's adding / removing. A new target replaces one in progress (from the
    original replicas); ``None`` cancels (back to the original replicas). Each requested
    partition's answer goes to ``reassign_outcomes`` (error name, message).
11. **Topic deletion** (Kafka's ``TopicDeletionManager``; ``DeletionRequested``): a
    requested topic's replicas go to ReplicaDeletionStarted and its znodes are deleted
    (``DeleteTopic``); its reassignments end with it. The store's notification
    (``TopicDeleted``) completes it. A request for a topic the controller does not know
    only clears the request (``DeleteTopic`` with ``known`` false); a failed delete
    (``DeletionFailed``) is requested again by the shell.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from headrace.cluster.controller import (
    bounced_replicas,
    cancel_reassignment,
    elected,
    finish_reassignment,
    initial_state,
    offline_election,
    preferred_election,
    reassignment_target,
    start_reassignment,
)
from headrace.metadata.store import PartitionState

TP = tuple[str, int]


class InvalidTransitionError(ValueError):
    """A state machine was asked for a transition its table does not allow (our misuse,
    or a stale event): nothing changed."""


# ---------------------------------------------------------------------- partition states
class PartitionPhase(enum.Enum):
    NON_EXISTENT = "NonExistentPartition"
    NEW = "NewPartition"
    ONLINE = "OnlinePartition"
    OFFLINE = "OfflinePartition"


PARTITION_TRANSITIONS: dict[PartitionPhase, frozenset[PartitionPhase]] = {
    PartitionPhase.NEW: frozenset({PartitionPhase.NON_EXISTENT}),
    PartitionPhase.ONLINE: frozenset({PartitionPhase.NEW, PartitionPhase.ONLINE,
                                      PartitionPhase.OFFLINE}),
    PartitionPhase.OFFLINE: frozenset({PartitionPhase.NEW, PartitionPhase.ONLINE,
                                       PartitionPhase.OFFLINE}),
    PartitionPhase.NON_EXISTENT: frozenset({PartitionPhase.OFFLINE}),
}


# ---------------------------------------------------------------------- replica states
class ReplicaPhase(enum.Enum):
    NEW = "NewReplica"
    ONLINE = "OnlineReplica"
    OFFLINE = "OfflineReplica"
    DELETION_STARTED = "ReplicaDeletionStarted"
    DELETION_SUCCESSFUL = "ReplicaDeletionSuccessful"
    DELETION_INELIGIBLE = "ReplicaDeletionIneligible"
    NON_EXISTENT = "NonExistentReplica"


_R = ReplicaPhase
REPLICA_TRANSITIONS: dict[ReplicaPhase, frozenset[ReplicaPhase]] = {
    _R.NEW: frozenset({_R.NON_EXISTENT}),
    _R.ONLINE: frozenset({_R.NEW, _R.ONLINE, _R.OFFLINE, _R.DELETION_INELIGIBLE}),
    _R.OFFLINE: frozenset({_R.NEW, _R.ONLINE, _R.OFFLINE, _R.DELETION_INELIGIBLE}),
    _R.DELETION_STARTED: frozenset({_R.OFFLINE}),
    _R.DELETION_SUCCESSFUL: frozenset({_R.DELETION_STARTED}),
    _R.DELETION_INELIGIBLE: frozenset({_R.OFFLINE, _R.DELETION_STARTED}),
    _R.NON_EXISTENT: frozenset({_R.DELETION_SUCCESSFUL}),
}


S = TypeVar("S", PartitionPhase, ReplicaPhase)


def check_transition(table: Mapping[S, frozenset[S]], current: S, target: S) -> None:
    """Raise ``InvalidTransitionError`` unless ``current`` -> ``target`` is in ``table``."""
    if current not in table[target]:
        raise InvalidTransitionError(
            f"{current.value} -> {target.value} is not a valid transition (valid previous "
            f"states: {sorted(s.value for s in table[target])})")


# ---------------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class Startup:
    """This broker won the controller election: the full read of ZooKeeper."""
    states: Mapping[TP, PartitionState]
    live: Mapping[int, int]  # broker id -> broker epoch (its registration's session)
    # the zxid of each state's last write (-1 / absent: unknown), to find the bounces this
    # controller did not see (a registration newer than the state)
    state_zxids: Mapping[TP, int] = field(default_factory=dict)
    # reassignments in progress (the topic znodes' adding / removing replicas)
    reassignments: Mapping[TP, tuple[list[int], list[int]]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BrokerChange:
    live: Mapping[int, int]


@dataclass(frozen=True, slots=True)
class IsrChange:
    """A partition's state znode changed (a leader wrote its ISR): the state read."""
    tp: TP
    state: PartitionState


@dataclass(frozen=True, slots=True)
class TopicCreated:
    topic: str
    assignment: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class TopicChanged:
    """A topic as read: its partitions' states (with the assignment's replicas; a state
    not written yet has ``zk_version`` -1) and its unclean election config (None: the
    controller's default). New partitions are created, known ones take a newer state
    (keeping the controller's own replicas, rule 7); each is decided again."""
    topic: str
    states: Mapping[int, PartitionState]
    unclean: bool | None = None


@dataclass(frozen=True, slots=True)
class TopicDeleted:
    topic: str


@dataclass(frozen=True, slots=True)
class ControlledShutdown:
    broker: int


@dataclass(frozen=True, slots=True)
class Elect:
    """Elections asked for: ``preferred`` (leadership back to the first replica) or
    unclean (an offline partition elects any live replica)."""
    tps: tuple[TP, ...]
    preferred: bool = True


@dataclass(frozen=True, slots=True)
class Rebalance:
    """The auto leader rebalance: every broker whose share of the partitions it should
    lead (first replica) but does not is above ``percentage`` gets them back."""
    percentage: int


@dataclass(frozen=True, slots=True)
class Reassign:
    """AlterPartitionReassignments: per partition its target replicas, or None to cancel
    the reassignment in progress."""
    items: tuple[tuple[TP, tuple[int, ...] | None], ...]


@dataclass(frozen=True, slots=True)
class DeletionRequested:
    topic: str


@dataclass(frozen=True, slots=True)
class DeletionFailed:
    """The shell could not delete the topic's znodes (no answer): request it again."""
    topic: str


@dataclass(frozen=True, slots=True)
class StateWritten:
    tp: TP
    state: PartitionState  # with the znode version the write produced


@dataclass(frozen=True, slots=True)
class WriteRefused:
    tp: TP
    current: PartitionState | None  # what the znode holds now


Event = Startup | BrokerChange | IsrChange | TopicCreated | TopicChanged | TopicDeleted | \
    ControlledShutdown | Elect | Rebalance | Reassign | DeletionRequested | DeletionFailed | \
    StateWritten | WriteRefused


# ---------------------------------------------------------------------- effects
@dataclass(frozen=True, slots=True)
class WriteState:
    """Write ``state`` to the partition's znode if its version is still
    ``expected_version`` (-1: create it) and ``controller_epoch`` is still current."""
    tp: TP
    state: PartitionState
    expected_version: int
    controller_epoch: int
    why: str


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    broker: int
    tp: TP
    state: PartitionState


@dataclass(frozen=True, slots=True)
class WriteAssignment:
    """Write the topic's assignment: every partition's replicas, and the reassignments
    still in progress (adding / removing replicas), if ``controller_epoch`` is current."""
    topic: str
    assignment: dict[int, list[int]]
    adding: dict[int, list[int]]
    removing: dict[int, list[int]]
    controller_epoch: int
    why: str


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    """Delete the topic's znodes and its deletion request (``known`` false: only the
    request: the controller knows no such topic)."""
    topic: str
    controller_epoch: int
    known: bool = True


Effect = WriteState | LeaderAndIsr | WriteAssignment | DeleteTopic


@dataclass(slots=True)
class Controller:
    """The active controller at ``epoch``. ``enqueue`` events, ``run`` to handle them."""

    epoch: int
    unclean: bool = False
    unclean_topics: dict[str, bool] = field(default_factory=dict)  # per-topic config
    states: dict[TP, PartitionState] = field(default_factory=dict)
    partition_phase: dict[TP, PartitionPhase] = field(default_factory=dict)
    replica_phase: dict[tuple[TP, int], ReplicaPhase] = field(default_factory=dict)
    live: dict[int, int] = field(default_factory=dict)
    hosted: dict[int, set[TP]] = field(default_factory=dict)  # broker -> its partitions
    shutting_down: set[int] = field(default_factory=set)
    in_flight: set[TP] = field(default_factory=set)  # a write not yet answered
    writing: dict[TP, PartitionState] = field(default_factory=dict)  # what it writes
    refused: list[str] = field(default_factory=list)
    queue: deque[Event] = field(default_factory=deque)
    handled: int = 0
    # requested elections: partition -> elected / not needed / not available / unknown
    outcomes: dict[TP, str] = field(default_factory=dict)
    # reassignments in progress: partition -> (adding, removing)
    reassigning: dict[TP, tuple[list[int], list[int]]] = field(default_factory=dict)
    completing: set[TP] = field(default_factory=set)  # the completing state is in flight
    # requested reassignments: partition -> (error name, message)
    reassign_outcomes: dict[TP, tuple[str, str | None]] = field(default_factory=dict)
    deleting: set[str] = field(default_factory=set)  # topics whose deletion is under way
    partitions_of: dict[str, set[int]] = field(default_factory=dict)  # topic -> partitions
    # LeaderAndIsr effects wanted: the simulation delivers them; the ZooKeeper shell does
    # not (its brokers read the state change notifications), and a failover of 30,000
    # partitions made 60,000 of them for nothing
    leader_and_isr: bool = True

    # ------------------------------------------------------------------ queue
    def enqueue(self, event: Event) -> None:
        self.queue.append(event)

    def run(self) -> list[Effect]:
        """Handle every queued event, in order; the effects of all of them."""
        out: list[Effect] = []
        while self.queue:
            out += self.handle(self.queue.popleft())
        return out

    def handle(self, event: Event) -> list[Effect]:
        self.handled += 1
        if type(event) is StateWritten:  # the most frequent: one per partition written
            return self._written(event.tp, event.state)
        if isinstance(event, Startup):
            return self._startup(event)
        if isinstance(event, BrokerChange):
            return self._broker_change(event.live)
        if isinstance(event, IsrChange):
            return self._isr_change(event.tp, event.state)
        if isinstance(event, TopicCreated):
            return self._topic_created(event)
        if isinstance(event, TopicChanged):
            return self._topic_changed(event)
        if isinstance(event, TopicDeleted):
            return self._topic_deleted(event.topic)
        if isinstance(event, ControlledShutdown):
            return self._controlled_shutdown(event.broker)
        if isinstance(event, Elect):
            return self._elect(event.tps, event.preferred)
        if isinstance(event, Rebalance):
            return self._rebalance(event.percentage)
        if isinstance(event, Reassign):
            return self._reassign(event.items)
        if isinstance(event, DeletionRequested):
            return self._deletion_requested(event.topic)
        if isinstance(event, DeletionFailed):
            self.deleting.discard(event.topic)
            return []
        if isinstance(event, StateWritten):
            return self._written(event.tp, event.state)
        return self._refused(event.tp, event.current)

    # ------------------------------------------------------------------ state machines
    def move_partition(self, tp: TP, target: PartitionPhase) -> bool:
        current = self.partition_phase.get(tp, PartitionPhase.NON_EXISTENT)
        try:
            check_transition(PARTITION_TRANSITIONS, current, target)
        except InvalidTransitionError as e:
            self.refused.append(f"partition {tp[0]}-{tp[1]}: {e}")
            return False
        self.partition_phase[tp] = target
        return True

    def move_replica(self, tp: TP, broker: int, target: ReplicaPhase) -> bool:
        current = self.replica_phase.get((tp, broker), ReplicaPhase.NON_EXISTENT)
        try:
            check_transition(REPLICA_TRANSITIONS, current, target)
        except InvalidTransitionError as e:
            self.refused.append(f"replica {broker} of {tp[0]}-{tp[1]}: {e}")
            return False
        self.replica_phase[(tp, broker)] = target
        return True

    # ------------------------------------------------------------------ helpers
    def _index(self, tp: TP, st: PartitionState) -> None:
        old = self.states.get(tp)
        self.states[tp] = st
        self.partitions_of.setdefault(tp[0], set()).add(tp[1])
        if old is not None and old.replicas != st.replicas:
            for r in set(old.replicas) - set(st.replicas):
                self.hosted.get(r, set()).discard(tp)
        for r in st.replicas:
            self.hosted.setdefault(r, set()).add(tp)

    def _unclean(self, topic: str) -> bool:
        return self.unclean_topics.get(topic, self.unclean)

    def _write(self, tp: TP, st: PartitionState, why: str) -> list[Effect]:
        if tp in self.in_flight:
            return []  # decided again when the write in flight is answered
        old = self.states.get(tp)
        self.in_flight.add(tp)
        self.writing[tp] = st
        expected = old.zk_version if old is not None else -1
        return [WriteState(tp, st.copy(), expected, self.epoch, why)]

    def _decide(self, tp: TP, down: frozenset[int] = frozenset()) -> list[Effect]:
        """The one decision for ``tp`` given the live brokers (Kafka's
        ``onBrokerFailure`` / ``onBrokerStartup`` / ``triggerOnlinePartitionStateChange``
        for one partition). ``down``: live brokers handled as failed here (the failure
        half of a bounce): never an unclean election then."""
        st = self.states.get(tp)
        if st is None or tp in self.in_flight or tp[0] in self.deleting:
            return []
        live = set(self.live) - down
        unclean = self._unclean(tp[0]) and not (down & set(st.replicas))
        if self.partition_phase.get(tp) is PartitionPhase.NEW or st.zk_version < 0:
            init = initial_state(list(st.replicas), live)
            return [] if init is None else self._write(tp, init, "new partition")
        usable = live - self.shutting_down
        if tp in self.reassigning and not down:
            target = reassignment_target(st, self.reassigning[tp][1])
            done = finish_reassignment(st, target, usable)
            if done is not None:
                self.completing.add(tp)
                return self._write(tp, done, "reassignment completed")
        if st.leader in self.shutting_down and st.leader in live:
            # controlled shutdown: leadership moves to another live in-sync replica if
            # there is one; else the broker keeps leading (its shutdown waits)
            choice = offline_election(st, usable, False)
            if choice is not None:
                return self._write(tp, elected(st, choice[0], choice[1]),
                                   f"controlled shutdown of broker {st.leader}")
        if st.leader in live:
            dead = [r for r in st.isr if r not in live and r != st.leader]
            if dead:
                isr = [r for r in st.isr if r not in dead]
                shrunk = st.copy()
                shrunk.isr = isr
                return self._write(tp, shrunk, f"broker(s) {dead} left the ISR")
            return []
        choice = offline_election(st, usable, unclean)
        if choice is None:
            if st.leader != -1:
                isr = [r for r in st.isr if r in live] or list(st.isr)
                return self._write(tp, elected(st, -1, isr),
                                   f"leader {st.leader} gone, no live in-sync replica")
            return []
        leader, isr, was_unclean = choice
        return self._write(tp, elected(st, leader, isr),
                           f"leader {st.leader} gone" + (" (UNCLEAN election: broker "
                                                         f"{leader} was not in the ISR)"
                                                         if was_unclean else ""))

    def _leader_and_isr(self, tp: TP, brokers: Iterable[int]) -> list[Effect]:
        if not self.leader_and_isr:
            return []
        st = self.states[tp]
        return [LeaderAndIsr(b, tp, st) for b in sorted(set(brokers)) if b in self.live]

    # ------------------------------------------------------------------ events
    def _startup(self, ev: Startup) -> list[Effect]:
        self.live = dict(ev.live)
        self.reassigning = {tp: (list(a), list(r)) for tp, (a, r) in ev.reassignments.items()
                            if tp in ev.states and (a or r)}
        out: list[Effect] = []
        for tp in sorted(ev.states):
            st = ev.states[tp]
            self._index(tp, st)
            if st.zk_version < 0:
                self.move_partition(tp, PartitionPhase.NEW)
            else:
                self.move_partition(tp, PartitionPhase.NEW)
                self.move_partition(tp, PartitionPhase.ONLINE if st.leader >= 0
                                    else PartitionPhase.OFFLINE)
            for r in st.replicas:
                self.move_replica(tp, r, ReplicaPhase.NEW)
                self.move_replica(tp, r, ReplicaPhase.ONLINE if r in self.live
                                  else ReplicaPhase.OFFLINE)
        for tp in sorted(self.states):
            st = self.states[tp]
            zxid = ev.state_zxids.get(tp, -1)
            bounced = (frozenset(bounced_replicas(st, set(), self.live, zxid))
                       if zxid >= 0 and st.zk_version >= 0 else frozenset())
            decided = self._decide(tp, bounced)
            if bounced and not decided:  # the failure half changes nothing: the start
                decided = self._decide(tp)
            out += decided
            if tp not in self.in_flight and self.states[tp].zk_version >= 0:
                out += self._leader_and_isr(tp, self.states[tp].replicas)
        return out

    def _broker_change(self, live: Mapping[int, int]) -> list[Effect]:
        gone = {b for b, e in self.live.items() if live.get(b) != e}  # dead or bounced
        came = {b for b, e in live.items() if self.live.get(b) != e}  # new or bounced
        touched: set[TP] = set()
        for b in gone | came:
            touched |= self.hosted.get(b, set())
        # a bounced broker: first its failure (out of the ISRs, leadership moved) ...
        bounced = frozenset(gone & came)
        self.live = {b: e for b, e in live.items() if b not in came}
        self.shutting_down = (self.shutting_down & set(live)) - gone
        out: list[Effect] = []
        for tp in sorted(touched):
            for b in sorted(gone & set(self.states[tp].replicas)):
                self.move_replica(tp, b, ReplicaPhase.OFFLINE)
            out += self._decide(tp, bounced)
        # ... then its start: LeaderAndIsr for what it hosts, offline partitions retried
        self.live = dict(live)
        if not came:  # the live brokers are those the decisions above had: nothing new
            return out
        for tp in sorted(touched):
            for b in sorted(came & set(self.states[tp].replicas)):
                self.move_replica(tp, b, ReplicaPhase.ONLINE)
            if tp in self.in_flight:
                continue
            out += self._decide(tp)
            if tp not in self.in_flight and self.states[tp].zk_version >= 0:
                out += self._leader_and_isr(tp, came & set(self.states[tp].replicas))
        return out

    def _isr_change(self, tp: TP, st: PartitionState) -> list[Effect]:
        old = self.states.get(tp)
        if old is None:  # a partition of a topic not known (yet, or any more)
            self.refused.append(f"state of unknown partition {tp[0]}-{tp[1]} ignored")
            return []
        if st.zk_version <= old.zk_version:
            return []  # not newer than what the controller knows
        mine = st.copy()
        mine.replicas = list(old.replicas)  # its own (see above)
        self._index(tp, mine)
        if tp in self.in_flight:
            return []
        return self._decide(tp)

    def _topic_created(self, ev: TopicCreated) -> list[Effect]:
        out: list[Effect] = []
        for i, replicas in enumerate(ev.assignment):
            tp = (ev.topic, i)
            if tp in self.states:
                self.refused.append(f"topic {ev.topic} partition {i} exists")
                continue
            if not self.move_partition(tp, PartitionPhase.NEW):
                continue
            self._index(tp, PartitionState(list(replicas), -1, -1, [], -1, -1, -1))
            for r in replicas:
                self.move_replica(tp, r, ReplicaPhase.NEW)
            out += self._decide(tp)
        return out

    def _topic_changed(self, ev: TopicChanged) -> list[Effect]:
        if ev.unclean is None:
            self.unclean_topics.pop(ev.topic, None)
        else:
            self.unclean_topics[ev.topic] = ev.unclean
        out: list[Effect] = []
        for p in sorted(ev.states):
            tp, st = (ev.topic, p), ev.states[p]
            old = self.states.get(tp)
            if old is None:
                if not self.move_partition(tp, PartitionPhase.NEW):
                    continue
                self._index(tp, st)
                for r in st.replicas:
                    self.move_replica(tp, r, ReplicaPhase.NEW)
                if st.zk_version >= 0:
                    self.move_partition(tp, PartitionPhase.ONLINE if st.leader >= 0
                                        else PartitionPhase.OFFLINE)
                    for r in st.replicas:
                        self.move_replica(tp, r, ReplicaPhase.ONLINE if r in self.live
                                          else ReplicaPhase.OFFLINE)
            elif st.zk_version > old.zk_version:
                # a known partition's replicas are the controller's own (it writes every
                # assignment change: reassignments): a notification of an older assignment
                # must not undo one
                self._index(tp, replace(st, replicas=list(old.replicas)))
            if tp in self.in_flight:
                continue
            for r in self.states[tp].replicas:
                if (tp, r) not in self.replica_phase:
                    self.move_replica(tp, r, ReplicaPhase.NEW)
            out += self._decide(tp)
        return out

    def _topic_deleted(self, topic: str) -> list[Effect]:
        """Kafka's topic deletion, all at once: each partition Offline -> NonExistent,
        each replica through deletion to NonExistent, then out of every table."""
        for tp in sorted(t for t in self.states if t[0] == topic):
            st = self.states.pop(tp)
            self.move_partition(tp, PartitionPhase.OFFLINE)
            self.move_partition(tp, PartitionPhase.NON_EXISTENT)
            self.partition_phase.pop(tp, None)
            for r in st.replicas:
                self.move_replica(tp, r, ReplicaPhase.OFFLINE)
                self.move_replica(tp, r, ReplicaPhase.DELETION_STARTED)
                self.move_replica(tp, r, ReplicaPhase.DELETION_SUCCESSFUL)
                self.move_replica(tp, r, ReplicaPhase.NON_EXISTENT)
                self.replica_phase.pop((tp, r), None)
                self.hosted.get(r, set()).discard(tp)
            self.in_flight.discard(tp)  # its answer, if any, is ignored
            self.writing.pop(tp, None)
            self.reassigning.pop(tp, None)
            self.completing.discard(tp)
        self.unclean_topics.pop(topic, None)
        self.partitions_of.pop(topic, None)
        self.deleting.discard(topic)
        return []

    def _deletion_requested(self, topic: str) -> list[Effect]:
        if topic in self.deleting:
            return []  # under way
        parts = sorted(self.partitions_of.get(topic, ()))
        if not parts:
            return [DeleteTopic(topic, self.epoch, known=False)]
        self.deleting.add(topic)
        for p in parts:
            tp = (topic, p)
            for r in self.states[tp].replicas:
                if self.replica_phase.get((tp, r)) is not ReplicaPhase.OFFLINE:
                    self.move_replica(tp, r, ReplicaPhase.OFFLINE)
                self.move_replica(tp, r, ReplicaPhase.DELETION_STARTED)
            self.reassigning.pop(tp, None)  # a deleted topic's reassignments end with it
        return [DeleteTopic(topic, self.epoch)]

    def _assignment(self, topic: str, replicas: Mapping[int, list[int]], why: str
                    ) -> WriteAssignment:
        """The topic's whole assignment as the snapshot has it, ``replicas`` overriding
        (what the states about to be written will say), with its reassignments."""
        def now(p: int) -> list[int]:  # a state being written counts as written
            tp = (topic, p)
            return (replicas[p] if p in replicas else
                    self.writing[tp].replicas if tp in self.writing else
                    self.states[tp].replicas)

        assignment = {p: list(now(p)) for p in sorted(self.partitions_of.get(topic, ()))}
        adding = {tp[1]: list(a) for tp, (a, _) in self.reassigning.items()
                  if tp[0] == topic and a}
        removing = {tp[1]: list(r) for tp, (_, r) in self.reassigning.items()
                    if tp[0] == topic and r}
        return WriteAssignment(topic, assignment, adding, removing, self.epoch, why)

    def _reassign(self, items: Iterable[tuple[TP, tuple[int, ...] | None]]) -> list[Effect]:
        """AlterPartitionReassignments over the snapshot: per topic the new assignment
        first, then the partitions' states."""
        live = set(self.live)
        by_topic: dict[str, dict[int, list[int]]] = {}
        states: list[Effect] = []
        for tp, target in items:
            st = self.states.get(tp)
            if st is None or st.zk_version < 0 or tp[0] in self.deleting:
                self.reassign_outcomes[tp] = ("unknown_topic_or_partition", None)
                continue
            if target is not None and (not target or len(set(target)) != len(target)
                                       or not set(target) <= live):
                self.reassign_outcomes[tp] = (
                    "invalid_replica_assignment",
                    f"Invalid replica assignment {list(target)}: brokers must be distinct "
                    "and registered")
                continue
            if tp in self.in_flight:
                self.reassign_outcomes[tp] = (
                    "reassignment_in_progress",
                    "a state change of the partition is being written; try again")
                continue
            ongoing = self.reassigning.get(tp)
            if target is None:
                if ongoing is None:
                    self.reassign_outcomes[tp] = ("no_reassignment_in_progress", None)
                    continue
                new = cancel_reassignment(st, ongoing[1], ongoing[0], live)
                del self.reassigning[tp]
                why = "reassignment cancelled"
            else:
                base = st if ongoing is None else cancel_reassignment(
                    st, ongoing[1], ongoing[0], live)
                self.reassigning.pop(tp, None)
                if list(target) == list(base.replicas):
                    new, why = base, "reassignment cancelled"  # back where it started
                else:
                    r = start_reassignment(base, list(target))
                    new, why = r.state, "reassignment started"
                    if r.adding or r.removing:
                        self.reassigning[tp] = (list(r.adding), list(r.removing))
            self.reassign_outcomes[tp] = ("none", None)
            by_topic.setdefault(tp[0], {})[tp[1]] = list(new.replicas)
            if new != st:
                self.completing.discard(tp)
                if list(new.replicas) != list(st.replicas):
                    # the snapshot's replicas are the assignment's, written first (and
                    # retried until written): so a refused state write decides again over
                    # the replicas the reassignment needs
                    self._index(tp, replace(st, replicas=list(new.replicas)))
                states += self._write(tp, new, why)
        out: list[Effect] = [self._assignment(t, reps, "reassignment requested")
                             for t, reps in sorted(by_topic.items())]
        return out + states

    def _controlled_shutdown(self, broker: int) -> list[Effect]:
        if broker not in self.live:
            self.refused.append(f"controlled shutdown of broker {broker}: not live")
            return []
        self.shutting_down.add(broker)
        out: list[Effect] = []
        for tp in sorted(self.hosted.get(broker, set())):
            st = self.states[tp]
            if tp in self.in_flight or st.zk_version < 0:
                continue
            if st.leader == broker:
                out += self._decide(tp)
            elif broker in st.isr and len(st.isr) > 1:
                out += self._write(tp, replace(st, isr=[r for r in st.isr if r != broker]),
                                   f"controlled shutdown of broker {broker}")
        return out

    def _elect(self, tps: Iterable[TP], preferred: bool) -> list[Effect]:
        out: list[Effect] = []
        usable = set(self.live) - self.shutting_down
        for tp in tps:
            st = self.states.get(tp)
            if st is None or st.zk_version < 0:
                self.outcomes[tp] = "unknown"
                continue
            if preferred:
                if st.replicas and st.leader == st.replicas[0]:
                    self.outcomes[tp] = "not needed"
                    continue
                new = preferred_election(st, usable)
                why = "preferred leader election"
            else:
                if st.leader in self.live:
                    self.outcomes[tp] = "not needed"
                    continue
                choice = offline_election(st, usable, True)
                new = None if choice is None else elected(st, choice[0], choice[1])
                why = "unclean election on request" + (
                    f" (UNCLEAN election: broker {choice[0]} was not in the ISR)"
                    if choice is not None and choice[2] else "")
            if new is None or tp in self.in_flight:
                self.outcomes[tp] = "not available"
                continue
            self.outcomes[tp] = "elected"
            out += self._write(tp, new, why)
        return out

    def _rebalance(self, percentage: int) -> list[Effect]:
        """Kafka's auto leader rebalance over the snapshot: per live broker, the share of
        the partitions whose first replica it is but which it does not lead; above
        ``percentage``, each of them whose preferred replica can lead now is elected
        back."""
        by_broker: dict[int, list[TP]] = {}
        for tp in sorted(self.states):
            st = self.states[tp]
            if st.replicas and st.zk_version >= 0:
                by_broker.setdefault(st.replicas[0], []).append(tp)
        usable = set(self.live) - self.shutting_down
        out: list[Effect] = []
        for broker in sorted(by_broker):
            parts = by_broker[broker]
            if broker not in usable:
                continue
            off = [tp for tp in parts if self.states[tp].leader != broker]
            if len(off) * 100 / len(parts) <= percentage:
                continue
            for tp in off:
                new = preferred_election(self.states[tp], usable)
                if new is not None and tp not in self.in_flight:
                    out += self._write(tp, new, "auto leader rebalance")
        return out

    def _written(self, tp: TP, st: PartitionState) -> list[Effect]:
        self.in_flight.discard(tp)
        self.writing.pop(tp, None)
        if tp not in self.states:  # deleted meanwhile
            return []
        left = set(self.states[tp].replicas) - set(st.replicas)
        self._index(tp, st)
        for r in sorted(left):  # replicas a reassignment removed: deleted
            if self.replica_phase.get((tp, r)) is not ReplicaPhase.OFFLINE:
                self.move_replica(tp, r, ReplicaPhase.OFFLINE)
            for step in (ReplicaPhase.DELETION_STARTED, ReplicaPhase.DELETION_SUCCESSFUL,
                         ReplicaPhase.NON_EXISTENT):
                self.move_replica(tp, r, step)
            self.replica_phase.pop((tp, r), None)
        done: list[Effect] = []
        if tp in self.completing:  # the state is the target's: the assignment follows
            self.completing.discard(tp)
            self.reassigning.pop(tp, None)
            done.append(self._assignment(tp[0], {}, "reassignment completed"))
        target = PartitionPhase.ONLINE if st.leader >= 0 else PartitionPhase.OFFLINE
        self.move_partition(tp, target)
        for r in st.replicas:
            now = self.replica_phase.get((tp, r))
            if now is None:  # a replica a reassignment added
                self.move_replica(tp, r, ReplicaPhase.NEW)
            want = ReplicaPhase.ONLINE if r in self.live else ReplicaPhase.OFFLINE
            if now is not want:
                self.move_replica(tp, r, want)
        return done + self._leader_and_isr(tp, st.replicas) + self._decide(tp)

    def _refused(self, tp: TP, current: PartitionState | None) -> list[Effect]:
        self.in_flight.discard(tp)
        self.writing.pop(tp, None)
        self.completing.discard(tp)  # decided again below
        if self.outcomes.get(tp) == "elected":
            self.outcomes[tp] = "not available"  # someone else wrote first
        if tp not in self.states:  # deleted meanwhile
            return []
        if current is not None:  # the replicas stay its own (rule 7)
            self._index(tp, replace(current, replicas=list(self.states[tp].replicas)))
        return self._decide(tp)
