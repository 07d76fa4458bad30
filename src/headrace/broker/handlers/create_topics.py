"""CreateTopics (19): partitions, replication factor or explicit assignment, configs.

Each topic is its own result and is created all or nothing; the partition limit is
checked for the whole request before anything is created (``TopicAdmin.create_topics``),
and the directories and logs are made in a worker thread, so a big create does not stall
other clients. Arrays a client sends as null (the request's topics, a topic's configs or
assignments, an assignment's broker ids) are answered with INVALID_REQUEST for that topic,
never an exception.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler, ms
from headrace.broker.handlers.describe_configs import topic_config_entries
from headrace.broker.security import CREATE, DESCRIBE_CONFIGS, TOPIC
from headrace.broker.topics import TopicError, TopicPlan, TopicSpec

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def _spec(t: Any, duplicate: bool) -> TopicSpec | TopicError:
    """The request's entry as a TopicSpec, or the error it gets before any validation."""
    if duplicate:
        return TopicError(ErrorCode.invalid_request,
                          f"Duplicate topic name {t.name!r} in the request")
    if t.configs is None:
        return TopicError(ErrorCode.invalid_request, "configs must not be null")
    if t.assignments is None:
        return TopicError(ErrorCode.invalid_request, "assignments must not be null")
    assignment = None
    if t.assignments:
        if t.num_partitions != -1 or t.replication_factor != -1:
            return TopicError(ErrorCode.invalid_request,
                              "Both numPartitions or replicationFactor and "
                              "replicasAssignments were set.")
        if any(a.broker_ids is None for a in t.assignments):
            return TopicError(ErrorCode.invalid_request,
                              "broker_ids of an assignment must not be null")
        ordered = sorted(t.assignments, key=lambda a: a.partition_index)
        if [a.partition_index for a in ordered] != list(range(len(ordered))):
            return TopicError(ErrorCode.invalid_replica_assignment,
                              "Partitions must be numbered 0..n-1")
        assignment = [[int(b) for b in a.broker_ids] for a in ordered]
    configs = {c.name: c.value for c in t.configs}
    return TopicSpec(str(t.name) if t.name is not None else "", int(t.num_partitions),
                     int(t.replication_factor), configs, assignment)


@handler(19, "CreateTopics", 2, 7)
async def handle_create_topics(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    requested = list(req.topics) if req.topics is not None else []
    seen: dict[str, int] = {}
    for t in requested:
        seen[t.name] = seen.get(t.name, 0) + 1
    # Kafka: CREATE on the cluster, or else on each topic (TOPIC_AUTHORIZATION_FAILED)
    security = broker.security
    allowed = ({t.name for t in requested} if security.cluster_allowed(ctx, CREATE) else
               security.allowed_names(ctx, CREATE, TOPIC, (t.name for t in requested)))
    refused = [t for t in requested if t.name not in allowed and seen[t.name] == 1]
    wanted = [t for t in requested if t not in refused]
    done = iter(await broker.topics.create_topics(
        [_spec(t, seen[t.name] > 1) for t in wanted], bool(req.validate_only),
        ms(req.timeout)))
    outcomes = [TopicError(ErrorCode.topic_authorization_failed, "Authorization failed.")
                if t in refused else next(done) for t in requested]
    results = []
    for t, outcome in zip(requested, outcomes, strict=True):
        entry: dict[str, Any] = {"name": t.name, "topic_id": uuid.UUID(int=0),
                                 "error_code": 0, "error_message": None,
                                 "topic_config_error_code": 0, "num_partitions": -1,
                                 "replication_factor": -1, "configs": None}
        results.append(entry)
        if isinstance(outcome, TopicError):
            entry["error_code"] = outcome.error_code
            entry["error_message"] = outcome.message
        elif isinstance(outcome, TopicPlan):  # validate_only
            entry.update(num_partitions=len(outcome.states),
                         replication_factor=outcome.replication_factor)
        elif not security.allowed(ctx, DESCRIBE_CONFIGS, TOPIC, outcome.name):
            entry.update(topic_id=outcome.topic_id, num_partitions=len(outcome.partitions),
                         replication_factor=len(outcome.partitions[0].replicas),
                         topic_config_error_code=ErrorCode.topic_authorization_failed)
        else:
            entry.update(
                topic_id=outcome.topic_id,
                num_partitions=len(outcome.partitions),
                replication_factor=len(outcome.partitions[0].replicas),
                configs=[
                    {"name": c["name"], "value": c["value"], "read_only": False,
                     "config_source": c["config_source"], "is_sensitive": False}
                    for c in topic_config_entries(broker, outcome.name, None)
                ],
            )
    return ctx.response({"throttle_time": 0, "topics": results})
