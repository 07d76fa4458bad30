"""Produce (0): append record batches to partition leaders (R-PROTO-3, R-LOG-3/4).

acks=0 gets no response (the request is still appended in full), acks=1 is answered after
the leader's append, acks=all (-1) after the high watermark passes the appended batches or
``timeout`` expires (REQUEST_TIMED_OUT). Batches are validated and stored byte for byte;
only the base offset and partition leader epoch are rewritten (``PartitionLog``).

Before a partition's records reach its log they get Kafka's request-level checks
(``KafkaApis.handleProduceRequest``): internal topics refuse client appends
(INVALID_TOPIC_EXCEPTION, ``ReplicaManager.appendToLocalLog`` with internalTopicsAllowed
false), and ``ProduceRequest.validateRecords`` wants exactly one whole magic-2 batch
(INVALID_RECORD) and no zstd before v7 (UNSUPPORTED_COMPRESSION_TYPE). A rejected record
batch is answered with ``error_message`` and, from v8, ``record_errors`` (the index of each
bad record in its batch), as Kafka's LogValidator reports them.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler, ms
from headrace.broker.replica_manager import Partition, TopicPartition
from headrace.broker.security import TOPIC, TRANSACTIONAL_ID, WRITE
from headrace.broker.topics import INTERNAL_TOPICS
from headrace.log.errors import LogError
from headrace.protocol.records import (
    ATTRIBUTES_POS,
    CODEC_MASK,
    CODEC_ZSTD,
    InvalidRecordError,
    check_produce_records,
)

if TYPE_CHECKING:
    from headrace.broker.server import Broker

log = logging.getLogger("headrace.produce")


def _partition_result(
    index: int,
    code: ErrorCode,
    base_offset: int = -1,
    log_append_time_ms: int = -1,
    log_start_offset: int = -1,
    message: str | None = None,
    record_errors: tuple[tuple[int, str], ...] = (),
) -> dict[str, Any]:
    return {
        "index": index,
        "error_code": code,
        "base_offset": base_offset,
        "log_append_time": (
            None
            if log_append_time_ms < 0
            else datetime.datetime.fromtimestamp(log_append_time_ms / 1000, datetime.UTC)
        ),
        "log_start_offset": log_start_offset,
        "record_errors": tuple(
            {"batch_index": i, "batch_index_error_message": m} for i, m in record_errors
        ),
        "error_message": message,
    }


# v0-v2 are advertised, never served, as Kafka 4.0 does (KAFKA-18659): librdkafka before its
# fix (librdkafka issue 4956) compresses only if Produce v0 is advertised; those versions are
# refused before they reach this handler (``protocol/legacy.py``: UNSUPPORTED_VERSION, the
# connection is closed).
@handler(0, "Produce", 0, 12)
async def handle_produce(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    acks = int(req.acks)
    timeout_ms = ms(req.timeout)
    results: list[tuple[str, list[dict[str, Any]]]] = []
    waits: list[tuple[Partition, int, dict[str, Any]]] = []
    # Kafka: transactional records need WRITE on the transactional id (else every
    # partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then WRITE on each topic
    writable: set[str] | None = None
    refusal: ErrorCode | None = None
    if broker.security.enabled:
        txn_id = getattr(req, "transactional_id", None)
        if _has_transactional_records(req) and (txn_id is None or not broker.security.allowed(
                ctx, WRITE, TRANSACTIONAL_ID, str(txn_id))):
            refusal = ErrorCode.transactional_id_authorization_failed
        writable = broker.security.allowed_names(
            ctx, WRITE, TOPIC, (str(t.name) for t in req.topic_data or ()))

    for topic in req.topic_data or ():
        partition_results: list[dict[str, Any]] = []
        results.append((topic.name, partition_results))
        for pd in topic.partition_data or ():
            index = int(pd.index)
            if acks not in (0, 1, -1):
                partition_results.append(_partition_result(index, ErrorCode.invalid_required_acks))
                continue
            if refusal is not None:
                partition_results.append(_partition_result(index, refusal))
                continue
            if writable is not None and topic.name not in writable:
                partition_results.append(_partition_result(
                    index, ErrorCode.topic_authorization_failed))
                continue
            if topic.name in INTERNAL_TOPICS:
                partition_results.append(_partition_result(
                    index, ErrorCode.invalid_topic_exception,
                    message=f"Cannot append to internal topic {topic.name}",
                ))
                continue
            tp = TopicPartition(topic.name, index)
            partition = broker.replicas.get(tp)
            if partition is None:
                code = (
                    ErrorCode.not_leader_or_follower
                    if broker.metadata.topic(topic.name) is not None
                    and index < len(broker.metadata.topic(topic.name).partitions)  # type: ignore[union-attr]
                    else ErrorCode.unknown_topic_or_partition
                )
                partition_results.append(_partition_result(index, code))
                continue
            if not partition.is_leader(broker.node_id):
                partition_results.append(_partition_result(index, ErrorCode.not_leader_or_follower))
                continue
            if acks == -1 and partition.in_sync_count() < partition.log.config.min_insync_replicas:
                partition_results.append(
                    _partition_result(index, ErrorCode.not_enough_replicas)
                )
                continue
            try:
                records = _one_batch(pd.records, ctx.api_version)
                res = partition.append_as_leader(records)
            except InvalidRecordError as e:
                log.debug("produce to %s rejected: %s", tp, e)
                message, record_errors = e.in_partition(str(tp))
                partition_results.append(_partition_result(
                    index, e.error_code, message=message or None, record_errors=record_errors,
                ))
                continue
            except LogError as e:
                log.debug("produce to %s failed: %s", tp, e)
                partition_results.append(
                    _partition_result(index, e.error_code, message=str(e) or None)
                )
                continue
            broker.replicas.wake(tp)
            broker.metrics.produced(topic.name, len(records),
                                    res.last_offset - res.first_offset + 1)
            entry = _partition_result(
                index, ErrorCode.none, res.first_offset, res.log_append_time_ms,
                res.log_start_offset,
            )
            partition_results.append(entry)
            if acks == -1:
                waits.append((partition, res.last_offset + 1, entry))

    if acks == 0:
        return None
    if waits:
        broker.metrics.delayed_produce += 1  # kafka's produce purgatory size
        try:
            await _await_replication(waits, timeout_ms)
        finally:
            broker.metrics.delayed_produce -= 1
    return ctx.response(
        {
            "responses": [
                {"name": name, "partition_responses": prs} for name, prs in results
            ],
            "throttle_time": 0,
        }
    )


def _has_transactional_records(req: Any) -> bool:
    """Kafka's ``RequestUtils.hasTransactionalRecords``: a v2 batch with the transactional
    attribute (bit 4 of the attributes, int16 at byte 21 after baseOffset, batchLength,
    partitionLeaderEpoch, magic (byte 16) and crc)."""
    for topic in req.topic_data or ():
        for pd in topic.partition_data or ():
            records = pd.records
            if records is not None and len(records) >= 23 and records[16] == 2 \
                    and records[22] & 0x10:
                return True
    return False


def _one_batch(records: bytes | None, version: int) -> memoryview:
    """``ProduceRequest.validateRecords``: the one batch of a partition's records (bytes
    after it that are not a whole batch are dropped, as Kafka trims them)."""
    size = check_produce_records(records)
    view = memoryview(records)[:size]  # type: ignore[arg-type]  # checked: not None
    if version < 7 and view[ATTRIBUTES_POS + 1] & CODEC_MASK == CODEC_ZSTD:
        raise InvalidRecordError(
            ErrorCode.unsupported_compression_type,
            f"produce requests with version {version} may not use zstd (v7+ only)",
        )
    return view


async def _await_replication(
    waits: list[tuple[Partition, int, dict[str, Any]]], timeout_ms: int
) -> None:
    """The acks=all purgatory (Kafka's ``DelayedProduce``): wait for every partition's high
    watermark to pass its batches. Then, as Kafka's ``checkEnoughReplicasReachOffset``: an
    ISR shrunk below ``min.insync.replicas`` meanwhile answers
    NOT_ENOUGH_REPLICAS_AFTER_APPEND (the records are written; a retry may duplicate them
    unless the producer is idempotent); leadership lost meanwhile answers
    NOT_LEADER_OR_FOLLOWER; the timeout answers REQUEST_TIMED_OUT."""
    pending = [(p, off, e) for p, off, e in waits if p.log.high_watermark < off]
    done: list[bool | None] = []
    if pending:
        done = list(await asyncio.gather(
            *(p.wait_for_hw(off, timeout_ms / 1000) for p, off, _ in pending)
        ))
    outcome = {id(e): ok for ok, (_, _, e) in zip(done, pending, strict=True)}
    for p, _, entry in waits:
        ok = outcome.get(id(entry), True)
        if ok is None:
            entry["error_code"] = ErrorCode.request_timed_out
        elif ok is False:
            entry["error_code"] = ErrorCode.not_leader_or_follower
        elif p.in_sync_count() < p.log.config.min_insync_replicas:
            entry["error_code"] = ErrorCode.not_enough_replicas_after_append
