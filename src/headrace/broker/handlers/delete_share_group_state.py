"""DeleteShareGroupState (86): the share coordinator's state API (KIP-932), served by
``share_coordinator.ShareCoordinatorService`` (brokers send it; CLUSTER_ACTION needed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.share_coordinator import state_request

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(86, "DeleteShareGroupState", 0, 0)
async def handle_delete_share_group_state(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    return await state_request(broker, ctx, req, 86)
