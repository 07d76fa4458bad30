"""AddOffsetsToTxn (25): a group's ``__consumer_offsets`` partition joins the transaction
(issue 10), so that offsets sent with TxnOffsetCommit are committed with it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import GROUP, READ, TRANSACTIONAL_ID, WRITE

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(25, "AddOffsetsToTxn", 0, 4)
async def handle_add_offsets_to_txn(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    tid = str(req.transactional_id)
    # Kafka: WRITE on the transactional id, READ on the group
    if not broker.security.allowed(ctx, WRITE, TRANSACTIONAL_ID, tid):
        return ctx.response({"throttle_time": 0,
                             "error_code": ErrorCode.transactional_id_authorization_failed})
    if not broker.security.allowed(ctx, READ, GROUP, str(req.group_id)):
        return ctx.response({"throttle_time": 0,
                             "error_code": ErrorCode.group_authorization_failed})
    err, coordinator = broker.txns.coordinator_for(tid)
    if coordinator is not None:
        if not broker.groups.ensure_topic():
            err = ErrorCode.coordinator_not_available
        else:
            out = coordinator.add_offsets(tid, int(req.producer_id), int(req.producer_epoch),
                                          broker.groups.partition_for(str(req.group_id)),
                                          broker.txns.now_ms())
            err = out.error
            if out.write is not None:
                written = await broker.txns.write(coordinator, out.write)
                if err is ErrorCode.none:
                    err = written
    # Kafka (KIP-588): v0-v1 clients know INVALID_PRODUCER_EPOCH, not PRODUCER_FENCED
    if err is ErrorCode.producer_fenced and ctx.api_version < 2:
        err = ErrorCode.invalid_producer_epoch
    return ctx.response({"throttle_time": 0, "error_code": err})
