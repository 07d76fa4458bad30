"""ListGroups (16) v0-5: every group this broker coordinates; v4+ filter by state, v5+ by
type (``classic`` / ``consumer``), both case-insensitive as Kafka."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DESCRIBE, GROUP

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(16, "ListGroups", 0, 5)
async def handle_list_groups(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    states = set(getattr(req, "states_filter", ()) or ())
    types = set(getattr(req, "types_filter", ()) or ())
    listing = broker.groups.coordinator.list_groups(states or None, types or None)
    security = broker.security
    if not security.cluster_allowed(ctx, DESCRIBE):  # Kafka: else the DESCRIBE-able groups
        allowed = security.allowed_names(ctx, DESCRIBE, GROUP, (g.group_id for g in listing))
        listing = [g for g in listing if g.group_id in allowed]
    return ctx.response({
        "throttle_time": 0,
        "error_code": 0,
        "groups": [
            {"group_id": g.group_id, "protocol_type": g.protocol_type,
             "group_state": g.state, "group_type": g.group_type}
            for g in listing
        ],
    })
