"""ListTransactions (66) v0-1: the transactional ids this broker coordinates, filtered by
state, producer id and (v1, KIP-994) how long they have been running (issue 10;
``headrace transactions list``). Only the ids the principal may DESCRIBE are listed
(Kafka's ``handleListTransactionsRequest``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler, ms
from headrace.broker.handlers.describe_transactions import STATE_NAMES
from headrace.broker.security import DESCRIBE, TRANSACTIONAL_ID
from headrace.txn.records import TxnState

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(66, "ListTransactions", 0, 1)
async def handle_list_transactions(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    names = {v: k for k, v in STATE_NAMES.items()}
    wanted = [str(s) for s in req.state_filters]
    unknown = [s for s in wanted if s not in names]
    states = {names[s] for s in wanted if s in names}
    pids = {int(p) for p in req.producer_id_filters}
    duration = ms(getattr(req, "duration_filter", -1))
    now = broker.txns.now_ms()
    out = []
    for c in broker.txns.coordinators.values():
        for tid, m in sorted(c.txns.items()):
            if (wanted and m.state not in states) or (pids and m.producer_id not in pids):
                continue
            if duration >= 0 and not (m.state == TxnState.ONGOING
                                      and now - m.start_ms >= duration):
                continue
            if not broker.security.allowed(ctx, DESCRIBE, TRANSACTIONAL_ID, tid):
                continue
            out.append({"transactional_id": tid, "producer_id": m.producer_id,
                        "transaction_state": STATE_NAMES[m.state]})
    return ctx.response({"throttle_time": 0, "error_code": ErrorCode.none,
                         "unknown_state_filters": unknown, "transaction_states": out})
