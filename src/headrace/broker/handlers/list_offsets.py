"""ListOffsets (2): earliest (-2), latest (-1), max timestamp (-3), by timestamp (R-PROTO-5).

"latest" is the high watermark for read_uncommitted and the last stable offset for
read_committed (librdkafka's default); a lookup by timestamp uses the time index and only
returns offsets a consumer may read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.fetch import READ_COMMITTED, _epoch_error
from headrace.broker.replica_manager import TopicPartition
from headrace.log.errors import LogError
from headrace.log.partition_log import PartitionLog

if TYPE_CHECKING:
    from headrace.broker.server import Broker

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5


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


@handler(2, "ListOffsets", 1, 10)
async def handle_list_offsets(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    isolation = int(getattr(req, "isolation_level", 0))
    topics = []
    for t in req.topics:
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
