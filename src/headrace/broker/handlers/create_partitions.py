"""CreatePartitions (37): grow a topic's partition count.

Each topic is its own result, all or nothing; the partition limit is checked for the
whole request first and the new directories are made in a worker thread
(``TopicAdmin.create_partitions``). A null topics array answers an empty result; a null
broker id list in an assignment answers INVALID_REQUEST for its topic (null
``assignments`` is legal: the broker assigns). An internal topic's partition count
cannot change: INVALID_REQUEST (``TopicAdmin.plan_partitions``; Kafka accepts it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import ALTER, TOPIC
from headrace.broker.topics import TopicError

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def _request(t: Any, duplicate: bool) -> tuple[str, int, list[list[int]] | None] | TopicError:
    if duplicate:
        return TopicError(ErrorCode.invalid_request, "Duplicate topic in request.")
    if t.assignments is None:
        return (str(t.name), int(t.count), None)
    if any(a.broker_ids is None for a in t.assignments):
        return TopicError(ErrorCode.invalid_request,
                          "broker_ids of an assignment must not be null")
    return (str(t.name), int(t.count), [[int(b) for b in a.broker_ids] for a in t.assignments])


@handler(37, "CreatePartitions", 0, 3)
async def handle_create_partitions(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    requested = list(req.topics) if req.topics is not None else []
    seen: dict[str, int] = {}
    for t in requested:
        seen[t.name] = seen.get(t.name, 0) + 1
    # Kafka: ALTER on each topic (TOPIC_AUTHORIZATION_FAILED); duplicates are refused first
    allowed = broker.security.allowed_names(ctx, ALTER, TOPIC, (t.name for t in requested))
    refused = [t for t in requested if t.name not in allowed and seen[t.name] == 1]
    wanted = [t for t in requested if t not in refused]
    done = iter(await broker.topics.create_partitions(
        [_request(t, seen[t.name] > 1) for t in wanted], bool(req.validate_only)))
    outcomes = [TopicError(ErrorCode.topic_authorization_failed,
                           "The topic authorization is failed.") if t in refused
                else next(done) for t in requested]
    results = []
    for t, outcome in zip(requested, outcomes, strict=True):
        entry: dict[str, Any] = {"name": t.name, "error_code": 0, "error_message": None}
        if outcome is not None:
            entry["error_code"] = outcome.error_code
            entry["error_message"] = outcome.message
        results.append(entry)
    return ctx.response({"throttle_time": 0, "results": results})
