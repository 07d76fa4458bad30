"""PURE: one classic consumer group (JoinGroup/SyncGroup/Heartbeat/LeaveGroup), R-GRP-3/4.

Everything that affects the group's state lives here; the coordinator and the asyncio shell
only feed it requests and time (``now_ms``). It never blocks: a JoinGroup or SyncGroup that
Kafka would park returns ``Parked(ticket)``, and the answer comes later as a ``JoinResult``
or ``SyncResult`` carrying that ticket in ``take_completions()``.

Rules (Kafka's ``GroupCoordinator``/``ClassicGroup``; the transition graph is ``TRANSITIONS``):

- States: Empty → PreparingRebalance → CompletingRebalance → Stable, and Dead. A transition
  not in ``TRANSITIONS`` raises ``IllegalTransitionError`` and changes nothing.
- JoinGroup, unknown member (empty member id):
  - protocol type and protocols must fit (``supports_protocols``) else
    INCONSISTENT_GROUP_PROTOCOL;
  - static member (``group_instance_id``) already known: the new member id replaces the old
    one (whose parked requests get FENCED_INSTANCE_ID). In Stable, when the protocol the group
    would select is unchanged, there is no rebalance: the member gets the current generation
    and keeps its assignment (KIP-345; with v9+ a rejoining leader gets the member list and
    ``skip_assignment``, KIP-814). Otherwise a rebalance starts;
  - v4+ dynamic member: MEMBER_ID_REQUIRED with a new id ``{client_id}-{uuid4}`` (KIP-394);
    the id is pending until it joins again or its session timeout passes;
  - otherwise the member is added and a rebalance starts.
- JoinGroup, known member id: a pending id is added (rebalance); a static member whose
  instance id maps to another member id → FENCED_INSTANCE_ID; unknown id → UNKNOWN_MEMBER_ID.
  PreparingRebalance: parked. CompletingRebalance: same protocols → the current join answer
  at once, else rebalance. Stable: the leader, or changed protocols → rebalance; a follower
  with the same protocols gets the current answer at once.
- A rebalance (``_prepare_rebalance``) starting from Empty waits
  ``group.initial.rebalance.delay.ms``, extended by the same delay (up to the rebalance
  timeout) while new members keep arriving; otherwise it completes as soon as every member
  and no pending id is waiting in JoinGroup, or when the rebalance timeout (the largest of
  the members') expires. Members that did not rejoin are removed. Then generation + 1, the
  protocol is selected by vote among those all members support, the leader (kept if still a
  member, else the first member) gets all members' metadata, state CompletingRebalance; with
  no members left the group becomes Empty.
- SyncGroup: checks (in order) FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
  INCONSISTENT_GROUP_PROTOCOL (v5 protocol type/name); PreparingRebalance →
  REBALANCE_IN_PROGRESS; CompletingRebalance → parked until the leader syncs, whose
  assignment (missing members get empty bytes) completes every parked sync and makes the
  group Stable; Stable → the member's assignment.
- Heartbeat: FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION as for SyncGroup;
  Empty → UNKNOWN_MEMBER_ID; PreparingRebalance → REBALANCE_IN_PROGRESS; else NONE.
  Heartbeats, joins, syncs and valid commits restart the member's session timeout; a member
  parked in JoinGroup or SyncGroup does not expire. An expired or leaving member is removed
  (its parked requests get UNKNOWN_MEMBER_ID): Stable/CompletingRebalance → rebalance;
  PreparingRebalance → the join may now be complete.
- Offset commits (``validate_offset_commit``, Kafka's ``ClassicGroup.validateOffsetCommit``):
  Dead → COORDINATOR_NOT_AVAILABLE; generation < 0 on an Empty group → accepted (assign()
  mode, R-GRP-7); a member id, instance id or generation given → the member must be known
  (FENCED_INSTANCE_ID / UNKNOWN_MEMBER_ID) and the generation current (ILLEGAL_GENERATION);
  no member and a non-empty group → UNKNOWN_MEMBER_ID; CompletingRebalance →
  REBALANCE_IN_PROGRESS.
- ``metadata_dirty`` is set when Kafka would write the group's metadata record: a leader's
  sync (Stable), a rebalance ending Empty, a static member replaced without rebalance.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from headrace.group.base import GROUP_TYPE_CLASSIC


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


S = GroupState
# state → the states it may move to (Kafka's ``validPreviousStates``, turned around)
TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    S.EMPTY: frozenset({S.PREPARING_REBALANCE, S.DEAD}),
    S.PREPARING_REBALANCE: frozenset({S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD}),
    S.COMPLETING_REBALANCE: frozenset({S.STABLE, S.PREPARING_REBALANCE, S.DEAD}),
    S.STABLE: frozenset({S.PREPARING_REBALANCE, S.DEAD}),
    S.DEAD: frozenset({S.DEAD}),
}
# states from which a member change starts a rebalance (Kafka's ``canRebalance``)
CAN_REBALANCE = frozenset({S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY})


class IllegalTransitionError(Exception):
    """Our bug: the coordinator asked for a transition the state graph does not have."""


Protocols = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class GroupTimeouts:
    """Broker configs that bound classic groups."""

    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    max_size: int = 2**31 - 1


@dataclass(frozen=True, slots=True)
class JoinRequest:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    require_known_member_id: bool = True  # JoinGroup v4+
    supports_skip_assignment: bool = False  # JoinGroup v9+


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    ticket: int  # 0 for an immediate answer
    error: ErrorCode
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[JoinedMember, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    ticket: int
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class Parked:
    """The answer will come later as a completion with this ticket."""

    ticket: int


Completion = JoinResult | SyncResult


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    session_deadline_ms: int
    assignment: bytes = b""
    join_ticket: int | None = None
    sync_ticket: int | None = None

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise IllegalTransitionError(f"member {self.member_id} supports none of {candidates}")


def _new_member_id(client_id: str) -> str:
    return f"{client_id}-{uuid.uuid4()}"


@dataclass
class ClassicGroup:
    group_id: str
    timeouts: GroupTimeouts = field(default_factory=GroupTimeouts)
    member_id_factory: Callable[[str], str] = _new_member_id
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type_: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    state_timestamp_ms: int = -1
    members: dict[str, Member] = field(default_factory=dict)
    pending_members: dict[str, int] = field(default_factory=dict)  # member id → deadline
    static_members: dict[str, str] = field(default_factory=dict)  # instance id → member id
    metadata_dirty: bool = False
    _completions: list[Completion] = field(default_factory=list)
    _next_ticket: int = 1
    _join_deadline_ms: int = 0
    _initial_delay_remaining_ms: int = 0
    _in_initial_delay: bool = False
    _new_member_added: bool = False

    # ------------------------------------------------------------------ Group protocol
    @property
    def group_type(self) -> str:
        return GROUP_TYPE_CLASSIC

    @property
    def protocol_type(self) -> str:
        return self.protocol_type_ or ""

    @property
    def state_name(self) -> str:
        return self.state.value

    def is_empty(self) -> bool:
        return not self.members

    def validate_offset_commit(
        self, member_id: str, generation_or_epoch: int, group_instance_id: str | None,
        now_ms: int,
    ) -> ErrorCode:
        if self.state is S.DEAD:
            return ErrorCode.coordinator_not_available
        if generation_or_epoch < 0 and self.state is S.EMPTY:
            return ErrorCode.none
        if generation_or_epoch >= 0 or member_id or group_instance_id is not None:
            err = self._validate_member(member_id, group_instance_id)
            if err is not ErrorCode.none:
                return err
            if generation_or_epoch != self.generation:
                return ErrorCode.illegal_generation
        elif self.state is not S.EMPTY:
            return ErrorCode.unknown_member_id
        if self.state is S.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        member = self.members.get(member_id)
        if member is not None:
            self._refresh(member, now_ms)
        return ErrorCode.none

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> ErrorCode:
        if self.state is S.DEAD:
            return ErrorCode.group_id_not_found
        return ErrorCode.none

    def tick(self, now_ms: int) -> bool:
        changed = False
        for member_id, deadline in list(self.pending_members.items()):
            if now_ms >= deadline:
                del self.pending_members[member_id]
                changed = True
        for member in list(self.members.values()):
            if (member.join_ticket is None and member.sync_ticket is None
                    and now_ms >= member.session_deadline_ms):
                self._remove_member(member, now_ms)
                changed = True
        before = (self.state, self.generation)
        self._try_complete_join(now_ms)
        return changed or before != (self.state, self.generation)

    # ------------------------------------------------------------------ effects
    def take_completions(self) -> list[Completion]:
        out, self._completions = self._completions, []
        return out

    def has_completions(self) -> bool:
        return bool(self._completions)

    # ------------------------------------------------------------------ state graph
    def transition(self, to: GroupState, now_ms: int) -> None:
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransitionError(
                f"group {self.group_id!r}: {self.state.value} → {to.value} is not allowed"
            )
        self.state = to
        self.state_timestamp_ms = now_ms

    def mark_dead(self, now_ms: int) -> None:
        """DeleteGroups or unload: every parked request gets COORDINATOR_NOT_AVAILABLE."""
        for member in self.members.values():
            self._complete_join(member, JoinResult(0, ErrorCode.coordinator_not_available,
                                                   member.member_id))
            self._complete_sync(member, SyncResult(0, ErrorCode.coordinator_not_available))
        self.transition(S.DEAD, now_ms)

    # ------------------------------------------------------------------ queries
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def candidate_protocols(self) -> set[str]:
        counts: dict[str, int] = {}
        for m in self.members.values():
            for name, _ in m.protocols:
                counts[name] = counts.get(name, 0) + 1
        return {name for name, n in counts.items() if n == len(self.members)}

    def supports_protocols(self, protocol_type: str, protocols: Protocols) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        names = {name for name, _ in protocols}
        return protocol_type == self.protocol_type_ and bool(names & self.candidate_protocols())

    def select_protocol(self) -> str:
        """Kafka's vote: each member votes for its most preferred protocol that every member
        supports; most votes wins (ties: the one the leader prefers, then the name)."""
        candidates = self.candidate_protocols()
        if not candidates:
            raise IllegalTransitionError(f"group {self.group_id!r} has no common protocol")
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = m.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        leader = self.members.get(self.leader or "")
        preference = {name: i for i, (name, _) in enumerate(leader.protocols)} if leader else {}
        return min(votes, key=lambda p: (-votes[p], preference.get(p, len(preference)), p))

    def is_static_member_fenced(self, member_id: str, group_instance_id: str | None) -> bool:
        if group_instance_id is None:
            return False
        current = self.static_members.get(group_instance_id)
        return current is not None and current != member_id

    def all_joined(self) -> bool:
        return not self.pending_members and all(
            m.join_ticket is not None for m in self.members.values()
        )

    # ------------------------------------------------------------------ JoinGroup
    def join(self, req: JoinRequest, now_ms: int) -> JoinResult | Parked:
        if self.state is S.DEAD:
            return JoinResult(0, ErrorCode.coordinator_not_available, req.member_id)
        if not req.member_id:
            result = self._join_new_member(req, now_ms)
        else:
            result = self._join_known_member(req, now_ms)
        self._try_complete_join(now_ms)
        return result

    def _join_new_member(self, req: JoinRequest, now_ms: int) -> JoinResult | Parked:
        if not self.supports_protocols(req.protocol_type, req.protocols):
            return JoinResult(0, ErrorCode.inconsistent_group_protocol, req.member_id)
        instance = req.group_instance_id
        if instance is not None and instance in self.static_members:
            new_id = self.member_id_factory(req.client_id)
            return self._replace_static_member(req, self.static_members[instance], new_id,
                                               now_ms)
        if len(self.members) + len(self.pending_members) >= self.timeouts.max_size:
            return JoinResult(0, ErrorCode.group_max_size_reached, req.member_id)
        new_id = self.member_id_factory(req.client_id)
        if instance is None and req.require_known_member_id:
            self.pending_members[new_id] = now_ms + req.session_timeout_ms
            return JoinResult(0, ErrorCode.member_id_required, new_id)
        return self._add_member_and_rebalance(req, new_id, now_ms)

    def _join_known_member(self, req: JoinRequest, now_ms: int) -> JoinResult | Parked:
        if not self.supports_protocols(req.protocol_type, req.protocols):
            return JoinResult(0, ErrorCode.inconsistent_group_protocol, req.member_id)
        if req.member_id in self.pending_members:
            del self.pending_members[req.member_id]
            return self._add_member_and_rebalance(req, req.member_id, now_ms)
        if self.is_static_member_fenced(req.member_id, req.group_instance_id):
            return JoinResult(0, ErrorCode.fenced_instance_id, req.member_id)
        member = self.members.get(req.member_id)
        if member is None:
            return JoinResult(0, ErrorCode.unknown_member_id, req.member_id)
        same = member.protocols == req.protocols
        if self.state is S.PREPARING_REBALANCE:
            return self._update_member_and_rebalance(member, req, now_ms)
        if self.state is S.COMPLETING_REBALANCE:
            if same:
                self._refresh(member, now_ms)
                return self._current_join_result(member, 0)
            return self._update_member_and_rebalance(member, req, now_ms)
        if self.state is S.STABLE:
            if member.member_id == self.leader or not same:
                return self._update_member_and_rebalance(member, req, now_ms)
            self._refresh(member, now_ms)
            return self._current_join_result(member, 0)
        return JoinResult(0, ErrorCode.unknown_member_id, req.member_id)

    def _ticket(self) -> int:
        t = self._next_ticket
        self._next_ticket += 1
        return t

    def _add_member_and_rebalance(
        self, req: JoinRequest, member_id: str, now_ms: int
    ) -> Parked:
        if not self.members:
            self.protocol_type_ = req.protocol_type
        member = Member(
            member_id, req.group_instance_id, req.client_id, req.client_host,
            req.session_timeout_ms, req.rebalance_timeout_ms, req.protocol_type, req.protocols,
            now_ms + req.session_timeout_ms,
        )
        self.members[member_id] = member
        if self.leader is None:
            self.leader = member_id
        if req.group_instance_id is not None:
            self.static_members[req.group_instance_id] = member_id
        member.join_ticket = self._ticket()
        if self.state is S.PREPARING_REBALANCE and self._in_initial_delay:
            self._new_member_added = True
        self._maybe_prepare_rebalance(now_ms)
        return Parked(member.join_ticket)

    def _update_member_and_rebalance(
        self, member: Member, req: JoinRequest, now_ms: int
    ) -> Parked:
        self._update_member(member, req)
        if member.join_ticket is not None:
            self._completions.append(JoinResult(member.join_ticket,
                                                ErrorCode.rebalance_in_progress,
                                                member.member_id))
        member.join_ticket = self._ticket()
        self._refresh(member, now_ms)
        self._maybe_prepare_rebalance(now_ms)
        return Parked(member.join_ticket)

    @staticmethod
    def _update_member(member: Member, req: JoinRequest) -> None:
        member.protocols = req.protocols
        member.protocol_type = req.protocol_type
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id = req.client_id
        member.client_host = req.client_host

    def _replace_static_member(
        self, req: JoinRequest, old_id: str, new_id: str, now_ms: int
    ) -> JoinResult | Parked:
        old = self.members.pop(old_id)
        self._complete_join(old, JoinResult(0, ErrorCode.fenced_instance_id, old_id))
        self._complete_sync(old, SyncResult(0, ErrorCode.fenced_instance_id))
        current_leader = self.leader or ""
        old.member_id = new_id
        self.members[new_id] = old
        assert req.group_instance_id is not None
        self.static_members[req.group_instance_id] = new_id
        if self.leader == old_id:
            self.leader = new_id
        self._update_member(old, req)
        self._refresh(old, now_ms)
        if self.state is S.STABLE:
            if self.protocol_name == self.select_protocol():
                self.metadata_dirty = True
                if req.supports_skip_assignment and self.leader == new_id:
                    return self._current_join_result(old, 0, skip_assignment=True)
                return JoinResult(0, ErrorCode.none, new_id, self.generation,
                                  self.protocol_type_, self.protocol_name, current_leader)
            old.join_ticket = self._ticket()
            self._prepare_rebalance(now_ms)
            return Parked(old.join_ticket)
        if self.state is S.COMPLETING_REBALANCE:
            old.join_ticket = self._ticket()
            self._prepare_rebalance(now_ms)
            return Parked(old.join_ticket)
        if self.state is S.PREPARING_REBALANCE:
            old.join_ticket = self._ticket()
            return Parked(old.join_ticket)
        raise IllegalTransitionError(
            f"group {self.group_id!r}: static member replaced in state {self.state.value}"
        )

    def _current_join_result(
        self, member: Member, ticket: int, skip_assignment: bool = False
    ) -> JoinResult:
        is_leader = member.member_id == self.leader
        members: tuple[JoinedMember, ...] = ()
        if is_leader:
            members = tuple(
                JoinedMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                for m in self.members.values()
            )
        return JoinResult(ticket, ErrorCode.none, member.member_id, self.generation,
                          self.protocol_type_, self.protocol_name, self.leader or "", members,
                          skip_assignment)

    # ------------------------------------------------------------------ rebalance
    def _maybe_prepare_rebalance(self, now_ms: int) -> None:
        if self.state in CAN_REBALANCE:
            self._prepare_rebalance(now_ms)

    def _prepare_rebalance(self, now_ms: int) -> None:
        if self.state is S.COMPLETING_REBALANCE:
            for member in self.members.values():
                member.assignment = b""
                self._complete_sync(member, SyncResult(0, ErrorCode.rebalance_in_progress))
        delay = self.timeouts.initial_rebalance_delay_ms
        if self.state is S.EMPTY:
            self._in_initial_delay = True
            self._new_member_added = False
            self._join_deadline_ms = now_ms + delay
            self._initial_delay_remaining_ms = max(self.rebalance_timeout_ms() - delay, 0)
        else:
            self._in_initial_delay = False
            self._join_deadline_ms = now_ms + self.rebalance_timeout_ms()
        self.transition(S.PREPARING_REBALANCE, now_ms)

    def _try_complete_join(self, now_ms: int) -> None:
        if self.state is not S.PREPARING_REBALANCE:
            return
        if self._in_initial_delay:
            if now_ms < self._join_deadline_ms:
                return
            if self._new_member_added and self._initial_delay_remaining_ms > 0:
                delay = min(self.timeouts.initial_rebalance_delay_ms,
                            self._initial_delay_remaining_ms)
                self._new_member_added = False
                self._initial_delay_remaining_ms = max(
                    self._initial_delay_remaining_ms - self.timeouts.initial_rebalance_delay_ms,
                    0)
                self._join_deadline_ms = now_ms + delay
                if delay > 0:
                    return
        elif not self.all_joined() and now_ms < self._join_deadline_ms:
            return
        self._complete_rebalance_join(now_ms)

    def _complete_rebalance_join(self, now_ms: int) -> None:
        for member in [m for m in self.members.values() if m.join_ticket is None]:
            self._drop_member(member)
        if self.leader not in self.members:
            self.leader = next(iter(self.members), None)
        self.generation += 1
        self._in_initial_delay = False
        if not self.members:
            self.protocol_name = None
            self.transition(S.EMPTY, now_ms)
            self.metadata_dirty = True
            return
        self.protocol_name = self.select_protocol()
        self.transition(S.COMPLETING_REBALANCE, now_ms)
        for member in self.members.values():
            ticket = member.join_ticket
            assert ticket is not None
            member.join_ticket = None
            self._refresh(member, now_ms)
            self._completions.append(self._current_join_result(member, ticket))

    # ------------------------------------------------------------------ SyncGroup
    def sync(
        self, member_id: str, generation: int, group_instance_id: str | None,
        protocol_type: str | None, protocol_name: str | None,
        assignments: dict[str, bytes], now_ms: int,
    ) -> SyncResult | Parked:
        if self.state is S.DEAD:
            return SyncResult(0, ErrorCode.coordinator_not_available)
        err = self._validate_member(member_id, group_instance_id)
        if err is not ErrorCode.none:
            return SyncResult(0, err)
        if generation != self.generation:
            return SyncResult(0, ErrorCode.illegal_generation)
        if (protocol_type is not None and protocol_type != self.protocol_type_) or (
                protocol_name is not None and protocol_name != self.protocol_name):
            return SyncResult(0, ErrorCode.inconsistent_group_protocol)
        member = self.members[member_id]
        if self.state is S.PREPARING_REBALANCE:
            return SyncResult(0, ErrorCode.rebalance_in_progress)
        if self.state is S.STABLE:
            self._refresh(member, now_ms)
            return SyncResult(0, ErrorCode.none, self.protocol_type_, self.protocol_name,
                              member.assignment)
        if self.state is not S.COMPLETING_REBALANCE:
            return SyncResult(0, ErrorCode.unknown_member_id)
        self._refresh(member, now_ms)
        if member.sync_ticket is not None:
            self._completions.append(SyncResult(member.sync_ticket,
                                                ErrorCode.rebalance_in_progress))
        member.sync_ticket = self._ticket()
        ticket = member.sync_ticket
        if member_id == self.leader:
            for m in self.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            self.transition(S.STABLE, now_ms)
            self.metadata_dirty = True
            for m in self.members.values():
                self._complete_sync(m, SyncResult(0, ErrorCode.none, self.protocol_type_,
                                                  self.protocol_name, m.assignment))
                self._refresh(m, now_ms)
        return Parked(ticket)

    # ------------------------------------------------------------------ Heartbeat
    def heartbeat(
        self, member_id: str, generation: int, group_instance_id: str | None, now_ms: int
    ) -> ErrorCode:
        if self.state is S.DEAD:
            return ErrorCode.coordinator_not_available
        err = self._validate_member(member_id, group_instance_id)
        if err is not ErrorCode.none:
            return err
        if generation != self.generation:
            return ErrorCode.illegal_generation
        if self.state is S.EMPTY:
            return ErrorCode.unknown_member_id
        self._refresh(self.members[member_id], now_ms)
        if self.state is S.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    # ------------------------------------------------------------------ LeaveGroup
    def leave(self, member_id: str, group_instance_id: str | None, now_ms: int) -> ErrorCode:
        """One member of a (batched) LeaveGroup; the caller answers COORDINATOR_NOT_AVAILABLE
        for a Dead group."""
        if self.state is S.DEAD:
            return ErrorCode.coordinator_not_available
        if not member_id:
            if group_instance_id is None or group_instance_id not in self.static_members:
                return ErrorCode.unknown_member_id
            member_id = self.static_members[group_instance_id]
        elif self.is_static_member_fenced(member_id, group_instance_id):
            return ErrorCode.fenced_instance_id
        elif member_id in self.pending_members:
            del self.pending_members[member_id]
            self._try_complete_join(now_ms)
            return ErrorCode.none
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        self._remove_member(member, now_ms)
        return ErrorCode.none

    # ------------------------------------------------------------------ helpers
    def _validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode:
        if self.is_static_member_fenced(member_id, group_instance_id):
            return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return ErrorCode.none

    @staticmethod
    def _refresh(member: Member, now_ms: int) -> None:
        member.session_deadline_ms = now_ms + member.session_timeout_ms

    def _complete_join(self, member: Member, result: JoinResult) -> None:
        if member.join_ticket is not None:
            self._completions.append(JoinResult(
                member.join_ticket, result.error, result.member_id, result.generation,
                result.protocol_type, result.protocol_name, result.leader, result.members,
                result.skip_assignment))
            member.join_ticket = None

    def _complete_sync(self, member: Member, result: SyncResult) -> None:
        if member.sync_ticket is not None:
            self._completions.append(SyncResult(
                member.sync_ticket, result.error, result.protocol_type, result.protocol_name,
                result.assignment))
            member.sync_ticket = None

    def _drop_member(self, member: Member) -> None:
        self._complete_join(member, JoinResult(0, ErrorCode.unknown_member_id,
                                               member.member_id))
        self._complete_sync(member, SyncResult(0, ErrorCode.unknown_member_id))
        del self.members[member.member_id]
        if member.group_instance_id is not None and \
                self.static_members.get(member.group_instance_id) == member.member_id:
            del self.static_members[member.group_instance_id]
        if self.leader == member.member_id:
            self.leader = next(iter(self.members), None)

    def _remove_member(self, member: Member, now_ms: int) -> None:
        self._drop_member(member)
        if self.state in (S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(now_ms)
        self._try_complete_join(now_ms)
