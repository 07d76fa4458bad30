"""InitProducerId (22): producer ids for idempotent producers (R-PROTO-7).

Ids come from blocks reserved in the metadata store (persisted before use, so an id is
never handed out twice, even across a crash). A producer that asks again with its current
id and epoch (KIP-360, v3+) gets the epoch bumped; at the epoch limit, a new id. A
transactional id goes to its transaction coordinator (``TxnService``), which answers
NOT_COORDINATOR where another broker coordinates it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler, ms
from headrace.broker.security import IDEMPOTENT_WRITE, TOPIC, TRANSACTIONAL_ID, WRITE
from headrace.metadata.store import MetadataError

if TYPE_CHECKING:
    from headrace.broker.server import Broker

MAX_EPOCH = 32767
UNAVAILABLE_LOG_EVERY_S = 10.0

log = logging.getLogger("headrace.broker")


async def _new_producer_id(broker: Broker) -> int | None:
    """A new producer id, or None when no block can be reserved now (ZooKeeper
    unreachable, the metadata database unwritable): the request is answered
    COORDINATOR_LOAD_IN_PROGRESS, which clients retry, as Kafka's KRaft brokers answer
    while their producer id block is not there yet. One log line per
    ``UNAVAILABLE_LOG_EVERY_S``, not one per retry."""
    ids = broker.producer_ids
    try:
        return await ids.next_async()
    except MetadataError as e:
        now = time.monotonic()
        if ids.unavailable_logged_at is None or (
                now - ids.unavailable_logged_at >= UNAVAILABLE_LOG_EVERY_S):
            ids.unavailable_logged_at = now
            log.warning("InitProducerId answered COORDINATOR_LOAD_IN_PROGRESS: %s", e)
        return None


@handler(22, "InitProducerId", 0, 5)
async def handle_init_producer_id(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    security = broker.security
    if req.transactional_id is not None:
        if not security.allowed(ctx, WRITE, TRANSACTIONAL_ID, str(req.transactional_id)):
            return _refused(ctx, ErrorCode.transactional_id_authorization_failed)
        return await _transactional(broker, ctx, req)
    # Kafka 3.x: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic
    if not (security.cluster_allowed(ctx, IDEMPOTENT_WRITE)
            or security.allowed_on_some(ctx, WRITE, TOPIC)):
        return _refused(ctx, ErrorCode.cluster_authorization_failed)
    pid = int(getattr(req, "producer_id", -1))
    epoch = int(getattr(req, "producer_epoch", -1))
    if pid >= 0 and 0 <= epoch < MAX_EPOCH - 1:
        new_pid, new_epoch = pid, epoch + 1
    else:
        reserved = await _new_producer_id(broker)
        if reserved is None:
            return _refused(ctx, ErrorCode.coordinator_load_in_progress)
        new_pid, new_epoch = reserved, 0
    return ctx.response(
        {"throttle_time": 0, "error_code": 0, "producer_id": new_pid, "producer_epoch": new_epoch}
    )


def _refused(ctx: RequestContext, code: ErrorCode) -> Any:
    return ctx.response({"throttle_time": 0, "error_code": code, "producer_id": -1,
                         "producer_epoch": -1})


async def _transactional(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    """The transaction coordinator's InitProducerId (``headrace.txn.coordinator``): a
    new id gets a producer id at epoch 0; an existing one its epoch bumped (an ongoing
    transaction of a zombie is aborted first: CONCURRENT_TRANSACTIONS, the client
    retries)."""
    tid = str(req.transactional_id)
    timeout_ms = ms(req.transaction_timeout)
    err, coordinator = broker.txns.coordinator_for(tid)
    pid, epoch = -1, -1
    if coordinator is not None:
        reserved: int | None = None
        m = coordinator.txns.get(tid)
        if m is None or m.producer_epoch + 1 >= MAX_EPOCH:
            reserved = await _new_producer_id(broker)
            if reserved is None:
                return _refused(ctx, ErrorCode.coordinator_load_in_progress)
            err, coordinator = broker.txns.coordinator_for(tid)  # the await may have moved it
        if coordinator is not None:
            expected = (int(getattr(req, "producer_id", -1)),
                        int(getattr(req, "producer_epoch", -1)))
            out = coordinator.init_producer_id(tid, timeout_ms, broker.txns.now_ms(),
                                               expected if ctx.api_version >= 3 else None,
                                               new_producer_id=reserved)
            err, pid, epoch = out.error, out.producer_id, out.producer_epoch
            if out.write is not None:
                written = await broker.txns.write(coordinator, out.write)
                if written is not ErrorCode.none:
                    err, pid, epoch = written, -1, -1
            if err is not ErrorCode.none:
                pid, epoch = -1, -1
    if err is ErrorCode.producer_fenced and ctx.api_version < 4:
        err = ErrorCode.invalid_producer_epoch  # Kafka: older clients know only this
    return ctx.response({"throttle_time": 0, "error_code": err, "producer_id": pid,
                         "producer_epoch": epoch})
