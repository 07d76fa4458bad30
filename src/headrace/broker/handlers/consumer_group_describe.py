"""ConsumerGroupDescribe (69): KIP-848 groups with members, assignments and target assignments.

Per group: an empty id → INVALID_GROUP_ID; the coordinator check; no group, a Dead one or a
classic group → GROUP_ID_NOT_FOUND (Kafka's answers). Topic names are resolved from the
current metadata.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.group.consumer_group import ConsumerGroup, GroupState

if TYPE_CHECKING:
    from headrace.broker.server import Broker

UNKNOWN_AUTHORIZED_OPERATIONS = -2147483648


def _error(group_id: str, code: ErrorCode, message: str | None = None) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "group_id": group_id,
            "group_state": "", "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "",
            "members": [], "authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS}


@handler(69, "ConsumerGroupDescribe", 0, 1)
async def handle_consumer_group_describe(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    names = {t.topic_id: name for name, t in broker.metadata.topics().items()}
    out: list[dict[str, Any]] = []
    for group_id in req.group_ids:
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
        entry["authorized_operations"] = UNKNOWN_AUTHORIZED_OPERATIONS
        out.append(entry)
    return ctx.response({"throttle_time": 0, "groups": out})
