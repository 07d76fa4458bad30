"""Heartbeat (12) v0-4: keeps a classic member's session alive; tells it to rejoin
(REBALANCE_IN_PROGRESS) or that it is stale (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
FENCED_INSTANCE_ID), per ``ClassicGroup.heartbeat`` (R-GRP-3/4)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import GROUP, READ

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(12, "Heartbeat", 0, 4)
async def handle_heartbeat(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    group_id = str(req.group_id)
    err = (ErrorCode.group_authorization_failed
           if not broker.security.allowed(ctx, READ, GROUP, group_id)
           else ErrorCode.invalid_group_id if not group_id
           else broker.groups.check_coordinator(group_id))
    if err is ErrorCode.none:
        groups = broker.groups
        err = groups.coordinator.heartbeat(
            group_id, str(req.member_id), int(req.generation_id),
            getattr(req, "group_instance_id", None), groups.now_ms(),
        )
        groups.flush()
    return ctx.response({"throttle_time": 0, "error_code": err})
