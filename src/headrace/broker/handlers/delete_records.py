"""DeleteRecords (21): move partitions' log start offsets forward (``kafka-delete-records``,
Kafka Streams' repartition purge, "clear topic" buttons).

Per partition, Kafka's rules (``KafkaApis.handleDeleteRecordsRequest``,
``ReplicaManager.deleteRecordsOnLocalLog``, ``Partition.deleteRecordsOnLeader``): a partition
the metadata does not know is UNKNOWN_TOPIC_OR_PARTITION; an internal topic is
INVALID_TOPIC_EXCEPTION; then the leader moves its log start offset
(``ReplicaManager.delete_records``: offset -1 means the high watermark; past it, or negative,
is OFFSET_OUT_OF_RANGE; NOT_LEADER_OR_FOLLOWER off the leader; POLICY_VIOLATION for a
compact-only topic) and answers the new low watermark; every error answers low watermark -1.
The stored offsets are fsynced (in a worker thread) before the response, so an answered
delete survives a crash; a failed fsync answers KAFKA_STORAGE_ERROR (the start has moved in
memory and in the page cache all the same: Kafka would take the log dir offline). The
request's ``timeout_ms`` bounds Kafka's wait for followers to reach the low watermark; the
low watermark here is the leader's, so nothing waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.security import DELETE, TOPIC
from headrace.broker.topics import INTERNAL_TOPICS
from headrace.log.errors import LogError

if TYPE_CHECKING:
    from headrace.broker.server import Broker

INVALID_LOW_WATERMARK = -1


def _delete_one(broker: Broker, tp: TopicPartition, offset: int) -> tuple[ErrorCode, int]:
    topic = broker.metadata.topic(tp.topic)
    if topic is None or not 0 <= tp.partition < len(topic.partitions):
        return ErrorCode.unknown_topic_or_partition, INVALID_LOW_WATERMARK
    if tp.topic in INTERNAL_TOPICS:
        return ErrorCode.invalid_topic_exception, INVALID_LOW_WATERMARK
    try:
        return ErrorCode.none, broker.replicas.delete_records(tp, offset)
    except LogError as e:
        return e.error_code, INVALID_LOW_WATERMARK


@handler(21, "DeleteRecords", 0, 2)
async def handle_delete_records(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    results: list[tuple[str, list[dict[str, Any]]]] = []
    moved: list[TopicPartition] = []
    # Kafka: DELETE on each topic (TOPIC_AUTHORIZATION_FAILED)
    deletable = broker.security.allowed_names(ctx, DELETE, TOPIC, (t.name for t in req.topics))
    for t in req.topics:
        partitions: list[dict[str, Any]] = []
        results.append((t.name, partitions))
        for p in t.partitions:
            tp = TopicPartition(t.name, int(p.partition_index))
            code, low = ((ErrorCode.topic_authorization_failed, -1) if t.name not in deletable
                         else _delete_one(broker, tp, int(p.offset)))
            if code == ErrorCode.none:
                moved.append(tp)
            partitions.append({"partition_index": tp.partition, "error_code": code,
                               "low_watermark": low})
    failed = await broker.replicas.sync_log_starts(moved) if moved else set()
    if failed:
        for name, partitions in results:
            for entry in partitions:
                if TopicPartition(name, entry["partition_index"]) in failed:
                    entry.update(error_code=ErrorCode.kafka_storage_error,
                                 low_watermark=INVALID_LOW_WATERMARK)
    return ctx.response({"throttle_time": 0,
                         "topics": [{"name": n, "partitions": ps} for n, ps in results]})
