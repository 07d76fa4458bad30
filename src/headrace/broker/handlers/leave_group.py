"""LeaveGroup (13) v0-5: members leave at once instead of waiting for their session
timeout; v3+ batches members and names static members by ``group_instance_id``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import GROUP, READ

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(13, "LeaveGroup", 0, 5)
async def handle_leave_group(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    group_id = str(req.group_id)
    if ctx.api_version >= 3:
        members = [(str(m.member_id), m.group_instance_id) for m in req.members]
    else:
        members = [(str(req.member_id), None)]
    err = (ErrorCode.group_authorization_failed
           if not broker.security.allowed(ctx, READ, GROUP, group_id)
           else ErrorCode.invalid_group_id if not group_id
           else broker.groups.check_coordinator(group_id))
    errors: list[ErrorCode] = []
    if err is ErrorCode.none:
        groups = broker.groups
        err, errors = groups.coordinator.leave_group(group_id, members, groups.now_ms())
        groups.flush()
    if ctx.api_version < 3:
        if err is ErrorCode.none and errors:
            err = errors[0]
        return ctx.response({"throttle_time": 0, "error_code": err})
    return ctx.response({
        "throttle_time": 0,
        "error_code": err,
        "members": [
            {"member_id": m, "group_instance_id": i, "error_code": e}
            for (m, i), e in zip(members, errors, strict=False)
        ] if err is ErrorCode.none else [],
    })
