"""EndTxn (26) v0-4: commit or abort a transaction (issue 10).

The Prepare state is written to ``__transaction_state`` and then answered; the markers go
to the partitions' leaders afterwards and the Complete state is written when they all
have them (``TxnService``). v5 (Kafka's transaction version 2, an epoch bump per
transaction) is not advertised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import TRANSACTIONAL_ID, WRITE

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(26, "EndTxn", 0, 4)
async def handle_end_txn(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    tid = str(req.transactional_id)
    if not broker.security.allowed(ctx, WRITE, TRANSACTIONAL_ID, tid):  # Kafka's check
        return ctx.response({"throttle_time": 0,
                             "error_code": ErrorCode.transactional_id_authorization_failed})
    err, coordinator = broker.txns.coordinator_for(tid)
    if coordinator is not None:
        out = coordinator.end_txn(tid, int(req.producer_id), int(req.producer_epoch),
                                  bool(req.committed), broker.txns.now_ms())
        err = out.error
        if out.write is not None:
            written = await broker.txns.write(coordinator, out.write)
            if err is ErrorCode.none:
                err = written
    # Kafka: v0-v1 clients know INVALID_PRODUCER_EPOCH, not PRODUCER_FENCED
    if err is ErrorCode.producer_fenced and ctx.api_version < 2:
        err = ErrorCode.invalid_producer_epoch
    return ctx.response({"throttle_time": 0, "error_code": err})
