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
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler, ms
from headrace.broker.replica_manager import Partition, TopicPartition
from headrace.broker.security import TOPIC, TRANSACTIONAL_ID, WRITE
from headrace.broker.topics import INTERNAL_TOPICS
from headrace.log.errors import LogError
from headrace.log.producer_state import VerificationGuard
from headrace.protocol.codec import ProducePartition, encode_produce_body
from headrace.protocol.records import (
    ATTRIBUTES_POS,
    CODEC_MASK,
    CODEC_ZSTD,
    TRANSACTIONAL_BIT,
    InvalidRecordError,
    check_produce_records,
    read_header,
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
) -> ProducePartition:
    return ProducePartition(index, code, base_offset, log_append_time_ms, log_start_offset,
                            message, record_errors)


# v0-v2 are advertised, never served, as Kafka 4.0 does (KAFKA-18659): librdkafka before its
# fix (librdkafka issue 4956) compresses only if Produce v0 is advertised; those versions are
# refused before they reach this handler (``protocol/legacy.py``: UNSUPPORTED_VERSION, the
# connection is closed).
@handler(0, "Produce", 0, 12)
async def handle_produce(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    acks = int(req.acks)
    timeout_ms = ms(req.timeout)
    results: list[tuple[str, list[ProducePartition]]] = []
    waits: list[tuple[Partition, int, ProducePartition]] = []
    # Kafka (``KafkaApis.handleProduceRequest``): transactional records need a
    # transactional id and WRITE on it (else every partition
    # TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then WRITE on each topic
    writable: set[str] | None = None
    refusal: ErrorCode | None = None
    txn_id = getattr(req, "transactional_id", None)
    if _has_transactional_records(req) and (txn_id is None or (
            broker.security.enabled and not broker.security.allowed(
                ctx, WRITE, TRANSACTIONAL_ID, str(txn_id)))):
        refusal = ErrorCode.transactional_id_authorization_failed
    if broker.security.enabled:
        writable = broker.security.allowed_names(
            ctx, WRITE, TOPIC, (str(t.name) for t in req.topic_data or ()))

    # the partitions that pass the request-level checks, appended after the transaction
    # verification (if any batch needs one)
    appends: list[tuple[str, TopicPartition, Partition, memoryview, list[ProducePartition],
                        int]] = []
    for topic in req.topic_data or ():
        partition_results: list[ProducePartition] = []
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
            except InvalidRecordError as e:
                log.debug("produce to %s rejected: %s", tp, e)
                message, record_errors = e.in_partition(str(tp))
                partition_results.append(_partition_result(
                    index, e.error_code, message=message or None, record_errors=record_errors,
                ))
                continue
            partition_results.append(_PENDING)  # filled in below
            appends.append((topic.name, tp, partition, records, partition_results,
                            len(partition_results) - 1))

    verify = broker.txns.verification_enabled
    guards: dict[TopicPartition, VerificationGuard] = {}
    refused: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}
    awaited = False
    if verify and txn_id is not None and appends:
        guards, refused, awaited = await _verify_transaction(broker, str(txn_id), appends)

    for topic_name, tp, partition, records, partition_results, slot in appends:
        index = tp.partition
        if tp in refused:
            code, why = refused[tp]
            partition_results[slot] = _partition_result(index, code, message=why)
            continue
        if awaited and (broker.replicas.get(tp) is not partition
                        or not partition.is_leader(broker.node_id)):
            # leadership moved while the coordinator was asked
            partition_results[slot] = _partition_result(index,
                                                        ErrorCode.not_leader_or_follower)
            continue
        try:
            res = partition.append_as_leader(records, verify_txn=verify, guard=guards.get(tp))
        except InvalidRecordError as e:
            log.debug("produce to %s rejected: %s", tp, e)
            message, record_errors = e.in_partition(str(tp))
            partition_results[slot] = _partition_result(
                index, e.error_code, message=message or None, record_errors=record_errors,
            )
            continue
        except LogError as e:
            log.debug("produce to %s failed: %s", tp, e)
            partition_results[slot] = _partition_result(index, e.error_code,
                                                        message=str(e) or None)
            continue
        broker.replicas.wake(tp)
        broker.metrics.produced(topic_name, len(records),
                                res.last_offset - res.first_offset + 1)
        entry = _partition_result(
            index, ErrorCode.none, res.first_offset, res.log_append_time_ms,
            res.log_start_offset,
        )
        partition_results[slot] = entry
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
    # encoded by hand (kio's generic writer was an eighth of a small Produce's CPU)
    return encode_produce_body(ctx.api_version, results)


_PENDING = ProducePartition(-1, ErrorCode.none)  # a slot the append fills in


# Kafka's ReplicaManager: verification errors a client may not retry correctly become
# NOT_ENOUGH_REPLICAS (retriable, and no metadata refresh)
_RETRIABLE_VERIFICATION = frozenset({
    ErrorCode.concurrent_transactions, ErrorCode.network_exception,
    ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
    ErrorCode.not_coordinator})


def verification_error(error: ErrorCode) -> tuple[ErrorCode, str | None]:
    """What a producer hears when its partition was not verified (Kafka's
    ``postVerificationCallback``)."""
    if error is ErrorCode.invalid_txn_state:
        return error, "Partition was not added to the transaction"
    if error in _RETRIABLE_VERIFICATION:
        return ErrorCode.not_enough_replicas, (
            "Unable to verify the partition has been added to the transaction. "
            f"Underlying error: {error.name.upper()}")
    return error, None


async def _verify_transaction(
    broker: Broker, txn_id: str,
    appends: list[tuple[str, TopicPartition, Partition, memoryview, list[ProducePartition],
                        int]],
) -> tuple[dict[TopicPartition, VerificationGuard],
           dict[TopicPartition, tuple[ErrorCode, str | None]], bool]:
    """KIP-890 (Kafka's ``handleProduceAppend``): the partitions whose transactional batch
    starts its producer's transaction here are verified with the coordinator first; the
    guards to append them with, the partitions refused, and whether the coordinator was
    asked. Batch-level: one header read
    per transactional batch; a producer whose transaction is ongoing here costs nothing
    more."""
    producers: set[tuple[int, int]] = set()
    to_verify: list[tuple[TopicPartition, Partition, int]] = []
    for _, tp, partition, records, _, _ in appends:
        if not records[ATTRIBUTES_POS + 1] & TRANSACTIONAL_BIT:
            continue
        h = read_header(records, 0)
        producers.add((h.producer_id, h.producer_epoch))
        to_verify.append((tp, partition, h.producer_id))
    if not producers:
        return {}, {}, False
    if len(producers) > 1:  # Kafka: InvalidPidMappingException for the whole request
        mixed = (ErrorCode.invalid_producer_id_mapping,
                 "Transactional records contained more than one producer ID")
        return {}, {tp: mixed for _, tp, _, _, _, _ in appends}, False
    ((producer_id, producer_epoch),) = producers
    guards: dict[TopicPartition, VerificationGuard] = {}
    for tp, partition, pid in to_verify:
        guard = partition.log.start_txn_verification(pid)
        if guard is not None:
            guards[tp] = guard
    if not guards:
        return {}, {}, False
    unverified = await broker.txns.verifier.verify(txn_id, producer_id, producer_epoch,
                                               [(tp.topic, tp.partition) for tp in guards])
    refused: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}
    for tp, guard in list(guards.items()):
        code = unverified.get((tp.topic, tp.partition))
        if code is None:
            continue
        refused[tp] = verification_error(code)
        del guards[tp]
        hosted = broker.replicas.get(tp)
        if hosted is not None:
            hosted.log.producer_state.abandon_verification(producer_id, guard)
    if refused:
        log.debug("transactional produce of %r (producer %d epoch %d) refused: %s", txn_id,
                  producer_id, producer_epoch,
                  ", ".join(f"{tp}: {code.name.upper()}" for tp, (code, _) in refused.items()))
    return guards, refused, True


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
    waits: list[tuple[Partition, int, ProducePartition]], timeout_ms: int
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
            entry.error_code = ErrorCode.request_timed_out
        elif ok is False:
            entry.error_code = ErrorCode.not_leader_or_follower
        elif p.in_sync_count() < p.log.config.min_insync_replicas:
            entry.error_code = ErrorCode.not_enough_replicas_after_append
