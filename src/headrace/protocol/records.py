"""Kafka RecordBatch v2 (magic 2): header parsing, validation and batch-level rewrites.

PURE: bytes in, values or bytes out; no file or socket I/O. Thread-safety: functions are
re-entrant; the rewrite functions mutate only the ``bytearray`` they are given.

Batch layout (all integers big-endian; ``HEADER`` below is the struct of the first 61 bytes)::

    offset  size  field
         0     8  baseOffset            int64   first offset of the batch (the broker assigns it)
         8     4  batchLength           int32   bytes that follow this field
        12     4  partitionLeaderEpoch  int32   set by the leader; not covered by the CRC
        16     1  magic                 int8    2 (0 and 1 are the old message-set formats)
        17     4  crc                   uint32  CRC-32C of bytes 21..end (attributes..last record)
        21     2  attributes            int16   bits 0-2 codec (0 none, 1 gzip, 2 snappy, 3 lz4,
                                                4 zstd); bit 3 timestamp type (1 LogAppendTime);
                                                bit 4 transactional; bit 5 control batch
        23     4  lastOffsetDelta       int32   offset of the last record minus baseOffset
        27     8  baseTimestamp         int64   timestamp of the first record
        35     8  maxTimestamp          int64   largest record timestamp (or the append time)
        43     8  producerId            int64   -1: not idempotent
        51     2  producerEpoch         int16
        53     4  baseSequence          int32   sequence of the first record (-1: none)
        57     4  recordsCount          int32
        61     …  records               compressed as one block when the codec is not none

A record (inside the possibly compressed block): length varint, attributes int8,
timestampDelta varlong, offsetDelta varint, key (varint length, -1 null, bytes), value (same),
headers (varint count, then key varint length + utf-8, value varint length + bytes). Varints
are zigzag-encoded (Protocol Buffers style).

The byte offsets in the table are derived from the struct format, never typed in. The broker
stores batches exactly as produced; it rewrites only ``baseOffset`` and
``partitionLeaderEpoch`` (both outside the CRC) and, for LogAppendTime topics, the timestamp
type bit and ``maxTimestamp`` (then recomputes the CRC). Nothing here does per-record Python
work except ``record_timestamps``, which is for ListOffsets-by-timestamp only.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import cramjam
import crc32c
import numpy as np
import numpy.typing as npt
from kio.schema.errors import ErrorCode

HEADER = struct.Struct(
    ">q"  # baseOffset
    "i"  # batchLength
    "i"  # partitionLeaderEpoch
    "b"  # magic
    "I"  # crc
    "h"  # attributes
    "i"  # lastOffsetDelta
    "q"  # baseTimestamp
    "q"  # maxTimestamp
    "q"  # producerId
    "h"  # producerEpoch
    "i"  # baseSequence
    "i"  # recordsCount
)
HEADER_SIZE = HEADER.size  # 61
BASE_OFFSET_POS = 0
LENGTH_POS = struct.calcsize(">q")
LOG_OVERHEAD = struct.calcsize(">qi")  # bytes before the part counted by batchLength
PARTITION_LEADER_EPOCH_POS = struct.calcsize(">qi")
MAGIC_POS = struct.calcsize(">qii")
CRC_POS = struct.calcsize(">qiib")
ATTRIBUTES_POS = struct.calcsize(">qiibI")
MAX_TIMESTAMP_POS = struct.calcsize(">qiibIhiq")
# The shortest prefix that tells us the format: magic sits at the same place in v0/v1/v2.
MAGIC_PREFIX = MAGIC_POS + 1

# Anything ``struct.unpack_from`` and ``crc32c`` can read; mmap for on-disk segments.
ReadableBuffer = bytes | bytearray | memoryview | mmap.mmap

_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")

CURRENT_MAGIC = 2
CODEC_MASK = 0x07
CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = len(_XERIAL_MAGIC) + struct.calcsize(">ii")  # magic, version, compat


class InvalidRecordError(Exception):
    """The client's (or the disk's) batch bytes are not a valid v2 batch.

    ``error_code`` is the Kafka error a produce gets: CORRUPT_MESSAGE (bad CRC, unknown
    magic or codec, undecompressable records), MESSAGE_TOO_LARGE, INVALID_RECORD (magic 0/1,
    torn or empty records, records that contradict their batch header, a compression bomb),
    INVALID_TIMESTAMP, or a producer-state error. ``record_errors`` names the offending
    records by their index in the batch (Produce v8+).
    """

    def __init__(
        self, error_code: ErrorCode, message: str,
        record_errors: tuple[tuple[int, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.error_code = error_code
        # (index of the record in its batch, message): Produce v8+'s record_errors
        self.record_errors = record_errors

    def in_partition(self, topic_partition: str) -> tuple[str, tuple[tuple[int, str], ...]]:
        """(error_message, record_errors) with ``TOPIC_PARTITION`` replaced by the name of
        the partition (``topic-index``), where Kafka's messages name it: the validator
        does not know which partition it checks."""
        return (str(self).replace(TOPIC_PARTITION, topic_partition),
                tuple((i, m.replace(TOPIC_PARTITION, topic_partition))
                      for i, m in self.record_errors))


TOPIC_PARTITION = "<topic-partition>"
"""Stands for the partition's name in validation messages until ``in_partition`` fills it."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The 61-byte header of one batch and where the batch sits in its buffer or file."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int = 0

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & CODEC_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record; wraps from INT32_MAX to 0 like Kafka's."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return increment_sequence(self.base_sequence, self.last_offset_delta)


def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment`` in Kafka's int32 sequence space (wrapping to 0)."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def read_header(buf: ReadableBuffer, pos: int = 0, *,
                position: int | None = None) -> BatchHeader:
    """Parse the header at ``pos``; checks only what is needed to trust its fields. The
    header's ``position`` is ``pos``, or ``position`` if given (where a header read alone
    sits in its file: one object, not a copy made by ``dataclasses.replace``).

    Raises ``InvalidRecordError``: CORRUPT_MESSAGE if fewer than the header's bytes remain,
    ``batchLength`` is too small for a header or magic is unknown; INVALID_RECORD for magic
    0/1 (what Kafka answers a v3+ produce).
    Whether the whole batch is present and its CRC are checked by ``check_batch``.
    """
    available = len(buf) - pos
    if available < MAGIC_PREFIX:
        raise InvalidRecordError(
            ErrorCode.corrupt_message,
            f"torn batch at position {pos}: {available} bytes left, not even a header",
        )
    magic = buf[pos + MAGIC_POS]
    if magic != CURRENT_MAGIC:
        if magic in (0, 1):
            # ProduceRequest.validateRecords (v3+): INVALID_RECORD
            raise InvalidRecordError(
                ErrorCode.invalid_record,
                f"message format v{magic} (magic {magic}) is not supported: produce requests "
                "are only allowed to contain record batches with magic version 2",
            )
        raise InvalidRecordError(
            ErrorCode.corrupt_message, f"unknown magic byte {magic} at position {pos}"
        )
    if available < HEADER_SIZE:
        raise InvalidRecordError(
            ErrorCode.corrupt_message,
            f"torn batch at position {pos}: {available} bytes left, header needs {HEADER_SIZE}",
        )
    (base_offset, batch_length, leader_epoch, magic_, crc, attributes, last_offset_delta,
     base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence,
     records_count) = HEADER.unpack_from(buf, pos)
    header = BatchHeader(
        base_offset, batch_length, leader_epoch, magic_, crc, attributes, last_offset_delta,
        base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence,
        records_count, pos if position is None else position,
    )
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidRecordError(
            ErrorCode.corrupt_message,
            f"batch at position {pos} has batchLength {header.batch_length}, "
            f"less than a header",
        )
    return header


def check_batch(buf: ReadableBuffer, header: BatchHeader) -> None:
    """Check that the batch ``header`` describes is whole in ``buf``, its CRC and counts.

    CORRUPT_MESSAGE for a torn batch, a CRC mismatch or an unknown codec; INVALID_RECORD for
    zero records or a negative ``lastOffsetDelta``.
    """
    pos = header.position
    end = pos + header.size
    if end > len(buf):
        raise InvalidRecordError(
            ErrorCode.corrupt_message,
            f"torn batch at position {pos}: needs {header.size} bytes, "
            f"{len(buf) - pos} present",
        )
    actual = crc32c.crc32c(memoryview(buf)[pos + ATTRIBUTES_POS : end])
    if actual != header.crc:
        raise InvalidRecordError(
            ErrorCode.corrupt_message,
            f"CRC-32C mismatch in batch at position {pos}: stored {header.crc:#010x}, "
            f"computed {actual:#010x}",
        )
    if header.compression > CODEC_ZSTD:
        raise InvalidRecordError(
            ErrorCode.corrupt_message, f"unknown compression codec {header.compression}"
        )
    if header.records_count < 1:
        raise InvalidRecordError(
            ErrorCode.invalid_record, f"batch at position {pos} has no records"
        )
    if header.last_offset_delta < 0:
        raise InvalidRecordError(
            ErrorCode.invalid_record,
            f"batch at position {pos} has negative lastOffsetDelta {header.last_offset_delta}",
        )


def iter_batches(buf: ReadableBuffer, pos: int = 0) -> Iterator[BatchHeader]:
    """Headers of the consecutive batches in ``buf`` from ``pos``; no CRC checks.

    Stops quietly at the end of ``buf`` or before a torn last batch (a fetch response may
    end with a partial batch); raises ``InvalidRecordError`` for a malformed header.
    """
    end = len(buf)
    while end - pos >= MAGIC_PREFIX:
        if end - pos < HEADER_SIZE and buf[pos + MAGIC_POS] == CURRENT_MAGIC:
            return
        header = read_header(buf, pos)
        if pos + header.size > end:
            return
        yield header
        pos += header.size


def split_batches(records: bytes | memoryview, max_batch_bytes: int) -> list[BatchHeader]:
    """Validate every batch of a produce request's records and return their headers.

    The blob must be whole v2 batches with nothing after the last one. Each batch gets
    the checks of ``read_header`` and ``check_batch``, and MESSAGE_TOO_LARGE if it is
    larger than ``max_batch_bytes`` (max.message.bytes). An empty blob is INVALID_RECORD
    (Kafka: "must have at least one record batch per partition"); a produce request's
    records are first checked by ``check_produce_records``.
    """
    buf = memoryview(records)
    if len(buf) == 0:
        raise InvalidRecordError(ErrorCode.invalid_record, "no record batches")
    headers: list[BatchHeader] = []
    pos = 0
    while pos < len(buf):
        header = read_header(buf, pos)
        if header.size > max_batch_bytes:
            raise InvalidRecordError(
                ErrorCode.message_too_large,
                f"batch of {header.size} bytes exceeds max.message.bytes={max_batch_bytes}",
            )
        check_batch(buf, header)
        headers.append(header)
        pos += header.size
    return headers


def whole_batches_length(buf: ReadableBuffer) -> int:
    """Bytes of the whole batches at the start of ``buf`` (reads length fields only)."""
    pos = 0
    while len(buf) - pos >= LOG_OVERHEAD:
        (length,) = _INT32.unpack_from(buf, pos + LENGTH_POS)
        if length < HEADER_SIZE - LOG_OVERHEAD or pos + LOG_OVERHEAD + length > len(buf):
            break
        pos += LOG_OVERHEAD + length
    return pos


RECORDS_COUNT_POS = HEADER_SIZE - 4  # the header's last field


def records_in_batches(buf: ReadableBuffer) -> int:
    """Records in the whole v2 batches at the start of ``buf``, from each header's record
    count (reads three fields per batch, decodes nothing; a control batch counts its
    marker). Stops at a partial batch or one that is not v2."""
    pos = n = 0
    size = len(buf)
    while size - pos >= HEADER_SIZE:
        (length,) = _INT32.unpack_from(buf, pos + LENGTH_POS)
        end = pos + LOG_OVERHEAD + length
        if length < HEADER_SIZE - LOG_OVERHEAD or end > size or buf[pos + MAGIC_POS] != 2:
            break
        n += _INT32.unpack_from(buf, pos + RECORDS_COUNT_POS)[0]
        pos = end
    return n


# ------------------------------------------------------------------ batch-level rewrites


def set_base_offset(buf: bytearray, header: BatchHeader, base_offset: int) -> None:
    """Write ``baseOffset`` of the batch at ``header.position`` (outside the CRC)."""
    _INT64.pack_into(buf, header.position + BASE_OFFSET_POS, base_offset)


def set_partition_leader_epoch(buf: bytearray, header: BatchHeader, leader_epoch: int) -> None:
    """Write ``partitionLeaderEpoch`` (outside the CRC)."""
    _INT32.pack_into(buf, header.position + PARTITION_LEADER_EPOCH_POS, leader_epoch)


def set_log_append_time(buf: bytearray, header: BatchHeader, timestamp_ms: int) -> None:
    """Mark the batch LogAppendTime with ``maxTimestamp = timestamp_ms``; recompute the CRC.

    Consumers then read every record's timestamp as ``maxTimestamp`` (Kafka's rule).
    """
    pos = header.position
    _INT16.pack_into(buf, pos + ATTRIBUTES_POS, header.attributes | TIMESTAMP_TYPE_BIT)
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_POS, timestamp_ms)
    crc = crc32c.crc32c(memoryview(buf)[pos + ATTRIBUTES_POS : pos + header.size])
    _UINT32.pack_into(buf, pos + CRC_POS, crc)


# ------------------------------------------------------------------ record decoding


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, position after it)."""
    shift = 0
    raw = 0
    while True:
        if pos >= len(buf):
            raise InvalidRecordError(ErrorCode.corrupt_message, "truncated varint")
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise InvalidRecordError(ErrorCode.corrupt_message, "varint longer than 10 bytes")


# ------------------------------------------------------------------ bounded decompression
#
# Kafka decompresses a batch as a stream, one record at a time, and has no cap on what a
# batch inflates to (a 48 KB zstd batch of one 1.5 GiB record is "valid" there). Here a
# batch's records block is decompressed into one buffer of at most ``limit`` bytes, and a
# batch that would inflate past it is refused (INVALID_RECORD on produce; skipped by the
# cleaner and the timestamp search). The buffer comes from ``numpy.zeros`` (calloc: pages
# are only committed as the decompressor writes them), and every decompressor writes into
# it and stops at its end, so memory is bounded by ``limit`` whatever the input claims.

INFLATE_RATIO = 64
"""A batch may inflate to at most this many times max.message.bytes (see ``inflate_limit``)."""
MIN_INFLATE_LIMIT = 16 << 20
DEFAULT_INFLATE_LIMIT = 64 << 20
_FIRST_TRY_MIN = 256 << 10
_FIRST_TRY_RATIO = 8
"""The cap for readers without a topic config (1 MiB max.message.bytes x ``INFLATE_RATIO``)."""


def inflate_limit(max_message_bytes: int) -> int:
    """The most bytes one batch's records may decompress to for a topic whose
    max.message.bytes is ``max_message_bytes``: ``INFLATE_RATIO`` times it, at least 16 MiB."""
    return max(MIN_INFLATE_LIMIT, INFLATE_RATIO * max_message_bytes)


def _too_large(codec: int, limit: int) -> InvalidRecordError:
    return InvalidRecordError(
        ErrorCode.invalid_record,
        f"compressed records (codec {codec}) inflate past {limit} bytes (compression bomb?)",
    )


def _snappy_into(data: memoryview, out: memoryview, limit: int) -> int:
    """Kafka's Java client writes xerial-framed snappy (8-byte magic, version, compat, then
    int32-length-prefixed raw blocks); librdkafka may write one raw block. Each raw block
    states its uncompressed length first; it is checked against the room left before the
    block is decompressed."""
    if bytes(data[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        blocks = [data]
    else:
        blocks = []
        pos = _XERIAL_HEADER
        while pos < len(data):
            if len(data) - pos < _INT32.size:
                raise InvalidRecordError(ErrorCode.corrupt_message, "torn xerial snappy chunk")
            (length,) = _INT32.unpack_from(data, pos)
            pos += _INT32.size
            if length < 0 or pos + length > len(data):
                raise InvalidRecordError(
                    ErrorCode.corrupt_message, f"xerial snappy chunk of {length} bytes is torn"
                )
            blocks.append(data[pos : pos + length])
            pos += length
    written = 0
    for block in blocks:
        n = int(cramjam.snappy.decompress_raw_len(block))
        if n > limit - written:
            raise _too_large(CODEC_SNAPPY, limit)
        if n:
            got = int(cramjam.snappy.decompress_raw_into(block, out[written : written + n]))
            if got != n:
                raise InvalidRecordError(ErrorCode.corrupt_message, "snappy block length lies")
        written += n
    return written


_DECOMPRESS_INTO = {
    CODEC_GZIP: cramjam.gzip.decompress_into,
    CODEC_LZ4: cramjam.lz4.decompress_into,
    CODEC_ZSTD: cramjam.zstd.decompress_into,
}


def inflate(
    codec: int, data: bytes | bytearray | memoryview, limit: int = DEFAULT_INFLATE_LIMIT
) -> memoryview:
    """The records block of a batch with compression ``codec``, uncompressed, as a view.

    Uncompressed data is returned as is (no copy). Otherwise at most ``limit`` bytes are
    ever written: INVALID_RECORD if the data would inflate past it, CORRUPT_MESSAGE if it
    cannot be decompressed or the codec is unknown.
    """
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
    if codec == CODEC_NONE:
        return view
    if codec not in _DECOMPRESS_INTO and codec != CODEC_SNAPPY:
        raise InvalidRecordError(ErrorCode.corrupt_message, f"unknown compression codec {codec}")
    # A small buffer first (most batches inflate a few times at most: a 64 MiB calloc costs
    # more than decompressing them), the whole ``limit`` only if that overflows. One spare
    # byte: filling it proves the data inflates past the buffer's room.
    first = min(limit, max(_FIRST_TRY_MIN, _FIRST_TRY_RATIO * len(view)))
    for room in (first, limit) if first < limit else (limit,):
        out: memoryview = np.zeros(room + 1, dtype=np.uint8).data
        try:
            if codec == CODEC_SNAPPY:
                n = _snappy_into(view, out, room)
            else:
                n = int(_DECOMPRESS_INTO[codec](view, out))
        except cramjam.DecompressionError as e:
            if "failed to write whole buffer" in str(e):
                n = room + 1
            else:
                raise InvalidRecordError(
                    ErrorCode.corrupt_message, f"cannot decompress codec {codec}: {e}"
                ) from None
        except InvalidRecordError as e:
            if e.error_code != ErrorCode.invalid_record or room == limit:  # snappy's claim
                raise
            n = room + 1
        except (ValueError, OverflowError, struct.error) as e:
            raise InvalidRecordError(
                ErrorCode.corrupt_message, f"cannot decompress codec {codec}: {e}"
            ) from None
        if n <= room:
            return out[:n]
    raise _too_large(codec, limit)


def decompress(codec: int, data: bytes, limit: int = DEFAULT_INFLATE_LIMIT) -> bytes:
    """The records block of a batch with compression ``codec``, uncompressed (``inflate``
    as ``bytes``; same errors, same bound)."""
    if codec == CODEC_NONE:
        return bytes(data)
    return bytes(inflate(codec, data, limit))


# ------------------------------------------------------------------ bulk record scanning

I64 = npt.NDArray[np.int64]


class FramingError(Exception):
    """A record's framing is broken; ``index`` is the first record concerned."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def varints(arr: npt.NDArray[np.uint8], pos: I64, max_size: int,
             guess: bool = False) -> tuple[I64, I64]:
    """Zigzag varints at every position of ``pos`` in ``arr``: (values, sizes in bytes).

    A varint running past the end of ``arr`` or longer than ``max_size`` bytes raises
    ``FramingError`` naming the first such position's index, unless ``guess`` (the positions
    are only guesses: garbage out, never an error)."""
    n = len(arr)
    if n == 0 or (len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= n)):
        if guess:
            return np.full(len(pos), -2, dtype=np.int64), np.zeros(len(pos), dtype=np.int64)
        bad = np.flatnonzero((pos < 0) | (pos >= n))
        raise FramingError(int(bad[0]) if bad.size else 0, "a record field runs past its batch")
    b = arr[pos]
    if not len(b) or int(b.max()) < 0x80:  # the common case: every varint is one byte
        v = b.astype(np.int64)
        return (v >> 1) ^ -(v & 1), np.ones(len(pos), dtype=np.int64)
    if int(pos.max()) + 1 < n and max_size >= 2:  # next common case: at most two bytes
        two = b >= 0x80
        b1 = arr[pos + 1]
        if not bool((two & (b1 >= 0x80)).any()):
            v = (b & 0x7F).astype(np.int64) | np.where(two, b1.astype(np.int64) << 7, 0)
            return (v >> 1) ^ -(v & 1), two.astype(np.int64) + 1
    raw = (b & 0x7F).astype(np.uint64)
    size = np.ones(len(pos), dtype=np.int64)
    idx = np.flatnonzero(b >= 0x80)
    shift = 7
    while idx.size:
        if size[idx[0]] >= max_size:
            if guess:
                break
            raise FramingError(int(idx[0]), f"varint longer than {max_size} bytes")
        at = pos[idx] + size[idx]
        over = at >= n
        if over.any():
            if not guess:
                raise FramingError(int(idx[np.flatnonzero(over)[0]]), "truncated varint")
            at = np.minimum(at, n - 1)
        b = arr[at]
        raw[idx] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        size[idx] += 1
        idx = idx[b >= 0x80]
        shift += 7
    values = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    return values, size


def record_starts(data: memoryview, arr: npt.NDArray[np.uint8], count: int,
                   pos: int) -> tuple[I64, int]:
    """Positions of ``count`` consecutive records from ``pos`` in ``data`` (each starts
    with its length varint) and the position after the last. Runs of records of one length
    are found by guessing that the next records have the last one's length and checking
    all guesses at once with numpy (the length only changes where a delta needs one more
    varint byte); where lengths keep changing, a plain loop walks a stretch of records."""
    out: list[I64] = []
    i = 0
    end = len(data)
    chunk = 64
    while i < count:
        if pos >= end:
            raise FramingError(i, "the batch holds fewer records than its count")
        lengths1, sizes1 = varints(arr, np.array([pos], dtype=np.int64), 5)
        length, after = int(lengths1[0]), pos + int(sizes1[0])
        if length < 0:
            raise FramingError(i, f"negative record length {length}")
        stride = after - pos + length
        k = min(count - i, chunk, (end - pos - 1) // stride + 1)
        guess = pos + np.arange(k, dtype=np.int64) * stride
        lengths, sizes = varints(arr, guess, 5, guess=True)
        bad = np.flatnonzero((lengths != length) | (sizes != after - pos))
        good = k if not bad.size else max(int(bad[0]), 1)
        out.append(guess[:good])
        i += good
        pos += good * stride
        if good == k:
            chunk = min(chunk * 2, 1 << 16)
            continue
        chunk = 64
        if good < 8:  # lengths keep changing: walk a stretch one record at a time
            walk = [0] * min(64, count - i)
            for j in range(len(walk)):
                walk[j] = pos
                if pos >= end:
                    raise FramingError(i + j, "the batch holds fewer records than its count")
                try:
                    length, after = read_varint(data, pos)  # type: ignore[arg-type]
                except InvalidRecordError as e:
                    raise FramingError(i + j, str(e)) from None
                if length < 0:
                    raise FramingError(i + j, f"negative record length {length}")
                pos = after + length
            out.append(np.array(walk, dtype=np.int64))
            i += len(walk)
    return (np.concatenate(out) if out else np.zeros(0, dtype=np.int64)), pos


# Up to this many records, a plain loop over the length varints finds the record starts
# faster than guessing runs of equal lengths with numpy.
_WALK_LENGTHS_MAX = 1000


def _walk_lengths(data: memoryview, count: int, pos: int) -> tuple[I64, int]:
    """``record_starts`` by a plain loop, one length varint at a time (one- and two-byte
    lengths inline)."""
    n = len(data)
    starts = [0] * count
    for i in range(count):
        starts[i] = pos
        if pos + 1 < n and data[pos] < 0x80:
            b = data[pos]
            length = (b >> 1) ^ -(b & 1)
            pos += 1
        elif pos + 2 < n and data[pos + 1] < 0x80:
            raw = (data[pos] & 0x7F) | (data[pos + 1] << 7)
            length = (raw >> 1) ^ -(raw & 1)
            pos += 2
        else:
            if pos >= n:
                raise FramingError(i, "the batch holds fewer records than its count")
            length, pos = _small_varint(data, pos, n, 5, i)
        if length < 0:
            raise FramingError(i, f"negative record length {length}")
        pos += length
    return np.array(starts, dtype=np.int64), pos


@dataclass(frozen=True, slots=True)
class RecordScan:
    """Fields of every record of one batch's (uncompressed) records block, as arrays."""

    timestamp_delta: I64
    offset_delta: I64
    key_length: I64  # negative: null key
    value_length: I64  # negative: null value (a tombstone)
    header_count: I64


# A stretch of records whose headers are walked with numpy; below it, per record in Python.
_HEADER_BULK_MIN = 16


def _walk_headers(data: memoryview, arr: npt.NDArray[np.uint8], pos: I64, count: I64) -> I64:
    """Positions after the headers of every record (``pos``: after its header count)."""
    pos = pos.copy()
    left = count.copy()
    active = np.flatnonzero(left > 0)
    while active.size >= _HEADER_BULK_MIN:
        klen, ks = varints(arr, pos[active], 5)
        if bool((klen < 0).any()):
            raise FramingError(int(active[np.flatnonzero(klen < 0)[0]]),
                           "invalid negative header key size")
        p = pos[active] + ks + klen
        if bool((p >= len(arr)).any()):
            raise FramingError(int(active[np.flatnonzero(p >= len(arr))[0]]),
                           "a header runs past its record")
        vlen, vs = varints(arr, p, 5)
        pos[active] = p + vs + np.maximum(vlen, 0)
        left[active] -= 1
        active = active[left[active] > 0]
    for i in active.tolist():
        at = int(pos[i])
        try:
            for _ in range(int(left[i])):
                key_size, at = read_varint(data, at)  # type: ignore[arg-type]
                if key_size < 0:
                    raise FramingError(i, "invalid negative header key size")
                value_size, at = read_varint(data, at + key_size)  # type: ignore[arg-type]
                at += max(value_size, 0)
                if at > len(data):
                    raise FramingError(i, "a header runs past its record")
        except InvalidRecordError as e:
            raise FramingError(i, str(e)) from None
        pos[i] = at
    return pos


# Records scanned per numpy pass: bounds the scan's arrays (~15 int64 per record) whatever
# the batch claims (a 64 MiB records block can hold 9.6 M seven-byte records).
SCAN_CHUNK = 32768


def iter_record_scans(data: memoryview | bytes, count: int,
                      chunk: int | None = None) -> Iterator[tuple[int, RecordScan]]:
    """Walk the ``count`` records of an uncompressed records block in bulk, ``chunk``
    records at a time (default ``SCAN_CHUNK``): (index of the chunk's first record, its
    scan). Checks their framing as Kafka's ``DefaultRecord.readFrom`` does: each record's
    length varint, its fields (varints no longer than Kafka reads: 5 bytes for int32, 10
    for int64) and its headers (a non-negative count, non-null keys) end exactly where its
    length says, and the records fill the block exactly. Raises INVALID_RECORD naming the
    first broken record in ``record_errors`` (after yielding the chunks before it).
    """
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
    arr = np.frombuffer(view, dtype=np.uint8)
    chunk = chunk or SCAN_CHUNK
    first = 0
    try:
        if count < 1:
            raise FramingError(0, f"invalid record count {count}")
        if count > len(arr) // 7:  # no record is shorter than 7 bytes
            raise FramingError(0, f"{count} records cannot fit in {len(arr)} bytes")
        if count <= _SMALL_BATCH:
            scan = _scan_small(view, count)
            yield 0, scan
            return
        pos = 0
        while first < count:
            k = min(chunk, count - first)
            starts, pos = (_walk_lengths(view, k, pos) if k <= _WALK_LENGTHS_MAX
                           else record_starts(view, arr, k, pos))
            scan = _scan_fields(view, arr, starts)
            yield first, scan
            first += k
    except FramingError as e:  # e.index counts from the chunk's first record
        index = first + e.index
        raise InvalidRecordError(
            ErrorCode.invalid_record, f"record {index}: {e}", ((index, str(e)),)
        ) from None
    if pos != len(view):
        where = "past the end of" if pos > len(view) else "short of"
        message = (f"record lengths add up to {pos} bytes, {where} the {len(view)} records "
                   "bytes")
        raise InvalidRecordError(ErrorCode.invalid_record, f"record {count - 1}: {message}",
                                 ((count - 1, message),))


def scan_records(data: memoryview | bytes, count: int) -> RecordScan:
    """``iter_record_scans`` in one piece (its arrays hold ``count`` entries: for tests and
    small batches)."""
    parts = [scan for _, scan in iter_record_scans(data, count)]
    if len(parts) == 1:
        return parts[0]
    return RecordScan(*(np.concatenate([getattr(p, f) for p in parts])
                        for f in RecordScan.__slots__))


def _scan_fields(view: memoryview, arr: npt.NDArray[np.uint8], starts: I64) -> RecordScan:
    """The fields of the records at ``starts`` (``FramingError`` indexes are into ``starts``)."""
    rec_len, len_size = varints(arr, starts, 5)
    body = starts + len_size
    end = body + rec_len
    if int(rec_len.min()) < 6:
        i = int(np.flatnonzero(rec_len < 6)[0])
        raise FramingError(i, f"record of {int(rec_len[i])} bytes is too short")
    ts_delta, s1 = varints(arr, body + 1, 10)  # after the attributes byte
    p = body + 1 + s1
    off_delta, s2 = varints(arr, np.minimum(p, end), 5)
    p = p + s2
    key_len, s3 = varints(arr, np.minimum(p, end), 5)
    p = p + s3 + np.maximum(key_len, 0)
    _check_within(p, end, "key")
    value_len, s4 = varints(arr, p, 5)
    p = p + s4 + np.maximum(value_len, 0)
    _check_within(p, end, "value")
    header_count, s5 = varints(arr, p, 5)
    p = p + s5
    if int(header_count.min()) < 0:
        raise FramingError(int(np.flatnonzero(header_count < 0)[0]),
                       "invalid negative number of record headers")
    _check_within(p, end + 1, "header count")
    if bool(header_count.any()):
        p = _walk_headers(view, arr, p, header_count)
    if not np.array_equal(p, end):
        i = int(np.flatnonzero(p != end)[0])
        raise FramingError(i, f"invalid record size: expected to read {int(rec_len[i])} bytes "
                          f"in record payload, but instead read {int(p[i] - body[i])}")
    return RecordScan(ts_delta, off_delta, key_len, value_len, header_count)



SMALL_BATCH = 80
"""Up to this many records a plain loop beats numpy's fixed cost (~150 us a batch)."""
_SMALL_BATCH = SMALL_BATCH


def _small_varint(data: memoryview, pos: int, end: int, max_size: int, i: int) -> tuple[int, int]:
    """``read_varint`` for ``_scan_small``: a fast path for one-byte varints, errors as
    ``FramingError`` for record ``i``, never reading at or past ``end``."""
    if pos >= end:
        raise FramingError(i, "a record field runs past its record")
    b = data[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    raw = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise FramingError(i, "truncated varint")
        if pos - start >= max_size:
            raise FramingError(i, f"varint longer than {max_size} bytes")
        b = data[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            # 64 bits, as Java's readVarlong and the numpy path keep (a tenth byte's high
            # bits are dropped): never a value past int64
            raw &= 0xFFFFFFFFFFFFFFFF
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def scan_small_records(data: memoryview | bytes, count: int
                       ) -> tuple[list[int], list[int], list[int], list[int],
                                  list[int]] | None:
    """The fields of a small records block (at most ``SMALL_BATCH`` records) as plain
    lists (timestamp deltas, offset deltas, key lengths, value lengths, header counts),
    with ``iter_record_scans``' framing checks; None when the block is not small or is
    broken (``iter_record_scans`` then says how). For a batch of a few records, numpy's
    fixed cost per operation is most of the work: a caller checks the lists in Python."""
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
    if not 1 <= count <= _SMALL_BATCH or count > len(view) // 7:
        return None
    try:
        return _scan_small_lists(view, count)
    except FramingError:
        return None


def _scan_small(data: memoryview, count: int) -> RecordScan:
    """``scan_records`` for a few records: the same checks, one record at a time."""
    ts_deltas, off_deltas, key_lens, value_lens, header_counts = _scan_small_lists(data,
                                                                                   count)
    return RecordScan(np.array(ts_deltas, dtype=np.int64), np.array(off_deltas, dtype=np.int64),
                      np.array(key_lens, dtype=np.int64), np.array(value_lens, dtype=np.int64),
                      np.array(header_counts, dtype=np.int64))


def _scan_small_lists(data: memoryview, count: int) -> tuple[
        list[int], list[int], list[int], list[int], list[int]]:
    """``_scan_small``'s fields as lists."""
    n = len(data)
    ts_deltas = [0] * count
    off_deltas = [0] * count
    key_lens = [0] * count
    value_lens = [0] * count
    header_counts = [0] * count
    pos = 0
    for i in range(count):
        if pos >= n:
            raise FramingError(i, f"the batch holds fewer records than its count {count}")
        length, body = _small_varint(data, pos, n, 5, i)
        if length < 0:
            raise FramingError(i, f"negative record length {length}")
        if length < 6:
            raise FramingError(i, f"record of {length} bytes is too short")
        end = body + length
        if end > n:
            raise FramingError(i, "record lengths add up past the end of the records bytes")
        # one-byte varints inline (the common case), others through _small_varint
        p = body + 1
        b = data[p] if p < end else 0x80
        if b < 0x80:
            ts_deltas[i] = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            ts_deltas[i], p = _small_varint(data, p, end, 10, i)
        b = data[p] if p < end else 0x80
        if b < 0x80:
            off_deltas[i] = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            off_deltas[i], p = _small_varint(data, p, end, 5, i)
        b = data[p] if p < end else 0x80
        if b < 0x80:
            key_len = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            key_len, p = _small_varint(data, p, end, 5, i)
        key_lens[i] = key_len
        p += max(key_len, 0)
        b = data[p] if p < end else 0x80
        if b < 0x80:
            value_len = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            value_len, p = _small_varint(data, p, end, 5, i)
        value_lens[i] = value_len
        p += max(value_len, 0)
        b = data[p] if p < end else 0x80
        if b < 0x80:
            headers = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            headers, p = _small_varint(data, p, end, 5, i)
        if headers < 0:
            raise FramingError(i, "invalid negative number of record headers")
        header_counts[i] = headers
        for _ in range(headers):
            key_size, p = _small_varint(data, p, end, 5, i)
            if key_size < 0:
                raise FramingError(i, "invalid negative header key size")
            value_size, p = _small_varint(data, p + key_size, end, 5, i)
            p += max(value_size, 0)
        if p != end:
            raise FramingError(i, f"invalid record size: expected to read {length} bytes "
                              f"in record payload, but instead read {p - body}")
        pos = end
    if pos != n:
        raise FramingError(count - 1, f"record lengths add up to {pos} bytes, short of the {n} "
                                  "records bytes")
    return ts_deltas, off_deltas, key_lens, value_lens, header_counts


def _check_within(p: I64, end: I64, field_name: str) -> None:
    if bool((p >= end).any()):
        raise FramingError(int(np.flatnonzero(p >= end)[0]),
                       f"the record's {field_name} runs past its length")


def record_timestamps(
    batch: bytes | bytearray | memoryview, limit: int = DEFAULT_INFLATE_LIMIT
) -> Iterator[tuple[int, int]]:
    """(offset, timestamp) of every record of one whole batch, in order, lazily.

    Decompresses at most ``limit`` bytes and scans the records in bulk, ``SCAN_CHUNK`` at a
    time (for ListOffsets by timestamp, which stops at the first match). In a LogAppendTime
    batch every record's timestamp is ``maxTimestamp``. A batch that cannot be read within
    bounds (a compression bomb or broken records stored before records were validated) is
    answered at batch level: ``(baseOffset, maxTimestamp)`` after whatever records could be
    read, so a search lands at its start instead of failing.
    """
    header = read_header(batch, 0)
    try:
        data = inflate(header.compression, memoryview(batch)[HEADER_SIZE : header.size], limit)
        for _, scan in iter_record_scans(data, header.records_count):
            offsets = scan.offset_delta + header.base_offset
            if header.is_log_append_time:
                stamps = np.full(len(offsets), header.max_timestamp, dtype=np.int64)
            else:
                stamps = scan.timestamp_delta + header.base_timestamp
            yield from zip(offsets.tolist(), stamps.tolist(), strict=True)
    except InvalidRecordError:
        yield header.base_offset, header.max_timestamp


def check_produce_records(records: bytes | memoryview | None) -> int:
    """Kafka's ``ProduceRequest.validateRecords`` (v3+) on one partition's records, as its
    batch iterator (``ByteBufferLogInputStream``) sees them: the length of the one batch to
    append.

    INVALID_RECORD when there is no whole batch (null, empty or torn records), when the
    batch's magic is 0 or 1, or when a second whole batch follows; CORRUPT_MESSAGE for a
    batch length below the smallest (legacy) record or an unknown magic. Bytes after the
    batch that do not make a whole batch are ignored, as Kafka ignores (and trims) them.
    """
    if records is None:
        raise InvalidRecordError(ErrorCode.invalid_record, "null records")
    buf = memoryview(records)
    first = _next_batch_size(buf, 0)
    if first is None:
        raise InvalidRecordError(
            ErrorCode.invalid_record,
            "produce requests must have at least one record batch per partition",
        )
    magic = buf[MAGIC_POS]
    if magic != CURRENT_MAGIC:
        raise InvalidRecordError(
            ErrorCode.invalid_record,
            f"produce requests are only allowed to contain record batches with magic "
            f"version 2, not {magic}",
        )
    if _next_batch_size(buf, first) is not None:
        raise InvalidRecordError(
            ErrorCode.invalid_record,
            "produce requests are only allowed to contain exactly one record batch per "
            "partition",
        )
    return first


_LEGACY_RECORD_OVERHEAD_V0 = 14


def _next_batch_size(buf: memoryview, pos: int) -> int | None:
    """``ByteBufferLogInputStream.nextBatch``: the size of the whole batch at ``pos``, None
    if there is none (too few bytes), CORRUPT_MESSAGE for an impossible length or magic."""
    remaining = len(buf) - pos
    if remaining < LOG_OVERHEAD:
        return None
    (length,) = _INT32.unpack_from(buf, pos + LENGTH_POS)
    if length < _LEGACY_RECORD_OVERHEAD_V0:
        raise InvalidRecordError(
            ErrorCode.corrupt_message,
            f"record size {length} is less than the minimum record overhead "
            f"({_LEGACY_RECORD_OVERHEAD_V0})",
        )
    if remaining < MAGIC_PREFIX:
        return None
    magic = buf[pos + MAGIC_POS]
    if magic > CURRENT_MAGIC:
        raise InvalidRecordError(
            ErrorCode.corrupt_message, f"invalid magic found in record: {magic}"
        )
    if remaining < length + LOG_OVERHEAD:
        return None
    return int(length + LOG_OVERHEAD)


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record (per-record work: internal topics, compaction, tools only)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def _read_nullable_bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = read_varint(data, pos)
    if length < 0:
        return None, pos
    end = pos + length
    if end > len(data):
        raise InvalidRecordError(ErrorCode.corrupt_message, "record field runs past its batch")
    return data[pos:end], end


def decode_records(
    batch: bytes | bytearray | memoryview, limit: int = DEFAULT_INFLATE_LIMIT
) -> list[Record]:
    """Every record of one whole batch: offset, timestamp, key, value, headers.

    Record layout (inside the possibly compressed records block)::

        varint length | int8 attributes | varint timestampDelta | varint offsetDelta
        | varint keyLength | key | varint valueLength | value
        | varint headerCount | (varint keyLength | key | varint valueLength | value)*

    Lengths of -1 mean null. Not for the produce/fetch hot path. Records that inflate past
    ``limit`` bytes raise INVALID_RECORD.
    """
    header = read_header(batch, 0)
    data = decompress(header.compression, bytes(batch[HEADER_SIZE : header.size]), limit)
    log_append = header.is_log_append_time
    out: list[Record] = []
    pos = 0
    for _ in range(header.records_count):
        length, pos = read_varint(data, pos)
        end = pos + length
        pos += 1  # attributes
        timestamp_delta, pos = read_varint(data, pos)
        offset_delta, pos = read_varint(data, pos)
        key, pos = _read_nullable_bytes(data, pos)
        value, pos = _read_nullable_bytes(data, pos)
        count, pos = read_varint(data, pos)
        headers = []
        for _ in range(count):
            hkey, pos = _read_nullable_bytes(data, pos)
            hvalue, pos = _read_nullable_bytes(data, pos)
            headers.append(((hkey or b"").decode("utf-8", "replace"), hvalue))
        if pos != end or end > len(data):
            raise InvalidRecordError(ErrorCode.corrupt_message, "record length mismatch")
        timestamp = header.max_timestamp if log_append else header.base_timestamp + timestamp_delta
        out.append(Record(header.base_offset + offset_delta, timestamp, key, value,
                          tuple(headers)))
    return out


def encode_uvarint(n: int) -> bytes:
    """Unsigned varint (LEB128), as flexible-version lengths and tag counts use."""
    if n < 0:
        raise ValueError(f"negative unsigned varint {n}")
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Zigzag varint (64-bit), as records use."""
    return encode_uvarint((value << 1) ^ (value >> 63))


def _nullable(data: bytes | None) -> bytes:
    return encode_varint(-1) if data is None else encode_varint(len(data)) + data


def build_batch(
    records: list[tuple[bytes | None, bytes | None]],
    timestamp_ms: int,
    *,
    base_offset: int = 0,
    offset_deltas: list[int] | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> bytes:
    """An uncompressed v2 batch of (key, value) records, all stamped ``timestamp_ms``.

    Used by the broker for the records it writes itself (``__consumer_offsets``,
    transaction markers: ``attributes`` with the transactional and control bits) and by
    compaction (``offset_deltas`` keeps the surviving records' original offsets).
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    deltas = offset_deltas if offset_deltas is not None else list(range(len(records)))
    body = bytearray()
    for delta, (key, value) in zip(deltas, records, strict=True):
        rec = (b"\x00" + encode_varint(0) + encode_varint(delta) + _nullable(key)
               + _nullable(value) + b"\x00")
        body += encode_varint(len(rec)) + rec
    buf = bytearray(HEADER_SIZE) + body
    HEADER.pack_into(
        buf, 0, base_offset, len(buf) - LOG_OVERHEAD, -1, 2, 0, attributes, deltas[-1],
        timestamp_ms,
        timestamp_ms, producer_id, producer_epoch, base_sequence, len(records),
    )
    _UINT32.pack_into(buf, CRC_POS, crc32c.crc32c(memoryview(buf)[ATTRIBUTES_POS:]))
    return bytes(buf)

