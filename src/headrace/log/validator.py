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
  exactly ``recordsCount`` well-framed records (``records.iter_record_scans``: INVALID_RECORD);
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
message) per bad record in ``InvalidRecordError.record_errors`` (Produce v8+; the first
``MAX_RECORD_ERRORS`` of them), and the error is INVALID_TIMESTAMP if any record's is, else
INVALID_RECORD. All of it is bulk work over the records bytes (``records.iter_record_scans``:
numpy, a chunk of records at a time so memory stays bounded); a batch of up to
``SMALL_BATCH`` (80) records, where numpy's fixed cost dominates, is read and checked by
plain loops, and goes through numpy only if something in it is wrong (which then words the
errors). Where the C extension ``headrace._speedups`` was built (``setup.py``; optional),
its ``records_ok`` checks a batch of any size first, in one pass over the bytes, and only
a batch it does not accept takes the Python paths (which then find and word the error): it
is as strict as they are, never more lenient (``tests/unit/test_speedups.py``).

``HEADRACE_BENCH_SKIP_RECORD_VALIDATION=1`` in the broker's environment skips everything
but the compacted-topic key check (for ``bench/validation_bench.py`` only).
"""

from __future__ import annotations

import os
from types import ModuleType

import numpy as np
from kio.schema.errors import ErrorCode

from headrace import speedups
from headrace.config import LogConfig
from headrace.protocol.records import (
    HEADER_SIZE,
    SMALL_BATCH,
    TOPIC_PARTITION,
    BatchHeader,
    InvalidRecordError,
    inflate,
    inflate_limit,
    iter_record_scans,
    scan_small_records,
)

SKIP_ENV = "HEADRACE_BENCH_SKIP_RECORD_VALIDATION"
_SKIP = os.environ.get(SKIP_ENV) == "1"

_speedups: ModuleType | None = speedups.native

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
                _validate_records(batch, h, config, now_ms, limit, keys_only=True)
            continue
        validate_batch(batch, h, config, now_ms, limit)


def validate_batch(
    batch: memoryview, h: BatchHeader, config: LogConfig, now_ms: int, limit: int | None = None
) -> None:
    """Validate one batch (``batch``: its bytes, header included)."""
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
    _validate_records(batch, h, config, now_ms, limit)


MAX_RECORD_ERRORS = 1000
"""Record errors kept for the response (Kafka lists all; a batch may hold millions)."""


def _validate_records(batch: memoryview, h: BatchHeader, config: LogConfig, now_ms: int,
                      limit: int, keys_only: bool = False) -> None:
    """The per-record checks, a chunk of records at a time (bounded memory)."""
    check_time = not keys_only and config.message_timestamp_type != LOG_APPEND_TIME
    lo = max(now_ms - config.message_timestamp_before_max_ms, _INT64_MIN)
    hi = min(now_ms + config.message_timestamp_after_max_ms, _INT64_MAX)
    errors: dict[int, tuple[ErrorCode, str]] = {}
    total = 0
    bad_time = False
    data = inflate(h.compression, batch[HEADER_SIZE:], limit)
    if _speedups is not None:
        flags = ((0 if keys_only else _speedups.CHECK_OFFSETS)
                 | (_speedups.CHECK_TIMES if check_time else 0)
                 | (_speedups.REQUIRE_KEYS if config.compact else 0))
        records_ok = _speedups.records_ok(data, h.records_count, h.base_timestamp, lo, hi,
                                          flags)
    else:
        records_ok = False
    # a few records, all good, are checked in plain Python: no numpy pass
    records_ok = records_ok or (h.records_count <= SMALL_BATCH and _small_batch_ok(
        data, h, config, lo, hi, check_time, keys_only))
    for first, scan in () if records_ok else iter_record_scans(data, h.records_count):
        n = len(scan.offset_delta)
        bad_offset = (scan.offset_delta != np.arange(first, first + n, dtype=np.int64)
                      if not keys_only else np.zeros(n, dtype=bool))
        keyless = scan.key_length < 0 if config.compact else np.zeros(n, dtype=bool)
        if check_time:
            with np.errstate(over="ignore"):
                stamps = scan.timestamp_delta + np.int64(h.base_timestamp)
            out_of_range = (stamps != NO_TIMESTAMP) & ((stamps < lo) | (stamps > hi))
        else:
            out_of_range = np.zeros(n, dtype=bool)
        bad = bad_offset | keyless | out_of_range
        if not bool(bad.any()):
            continue
        total += int(np.count_nonzero(bad))
        # a record reports one error, its key's before its timestamp's (Kafka's
        # validateRecord): INVALID_TIMESTAMP only if some record's reported error is one
        bad_time = bad_time or bool((out_of_range & ~keyless & ~bad_offset).any())
        for i in np.flatnonzero(bad)[:max(MAX_RECORD_ERRORS - len(errors), 0)].tolist():
            index = first + i
            if bad_offset[i]:
                errors[index] = (ErrorCode.invalid_record,
                                 f"record {index} has offset delta {int(scan.offset_delta[i])}, "
                                 f"expected {index}")
            elif keyless[i]:
                errors[index] = (ErrorCode.invalid_record,
                                 "Compacted topic cannot accept message without key in "
                                 f"topic partition {TOPIC_PARTITION}")
            else:
                errors[index] = (ErrorCode.invalid_timestamp,
                                 f"Timestamp {int(stamps[i])} of message with offset "
                                 f"{h.base_offset + int(scan.offset_delta[i])} is out of "
                                 f"range. The timestamp should be within [{lo}, {hi}]")
    if total:
        _raise_record_errors(errors, total, bad_time)
    if check_time and h.max_timestamp != NO_TIMESTAMP and not lo <= h.max_timestamp <= hi:
        # The header's maxTimestamp feeds the time index and retention; Kafka rewrites it
        # to the records' largest timestamp, headrace stores batches as sent: refuse.
        raise InvalidRecordError(
            ErrorCode.invalid_timestamp,
            f"batch maxTimestamp {h.max_timestamp} is out of range: it should be within "
            f"[{lo}, {hi}]",
        )


def _small_batch_ok(data: memoryview | bytes, h: BatchHeader, config: LogConfig, lo: int,
                    hi: int, check_time: bool, keys_only: bool) -> bool:
    """``_validate_records``' checks for a batch of at most ``SMALL_BATCH`` records, in
    plain Python (numpy's fixed cost per operation was most of a one-record Produce's
    validation): True when every record passes; False when any does not, or its framing is
    broken, and the numpy path then finds and words the errors."""
    fields = scan_small_records(data, h.records_count)
    if fields is None:
        return False
    ts_deltas, off_deltas, key_lens, _, _ = fields
    if not keys_only and off_deltas != list(range(len(off_deltas))):
        return False
    if config.compact and min(key_lens) < 0:
        return False
    if check_time:
        base = h.base_timestamp
        for delta in ts_deltas:
            # int64 arithmetic, as the numpy path's (a sum past int64 wraps around)
            stamp = ((base + delta + 2**63) & 0xFFFFFFFFFFFFFFFF) - 2**63
            if stamp != NO_TIMESTAMP and not lo <= stamp <= hi:
                return False
    return True


def _raise_record_errors(errors: dict[int, tuple[ErrorCode, str]], total: int,
                         bad_time: bool) -> None:
    """Kafka's ``processRecordErrors``, in its words: INVALID_TIMESTAMP if any record's
    timestamp is out of range, else INVALID_RECORD whose message lists (at most) the first
    three errors as Java prints a list of ``RecordError``; ``errors`` holds the first
    ``MAX_RECORD_ERRORS`` of ``total``. Built only for a batch already known bad."""
    record_errors = tuple((i, msg) for i, (_, msg) in sorted(errors.items()))
    if bad_time:
        raise InvalidRecordError(
            ErrorCode.invalid_timestamp,
            "One or more records have been rejected due to invalid timestamp",
            record_errors,
        )
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{msg}')"
                      for i, msg in record_errors[:3])
    raise InvalidRecordError(
        ErrorCode.invalid_record,
        f"One or more records have been rejected due to {total} record errors "
        f"in total, and only showing the first three errors at most: [{shown}]",
        record_errors,
    )
