"""OffsetForLeaderEpoch (23): where a leader epoch ends on the leader (KIP-101, KIP-279).

Followers ask it before fetching, to truncate exactly their divergent suffix; consumers
ask it after a leader change to detect truncation (KIP-320). Per partition: the largest
epoch at or below the requested one and its end offset (``PartitionLog.end_offset_for_epoch``),
answered by the leader only (NOT_LEADER_OR_FOLLOWER elsewhere), with the
``current_leader_epoch`` fencing of Fetch (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH).

Authorization (Kafka's ``handleOffsetForLeaderEpochRequest``): CLUSTER_ACTION on the
cluster (a follower) answers every topic; otherwise a topic the principal may not DESCRIBE
is TOPIC_AUTHORIZATION_FAILED for each requested partition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.fetch import _epoch_error
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.security import CLUSTER_ACTION, DESCRIBE, TOPIC

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def _answer(broker: Broker, topic: str, p: Any) -> dict[str, Any]:
    index = int(p.partition)
    entry: dict[str, Any] = {"error_code": ErrorCode.none, "partition": index,
                             "leader_epoch": -1, "end_offset": -1}
    partition = broker.replicas.get(TopicPartition(topic, index))
    if partition is None:
        known = broker.metadata.topic(topic)
        entry["error_code"] = (
            ErrorCode.not_leader_or_follower
            if known is not None and 0 <= index < len(known.partitions)
            else ErrorCode.unknown_topic_or_partition)
        return entry
    # the epoch before leadership, as Kafka checks them (see the Fetch handler)
    err = _epoch_error(int(p.current_leader_epoch), partition.leader_epoch)
    if err is not None:
        entry["error_code"] = err
        return entry
    if not partition.is_leader(broker.node_id):
        entry["error_code"] = ErrorCode.not_leader_or_follower
        return entry
    if partition.log.offline is not None:
        entry["error_code"] = ErrorCode.kafka_storage_error
        return entry
    epoch, end = partition.log.end_offset_for_epoch(int(p.leader_epoch))
    entry.update(leader_epoch=epoch, end_offset=end)
    return entry


@handler(23, "OffsetForLeaderEpoch", 2, 4)
async def handle_offset_for_leader_epoch(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    security = broker.security
    names = [t.topic for t in req.topics]
    described = (set(names) if security.cluster_allowed(ctx, CLUSTER_ACTION)
                 else security.allowed_names(ctx, DESCRIBE, TOPIC, names))

    def denied(p: Any) -> dict[str, Any]:
        return {"error_code": ErrorCode.topic_authorization_failed,
                "partition": int(p.partition), "leader_epoch": -1, "end_offset": -1}

    return ctx.response({
        "throttle_time": 0,
        "topics": [{"topic": t.topic, "partitions": [
            _answer(broker, t.topic, p) if t.topic in described else denied(p)
            for p in t.partitions]}
                   for t in req.topics],
    })
