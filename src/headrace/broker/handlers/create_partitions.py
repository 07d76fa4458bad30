"""CreatePartitions (37): grow a topic's partition count."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.topics import TopicError

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(37, "CreatePartitions", 0, 3)
async def handle_create_partitions(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    results = []
    for t in req.topics:
        entry: dict[str, Any] = {"name": t.name, "error_code": 0, "error_message": None}
        results.append(entry)
        assignment = (
            [[int(b) for b in a.broker_ids] for a in t.assignments]
            if t.assignments is not None else None
        )
        try:
            broker.topics.add_partitions(t.name, int(t.count), assignment,
                                         bool(req.validate_only))
        except TopicError as e:
            entry["error_code"] = e.error_code
            entry["error_message"] = e.message
    return ctx.response({"throttle_time": 0, "results": results})
