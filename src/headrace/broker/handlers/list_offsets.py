"""ListOffsets (2): earliest (-2), latest (-1), max timestamp (-3), by timestamp (R-PROTO-5).

"latest" is the high watermark for read_uncommitted and the last stable offset for
read_committed (librdkafka's default); a lookup by timestamp uses the time index and only
returns offsets a consumer may read.

v0 (removed in Kafka 4.0, KIP-896; sarama-based tools such as Burrow still send it) is
answered as Kafka 3.9's ``KafkaApis.handleListOffsetRequestV0`` does: a list of up to
``max_num_offsets`` offsets, newest first, from ``UnifiedLog.legacyFetchOffsetsBefore``
(segment base offsets by the segment file's modification time, plus the log end offset
"now"), of which a consumer sees none above the high watermark (``Partition
.legacyFetchOffsetsForTimestamp``); timestamps below -2 are UNSUPPORTED_VERSION. Its bytes
are hand-coded (``protocol/legacy.py``: kio has no v0 schema).

Authorization, every version: a topic the principal may not DESCRIBE is
TOPIC_AUTHORIZATION_FAILED for each requested partition (v0: with no offsets).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.fetch import READ_COMMITTED, _epoch_error
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.security import DESCRIBE, TOPIC
from headrace.log.errors import LogError
from headrace.log.partition_log import PartitionLog
from headrace.protocol.codec import EncodedBody
from headrace.protocol.legacy import (
    ListOffsetsPartitionResponseV0,
    ListOffsetsRequestV0,
    encode_list_offsets_v0,
)

if TYPE_CHECKING:
    from headrace.broker.server import Broker

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5
CONSUMER_REPLICA_ID, DEBUGGING_REPLICA_ID = -1, -2


def _lookup(broker: Broker, tp: TopicPartition, p: Any, isolation: int) -> dict[str, Any]:
    index = int(p.partition_index)
    entry: dict[str, Any] = {"partition_index": index, "error_code": 0, "timestamp": -1,
                             "offset": -1, "leader_epoch": -1}
    partition = broker.replicas.get(tp)
    if partition is None:
        known = broker.metadata.topic(tp.topic)
        entry["error_code"] = (
            ErrorCode.not_leader_or_follower
            if known is not None and 0 <= index < len(known.partitions)
            else ErrorCode.unknown_topic_or_partition
        )
        return entry
    if not partition.is_leader(broker.node_id):
        entry["error_code"] = ErrorCode.not_leader_or_follower
        return entry
    err = _epoch_error(int(getattr(p, "current_leader_epoch", -1)), partition.leader_epoch)
    if err is not None:
        entry["error_code"] = err
        return entry
    plog = partition.log
    if plog.offline is not None:  # an I/O error took it offline (Kafka: its log dir)
        entry["error_code"] = ErrorCode.kafka_storage_error
        return entry
    try:
        _find(plog, int(p.timestamp), isolation, entry)
    except LogError as e:  # went offline during the lookup
        entry.update(error_code=e.error_code, offset=-1, timestamp=-1)
        return entry
    entry["leader_epoch"] = partition.leader_epoch
    return entry


def _find(plog: PartitionLog, ts: int, isolation: int, entry: dict[str, Any]) -> None:
    visible = plog.last_stable_offset if isolation == READ_COMMITTED else plog.high_watermark
    if ts == LATEST:
        entry["offset"] = visible
    elif ts in (EARLIEST, EARLIEST_LOCAL):
        entry["offset"] = plog.log_start_offset
    elif ts == LATEST_TIERED:
        entry["offset"] = plog.log_start_offset - 1
    elif ts == MAX_TIMESTAMP:
        found = plog.max_timestamp()
        if found is not None and found[0] < visible:
            entry["offset"], entry["timestamp"] = found
    elif ts >= 0:
        found = plog.offset_for_timestamp(ts)
        if found is not None and found[0] < visible:
            entry["offset"], entry["timestamp"] = found
    else:
        entry["error_code"] = ErrorCode.invalid_request


@handler(2, "ListOffsets", 0, 10)
async def handle_list_offsets(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    if isinstance(req, ListOffsetsRequestV0):
        return _handle_v0(broker, ctx, req)
    isolation = int(getattr(req, "isolation_level", 0))
    topics = []
    # Kafka: DESCRIBE on each topic, else TOPIC_AUTHORIZATION_FAILED per partition
    described = broker.security.allowed_names(ctx, DESCRIBE, TOPIC, (t.name for t in req.topics))
    for t in req.topics:
        if t.name not in described:
            topics.append({"name": t.name, "partitions": [
                {"partition_index": p.partition_index, "timestamp": -1, "offset": -1,
                 "leader_epoch": -1, "error_code": ErrorCode.topic_authorization_failed}
                for p in t.partitions]})
            continue
        topics.append(
            {
                "name": t.name,
                "partitions": [
                    _lookup(broker, TopicPartition(t.name, int(p.partition_index)), p, isolation)
                    for p in t.partitions
                ],
            }
        )
    return ctx.response({"throttle_time": 0, "topics": topics})


# ---------------------------------------------------------------------------------- v0


def legacy_offsets_before(entries: list[tuple[int, int]], timestamp: int,
                          max_num_offsets: int) -> list[int]:
    """PURE: Kafka 3.9's ``UnifiedLog.legacyFetchOffsetsBefore`` over ``entries``, the
    (offset, last modified ms) of each segment (its base offset, at least the log start
    offset) and, when the active segment holds anything, (log end offset, now): for
    LATEST all of them from the last, for EARLIEST the first, otherwise those from the
    last entry modified at or before ``timestamp``; at most ``max_num_offsets`` of them,
    newest first. A negative ``max_num_offsets`` is ``ValueError`` (Kafka fails the
    partition with UNKNOWN_SERVER_ERROR)."""
    if timestamp == LATEST:
        start = len(entries) - 1
    elif timestamp == EARLIEST:
        start = 0
    else:
        start = len(entries) - 1
        while start >= 0 and entries[start][1] > timestamp:
            start -= 1
    size = min(max_num_offsets, start + 1)
    if size < 0:
        raise ValueError(f"max_num_offsets {max_num_offsets}")
    return sorted((entries[start - j][0] for j in range(size)), reverse=True)


def _segment_times(plog: PartitionLog, now_ms: int) -> list[tuple[int, int]]:
    """(offset, last modified ms) per segment, as ``legacyFetchOffsetsBefore`` builds them
    (a file gone meanwhile counts as modified at 0, as Java's ``File.lastModified``)."""
    entries = []
    start = plog.log_start_offset
    segments = plog.segments
    for seg in segments:
        try:
            mtime_ms = os.stat(seg.log_path).st_mtime_ns // 1_000_000
        except OSError:
            mtime_ms = 0
        entries.append((max(seg.base_offset, start), mtime_ms))
    if segments and segments[-1].size > 0:
        entries.append((plog.log_end_offset, now_ms))
    return entries


def _lookup_v0(broker: Broker, name: str, p: Any,
               replica_id: int) -> ListOffsetsPartitionResponseV0:
    index = int(p.partition_index)

    def error(code: ErrorCode) -> ListOffsetsPartitionResponseV0:
        return ListOffsetsPartitionResponseV0(index, int(code), ())

    if p.timestamp < EARLIEST:  # v0 knows only latest and earliest among the negatives
        return error(ErrorCode.unsupported_version)
    partition = broker.replicas.get(TopicPartition(name, index))
    if partition is None:
        known = broker.metadata.topic(name)
        return error(ErrorCode.not_leader_or_follower
                     if known is not None and 0 <= index < len(known.partitions)
                     else ErrorCode.unknown_topic_or_partition)
    # Kafka: fetchOnlyFromLeader unless the debugging replica id asks
    if replica_id != DEBUGGING_REPLICA_ID and not partition.is_leader(broker.node_id):
        return error(ErrorCode.not_leader_or_follower)
    plog = partition.log
    if plog.offline is not None:
        return error(ErrorCode.kafka_storage_error)
    try:
        offsets = legacy_offsets_before(_segment_times(plog, broker.clock.wall_ms()),
                                        int(p.timestamp), int(p.max_num_offsets))
    except ValueError:
        return error(ErrorCode.unknown_server_error)
    if replica_id == CONSUMER_REPLICA_ID:  # a consumer sees nothing above the HW
        hw = plog.high_watermark
        if any(o > hw for o in offsets):
            offsets = [hw, *(o for o in offsets if o <= hw)]
    return ListOffsetsPartitionResponseV0(index, 0, tuple(offsets))


def _handle_v0(broker: Broker, ctx: RequestContext, req: ListOffsetsRequestV0) -> EncodedBody:
    described = broker.security.allowed_names(ctx, DESCRIBE, TOPIC, (t.name for t in req.topics))
    denied = int(ErrorCode.topic_authorization_failed)
    topics = [(t.name, [_lookup_v0(broker, t.name, p, req.replica_id)
                        if t.name in described
                        else ListOffsetsPartitionResponseV0(int(p.partition_index), denied, ())
                        for p in t.partitions])
              for t in req.topics]
    body = encode_list_offsets_v0(topics)
    return EncodedBody([body], len(body))
