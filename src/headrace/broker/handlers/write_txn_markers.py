"""WriteTxnMarkers (27): a transaction coordinator asks this leader to end a producer's
transaction in its partitions (issue 10). Each marker is a control batch appended as
leader and answered once committed (acks=all); a ``__consumer_offsets`` partition's
pending transactional offsets are decided with it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.security import CLUSTER_ACTION

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(27, "WriteTxnMarkers", 1, 1)
async def handle_write_txn_markers(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    results = []
    if not broker.security.cluster_allowed(ctx, CLUSTER_ACTION):  # Kafka: inter-broker only
        return ctx.response({"markers": [
            {"producer_id": m.producer_id, "topics": [
                {"name": t.name, "partitions": [
                    {"partition_index": p, "error_code": ErrorCode.cluster_authorization_failed}
                    for p in t.partition_indexes]} for t in m.topics]}
            for m in req.markers]})
    for m in req.markers:
        topics = []
        for t in m.topics:
            codes = await asyncio.gather(*(
                broker.txns.write_marker(TopicPartition(str(t.name), int(p)),
                                         int(m.producer_id), int(m.producer_epoch),
                                         bool(m.transaction_result), int(m.coordinator_epoch))
                for p in t.partition_indexes))
            topics.append({"name": t.name, "partitions": [
                {"partition_index": p, "error_code": code}
                for p, code in zip(t.partition_indexes, codes, strict=True)]})
        results.append({"producer_id": m.producer_id, "topics": topics})
    return ctx.response({"markers": results})
