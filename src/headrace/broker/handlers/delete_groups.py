"""DeleteGroups (42) v0-2: delete empty groups with their offsets (tombstones for every
committed offset and the group metadata; a share group's share-partition state is deleted
from the share coordinator first). NON_EMPTY_GROUP while members remain,
GROUP_ID_NOT_FOUND for an unknown group."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.share_group_offsets import delete_share_group_state
from headrace.broker.security import DELETE, GROUP
from headrace.share.group import ShareGroup

if TYPE_CHECKING:
    from headrace.broker.server import Broker


async def _delete(broker: Broker, group_id: str) -> ErrorCode:
    groups = broker.groups
    err = groups.check_coordinator(group_id)
    if err is not ErrorCode.none:
        return err
    g = groups.coordinator.groups.get(group_id)
    if isinstance(g, ShareGroup) and g.is_empty() and g.state_name != "Dead":
        err = await delete_share_group_state(broker, g)  # KIP-932: the state goes first
        if err is not ErrorCode.none:
            return err
    err, write = groups.coordinator.delete_group(group_id)
    if err is ErrorCode.none and write is not None:
        err = await groups.write(write)
    return err


@handler(42, "DeleteGroups", 0, 2)
async def handle_delete_groups(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    results = []
    for gid in req.groups_names:
        allowed = broker.security.allowed(ctx, DELETE, GROUP, str(gid))
        results.append({"group_id": gid, "error_code": await _delete(broker, str(gid))
                        if allowed else ErrorCode.group_authorization_failed})
    return ctx.response({"throttle_time": 0, "results": results})
