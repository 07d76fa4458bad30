"""PURE: Kafka's LogValidator for produced batches: what a leader checks before it stores.

``validate_batches`` runs after ``split_batches`` has checked each batch's header, length and
CRC, and before offsets are assigned; it raises ``InvalidRecordError`` and then nothing of
the request is appended. Per batch, as Kafka's ``LogValidator`` (``validateBatch``,
``validateRecord``, ``DefaultRecord.readFrom``) does:

- the header's counts agree: ``lastOffsetDelta + 1 == recordsCount`` (INVALID_RECORD,
  "Inconsistent batch offset range"); a client may not set the LogAppendTime bit
  (INVALID_TIMESTAMP);
- the records block (decompressed into at most ``inflate_limit(max.message.bytes)`` bytes:
  a compression bomb is INVALID_RECORD, undecompressable bytes CORRUPT_MESSAGE) holds
  exactly ``recordsCount`` well-framed records (``records.scan_records``: INVALID_RECORD);
- offset deltas are exactly 0, 1, ..., n-1 (Kafka checks this for compressed batches, whose
  offsets it reassigns, "inner records offset should always be continuous"; here for every
  batch, since the stored bytes are what consumers read and a delta past
  ``lastOffsetDelta`` stalls them);
- compacted topics refuse records without a key (INVALID_RECORD);
- with CreateTime, a record timestamp (other than -1) more than
  message.timestamp.before.max.ms before ``now_ms`` or message.timestamp.after.max.ms after
  it is INVALID_TIMESTAMP (KIP-937); so is a batch whose header maxTimestamp is (Kafka
  would rewrite it to the records' largest timestamp; here batches are stored as sent).

Record errors are collected as Kafka's ``processRecordErrors`` does: one (record index,
message) per bad record in ``InvalidRecordError.record_errors`` (Produce v8+), and the error
is INVALID_TIMESTAMP if any record's is, else INVALID_RECORD. All of it is numpy over the
records bytes: no Python work per record (except records with many headers).

``HEADRACE_BENCH_SKIP_RECORD_VALIDATION=1`` in the broker's environment skips everything
but the compacted-topic key check (for ``bench/validation_bench.py`` only).
"""

from __future__ import annotations

import os

import numpy as np
from kio.schema.errors import ErrorCode

from headrace.config import LogConfig
from headrace.protocol.records import (
    HEADER_SIZE,
    BatchHeader,
    InvalidRecordError,
    RecordScan,
    inflate,
    inflate_limit,
    scan_records,
)

SKIP_ENV = "HEADRACE_BENCH_SKIP_RECORD_VALIDATION"
_SKIP = os.environ.get(SKIP_ENV) == "1"

NO_TIMESTAMP = -1
LOG_APPEND_TIME = "LogAppendTime"  # message.timestamp.type
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def validate_batches(
    records: bytes | memoryview, headers: list[BatchHeader], config: LogConfig, now_ms: int
) -> None:
    """Check the records inside ``headers``' batches against the topic's rules."""
    view = memoryview(records)
    limit = inflate_limit(config.max_message_bytes)
    for h in headers:
        batch = view[h.position:h.position + h.size]
        if _SKIP:
            if config.compact:
                _check_keys(_scan(batch, h, limit), config)
            continue
        validate_batch(batch, h, config, now_ms, limit)


def _scan(batch: memoryview, h: BatchHeader, limit: int) -> RecordScan:
    return scan_records(inflate(h.compression, batch[HEADER_SIZE:], limit), h.records_count)


def validate_batch(
    batch: memoryview, h: BatchHeader, config: LogConfig, now_ms: int, limit: int | None = None
) -> RecordScan:
    """Validate one batch (``batch``: its bytes, header included); returns its scan."""
    if h.last_offset_delta + 1 != h.records_count:
        raise InvalidRecordError(
            ErrorCode.invalid_record,
            f"inconsistent batch offset range [0, {h.last_offset_delta}] and count of records "
            f"{h.records_count}",
        )
    if h.is_log_append_time:
        message = "producer should not set timestamp type to LogAppendTime"
        raise InvalidRecordError(ErrorCode.invalid_timestamp, message, ((0, message),))
    if limit is None:
        limit = inflate_limit(config.max_message_bytes)
    scan = _scan(batch, h, limit)
    errors: dict[int, tuple[ErrorCode, str]] = {}
    n = h.records_count
    expected = np.arange(n, dtype=np.int64)
    for i in np.flatnonzero(scan.offset_delta != expected)[:n].tolist():
        errors.setdefault(i, (ErrorCode.invalid_record,
                              f"record {i} has offset delta {int(scan.offset_delta[i])}, "
                              f"expected {i}"))
    if config.compact:
        for i in np.flatnonzero(scan.key_length < 0).tolist():
            errors.setdefault(i, (ErrorCode.invalid_record,
                                  "compacted topic cannot accept message without key "
                                  f"(record {i})"))
    if config.message_timestamp_type != LOG_APPEND_TIME:
        lo = max(now_ms - config.message_timestamp_before_max_ms, _INT64_MIN)
        hi = min(now_ms + config.message_timestamp_after_max_ms, _INT64_MAX)
        with np.errstate(over="ignore"):
            stamps = scan.timestamp_delta + np.int64(h.base_timestamp)
        bad = (stamps != NO_TIMESTAMP) & ((stamps < lo) | (stamps > hi))
        for i in np.flatnonzero(bad).tolist():
            errors.setdefault(i, (ErrorCode.invalid_timestamp,
                                  f"timestamp {int(stamps[i])} of record {i} is out of range: "
                                  f"it should be within [{lo}, {hi}]"))
        if not errors and h.max_timestamp != NO_TIMESTAMP and not lo <= h.max_timestamp <= hi:
            # The header's maxTimestamp feeds the time index and retention; Kafka rewrites
            # it to the records' largest timestamp, headrace stores batches as sent: refuse.
            raise InvalidRecordError(
                ErrorCode.invalid_timestamp,
                f"batch maxTimestamp {h.max_timestamp} is out of range: it should be within "
                f"[{lo}, {hi}]",
            )
    if errors:
        _raise_record_errors(errors)
    return scan


def _check_keys(scan: RecordScan, config: LogConfig) -> None:
    keyless = np.flatnonzero(scan.key_length < 0).tolist()
    if keyless:
        _raise_record_errors({
            i: (ErrorCode.invalid_record,
                f"compacted topic cannot accept message without key (record {i})")
            for i in keyless
        })


def _raise_record_errors(errors: dict[int, tuple[ErrorCode, str]]) -> None:
    """Kafka's ``processRecordErrors``: INVALID_TIMESTAMP if any record's timestamp is out
    of range, else INVALID_RECORD listing (at most) the first three errors."""
    record_errors = tuple((i, msg) for i, (_, msg) in sorted(errors.items()))
    if any(code == ErrorCode.invalid_timestamp for code, _ in errors.values()):
        raise InvalidRecordError(
            ErrorCode.invalid_timestamp,
            "one or more records have been rejected due to invalid timestamp: "
            + "; ".join(msg for _, msg in record_errors[:3]),
            record_errors,
        )
    raise InvalidRecordError(
        ErrorCode.invalid_record,
        f"one or more records have been rejected due to {len(record_errors)} record errors "
        "in total, and only showing the first three errors at most: "
        + "; ".join(msg for _, msg in record_errors[:3]),
        record_errors,
    )
