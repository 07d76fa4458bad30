"""Record batches (v2) of a fetch response → one Arrow record batch, in bulk.

PURE: bytes in, Arrow out; no I/O. Where ``headrace._speedups`` was built, one C pass
(``record_fields``) reads every record's fields; otherwise, or where it refuses the bytes,
per-record Python work is limited to walking the record length varints (skipped when a
vectorised check proves the predicted starts) and to records that carry headers when
``includeHeaders`` is on. Everything else is numpy over the records bytes: varints are
decoded for all records at once, key and value columns are Arrow ``binary_view`` arrays
pointing into the (decompressed) records buffer, cast to ``binary`` by Arrow's C++ (one
memcpy per value, no Python ``bytes``).

The records of all batches are decoded as one stream: the records regions of the batches
(decompressed when needed) are concatenated, and per-batch fields (base offset, base and max
timestamp, timestamp type) are repeated per record.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
from kio.schema.errors import ErrorCode

from headrace import speedups
from headrace.protocol import records
from headrace.protocol.records import (
    DEFAULT_INFLATE_LIMIT,
    HEADER_SIZE,
    InvalidRecordError,
    decompress,
    inflate_limit,
    iter_batches,
    read_varint,
)

I64 = npt.NDArray[np.int64]
HEADER_TYPE = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)


def _corrupt(msg: str) -> InvalidRecordError:
    return InvalidRecordError(ErrorCode.corrupt_message, msg)


def varints(arr: npt.NDArray[np.uint8], pos: I64) -> tuple[I64, I64]:
    """Zigzag varints at every position of ``pos`` in ``arr``: (values, sizes in bytes)
    (``records.varints``, the validator's, with its errors as CORRUPT_MESSAGE)."""
    try:
        return records.varints(arr, pos, 10)
    except records.FramingError as e:
        raise _corrupt(str(e)) from None


PAD = 16


def record_starts(data: bytes, arr: npt.NDArray[np.uint8], count: int) -> I64:
    """Positions of the ``count`` consecutive records in ``data`` (each starts with its
    length varint), checked to end exactly at the end of ``data``; ``data`` ends with
    ``PAD`` zero bytes that are not part of the records (``records.record_starts``, the
    validator's bulk walker)."""
    end = len(data) - PAD
    try:
        starts, pos = records.record_starts(memoryview(data)[:end], arr[:end], count, 0)
    except records.FramingError as e:
        raise _corrupt(str(e)) from None
    if pos != end:
        raise _corrupt(f"record lengths add up to {pos} bytes, the batches hold {end}")
    return starts


def _varint_size(v: I64) -> I64:
    """Bytes of the (non-negative, already zigzagged) varints ``v``."""
    return (1 + (v >= 1 << 7).astype(np.int64) + (v >= 1 << 14) + (v >= 1 << 21)
            + (v >= 1 << 28))


def predicted_starts(arr: npt.NDArray[np.uint8], body_pos: I64, body_len: I64,
                     counts: I64) -> I64 | None:
    """The record starts of every batch at once, or None where the prediction fails.

    A producer's batch holds records whose offset deltas are 0, 1, 2, ... and whose
    timestamp deltas, keys, values and headers mostly keep their sizes: then record ``i``
    is the first record's length plus the bytes its offset delta's varint has beyond the
    first one's (one more from 64 on, two from 8,192). The starts this predicts are checked
    all together, as ``records.record_starts`` checks its guesses: each must hold a length
    varint of the predicted length and size, and the lengths must add up to the batch's
    records region exactly. The first batch that differs anywhere makes this None (the
    caller walks the records instead)."""
    n_all = int(counts.sum())
    if n_all == 0 or not len(counts) or bool((counts <= 0).any()):
        return None
    first_len, _ = records.varints(arr, body_pos, 5, guess=True)
    if bool((first_len < 0).any()):
        return None
    batch_of = np.repeat(np.arange(len(counts)), counts)
    first_index = np.cumsum(counts) - counts
    index = np.arange(n_all, dtype=np.int64) - first_index[batch_of]
    od_extra = (index >= 64).astype(np.int64) + (index >= 8192) + (index >= 1 << 20)
    length = first_len[batch_of] + od_extra
    total = _varint_size(length * 2) + length
    if not np.array_equal(np.add.reduceat(total, first_index), body_len):
        return None
    before = np.cumsum(total) - total  # bytes of all records before each one
    starts: I64 = (body_pos - before[first_index])[batch_of] + before
    got_len, got_size = records.varints(arr, starts, 5, guess=True)
    if not (np.array_equal(got_len, length) and np.array_equal(got_size, total - length)):
        return None
    return starts


def binary_column(buf: pa.Buffer, arr: npt.NDArray[np.uint8], starts: I64,
                  lengths: I64) -> pa.Array:
    """A ``binary`` array of the slices ``[start, start + length)`` of ``buf`` (length -1:
    null), built as a ``binary_view`` array over ``buf`` and cast by Arrow."""
    n = len(lengths)
    native = speedups.native
    if native is not None:  # the buffers of the binary array, in one C pass
        made = native.binary_column(arr[:len(arr) - PAD], np.ascontiguousarray(starts),
                                    np.ascontiguousarray(lengths))
        if made is not None:
            offsets, values, validity_bits, nulls = made
            return pa.Array.from_buffers(
                pa.binary(), n, [None if validity_bits is None else pa.py_buffer(validity_bits),
                                 pa.py_buffer(offsets), pa.py_buffer(values)],
                null_count=nulls)
    valid = lengths >= 0
    null_count = n - int(np.count_nonzero(valid))
    if null_count == n:
        return pa.nulls(n, pa.binary())
    lens = np.where(valid, lengths, 0).astype(np.int32)
    if len(arr) and int((starts + lens).max()) > len(arr) - PAD:
        raise _corrupt("a key or value runs past its batch")
    views = np.zeros((n, 4), dtype=np.int32)
    views[:, 0] = lens
    # Bytes 4..15: the value itself when at most 12 bytes, else its 4-byte prefix
    # (then buffer index and offset). Gather 12 bytes per view, zero past the length.
    idx = starts[:, None] + np.arange(12, dtype=np.int64)[None, :]
    if len(arr):
        np.minimum(idx, len(arr) - 1, out=idx)
        inline = arr[idx]
    else:
        inline = np.zeros((n, 12), dtype=np.uint8)
    inline[np.arange(12)[None, :] >= lens[:, None]] = 0
    views.view(np.uint8).reshape(n, 16)[:, 4:] = inline
    long = lens > 12
    views[long, 2] = 0
    views[long, 3] = starts[long].astype(np.int32)
    validity = None
    if null_count:
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    view_array = pa.Array.from_buffers(
        pa.binary_view(), n, [validity, pa.py_buffer(views), buf], null_count=null_count
    )
    return view_array.cast(pa.binary())


def _headers(data: bytes, positions: I64, counts: I64) -> list[list[dict[str, Any]]]:
    """Per-record header lists (per-record Python: only records that have headers)."""
    out: list[list[dict[str, Any]]] = [[] for _ in range(len(counts))]
    for i in np.flatnonzero(counts).tolist():
        pos = int(positions[i])
        _, pos = read_varint(data, pos)  # the count, known
        hs = out[i]
        for _ in range(int(counts[i])):
            klen, pos = read_varint(data, pos)
            key = b"" if klen < 0 else data[pos:pos + klen]
            pos += max(klen, 0)
            vlen, pos = read_varint(data, pos)
            value = None if vlen < 0 else data[pos:pos + vlen]
            pos += max(vlen, 0)
            if pos > len(data) - PAD:
                raise _corrupt("a header runs past its batch")
            hs.append({"key": key.decode("utf-8", "replace"), "value": value})
    return out


def _native_fields(data: bytes, n_all: int) -> tuple[I64, ...] | None:
    """The records' fields from ``speedups.native.record_fields`` (one C pass), or None
    where it was not built or does not accept the records (``_numpy_fields`` then reads
    them, or says what is wrong)."""
    native = speedups.native
    if native is None:
        return None
    out = tuple(np.empty(n_all, dtype=np.int64) for _ in range(7))
    if not native.record_fields(data, n_all, len(data) - PAD, *out):
        return None
    return out


def _numpy_fields(data: bytes, arr: npt.NDArray[np.uint8], lengths: I64,
                  counts: list[int]) -> tuple[I64, ...]:
    """The records' fields (timestamp and offset deltas, key position and length, value
    position and length, header count position) by numpy over all records at once."""
    predicted = predicted_starts(arr, np.cumsum(lengths) - lengths, lengths,
                                 np.array(counts, dtype=np.int64))
    starts = predicted if predicted is not None else record_starts(data, arr, sum(counts))
    rec_len, len_size = varints(arr, starts)
    body_pos = starts + len_size
    rec_end = body_pos + rec_len
    ts_delta, s1 = varints(arr, body_pos + 1)  # after the attributes byte
    p = body_pos + 1 + s1
    off_delta, s2 = varints(arr, p)
    p += s2
    key_len, s3 = varints(arr, p)
    key_pos = p + s3
    p = key_pos + np.maximum(key_len, 0)
    value_len, s4 = varints(arr, p)
    value_pos = p + s4
    header_pos = value_pos + np.maximum(value_len, 0)
    if bool(np.any(header_pos >= rec_end)):
        raise _corrupt("a record's fields run past its length")
    return ts_delta, off_delta, key_pos, key_len, value_pos, value_len, header_pos


def decode_fetched(
    blob: bytes | memoryview, from_offset: int, until_offset: int, topic: str,
    partition: int, schema: pa.Schema, include_headers: bool,
) -> tuple[pa.RecordBatch | None, int]:
    """The records of ``blob`` (a fetch response's records: whole batches, maybe a torn
    last one) with offsets in ``[from_offset, until_offset)``, and the offset to fetch next
    (after the last whole batch seen, at most ``until_offset``; ``from_offset`` if none).

    Control batches are skipped (their offsets count as read). Batches are not
    CRC-checked (the broker checked them on produce).
    """
    buf = memoryview(blob)
    regions: list[bytes | memoryview] = []
    counts: list[int] = []
    bases: list[int] = []
    base_ts: list[int] = []
    max_ts: list[int] = []
    log_append: list[bool] = []
    next_offset = from_offset
    for h in iter_batches(buf):
        if h.next_offset <= from_offset:
            continue
        if h.base_offset >= until_offset:
            break
        next_offset = max(next_offset, h.next_offset)
        if h.is_control:
            continue
        body: bytes | memoryview = buf[h.position + HEADER_SIZE:h.position + h.size]
        if h.compression:
            # the broker lets a batch inflate to inflate_limit(max.message.bytes), and the
            # topic's max.message.bytes is at least this batch's size
            body = decompress(h.compression, bytes(body),
                              max(DEFAULT_INFLATE_LIMIT, inflate_limit(h.size)))
        regions.append(body)
        counts.append(h.records_count)
        bases.append(h.base_offset)
        base_ts.append(h.base_timestamp)
        max_ts.append(h.max_timestamp)
        log_append.append(h.is_log_append_time)
    next_offset = min(next_offset, until_offset)
    if not regions:
        return None, next_offset
    lengths = np.array([len(r) for r in regions], dtype=np.int64)
    regions.append(bytes(PAD))
    data = b"".join(regions)
    arr = np.frombuffer(data, dtype=np.uint8)
    n_all = sum(counts)
    fields = _native_fields(data, n_all)
    if fields is not None:
        ts_delta, off_delta, key_pos, key_len, value_pos, value_len, header_pos = fields
    else:
        ts_delta, off_delta, key_pos, key_len, value_pos, value_len, header_pos = (
            _numpy_fields(data, arr, lengths, counts))

    per_batch = np.array(counts, dtype=np.int64)
    offsets = np.repeat(np.array(bases, dtype=np.int64), per_batch) + off_delta
    lo, hi = np.searchsorted(offsets, [from_offset, until_offset]).tolist()
    if lo >= hi:
        return None, next_offset
    sl = slice(lo, hi)
    appended = np.repeat(np.array(log_append, dtype=bool), per_batch)[sl]
    stamps = np.where(
        appended, np.repeat(np.array(max_ts, dtype=np.int64), per_batch)[sl],
        np.repeat(np.array(base_ts, dtype=np.int64), per_batch)[sl] + ts_delta[sl],
    )
    n = hi - lo
    pabuf = pa.py_buffer(data)
    columns: list[pa.Array] = [
        binary_column(pabuf, arr, key_pos[sl], key_len[sl]),
        binary_column(pabuf, arr, value_pos[sl], value_len[sl]),
        pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(n, dtype=np.int32)), pa.array([topic], pa.string())
        ).cast(pa.string()),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(offsets[sl]),
        pa.array(stamps * 1000, pa.timestamp("us", tz="UTC")),
        pa.array(appended.astype(np.int32)),
    ]
    if include_headers:
        header_count, _ = varints(arr, header_pos[sl])
        if bool(np.any(header_count)):
            columns.append(pa.array(_headers(data, header_pos[sl], header_count), HEADER_TYPE))
        else:
            columns.append(pa.ListArray.from_arrays(
                pa.array(np.zeros(n + 1, dtype=np.int32)),
                pa.array([], HEADER_TYPE.value_type), type=HEADER_TYPE,
            ))
    return pa.RecordBatch.from_arrays(columns, schema=schema), next_offset
