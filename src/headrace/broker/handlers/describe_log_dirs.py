"""DescribeLogDirs (35): each log dir, its partitions' sizes, total and usable bytes.

Kafka's answer (``ReplicaManager.describeLogDirs``): one result per log dir, its absolute
path, per topic the requested partitions hosted there (``topics`` null: every one) with
their size in bytes (all segments), their offset lag (``max(high watermark - log end
offset, 0)``: 0 on a leader) and ``is_future_key`` false (a move here is done at once,
with no future replica to report); topics with no such partition are left out; v4 adds the
file system's total and usable bytes. The first of ``log.dirs`` holds the broker's state
and new partitions, the others the replicas moved there (AlterReplicaLogDirs). A
partition whose log is offline (an I/O error) is left out, as Kafka leaves out the logs of
an offline dir; a log dir whose file system cannot be read answers KAFKA_STORAGE_ERROR.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.security import DESCRIBE

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def _wanted(req: Any) -> set[TopicPartition] | None:
    if req.topics is None:
        return None
    return {TopicPartition(t.topic, int(p)) for t in req.topics for p in t.partitions}


def _topics(broker: Broker, wanted: set[TopicPartition] | None, log_dir: str
            ) -> list[dict[str, Any]]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for tp, p in list(broker.replicas.partitions.items()):
        if wanted is not None and tp not in wanted:
            continue
        plog = p.log
        if plog.offline is not None or os.path.abspath(plog.dir.parent) != log_dir:
            continue
        by_topic.setdefault(tp.topic, []).append({
            "partition_index": tp.partition,
            "partition_size": plog.size_in_bytes,
            "offset_lag": max(plog.high_watermark - plog.log_end_offset, 0),
            "is_future_key": False,
        })
    return [{"name": name, "partitions": sorted(ps, key=lambda e: e["partition_index"])}
            for name, ps in sorted(by_topic.items())]


@handler(35, "DescribeLogDirs", 1, 4)
async def handle_describe_log_dirs(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    if not broker.security.cluster_allowed(ctx, DESCRIBE):  # Kafka: DESCRIBE on the cluster
        return ctx.response({"throttle_time": 0,
                             "error_code": ErrorCode.cluster_authorization_failed,
                             "results": []})
    wanted = _wanted(req)
    results = []
    for d in broker.replicas.log_dirs:
        path = os.path.abspath(d)
        result: dict[str, Any] = {"log_dir": path, "error_code": ErrorCode.none,
                                  "topics": []}
        try:
            st = os.statvfs(path)
        except OSError:
            result["error_code"] = ErrorCode.kafka_storage_error
        else:
            result["topics"] = _topics(broker, wanted, path)
            result["total_bytes"] = st.f_blocks * st.f_frsize
            result["usable_bytes"] = st.f_bavail * st.f_frsize
        results.append(result)
    return ctx.response({"throttle_time": 0, "error_code": ErrorCode.none,
                         "results": results})
