"""DescribeGroups (15) v0-5: state, protocol and members of groups.

As Kafka: members carry their metadata (for the selected protocol) and assignment only in
Stable; an unknown group, or a share group (Kafka's ``describeGroups`` finds no classic
group of that id), is described as ``Dead`` with no error (v6 would say
GROUP_ID_NOT_FOUND).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DESCRIBE, GROUP
from headrace.group.classic import ClassicGroup, GroupState
from headrace.share.group import ShareGroup

if TYPE_CHECKING:
    from headrace.broker.server import Broker

UNKNOWN_AUTHORIZED_OPERATIONS = -2147483648


def _describe(broker: Broker, ctx: RequestContext, group_id: str, with_operations: bool
              ) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "error_code": ErrorCode.none, "group_id": group_id, "group_state": "Dead",
        "protocol_type": "", "protocol_data": "", "members": [],
        "authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS,
    }
    if not broker.security.allowed(ctx, DESCRIBE, GROUP, group_id):
        entry["error_code"] = ErrorCode.group_authorization_failed
        return entry
    if with_operations:
        entry["authorized_operations"] = broker.security.authorized_operations(
            ctx, GROUP, group_id)
    err = broker.groups.check_coordinator(group_id)
    if err is not ErrorCode.none:
        entry["error_code"] = err
        return entry
    g = broker.groups.coordinator.groups.get(group_id)
    if g is None or isinstance(g, ShareGroup):
        return entry
    entry["group_state"] = g.state_name
    entry["protocol_type"] = g.protocol_type
    if isinstance(g, ClassicGroup):
        stable = g.state is GroupState.STABLE
        entry["protocol_data"] = (g.protocol_name or "") if stable else ""
        entry["members"] = [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
             "client_id": m.client_id, "client_host": m.client_host,
             "member_metadata": m.metadata(g.protocol_name) if stable else b"",
             "member_assignment": m.assignment if stable else b""}
            for m in g.members.values()
        ]
    return entry


@handler(15, "DescribeGroups", 0, 5)
async def handle_describe_groups(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    return ctx.response({
        "throttle_time": 0,
        "groups": [_describe(broker, ctx, str(gid),
                             bool(getattr(req, "include_authorized_operations", False)))
                   for gid in req.groups],
    })
