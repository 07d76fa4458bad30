"""JoinGroup (11) v0-9: the first half of a classic rebalance (R-GRP-3).

The decisions are ``ClassicGroup.join``'s; this handler converts the request, parks the
answer when the group does (until every member has rejoined or the rebalance timeout
passes) and converts the answer. v0 has no rebalance timeout (it is the session timeout);
v4+ gets the KIP-394 MEMBER_ID_REQUIRED round trip; v9 the KIP-814 ``skip_assignment``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler, ms
from headrace.broker.security import GROUP, READ
from headrace.group.classic import JoinRequest, JoinResult, Parked

if TYPE_CHECKING:
    from headrace.broker.server import Broker

PARK_MARGIN_MS = 10_000


def client_host(ctx: RequestContext) -> str:
    return "/" + ctx.peer.rsplit(":", 1)[0]


def _answer(ctx: RequestContext, res: JoinResult) -> Any:
    return ctx.response({
        "throttle_time": 0,
        "error_code": res.error,
        "generation_id": res.generation,
        "protocol_type": res.protocol_type,
        "protocol_name": res.protocol_name if ctx.api_version >= 7 else
        (res.protocol_name or ""),
        "leader": res.leader,
        "skip_assignment": res.skip_assignment,
        "member_id": res.member_id,
        "members": [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
             "metadata": m.metadata}
            for m in res.members
        ],
    })


@handler(11, "JoinGroup", 0, 9)
async def handle_join_group(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    group_id = str(req.group_id)
    member_id = str(req.member_id)
    if not broker.security.allowed(ctx, READ, GROUP, group_id):
        return _answer(ctx, JoinResult(0, ErrorCode.group_authorization_failed, member_id))
    if not group_id:
        return _answer(ctx, JoinResult(0, ErrorCode.invalid_group_id, member_id))
    err = broker.groups.check_coordinator(group_id)
    if err is not ErrorCode.none:
        return _answer(ctx, JoinResult(0, err, member_id))
    session_timeout_ms = ms(req.session_timeout)
    rebalance_timeout_ms = (ms(req.rebalance_timeout) if ctx.api_version >= 1
                            else session_timeout_ms)
    jr = JoinRequest(
        member_id=member_id,
        group_instance_id=getattr(req, "group_instance_id", None),
        client_id=ctx.header.client_id or "",
        client_host=client_host(ctx),
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        protocol_type=str(req.protocol_type),
        protocols=tuple((str(p.name), bytes(p.metadata)) for p in req.protocols),
        require_known_member_id=ctx.api_version >= 4,
        supports_skip_assignment=ctx.api_version >= 9,
    )
    groups = broker.groups
    result = groups.coordinator.join_group(group_id, jr, groups.now_ms())
    if isinstance(result, Parked):
        fut = groups.park(group_id, result.ticket)
        groups.flush()
        done = await groups.wait(group_id, fut, result.ticket,
                                 rebalance_timeout_ms + PARK_MARGIN_MS)
        if not isinstance(done, JoinResult):
            done = JoinResult(0, ErrorCode.rebalance_in_progress, member_id)
        return _answer(ctx, done)
    groups.flush()
    return _answer(ctx, result)
