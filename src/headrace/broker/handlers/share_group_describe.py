"""ShareGroupDescribe (77): share groups' members, epochs and assignments (KIP-932), as
Kafka's ``KafkaApis.handleShareGroupDescribe``: DESCRIBE on each group (else
GROUP_AUTHORIZATION_FAILED for it), NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS for a
group this broker does not coordinate, GROUP_ID_NOT_FOUND for an unknown group or one of
another type ("Group X is not a share group."). ``include_authorized_operations``: the
operations the principal may do on each group described without error; with an
authorizer, a group whose members are assigned a topic the principal may not DESCRIBE is
TOPIC_AUTHORIZATION_FAILED with no members (Kafka hides them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DESCRIBE, GROUP, TOPIC
from headrace.share.group import ShareGroup, describe_unknown_group

if TYPE_CHECKING:
    from headrace.broker.server import Broker

UNKNOWN_AUTHORIZED_OPERATIONS = -2147483648


def _describe(broker: Broker, ctx: RequestContext, group_id: str) -> dict[str, Any]:
    if not broker.security.allowed(ctx, DESCRIBE, GROUP, group_id):
        return {"group_id": group_id, "error_code": ErrorCode.group_authorization_failed,
                "error_message": None}
    err = broker.groups.check_coordinator(group_id)
    if err is not ErrorCode.none:
        return {"group_id": group_id, "error_code": err, "error_message": None}
    g = broker.groups.coordinator.groups.get(group_id)
    if g is None or g.state_name == "Dead":
        return describe_unknown_group(group_id)
    if not isinstance(g, ShareGroup):
        return {"group_id": group_id, "error_code": ErrorCode.group_id_not_found,
                "error_message": f"Group {group_id} is not a share group."}
    names = {t.topic_id: name for name, t in broker.metadata.topics().items()}
    return g.describe(names)


def _hide_unauthorized(broker: Broker, ctx: RequestContext, group: dict[str, Any]
                       ) -> dict[str, Any]:
    names = {str(tp["topic_name"]) for m in group.get("members", ())
             for tp in m["assignment"]["topic_partitions"]}
    if len(broker.security.allowed_names(ctx, DESCRIBE, TOPIC, names)) == len(names):
        return group
    return {**group, "error_code": ErrorCode.topic_authorization_failed, "members": [],
            "error_message": "The group has described topic(s) that the client is not "
                             "authorized to describe."}


@handler(77, "ShareGroupDescribe", 1, 1)
async def handle_share_group_describe(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    groups = []
    for group_id in req.group_ids:
        g: dict[str, Any] = {
            "group_state": "", "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "",
            "members": [], "authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS,
            **_describe(broker, ctx, str(group_id))}
        if g["error_code"] == ErrorCode.none:
            if req.include_authorized_operations:
                g["authorized_operations"] = broker.security.authorized_operations(
                    ctx, GROUP, str(group_id))
            if broker.security.enabled:
                g = _hide_unauthorized(broker, ctx, g)
        groups.append(g)
    return ctx.response({"throttle_time": 0, "groups": groups})
