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
- the replica's current dir: NONE, nothing to do.

headrace has one log dir (``log.dirs`` names more only in a warning: README, "Kafka's
``server.properties``"), so a hosted replica is always in the dir it is asked to be in.
"""

from __future__ import annotations

import os
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
    if len(tp.topic) > MAX_TOPIC_NAME:
        return ErrorCode.invalid_topic_exception
    if path != os.path.abspath(broker.data_dir):
        return ErrorCode.log_dir_not_found
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
        by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition,
                                                  "error_code": code})
    return ctx.response({"throttle_time": 0, "results": [
        {"topic_name": name, "partitions": ps} for name, ps in by_topic.items()]})
