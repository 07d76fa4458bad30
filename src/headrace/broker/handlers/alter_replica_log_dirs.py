"""AlterReplicaLogDirs (34) v1-2: move replicas of this broker between its log dirs (issue
27 item 3; kafka-reassign-partitions.sh ``--reassignment-json-file`` with "log_dirs").

Kafka's answer (``KafkaApis.handleAlterReplicaLogDirsRequest``, ``ReplicaManager.
alterReplicaLogDirs``): ALTER on the cluster, else every partition
CLUSTER_AUTHORIZATION_FAILED; then per partition (a partition named under two dirs: the
last one wins), in this order:

- a topic name longer than 249 characters: INVALID_TOPIC_EXCEPTION;
- a path that is not one of this broker's log dirs (absolute, as DescribeLogDirs reports
  them): LOG_DIR_NOT_FOUND;
- a partition of no topic: UNKNOWN_TOPIC_OR_PARTITION; of a topic whose replica is not on
  this broker: REPLICA_NOT_AVAILABLE; whose log is offline: KAFKA_STORAGE_ERROR;
- otherwise the replica moves to that dir (``ReplicaManager.move_replica``: done before
  the answer, the log closed, copied, fsynced and reopened there; KAFKA_STORAGE_ERROR if
  the copy failed, the replica then staying where it was). The replica's current dir:
  NONE, nothing to do.

Kafka answers at once and copies in the background (a future replica, reported by
DescribeLogDirs with ``is_future_key``, and REPLICA_NOT_AVAILABLE for a partition not yet
created); headrace moves while the request waits, so DescribeLogDirs reports the replica
in its new dir as soon as the answer is NONE.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.security import ALTER

if TYPE_CHECKING:
    from headrace.broker.server import Broker

MAX_TOPIC_NAME = 249


def _wanted(req: Any) -> dict[TopicPartition, str]:
    """Kafka's ``partitionDirs``: partition → requested dir, the last naming wins."""
    out: dict[TopicPartition, str] = {}
    for d in req.dirs:
        for t in d.topics:
            for p in t.partitions:
                out[TopicPartition(str(t.name), int(p))] = str(d.path)
    return out


def _error(broker: Broker, tp: TopicPartition, path: str) -> ErrorCode:
    """The refusal of moving ``tp`` to ``path``, or NONE: move it."""
    if len(tp.topic) > MAX_TOPIC_NAME:
        return ErrorCode.invalid_topic_exception
    if path not in {os.path.abspath(d) for d in broker.replicas.log_dirs}:
        return ErrorCode.log_dir_not_found
    if not os.path.isdir(path):  # Kafka: the dir is offline
        return ErrorCode.kafka_storage_error
    hosted = broker.replicas.get(tp)
    if hosted is None:
        topic = broker.metadata.topic(tp.topic)
        if topic is None or not 0 <= tp.partition < len(topic.partitions):
            return ErrorCode.unknown_topic_or_partition
        return ErrorCode.replica_not_available
    if hosted.log.offline is not None:
        return ErrorCode.kafka_storage_error
    return ErrorCode.none


@handler(34, "AlterReplicaLogDirs", 1, 2)
async def handle_alter_replica_log_dirs(broker: Broker, ctx: RequestContext,
                                        req: Any) -> Any:
    wanted = _wanted(req)
    allowed = broker.security.cluster_allowed(ctx, ALTER)  # Kafka: ALTER on the cluster
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for tp, path in wanted.items():
        code = (_error(broker, tp, path) if allowed
                else ErrorCode.cluster_authorization_failed)
        if code is ErrorCode.none:
            code = await broker.replicas.move_replica(tp, Path(path))
        by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition,
                                                  "error_code": code})
    return ctx.response({"throttle_time": 0, "results": [
        {"topic_name": name, "partitions": ps} for name, ps in by_topic.items()]})
