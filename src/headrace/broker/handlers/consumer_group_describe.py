"""ConsumerGroupDescribe (69): KIP-848 groups with members, assignments and target assignments.

Per group: an empty id → INVALID_GROUP_ID; the coordinator check; no group, a Dead one or a
classic group → GROUP_ID_NOT_FOUND (Kafka's answers). Topic names are resolved from the
current metadata.

Authorization (Kafka's ``handleConsumerGroupDescribe``): a group the principal may not
DESCRIBE is GROUP_AUTHORIZATION_FAILED (those answers first, as Kafka adds them before the
coordinator's); ``authorized_operations``, when asked for, is the principal's group
operations for each group described without error; with an authorizer, a group whose
members' assignments or target assignments name a topic the principal may not DESCRIBE is
answered TOPIC_AUTHORIZATION_FAILED without members.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DESCRIBE, GROUP, TOPIC
from headrace.group.consumer_group import ConsumerGroup, GroupState

if TYPE_CHECKING:
    from headrace.broker.server import Broker

UNKNOWN_AUTHORIZED_OPERATIONS = -2147483648
UNAUTHORIZED_TOPICS_MESSAGE = ("The group has described topic(s) that the client is not "
                               "authorized to describe.")


def _error(group_id: str, code: ErrorCode, message: str | None = None) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "group_id": group_id,
            "group_state": "", "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "",
            "members": [], "authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS}


@handler(69, "ConsumerGroupDescribe", 0, 1)
async def handle_consumer_group_describe(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    names = {t.topic_id: name for name, t in broker.metadata.topics().items()}
    security = broker.security
    denied: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for group_id in req.group_ids:
        if not security.allowed(ctx, DESCRIBE, GROUP, group_id):
            denied.append(_error(group_id, ErrorCode.group_authorization_failed))
            continue
        if not group_id:
            out.append(_error(group_id, ErrorCode.invalid_group_id))
            continue
        err = broker.groups.check_coordinator(group_id)
        if err is not ErrorCode.none:
            out.append(_error(group_id, err))
            continue
        group = broker.groups.coordinator.groups.get(group_id)
        if group is None or group.state_name == GroupState.DEAD.value:
            out.append(_error(group_id, ErrorCode.group_id_not_found,
                              f"Group {group_id} not found."))
            continue
        if not isinstance(group, ConsumerGroup):
            out.append(_error(group_id, ErrorCode.group_id_not_found,
                              f"Group {group_id} is not a consumer group."))
            continue
        entry = group.describe(names)
        entry["authorized_operations"] = (
            security.authorized_operations(ctx, GROUP, group_id)
            if req.include_authorized_operations else UNKNOWN_AUTHORIZED_OPERATIONS)
        if security.enabled:
            topics = {tp["topic_name"] for m in entry["members"]
                      for a in (m["assignment"], m["target_assignment"])
                      for tp in a["topic_partitions"]}
            if security.allowed_names(ctx, DESCRIBE, TOPIC, topics) != topics:
                entry = _error(group_id, ErrorCode.topic_authorization_failed,
                               UNAUTHORIZED_TOPICS_MESSAGE)
        out.append(entry)
    return ctx.response({"throttle_time": 0, "groups": denied + out})
