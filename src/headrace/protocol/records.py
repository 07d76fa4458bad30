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

import gzip
import mmap
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import cramjam
import crc32c
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

    ``error_code`` is the Kafka error a produce gets: CORRUPT_MESSAGE (bad CRC, torn or
    inconsistent lengths), UNSUPPORTED_VERSION (magic 0/1), MESSAGE_TOO_LARGE, INVALID_RECORD
    (well-formed but not acceptable, e.g. zero records), or a producer-state error.
    """

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


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


def read_header(buf: ReadableBuffer, pos: int = 0) -> BatchHeader:
    """Parse the header at ``pos``; checks only what is needed to trust its fields.

    Raises ``InvalidRecordError``: CORRUPT_MESSAGE if fewer than the header's bytes remain
    or ``batchLength`` is too small for a header, UNSUPPORTED_VERSION if magic is not 2.
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
            raise InvalidRecordError(
                ErrorCode.unsupported_version,
                f"message format v{magic} (magic {magic}) is not supported; use RecordBatch v2",
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
        records_count, pos,
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
    larger than ``max_batch_bytes`` (max.message.bytes). An empty blob is CORRUPT_MESSAGE.
    """
    buf = memoryview(records)
    if len(buf) == 0:
        raise InvalidRecordError(ErrorCode.corrupt_message, "no record batches")
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


def _snappy_decompress(data: bytes) -> bytes:
    """Kafka's Java client writes xerial-framed snappy; librdkafka may write a raw block."""
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out = bytearray()
    pos = _XERIAL_HEADER
    while pos < len(data):
        (length,) = _INT32.unpack_from(data, pos)
        pos += _INT32.size
        out += bytes(cramjam.snappy.decompress_raw(data[pos : pos + length]))
        pos += length
    return bytes(out)


def decompress(codec: int, data: bytes) -> bytes:
    """The records block of a batch with compression ``codec``, uncompressed."""
    try:
        if codec == CODEC_NONE:
            return data
        if codec == CODEC_GZIP:
            return gzip.decompress(data)
        if codec == CODEC_SNAPPY:
            return _snappy_decompress(data)
        if codec == CODEC_LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == CODEC_ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except (OSError, EOFError, ValueError, zlib.error, struct.error,
            cramjam.DecompressionError) as e:
        raise InvalidRecordError(
            ErrorCode.corrupt_message, f"cannot decompress codec {codec}: {e}"
        ) from e
    raise InvalidRecordError(ErrorCode.corrupt_message, f"unknown compression codec {codec}")


def record_timestamps(batch: bytes | bytearray | memoryview) -> list[tuple[int, int]]:
    """(offset, timestamp) of every record of one whole batch, in order.

    Decompresses and decodes the records (per-record Python work: for ListOffsets by
    timestamp, never the produce or fetch path). In a LogAppendTime batch every record's
    timestamp is ``maxTimestamp``.
    """
    header = read_header(batch, 0)
    data = decompress(header.compression, bytes(batch[HEADER_SIZE : header.size]))
    log_append = header.is_log_append_time
    out: list[tuple[int, int]] = []
    pos = 0
    for _ in range(header.records_count):
        length, pos = read_varint(data, pos)
        start = pos
        pos += 1  # record attributes, unused
        timestamp_delta, pos = read_varint(data, pos)
        offset_delta, pos = read_varint(data, pos)
        timestamp = header.max_timestamp if log_append else header.base_timestamp + timestamp_delta
        out.append((header.base_offset + offset_delta, timestamp))
        pos = start + length
        if pos > len(data):
            raise InvalidRecordError(ErrorCode.corrupt_message, "record runs past its batch")
    return out


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


def decode_records(batch: bytes | bytearray | memoryview) -> list[Record]:
    """Every record of one whole batch: offset, timestamp, key, value, headers.

    Record layout (inside the possibly compressed records block)::

        varint length | int8 attributes | varint timestampDelta | varint offsetDelta
        | varint keyLength | key | varint valueLength | value
        | varint headerCount | (varint keyLength | key | varint valueLength | value)*

    Lengths of -1 mean null. Not for the produce/fetch hot path.
    """
    header = read_header(batch, 0)
    data = decompress(header.compression, bytes(batch[HEADER_SIZE : header.size]))
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
) -> bytes:
    """An uncompressed v2 batch of (key, value) records, all stamped ``timestamp_ms``.

    Used by the broker for the records it writes itself (``__consumer_offsets``) and by
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
        buf, 0, base_offset, len(buf) - LOG_OVERHEAD, -1, 2, 0, 0, deltas[-1], timestamp_ms,
        timestamp_ms, producer_id, producer_epoch, base_sequence, len(records),
    )
    _UINT32.pack_into(buf, CRC_POS, crc32c.crc32c(memoryview(buf)[ATTRIBUTES_POS:]))
    return bytes(buf)

