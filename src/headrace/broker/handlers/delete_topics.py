"""DeleteTopics (20): by name (all versions) or topic id (v6+)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.topics import TopicError

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(20, "DeleteTopics", 1, 6)
async def handle_delete_topics(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    if ctx.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(name, None) for name in req.topic_names]
    results = []
    for name, topic_id in wanted:
        entry: dict[str, Any] = {"name": name, "topic_id": topic_id or uuid.UUID(int=0),
                                 "error_code": 0, "error_message": None}
        results.append(entry)
        if name is None and topic_id is not None:
            found = broker.metadata.topic_by_id(topic_id)
            if found is None:
                entry["error_code"] = ErrorCode.unknown_topic_id
                continue
            name = entry["name"] = found.name
        if name is None:
            entry["error_code"] = ErrorCode.invalid_request
            continue
        known = broker.metadata.topic(name)
        if known is not None:
            entry["topic_id"] = known.topic_id
        try:
            broker.topics.delete(name)
        except TopicError as e:
            entry["error_code"] = e.error_code
            entry["error_message"] = e.message
    return ctx.response({"throttle_time": 0, "responses": results})
