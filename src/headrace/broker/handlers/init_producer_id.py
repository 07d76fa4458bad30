"""InitProducerId (22): producer ids for idempotent producers (R-PROTO-7).

Ids come from blocks reserved in the metadata store (persisted before use, so an id is
never handed out twice, even across a crash). A producer that asks again with its current
id and epoch (KIP-360, v3+) gets the epoch bumped; at the epoch limit, a new id. Transactional
ids need the transaction coordinator, which does not exist yet: COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler

if TYPE_CHECKING:
    from headrace.broker.server import Broker

MAX_EPOCH = 32767


@handler(22, "InitProducerId", 0, 5)
async def handle_init_producer_id(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    if req.transactional_id is not None:
        return ctx.response(
            {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available,
             "producer_id": -1, "producer_epoch": -1}
        )
    pid = int(getattr(req, "producer_id", -1))
    epoch = int(getattr(req, "producer_epoch", -1))
    if pid >= 0 and 0 <= epoch < MAX_EPOCH - 1:
        new_pid, new_epoch = pid, epoch + 1
    else:
        new_pid, new_epoch = await broker.producer_ids.next_async(), 0
    return ctx.response(
        {"throttle_time": 0, "error_code": 0, "producer_id": new_pid, "producer_epoch": new_epoch}
    )
