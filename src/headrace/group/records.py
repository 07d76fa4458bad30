"""PURE: the keys and values of ``__consumer_offsets`` records, in Kafka's own formats.

Kafka's group coordinator stores offsets and group state in ``__consumer_offsets``
(R-GRP-6), each key and value starting with an int16 version: committed offsets, classic
groups' metadata, and the state of KIP-848 consumer groups (the group-managed
``subscribe()`` of R-GRP-7: members, epochs, target and current assignments). We write
exactly what Kafka writes (offset commit key v1 / value v3, group metadata key v2 / value
v3 as Kafka 2.3+; the KIP-848 records as Kafka 4.0), so tools that read the topic
(Burrow, ``kafka-console-consumer --formatter ...GroupMetadataManager$...``) decode them;
we read every version Kafka has ever written (classic values v0..v4, KIP-848 values v0).

Primitive types (big-endian), as in Kafka's non-flexible schemas::

    int16/int32/int64   2/4/8 bytes, two's complement
    string              int16 length, then UTF-8 bytes
    nullable string     int16 length (-1: null), then UTF-8 bytes
    bytes               int32 length, then the bytes
    array               int32 count, then the elements

Flexible versions (``OffsetCommitValue`` v4, ``GroupMetadataValue`` v4) use compact forms:
string/bytes/array lengths are unsigned varints holding length + 1 (0: null), and every
struct ends with tagged fields (unsigned varint count, then per field: uvarint tag,
uvarint size, data), which we skip.

Keys (the record key; the version says which record this is)::

    OffsetCommitKey v0, v1 (v1 written)      GroupMetadataKey v2
      int16   version (0 or 1)                 int16   version (2)
      string  group                            string  group
      string  topic
      int32   partition

Versions 3..8 are KIP-848 consumer-group records (below); ``decode_key`` returns None for
every later version (share groups, streams groups, transactions), which we ignore.

OffsetCommitValue (the record value; a null value is a tombstone: offset deleted)::

    field            v0  v1  v2  v3  v4      (v3 written)
    int16 version     x   x   x   x   x
    int64 offset      x   x   x   x   x
    int32 leaderEpoch             x   x      (-1 when absent)
    string metadata   x   x   x   x   x      (compact in v4)
    int64 commitTimestamp x x x   x   x
    int64 expireTimestamp x                  (v1 only; dropped)
    tagged fields                     x

GroupMetadataValue (a null value is a tombstone: group deleted)::

    field                            v0  v1  v2  v3  v4   (v3 written)
    int16 version                     x   x   x   x   x
    string protocolType               x   x   x   x   x
    int32 generation                  x   x   x   x   x
    nullable string protocol          x   x   x   x   x
    nullable string leader            x   x   x   x   x
    int64 currentStateTimestamp               x   x   x   (-1 when absent)
    array members (MemberMetadata)    x   x   x   x   x
    tagged fields                                     x

    MemberMetadata                   v0  v1  v2  v3  v4
    string memberId                   x   x   x   x   x
    nullable string groupInstanceId               x   x   (None when absent)
    string clientId                   x   x   x   x   x
    string clientHost                 x   x   x   x   x
    int32 rebalanceTimeout                x   x   x   x   (v0: = sessionTimeout, as Kafka)
    int32 sessionTimeout              x   x   x   x   x
    bytes subscription                x   x   x   x   x
    bytes assignment                  x   x   x   x   x
    tagged fields                                     x

KIP-848 consumer groups (``group.protocol=consumer``; Kafka's
``group-coordinator/src/main/resources/common/message/ConsumerGroup*.json``, as Kafka 4.0
writes them). Keys are non-flexible (int16 version, then int16-length strings); each value
is an int16 version (0: the only one) followed by a flexible struct: compact strings and
arrays, a ``uuid`` is 16 bytes, ``int8`` one byte, and every struct (array elements too)
ends with tagged fields. We write no tagged fields and skip any we read (4.1's
``MetadataHash``, ``ClassicMemberMetadata``, KIP-1251's ``AssignmentEpochs``, ...)::

    key  record                              key fields           value fields (v0)
    3    ConsumerGroupMetadata               group                int32 epoch
    4    ConsumerGroupPartitionMetadata      group                []TopicMetadata
                                                                    (uuid topicId, string
                                                                    topicName, int32
                                                                    numPartitions,
                                                                    []PartitionMetadata
                                                                    (int32 partition,
                                                                    []string racks))
    5    ConsumerGroupMemberMetadata         group, member id     nullable string instanceId,
                                                                  nullable string rackId,
                                                                  string clientId,
                                                                  string clientHost,
                                                                  []string subscribedTopicNames,
                                                                  nullable string
                                                                  subscribedTopicRegex,
                                                                  int32 rebalanceTimeoutMs,
                                                                  nullable string serverAssignor
    6    ConsumerGroupTargetAssignmentMetadata  group             int32 assignmentEpoch
    7    ConsumerGroupTargetAssignmentMember group, member id     []TopicPartitions
    8    ConsumerGroupCurrentMemberAssignment group, member id    int32 memberEpoch,
                                                                  int32 previousMemberEpoch,
                                                                  int8 state (0 stable,
                                                                  1 unrevoked, 2 unreleased
                                                                  partitions), []TopicPartitions
                                                                  assigned, []TopicPartitions
                                                                  pendingRevocation

    TopicPartitions: uuid topicId, []int32 partitions

A null value is a tombstone (the member, the target, the group is gone).

Trailing bytes after the fields are ignored (Kafka's readers do the same for fields added
later). Errors: malformed bytes (someone else's, or a corrupt log) raise ``GroupRecordError``;
encoding values out of their type's range raises ``ValueError`` (our misuse).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from headrace.protocol.records import encode_uvarint

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3
MAX_VALUE_VERSION = 4

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


class GroupRecordError(ValueError):
    """The bytes of a ``__consumer_offsets`` key or value are malformed."""


@dataclass(frozen=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True)
class OffsetCommitValue:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int


@dataclass(frozen=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberMetadata, ...]


# ---------------------------------------------------------------------- KIP-848 records

CONSUMER_GROUP_METADATA_KEY_VERSION = 3
CONSUMER_GROUP_PARTITION_METADATA_KEY_VERSION = 4
CONSUMER_GROUP_MEMBER_METADATA_KEY_VERSION = 5
CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY_VERSION = 6
CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY_VERSION = 7
CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY_VERSION = 8
CONSUMER_GROUP_VALUE_VERSION = 0

# Kafka's org.apache.kafka.coordinator.group.modern.MemberState values
MEMBER_STATE_STABLE = 0
MEMBER_STATE_UNREVOKED_PARTITIONS = 1
MEMBER_STATE_UNRELEASED_PARTITIONS = 2

# (topic id, partitions), as the TopicPartitions structs carry them
TopicPartitions = tuple[tuple[uuid.UUID, tuple[int, ...]], ...]


@dataclass(frozen=True)
class ConsumerGroupMetadataKey:
    group: str


@dataclass(frozen=True)
class ConsumerGroupPartitionMetadataKey:
    group: str


@dataclass(frozen=True)
class ConsumerGroupMemberMetadataKey:
    group: str
    member_id: str


@dataclass(frozen=True)
class ConsumerGroupTargetAssignmentMetadataKey:
    group: str


@dataclass(frozen=True)
class ConsumerGroupTargetAssignmentMemberKey:
    group: str
    member_id: str


@dataclass(frozen=True)
class ConsumerGroupCurrentMemberAssignmentKey:
    group: str
    member_id: str


@dataclass(frozen=True)
class ConsumerGroupMetadataValue:
    epoch: int


@dataclass(frozen=True)
class TopicMetadata:
    topic_id: uuid.UUID
    topic_name: str
    num_partitions: int
    # (partition, racks); Kafka 4.0 writes an empty list without rack information
    partition_racks: tuple[tuple[int, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class ConsumerGroupPartitionMetadataValue:
    topics: tuple[TopicMetadata, ...]


@dataclass(frozen=True)
class ConsumerGroupMemberMetadataValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None


@dataclass(frozen=True)
class ConsumerGroupTargetAssignmentMetadataValue:
    assignment_epoch: int


@dataclass(frozen=True)
class ConsumerGroupTargetAssignmentMemberValue:
    topic_partitions: TopicPartitions


@dataclass(frozen=True)
class ConsumerGroupCurrentMemberAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned_partitions: TopicPartitions
    partitions_pending_revocation: TopicPartitions


ConsumerGroupKey = (ConsumerGroupMetadataKey | ConsumerGroupPartitionMetadataKey
                    | ConsumerGroupMemberMetadataKey | ConsumerGroupTargetAssignmentMetadataKey
                    | ConsumerGroupTargetAssignmentMemberKey
                    | ConsumerGroupCurrentMemberAssignmentKey)
ConsumerGroupValue = (ConsumerGroupMetadataValue | ConsumerGroupPartitionMetadataValue
                      | ConsumerGroupMemberMetadataValue
                      | ConsumerGroupTargetAssignmentMetadataValue
                      | ConsumerGroupTargetAssignmentMemberValue
                      | ConsumerGroupCurrentMemberAssignmentValue)
GroupKey = OffsetCommitKey | GroupMetadataKey | ConsumerGroupKey
GroupValue = OffsetCommitValue | GroupMetadataValue | ConsumerGroupValue

_KEY_VERSIONS: dict[type, int] = {
    ConsumerGroupMetadataKey: CONSUMER_GROUP_METADATA_KEY_VERSION,
    ConsumerGroupPartitionMetadataKey: CONSUMER_GROUP_PARTITION_METADATA_KEY_VERSION,
    ConsumerGroupMemberMetadataKey: CONSUMER_GROUP_MEMBER_METADATA_KEY_VERSION,
    ConsumerGroupTargetAssignmentMetadataKey:
        CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY_VERSION,
    ConsumerGroupTargetAssignmentMemberKey: CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY_VERSION,
    ConsumerGroupCurrentMemberAssignmentKey:
        CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY_VERSION,
}


# ---------------------------------------------------------------------- encoding


def _string(s: str | None) -> bytes:
    if s is None:
        return _INT16.pack(-1)
    data = s.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes is too long for an int16 length")
    return _INT16.pack(len(data)) + data


def _bytes(b: bytes) -> bytes:
    return _INT32.pack(len(b)) + b


def encode_key(key: GroupKey) -> bytes:
    """The record key: offset commit key v1, group metadata key v2, or a KIP-848 key
    (versions 3..8)."""
    if isinstance(key, OffsetCommitKey):
        return (_INT16.pack(OFFSET_COMMIT_KEY_VERSION) + _string(key.group)
                + _string(key.topic) + _INT32.pack(key.partition))
    if isinstance(key, GroupMetadataKey):
        return _INT16.pack(GROUP_METADATA_KEY_VERSION) + _string(key.group)
    out = _INT16.pack(_KEY_VERSIONS[type(key)]) + _string(key.group)
    if isinstance(key, (ConsumerGroupMemberMetadataKey, ConsumerGroupTargetAssignmentMemberKey,
                        ConsumerGroupCurrentMemberAssignmentKey)):
        out += _string(key.member_id)
    return out


_NO_TAGS = b"\x00"  # an empty tagged-field section


def _compact_string(s: str | None) -> bytes:
    if s is None:
        return b"\x00"
    data = s.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes is too long")
    return encode_uvarint(len(data) + 1) + data


def _compact_array(items: list[bytes]) -> bytes:
    return encode_uvarint(len(items) + 1) + b"".join(items)


def _int32s(values: tuple[int, ...]) -> bytes:
    return _compact_array([_INT32.pack(v) for v in values])


def _topic_partitions(tps: TopicPartitions) -> bytes:
    return _compact_array([t.bytes + _int32s(ps) + _NO_TAGS for t, ps in tps])


def _consumer_group_value(value: ConsumerGroupValue) -> bytes:
    """The flexible v0 struct of a KIP-848 value (without the version prefix)."""
    if isinstance(value, ConsumerGroupMetadataValue):
        body = _INT32.pack(value.epoch)
    elif isinstance(value, ConsumerGroupTargetAssignmentMetadataValue):
        body = _INT32.pack(value.assignment_epoch)
    elif isinstance(value, ConsumerGroupPartitionMetadataValue):
        body = _compact_array([
            t.topic_id.bytes + _compact_string(t.topic_name) + _INT32.pack(t.num_partitions)
            + _compact_array([
                _INT32.pack(p) + _compact_array([_compact_string(r) for r in racks]) + _NO_TAGS
                for p, racks in t.partition_racks
            ]) + _NO_TAGS
            for t in value.topics
        ])
    elif isinstance(value, ConsumerGroupMemberMetadataValue):
        body = b"".join((
            _compact_string(value.instance_id), _compact_string(value.rack_id),
            _compact_string(value.client_id), _compact_string(value.client_host),
            _compact_array([_compact_string(n) for n in value.subscribed_topic_names]),
            _compact_string(value.subscribed_topic_regex),
            _INT32.pack(value.rebalance_timeout_ms), _compact_string(value.server_assignor),
        ))
    elif isinstance(value, ConsumerGroupTargetAssignmentMemberValue):
        body = _topic_partitions(value.topic_partitions)
    else:
        body = b"".join((
            _INT32.pack(value.member_epoch), _INT32.pack(value.previous_member_epoch),
            _INT8.pack(value.state), _topic_partitions(value.assigned_partitions),
            _topic_partitions(value.partitions_pending_revocation),
        ))
    return _INT16.pack(CONSUMER_GROUP_VALUE_VERSION) + body + _NO_TAGS


def _member(m: MemberMetadata) -> bytes:
    return b"".join((
        _string(m.member_id), _string(m.group_instance_id), _string(m.client_id),
        _string(m.client_host), _INT32.pack(m.rebalance_timeout),
        _INT32.pack(m.session_timeout), _bytes(m.subscription), _bytes(m.assignment),
    ))


def encode_value(value: GroupValue | None) -> bytes | None:
    """The record value: offset commit value v3, group metadata value v3 or a KIP-848
    value v0; None (a tombstone) for None."""
    if value is None:
        return None
    if not isinstance(value, (OffsetCommitValue, GroupMetadataValue)):
        return _consumer_group_value(value)
    if isinstance(value, OffsetCommitValue):
        return (_INT16.pack(OFFSET_COMMIT_VALUE_VERSION) + _INT64.pack(value.offset)
                + _INT32.pack(value.leader_epoch) + _string(value.metadata)
                + _INT64.pack(value.commit_timestamp))
    return b"".join((
        _INT16.pack(GROUP_METADATA_VALUE_VERSION), _string(value.protocol_type),
        _INT32.pack(value.generation), _string(value.protocol), _string(value.leader),
        _INT64.pack(value.current_state_timestamp), _INT32.pack(len(value.members)),
        *(_member(m) for m in value.members),
    ))


# ---------------------------------------------------------------------- decoding


class _Reader:
    """A cursor over one key or value; every read checks bounds."""

    def __init__(self, data: bytes, flexible: bool = False) -> None:
        self.data = data
        self.pos = 0
        self.flexible = flexible

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise GroupRecordError(
                f"truncated: need {n} byte(s) at position {self.pos} of {len(self.data)}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int8(self) -> int:
        return int(_INT8.unpack(self._take(1))[0])

    def int16(self) -> int:
        return int(_INT16.unpack(self._take(2))[0])

    def int32(self) -> int:
        return int(_INT32.unpack(self._take(4))[0])

    def int64(self) -> int:
        return int(_INT64.unpack(self._take(8))[0])

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise GroupRecordError(f"unsigned varint too long at position {self.pos}")

    def _length(self, wide: bool) -> int:
        """A length: compact (uvarint - 1) when flexible, else int16 or int32 (-1: null)."""
        if self.flexible:
            return self.uvarint() - 1
        return self.int32() if wide else self.int16()

    def nullable_string(self) -> str | None:
        n = self._length(False)
        if n < -1:
            raise GroupRecordError(f"negative string length {n}")
        if n == -1:
            return None
        try:
            return self._take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise GroupRecordError(f"string is not UTF-8: {e}") from e

    def string(self) -> str:
        s = self.nullable_string()
        if s is None:
            raise GroupRecordError("null where a non-nullable string is required")
        return s

    def bytes_(self) -> bytes:
        n = self._length(True)
        if n < 0:
            raise GroupRecordError(f"bad bytes length {n}")
        return self._take(n)

    def array_count(self) -> int:
        n = self._length(True)
        if n < 0:
            raise GroupRecordError(f"bad array count {n}")
        return n

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self._take(16))

    def tagged_fields(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()  # tag
                self._take(self.uvarint())


_MEMBER_KEYS: dict[int, type[ConsumerGroupMemberMetadataKey]
                  | type[ConsumerGroupTargetAssignmentMemberKey]
                  | type[ConsumerGroupCurrentMemberAssignmentKey]] = {
    CONSUMER_GROUP_MEMBER_METADATA_KEY_VERSION: ConsumerGroupMemberMetadataKey,
    CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY_VERSION: ConsumerGroupTargetAssignmentMemberKey,
    CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY_VERSION:
        ConsumerGroupCurrentMemberAssignmentKey,
}
_GROUP_KEYS: dict[int, type[ConsumerGroupMetadataKey]
                 | type[ConsumerGroupPartitionMetadataKey]
                 | type[ConsumerGroupTargetAssignmentMetadataKey]] = {
    CONSUMER_GROUP_METADATA_KEY_VERSION: ConsumerGroupMetadataKey,
    CONSUMER_GROUP_PARTITION_METADATA_KEY_VERSION: ConsumerGroupPartitionMetadataKey,
    CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY_VERSION:
        ConsumerGroupTargetAssignmentMetadataKey,
}


def decode_key(data: bytes) -> GroupKey | None:
    """The key of a ``__consumer_offsets`` record; None for a record kind we ignore
    (versions >= 9: share groups, streams groups and other coordinators' records)."""
    r = _Reader(bytes(data))
    version = r.int16()
    if version in (0, 1):
        return OffsetCommitKey(r.string(), r.string(), r.int32())
    if version == 2:
        return GroupMetadataKey(r.string())
    group_key = _GROUP_KEYS.get(version)
    if group_key is not None:
        return group_key(r.string())
    member_key = _MEMBER_KEYS.get(version)
    if member_key is not None:
        return member_key(r.string(), r.string())
    if version < 0:
        raise GroupRecordError(f"negative key version {version}")
    return None


def decode_value(key: GroupKey, data: bytes | None) -> GroupValue | None:
    """The value for ``key``'s record kind; None for a tombstone (null value)."""
    if data is None:
        return None
    r = _Reader(bytes(data))
    version = r.int16()
    if not isinstance(key, (OffsetCommitKey, GroupMetadataKey)):
        if version != CONSUMER_GROUP_VALUE_VERSION:
            raise GroupRecordError(
                f"unknown value version {version} for {type(key).__name__}")
        r.flexible = True
        return _consumer_group_value_of(key, r)
    if not 0 <= version <= MAX_VALUE_VERSION:
        raise GroupRecordError(f"unknown value version {version} for {type(key).__name__}")
    r.flexible = version >= 4
    if isinstance(key, OffsetCommitKey):
        return _offset_commit_value(r, version)
    return _group_metadata_value(r, version)


def _int32_array(r: _Reader) -> tuple[int, ...]:
    return tuple(r.int32() for _ in range(r.array_count()))


def _read_topic_partitions(r: _Reader) -> TopicPartitions:
    out = []
    for _ in range(r.array_count()):
        topic_id = r.uuid()
        partitions = _int32_array(r)
        r.tagged_fields()
        out.append((topic_id, partitions))
    return tuple(out)


def _topic_metadata(r: _Reader) -> TopicMetadata:
    topic_id = r.uuid()
    name = r.string()
    num_partitions = r.int32()
    racks = []
    for _ in range(r.array_count()):
        partition = r.int32()
        racks.append((partition, tuple(r.string() for _ in range(r.array_count()))))
        r.tagged_fields()
    r.tagged_fields()
    return TopicMetadata(topic_id, name, num_partitions, tuple(racks))


def _consumer_group_value_of(key: ConsumerGroupKey, r: _Reader) -> ConsumerGroupValue:
    value: ConsumerGroupValue
    if isinstance(key, ConsumerGroupMetadataKey):
        value = ConsumerGroupMetadataValue(r.int32())
    elif isinstance(key, ConsumerGroupTargetAssignmentMetadataKey):
        value = ConsumerGroupTargetAssignmentMetadataValue(r.int32())
    elif isinstance(key, ConsumerGroupPartitionMetadataKey):
        value = ConsumerGroupPartitionMetadataValue(
            tuple(_topic_metadata(r) for _ in range(r.array_count())))
    elif isinstance(key, ConsumerGroupMemberMetadataKey):
        value = ConsumerGroupMemberMetadataValue(
            instance_id=r.nullable_string(), rack_id=r.nullable_string(),
            client_id=r.string(), client_host=r.string(),
            subscribed_topic_names=tuple(r.string() for _ in range(r.array_count())),
            subscribed_topic_regex=r.nullable_string(), rebalance_timeout_ms=r.int32(),
            server_assignor=r.nullable_string(),
        )
    elif isinstance(key, ConsumerGroupTargetAssignmentMemberKey):
        value = ConsumerGroupTargetAssignmentMemberValue(_read_topic_partitions(r))
    else:
        value = ConsumerGroupCurrentMemberAssignmentValue(
            member_epoch=r.int32(), previous_member_epoch=r.int32(), state=r.int8(),
            assigned_partitions=_read_topic_partitions(r),
            partitions_pending_revocation=_read_topic_partitions(r),
        )
    r.tagged_fields()
    return value


def _offset_commit_value(r: _Reader, version: int) -> OffsetCommitValue:
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else -1
    metadata = r.string()
    commit_timestamp = r.int64()
    if version == 1:
        r.int64()  # expireTimestamp: per-commit retention, gone since Kafka 2.1
    r.tagged_fields()
    return OffsetCommitValue(offset, leader_epoch, metadata, commit_timestamp)


def _group_metadata_value(r: _Reader, version: int) -> GroupMetadataValue:
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    current_state_timestamp = r.int64() if version >= 2 else -1
    members = tuple(_member_metadata(r, version) for _ in range(r.array_count()))
    r.tagged_fields()
    return GroupMetadataValue(protocol_type, generation, protocol, leader,
                              current_state_timestamp, members)


def _member_metadata(r: _Reader, version: int) -> MemberMetadata:
    member_id = r.string()
    group_instance_id = r.nullable_string() if version >= 3 else None
    client_id = r.string()
    client_host = r.string()
    rebalance_timeout = r.int32() if version >= 1 else None
    session_timeout = r.int32()
    subscription = r.bytes_()
    assignment = r.bytes_()
    r.tagged_fields()
    return MemberMetadata(
        member_id, group_instance_id, client_id, client_host,
        session_timeout if rebalance_timeout is None else rebalance_timeout,
        session_timeout, subscription, assignment,
    )
