"""DeleteTopics (20): by name (all versions) or topic id (v6+).

Topics the broker owns (``__consumer_offsets``, ``__transaction_state``, ...) are refused with
INVALID_TOPIC_EXCEPTION: deleting ``__consumer_offsets`` loses every group's committed
offsets. Kafka's own DeleteTopics has no such check (only ACLs: a client without ALTER on the
topic gets TOPIC_AUTHORIZATION_FAILED, and kafka-topics.sh refuses internal topics); the code
is the one Kafka answers for the other client writes to internal topics (Produce: "Cannot
append to internal topic", DeleteRecords: "Cannot delete records of internal topic",
``ReplicaManager.scala``).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DELETE, TOPIC
from headrace.broker.topics import INTERNAL_TOPICS, TopicError

if TYPE_CHECKING:
    from headrace.broker.server import Broker


# Kafka's Topic.isInternal set, plus its metadata log's name: all owned by the broker
BROKER_OWNED_TOPICS = INTERNAL_TOPICS | {"__share_group_state", "__cluster_metadata"}


@handler(20, "DeleteTopics", 1, 6)
async def handle_delete_topics(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    if ctx.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in req.topics or ()]
    else:
        wanted = [(name, None) for name in req.topic_names or ()]
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
        if not broker.security.allowed(ctx, DELETE, TOPIC, name):  # Kafka: DELETE on it
            entry["error_code"] = ErrorCode.topic_authorization_failed
            continue
        known = broker.metadata.topic(name)
        if known is not None:
            entry["topic_id"] = known.topic_id
        if name in BROKER_OWNED_TOPICS:
            entry["error_code"] = ErrorCode.invalid_topic_exception
            entry["error_message"] = f"Cannot delete internal topic {name}"
            continue
        try:
            await broker.topics.delete_async(name)
        except TopicError as e:
            entry["error_code"] = e.error_code
            entry["error_message"] = e.message
            if e.error_code == ErrorCode.topic_deletion_disabled and ctx.api_version < 3:
                entry["error_code"] = ErrorCode.invalid_request  # Kafka: 73 came with v3
        else:  # its series leave /metrics (a cluster: every broker, as it forgets it)
            broker.metrics.topic_deleted(name)
    return ctx.response({"throttle_time": 0, "responses": results})
