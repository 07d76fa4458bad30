"""SyncGroup (14) v0-5: the leader's assignment handed to every member (R-GRP-3).

Followers' syncs are parked until the leader's arrives (``ClassicGroup.sync``); the
assignment bytes are carried opaquely, so every client-side assignor works.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import GROUP, READ
from headrace.group.classic import ClassicGroup, Parked, SyncResult

if TYPE_CHECKING:
    from headrace.broker.server import Broker

PARK_MARGIN_MS = 10_000
MIN_PARK_MS = 30_000


def _answer(ctx: RequestContext, res: SyncResult) -> Any:
    return ctx.response({
        "throttle_time": 0,
        "error_code": res.error,
        "protocol_type": res.protocol_type,
        "protocol_name": res.protocol_name,
        "assignment": res.assignment,
    })


@handler(14, "SyncGroup", 0, 5)
async def handle_sync_group(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    group_id = str(req.group_id)
    if not broker.security.allowed(ctx, READ, GROUP, group_id):
        return _answer(ctx, SyncResult(0, ErrorCode.group_authorization_failed))
    if not group_id:
        return _answer(ctx, SyncResult(0, ErrorCode.invalid_group_id))
    err = broker.groups.check_coordinator(group_id)
    if err is not ErrorCode.none:
        return _answer(ctx, SyncResult(0, err))
    groups = broker.groups
    assignments = {str(a.member_id): bytes(a.assignment) for a in req.assignments}
    result = groups.coordinator.sync_group(
        group_id, str(req.member_id), int(req.generation_id),
        getattr(req, "group_instance_id", None), getattr(req, "protocol_type", None),
        getattr(req, "protocol_name", None), assignments, groups.now_ms(),
    )
    if isinstance(result, Parked):
        g = groups.coordinator.groups.get(group_id)
        wait_ms = max(g.rebalance_timeout_ms() if isinstance(g, ClassicGroup) else 0,
                      MIN_PARK_MS) + PARK_MARGIN_MS
        fut = groups.park(group_id, result.ticket, sync=True)
        groups.flush()
        done = await groups.wait(group_id, fut, result.ticket, wait_ms)
        if not isinstance(done, SyncResult):
            done = SyncResult(0, ErrorCode.rebalance_in_progress)
        return _answer(ctx, done)
    groups.flush()
    return _answer(ctx, result)
