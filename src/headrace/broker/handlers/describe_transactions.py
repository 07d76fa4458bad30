"""DescribeTransactions (65): the state of transactional ids this broker coordinates
(issue 10; ``kafka-transactions.sh describe``, ``headrace transactions describe``).

Authorization (Kafka's ``handleDescribeTransactionsRequest``): an id the principal may not
DESCRIBE is TRANSACTIONAL_ID_AUTHORIZATION_FAILED; the topics of a described transaction
are only those the principal may DESCRIBE.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DESCRIBE, TOPIC, TRANSACTIONAL_ID
from headrace.txn.records import TxnState

if TYPE_CHECKING:
    from headrace.broker.server import Broker

# Kafka's TransactionState names
STATE_NAMES = {TxnState.EMPTY: "Empty", TxnState.ONGOING: "Ongoing",
               TxnState.PREPARE_COMMIT: "PrepareCommit", TxnState.PREPARE_ABORT: "PrepareAbort",
               TxnState.COMPLETE_COMMIT: "CompleteCommit",
               TxnState.COMPLETE_ABORT: "CompleteAbort", TxnState.DEAD: "Dead",
               TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence"}


def _time(ms: int) -> datetime.datetime:
    """A timestamp field (kio writes an aware datetime as int64 ms; -1: none)."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


def _describe(broker: Broker, ctx: RequestContext, tid: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"error_code": ErrorCode.none, "transactional_id": tid,
                             "transaction_state": "", "transaction_timeout": 0,
                             "transaction_start_time": _time(0), "producer_id": 0,
                             "producer_epoch": 0, "topics": []}  # Kafka's defaults
    security = broker.security
    if not security.allowed(ctx, DESCRIBE, TRANSACTIONAL_ID, tid):
        entry["error_code"] = ErrorCode.transactional_id_authorization_failed
        return entry
    err, coordinator = broker.txns.coordinator_for(tid)
    if coordinator is None:
        entry["error_code"] = err
        return entry
    m = coordinator.txns.get(tid)
    if m is None:
        entry["error_code"] = ErrorCode.transactional_id_not_found
        return entry
    topics: dict[str, list[int]] = {}
    described = security.allowed_names(ctx, DESCRIBE, TOPIC, (t for t, _ in m.partitions))
    for t, p in sorted(m.partitions):
        if t in described:
            topics.setdefault(t, []).append(p)
    entry.update(transaction_state=STATE_NAMES[m.state], transaction_timeout=m.timeout_ms,
                 transaction_start_time=_time(m.start_ms), producer_id=m.producer_id,
                 producer_epoch=m.producer_epoch,
                 topics=[{"topic": t, "partitions": ps} for t, ps in topics.items()])
    return entry


@handler(65, "DescribeTransactions", 0, 0)
async def handle_describe_transactions(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    return ctx.response({"throttle_time": 0, "transaction_states": [
        _describe(broker, ctx, str(tid)) for tid in req.transactional_ids]})
