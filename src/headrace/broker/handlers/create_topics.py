"""CreateTopics (19): partitions, replication factor or explicit assignment, configs."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.describe_configs import topic_config_entries
from headrace.broker.topics import TopicError

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(19, "CreateTopics", 2, 7)
async def handle_create_topics(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    results = []
    seen: dict[str, int] = {}
    for t in req.topics:
        seen[t.name] = seen.get(t.name, 0) + 1
    for t in req.topics:
        entry: dict[str, Any] = {"name": t.name, "topic_id": uuid.UUID(int=0),
                                 "error_code": 0, "error_message": None,
                                 "topic_config_error_code": 0, "num_partitions": -1,
                                 "replication_factor": -1, "configs": None}
        results.append(entry)
        if seen[t.name] > 1:
            entry["error_code"] = ErrorCode.invalid_request
            entry["error_message"] = f"Duplicate topic name {t.name!r} in the request"
            continue
        assignment = None
        if t.assignments:
            if t.num_partitions != -1 or t.replication_factor != -1:
                entry["error_code"] = ErrorCode.invalid_request
                entry["error_message"] = ("Both numPartitions or replicationFactor and "
                                          "replicasAssignments were set.")
                continue
            ordered = sorted(t.assignments, key=lambda a: a.partition_index)
            if [a.partition_index for a in ordered] != list(range(len(ordered))):
                entry["error_code"] = ErrorCode.invalid_replica_assignment
                entry["error_message"] = "Partitions must be numbered 0..n-1"
                continue
            assignment = [[int(b) for b in a.broker_ids] for a in ordered]
        configs = {c.name: c.value for c in t.configs}
        try:
            topic = broker.topics.create(
                t.name, int(t.num_partitions), int(t.replication_factor), configs,
                assignment=assignment, validate_only=bool(req.validate_only),
            )
        except TopicError as e:
            entry["error_code"] = e.error_code
            entry["error_message"] = e.message
            continue
        if topic is None:  # validate_only
            nparts = int(t.num_partitions) if t.num_partitions != -1 else int(
                broker.config["num.partitions"])
            rf = int(t.replication_factor) if t.replication_factor != -1 else int(
                broker.config["default.replication.factor"])
            if assignment:
                nparts, rf = len(assignment), len(assignment[0])
            entry.update(num_partitions=nparts, replication_factor=rf)
            continue
        entry.update(
            topic_id=topic.topic_id,
            num_partitions=len(topic.partitions),
            replication_factor=len(topic.partitions[0].replicas),
            configs=[
                {"name": c["name"], "value": c["value"], "read_only": False,
                 "config_source": c["config_source"], "is_sensitive": False}
                for c in topic_config_entries(broker, topic.name, None)
            ],
        )
    return ctx.response({"throttle_time": 0, "topics": results})
