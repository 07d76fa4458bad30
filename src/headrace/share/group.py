"""PURE: a KIP-932 share group (ShareGroupHeartbeat, ShareGroupDescribe), as Kafka 4.2 runs it.

Everything that affects a share group's membership and assignment lives here; the handler
decodes ShareGroupHeartbeat, passes every existing topic (name → ``TopicInfo``) and
``now_ms``, encodes the ``HeartbeatResult``, appends its ``records`` to the group's
``__consumer_offsets`` partition and hands its ``initialize`` event to the share
coordinator. No I/O, no clock. (Kafka's ``GroupMetadataManager.shareGroupHeartbeat``,
``ShareGroup``, ``ShareGroupMember``, ``ShareGroupAssignmentBuilder``, ``SimpleAssignor``.)

## Heartbeat rules (in order; a refused heartbeat changes nothing and writes nothing)

1. Request validation (``GroupCoordinatorService.throwIfShareGroupHeartbeatRequestIsInvalid``),
   INVALID_REQUEST: an empty (blank) ``member_id`` — in 4.2 the *client* generates the member
   id (a UUID) and keeps it for its lifetime, the coordinator never does; an empty
   ``rack_id``; ``member_epoch`` 0 without subscribed topic names (null or empty); an epoch
   below -1.
2. ``member_epoch`` -1 leaves: an unknown member → UNKNOWN_MEMBER_ID; otherwise the member
   and its records are removed (tombstones) and the group epoch bumps. The response carries
   epoch -1. The target assignment is recomputed on the next heartbeat of any member (as
   Kafka: ``shareGroupFenceMember`` only bumps the epoch).
3. ``group.share.max.size`` (default 200): a group with that many members refuses a member
   id it does not know → GROUP_MAX_SIZE_REACHED (``throwIfShareGroupIsFull``; checked before
   the member lookup, so it also answers an unknown member with epoch > 0).
4. Epoch 0 creates the member if it is new (epoch 0, previous epoch -1); any other epoch
   needs a known member → UNKNOWN_MEMBER_ID. Then (``throwIfShareGroupMemberEpochIsInvalid``)
   an epoch above the member's → FENCED_MEMBER_EPOCH; below it and not its previous epoch
   (a lost response) → FENCED_MEMBER_EPOCH. So a known member re-joining with epoch 0 is
   fenced unless 0 is its previous epoch (its join response was lost).
5. The member's rack id and subscribed topic names are updated when given (null: unchanged),
   client id and host always. The **group epoch** bumps when the subscribed topic names
   changed, when the subscribed topics' metadata changed (a subscribed topic created or
   deleted, or given more partitions: ``metadata_hash``), or when partitions whose share
   state has been initialized are not yet all in the target assignment
   (``initializedAssignmentPending``).
6. When the group epoch is ahead of the **assignment epoch**, the simple assignor computes
   a new **target assignment** for all members (input: the previous target) over the
   *assignable* partitions — only partitions whose share-group state is initialized (see
   below) — and the assignment epoch becomes the group epoch.
7. Reconciliation (``ShareGroupAssignmentBuilder``): there is no revocation phase and no
   owned-partitions list. A member whose epoch differs from the assignment epoch gets its
   target assignment at once (filtered to its subscribed topics), its epoch becomes the
   assignment epoch and the old one its previous epoch; a member whose subscription changed
   gets the filtered target at its current epoch. Member state is always STABLE (0).
8. The session deadline moves to ``now_ms + group.share.session.timeout.ms`` (45000). The
   response carries ``group.share.heartbeat.interval.ms`` (5000), and the assignment when the
   member joined (epoch 0), sent its topic names (a full request), or its assignment changed.

## Timers (``tick(now_ms)``)

A member whose session deadline has passed (``now_ms >= deadline``) is fenced exactly as if
it left (rule 2).

## Share-partition state initialization (what the group tells the share coordinator)

A share partition must have its state initialized (InitializeShareGroupState, state epoch =
the group epoch, start offset -1: "use the auto.offset.reset policy") before the group
assigns it. After every accepted heartbeat (Kafka's
``maybeCreateInitializeShareGroupStateRequest``) every partition of every topic some member
subscribes to that is neither *initialized* nor *initializing* (an initializing entry older
than ``group.share.initialize.retry.interval.ms``, 30000, is asked for again) becomes
*initializing* (stamped ``now_ms``) and the result carries an ``InitializeShareGroupState``
event naming them. The shell sends it and reports back: ``state_initialized`` moves the
partitions to *initialized* (the next heartbeat then bumps the epoch and assigns them),
``state_initialize_failed`` drops them from *initializing* (asked for again on the next
heartbeat). Both sets are persisted in ShareGroupStatePartitionMetadata. Topic deletion
(``DeletingTopics``, DeleteShareGroupState) is not modelled here: the field is read and
written back unchanged.

## Group states (``ShareGroup.ShareGroupState``; transitions as data: ``TRANSITIONS``)

Empty (no members) / Stable (some member) / Dead (after ``mark_dead``, DeleteGroups of an
empty group). Share groups have no Assigning or Reconciling state. An event outside the
states ``TRANSITIONS`` allows raises ``IllegalGroupEvent`` and changes nothing.

## Persistence (``__consumer_offsets``, Kafka 4.2's share-group coordinator records)

Each key is an int16 record type then a non-flexible struct (int16-length strings); each
value an int16 version (0) then a flexible struct (compact strings and arrays, uuids as 16
bytes, tagged fields at the end of every struct; we write none and skip any we read)::

    type  record                              key fields          value fields (v0)
    10    ShareGroupMemberMetadata            group, member id    nullable string rackId,
                                                                  string clientId,
                                                                  string clientHost,
                                                                  []string subscribedTopicNames
    11    ShareGroupMetadata                  group               int32 epoch,
                                                                  int64 metadataHash
    12    ShareGroupTargetAssignmentMetadata  group               int32 assignmentEpoch
    13    ShareGroupTargetAssignmentMember    group, member id    []TopicPartition (uuid topicId,
                                                                  []int32 partitions)
    14    ShareGroupCurrentMemberAssignment   group, member id    int32 memberEpoch,
                                                                  int32 previousMemberEpoch,
                                                                  int8 state,
                                                                  []TopicPartitions assigned
    15    ShareGroupStatePartitionMetadata    group               []TopicPartitionsInfo
                                                                    initializingTopics,
                                                                  []TopicPartitionsInfo
                                                                    initializedTopics,
                                                                  []TopicInfo deletingTopics
          TopicPartitionsInfo: uuid topicId, string topicName, []int32 partitions
          TopicInfo: uuid topicId, string topicName

A null value is a tombstone. Every call that changes state returns the records of what
changed since the last call, in Kafka's order (removed members' tombstones: current
assignment, target assignment, member metadata; then member metadata, group metadata,
target members, target metadata, current assignments, state partition metadata). If the
append of one call's records fails the shell calls ``forget_written()`` before the next
call, and the next call writes them again. ``ShareGroupSnapshot.replay`` folds records (a
later record for a key wins) and ``ShareGroup.restore`` rebuilds the group: members, epochs,
target and current assignments and the initialized/initializing sets come back; sessions
restart at ``now_ms`` (as Kafka when it loads a partition), initializing entries are
stamped ``now_ms``.

``metadataHash`` is ours, not Kafka's murmur3 topic hash: a 64-bit BLAKE2b of the subscribed
topics' (name, id, partition count). Only its changes matter (rule 5); a Kafka broker
loading our records would see a different hash and bump the group epoch once.
"""

from __future__ import annotations

import enum
import hashlib
import struct
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from headrace.group.assignors import TopicInfo
from headrace.protocol.records import encode_uvarint

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
DEFAULT_SESSION_TIMEOUT_MS = 45_000  # group.share.session.timeout.ms
DEFAULT_HEARTBEAT_INTERVAL_MS = 5_000  # group.share.heartbeat.interval.ms
DEFAULT_MAX_SIZE = 200  # group.share.max.size
DEFAULT_INITIALIZE_RETRY_INTERVAL_MS = 30_000  # group.share.initialize.retry.interval.ms
SIMPLE_ASSIGNOR_NAME = "simple"
MEMBER_STATE_STABLE = 0  # Kafka's MemberState.STABLE, the only state a share member has
PROTOCOL_TYPE = "share"
UNKNOWN_TOPIC_NAME = "UNKNOWN"  # GroupMetadataManager.combineInitMaps's default name

Partitions = Mapping[uuid.UUID, frozenset[int]]
Assignment = dict[str, dict[uuid.UUID, frozenset[int]]]
TopicPartition = tuple[uuid.UUID, int]
TopicPartitions = tuple[tuple[uuid.UUID, tuple[int, ...]], ...]
KeyValue = tuple[bytes, bytes | None]


# ====================================================================== records

SHARE_GROUP_MEMBER_METADATA = 10
SHARE_GROUP_METADATA = 11
SHARE_GROUP_TARGET_ASSIGNMENT_METADATA = 12
SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER = 13
SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT = 14
SHARE_GROUP_STATE_PARTITION_METADATA = 15
SHARE_GROUP_VALUE_VERSION = 0


class ShareGroupRecordError(ValueError):
    """The bytes of a share-group key or value are malformed (someone else's bytes)."""


@dataclass(frozen=True, slots=True)
class ShareGroupMemberMetadataKey:
    group: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ShareGroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class ShareGroupTargetAssignmentMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class ShareGroupTargetAssignmentMemberKey:
    group: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ShareGroupCurrentMemberAssignmentKey:
    group: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ShareGroupStatePartitionMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class ShareGroupMemberMetadataValue:
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ShareGroupMetadataValue:
    epoch: int
    metadata_hash: int


@dataclass(frozen=True, slots=True)
class ShareGroupTargetAssignmentMetadataValue:
    assignment_epoch: int


@dataclass(frozen=True, slots=True)
class ShareGroupTargetAssignmentMemberValue:
    topic_partitions: TopicPartitions


@dataclass(frozen=True, slots=True)
class ShareGroupCurrentMemberAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned_partitions: TopicPartitions


@dataclass(frozen=True, slots=True)
class TopicPartitionsInfo:
    topic_id: uuid.UUID
    topic_name: str
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ShareGroupStatePartitionMetadataValue:
    initializing_topics: tuple[TopicPartitionsInfo, ...]
    initialized_topics: tuple[TopicPartitionsInfo, ...]
    deleting_topics: tuple[tuple[uuid.UUID, str], ...]


ShareGroupKey = (ShareGroupMemberMetadataKey | ShareGroupMetadataKey
                 | ShareGroupTargetAssignmentMetadataKey | ShareGroupTargetAssignmentMemberKey
                 | ShareGroupCurrentMemberAssignmentKey | ShareGroupStatePartitionMetadataKey)
ShareGroupValue = (ShareGroupMemberMetadataValue | ShareGroupMetadataValue
                   | ShareGroupTargetAssignmentMetadataValue
                   | ShareGroupTargetAssignmentMemberValue
                   | ShareGroupCurrentMemberAssignmentValue
                   | ShareGroupStatePartitionMetadataValue)

_KEY_TYPES: dict[type, int] = {
    ShareGroupMemberMetadataKey: SHARE_GROUP_MEMBER_METADATA,
    ShareGroupMetadataKey: SHARE_GROUP_METADATA,
    ShareGroupTargetAssignmentMetadataKey: SHARE_GROUP_TARGET_ASSIGNMENT_METADATA,
    ShareGroupTargetAssignmentMemberKey: SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER,
    ShareGroupCurrentMemberAssignmentKey: SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT,
    ShareGroupStatePartitionMetadataKey: SHARE_GROUP_STATE_PARTITION_METADATA,
}
_MEMBER_KEYS = (ShareGroupMemberMetadataKey, ShareGroupTargetAssignmentMemberKey,
                ShareGroupCurrentMemberAssignmentKey)

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_NO_TAGS = b"\x00"


def _string(s: str) -> bytes:
    data = s.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes is too long for an int16 length")
    return _INT16.pack(len(data)) + data


def _compact_string(s: str | None) -> bytes:
    if s is None:
        return b"\x00"
    data = s.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes is too long")
    return encode_uvarint(len(data) + 1) + data


def _compact_array(items: Iterable[bytes]) -> bytes:
    parts = list(items)
    return encode_uvarint(len(parts) + 1) + b"".join(parts)


def _int32s(values: Iterable[int]) -> bytes:
    return _compact_array(_INT32.pack(v) for v in values)


def _topic_partitions(tps: TopicPartitions) -> bytes:
    return _compact_array(t.bytes + _int32s(ps) + _NO_TAGS for t, ps in tps)


def _partitions_info(infos: tuple[TopicPartitionsInfo, ...]) -> bytes:
    return _compact_array(i.topic_id.bytes + _compact_string(i.topic_name)
                          + _int32s(i.partitions) + _NO_TAGS for i in infos)


def encode_key(key: ShareGroupKey) -> bytes:
    """int16 record type, string group id, and for per-member records string member id."""
    out = _INT16.pack(_KEY_TYPES[type(key)]) + _string(key.group)
    if isinstance(key, _MEMBER_KEYS):
        out += _string(key.member_id)
    return out


def encode_value(value: ShareGroupValue | None) -> bytes | None:
    """int16 version 0, then the flexible struct; None (a tombstone) for None."""
    if value is None:
        return None
    if isinstance(value, ShareGroupMemberMetadataValue):
        body = (_compact_string(value.rack_id) + _compact_string(value.client_id)
                + _compact_string(value.client_host)
                + _compact_array(_compact_string(n) for n in value.subscribed_topic_names))
    elif isinstance(value, ShareGroupMetadataValue):
        body = _INT32.pack(value.epoch) + _INT64.pack(value.metadata_hash)
    elif isinstance(value, ShareGroupTargetAssignmentMetadataValue):
        body = _INT32.pack(value.assignment_epoch)
    elif isinstance(value, ShareGroupTargetAssignmentMemberValue):
        body = _topic_partitions(value.topic_partitions)
    elif isinstance(value, ShareGroupCurrentMemberAssignmentValue):
        body = (_INT32.pack(value.member_epoch) + _INT32.pack(value.previous_member_epoch)
                + _INT8.pack(value.state) + _topic_partitions(value.assigned_partitions))
    else:
        body = (_partitions_info(value.initializing_topics)
                + _partitions_info(value.initialized_topics)
                + _compact_array(t.bytes + _compact_string(n) + _NO_TAGS
                                 for t, n in value.deleting_topics))
    return _INT16.pack(SHARE_GROUP_VALUE_VERSION) + body + _NO_TAGS


class _Reader:
    """A bounds-checked cursor over one key or value."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ShareGroupRecordError(
                f"truncated: need {n} byte(s) at position {self.pos} of {len(self.data)}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int8(self) -> int:
        return int(_INT8.unpack(self.take(1))[0])

    def int16(self) -> int:
        return int(_INT16.unpack(self.take(2))[0])

    def int32(self) -> int:
        return int(_INT32.unpack(self.take(4))[0])

    def int64(self) -> int:
        return int(_INT64.unpack(self.take(8))[0])

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ShareGroupRecordError(f"unsigned varint too long at {self.pos}")

    def _utf8(self, n: int) -> str:
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ShareGroupRecordError(f"string is not UTF-8: {e}") from e

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise ShareGroupRecordError(f"bad string length {n}")
        return self._utf8(n)

    def compact_nullable_string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n < 0 else self._utf8(n)

    def compact_string(self) -> str:
        s = self.compact_nullable_string()
        if s is None:
            raise ShareGroupRecordError("null where a non-nullable string is required")
        return s

    def count(self) -> int:
        n = self.uvarint() - 1
        if n < 0:
            raise ShareGroupRecordError("null where an array is required")
        return n

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.take(16))

    def int32s(self) -> tuple[int, ...]:
        return tuple(self.int32() for _ in range(self.count()))

    def tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())

    def topic_partitions(self) -> TopicPartitions:
        out = []
        for _ in range(self.count()):
            topic_id = self.uuid()
            partitions = self.int32s()
            self.tagged_fields()
            out.append((topic_id, partitions))
        return tuple(out)

    def partitions_info(self) -> tuple[TopicPartitionsInfo, ...]:
        out = []
        for _ in range(self.count()):
            info = TopicPartitionsInfo(self.uuid(), self.compact_string(), self.int32s())
            self.tagged_fields()
            out.append(info)
        return tuple(out)


def decode_key(data: bytes) -> ShareGroupKey | None:
    """A share-group key, or None for any other record type of ``__consumer_offsets``."""
    r = _Reader(bytes(data))
    record_type = r.int16()
    if record_type == SHARE_GROUP_METADATA:
        return ShareGroupMetadataKey(r.string())
    if record_type == SHARE_GROUP_TARGET_ASSIGNMENT_METADATA:
        return ShareGroupTargetAssignmentMetadataKey(r.string())
    if record_type == SHARE_GROUP_STATE_PARTITION_METADATA:
        return ShareGroupStatePartitionMetadataKey(r.string())
    if record_type == SHARE_GROUP_MEMBER_METADATA:
        return ShareGroupMemberMetadataKey(r.string(), r.string())
    if record_type == SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER:
        return ShareGroupTargetAssignmentMemberKey(r.string(), r.string())
    if record_type == SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT:
        return ShareGroupCurrentMemberAssignmentKey(r.string(), r.string())
    return None


def decode_value(key: ShareGroupKey, data: bytes | None) -> ShareGroupValue | None:
    """The value of ``key``'s record type; None for a tombstone."""
    if data is None:
        return None
    r = _Reader(bytes(data))
    version = r.int16()
    if version != SHARE_GROUP_VALUE_VERSION:
        raise ShareGroupRecordError(f"unknown value version {version} for {type(key).__name__}")
    value: ShareGroupValue
    if isinstance(key, ShareGroupMemberMetadataKey):
        value = ShareGroupMemberMetadataValue(
            r.compact_nullable_string(), r.compact_string(), r.compact_string(),
            tuple(r.compact_string() for _ in range(r.count())))
    elif isinstance(key, ShareGroupMetadataKey):
        value = ShareGroupMetadataValue(r.int32(), r.int64())
    elif isinstance(key, ShareGroupTargetAssignmentMetadataKey):
        value = ShareGroupTargetAssignmentMetadataValue(r.int32())
    elif isinstance(key, ShareGroupTargetAssignmentMemberKey):
        value = ShareGroupTargetAssignmentMemberValue(r.topic_partitions())
    elif isinstance(key, ShareGroupCurrentMemberAssignmentKey):
        value = ShareGroupCurrentMemberAssignmentValue(r.int32(), r.int32(), r.int8(),
                                                       r.topic_partitions())
    else:
        initializing = r.partitions_info()
        initialized = r.partitions_info()
        deleting = []
        for _ in range(r.count()):
            deleting.append((r.uuid(), r.compact_string()))
            r.tagged_fields()
        value = ShareGroupStatePartitionMetadataValue(initializing, initialized, tuple(deleting))
    r.tagged_fields()
    return value


# ====================================================================== simple assignor


class PartitionAssignorError(Exception):
    """Kafka's PartitionAssignorException: a member subscribes to a topic the assignor was
    not told about (the caller's misuse)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _balance(member_ids: Sequence[str], targets: Sequence[TopicPartition],
             current: Mapping[str, set[TopicPartition]]) -> dict[str, list[TopicPartition]]:
    """One balancing round of Kafka's simple assignment builders over ``targets`` shared by
    ``member_ids`` (see ``simple_assign``)."""
    n_members, n_targets = len(member_ids), len(targets)
    if not n_targets or not n_members:
        return {m: [] for m in member_ids}
    sharing = _ceil_div(n_members, n_targets)  # desiredSharing
    # desiredAssignmentCount: spread sharing * N assignments as evenly as possible; the
    # first members in order take the extra one (exact integers, not Java's doubles)
    total = sharing * n_targets
    desired = {m: _ceil_div(total * (i + 1), n_members) - _ceil_div(total * i, n_members)
               for i, m in enumerate(member_ids)}
    order = {tp: i for i, tp in enumerate(targets)}
    # 1. keep what each member holds that is still assignable to it
    held = {m: sorted((tp for tp in current.get(m, ()) if tp in order), key=order.__getitem__)
            for m in member_ids}
    holders: dict[TopicPartition, list[str]] = {tp: [] for tp in targets}
    for m in member_ids:
        for tp in held[m]:
            holders[tp].append(m)
    # 2. revoke over-shared partitions, from over-filled members first
    for tp in targets:
        while len(holders[tp]) > sharing:
            over = [m for m in holders[tp] if len(held[m]) > desired[m]]
            victim = (over or holders[tp])[0]
            holders[tp].remove(victim)
            held[victim].remove(tp)
    # 3. revoke from members that still hold more than desired (their last partitions)
    for m in member_ids:
        while len(held[m]) > desired[m]:
            holders[held[m].pop()].remove(m)
    # 4. hand the partitions that want more members to the unfilled members, round robin
    unfilled = [m for m in member_ids if len(held[m]) < desired[m]]
    cursor = 0
    for tp in targets:
        need = sharing - len(holders[tp])
        tried = 0
        while need > 0 and unfilled and tried < len(unfilled):
            cursor %= len(unfilled)
            m = unfilled[cursor]
            if m in holders[tp]:
                cursor += 1
                tried += 1
                continue
            holders[tp].append(m)
            held[m].append(tp)
            need -= 1
            tried = 0
            if len(held[m]) >= desired[m]:
                unfilled.pop(cursor)
            else:
                cursor += 1
    return held


def simple_assign(
    subscriptions: Mapping[str, frozenset[uuid.UUID]],
    assignable: Mapping[uuid.UUID, Sequence[int]],
    current: Mapping[str, Partitions],
) -> Assignment:
    """Kafka 4.2's ``SimpleAssignor`` (``SimpleHomogeneousAssignmentBuilder`` and
    ``SimpleHeterogeneousAssignmentBuilder``): balance first, then stickiness.

    ``subscriptions``: member id → subscribed topic ids; ``assignable``: topic id → its
    assignable partitions (initialized share partitions; topics in this mapping's order);
    ``current``: the previous target assignment. Members are taken in member-id order.

    - If every member subscribes to the same topics (homogeneous), all their partitions are
      balanced together; otherwise each topic is balanced on its own among its subscribers
      (so a member subscribing to T1 and T2 gets its share of each).
    - With N partitions and M members: each partition is wanted by ``ceil(M / N)`` members
      (``desiredSharing``: 1 while M <= N; partitions are *shared* by several members when
      M > N), and the ``ceil(M/N) * N`` assignments are spread so that member counts differ
      by at most one (the first members in order take the extra ones).
    - A member keeps what it had of its subscribed, assignable partitions; partitions held
      by more members than wanted are taken first from members holding more than their
      share; members still above their share drop their last partitions; then every
      partition wanting more members is handed round robin to the members below their
      share, never twice to one member.

    Every assignable partition of a subscribed topic ends up with at least one member.
    Kafka iterates hash maps where we iterate in order, so which member gets which
    partition can differ from Kafka; the counts and the rules above do not.
    """
    members = sorted(subscriptions)
    out: Assignment = {m: {} for m in members}
    topics = [t for t in assignable if any(t in s for s in subscriptions.values())]
    for subs in subscriptions.values():
        for t in subs:
            if t not in assignable:
                raise PartitionAssignorError(
                    f"Members are subscribed to topic {t} which doesn't exist in the topic "
                    "metadata.")
    prev = {m: {(t, p) for t, ps in current.get(m, {}).items() for p in ps} for m in members}
    rounds: list[tuple[list[str], list[TopicPartition]]]
    if len({subscriptions[m] for m in members}) <= 1:
        rounds = [(members, [(t, p) for t in topics for p in assignable[t]])]
    else:
        rounds = [([m for m in members if t in subscriptions[m]],
                   [(t, p) for p in assignable[t]]) for t in topics]
    for round_members, targets in rounds:
        for m, tps in _balance(round_members, targets, prev).items():
            for t, p in tps:
                out[m][t] = out[m].get(t, frozenset()) | {p}
    return out


# ====================================================================== the group


class ShareGroupState(enum.Enum):
    EMPTY = "Empty"
    STABLE = "Stable"
    DEAD = "Dead"


class Event(enum.Enum):
    JOIN = "join"
    HEARTBEAT = "heartbeat"
    LEAVE = "leave"
    SESSION_EXPIRED = "session_expired"
    STATE_INITIALIZED = "state_initialized"
    STATE_INITIALIZE_FAILED = "state_initialize_failed"
    DELETE = "delete"


_LIVE = frozenset({ShareGroupState.EMPTY, ShareGroupState.STABLE})
_STABLE = frozenset({ShareGroupState.STABLE})

# event → (states it is legal in, states it can lead to). A state outside the first set
# raises IllegalGroupEvent; a result outside the second is a bug (AssertionError).
TRANSITIONS: dict[Event, tuple[frozenset[ShareGroupState], frozenset[ShareGroupState]]] = {
    Event.JOIN: (_LIVE, _STABLE),
    Event.HEARTBEAT: (_STABLE, _STABLE),
    Event.LEAVE: (_STABLE, _LIVE),
    Event.SESSION_EXPIRED: (_STABLE, _LIVE),
    Event.STATE_INITIALIZED: (_LIVE, _LIVE),
    Event.STATE_INITIALIZE_FAILED: (_LIVE, _LIVE),
    Event.DELETE: (frozenset({ShareGroupState.EMPTY}), frozenset({ShareGroupState.DEAD})),
}


class IllegalGroupEvent(Exception):
    """Our own misuse: an event the group's current state does not allow."""


@dataclass(frozen=True, slots=True)
class InitializeShareGroupState:
    """Output event: ask the share coordinator to initialize these share partitions
    (InitializeShareGroupState: state epoch = ``group_epoch``, start offset -1)."""

    group_id: str
    group_epoch: int
    topics: TopicPartitions


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """A ShareGroupHeartbeat response, the records to append and the event to send."""

    error_code: ErrorCode
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    # (topic_id, sorted partitions) when the assignment is sent, else None
    assignment: TopicPartitions | None = None
    records: tuple[KeyValue, ...] = ()
    initialize: InitializeShareGroupState | None = None


@dataclass(frozen=True, slots=True)
class TickResult:
    expired: tuple[str, ...] = ()
    records: tuple[KeyValue, ...] = ()


@dataclass(slots=True)
class ShareMember:
    member_id: str
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: frozenset[str] = frozenset()
    member_epoch: int = 0
    previous_member_epoch: int = -1
    assigned: dict[uuid.UUID, frozenset[int]] = field(default_factory=dict)
    session_deadline_ms: int = 0


@dataclass(frozen=True, slots=True)
class InitEntry:
    """Kafka's ``ShareGroup.InitMapValue``: a topic's name, partitions, and when asked."""

    name: str
    partitions: frozenset[int]
    timestamp_ms: int


class _Reject(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _wire(partitions: Partitions) -> TopicPartitions:
    return tuple((t, tuple(sorted(ps))) for t, ps in sorted(partitions.items(),
                                                                key=lambda kv: str(kv[0]))
                 if ps)


def _unwire(tps: TopicPartitions) -> dict[uuid.UUID, frozenset[int]]:
    return {t: frozenset(ps) for t, ps in tps if ps}


def _infos(entries: Mapping[uuid.UUID, InitEntry]) -> tuple[TopicPartitionsInfo, ...]:
    return tuple(TopicPartitionsInfo(t, e.name, tuple(sorted(e.partitions)))
                 for t, e in sorted(entries.items(), key=lambda kv: str(kv[0])))


def _combine(a: Mapping[uuid.UUID, InitEntry],
             b: Mapping[uuid.UUID, InitEntry]) -> dict[uuid.UUID, InitEntry]:
    """Kafka's ``combineInitMaps``: union of partitions per topic; ``b``'s name and time win."""
    out = dict(a)
    for t, e in b.items():
        old = out.get(t)
        out[t] = e if old is None else InitEntry(e.name, old.partitions | e.partitions,
                                                 e.timestamp_ms)
    return out


@dataclass
class ShareGroupSnapshot:
    """One share group's records replayed from ``__consumer_offsets`` (a later record for a
    key wins, a tombstone deletes): the input of ``ShareGroup.restore``."""

    epoch: int | None = None
    metadata_hash: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareGroupMemberMetadataValue] = field(default_factory=dict)
    targets: dict[str, TopicPartitions] = field(default_factory=dict)
    current: dict[str, ShareGroupCurrentMemberAssignmentValue] = field(default_factory=dict)
    state_partitions: ShareGroupStatePartitionMetadataValue | None = None

    def replay(self, key: ShareGroupKey, value: ShareGroupValue | None) -> None:
        if isinstance(key, ShareGroupMetadataKey):
            if isinstance(value, ShareGroupMetadataValue):
                self.epoch, self.metadata_hash = value.epoch, value.metadata_hash
            else:
                self.epoch, self.metadata_hash = None, 0
        elif isinstance(key, ShareGroupTargetAssignmentMetadataKey):
            self.assignment_epoch = (value.assignment_epoch if isinstance(
                value, ShareGroupTargetAssignmentMetadataValue) else 0)
        elif isinstance(key, ShareGroupStatePartitionMetadataKey):
            self.state_partitions = (value if isinstance(
                value, ShareGroupStatePartitionMetadataValue) else None)
        elif isinstance(key, ShareGroupMemberMetadataKey):
            if isinstance(value, ShareGroupMemberMetadataValue):
                self.members[key.member_id] = value
            else:
                self.members.pop(key.member_id, None)
        elif isinstance(key, ShareGroupTargetAssignmentMemberKey):
            if isinstance(value, ShareGroupTargetAssignmentMemberValue):
                self.targets[key.member_id] = value.topic_partitions
            else:
                self.targets.pop(key.member_id, None)
        elif isinstance(value, ShareGroupCurrentMemberAssignmentValue):
            self.current[key.member_id] = value
        else:
            self.current.pop(key.member_id, None)

    def is_empty(self) -> bool:
        return self.epoch is None and not self.members


def metadata_hash(topics: Mapping[str, TopicInfo]) -> int:
    """Our ``metadataHash`` of the subscribed topics (see the module docstring); 0 for none."""
    if not topics:
        return 0
    text = ";".join(f"{name}:{info.topic_id}:{info.num_partitions}"
                    for name, info in sorted(topics.items()))
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class ShareGroup:
    """One KIP-932 share group (see the module docstring for every rule)."""

    def __init__(
        self,
        group_id: str,
        *,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        max_size: int = DEFAULT_MAX_SIZE,
        initialize_retry_interval_ms: int = DEFAULT_INITIALIZE_RETRY_INTERVAL_MS,
    ) -> None:
        self.group_id = group_id
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_size = max_size
        self.initialize_retry_interval_ms = initialize_retry_interval_ms
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.metadata_hash = 0
        self.members: dict[str, ShareMember] = {}
        self.target: dict[str, dict[uuid.UUID, frozenset[int]]] = {}
        self.initializing: dict[uuid.UUID, InitEntry] = {}
        self.initialized: dict[uuid.UUID, InitEntry] = {}
        self.deleting: dict[uuid.UUID, str] = {}
        self._dead = False
        self._written: dict[ShareGroupKey, ShareGroupValue] = {}
        self._before_last: dict[ShareGroupKey, ShareGroupValue] = {}

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> ShareGroupState:
        if self._dead:
            return ShareGroupState.DEAD
        return ShareGroupState.STABLE if self.members else ShareGroupState.EMPTY

    @property
    def protocol_type(self) -> str:
        return PROTOCOL_TYPE

    # -- what the group coordinator's registry asks of every group (group.base.Group) --
    @property
    def group_type(self) -> str:
        return "share"

    @property
    def state_name(self) -> str:
        return self.state.value

    def validate_offset_commit(self, member_id: str, generation_or_epoch: int,
                               group_instance_id: str | None, now_ms: int) -> ErrorCode:
        """A share group has no committed offsets (Kafka: the group is not a consumer
        group)."""
        return ErrorCode.group_id_not_found

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> ErrorCode:
        return ErrorCode.group_id_not_found

    def is_empty(self) -> bool:
        return not self.members

    def subscribed_topic_names(self) -> frozenset[str]:
        out: set[str] = set()
        for m in self.members.values():
            out |= m.subscribed_topic_names
        return frozenset(out)

    def _check(self, event: Event) -> None:
        legal, _ = TRANSITIONS[event]
        if self.state not in legal:
            raise IllegalGroupEvent(f"{event.value} is not allowed in state "
                                    f"{self.state.value} (share group {self.group_id})")

    def _checked(self, event: Event) -> None:
        _, results = TRANSITIONS[event]
        assert self.state in results, f"{event.value} led to {self.state.value}"

    def mark_dead(self) -> tuple[KeyValue, ...]:
        """DeleteGroups: only an empty group may die; returns the group's tombstones."""
        self._check(Event.DELETE)
        out = self.tombstone_records()
        self._dead = True
        self._written = {}
        self._checked(Event.DELETE)
        return out

    # ------------------------------------------------------------------ heartbeat
    def heartbeat(
        self,
        *,
        member_id: str,
        member_epoch: int,
        topics: Mapping[str, TopicInfo],
        now_ms: int,
        rack_id: str | None = None,
        subscribed_topic_names: Sequence[str] | None = None,
        client_id: str = "",
        client_host: str = "",
    ) -> HeartbeatResult:
        """One ShareGroupHeartbeat; ``topics``: every existing topic, name → TopicInfo."""
        if self._dead:
            raise IllegalGroupEvent(f"share group {self.group_id} is dead")
        try:
            self._validate(member_id, member_epoch, rack_id, subscribed_topic_names)
            if member_epoch == LEAVE_EPOCH:
                return self._leave(member_id, topics)
            if len(self.members) >= self.max_size and member_id not in self.members:
                raise _Reject(ErrorCode.group_max_size_reached,
                              "The share group has reached its maximum capacity of "
                              f"{self.max_size} members.")
            member = self.members.get(member_id)
            if member is None:
                if member_epoch != JOIN_EPOCH:
                    raise _Reject(ErrorCode.unknown_member_id, f"Member {member_id} is not a "
                                  f"member of group {self.group_id}.")
                member = ShareMember(member_id)
            elif member_epoch > member.member_epoch:
                raise _Reject(ErrorCode.fenced_member_epoch, "The share group member has a "
                              f"greater member epoch ({member_epoch}) than the one known by "
                              f"the group coordinator ({member.member_epoch}).")
            elif (member_epoch < member.member_epoch
                  and member_epoch != member.previous_member_epoch):
                raise _Reject(ErrorCode.fenced_member_epoch, "The share group member has a "
                              f"smaller member epoch ({member_epoch}) than the one known by "
                              f"the group coordinator ({member.member_epoch}), and it does "
                              "not match the previous member epoch "
                              f"({member.previous_member_epoch}).")
        except _Reject as e:
            return HeartbeatResult(e.code, e.message)
        event = Event.HEARTBEAT if member_id in self.members else Event.JOIN
        self._check(event)
        result = self._accept(member, member_epoch, topics, now_ms, rack_id,
                              subscribed_topic_names, client_id, client_host)
        self._checked(event)
        return result

    @staticmethod
    def _validate(member_id: str, member_epoch: int, rack_id: str | None,
                  names: Sequence[str] | None) -> None:
        invalid = ErrorCode.invalid_request
        if not member_id.strip():
            raise _Reject(invalid, "MemberId can't be empty.")
        if rack_id is not None and not rack_id.strip():
            raise _Reject(invalid, "RackId can't be empty.")
        if member_epoch == JOIN_EPOCH:
            if not names:
                raise _Reject(invalid, "SubscribedTopicNames must be set in first request.")
        elif member_epoch < LEAVE_EPOCH:
            raise _Reject(invalid, "MemberEpoch is invalid.")

    def _accept(self, member: ShareMember, member_epoch: int, topics: Mapping[str, TopicInfo],
                now_ms: int, rack_id: str | None, names: Sequence[str] | None,
                client_id: str, client_host: str) -> HeartbeatResult:
        before_assigned = dict(member.assigned)
        pending = self._initialized_assignment_pending(topics)
        old_names = member.subscribed_topic_names
        if rack_id is not None:
            member.rack_id = rack_id
        if names is not None:
            member.subscribed_topic_names = frozenset(names)
        member.client_id = client_id
        member.client_host = client_host
        self.members[member.member_id] = member
        subscription_changed = member.subscribed_topic_names != old_names
        bump = subscription_changed or pending
        new_hash = metadata_hash(self._subscribed_metadata(topics))
        if new_hash != self.metadata_hash:
            self.metadata_hash = new_hash
            bump = True
        if bump:
            self.group_epoch += 1
        if self.group_epoch > self.assignment_epoch:
            self._compute_target(topics)
        self._reconcile(member, topics, subscription_changed)
        member.session_deadline_ms = now_ms + self.session_timeout_ms
        initialize = self._maybe_initialize(topics, now_ms)
        send = (member_epoch == JOIN_EPOCH or names is not None
                or member.assigned != before_assigned)
        return HeartbeatResult(
            ErrorCode.none, None, member.member_id, member.member_epoch,
            self.heartbeat_interval_ms, _wire(member.assigned) if send else None,
            self._flush(), initialize)

    def _subscribed_metadata(self, topics: Mapping[str, TopicInfo]) -> dict[str, TopicInfo]:
        return {n: topics[n] for n in self.subscribed_topic_names() if n in topics}

    def _initialized_assignment_pending(self, topics: Mapping[str, TopicInfo]) -> bool:
        """Kafka's ``initializedAssignmentPending``: some initialized partition of a
        subscribed topic is not in the target assignment (or the target holds partitions
        of it that are not initialized). Unlike Kafka, a topic missing from ``topics``
        (deleted) or partitions beyond its count are left out, so that they do not bump
        the epoch on every heartbeat (Kafka clears them through its topic-deletion path,
        which is not modelled here)."""
        names = self.subscribed_topic_names()
        if not self.members or not self.initialized or not names:
            return False
        assigned: dict[uuid.UUID, set[int]] = {}
        for parts in self.target.values():
            for t, ps in parts.items():
                assigned.setdefault(t, set()).update(ps)
        for t, e in self.initialized.items():
            info = topics.get(e.name)
            if e.name not in names or info is None or info.topic_id != t:
                continue
            if assigned.get(t, set()) != {p for p in e.partitions if p < info.num_partitions}:
                return True
        return False

    def _compute_target(self, topics: Mapping[str, TopicInfo]) -> None:
        subscriptions = {mid: frozenset(topics[n].topic_id for n in m.subscribed_topic_names
                                        if n in topics)
                         for mid, m in self.members.items()}
        assignable: dict[uuid.UUID, list[int]] = {}
        for name in sorted(self.subscribed_topic_names()):
            info = topics.get(name)
            if info is None:
                continue
            entry = self.initialized.get(info.topic_id)
            assignable[info.topic_id] = sorted(
                p for p in (entry.partitions if entry else ()) if p < info.num_partitions)
        self.target = simple_assign(subscriptions, assignable, self.target)
        self.assignment_epoch = self.group_epoch

    def _reconcile(self, member: ShareMember, topics: Mapping[str, TopicInfo],
                   subscription_changed: bool) -> None:
        """Kafka's ``ShareGroupAssignmentBuilder``: straight to the target, no revocation."""
        if member.member_epoch == self.assignment_epoch and not subscription_changed:
            return
        ids = {topics[n].topic_id for n in member.subscribed_topic_names if n in topics}
        member.assigned = {t: ps for t, ps in self.target.get(member.member_id, {}).items()
                           if t in ids and ps}
        if member.member_epoch != self.assignment_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.assignment_epoch

    def _maybe_initialize(self, topics: Mapping[str, TopicInfo],
                          now_ms: int) -> InitializeShareGroupState | None:
        """Kafka's ``subscribedTopicsChangeMap`` + ``addInitializingTopicsRecords``."""
        fresh = {t: e for t, e in self.initializing.items()
                 if now_ms - e.timestamp_ms < self.initialize_retry_interval_ms}
        known = _combine(self.initialized, fresh)
        change: dict[uuid.UUID, InitEntry] = {}
        for name in sorted(self.subscribed_topic_names()):
            info = topics.get(name)
            if info is None:
                continue
            have = known[info.topic_id].partitions if info.topic_id in known else frozenset()
            if len(have) < info.num_partitions:
                change[info.topic_id] = InitEntry(
                    name, frozenset(range(info.num_partitions)) - have, now_ms)
        if not change:
            return None
        self.initializing = _combine(self.initializing, change)
        for t in change:
            self.deleting.pop(t, None)
        return InitializeShareGroupState(self.group_id, self.group_epoch, tuple(
            (t, tuple(sorted(e.partitions))) for t, e in change.items()))

    # ------------------------------------------------------------------ leave and expiry
    def _leave(self, member_id: str, topics: Mapping[str, TopicInfo]) -> HeartbeatResult:
        if member_id not in self.members:
            raise _Reject(ErrorCode.unknown_member_id,
                          f"Member {member_id} is not a member of group {self.group_id}.")
        self._check(Event.LEAVE)
        self._fence(member_id, topics)
        self._checked(Event.LEAVE)
        return HeartbeatResult(ErrorCode.none, None, member_id, LEAVE_EPOCH, 0, None,
                               self._flush())

    def _fence(self, member_id: str, topics: Mapping[str, TopicInfo] | None) -> None:
        """Kafka's ``shareGroupFenceMember``: the member and its target go, the epoch bumps
        (with the hash of what the others subscribe to); the target waits for a heartbeat."""
        del self.members[member_id]
        self.target.pop(member_id, None)
        if topics is not None:
            self.metadata_hash = metadata_hash(self._subscribed_metadata(topics))
        self.group_epoch += 1

    def tick(self, now_ms: int, topics: Mapping[str, TopicInfo] | None = None) -> TickResult:
        """Fence every member whose session deadline has passed. ``topics`` (if given)
        recomputes the metadata hash without them, as Kafka does."""
        if self._dead:
            return TickResult()
        expired = tuple(sorted(mid for mid, m in self.members.items()
                               if now_ms >= m.session_deadline_ms))
        for mid in expired:
            self._check(Event.SESSION_EXPIRED)
            self._fence(mid, topics)
            self._checked(Event.SESSION_EXPIRED)
        return TickResult(expired, self._flush() if expired else ())

    # ------------------------------------------------------------------ share coordinator
    def state_initialized(self, topic_partitions: Mapping[uuid.UUID, Iterable[int]],
                          now_ms: int, topic_names: Mapping[uuid.UUID, str] | None = None,
                          ) -> tuple[KeyValue, ...]:
        """The share coordinator initialized these partitions (Kafka's
        ``initializeShareGroupState``; also AlterShareGroupOffsets, which names topics the
        group may never have asked for: ``topic_names``): initializing → initialized."""
        self._check(Event.STATE_INITIALIZED)
        done = {t: frozenset(ps) for t, ps in topic_partitions.items()}
        if not any(done.values()):
            return ()
        given = dict(topic_names or {})
        names = {t: (self.initializing[t].name if t in self.initializing
                     else self.initialized[t].name if t in self.initialized
                     else given.get(t, UNKNOWN_TOPIC_NAME)) for t in done}
        self.initialized = _combine(self.initialized, {
            t: InitEntry(names[t], ps, now_ms) for t, ps in done.items() if ps})
        self._drop_initializing(done)
        self._checked(Event.STATE_INITIALIZED)
        return self._flush()

    def state_initialize_failed(self, topic_partitions: Mapping[uuid.UUID, Iterable[int]]
                                ) -> tuple[KeyValue, ...]:
        """Initializing these failed (Kafka's ``uninitializeShareGroupState``): they leave
        *initializing* and are asked for again on the next heartbeat."""
        self._check(Event.STATE_INITIALIZE_FAILED)
        self._drop_initializing({t: frozenset(ps) for t, ps in topic_partitions.items()})
        self._checked(Event.STATE_INITIALIZE_FAILED)
        return self._flush()

    def _drop_initializing(self, done: Mapping[uuid.UUID, frozenset[int]]) -> None:
        for t, ps in done.items():
            entry = self.initializing.get(t)
            if entry is None:
                continue
            left = entry.partitions - ps
            if left:
                self.initializing[t] = InitEntry(entry.name, left, entry.timestamp_ms)
            else:
                del self.initializing[t]

    def state_deleted(self, topic_ids: Iterable[uuid.UUID]) -> tuple[KeyValue, ...]:
        """DeleteShareGroupOffsets deleted these topics' share-partition state: they are
        neither initialized nor initializing any more (the next assignment initializes them
        again, from ``share.auto.offset.reset``)."""
        self._check(Event.STATE_INITIALIZE_FAILED)  # legal in the same states
        for t in topic_ids:
            self.initialized.pop(t, None)
            self.initializing.pop(t, None)
            self.deleting.pop(t, None)
        return self._flush()

    def initialized_partitions(self) -> dict[uuid.UUID, frozenset[int]]:
        """Kafka's ``initializedShareGroupPartitions``."""
        return {t: e.partitions for t, e in self.initialized.items()}

    # ------------------------------------------------------------------ describe
    def describe(self, topic_names: Mapping[uuid.UUID, str] | None = None) -> dict[str, Any]:
        """ShareGroupDescribe's ``DescribedGroup`` (plain values); ``topic_names`` resolves
        topic ids for the members' assignments."""
        names = dict(topic_names or {})
        for t, e in (*self.initialized.items(), *self.initializing.items()):
            names.setdefault(t, e.name)
        return {
            "error_code": ErrorCode.none,
            "error_message": None,
            "group_id": self.group_id,
            "group_state": self.state.value,
            "group_epoch": self.group_epoch,
            "assignment_epoch": self.assignment_epoch,
            "assignor_name": SIMPLE_ASSIGNOR_NAME,
            "members": [
                {
                    "member_id": m.member_id,
                    "rack_id": m.rack_id,
                    "member_epoch": m.member_epoch,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "subscribed_topic_names": tuple(sorted(m.subscribed_topic_names)),
                    "assignment": {"topic_partitions": [
                        {"topic_id": t, "topic_name": names.get(t, ""), "partitions": ps}
                        for t, ps in _wire(m.assigned)]},
                }
                for m in sorted(self.members.values(), key=lambda m: m.member_id)
            ],
            "authorized_operations": -2147483648,
        }

    # ------------------------------------------------------------------ persistence
    def _state_records(self) -> dict[ShareGroupKey, ShareGroupValue]:
        """Every record the group's state needs now, in Kafka's write order."""
        gid = self.group_id
        mids = sorted(self.members)
        out: dict[ShareGroupKey, ShareGroupValue] = {}
        for mid in mids:
            m = self.members[mid]
            out[ShareGroupMemberMetadataKey(gid, mid)] = ShareGroupMemberMetadataValue(
                m.rack_id, m.client_id, m.client_host, tuple(sorted(m.subscribed_topic_names)))
        if self.group_epoch:
            out[ShareGroupMetadataKey(gid)] = ShareGroupMetadataValue(self.group_epoch,
                                                                      self.metadata_hash)
        for mid in mids:
            if mid in self.target:
                out[ShareGroupTargetAssignmentMemberKey(gid, mid)] = (
                    ShareGroupTargetAssignmentMemberValue(_wire(self.target[mid])))
        if self.assignment_epoch:
            out[ShareGroupTargetAssignmentMetadataKey(gid)] = (
                ShareGroupTargetAssignmentMetadataValue(self.assignment_epoch))
        for mid in mids:
            m = self.members[mid]
            out[ShareGroupCurrentMemberAssignmentKey(gid, mid)] = (
                ShareGroupCurrentMemberAssignmentValue(m.member_epoch, m.previous_member_epoch,
                                                       MEMBER_STATE_STABLE, _wire(m.assigned)))
        if self.initializing or self.initialized or self.deleting:
            out[ShareGroupStatePartitionMetadataKey(gid)] = ShareGroupStatePartitionMetadataValue(
                _infos(self.initializing), _infos(self.initialized),
                tuple(sorted(self.deleting.items(), key=lambda kv: str(kv[0]))))
        return out

    def _flush(self) -> tuple[KeyValue, ...]:
        now = self._state_records()
        rank = {ShareGroupCurrentMemberAssignmentKey: 0, ShareGroupTargetAssignmentMemberKey: 1,
                ShareGroupMemberMetadataKey: 2}

        def gone_order(k: ShareGroupKey) -> tuple[int, str, int]:
            if isinstance(k, _MEMBER_KEYS):
                return (0, k.member_id, rank[type(k)])
            return (1, "", 0)

        out: list[KeyValue] = [(encode_key(k), None)
                               for k in sorted((k for k in self._written if k not in now),
                                               key=gone_order)]
        out += [(encode_key(k), encode_value(v)) for k, v in now.items()
                if self._written.get(k) != v]
        self._before_last = self._written
        self._written = now
        return tuple(out)

    def forget_written(self) -> None:
        """The records of the last call did not reach the log: the next call rewrites them."""
        self._written = self._before_last

    def tombstone_records(self) -> tuple[KeyValue, ...]:
        """Kafka's ``ShareGroup.createGroupTombstoneRecords`` order; changes nothing."""
        gid = self.group_id
        mids = sorted(set(self.members) | {k.member_id for k in self._written
                                           if isinstance(k, _MEMBER_KEYS)})
        keys: list[ShareGroupKey] = [ShareGroupCurrentMemberAssignmentKey(gid, m) for m in mids]
        keys += [ShareGroupTargetAssignmentMemberKey(gid, m) for m in mids]
        keys.append(ShareGroupTargetAssignmentMetadataKey(gid))
        keys += [ShareGroupMemberMetadataKey(gid, m) for m in mids]
        keys += [ShareGroupStatePartitionMetadataKey(gid), ShareGroupMetadataKey(gid)]
        return tuple((encode_key(k), None) for k in keys)

    def restore(self, snapshot: ShareGroupSnapshot, now_ms: int) -> None:
        """Rebuild this (new) group from its replayed records; sessions restart at
        ``now_ms`` and initializing entries are stamped ``now_ms``."""
        self.group_epoch = snapshot.epoch or 0
        self.metadata_hash = snapshot.metadata_hash
        self.assignment_epoch = snapshot.assignment_epoch
        self.members = {}
        self.target = {}
        for mid, md in snapshot.members.items():
            member = ShareMember(mid, md.rack_id, md.client_id, md.client_host,
                                 frozenset(md.subscribed_topic_names),
                                 session_deadline_ms=now_ms + self.session_timeout_ms)
            cur = snapshot.current.get(mid)
            if cur is not None:
                member.member_epoch = cur.member_epoch
                member.previous_member_epoch = cur.previous_member_epoch
                member.assigned = _unwire(cur.assigned_partitions)
            self.members[mid] = member
            if mid in snapshot.targets:
                self.target[mid] = _unwire(snapshot.targets[mid])
        sp = snapshot.state_partitions
        self.initializing = {} if sp is None else {
            i.topic_id: InitEntry(i.topic_name, frozenset(i.partitions), now_ms)
            for i in sp.initializing_topics}
        self.initialized = {} if sp is None else {
            i.topic_id: InitEntry(i.topic_name, frozenset(i.partitions), now_ms)
            for i in sp.initialized_topics}
        self.deleting = {} if sp is None else dict(sp.deleting_topics)
        self._written = self._state_records()
        self._before_last = dict(self._written)


def describe_unknown_group(group_id: str) -> dict[str, Any]:
    """ShareGroupDescribe for a group id the coordinator does not know."""
    return {"error_code": ErrorCode.group_id_not_found,
            "error_message": f"Group {group_id} not found.", "group_id": group_id}


__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL_MS", "DEFAULT_INITIALIZE_RETRY_INTERVAL_MS", "DEFAULT_MAX_SIZE",
    "DEFAULT_SESSION_TIMEOUT_MS", "TRANSITIONS", "Event", "HeartbeatResult", "IllegalGroupEvent",
    "InitEntry", "InitializeShareGroupState", "PartitionAssignorError", "ShareGroup",
    "ShareGroupRecordError", "ShareGroupSnapshot", "ShareGroupState", "ShareMember",
    "TickResult", "TopicInfo", "decode_key", "decode_value", "describe_unknown_group",
    "encode_key", "encode_value", "metadata_hash", "simple_assign",
]


def invalid_heartbeat(group_id: str, member_id: str, member_epoch: int, rack_id: str | None,
                      names: Sequence[str] | None) -> HeartbeatResult | None:
    """Kafka's ``GroupCoordinatorService.throwIfShareGroupHeartbeatRequestIsInvalid``, which
    runs before the group is looked up (so an invalid request for a group that does not
    exist is INVALID_REQUEST, not UNKNOWN_MEMBER_ID): the refusal, or None. Its order:
    member id, group id, rack id, then the epoch."""
    if not member_id.strip():
        return HeartbeatResult(ErrorCode.invalid_request, "MemberId can't be empty.")
    if not group_id.strip():
        return HeartbeatResult(ErrorCode.invalid_request, "GroupId can't be empty.")
    try:
        ShareGroup._validate(member_id, member_epoch, rack_id, names)
    except _Reject as e:
        return HeartbeatResult(e.code, e.message)
    return None
