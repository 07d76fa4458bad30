"""PURE: the keys and values of ``__consumer_offsets`` records, in Kafka's own formats.

Kafka's group coordinator stores two record kinds in ``__consumer_offsets`` (R-GRP-6), each
key and value starting with an int16 version. We write exactly what Kafka 2.3+ writes
(offset commit key v1 / value v3, group metadata key v2 / value v3), so tools that read
the topic (Burrow, ``kafka-console-consumer --formatter ...GroupMetadataManager$...``)
decode them; we read every version Kafka has ever written (values v0..v4).

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

Versions >= 3 are KIP-848 / share-group / transaction records: ``decode_key`` returns None
for them (the classic coordinator ignores them).

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

Trailing bytes after the fields are ignored (Kafka's readers do the same for fields added
later). Errors: malformed bytes (someone else's, or a corrupt log) raise ``GroupRecordError``;
encoding values out of their type's range raises ``ValueError`` (our misuse).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3
MAX_VALUE_VERSION = 4

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


GroupKey = OffsetCommitKey | GroupMetadataKey
GroupValue = OffsetCommitValue | GroupMetadataValue


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


def encode_key(key: OffsetCommitKey | GroupMetadataKey) -> bytes:
    """The record key: offset commit key v1 or group metadata key v2."""
    if isinstance(key, OffsetCommitKey):
        return (_INT16.pack(OFFSET_COMMIT_KEY_VERSION) + _string(key.group)
                + _string(key.topic) + _INT32.pack(key.partition))
    return _INT16.pack(GROUP_METADATA_KEY_VERSION) + _string(key.group)


def _member(m: MemberMetadata) -> bytes:
    return b"".join((
        _string(m.member_id), _string(m.group_instance_id), _string(m.client_id),
        _string(m.client_host), _INT32.pack(m.rebalance_timeout),
        _INT32.pack(m.session_timeout), _bytes(m.subscription), _bytes(m.assignment),
    ))


def encode_value(value: OffsetCommitValue | GroupMetadataValue | None) -> bytes | None:
    """The record value: offset commit value v3 or group metadata value v3; None (a
    tombstone) for None."""
    if value is None:
        return None
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

    def tagged_fields(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()  # tag
                self._take(self.uvarint())


def decode_key(data: bytes) -> OffsetCommitKey | GroupMetadataKey | None:
    """The key of a ``__consumer_offsets`` record; None for a record kind we ignore
    (version >= 3: KIP-848 and other coordinators' records)."""
    r = _Reader(bytes(data))
    version = r.int16()
    if version in (0, 1):
        return OffsetCommitKey(r.string(), r.string(), r.int32())
    if version == 2:
        return GroupMetadataKey(r.string())
    if version < 0:
        raise GroupRecordError(f"negative key version {version}")
    return None


def decode_value(
    key: OffsetCommitKey | GroupMetadataKey, data: bytes | None
) -> OffsetCommitValue | GroupMetadataValue | None:
    """The value for ``key``'s record kind; None for a tombstone (null value)."""
    if data is None:
        return None
    r = _Reader(bytes(data))
    version = r.int16()
    if not 0 <= version <= MAX_VALUE_VERSION:
        raise GroupRecordError(f"unknown value version {version} for {type(key).__name__}")
    r.flexible = version >= 4
    if isinstance(key, OffsetCommitKey):
        return _offset_commit_value(r, version)
    return _group_metadata_value(r, version)


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
