"""PURE: the share coordinator's durable state, ``__share_group_state`` (KIP-932).

A share group's per-partition delivery state (the share-partition start offset, SPSO, and
the in-flight record ranges with their delivery state and count) is owned by the
share-partition leader but made durable by the *share coordinator*, which stores it in the
internal topic ``__share_group_state``. This module is Kafka's
``org.apache.kafka.coordinator.share`` package without its runtime: the record formats
(``ShareCoordinatorRecordSerde``, ``ShareCoordinatorRecordHelpers``), the batch merge
(``PersisterStateBatchCombiner.combineStateBatches``), the coordinator partition of a key
(``ShareCoordinatorService.partitionFor``), the topic's configs
(``ShareCoordinatorService.shareGroupStateTopicConfigs``) and the shard
(``ShareCoordinatorShard``): requests in, (response, records to append) out, and
``replay`` of records to rebuild the state, whether the records were just appended or are
read back by a coordinator that takes the partition over on another broker.

Rules (each cites the Kafka method it comes from)
-------------------------------------------------
R1  A share-partition is keyed by (group id, topic id, partition); its coordinator
    partition is ``Utils.abs("groupId:topicId:partition".hashCode()) % num_partitions``
    where topicId is Kafka's ``Uuid.toString()`` (URL-safe base64, no padding) and
    ``hashCode`` is Java's ``String.hashCode`` (``SharePartitionKey.asCoordinatorKey``,
    ``ShareCoordinatorService.partitionFor``). Default 50 partitions. FindCoordinator's
    key string is read as ``SharePartitionKey.validate`` reads it (``parse_coordinator_key``).
R2  InitializeShareGroupState writes a ShareSnapshot: snapshot epoch 0 for a new key, the
    current one + 1 for an existing key; the request's state epoch and start offset,
    leader epoch -1, no batches, delivery-complete count -1, create = write timestamp =
    now. A stored state epoch *above* the request's is FENCED_STATE_EPOCH
    (``ShareCoordinatorShard.initializeState``).
R3  Write and Read need an initialized share-partition (a ShareSnapshot replayed): else
    INVALID_REQUEST "Write/Read operation on uninitialized share partition not allowed."
    (``maybeGetWriteStateError``, ``maybeGetReadStateError``).
R4  Leader-epoch fencing: a Write or Read whose leader epoch is not -1 and is below the
    highest leader epoch recorded for the key is FENCED_LEADER_EPOCH; state-epoch fencing:
    a Write whose state epoch is not -1 and is below the recorded one is
    FENCED_STATE_EPOCH. A fenced request changes nothing and appends nothing.
R5  A Write appends a ShareUpdate unless the key has had ``records_per_snapshot`` updates
    or more since its snapshot (``share.coordinator.snapshot.update.records.per.snapshot``,
    default 500), in which case it appends a ShareSnapshot with snapshot epoch + 1 holding
    the current batches combined with the request's, cut at the new start offset
    (``generateShareStateRecord``). In a record, -1 for the start offset, leader epoch,
    state epoch or delivery-complete count means "unchanged".
R6  A Read returns the stored start offset, state epoch and batches; when its leader epoch
    is not -1 and differs from the recorded one, it also appends a record carrying the new
    leader epoch (as a Write with no batches would,
    ``readStateAndMaybeUpdateLeaderEpoch``).
R7  ReadShareGroupStateSummary returns start offset, state epoch, leader epoch (and, v1,
    the delivery-complete count) and appends nothing (``readStateSummary``).
R8  DeleteShareGroupState appends a tombstone (a ShareSnapshot key, null value) for an
    initialized key and nothing for an unknown one; both succeed (``deleteState``).
R9  Every request names a topic id (else INVALID_REQUEST "The topic id cannot be null."),
    a partition >= 0 (else INVALID_REQUEST "The partition id cannot be a negative
    number.") and a partition the metadata knows (else UNKNOWN_TOPIC_OR_PARTITION).
R10 Replay (``ShareCoordinatorShard.replay``): a ShareSnapshot replaces the key's state and
    raises the recorded leader and state epochs to at least its own; its update count is
    reset to 0 only if it had reached ``records_per_snapshot``. A ShareUpdate is merged into
    the state (``merge``: batches combined at the new start offset) and bumps the update
    count (absent -> 0, else + 1); it does not carry a state epoch. A tombstone forgets the
    key entirely. Replaying every appended record in order rebuilds exactly the state the
    shard had, so a coordinator that moves to another broker replays the topic.
R11 Batches combine as ``PersisterStateBatchCombiner.combineStateBatches``: batches ending
    below the start offset are dropped and one that straddles it is cut; overlapping
    batches are split so that, on each offset, the batch with the higher (delivery count,
    delivery state) wins; contiguous or overlapping batches with the same delivery count
    and state are merged.

The per-key state machine (``KeyState``, transitions in ``TRANSITIONS``)::

    UNINITIALIZED --ShareSnapshot--> INITIALIZED --ShareSnapshot|ShareUpdate--> INITIALIZED
    INITIALIZED   --tombstone-->     UNINITIALIZED
    UNINITIALIZED --ShareUpdate-->   INITIALIZED   (Kafka's replay accepts it; never written)
    UNINITIALIZED --tombstone-->     UNINITIALIZED

Record formats
--------------
Keys and values as Kafka's coordinator runtime writes them (``CoordinatorRecordSerde``:
the key is ``MessageUtil.toCoordinatorTypePrefixedBytes`` -- the record type, the JSON's
``apiKey``, as an int16, then the key struct at version 0; the value is
``toVersionPrefixedBytes`` -- an int16 value version, 0, then the value struct). Keys are
non-flexible; values are flexible (compact arrays, tagged fields).

``ShareSnapshotKey`` (type 0) and ``ShareUpdateKey`` (type 1)::

    int16   record type        0 snapshot, 1 update
    string  GroupId            int16 length, UTF-8
    uuid    TopicId            16 bytes
    int32   Partition

``ShareSnapshotValue`` v0::

    int16   version            0
    uint16  SnapshotEpoch
    int32   StateEpoch
    int32   LeaderEpoch
    int64   StartOffset
    int64   CreateTimestamp    ms; when the state was (re)initialized
    int64   WriteTimestamp     ms; when this snapshot was written
    compact array StateBatches (uvarint count + 1), each:
        int64 FirstOffset, int64 LastOffset, int8 DeliveryState, int16 DeliveryCount,
        tagged fields (we write none)
    tagged fields: tag 0 = int32 DeliveryCompleteCount (KIP-1226), written when not -1

``ShareUpdateValue`` v0: version, uint16 SnapshotEpoch, int32 LeaderEpoch, int64
StartOffset, the same StateBatches, and the same tagged DeliveryCompleteCount.

A null value (tombstone) is always written under a ShareSnapshot key
(``newShareStateTombstoneRecord``).

Provenance of the layout: the keys and the SnapshotEpoch/StateEpoch/LeaderEpoch/
StartOffset/StateBatches fields are checked against Kafka's JSON schemas (4.0/4.1 trunk).
CreateTimestamp/WriteTimestamp (as plain v0 fields after StartOffset) and
DeliveryCompleteCount (as tag 0) are what Kafka 4.2's ``ShareCoordinatorShardTest`` sets on
these records; the 4.2 JSON itself was not available to check their exact position and
taggedness.

Decoding: malformed bytes raise ``ShareStateRecordError`` and nothing else; trailing bytes
after the fields are ignored, as Kafka's readers do. Encoding values out of their type's
range raises ``ValueError`` (our misuse).

Thread-safety: none; one shard per ``__share_group_state`` partition, driven by one task.
"""

from __future__ import annotations

import base64
import enum
import heapq
import re
import struct
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from kio.schema.delete_share_group_state.v0 import request as delete_req
from kio.schema.delete_share_group_state.v0 import response as delete_resp
from kio.schema.errors import ErrorCode
from kio.schema.initialize_share_group_state.v0 import request as init_req
from kio.schema.initialize_share_group_state.v0 import response as init_resp
from kio.schema.read_share_group_state.v0 import request as read_req
from kio.schema.read_share_group_state.v0 import response as read_resp
from kio.schema.read_share_group_state_summary.v0 import request as summary_req_v0
from kio.schema.read_share_group_state_summary.v0 import response as summary_resp_v0
from kio.schema.read_share_group_state_summary.v1 import request as summary_req_v1
from kio.schema.read_share_group_state_summary.v1 import response as summary_resp_v1
from kio.schema.write_share_group_state.v0 import request as write_req_v0
from kio.schema.write_share_group_state.v0 import response as write_resp_v0
from kio.schema.write_share_group_state.v1 import request as write_req_v1
from kio.schema.write_share_group_state.v1 import response as write_resp_v1
from kio.static.primitive import i8, i16, i32, i64

from headrace.group.hashing import java_string_hashcode, kafka_abs
from headrace.protocol.records import encode_uvarint

# ---------------------------------------------------------------------- constants

SHARE_GROUP_STATE_TOPIC = "__share_group_state"

SHARE_SNAPSHOT_RECORD_TYPE = 0  # ShareSnapshotKey.json "apiKey"
SHARE_UPDATE_RECORD_TYPE = 1  # ShareUpdateKey.json "apiKey"
VALUE_VERSION = 0  # the only value version of both records

# ShareCoordinatorConfig defaults
DEFAULT_STATE_TOPIC_NUM_PARTITIONS = 50
DEFAULT_STATE_TOPIC_REPLICATION_FACTOR = 3
DEFAULT_STATE_TOPIC_MIN_ISR = 2
DEFAULT_STATE_TOPIC_SEGMENT_BYTES = 100 * 1024 * 1024
DEFAULT_RECORDS_PER_SNAPSHOT = 500

# org.apache.kafka.server.share.persister.PartitionFactory
UNINITIALIZED_START_OFFSET = -1
DEFAULT_STATE_EPOCH = 0
UNINITIALIZED_DELIVERY_COMPLETE_COUNT = -1

_DELIVERY_COMPLETE_COUNT_TAG = 0

# ShareCoordinatorShard's messages for INVALID_REQUEST
NULL_TOPIC_ID = "The topic id cannot be null."
NEGATIVE_PARTITION_ID = "The partition id cannot be a negative number."
WRITE_UNINITIALIZED_SHARE_PARTITION = (
    "Write operation on uninitialized share partition not allowed.")
READ_UNINITIALIZED_SHARE_PARTITION = "Read operation on uninitialized share partition not allowed."

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_UINT16 = struct.Struct(">H")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
# a StateBatch's fixed part: FirstOffset, LastOffset, DeliveryState, DeliveryCount
_STATE_BATCH = struct.Struct(">qqbh")


class ShareStateRecordError(ValueError):
    """The bytes of a ``__share_group_state`` key or value are malformed."""


# ---------------------------------------------------------------------- records


@dataclass(frozen=True, order=True)
class StateBatch:
    """One range of offsets with one delivery state (0 available, 2 acknowledged,
    4 archived) and delivery count: Kafka's ``PersisterStateBatch``. The order is Kafka's
    ``compareTo``: first offset, last offset, delivery count, delivery state."""

    first_offset: int
    last_offset: int
    delivery_count: int
    delivery_state: int


@dataclass(frozen=True)
class ShareSnapshotKey:
    group_id: str
    topic_id: uuid.UUID
    partition: int


@dataclass(frozen=True)
class ShareUpdateKey:
    group_id: str
    topic_id: uuid.UUID
    partition: int


@dataclass(frozen=True)
class ShareSnapshotValue:
    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    create_timestamp: int
    write_timestamp: int
    state_batches: tuple[StateBatch, ...] = ()
    delivery_complete_count: int = UNINITIALIZED_DELIVERY_COMPLETE_COUNT


@dataclass(frozen=True)
class ShareUpdateValue:
    snapshot_epoch: int
    leader_epoch: int
    start_offset: int
    state_batches: tuple[StateBatch, ...] = ()
    delivery_complete_count: int = UNINITIALIZED_DELIVERY_COMPLETE_COUNT


ShareStateKey = ShareSnapshotKey | ShareUpdateKey
ShareStateValue = ShareSnapshotValue | ShareUpdateValue


@dataclass(frozen=True)
class ShareStateRecord:
    """One record to append to (or read from) ``__share_group_state``; ``value`` None is a
    tombstone. A snapshot value goes with a snapshot key, an update value with an update
    key."""

    key: ShareStateKey
    value: ShareStateValue | None

    def __post_init__(self) -> None:
        if self.value is not None and (
            isinstance(self.key, ShareSnapshotKey) != isinstance(self.value, ShareSnapshotValue)
        ):
            raise ValueError(f"{type(self.value).__name__} under a {type(self.key).__name__}")

    def key_bytes(self) -> bytes:
        return encode_key(self.key)

    def value_bytes(self) -> bytes | None:
        return encode_value(self.value)


def _string(s: str) -> bytes:
    data = s.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes is too long for an int16 length")
    return _INT16.pack(len(data)) + data


def encode_key(key: ShareStateKey) -> bytes:
    """The record key: int16 record type, then GroupId, TopicId, Partition."""
    record_type = (SHARE_SNAPSHOT_RECORD_TYPE if isinstance(key, ShareSnapshotKey)
                   else SHARE_UPDATE_RECORD_TYPE)
    return (_INT16.pack(record_type) + _string(key.group_id) + key.topic_id.bytes
            + _INT32.pack(key.partition))


def _batches(batches: tuple[StateBatch, ...]) -> bytes:
    return encode_uvarint(len(batches) + 1) + b"".join(
        _STATE_BATCH.pack(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
        + b"\x00"  # the batch's (empty) tagged fields
        for b in batches
    )


def _tagged_delivery_complete_count(count: int) -> bytes:
    if count == UNINITIALIZED_DELIVERY_COMPLETE_COUNT:  # the default is not written
        return b"\x00"
    return (b"\x01" + encode_uvarint(_DELIVERY_COMPLETE_COUNT_TAG)
            + encode_uvarint(_INT32.size) + _INT32.pack(count))


def encode_value(value: ShareStateValue | None) -> bytes | None:
    """The record value (int16 version 0, then the flexible struct); None for a
    tombstone."""
    if value is None:
        return None
    try:
        if isinstance(value, ShareSnapshotValue):
            head = (_UINT16.pack(value.snapshot_epoch) + _INT32.pack(value.state_epoch)
                    + _INT32.pack(value.leader_epoch) + _INT64.pack(value.start_offset)
                    + _INT64.pack(value.create_timestamp) + _INT64.pack(value.write_timestamp))
        else:
            head = (_UINT16.pack(value.snapshot_epoch) + _INT32.pack(value.leader_epoch)
                    + _INT64.pack(value.start_offset))
        body = _batches(value.state_batches)
        tags = _tagged_delivery_complete_count(value.delivery_complete_count)
        if not -(1 << 31) <= value.delivery_complete_count < (1 << 31):
            raise ValueError(f"delivery complete count {value.delivery_complete_count}")
    except struct.error as e:
        raise ValueError(f"cannot encode {value!r}: {e}") from e
    return _INT16.pack(VALUE_VERSION) + head + body + tags


class _Reader:
    """A cursor over one key or value; every read checks bounds."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ShareStateRecordError(
                f"truncated: need {n} byte(s) at position {self.pos} of {len(self.data)}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        return tuple(int(v) for v in fmt.unpack(self.take(fmt.size)))

    def one(self, fmt: struct.Struct) -> int:
        return self.unpack(fmt)[0]

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ShareStateRecordError(f"unsigned varint too long at {self.pos}")

    def string(self) -> str:
        n = self.one(_INT16)
        if n < 0:
            raise ShareStateRecordError(f"bad string length {n} (GroupId is not nullable)")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ShareStateRecordError(f"string is not UTF-8: {e}") from e

    def batches(self) -> tuple[StateBatch, ...]:
        n = self.uvarint() - 1
        if n < 0:
            raise ShareStateRecordError("null StateBatches")
        out = []
        for _ in range(n):
            first, last, state, count = self.unpack(_STATE_BATCH)
            self.skip_tagged_fields()
            out.append(StateBatch(first, last, count, state))
        return tuple(out)

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())

    def value_tagged_fields(self) -> int:
        """The struct's tagged fields; returns DeliveryCompleteCount (tag 0) or -1."""
        count = UNINITIALIZED_DELIVERY_COMPLETE_COUNT
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            data = self.take(self.uvarint())
            if tag == _DELIVERY_COMPLETE_COUNT_TAG:
                if len(data) != _INT32.size:
                    raise ShareStateRecordError(
                        f"DeliveryCompleteCount of {len(data)} bytes, not 4")
                count = int(_INT32.unpack(data)[0])
        return count


def decode_key(data: bytes) -> ShareStateKey:
    """The key of a ``__share_group_state`` record."""
    r = _Reader(bytes(data))
    record_type = r.one(_INT16)
    if record_type not in (SHARE_SNAPSHOT_RECORD_TYPE, SHARE_UPDATE_RECORD_TYPE):
        raise ShareStateRecordError(f"unknown record type {record_type}")
    group_id = r.string()
    topic_id = uuid.UUID(bytes=r.take(16))
    partition = r.one(_INT32)
    if record_type == SHARE_SNAPSHOT_RECORD_TYPE:
        return ShareSnapshotKey(group_id, topic_id, partition)
    return ShareUpdateKey(group_id, topic_id, partition)


def decode_value(key: ShareStateKey, data: bytes | None) -> ShareStateValue | None:
    """The value for ``key``'s record type; None for a tombstone."""
    if data is None:
        return None
    r = _Reader(bytes(data))
    version = r.one(_INT16)
    if version != VALUE_VERSION:
        raise ShareStateRecordError(f"unknown value version {version} for {type(key).__name__}")
    if isinstance(key, ShareSnapshotKey):
        snapshot_epoch = r.one(_UINT16)
        state_epoch, leader_epoch = r.unpack(_INT32) + r.unpack(_INT32)
        start_offset, create_ts, write_ts = r.unpack(_INT64) + r.unpack(_INT64) + r.unpack(_INT64)
        batches = r.batches()
        return ShareSnapshotValue(snapshot_epoch, state_epoch, leader_epoch, start_offset,
                                  create_ts, write_ts, batches, r.value_tagged_fields())
    snapshot_epoch = r.one(_UINT16)
    leader_epoch = r.one(_INT32)
    start_offset = r.one(_INT64)
    batches = r.batches()
    return ShareUpdateValue(snapshot_epoch, leader_epoch, start_offset, batches,
                            r.value_tagged_fields())


def decode_record(key: bytes, value: bytes | None) -> ShareStateRecord:
    """A record read back from the topic; malformed bytes raise ShareStateRecordError."""
    k = decode_key(key)
    return ShareStateRecord(k, decode_value(k, value))


# ---------------------------------------------------------------------- placement, topic


def kafka_uuid_string(topic_id: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString``: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode("ascii")


def coordinator_key(group_id: str, topic_id: uuid.UUID, partition: int) -> str:
    """``SharePartitionKey.asCoordinatorKey``: ``"groupId:topicId:partition"``."""
    return f"{group_id}:{kafka_uuid_string(topic_id)}:{partition}"


def partition_for(group_id: str, topic_id: uuid.UUID, partition: int,
                  num_partitions: int = DEFAULT_STATE_TOPIC_NUM_PARTITIONS) -> int:
    """The ``__share_group_state`` partition whose coordinator owns this share-partition
    (R1, ``ShareCoordinatorService.partitionFor``)."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, not {num_partitions}")
    key = coordinator_key(group_id, topic_id, partition)
    return kafka_abs(java_string_hashcode(key)) % num_partitions


_BASE64_UUID = re.compile(r"[A-Za-z0-9_-]{22}(==)?")
_JAVA_INT = re.compile(r"[+-]?\d+")


def parse_coordinator_key(key: str) -> tuple[str, uuid.UUID, int]:
    """FindCoordinator key type 2's key ``"groupId:topicId:partition"`` as Kafka's
    ``SharePartitionKey.validate`` / ``getInstance`` read it: Java's ``split(":")`` (trailing
    empty fields dropped) must give exactly 3 fields; the group id is ``trim()``-ed and must
    not be empty; the topic id is ``Uuid.fromString`` (URL-safe base64 of 16 bytes, padding
    optional); the partition is ``Integer.parseInt`` (a sign allowed, so -1 is a valid key).
    ValueError with Kafka's message otherwise."""
    if not key:
        raise ValueError("Share partition key cannot be empty")
    tokens = key.split(":")
    while tokens and tokens[-1] == "":
        tokens.pop()
    if len(tokens) != 3:
        raise ValueError(
            f"Invalid key format: expected - groupId:topicId:partition, found -  {key}")
    group_id = _java_trim(tokens[0])
    if not group_id:
        raise ValueError("GroupId must be alphanumeric string")
    if _BASE64_UUID.fullmatch(tokens[1]) is None:
        raise ValueError(f"Invalid topic ID: {tokens[1]}")
    topic_id = uuid.UUID(bytes=base64.urlsafe_b64decode(tokens[1][:22] + "=="))
    if _JAVA_INT.fullmatch(tokens[2]) is None:
        raise ValueError(f"Invalid partition: {tokens[2]}")
    partition = int(tokens[2])
    if not -(1 << 31) <= partition < (1 << 31):
        raise ValueError(f"Invalid partition: {tokens[2]}")
    return group_id, topic_id, partition


def _java_trim(s: str) -> str:
    """Java's ``String.trim``: every character <= U+0020 off both ends."""
    start, end = 0, len(s)
    while start < end and s[start] <= " ":
        start += 1
    while end > start and s[end - 1] <= " ":
        end -= 1
    return s[start:end]


@dataclass(frozen=True)
class ShareCoordinatorConfig:
    """The ``share.coordinator.*`` settings this module uses, with Kafka's defaults."""

    state_topic_num_partitions: int = DEFAULT_STATE_TOPIC_NUM_PARTITIONS
    state_topic_replication_factor: int = DEFAULT_STATE_TOPIC_REPLICATION_FACTOR
    state_topic_min_isr: int = DEFAULT_STATE_TOPIC_MIN_ISR
    state_topic_segment_bytes: int = DEFAULT_STATE_TOPIC_SEGMENT_BYTES
    snapshot_update_records_per_snapshot: int = DEFAULT_RECORDS_PER_SNAPSHOT

    def __post_init__(self) -> None:
        if self.state_topic_num_partitions < 1 or self.state_topic_replication_factor < 1:
            raise ValueError("partitions and replication factor must be >= 1")
        if self.state_topic_min_isr < 1 or self.state_topic_segment_bytes < 1:
            raise ValueError("min ISR and segment bytes must be >= 1")
        if not 0 <= self.snapshot_update_records_per_snapshot <= 500:
            raise ValueError("share.coordinator.snapshot.update.records.per.snapshot is 0..500")

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> ShareCoordinatorConfig:
        def get(name: str, default: int) -> int:
            return int(props.get(name, default))
        return cls(
            get("share.coordinator.state.topic.num.partitions", DEFAULT_STATE_TOPIC_NUM_PARTITIONS),
            get("share.coordinator.state.topic.replication.factor",
                DEFAULT_STATE_TOPIC_REPLICATION_FACTOR),
            get("share.coordinator.state.topic.min.isr", DEFAULT_STATE_TOPIC_MIN_ISR),
            get("share.coordinator.state.topic.segment.bytes", DEFAULT_STATE_TOPIC_SEGMENT_BYTES),
            get("share.coordinator.snapshot.update.records.per.snapshot",
                DEFAULT_RECORDS_PER_SNAPSHOT),
        )


def state_topic_configs(config: ShareCoordinatorConfig | None = None) -> dict[str, str]:
    """The topic configs ``__share_group_state`` is created with
    (``ShareCoordinatorService.shareGroupStateTopicConfigs``).

    Kafka uses ``cleanup.policy=delete`` ("as defined in KIP-932"), not compaction: each
    ShareSnapshot makes every earlier record of its key redundant, and the coordinator
    deletes the redundant prefix itself (``lastRedundantOffset`` + DeleteRecords every
    ``share.coordinator.state.topic.prune.interval.ms``), so time-based retention is off.
    """
    config = config or ShareCoordinatorConfig()
    return {
        "cleanup.policy": "delete",
        "compression.type": "producer",
        "segment.bytes": str(config.state_topic_segment_bytes),
        "min.insync.replicas": str(config.state_topic_min_isr),
        "retention.ms": "-1",
    }


# ---------------------------------------------------------------------- batch merging


def _delivery_info(b: StateBatch) -> tuple[int, int]:
    """``compareBatchDeliveryInfo``: delivery count first, then delivery state."""
    return (b.delivery_count, b.delivery_state)


def combine_state_batches(so_far: Iterable[StateBatch], new: Iterable[StateBatch],
                          start_offset: int) -> tuple[StateBatch, ...]:
    """R11: ``PersisterStateBatchCombiner.combineStateBatches`` -- the non-overlapping,
    sorted batches of ``so_far`` and ``new`` at ``start_offset`` (-1: no cut)."""
    batches = [*so_far, *new]
    if start_offset != -1:  # pruneBatches
        pruned = []
        for b in batches:
            if b.last_offset < start_offset:
                continue
            pruned.append(b if b.first_offset >= start_offset
                          else replace(b, first_offset=start_offset))
        batches = pruned
    if len(batches) < 2:
        return tuple(batches)
    # Kafka's TreeSet as a heap and a set of its members: the smallest batch and the next
    # one are Kafka's first merge-candidate pair once the batches before it are settled
    # (``getMergeCandidatePair``); a settled batch moves out for good. O(n log n) per
    # resolved pair: a list re-sorted per pair was quadratic (a request of 16,000
    # overlapping batches held the event loop for minutes).
    pending = sorted(set(batches))  # sorted: a heap already
    members = set(pending)
    out: list[StateBatch] = []
    while pending:
        prev = heapq.heappop(pending)
        members.discard(prev)
        if not pending or not _mergeable(prev, pending[0]):
            out.append(prev)
            continue
        cand = heapq.heappop(pending)
        members.discard(cand)
        for b in _resolve(prev, cand):
            if b not in members:
                members.add(b)
                heapq.heappush(pending, b)
    return tuple(out)


def _mergeable(prev: StateBatch, cand: StateBatch) -> bool:
    """``getMergeCandidatePair``'s test of two neighbours (prev sorts before cand): they
    overlap, or are contiguous with the same delivery count and state."""
    return cand.first_offset <= prev.last_offset or (
        prev.last_offset + 1 == cand.first_offset
        and _delivery_info(prev) == _delivery_info(cand))


def _resolve(prev: StateBatch, cand: StateBatch) -> list[StateBatch]:
    """The batches that replace an overlapping pair (prev sorts before cand)."""
    if _delivery_info(cand) == _delivery_info(prev):  # handleSameStateMerge
        return [replace(prev, last_offset=max(prev.last_offset, cand.last_offset))]
    cand_wins = _delivery_info(cand) >= _delivery_info(prev)
    if cand.first_offset == prev.first_offset:
        if cand.last_offset == prev.last_offset or cand_wins:
            return [cand]
        return [prev, replace(cand, first_offset=prev.last_offset + 1)]
    head = replace(prev, last_offset=cand.first_offset - 1)
    if cand.last_offset < prev.last_offset:  # prev swallows cand
        if not cand_wins:
            return [prev]
        return [head, cand, replace(prev, first_offset=cand.last_offset + 1)]
    if cand.last_offset == prev.last_offset:
        return [prev] if not cand_wins else [head, cand]
    if not cand_wins:  # cand reaches further
        return [prev, replace(cand, first_offset=prev.last_offset + 1)]
    return [head, cand]


# ---------------------------------------------------------------------- shard state


@dataclass(frozen=True)
class ShareGroupOffset:
    """The durable state of one share-partition (Kafka's ``ShareGroupOffset``)."""

    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    create_timestamp: int = 0
    write_timestamp: int = 0
    state_batches: tuple[StateBatch, ...] = ()
    delivery_complete_count: int = UNINITIALIZED_DELIVERY_COMPLETE_COUNT


class KeyStatus(enum.Enum):
    UNINITIALIZED = "uninitialized"
    INITIALIZED = "initialized"


class RecordKind(enum.Enum):
    SHARE_SNAPSHOT = "ShareSnapshot"
    SHARE_UPDATE = "ShareUpdate"
    TOMBSTONE = "tombstone"


# (status before, record kind) -> status after: every pair is legal for replay
TRANSITIONS: dict[tuple[KeyStatus, RecordKind], KeyStatus] = {
    (KeyStatus.UNINITIALIZED, RecordKind.SHARE_SNAPSHOT): KeyStatus.INITIALIZED,
    (KeyStatus.INITIALIZED, RecordKind.SHARE_SNAPSHOT): KeyStatus.INITIALIZED,
    (KeyStatus.UNINITIALIZED, RecordKind.SHARE_UPDATE): KeyStatus.INITIALIZED,
    (KeyStatus.INITIALIZED, RecordKind.SHARE_UPDATE): KeyStatus.INITIALIZED,
    (KeyStatus.UNINITIALIZED, RecordKind.TOMBSTONE): KeyStatus.UNINITIALIZED,
    (KeyStatus.INITIALIZED, RecordKind.TOMBSTONE): KeyStatus.UNINITIALIZED,
}


@dataclass(frozen=True)
class KeyState:
    """Everything the shard keeps for one key: Kafka's ``shareStateMap``,
    ``leaderEpochMap``, ``stateEpochMap`` and ``snapshotUpdateCount`` entries."""

    offset: ShareGroupOffset
    leader_epoch: int  # the highest recorded (fencing)
    state_epoch: int | None  # the highest recorded by a snapshot (fencing)
    update_count: int | None  # ShareUpdates since the last counted snapshot


SharePartitionKey = tuple[str, uuid.UUID, int]  # (group id, topic id, partition)


def record_kind(record: ShareStateRecord) -> RecordKind:
    if record.value is None:
        return RecordKind.TOMBSTONE
    if isinstance(record.value, ShareSnapshotValue):
        return RecordKind.SHARE_SNAPSHOT
    return RecordKind.SHARE_UPDATE


def apply_record(state: KeyState | None, record: ShareStateRecord,
                 records_per_snapshot: int) -> KeyState | None:
    """R10: the key's state after ``record`` (``ShareCoordinatorShard.replay``)."""
    value = record.value
    if value is None:
        return None
    if isinstance(value, ShareSnapshotValue):
        offset = ShareGroupOffset(
            value.snapshot_epoch, value.state_epoch, value.leader_epoch, value.start_offset,
            value.create_timestamp, value.write_timestamp, value.state_batches,
            value.delivery_complete_count)
        count = None if state is None else state.update_count
        if count is not None and count >= records_per_snapshot:
            count = 0
        return KeyState(
            offset,
            value.leader_epoch if state is None else max(state.leader_epoch, value.leader_epoch),
            value.state_epoch if state is None or state.state_epoch is None
            else max(state.state_epoch, value.state_epoch),
            count,
        )
    if state is None:
        offset = ShareGroupOffset(
            value.snapshot_epoch, DEFAULT_STATE_EPOCH, value.leader_epoch, value.start_offset,
            state_batches=value.state_batches,
            delivery_complete_count=value.delivery_complete_count)
        return KeyState(offset, value.leader_epoch, None, 0)
    return KeyState(
        _merge(state.offset, value),
        max(state.leader_epoch, value.leader_epoch),
        state.state_epoch,
        0 if state.update_count is None else state.update_count + 1,
    )


def _keep(new: int, old: int) -> int:
    return old if new == -1 else new


def _merge(so_far: ShareGroupOffset, update: ShareUpdateValue) -> ShareGroupOffset:
    """``ShareCoordinatorShard.merge``: an update applied to the state."""
    start_offset = _keep(update.start_offset, so_far.start_offset)
    return replace(
        so_far,
        start_offset=start_offset,
        leader_epoch=_keep(update.leader_epoch, so_far.leader_epoch),
        delivery_complete_count=_keep(update.delivery_complete_count,
                                      so_far.delivery_complete_count),
        state_batches=combine_state_batches(so_far.state_batches, update.state_batches,
                                            start_offset),
    )


# ---------------------------------------------------------------------- the shard

R = TypeVar("R")


@dataclass(frozen=True)
class ShardResult(Generic[R]):
    """A request's response and the records to append for it (Kafka's
    ``CoordinatorResult``). The shard's state changes only when the records are replayed
    (after they are appended), as in Kafka's coordinator runtime."""

    response: R
    records: tuple[ShareStateRecord, ...] = field(default=())


WriteRequest = write_req_v0.WriteShareGroupStateRequest | write_req_v1.WriteShareGroupStateRequest
WriteResponse = (write_resp_v0.WriteShareGroupStateResponse
                 | write_resp_v1.WriteShareGroupStateResponse)
SummaryRequest = (summary_req_v0.ReadShareGroupStateSummaryRequest
                  | summary_req_v1.ReadShareGroupStateSummaryRequest)
SummaryResponse = (summary_resp_v0.ReadShareGroupStateSummaryResponse
                   | summary_resp_v1.ReadShareGroupStateSummaryResponse)


@dataclass(frozen=True)
class _Fail:
    error: ErrorCode
    message: str | None = None

    @property
    def error_message(self) -> str:
        return self.message if self.message is not None else _ERROR_MESSAGES[self.error]


def _code(fail: _Fail | None) -> ErrorCode:
    return ErrorCode.none if fail is None else fail.error


def _message(fail: _Fail | None) -> str | None:
    return None if fail is None else fail.error_message


_ERROR_MESSAGES = {
    ErrorCode.fenced_leader_epoch: "The leader epoch in the request is older than the epoch "
                                   "on the broker.",
    ErrorCode.fenced_state_epoch: "The share coordinator rejected the request because the "
                                  "share-group state epoch did not match.",
    ErrorCode.unknown_topic_or_partition: "This server does not host this topic-partition.",
    ErrorCode.invalid_request: "This most likely occurs because of a request being malformed "
                               "by the client library or the message was sent to an "
                               "incompatible broker. See the broker logs for more details.",
}


class ShareCoordinatorShard:
    """The state of one ``__share_group_state`` partition and the requests it serves.

    Requests are kio request objects (versions as Kafka 4.2 sends them: Initialize,
    Read and Delete v0, Write v0/v1, ReadSummary v0/v1); each method returns a
    ``ShardResult`` with the response at the request's version. Partitions of one request
    are handled in order, each seeing the records generated for the ones before it (as
    Kafka's service, which splits a request into one write operation per key). Nothing
    changes until ``replay`` is called with the records, in order, once appended.

    ``topics`` is the metadata the shard checks partitions against (R9): topic id ->
    partition count; None means no metadata yet (every request is
    UNKNOWN_TOPIC_OR_PARTITION).
    """

    def __init__(self, config: ShareCoordinatorConfig | None = None,
                 topics: Mapping[uuid.UUID, int] | None = None) -> None:
        self.config = config or ShareCoordinatorConfig()
        self._topics = dict(topics) if topics is not None else None
        self._keys: dict[SharePartitionKey, KeyState] = {}

    # -- metadata and state

    def on_metadata_update(self, topics: Mapping[uuid.UUID, int] | None) -> None:
        """``onMetadataUpdate``: the topics (id -> partition count) now known."""
        self._topics = dict(topics) if topics is not None else None

    def key_state(self, group_id: str, topic_id: uuid.UUID, partition: int) -> KeyState | None:
        return self._keys.get((group_id, topic_id, partition))

    def status(self, group_id: str, topic_id: uuid.UUID, partition: int) -> KeyStatus:
        return (KeyStatus.INITIALIZED if (group_id, topic_id, partition) in self._keys
                else KeyStatus.UNINITIALIZED)

    def snapshot(self) -> dict[SharePartitionKey, KeyState]:
        """A copy of every key's state (for tests and for comparing replicas)."""
        return dict(self._keys)

    def replay(self, record: ShareStateRecord) -> None:
        """R10: apply one appended (or loaded) record."""
        key = (record.key.group_id, record.key.topic_id, record.key.partition)
        before = self._keys.get(key)
        status = KeyStatus.UNINITIALIZED if before is None else KeyStatus.INITIALIZED
        expected = TRANSITIONS[(status, record_kind(record))]
        after = apply_record(before, record, self.config.snapshot_update_records_per_snapshot)
        assert (after is not None) == (expected is KeyStatus.INITIALIZED)
        if after is None:
            self._keys.pop(key, None)
        else:
            self._keys[key] = after

    def replay_bytes(self, key: bytes, value: bytes | None) -> None:
        """Replay a record read from the topic (raises ShareStateRecordError for bad
        bytes, changing nothing)."""
        self.replay(decode_record(key, value))

    # -- request helpers

    def _check(self, topic_id: uuid.UUID | None, partition: int) -> _Fail | None:
        if topic_id is None:
            return _Fail(ErrorCode.invalid_request, NULL_TOPIC_ID)
        if partition < 0:
            return _Fail(ErrorCode.invalid_request, NEGATIVE_PARTITION_ID)
        return None

    def _known(self, topic_id: uuid.UUID, partition: int) -> _Fail | None:
        if self._topics is None or partition >= self._topics.get(topic_id, 0):
            return _Fail(ErrorCode.unknown_topic_or_partition)
        return None

    def _state_record(self, state: KeyState, key: SharePartitionKey, *, leader_epoch: int,
                      state_epoch: int, start_offset: int, delivery_complete_count: int,
                      batches: tuple[StateBatch, ...], now_ms: int) -> ShareStateRecord:
        """R5: ``generateShareStateRecord`` for an initialized key."""
        current = state.offset
        group_id, topic_id, partition = key
        if (state.update_count or 0) >= self.config.snapshot_update_records_per_snapshot:
            new_start = _keep(start_offset, current.start_offset)
            return ShareStateRecord(
                ShareSnapshotKey(group_id, topic_id, partition),
                ShareSnapshotValue(
                    snapshot_epoch=current.snapshot_epoch + 1,
                    state_epoch=_keep(state_epoch, current.state_epoch),
                    leader_epoch=_keep(leader_epoch, current.leader_epoch),
                    start_offset=new_start,
                    create_timestamp=current.create_timestamp,
                    write_timestamp=now_ms,
                    state_batches=combine_state_batches(current.state_batches, batches,
                                                        new_start),
                    delivery_complete_count=_keep(delivery_complete_count,
                                                  current.delivery_complete_count),
                ))
        return ShareStateRecord(
            ShareUpdateKey(group_id, topic_id, partition),
            ShareUpdateValue(
                snapshot_epoch=current.snapshot_epoch,
                leader_epoch=leader_epoch,
                start_offset=start_offset,
                state_batches=combine_state_batches((), batches, start_offset),
                delivery_complete_count=delivery_complete_count,
            ))

    # -- requests

    def initialize_state(self, request: init_req.InitializeShareGroupStateRequest,
                         now_ms: int) -> ShardResult[init_resp.InitializeShareGroupStateResponse]:
        """R2: InitializeShareGroupState (83)."""
        overlay: dict[SharePartitionKey, KeyState | None] = {}
        records: list[ShareStateRecord] = []
        results = []
        for topic in request.topics:
            partitions = []
            for p in topic.partitions:
                fail = self._check(topic.topic_id, p.partition)
                if fail is None and topic.topic_id is not None:
                    key = (request.group_id, topic.topic_id, int(p.partition))
                    state = self._current(overlay, key)
                    if (state is not None and state.state_epoch is not None
                            and state.state_epoch > p.state_epoch):
                        fail = _Fail(ErrorCode.fenced_state_epoch)
                    else:
                        fail = self._known(topic.topic_id, p.partition)
                    if fail is None:
                        record = ShareStateRecord(
                            ShareSnapshotKey(*key),
                            ShareSnapshotValue(
                                snapshot_epoch=0 if state is None
                                else state.offset.snapshot_epoch + 1,
                                state_epoch=p.state_epoch, leader_epoch=-1,
                                start_offset=p.start_offset, create_timestamp=now_ms,
                                write_timestamp=now_ms))
                        self._emit(overlay, records, key, state, record)
                partitions.append(init_resp.PartitionResult(
                    partition=p.partition,
                    error_code=ErrorCode.none if fail is None else fail.error,
                    error_message=None if fail is None else fail.error_message))
            results.append(init_resp.InitializeStateResult(
                topic_id=topic.topic_id, partitions=tuple(partitions)))
        return ShardResult(init_resp.InitializeShareGroupStateResponse(results=tuple(results)),
                           tuple(records))

    def write_state(self, request: WriteRequest, now_ms: int) -> ShardResult[WriteResponse]:
        """R3-R5: WriteShareGroupState (85), v0 or v1 (v1 adds the delivery-complete
        count)."""
        overlay: dict[SharePartitionKey, KeyState | None] = {}
        records: list[ShareStateRecord] = []
        outcome: list[tuple[uuid.UUID | None, list[tuple[int, _Fail | None]]]] = []
        for topic in request.topics:
            partitions: list[tuple[int, _Fail | None]] = []
            for p in topic.partitions:
                fail = self._check(topic.topic_id, p.partition)
                if fail is None and topic.topic_id is not None:
                    key = (request.group_id, topic.topic_id, int(p.partition))
                    state = self._current(overlay, key)
                    if state is None:
                        fail = _Fail(ErrorCode.invalid_request,
                                     WRITE_UNINITIALIZED_SHARE_PARTITION)
                    elif p.leader_epoch != -1 and state.leader_epoch > p.leader_epoch:
                        fail = _Fail(ErrorCode.fenced_leader_epoch)
                    elif (p.state_epoch != -1 and state.state_epoch is not None
                          and state.state_epoch > p.state_epoch):
                        fail = _Fail(ErrorCode.fenced_state_epoch)
                    else:
                        fail = self._known(topic.topic_id, p.partition)
                    if fail is None and state is not None:
                        dcc = (p.delivery_complete_count
                               if isinstance(p, write_req_v1.PartitionData)
                               else UNINITIALIZED_DELIVERY_COMPLETE_COUNT)
                        record = self._state_record(
                            state, key, leader_epoch=p.leader_epoch, state_epoch=p.state_epoch,
                            start_offset=p.start_offset, delivery_complete_count=dcc,
                            batches=tuple(StateBatch(b.first_offset, b.last_offset,
                                                     b.delivery_count, b.delivery_state)
                                          for b in p.state_batches),
                            now_ms=now_ms)
                        self._emit(overlay, records, key, state, record)
                partitions.append((p.partition, fail))
            outcome.append((topic.topic_id, partitions))
        response: WriteResponse
        if isinstance(request, write_req_v1.WriteShareGroupStateRequest):
            response = write_resp_v1.WriteShareGroupStateResponse(results=tuple(
                write_resp_v1.WriteStateResult(topic_id=topic_id, partitions=tuple(
                    write_resp_v1.PartitionResult(
                        partition=i32(partition), error_code=_code(fail),
                        error_message=_message(fail))
                    for partition, fail in partitions))
                for topic_id, partitions in outcome))
        else:
            response = write_resp_v0.WriteShareGroupStateResponse(results=tuple(
                write_resp_v0.WriteStateResult(topic_id=topic_id, partitions=tuple(
                    write_resp_v0.PartitionResult(
                        partition=i32(partition), error_code=_code(fail),
                        error_message=_message(fail))
                    for partition, fail in partitions))
                for topic_id, partitions in outcome))
        return ShardResult(response, tuple(records))

    def read_state_and_maybe_update_leader_epoch(
        self, request: read_req.ReadShareGroupStateRequest, now_ms: int,
    ) -> ShardResult[read_resp.ReadShareGroupStateResponse]:
        """R3, R4, R6: ReadShareGroupState (84)."""
        overlay: dict[SharePartitionKey, KeyState | None] = {}
        records: list[ShareStateRecord] = []
        results = []
        for topic in request.topics:
            partitions = []
            for p in topic.partitions:
                fail = self._check(topic.topic_id, p.partition)
                state: KeyState | None = None
                if fail is None and topic.topic_id is not None:
                    key = (request.group_id, topic.topic_id, int(p.partition))
                    state = self._current(overlay, key)
                    if state is None:
                        fail = _Fail(ErrorCode.invalid_request, READ_UNINITIALIZED_SHARE_PARTITION)
                    elif p.leader_epoch != -1 and state.leader_epoch > p.leader_epoch:
                        fail = _Fail(ErrorCode.fenced_leader_epoch)
                    else:
                        fail = self._known(topic.topic_id, p.partition)
                    if (fail is None and state is not None and p.leader_epoch != -1
                            and p.leader_epoch != state.leader_epoch):
                        record = self._state_record(
                            state, key, leader_epoch=p.leader_epoch,
                            state_epoch=state.offset.state_epoch,
                            start_offset=state.offset.start_offset,
                            delivery_complete_count=state.offset.delivery_complete_count,
                            batches=(), now_ms=now_ms)
                        self._emit(overlay, records, key, state, record)
                if fail is None and state is not None:
                    offset = state.offset
                    partitions.append(read_resp.PartitionResult(
                        partition=p.partition, error_code=ErrorCode.none,
                        state_epoch=i32(offset.state_epoch), start_offset=i64(offset.start_offset),
                        state_batches=tuple(read_resp.StateBatch(
                            first_offset=i64(b.first_offset), last_offset=i64(b.last_offset),
                            delivery_state=i8(b.delivery_state),
                            delivery_count=i16(b.delivery_count))
                            for b in offset.state_batches)))
                else:
                    assert fail is not None
                    partitions.append(read_resp.PartitionResult(
                        partition=p.partition, error_code=fail.error,
                        error_message=fail.error_message, state_epoch=i32(0),
                        start_offset=i64(0), state_batches=()))
            results.append(read_resp.ReadStateResult(
                topic_id=topic.topic_id, partitions=tuple(partitions)))
        return ShardResult(read_resp.ReadShareGroupStateResponse(results=tuple(results)),
                           tuple(records))

    def read_state_summary(self, request: SummaryRequest) -> ShardResult[SummaryResponse]:
        """R7: ReadShareGroupStateSummary (87), v0 or v1; appends nothing."""
        uninitialized = ShareGroupOffset(0, 0, 0, 0)
        outcome: list[tuple[uuid.UUID | None, list[tuple[int, _Fail | None, ShareGroupOffset]]]]
        outcome = []
        for topic in request.topics:
            partitions: list[tuple[int, _Fail | None, ShareGroupOffset]] = []
            for p in topic.partitions:
                fail = self._check(topic.topic_id, p.partition)
                offset = uninitialized
                if fail is None and topic.topic_id is not None:
                    state = self._keys.get((request.group_id, topic.topic_id, int(p.partition)))
                    if state is None:
                        fail = _Fail(ErrorCode.invalid_request, READ_UNINITIALIZED_SHARE_PARTITION)
                    else:
                        fail = self._known(topic.topic_id, p.partition)
                        offset = state.offset if fail is None else uninitialized
                partitions.append((p.partition, fail, offset))
            outcome.append((topic.topic_id, partitions))
        response: SummaryResponse
        if isinstance(request, summary_req_v1.ReadShareGroupStateSummaryRequest):
            response = summary_resp_v1.ReadShareGroupStateSummaryResponse(results=tuple(
                summary_resp_v1.ReadStateSummaryResult(topic_id=topic_id, partitions=tuple(
                    summary_resp_v1.PartitionResult(
                        partition=i32(partition), error_code=_code(fail),
                        error_message=_message(fail), state_epoch=i32(o.state_epoch),
                        leader_epoch=i32(o.leader_epoch), start_offset=i64(o.start_offset),
                        delivery_complete_count=i32(
                            o.delivery_complete_count if fail is None
                            else UNINITIALIZED_DELIVERY_COMPLETE_COUNT))
                    for partition, fail, o in partitions))
                for topic_id, partitions in outcome))
        else:
            response = summary_resp_v0.ReadShareGroupStateSummaryResponse(results=tuple(
                summary_resp_v0.ReadStateSummaryResult(topic_id=topic_id, partitions=tuple(
                    summary_resp_v0.PartitionResult(
                        partition=i32(partition), error_code=_code(fail),
                        error_message=_message(fail), state_epoch=i32(o.state_epoch),
                        leader_epoch=i32(o.leader_epoch), start_offset=i64(o.start_offset))
                    for partition, fail, o in partitions))
                for topic_id, partitions in outcome))
        return ShardResult(response)

    def delete_state(self, request: delete_req.DeleteShareGroupStateRequest,
                     ) -> ShardResult[delete_resp.DeleteShareGroupStateResponse]:
        """R8: DeleteShareGroupState (86)."""
        overlay: dict[SharePartitionKey, KeyState | None] = {}
        records: list[ShareStateRecord] = []
        results = []
        for topic in request.topics:
            partitions = []
            for p in topic.partitions:
                fail = self._check(topic.topic_id, p.partition)
                if fail is None and topic.topic_id is not None:
                    fail = self._known(topic.topic_id, p.partition)
                    key = (request.group_id, topic.topic_id, int(p.partition))
                    state = self._current(overlay, key)
                    if fail is None and state is not None:
                        self._emit(overlay, records, key, state,
                                   ShareStateRecord(ShareSnapshotKey(*key), None))
                partitions.append(delete_resp.PartitionResult(
                    partition=p.partition,
                    error_code=ErrorCode.none if fail is None else fail.error,
                    error_message=None if fail is None else fail.error_message))
            results.append(delete_resp.DeleteStateResult(
                topic_id=topic.topic_id, partitions=tuple(partitions)))
        return ShardResult(delete_resp.DeleteShareGroupStateResponse(results=tuple(results)),
                           tuple(records))

    # -- the overlay: state as if this request's earlier records were already replayed

    def _current(self, overlay: dict[SharePartitionKey, KeyState | None],
                 key: SharePartitionKey) -> KeyState | None:
        return overlay[key] if key in overlay else self._keys.get(key)

    def _emit(self, overlay: dict[SharePartitionKey, KeyState | None],
              records: list[ShareStateRecord], key: SharePartitionKey,
              state: KeyState | None, record: ShareStateRecord) -> None:
        records.append(record)
        overlay[key] = apply_record(state, record, self.config.snapshot_update_records_per_snapshot)
