"""Log compaction (R-LOG-6): keep only the latest record per key in the closed segments.

Kafka's ``LogCleaner`` in one pass, run by ``PartitionLog.compact`` for logs whose
``cleanup.policy`` contains ``compact``:

1. **Offset map.** Every record below ``upto`` (the high watermark, so nothing that could
   still be truncated decides what is removed) is decoded: key -> offset of its latest
   occurrence, over the whole log, active segment included (so a key rewritten in the active
   segment loses its older copies in the closed ones). For each producer id, the base offset
   of its last batch in the log.
2. **Cleanable range.** The closed segments lying entirely below ``upto``, from the first on.
   The active segment is never rewritten.
3. **Filter.** A record survives when it has a key, its offset is the latest for that key,
   and it is not a tombstone (null value) whose batch ``maxTimestamp`` is older than
   ``now_ms - delete.retention.ms`` (a simplification of Kafka's per-segment delete horizon).
   Records without a key are dropped, as Kafka's cleaner does. A batch whose records all
   survive is copied byte for byte. Otherwise the survivors are written into a new batch
   with the original header fields (baseOffset, lastOffsetDelta, timestamps, producer id,
   epoch, base sequence, partition leader epoch), only ``recordsCount``, ``batchLength``,
   CRC and the codec bits changed: the records are stored uncompressed, each one's bytes
   copied verbatim (its offset and timestamp deltas stay valid). Keeping ``lastOffsetDelta``
   keeps every segment's next offset, and the producer sequence a batch ends at, unchanged.
   An empty batch is dropped, except the last batch of a producer id, which keeps its last
   record so that the producer state rebuilt on open stays right (Kafka keeps an empty
   batch; a v2 batch of zero records is invalid here). Transactional and control batches
   are kept whole, and a transactional record is never the latest for its key (Kafka's
   cleaner removes aborted transactions' records; keeping them is safe, as read_committed
   consumers skip them by the aborted-transaction list).
4. **Group and swap.** Consecutive cleanable segments are merged while their cleaned size
   fits ``segment.bytes`` (and relative offsets and indexes fit). A group made of one
   unchanged segment is left alone, so a second run with nothing new changes nothing.
   Offsets are preserved; reads by offset see gaps, which clients handle.

Files and crash behaviour (Kafka's ``.cleaned`` / ``.swap`` protocol)::

    N.log.cleaned   the cleaned group, being written         on open: deleted
    N.log.swap      the cleaned group, complete and fsynced   on open: replaces every
                    (renamed from .cleaned)                   segment with a base offset in
                                                              [N, swap's next offset)

A group is replaced in this order: write and fsync ``N.log.cleaned``; rename it to
``N.log.swap`` (fsync the directory); delete the group's other segments and N's index files;
rename ``N.log.swap`` over ``N.log``; rebuild its indexes. A crash before the second rename
leaves the old segments (a ``.cleaned`` is discarded); after it, ``complete_swaps`` on open
finishes the job. A segment of the group whose records were all removed (base offset at or
after the swap's next offset) may survive such a crash: it holds only superseded records,
which is harmless and cleaned again next time. Leader-epoch start offsets rebuilt on a later
open may move forward when a batch starting an epoch was removed.

A batch that cannot be read within bounds (a compression bomb or broken records stored
before produce validated records: its records inflate past ``inflate_limit(max.message.bytes)``
or are malformed) is kept byte for byte and its keys take no part in the offset map; the
pass logs one line per segment holding such batches and carries on (Kafka's cleaner would
fail on it and stop cleaning the partition).

Cost: decodes every record below the high watermark (per-record Python work) and rewrites
only the groups that change. Thread-safety: ``plan`` and ``write_cleaned`` only read
segments and write ``.cleaned`` files, so ``PartitionLog``'s ``CompactionJob`` runs them in a
worker thread on a snapshot; the swap (``PartitionLog._swap_in``) runs on the log's thread.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
from kio.schema.errors import ErrorCode

from headrace.config import LogConfig
from headrace.fsutil import fsync_dir
from headrace.log.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, LogSegment
from headrace.protocol.records import (
    ATTRIBUTES_POS,
    CODEC_MASK,
    CRC_POS,
    HEADER,
    HEADER_SIZE,
    INT32_MAX,
    LOG_OVERHEAD,
    BatchHeader,
    InvalidRecordError,
    inflate,
    inflate_limit,
    read_header,
    read_varint,
)

log = logging.getLogger("headrace.cleaner")

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
_UINT32 = struct.Struct(">I")
_CORRUPT = ErrorCode.corrupt_message
_TIME_INDEX_ENTRY = 12  # bytes per .timeindex entry, the larger of the two indexes


@dataclass
class CleanerStats:
    """What one ``clean`` did; ``next_tombstone_expiry_ms`` is when a retained tombstone
    becomes removable (None: no tombstone retained)."""

    groups_rewritten: int = 0
    segments_removed: int = 0
    records_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    cleanable_end: int = 0
    next_tombstone_expiry_ms: int | None = None
    unreadable_batches: int = 0  # kept as they are (see the module docstring)


@dataclass
class OffsetMap:
    """key -> latest offset below ``upto``; producer id -> base offset of its last batch."""

    upto: int
    latest: dict[bytes, int] = field(default_factory=dict)
    last_batch_of_producer: dict[int, int] = field(default_factory=dict)


# ---------------------------------------------------------------------- record parsing


@dataclass(frozen=True, slots=True)
class _RawRecord:
    offset: int
    key: bytes | None
    is_tombstone: bool
    data: bytes  # the whole record, its length varint included


def _raw_records(batch: bytes | memoryview, header: BatchHeader, limit: int) -> list[_RawRecord]:
    """The records of one whole batch (``batch`` starts at its header), undecoded bytes kept.

    Record: varint length | int8 attributes | varint timestampDelta | varint offsetDelta |
    varint keyLength (-1 null) | key | varint valueLength (-1 null) | value | headers.
    Raises ``InvalidRecordError`` if the records inflate past ``limit`` bytes or are
    malformed (then nothing of the batch is used).
    """
    return list(_iter_raw_records(batch, header, limit))


def _iter_raw_records(batch: bytes | memoryview, header: BatchHeader,
                      limit: int) -> Iterator[_RawRecord]:
    data = bytes(inflate(header.compression, memoryview(batch)[HEADER_SIZE : header.size],
                         limit))
    pos = 0
    for _ in range(header.records_count):
        start = pos
        length, pos = read_varint(data, pos)
        end = pos + length
        if length < 0 or end > len(data):
            raise InvalidRecordError(_CORRUPT, "record runs past its batch")
        pos += 1  # attributes
        _, pos = read_varint(data, pos)  # timestampDelta
        offset_delta, pos = read_varint(data, pos)
        key_length, pos = read_varint(data, pos)
        key = None if key_length < 0 else data[pos : pos + key_length]
        pos += max(key_length, 0)
        if pos > end:
            raise InvalidRecordError(_CORRUPT, "record key runs past its record")
        value_length, _ = read_varint(data, pos)
        yield _RawRecord(header.base_offset + offset_delta, key, value_length < 0,
                         data[start:end])
        pos = end


def _batch_with(header: BatchHeader, records: list[_RawRecord]) -> bytes:
    """A batch with ``header``'s fields and only ``records``, uncompressed, CRC recomputed."""
    body = b"".join(r.data for r in records)
    buf = bytearray(HEADER_SIZE) + body
    HEADER.pack_into(
        buf, 0, header.base_offset, len(buf) - LOG_OVERHEAD, header.partition_leader_epoch,
        header.magic, 0, header.attributes & ~CODEC_MASK, header.last_offset_delta,
        header.base_timestamp, header.max_timestamp, header.producer_id, header.producer_epoch,
        header.base_sequence, len(records),
    )
    _UINT32.pack_into(buf, CRC_POS, crc32c.crc32c(memoryview(buf)[ATTRIBUTES_POS:]))
    return bytes(buf)


def _batches(seg: LogSegment) -> Iterator[tuple[BatchHeader, bytes]]:
    """Each batch of the segment with its bytes (one pread per batch)."""
    for h in seg.headers(0):
        yield h, seg.read(h.position, h.size)


# ---------------------------------------------------------------------- the passes


def build_offset_map(segments: list[LogSegment], upto: int,
                     limit: int = inflate_limit(LogConfig().max_message_bytes)) -> OffsetMap:
    """Pass 1 over every segment (see the module docstring); batches that cannot be read
    within ``limit`` bytes are left out."""
    m = OffsetMap(upto)
    for seg in segments:
        for h, data in _batches(seg):
            if h.producer_id >= 0:
                m.last_batch_of_producer[h.producer_id] = h.base_offset
            # transactional records never supersede anything (an aborted one must not
            # hide the value a read_committed consumer sees) and are kept whole below
            if h.base_offset >= upto or h.is_control or h.is_transactional:
                continue
            try:
                records = _raw_records(data, h, limit)
            except InvalidRecordError:
                continue  # counted and logged by the filter pass
            for r in records:
                if r.key is not None and r.offset < upto:
                    m.latest[r.key] = r.offset
    return m


@dataclass
class CleanedSegment:
    segment: LogSegment
    batches: list[bytes]
    changed: bool
    size: int
    records_removed: int


def _filter_segment(
    seg: LogSegment, m: OffsetMap, tombstone_horizon_ms: int, stats: CleanerStats,
    delete_retention_ms: int, limit: int,
) -> CleanedSegment:
    out: list[bytes] = []
    changed = False
    removed = 0
    unreadable: list[str] = []
    for h, data in _batches(seg):
        if h.is_control or h.is_transactional:
            out.append(data)
            continue
        try:
            records = _raw_records(data, h, limit)
        except InvalidRecordError as e:
            out.append(data)
            unreadable.append(f"offset {h.base_offset}: {e}")
            continue
        keep: list[_RawRecord] = []
        for r in records:
            if r.key is None or m.latest.get(r.key) != r.offset:
                continue
            if r.is_tombstone:
                if h.max_timestamp < tombstone_horizon_ms:
                    continue
                expiry = h.max_timestamp + delete_retention_ms
                if stats.next_tombstone_expiry_ms is None or expiry < (
                    stats.next_tombstone_expiry_ms
                ):
                    stats.next_tombstone_expiry_ms = expiry
            keep.append(r)
        if not keep and h.producer_id >= 0 and (
            m.last_batch_of_producer.get(h.producer_id) == h.base_offset
        ):
            keep = records[-1:]
        removed += len(records) - len(keep)
        if len(keep) == len(records):
            out.append(data)
        elif keep:
            out.append(_batch_with(h, keep))
            changed = True
        else:
            changed = True
    if unreadable:
        stats.unreadable_batches += len(unreadable)
        log.warning("compaction keeps %d unreadable batch(es) of %s as they are (first at %s)",
                    len(unreadable), seg.log_path, unreadable[0])
    return CleanedSegment(seg, out, changed, sum(len(b) for b in out), removed)


def _group(cleaned: list[CleanedSegment], config: LogConfig) -> list[list[CleanedSegment]]:
    """Consecutive segments merged while the result fits one segment (greedy, Kafka's
    ``groupSegmentsBySize``)."""
    groups: list[list[CleanedSegment]] = []
    for c in cleaned:
        if groups:
            g = groups[-1]
            size = sum(x.size for x in g) + c.size
            fits = (
                size <= config.segment_bytes
                and c.segment.next_offset - 1 - g[0].segment.base_offset <= INT32_MAX
                and (size // max(config.index_interval_bytes, 1) + 2) * _TIME_INDEX_ENTRY
                < config.segment_index_bytes
            )
            if fits:
                g.append(c)
                continue
        groups.append([c])
    return groups


def plan(
    segments: list[LogSegment], upto: int, config: LogConfig, now_ms: int
) -> tuple[int, CleanerStats, list[tuple[list[CleanedSegment], bool]]]:
    """Steps 1-4 short of the swap: (how many of ``segments`` are cleanable, statistics,
    the cleanable segments' groups each with whether it must be rewritten).

    ``segments`` is a log's whole list (the last one active, never touched); ``upto`` is
    its high watermark. Only reads the segments: safe on a snapshot in a worker thread.
    """
    stats = CleanerStats()
    cleanable = 0
    while cleanable < len(segments) - 1 and segments[cleanable + 1].base_offset <= upto:
        cleanable += 1
    stats.cleanable_end = segments[cleanable].base_offset
    if cleanable == 0:
        return 0, stats, []
    limit = inflate_limit(config.max_message_bytes)
    m = build_offset_map(segments, upto, limit)
    horizon = now_ms - config.delete_retention_ms
    cleaned = [_filter_segment(seg, m, horizon, stats, config.delete_retention_ms, limit)
               for seg in segments[:cleanable]]
    groups: list[tuple[list[CleanedSegment], bool]] = []
    for group in _group(cleaned, config):
        rewrite = len(group) > 1 or group[0].changed
        if rewrite:
            stats.groups_rewritten += 1
            stats.segments_removed += len(group) - 1
            stats.records_removed += sum(c.records_removed for c in group)
            stats.bytes_before += sum(c.segment.size for c in group)
            stats.bytes_after += sum(c.size for c in group)
        groups.append((group, rewrite))
    return cleanable, stats, groups


# ---------------------------------------------------------------------- files


def write_cleaned(group: list[CleanedSegment]) -> Path:
    """Write and fsync a group's surviving batches to ``N.log.cleaned`` (freeing them as
    they are written); on an error nothing stays on disk and the error propagates."""
    first = group[0].segment
    path = first.dir / f"{first.base_offset:020d}{LOG_SUFFIX}{CLEANED_SUFFIX}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        for c in group:
            for batch in c.batches:
                view = memoryview(batch)
                while view:
                    view = view[os.write(fd, view):]
            c.batches = []  # written: free the memory
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return path


def _swap_next_offset(path: Path) -> int | None:
    """One past the last offset in a swap file (None if it holds no valid batch)."""
    data = path.read_bytes()
    pos = 0
    next_offset = None
    while pos < len(data):
        try:
            h = read_header(data, pos)
        except InvalidRecordError:
            break
        if pos + h.size > len(data):
            break
        next_offset = h.next_offset
        pos += h.size
    return next_offset


def complete_swaps(directory: Path) -> None:
    """Crash recovery, before the log's segments are opened: discard ``.cleaned`` files
    and finish every ``.swap`` (see the module docstring)."""
    changed = False
    for p in directory.glob(f"*{CLEANED_SUFFIX}"):
        log.info("removing unfinished cleaner output %s", p)
        p.unlink(missing_ok=True)
        changed = True
    for swap in sorted(directory.glob(f"*{LOG_SUFFIX}{SWAP_SUFFIX}")):
        stem = swap.name.removesuffix(f"{LOG_SUFFIX}{SWAP_SUFFIX}")
        if not stem.isdigit():
            continue
        base = int(stem)
        end = _swap_next_offset(swap)
        end = base + 1 if end is None else end
        for p in directory.glob(f"*{LOG_SUFFIX}"):
            if p.stem.isdigit() and base <= int(p.stem) < end:
                log.info("completing compaction swap %s: removing %s", swap, p)
                for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                    p.with_suffix(suffix).unlink(missing_ok=True)
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            (directory / f"{base:020d}{suffix}").unlink(missing_ok=True)
        os.replace(swap, directory / f"{base:020d}{LOG_SUFFIX}")
        changed = True
    if changed:  # nothing removed or renamed: no directory entry to make durable
        fsync_dir(directory)
