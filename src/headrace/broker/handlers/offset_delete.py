"""OffsetDelete (47): remove a group's committed offsets (tombstones in
``__consumer_offsets``). GROUP_ID_NOT_FOUND for an unknown group; a partition of a topic
the (non-empty) group subscribes to gets GROUP_SUBSCRIBED_TO_TOPIC."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DELETE, GROUP, READ, TOPIC

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(47, "OffsetDelete", 0, 0)
async def handle_offset_delete(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    group_id = str(req.group_id)
    groups = broker.groups
    requested = [(str(t.name), int(p.partition_index)) for t in req.topics
                 for p in t.partitions]
    errors: dict[tuple[str, int], ErrorCode] = {}
    # Kafka: DELETE on the group (top-level GROUP_AUTHORIZATION_FAILED), READ on each topic
    err = (groups.check_coordinator(group_id)
           if broker.security.allowed(ctx, DELETE, GROUP, group_id)
           else ErrorCode.group_authorization_failed)
    readable = broker.security.allowed_names(ctx, READ, TOPIC, (tp[0] for tp in requested))
    if err is ErrorCode.none:
        known = []
        for tp in requested:
            topic = broker.metadata.topic(tp[0])
            if tp[0] not in readable:
                errors[tp] = ErrorCode.topic_authorization_failed
            elif topic is None or not 0 <= tp[1] < len(topic.partitions):
                errors[tp] = ErrorCode.unknown_topic_or_partition
            else:
                known.append(tp)
        err, part_errors, write = groups.coordinator.delete_offsets(group_id, known)
        if err is ErrorCode.none:
            errors.update(zip(known, part_errors, strict=True))
            if write is not None and write.records:
                write_err = await groups.write(write)
                if write_err is not ErrorCode.none:
                    errors.update({tp: write_err for tp in write.deletions})
    return ctx.response({
        "error_code": err,
        "throttle_time": 0,
        "topics": [] if err is not ErrorCode.none else [
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index,
                 "error_code": errors.get((str(t.name), int(p.partition_index)),
                                          ErrorCode.none)}
                for p in t.partitions]}
            for t in req.topics
        ],
    })
