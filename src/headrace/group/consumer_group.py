"""PURE: a KIP-848 consumer group (``group.protocol=consumer``, ConsumerGroupHeartbeat).

Everything that affects the group's state lives here; the handler only decodes requests,
passes the current topic metadata and ``now_ms``, and encodes the result. No I/O, no clock.

## Epochs and assignments (Kafka's ``GroupMetadataManager`` / ``CurrentAssignmentBuilder``)

- The **group epoch** bumps on every membership change (join, leave, fenced, expired) and on
  every change of what the members subscribe to (topic names, regex, rack, assignor) or of
  the subscribed topics' metadata (a topic created, deleted, or given more partitions).
- When the group epoch is ahead of the **assignment epoch**, the chosen server assignor
  computes a new **target assignment** for all members (sticky input: the previous target)
  and the assignment epoch becomes the group epoch. This happens within the same event, so
  ``Assigning`` is never observed between events.
- Each member reconciles towards its target on its own heartbeat (member states below). A
  partition is *owned* by a member while it is in the member's assigned set or pending its
  revocation; a partition never has two owners.

## Member states (per member, on each heartbeat)

| member state            | on heartbeat                                                    |
|-------------------------|-----------------------------------------------------------------|
| STABLE                  | epoch == target epoch: unchanged; else compute next assignment  |
| UNREVOKED_PARTITIONS    | owned list given and none of the revoked partitions in it:      |
|                         | compute next assignment; otherwise wait (rebalance timeout runs) |
| UNRELEASED_PARTITIONS   | compute next assignment (picks up partitions released by now)   |

*Compute next assignment*: pending revocation := current - target. If the member still
owns some of it (its owned list names one, or it sent no owned list) → UNREVOKED_PARTITIONS
at the member's current epoch with assigned := current ∩ target and nothing new, not even
free partitions: a member revoking only ever shrinks, and gets what is new for it once it
acknowledges (Kafka's rule; handing both at once lets a client that unsubscribes
mid-revocation end up holding the new partitions, and a partition two clients hold). The
rebalance timeout starts (afresh on every new revocation, e.g. one asked for when the
member acknowledges the previous one after the target moved again): a member that does not
release in ``rebalance_timeout_ms`` is fenced. Otherwise assigned := current ∩ target plus
each partition of target - current that no other member owns (the others are
*unreleased*) → UNRELEASED_PARTITIONS if some are unreleased, else STABLE, at the target
epoch.

## Heartbeat rules (Kafka's error codes)

- ``member_epoch`` 0 joins (v0: an empty member id → the coordinator generates one; v1,
  KIP-1082: the client's id is required); a first heartbeat needs ``rebalance_timeout_ms``,
  an empty (not null) owned list and topic names or a regex, else INVALID_REQUEST.
- ``-1`` leaves (the member's partitions are freed at once), ``-2`` is a static member's
  temporary leave (kept with its assignment until its session expires or its instance id
  rejoins with epoch 0, which takes over the assignment without a rebalance).
- A static instance id held by an active member → UNRELEASED_INSTANCE_ID on join,
  FENCED_INSTANCE_ID on a heartbeat or leave naming another member id.
- Any other epoch: unknown member → UNKNOWN_MEMBER_ID; an epoch above the member's, or below
  it unless it is the previous epoch and the owned list is within the assignment (a lost
  response) → FENCED_MEMBER_EPOCH; an epoch < -2 → INVALID_REQUEST.
- An unknown ``server_assignor`` → UNSUPPORTED_ASSIGNOR; a bad regex →
  INVALID_REGULAR_EXPRESSION. A failed heartbeat changes nothing.
- The response carries the assignment only when it changed, on (re)join, or on a full
  request (rebalance timeout, topic names and owned list all given).

## Timers (``tick(now_ms)``)

Every accepted heartbeat pushes the member's session deadline to ``now +
session_timeout_ms``; a member whose deadline passes is removed. A member in
UNREVOKED_PARTITIONS past its revocation deadline is fenced (removed).

## Group states and events (transitions as data: ``TRANSITIONS``)

The state is derived: Empty (no members) / Assigning (group epoch > assignment epoch) /
Reconciling (some member not STABLE at the assignment epoch) / Stable; Dead after
``mark_dead`` (DeleteGroups of an empty group). Every event on a Dead group, and ``mark_dead``
on a group with members, raises ``IllegalGroupEvent`` and changes nothing.

## Persistence (R-GRP-6, R-GRP-7: a subscribe() group survives a coordinator restart)

The group's state lives in ``__consumer_offsets`` as Kafka 4.0 writes it
(``headrace.group.records``, key versions 3..8): the group epoch (ConsumerGroupMetadata),
the subscribed topics' metadata (ConsumerGroupPartitionMetadata), per member its
subscription and client (ConsumerGroupMemberMetadata), the target assignment
(ConsumerGroupTargetAssignmentMember per member, ConsumerGroupTargetAssignmentMetadata for
its epoch) and the member's epochs, state and current assignment
(ConsumerGroupCurrentMemberAssignment). A removed member gets tombstones for its three
records; a deleted group (``tombstone_records``) for all of them.

No I/O here: every event marks what it touched, and ``take_records()`` returns the records
of what changed since the last call (compared with what was handed out before), so a
heartbeat that changes nothing writes nothing. The shell appends one call's records as one
batch. If that append fails, ``forget_written()`` makes the next call rewrite the whole
group. ``restore(snapshot, now_ms)`` rebuilds a group from its replayed records
(``ConsumerGroupSnapshot``): members, epochs, target and current assignments come back as
they were; sessions (and the rebalance timeout of a member revoking partitions, unless it
left temporarily) restart at ``now_ms``. A member that heartbeats with its old id and epoch
carries on without a rebalance. Deadlines and the assignor name (derived from the members)
are not persisted, as in Kafka; neither is 4.1's MetadataHash (we write 4.0's
ConsumerGroupPartitionMetadata instead) nor rack information.

## Offsets (Kafka's ``ConsumerGroup.validateOffsetCommit`` / ``validateOffsetFetch``)

A commit with a negative epoch is accepted only while the group has no members (admin
tools, assign()-mode consumers); otherwise the member must exist (UNKNOWN_MEMBER_ID) and
the epoch must equal its member epoch (STALE_MEMBER_EPOCH). A fetch without a member id
and a negative epoch is always allowed; with one, the same checks apply.
"""

from __future__ import annotations

import base64
import enum
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from headrace.group.assignors import (
    ASSIGNORS,
    Assignor,
    MemberSubscription,
    TopicInfo,
    assignors_from_config,
)
from headrace.group.base import GROUP_TYPE_CONSUMER
from headrace.group.records import (
    MEMBER_STATE_STABLE,
    MEMBER_STATE_UNRELEASED_PARTITIONS,
    MEMBER_STATE_UNREVOKED_PARTITIONS,
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupCurrentMemberAssignmentValue,
    ConsumerGroupKey,
    ConsumerGroupMemberMetadataKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    ConsumerGroupPartitionMetadataKey,
    ConsumerGroupPartitionMetadataValue,
    ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupTargetAssignmentMemberValue,
    ConsumerGroupTargetAssignmentMetadataKey,
    ConsumerGroupTargetAssignmentMetadataValue,
    ConsumerGroupValue,
    TopicMetadata,
    TopicPartitions,
    encode_key,
    encode_value,
)

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
DEFAULT_SESSION_TIMEOUT_MS = 45_000
DEFAULT_HEARTBEAT_INTERVAL_MS = 5_000
INTERNAL_TOPIC_PREFIX = "__"

Partitions = Mapping[uuid.UUID, frozenset[int]]
TopicPartition = tuple[uuid.UUID, int]
KeyValue = tuple[bytes, bytes | None]


class GroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


# the int8 ``State`` of ConsumerGroupCurrentMemberAssignmentValue (Kafka's MemberState)
_STATE_CODES = {
    MemberState.STABLE: MEMBER_STATE_STABLE,
    MemberState.UNREVOKED_PARTITIONS: MEMBER_STATE_UNREVOKED_PARTITIONS,
    MemberState.UNRELEASED_PARTITIONS: MEMBER_STATE_UNRELEASED_PARTITIONS,
}
_STATES_BY_CODE = {code: state for state, code in _STATE_CODES.items()}


class Event(enum.Enum):
    JOIN = "join"
    HEARTBEAT = "heartbeat"
    LEAVE = "leave"
    STATIC_LEAVE = "static_leave"
    SESSION_EXPIRED = "session_expired"
    REBALANCE_TIMEOUT = "rebalance_timeout"
    DELETE = "delete"


_LIVE = frozenset({GroupState.EMPTY, GroupState.RECONCILING, GroupState.STABLE})
_ACTIVE = frozenset({GroupState.RECONCILING, GroupState.STABLE})

# event → (states it is legal in, states it can lead to). A state outside the first set
# raises IllegalGroupEvent; a result outside the second is a bug (AssertionError).
TRANSITIONS: dict[Event, tuple[frozenset[GroupState], frozenset[GroupState]]] = {
    Event.JOIN: (_LIVE, _ACTIVE),
    Event.HEARTBEAT: (_ACTIVE, _ACTIVE),
    Event.LEAVE: (_ACTIVE, _LIVE),
    Event.STATIC_LEAVE: (_ACTIVE, _ACTIVE),
    Event.SESSION_EXPIRED: (_ACTIVE, _LIVE),
    Event.REBALANCE_TIMEOUT: (frozenset({GroupState.RECONCILING}), _LIVE),
    Event.DELETE: (frozenset({GroupState.EMPTY}), frozenset({GroupState.DEAD})),
}


class IllegalGroupEvent(Exception):
    """Our own misuse: an event the group's current state does not allow."""


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error_code: ErrorCode
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    # (topic_id, sorted partitions) when the assignment is sent, else None
    assignment: tuple[tuple[uuid.UUID, tuple[int, ...]], ...] | None = None


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 0
    subscribed_topic_names: frozenset[str] = frozenset()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: dict[uuid.UUID, frozenset[int]] = field(default_factory=dict)
    pending_revocation: dict[uuid.UUID, frozenset[int]] = field(default_factory=dict)
    session_deadline_ms: int = 0
    revocation_deadline_ms: int | None = None

    def subscription_key(self) -> tuple[Any, ...]:
        return (self.subscribed_topic_names, self.subscribed_topic_regex, self.rack_id,
                self.server_assignor)


class _Reject(Exception):
    """A heartbeat refused with a Kafka error (internal control flow)."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


def _random_member_id() -> str:
    """Like Kafka's ``Uuid.randomUuid().toString()``: 22 URL-safe base64 characters."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _tps(partitions: Partitions) -> set[TopicPartition]:
    return {(t, p) for t, ps in partitions.items() for p in ps}


def _group(tps: Iterable[TopicPartition]) -> dict[uuid.UUID, frozenset[int]]:
    out: dict[uuid.UUID, set[int]] = {}
    for t, p in tps:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items()}


def _wire(partitions: Partitions) -> tuple[tuple[uuid.UUID, tuple[int, ...]], ...]:
    return tuple((t, tuple(sorted(ps))) for t, ps in sorted(partitions.items(),
                                                                key=lambda kv: str(kv[0]))
                 if ps)


def _unwire(tps: TopicPartitions) -> dict[uuid.UUID, frozenset[int]]:
    return {t: frozenset(ps) for t, ps in tps if ps}


@dataclass(slots=True)
class _Written:
    """The values of one member's three records last handed out by ``take_records``
    (None: not written, or unknown after a failed write)."""

    metadata: ConsumerGroupMemberMetadataValue | None = None
    target: ConsumerGroupTargetAssignmentMemberValue | None = None
    current: ConsumerGroupCurrentMemberAssignmentValue | None = None


@dataclass
class ConsumerGroupSnapshot:
    """One group's KIP-848 records replayed from ``__consumer_offsets`` (a later record for
    a key wins, a tombstone deletes): the input of ``ConsumerGroup.restore``."""

    epoch: int | None = None
    topics: tuple[TopicMetadata, ...] = ()
    assignment_epoch: int = 0
    members: dict[str, ConsumerGroupMemberMetadataValue] = field(default_factory=dict)
    targets: dict[str, TopicPartitions] = field(default_factory=dict)
    current: dict[str, ConsumerGroupCurrentMemberAssignmentValue] = field(
        default_factory=dict)

    def replay(self, key: ConsumerGroupKey, value: ConsumerGroupValue | None) -> None:
        """One record (``value`` None: a tombstone). A ConsumerGroupMetadata tombstone
        deletes the whole group: the caller drops the snapshot."""
        if isinstance(key, ConsumerGroupMetadataKey):
            self.epoch = value.epoch if isinstance(value, ConsumerGroupMetadataValue) else None
        elif isinstance(key, ConsumerGroupPartitionMetadataKey):
            self.topics = (value.topics if isinstance(value, ConsumerGroupPartitionMetadataValue)
                           else ())
        elif isinstance(key, ConsumerGroupTargetAssignmentMetadataKey):
            self.assignment_epoch = (
                value.assignment_epoch
                if isinstance(value, ConsumerGroupTargetAssignmentMetadataValue) else 0)
        elif isinstance(key, ConsumerGroupMemberMetadataKey):
            if isinstance(value, ConsumerGroupMemberMetadataValue):
                self.members[key.member_id] = value
            else:
                self.members.pop(key.member_id, None)
        elif isinstance(key, ConsumerGroupTargetAssignmentMemberKey):
            if isinstance(value, ConsumerGroupTargetAssignmentMemberValue):
                self.targets[key.member_id] = value.topic_partitions
            else:
                self.targets.pop(key.member_id, None)
        elif isinstance(value, ConsumerGroupCurrentMemberAssignmentValue):
            self.current[key.member_id] = value
        else:
            self.current.pop(key.member_id, None)

    def is_empty(self) -> bool:
        """Nothing left: no epoch record and no member."""
        return self.epoch is None and not self.members


class ConsumerGroup:
    """One KIP-848 consumer group (see the module docstring for every rule)."""

    def __init__(
        self,
        group_id: str,
        *,
        assignors: Sequence[Assignor] | str = "uniform,range",
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        new_member_id: Callable[[], str] = _random_member_id,
    ) -> None:
        self.group_id = group_id
        self.assignors: tuple[Assignor, ...] = (
            assignors_from_config(assignors) if isinstance(assignors, str) else tuple(assignors)
        )
        if not self.assignors:
            raise ValueError("at least one assignor is required")
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._new_member_id = new_member_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, Member] = {}
        self.target: dict[str, dict[uuid.UUID, frozenset[int]]] = {}
        # metadata of the topics some member subscribes to (by name)
        self.subscribed_topics: dict[str, TopicInfo] = {}
        self.assignor_name = self.assignors[0].name
        self._dead = False
        # persistence (R-GRP-6): members whose records may have changed since the last
        # ``take_records``, and what the records handed out so far say
        self._dirty: set[str] = set()
        self._all_dirty = False
        self._written_epoch = 0
        self._written_topics: dict[str, TopicInfo] | None = {}
        self._written_assignment_epoch = 0
        self._written_members: dict[str, _Written] = {}
        self._last_removed: dict[str, _Written] = {}

    # ------------------------------------------------------------------ Group protocol
    @property
    def group_type(self) -> str:
        return GROUP_TYPE_CONSUMER

    @property
    def protocol_type(self) -> str:
        return "consumer"

    @property
    def state(self) -> GroupState:
        if self._dead:
            return GroupState.DEAD
        if not self.members:
            return GroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return GroupState.ASSIGNING
        for m in self.members.values():
            if m.member_epoch == STATIC_LEAVE_EPOCH:
                continue
            if m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                return GroupState.RECONCILING
        return GroupState.STABLE

    @property
    def state_name(self) -> str:
        return self.state.value

    def is_empty(self) -> bool:
        return not self.members

    def subscribed_topic_names(self) -> set[str]:
        """Every topic some member subscribes to by name or (existing and matching) regex;
        OffsetDelete refuses to delete these (GROUP_SUBSCRIBED_TO_TOPIC)."""
        out: set[str] = set(self.subscribed_topics)
        for m in self.members.values():
            out |= m.subscribed_topic_names
        return out

    def mark_dead(self) -> None:
        """DeleteGroups: only an empty group may die."""
        with self._transition(Event.DELETE):
            self._dead = True

    def validate_offset_commit(self, member_id: str, generation_or_epoch: int,
                               group_instance_id: str | None, now_ms: int) -> ErrorCode:
        if generation_or_epoch < 0 and not self.members:
            return ErrorCode.none
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if generation_or_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> ErrorCode:
        if not member_id and member_epoch < 0:
            return ErrorCode.none
        member = self.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    def tick(self, now_ms: int) -> bool:
        if self._dead:
            return False
        changed = False
        for member in list(self.members.values()):
            if member.member_id not in self.members:
                continue
            if now_ms >= member.session_deadline_ms:
                with self._transition(Event.SESSION_EXPIRED):
                    self._remove(member.member_id)
                changed = True
            elif (member.revocation_deadline_ms is not None
                  and now_ms >= member.revocation_deadline_ms):
                with self._transition(Event.REBALANCE_TIMEOUT):
                    self._remove(member.member_id)
                changed = True
        return changed

    # ------------------------------------------------------------------ heartbeat
    def heartbeat(
        self,
        *,
        member_id: str,
        member_epoch: int,
        topics: Mapping[str, TopicInfo],
        now_ms: int,
        instance_id: str | None = None,
        rack_id: str | None = None,
        rebalance_timeout_ms: int = -1,
        subscribed_topic_names: Sequence[str] | None = None,
        subscribed_topic_regex: str | None = None,
        server_assignor: str | None = None,
        topic_partitions: Sequence[tuple[uuid.UUID, Sequence[int]]] | None = None,
        api_version: int = 1,
        client_id: str = "",
        client_host: str = "",
    ) -> HeartbeatResult:
        """One ConsumerGroupHeartbeat. ``topics``: every existing topic, name → TopicInfo."""
        if self._dead:
            raise IllegalGroupEvent(f"group {self.group_id} is dead")
        try:
            self._validate_request(member_id, member_epoch, instance_id, rack_id,
                                   rebalance_timeout_ms, subscribed_topic_names,
                                   subscribed_topic_regex, server_assignor, topic_partitions,
                                   api_version)
            if member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                return self._leave(member_id, member_epoch, instance_id)
            owned = None if topic_partitions is None else _group(
                (t, int(p)) for t, ps in topic_partitions for p in ps)
            if member_epoch == JOIN_EPOCH:
                event = Event.JOIN
                member, is_new = self._member_for_join(member_id, instance_id)
            else:
                event = Event.HEARTBEAT
                member = self._member_for_heartbeat(member_id, member_epoch, instance_id,
                                                    owned)
                is_new = False
        except _Reject as e:
            return HeartbeatResult(e.code, e.message)
        with self._transition(event):
            return self._accept(member, is_new, member_epoch, topics, now_ms, rack_id,
                                rebalance_timeout_ms, subscribed_topic_names,
                                subscribed_topic_regex, server_assignor, owned, client_id,
                                client_host)

    def _validate_request(
        self, member_id: str, member_epoch: int, instance_id: str | None, rack_id: str | None,
        rebalance_timeout_ms: int, names: Sequence[str] | None, regex: str | None,
        server_assignor: str | None,
        owned: Sequence[tuple[uuid.UUID, Sequence[int]]] | None, api_version: int,
    ) -> None:
        invalid = ErrorCode.invalid_request
        if instance_id == "":
            raise _Reject(invalid, "InstanceId can't be empty.")
        if rack_id == "":
            raise _Reject(invalid, "RackId can't be empty.")
        if api_version >= 1 and not member_id:
            raise _Reject(invalid, "MemberId can't be empty.")
        if member_epoch > 0 or member_epoch == LEAVE_EPOCH:
            if not member_id:
                raise _Reject(invalid, "MemberId can't be empty.")
        elif member_epoch == JOIN_EPOCH:
            if rebalance_timeout_ms < 0:
                raise _Reject(invalid, "RebalanceTimeoutMs must be provided in first request.")
            if owned is None or any(ps for _, ps in owned):
                raise _Reject(invalid, "TopicPartitions must be empty when (re-)joining.")
            if names is None and regex is None:
                raise _Reject(invalid, "Either SubscribedTopicNames or SubscribedTopicRegex "
                                       "must be non-null when (re-)joining.")
        elif member_epoch == STATIC_LEAVE_EPOCH:
            if not member_id:
                raise _Reject(invalid, "MemberId can't be empty.")
            if instance_id is None:
                raise _Reject(invalid, "InstanceId can't be null.")
        else:
            raise _Reject(invalid, f"MemberEpoch {member_epoch} is invalid.")
        if regex:
            try:
                re.compile(regex)
            except re.error as e:
                raise _Reject(ErrorCode.invalid_regular_expression,
                              f"SubscribedTopicRegex {regex!r} is not valid: {e}") from None
        if server_assignor is not None and server_assignor not in self._assignors_by_name():
            raise _Reject(ErrorCode.unsupported_assignor,
                          f"ServerAssignor {server_assignor} is not supported. Supported "
                          f"assignors: {', '.join(a.name for a in self.assignors)}.")

    def _assignors_by_name(self) -> dict[str, Assignor]:
        return {a.name: a for a in self.assignors}

    def _static_member(self, instance_id: str) -> Member | None:
        for m in self.members.values():
            if m.instance_id == instance_id:
                return m
        return None

    def _leave(self, member_id: str, member_epoch: int,
               instance_id: str | None) -> HeartbeatResult:
        if instance_id is not None:
            member = self._static_member(instance_id)
            if member is None:
                raise _Reject(ErrorCode.unknown_member_id,
                              f"Instance id {instance_id} is unknown.")
            if member.member_id != member_id:
                raise _Reject(ErrorCode.fenced_instance_id,
                              f"Instance id {instance_id} belongs to another member.")
        else:
            found = self.members.get(member_id)
            if found is None:
                raise _Reject(ErrorCode.unknown_member_id, f"Member {member_id} is unknown.")
            member = found
        if member_epoch == STATIC_LEAVE_EPOCH:
            with self._transition(Event.STATIC_LEAVE):
                self._dirty.add(member.member_id)
                # keeps its assignment (and ownership) until the session expires
                member.previous_member_epoch = member.member_epoch
                member.member_epoch = STATIC_LEAVE_EPOCH
                member.revocation_deadline_ms = None
        else:
            with self._transition(Event.LEAVE):
                self._remove(member.member_id)
        return HeartbeatResult(ErrorCode.none, None, member_id, member_epoch, 0)

    def _member_for_join(self, member_id: str, instance_id: str | None) -> tuple[Member, bool]:
        if instance_id is not None:
            existing = self._static_member(instance_id)
            if existing is not None and existing.member_id != member_id:
                if existing.member_epoch != STATIC_LEAVE_EPOCH:
                    raise _Reject(ErrorCode.unreleased_instance_id,
                                  f"Static member {existing.member_id} with instance id "
                                  f"{instance_id} is still active.")
                # the instance rejoins under a new member id: it takes over the assignment
                new_id = member_id or self._new_member_id()
                self._dirty.update((existing.member_id, new_id))
                del self.members[existing.member_id]
                self.target[new_id] = self.target.pop(existing.member_id, {})
                existing.member_id = new_id
                existing.member_epoch = existing.previous_member_epoch
                self.members[new_id] = existing
                return existing, False
            if existing is not None:
                if existing.member_epoch == STATIC_LEAVE_EPOCH:
                    existing.member_epoch = existing.previous_member_epoch
                    self._dirty.add(existing.member_id)
                return existing, False
        if member_id and member_id in self.members:
            found = self.members[member_id]
            if found.instance_id is not None and found.instance_id != instance_id:
                raise _Reject(ErrorCode.fenced_instance_id,
                              f"Member {member_id} has instance id {found.instance_id}.")
            return found, False
        return Member(member_id or self._new_member_id(), instance_id=instance_id), True

    def _member_for_heartbeat(self, member_id: str, member_epoch: int, instance_id: str | None,
                              owned: Partitions | None) -> Member:
        member = self.members.get(member_id)
        if member is None:
            raise _Reject(ErrorCode.unknown_member_id, f"Member {member_id} is unknown.")
        if instance_id is not None and member.instance_id != instance_id:
            raise _Reject(ErrorCode.fenced_instance_id,
                          f"Member {member_id} has instance id {member.instance_id}.")
        if member_epoch > member.member_epoch:
            raise _Reject(ErrorCode.fenced_member_epoch,
                          f"Epoch {member_epoch} is newer than the member's "
                          f"{member.member_epoch}.")
        if member_epoch < member.member_epoch:
            lost_response = (member_epoch == member.previous_member_epoch and owned is not None
                             and _tps(owned) <= _tps(member.assigned))
            if not lost_response:
                raise _Reject(ErrorCode.fenced_member_epoch,
                              f"Epoch {member_epoch} is older than the member's "
                              f"{member.member_epoch}.")
        return member

    def _accept(
        self, member: Member, is_new: bool, request_epoch: int, topics: Mapping[str, TopicInfo],
        now_ms: int, rack_id: str | None, rebalance_timeout_ms: int,
        names: Sequence[str] | None, regex: str | None, server_assignor: str | None,
        owned: Partitions | None, client_id: str, client_host: str,
    ) -> HeartbeatResult:
        before = member.subscription_key()
        self._dirty.add(member.member_id)
        if rack_id is not None:
            member.rack_id = rack_id
        if rebalance_timeout_ms >= 0:
            member.rebalance_timeout_ms = rebalance_timeout_ms
        if names is not None:
            member.subscribed_topic_names = frozenset(names)
        if regex is not None:
            member.subscribed_topic_regex = regex or None
        if server_assignor is not None:
            member.server_assignor = server_assignor
        if client_id:
            member.client_id = client_id
        if client_host:
            member.client_host = client_host
        member.session_deadline_ms = now_ms + self.session_timeout_ms
        if is_new:
            self.members[member.member_id] = member
        bump = is_new or member.subscription_key() != before
        metadata = self._subscribed_metadata(topics)
        if metadata != self.subscribed_topics:
            self.subscribed_topics = metadata
            bump = True
        if bump:
            self.group_epoch += 1
        self._maybe_compute_target()

        assigned_before = dict(member.assigned)
        if request_epoch == JOIN_EPOCH:
            owned = {}  # a (re)joining member owns nothing
        self._reconcile(member, owned, now_ms)
        full = (rebalance_timeout_ms >= 0 and names is not None and owned is not None)
        send = request_epoch == JOIN_EPOCH or full or member.assigned != assigned_before
        return HeartbeatResult(
            ErrorCode.none, None, member.member_id, member.member_epoch,
            self.heartbeat_interval_ms, _wire(member.assigned) if send else None,
        )

    # ------------------------------------------------------------------ target assignment
    def _subscribed_metadata(self, topics: Mapping[str, TopicInfo]) -> dict[str, TopicInfo]:
        wanted: set[str] = set()
        for m in self.members.values():
            wanted |= self._member_topics(m, topics)
        return {name: topics[name] for name in sorted(wanted) if name in topics}

    @staticmethod
    def _member_topics(member: Member, topics: Iterable[str]) -> frozenset[str]:
        out = set(member.subscribed_topic_names)
        if member.subscribed_topic_regex:
            pattern = re.compile(member.subscribed_topic_regex)
            out |= {t for t in topics
                    if not t.startswith(INTERNAL_TOPIC_PREFIX) and pattern.fullmatch(t)}
        return frozenset(out)

    def _preferred_assignor(self) -> Assignor:
        by_name = self._assignors_by_name()
        counts: dict[str, int] = {}
        for m in self.members.values():
            if m.server_assignor is not None and m.server_assignor in by_name:
                counts[m.server_assignor] = counts.get(m.server_assignor, 0) + 1
        if not counts:
            return self.assignors[0]
        return by_name[max(sorted(counts), key=lambda n: counts[n])]

    def _maybe_compute_target(self) -> None:
        if self.group_epoch <= self.assignment_epoch:
            return
        chosen = self._preferred_assignor()
        self.assignor_name = chosen.name
        subscriptions = {
            m.member_id: MemberSubscription(
                self._member_topics(m, self.subscribed_topics) & set(self.subscribed_topics),
                m.rack_id)
            for m in self.members.values()
        }
        self.target = chosen.assign(subscriptions, self.subscribed_topics, self.target)
        self.assignment_epoch = self.group_epoch
        self._all_dirty = True  # every member's target assignment record may change

    # ------------------------------------------------------------------ reconciliation
    def _owners(self, exclude: str) -> dict[TopicPartition, str]:
        out: dict[TopicPartition, str] = {}
        for m in self.members.values():
            if m.member_id == exclude:
                continue
            for tp in _tps(m.assigned) | _tps(m.pending_revocation):
                out[tp] = m.member_id
        return out

    def _reconcile(self, member: Member, owned: Partitions | None, now_ms: int) -> None:
        """Kafka's CurrentAssignmentBuilder for one member."""
        if member.member_epoch == STATIC_LEAVE_EPOCH:
            return
        if member.state is MemberState.STABLE:
            if member.member_epoch != self.assignment_epoch:
                self._next_assignment(member, member.member_epoch, owned, now_ms)
        elif member.state is MemberState.UNREVOKED_PARTITIONS:
            if owned is None or _tps(owned) & _tps(member.pending_revocation):
                return
            self._next_assignment(member, min(member.member_epoch + 1, self.assignment_epoch),
                                  owned, now_ms)
        else:
            self._next_assignment(member, member.member_epoch, owned, now_ms)

    def _next_assignment(self, member: Member, epoch: int, owned: Partitions | None,
                         now_ms: int) -> None:
        target = _tps(self.target.get(member.member_id, {}))
        current = _tps(member.assigned)
        kept = current & target
        revoke = current - target
        new_epoch = epoch
        if revoke and (owned is None or bool(_tps(owned) & revoke)):
            # Revoke first: the member stays at its epoch holding current ∩ target, and
            # gets nothing new (not even free partitions) until it acknowledges.
            before = (member.state, member.member_epoch, member.assigned,
                      member.pending_revocation)
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.pending_revocation = _group(revoke)
            if before != (member.state, new_epoch, _group(kept), member.pending_revocation):
                # A new revocation (Kafka's maybeReconcile reschedules the member's
                # rebalance timeout whenever it moves to UNREVOKED_PARTITIONS, and the
                # timer fences only a member still at the epoch it was set for): a member
                # that acknowledged one revocation and is asked for another gets a full
                # rebalance timeout for it, not what was left of the previous one.
                member.revocation_deadline_ms = now_ms + member.rebalance_timeout_ms
            assigned = kept
        else:
            owners = self._owners(exclude=member.member_id)
            wanted = target - current
            free = {tp for tp in wanted if tp not in owners}
            member.state = (MemberState.UNRELEASED_PARTITIONS if free != wanted
                            else MemberState.STABLE)
            member.pending_revocation = {}
            member.revocation_deadline_ms = None
            new_epoch = self.assignment_epoch
            assigned = kept | free
        member.assigned = _group(assigned)
        if new_epoch != member.member_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = new_epoch

    def _remove(self, member_id: str) -> None:
        self._dirty.add(member_id)
        del self.members[member_id]
        self.target.pop(member_id, None)
        self.group_epoch += 1
        # the departed member's topics may no longer be subscribed by anyone
        names = set(self.subscribed_topics)
        still: set[str] = set()
        for m in self.members.values():
            still |= self._member_topics(m, names)
        self.subscribed_topics = {n: i for n, i in self.subscribed_topics.items() if n in still}
        self._maybe_compute_target()

    # ------------------------------------------------------------------ persistence
    def _member_values(self, m: Member) -> _Written:
        return _Written(
            ConsumerGroupMemberMetadataValue(
                instance_id=m.instance_id, rack_id=m.rack_id, client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topic_names=tuple(sorted(m.subscribed_topic_names)),
                subscribed_topic_regex=m.subscribed_topic_regex,
                rebalance_timeout_ms=m.rebalance_timeout_ms, server_assignor=m.server_assignor,
            ),
            ConsumerGroupTargetAssignmentMemberValue(_wire(self.target.get(m.member_id, {}))),
            ConsumerGroupCurrentMemberAssignmentValue(
                member_epoch=m.member_epoch, previous_member_epoch=m.previous_member_epoch,
                state=_STATE_CODES[m.state], assigned_partitions=_wire(m.assigned),
                partitions_pending_revocation=_wire(m.pending_revocation),
            ),
        )

    def _partition_metadata(self) -> ConsumerGroupPartitionMetadataValue:
        return ConsumerGroupPartitionMetadataValue(tuple(
            TopicMetadata(info.topic_id, name, info.num_partitions)
            for name, info in sorted(self.subscribed_topics.items())))

    def take_records(self) -> list[KeyValue]:
        """The ``__consumer_offsets`` records of every change since the last call, in
        Kafka's order (removed members' tombstones; member metadata; partition metadata;
        group epoch; target assignment members; target assignment epoch; current member
        assignments). Only what changed is written; a plain heartbeat writes nothing."""
        if self._dead:
            self._dirty.clear()
            self._all_dirty = False
            return []
        ids = (set(self.members) | set(self._written_members) if self._all_dirty
               else set(self._dirty))
        self._dirty.clear()
        self._all_dirty = False
        gid = self.group_id
        out: list[KeyValue] = []
        self._last_removed = {}
        for mid in sorted(ids - set(self.members)):
            gone = self._written_members.pop(mid, None)
            if gone is None:
                continue
            self._last_removed[mid] = gone
            out += [(encode_key(ConsumerGroupCurrentMemberAssignmentKey(gid, mid)), None),
                    (encode_key(ConsumerGroupTargetAssignmentMemberKey(gid, mid)), None),
                    (encode_key(ConsumerGroupMemberMetadataKey(gid, mid)), None)]
        present = sorted(ids & set(self.members))
        now = {mid: self._member_values(self.members[mid]) for mid in present}
        was = {mid: self._written_members.setdefault(mid, _Written()) for mid in present}
        for mid in present:
            if now[mid].metadata != was[mid].metadata:
                was[mid].metadata = now[mid].metadata
                out.append((encode_key(ConsumerGroupMemberMetadataKey(gid, mid)),
                            encode_value(now[mid].metadata)))
        if self.subscribed_topics != self._written_topics:
            self._written_topics = dict(self.subscribed_topics)
            out.append((encode_key(ConsumerGroupPartitionMetadataKey(gid)),
                        encode_value(self._partition_metadata())))
        if self.group_epoch != self._written_epoch:
            self._written_epoch = self.group_epoch
            out.append((encode_key(ConsumerGroupMetadataKey(gid)),
                        encode_value(ConsumerGroupMetadataValue(self.group_epoch))))
        for mid in present:
            if now[mid].target != was[mid].target:
                was[mid].target = now[mid].target
                out.append((encode_key(ConsumerGroupTargetAssignmentMemberKey(gid, mid)),
                            encode_value(now[mid].target)))
        if self.assignment_epoch != self._written_assignment_epoch:
            self._written_assignment_epoch = self.assignment_epoch
            out.append((encode_key(ConsumerGroupTargetAssignmentMetadataKey(gid)),
                        encode_value(ConsumerGroupTargetAssignmentMetadataValue(
                            self.assignment_epoch))))
        for mid in present:
            if now[mid].current != was[mid].current:
                was[mid].current = now[mid].current
                out.append((encode_key(ConsumerGroupCurrentMemberAssignmentKey(gid, mid)),
                            encode_value(now[mid].current)))
        return out

    def forget_written(self) -> None:
        """The records of the last ``take_records`` did not reach the log: the next call
        rewrites the whole group (and the tombstones of the members it removed)."""
        self._written_members.update(self._last_removed)
        self._last_removed = {}
        for mid in self._written_members:
            self._written_members[mid] = _Written()
        self._written_epoch = -1
        self._written_assignment_epoch = -1
        self._written_topics = None
        self._all_dirty = True

    def tombstone_records(self) -> list[KeyValue]:
        """Tombstones for every record of the group (DeleteGroups, or an empty group
        turning classic), in Kafka's order: per member current assignment, target
        assignment and member metadata; then target assignment metadata, partition
        metadata and the group epoch. Changes nothing."""
        gid = self.group_id
        out: list[KeyValue] = []
        for mid in sorted(set(self.members) | set(self._written_members)):
            out += [(encode_key(ConsumerGroupCurrentMemberAssignmentKey(gid, mid)), None),
                    (encode_key(ConsumerGroupTargetAssignmentMemberKey(gid, mid)), None),
                    (encode_key(ConsumerGroupMemberMetadataKey(gid, mid)), None)]
        out += [(encode_key(ConsumerGroupTargetAssignmentMetadataKey(gid)), None),
                (encode_key(ConsumerGroupPartitionMetadataKey(gid)), None),
                (encode_key(ConsumerGroupMetadataKey(gid)), None)]
        return out

    def restore(self, snapshot: ConsumerGroupSnapshot, now_ms: int) -> None:
        """Rebuild this (new) group from its replayed records. Sessions restart at
        ``now_ms`` (as Kafka's coordinator does when it loads a partition), and a member
        that was revoking partitions gets a fresh rebalance timeout."""
        self.group_epoch = snapshot.epoch or 0
        self.assignment_epoch = snapshot.assignment_epoch
        self.subscribed_topics = {t.topic_name: TopicInfo(t.topic_id, t.num_partitions)
                                  for t in snapshot.topics}
        self.members = {}
        self.target = {}
        for mid, md in snapshot.members.items():
            cur = snapshot.current.get(mid)
            member = Member(
                mid, instance_id=md.instance_id, rack_id=md.rack_id, client_id=md.client_id,
                client_host=md.client_host, rebalance_timeout_ms=md.rebalance_timeout_ms,
                subscribed_topic_names=frozenset(md.subscribed_topic_names),
                subscribed_topic_regex=md.subscribed_topic_regex,
                server_assignor=md.server_assignor,
                session_deadline_ms=now_ms + self.session_timeout_ms,
            )
            if cur is not None:
                member.member_epoch = cur.member_epoch
                member.previous_member_epoch = cur.previous_member_epoch
                # a state a later Kafka may add: recompute the member's next assignment
                member.state = _STATES_BY_CODE.get(cur.state,
                                                   MemberState.UNRELEASED_PARTITIONS)
                member.assigned = _unwire(cur.assigned_partitions)
                member.pending_revocation = _unwire(cur.partitions_pending_revocation)
                if (member.state is MemberState.UNREVOKED_PARTITIONS
                        and member.member_epoch != STATIC_LEAVE_EPOCH):
                    member.revocation_deadline_ms = now_ms + member.rebalance_timeout_ms
            self.members[mid] = member
            self.target[mid] = _unwire(snapshot.targets.get(mid, ()))
        self.assignor_name = self._preferred_assignor().name
        self._dirty.clear()
        self._all_dirty = False
        self._written_epoch = self.group_epoch
        self._written_topics = dict(self.subscribed_topics)
        self._written_assignment_epoch = self.assignment_epoch
        self._written_members = {mid: self._member_values(m) for mid, m in self.members.items()}
        self._last_removed = {}

    # ------------------------------------------------------------------ transitions
    def _transition(self, event: Event) -> _TransitionGuard:
        return _TransitionGuard(self, event)

    # ------------------------------------------------------------------ describe
    def describe(self, topic_names: Mapping[uuid.UUID, str] | None = None) -> dict[str, Any]:
        """ConsumerGroupDescribe's ``DescribedGroup`` for this group (plain values);
        ``topic_names`` resolves topic ids (default: the subscribed topics' metadata)."""
        names = {info.topic_id: name for name, info in self.subscribed_topics.items()}
        if topic_names is not None:
            names.update(topic_names)

        def assignment(parts: Partitions) -> dict[str, Any]:
            return {"topic_partitions": [
                {"topic_id": t, "topic_name": names.get(t, ""), "partitions": ps}
                for t, ps in _wire(parts)
            ]}

        return {
            "error_code": ErrorCode.none,
            "group_id": self.group_id,
            "group_state": self.state_name,
            "group_epoch": self.group_epoch,
            "assignment_epoch": self.assignment_epoch,
            "assignor_name": self.assignor_name,
            "members": [
                {
                    "member_id": m.member_id,
                    "instance_id": m.instance_id,
                    "rack_id": m.rack_id,
                    "member_epoch": m.member_epoch,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "subscribed_topic_names": tuple(sorted(m.subscribed_topic_names)),
                    "subscribed_topic_regex": m.subscribed_topic_regex,
                    "assignment": assignment(m.assigned),
                    "target_assignment": assignment(self.target.get(m.member_id, {})),
                    "member_type": 1,
                }
                for m in sorted(self.members.values(), key=lambda m: m.member_id)
            ],
        }


class _TransitionGuard:
    """Checks an event against ``TRANSITIONS`` before (raise, nothing changed) and after."""

    def __init__(self, group: ConsumerGroup, event: Event) -> None:
        self.group = group
        self.event = event

    def __enter__(self) -> None:
        legal, _ = TRANSITIONS[self.event]
        state = self.group.state
        if state not in legal:
            raise IllegalGroupEvent(
                f"{self.event.value} is not allowed in state {state.value} "
                f"(group {self.group.group_id})")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            return
        _, results = TRANSITIONS[self.event]
        state = self.group.state
        assert state in results, f"{self.event.value} led to {state.value}"


__all__ = ["ASSIGNORS", "ConsumerGroup", "ConsumerGroupSnapshot", "GroupState",
           "HeartbeatResult", "IllegalGroupEvent", "Member", "MemberState", "TopicInfo"]
