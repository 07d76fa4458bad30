"""One segment of a partition log: a ``.log`` file of batches and its two indexes.

Files (Kafka's names, in the partition directory; ``N`` is the base offset, 20 digits)::

    N.log        RecordBatch v2 batches back to back, exactly as stored by the leader
                 (layout in ``headrace.protocol.records``); the first batch's baseOffset >= N
    N.index      sparse offset index (``headrace.log.index.OffsetIndex``)
    N.timeindex  sparse time index  (``headrace.log.index.TimeIndex``)
    N.txnindex   aborted transactions whose markers are here (kept by ``PartitionLog``;
                 ``delete`` removes it with the rest)

Appends are one ``os.write`` (or ``os.writev`` of its pieces) of already validated batch
bytes to an ``O_APPEND`` fd; reads are one ``os.pread``. Nothing is fsynced unless ``flush``
is called (the partition log's flush policy decides). The fds are ``LazyFile``s of the
process-wide ``OPEN_FILES`` LRU (``headrace.log.index``): a segment's file may be closed
while unused and is reopened on its next use.

A failed append (ENOSPC, EIO) is undone with ``mark`` / ``undo_to``: the files are cut back
to their size before it and the size checked, so no torn batch stays in front of later
appends (issue 8, item 2).

Crash behaviour: a crash can leave a torn or garbage tail on the ``.log`` and index entries
that point past it. ``recover`` re-validates every batch (length, magic, CRC-32C, offsets
increasing), truncates the file at the first invalid one and rewrites both indexes from the
surviving batches. ``open`` trusts a segment only if its indexes pass their sanity checks
and the batches after the last offset-index entry (at most about one index interval) are
whole and valid; otherwise the caller must ``recover`` it.

Thread-safety: none; one event-loop thread owns the segment.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import itertools
import logging
import mmap
import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from headrace.log.errors import CorruptLogError
from headrace.log.index import LazyFile, OffsetIndex, TimeIndex, release_later
from headrace.protocol.records import (
    HEADER_SIZE,
    INT32_MAX,
    BatchHeader,
    InvalidRecordError,
    check_batch,
    read_header,
)

log = logging.getLogger("headrace.log")

# The last batches appended to the active segment, as last offsets and positions (two
# arrays: 16 bytes a batch): a fetch at the tail (a follower's, a consumer caught up)
# finds its batch here with one header read, instead of reading every header from the
# last index entry on (up to index.interval.bytes of batches: ~40 reads for batches of
# one small record). Kept between TAIL_BATCHES and twice that, and dropped when the
# segment rolls: at most ~0.5 KB per partition.
TAIL_BATCHES = 16

# A fetch reads at least this many bytes of one segment as a ``FileRegion`` (sent with
# ``sendfile`` by the connection: no copy into the broker and none out of it) rather than
# with ``os.pread``. Measured on loopback (2-core machine, 256 KiB chunks): the sender's CPU
# per GB 0.31-0.33 s with sendfile against 0.65 s with pread + writev, at 64 KiB 0.37-0.42
# against 0.75-0.81. Below it the copy costs little and a region's bookkeeping would not pay.
REGION_MIN_BYTES = 32 * 1024

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"  # written by the partition log (``headrace.log.state_files``)


def segment_file(directory: Path, base_offset: int, suffix: str) -> Path:
    return directory / f"{base_offset:020d}{suffix}"


@contextlib.contextmanager
def _mapped(fd: int, size: int) -> Iterator[bytes | mmap.mmap]:
    """A read-only view of the first ``size`` bytes of the file (b"" when empty)."""
    if size == 0:
        yield b""
        return
    m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    try:
        yield m
    finally:
        m.close()


class SegmentMark(NamedTuple):
    """A segment's state before an append (``LogSegment.mark`` / ``undo_to``)."""

    size: int
    next_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    bytes_since_index_entry: int
    index_entries: int
    time_index_entries: int


class FileRegion:
    """``length`` bytes of a segment's ``.log`` from ``position``, not read yet: a Fetch
    response's records as the connection sends them with ``os.sendfile`` (or reads them
    with ``read`` where it cannot, e.g. TLS). Holds the file open (pinned in
    ``OPEN_FILES``) until ``release``, which the writer calls, and which dropping the region
    unwritten also does (at the next use of any file). ``valid`` is false once the segment
    was cut back (truncation, a failed append undone) after the region was taken: its bytes
    may have changed, and the response must not be sent."""

    __slots__ = ("_file", "fd", "generation", "length", "position", "segment")

    def __init__(self, segment: LogSegment, position: int, length: int) -> None:
        self.segment = segment
        self.generation = segment.generation
        self.position = position
        self.length = length
        self._file: LazyFile | None = segment._file
        self.fd = segment._file.acquire()

    def __len__(self) -> int:
        return self.length

    def valid(self) -> bool:
        return self._file is not None and self.segment.generation == self.generation

    def read(self, start: int = 0) -> bytes:
        """The region's bytes from ``start`` on (fewer if the file was cut meanwhile)."""
        return os.pread(self.fd, self.length - start, self.position + start)

    def release(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            f.release()

    def __del__(self) -> None:
        # dropped unwritten: give the pin back, later (the garbage collector may run this
        # while the file table's lock is held: see ``index.release_later``)
        f, self._file = self._file, None
        if f is not None:
            release_later(f)


class LogSegment:
    """A ``.log`` file with its indexes; see the module docstring for formats and crashes.

    ``next_offset`` is one past the last offset stored (``base_offset`` when empty);
    ``max_timestamp`` / ``offset_of_max_timestamp`` describe the batch with the largest
    ``maxTimestamp`` (its last offset), -1 when there is none. ``created_ms`` is when the
    segment was created per the clock, or for a reopened segment its first batch's
    ``maxTimestamp`` (so a restart does not reset its age); ``segment.ms`` rolls use it.
    """

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
        created_ms: int,
        truncate: bool = False,
    ) -> None:
        self.dir = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.log_path = segment_file(directory, base_offset, LOG_SUFFIX)
        self.index = OffsetIndex(
            segment_file(directory, base_offset, INDEX_SUFFIX), base_offset, max_index_bytes
        )
        self.time_index = TimeIndex(
            segment_file(directory, base_offset, TIME_INDEX_SUFFIX), base_offset, max_index_bytes
        )
        self._file = LazyFile(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        self._file.open_now(os.O_TRUNC if truncate else 0)
        with self._file.use() as fd:
            self.size = os.fstat(fd).st_size
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = -1
        self.created_ms = created_ms
        self._bytes_since_last_index_entry = 0
        self._closed = False
        # the batches last appended by ``append_parts``, consecutive and ending at the end
        # of the file: their last offsets and positions, and the first one's base offset
        # (emptied by anything else that moves the end: undo, truncation, recovery; and
        # on roll); replaced, never changed in place, when trimmed
        self._tail_last = array("q")
        self._tail_pos = array("q")
        self._tail_base = 0
        # counts the cuts of the file's end (truncation, undo, recovery): a FileRegion taken
        # before one is no longer valid
        self.generation = 0

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def create(
        cls, directory: Path, base_offset: int, *, index_interval_bytes: int,
        max_index_bytes: int, now_ms: int,
    ) -> LogSegment:
        """A new empty segment (existing files with this base offset are emptied)."""
        seg = cls(directory, base_offset, index_interval_bytes=index_interval_bytes,
                  max_index_bytes=max_index_bytes, created_ms=now_ms, truncate=True)
        seg.index.clear()
        seg.time_index.clear()
        return seg

    @classmethod
    def open(
        cls, directory: Path, base_offset: int, *, index_interval_bytes: int,
        max_index_bytes: int, now_ms: int, offset_limit: int | None,
    ) -> tuple[LogSegment, bool]:
        """Open an existing segment: (segment, whether it is consistent without recovery).

        Cost: reads both index files and validates the batches after the last offset-index
        entry. ``offset_limit`` is the next segment's base offset, if any.
        """
        seg = cls(directory, base_offset, index_interval_bytes=index_interval_bytes,
                  max_index_bytes=max_index_bytes, created_ms=now_ms)
        consistent = seg._load(offset_limit)
        return seg, consistent

    def _load(self, offset_limit: int | None) -> bool:
        if not (self.index.load(self.size, offset_limit) and self.time_index.load(offset_limit)):
            return False
        last_entry = self.index.last_entry
        start = last_entry[1] if last_entry is not None else 0
        with self._file.use() as fd, _mapped(fd, self.size) as buf:
            pos = start
            tail: list[BatchHeader] = []
            try:
                while pos < self.size:
                    header = read_header(buf, pos)
                    check_batch(buf, header)
                    tail.append(header)
                    pos += header.size
            except InvalidRecordError as e:
                log.warning("segment %s: invalid batch after the last index entry: %s",
                            self.log_path, e)
                return False
        if last_entry is not None and (not tail or tail[0].last_offset != last_entry[0]):
            log.warning("segment %s: last index entry does not match its batch", self.log_path)
            return False
        if any(b.base_offset <= a.last_offset for a, b in itertools.pairwise(tail)):
            log.warning("segment %s: offsets do not increase after the last index entry",
                        self.log_path)
            return False
        if tail and (tail[0].base_offset < self.base_offset
                     or (offset_limit is not None and tail[-1].last_offset >= offset_limit)):
            log.warning("segment %s: offsets outside the segment's range", self.log_path)
            return False
        last_time = self.time_index.last_entry
        if last_time is not None:
            self.max_timestamp, self.offset_of_max_timestamp = last_time
        for h in tail:
            self._track(h)
        if self.size:
            self.created_ms = min(self.created_ms, self._first_timestamp())
        return True

    def _first_timestamp(self) -> int:
        header = self._read_header_at(0)
        return header.max_timestamp if header is not None and header.max_timestamp >= 0 else (
            self.created_ms
        )

    def _drop_tail(self) -> None:
        self._tail_last = array("q")
        self._tail_pos = array("q")

    def _cut(self) -> None:
        """The end of the file moves back: the tail lookup and the regions taken go."""
        self._drop_tail()
        self.generation += 1

    def _track(self, header: BatchHeader) -> None:
        self.next_offset = header.next_offset
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.last_offset

    def recover(self) -> int:
        """Validate every batch, truncate at the first invalid one, rebuild both indexes.

        Returns the number of bytes truncated. Reads the whole file (mmap), one CRC-32C per
        batch: about the cost of reading the segment once.
        """
        self._cut()
        self.next_offset = self.base_offset
        self.max_timestamp = self.offset_of_max_timestamp = -1
        index_entries: list[tuple[int, int]] = []
        time_entries: list[tuple[int, int]] = []
        since_entry = 0
        valid = 0
        with self._file.use() as fd, _mapped(fd, self.size) as buf:
            while valid < self.size:
                try:
                    header = read_header(buf, valid)
                    check_batch(buf, header)
                except InvalidRecordError as e:
                    log.warning("segment %s: invalid batch at position %d: %s",
                                self.log_path, valid, e)
                    break
                if (header.base_offset < self.next_offset
                        or header.last_offset - self.base_offset > INT32_MAX):
                    log.warning("segment %s: batch at position %d has offset %d, expected "
                                ">= %d", self.log_path, valid, header.base_offset,
                                self.next_offset)
                    break
                self._track(header)
                if since_entry > self.index_interval_bytes:
                    index_entries.append((header.last_offset, valid))
                    if not time_entries or self.max_timestamp > time_entries[-1][0]:
                        time_entries.append((self.max_timestamp, self.offset_of_max_timestamp))
                    since_entry = 0
                since_entry += header.size
                valid += header.size
        truncated = self.size - valid
        if truncated:
            with self._file.use() as fd:
                os.ftruncate(fd, valid)
            self.size = valid
            log.warning("segment %s: truncated %d invalid byte(s) at position %d",
                        self.log_path, truncated, valid)
        if self.max_timestamp >= 0 and (
            not time_entries or self.max_timestamp > time_entries[-1][0]
        ):
            time_entries.append((self.max_timestamp, self.offset_of_max_timestamp))
        self.index.rebuild(index_entries)
        self.time_index.rebuild(time_entries)
        self._bytes_since_last_index_entry = since_entry
        return truncated

    def on_become_inactive(self) -> None:
        """Called when a newer segment takes over appends (roll): seal the time index with
        the segment's maximum timestamp, as Kafka does, and close the index append fds.
        Its tail is forgotten: fetches are at the new segment's."""
        self._drop_tail()
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
        self.index.close()
        self.time_index.close()

    def flush(self) -> None:
        """fsync the log and index files."""
        self._file.dirty = True
        self._file.fsync()
        self.index.flush()
        self.time_index.flush()

    def close(self) -> None:
        """Close all fds; writes nothing."""
        if not self._closed:
            self._closed = True
            self._file.close()
            self.index.close()
            self.time_index.close()

    def delete(self) -> None:
        """Close and remove the files (the ``.log`` first, so a crash leaves at most
        orphan index files, which the partition log removes on open)."""
        self.close()
        self.log_path.unlink(missing_ok=True)
        self.index.delete()
        self.time_index.delete()
        segment_file(self.dir, self.base_offset, TXN_INDEX_SUFFIX).unlink(missing_ok=True)

    # ------------------------------------------------------------------ append / read
    def append(self, batch: bytes | bytearray | memoryview, header: BatchHeader) -> None:
        """Append one validated batch whose offsets are already assigned.

        ``header`` describes ``batch`` (its ``position`` is ignored). An index entry
        (batch's last offset, its position) is added when more than
        ``index_interval_bytes`` were written since the previous entry.
        """
        self.append_parts([batch], header)

    def append_parts(
        self, parts: list[bytes | bytearray | memoryview], header: BatchHeader
    ) -> None:
        """``append`` of a batch given as consecutive pieces: one ``os.writev``, so a batch
        whose header was rewritten need not be copied whole."""
        position = self.size
        size = sum(map(len, parts))
        f = self._file
        f.dirty = True
        fd = f.acquire()
        try:
            written = os.writev(fd, parts) if len(parts) > 1 else os.write(fd, parts[0])
            if written < size:  # short write (e.g. the disk filled up): write the rest
                rest = memoryview(b"".join(parts))
                while written < size:
                    n = os.write(fd, rest[written:])
                    if n <= 0:
                        raise OSError(errno.ENOSPC, "no progress writing to the log")
                    written += n
        finally:
            f.release()
        self.size += size
        self._track(header)
        last = self._tail_last
        if len(last) >= 2 * TAIL_BATCHES:  # keep the newest: the first kept begins one
            self._tail_base = last[-TAIL_BATCHES - 1] + 1  # past the one before it
            self._tail_last = last = last[-TAIL_BATCHES:]
            self._tail_pos = self._tail_pos[-TAIL_BATCHES:]
        elif not last:
            self._tail_base = header.base_offset
        last.append(header.last_offset)
        self._tail_pos.append(position)
        if self._bytes_since_last_index_entry > self.index_interval_bytes:
            self.index.append(header.last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += size

    def mark(self) -> SegmentMark:
        """The segment's state now, for ``undo_to`` (taken before an append)."""
        return SegmentMark(self.size, self.next_offset, self.max_timestamp,
                           self.offset_of_max_timestamp, self._bytes_since_last_index_entry,
                           len(self.index), len(self.time_index))

    def undo_to(self, mark: SegmentMark) -> None:
        """Put the segment back exactly as it was at ``mark``: the ``.log`` file cut back to
        its size then (whatever a failed write left behind it: a torn batch, or whole
        batches of a request that failed later), the index files to their entries then,
        and the in-memory state. Verifies the file size afterwards; raises OSError if the
        files cannot be put back (the caller must then take the log offline)."""
        self._cut()
        with self._file.use() as fd:
            os.ftruncate(fd, mark.size)
            actual = os.fstat(fd).st_size
        if actual != mark.size:
            raise OSError(errno.EIO, f"{self.log_path} is {actual} bytes after truncating "
                                     f"to {mark.size}")
        self.size = mark.size
        self.next_offset = mark.next_offset
        self.max_timestamp = mark.max_timestamp
        self.offset_of_max_timestamp = mark.offset_of_max_timestamp
        self._bytes_since_last_index_entry = mark.bytes_since_index_entry
        self.index.restore(mark.index_entries)
        self.time_index.restore(mark.time_index_entries)

    def read(self, position: int, size: int) -> bytes:
        """``size`` bytes from ``position`` (fewer at the end of the file)."""
        f = self._file
        fd = f.acquire()
        try:
            return os.pread(fd, size, position)
        finally:
            f.release()

    def read_region(self, position: int, size: int) -> bytes | FileRegion:
        """``read``, or from ``REGION_MIN_BYTES`` on the same bytes as a ``FileRegion``."""
        size = min(size, self.size - position)
        if size < REGION_MIN_BYTES:
            return self.read(position, max(size, 0))
        return FileRegion(self, position, size)

    def _read_header_at(self, position: int) -> BatchHeader | None:
        if position >= self.size:
            return None
        f = self._file
        fd = f.acquire()
        try:
            data = os.pread(fd, HEADER_SIZE, position)
        finally:
            f.release()
        try:
            return read_header(data, 0, position=position)
        except InvalidRecordError as e:
            raise CorruptLogError(
                f"segment {self.log_path}: bad batch header at position {position}: {e}"
            ) from e

    def headers(self, position: int = 0) -> Iterator[BatchHeader]:
        """Headers of the batches from ``position`` on: one 61-byte pread per batch."""
        while True:
            header = self._read_header_at(position)
            if header is None:
                return
            yield header
            position += header.size

    def whole_batches_within(self, position: int, max_bytes: int, max_offset: int,
                             max_headers: int = 256) -> int:
        """Bytes of the whole batches from ``position`` (a batch's start) that fit in
        ``max_bytes`` and end below ``max_offset``, found by reading their headers (at most
        ``max_headers``: 0 past that, and the caller reads the bytes instead)."""
        end = position
        for n, header in enumerate(self.headers(position)):
            if n >= max_headers:
                return 0
            if header.last_offset >= max_offset or end + header.size - position > max_bytes:
                break
            end += header.size
        return end - position

    def find_batch(self, offset: int) -> BatchHeader | None:
        """The first batch whose last offset is >= ``offset`` (None: none in this segment).

        Among the batches last appended when ``offset`` is (one header read); else a
        binary search in the offset index, then a header-only scan of at most about one
        index interval.
        """
        last, pos = self._tail_last, self._tail_pos
        if last and self._tail_base <= offset:
            i = bisect.bisect_left(last, offset)
            return None if i == len(last) else self._read_header_at(pos[i])
        for header in self.headers(self.index.lookup(offset)):
            if header.last_offset >= offset:
                return header
        return None

    def find_position(self, offset: int) -> int | None:
        """File position of the batch containing ``offset`` (or the first one after it)."""
        header = self.find_batch(offset)
        return None if header is None else header.position

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; returns bytes removed.

        A batch containing ``offset`` is removed whole, so the new end may be below it.
        """
        header = self.find_batch(offset)
        if header is None:
            return 0
        self._cut()
        removed = self.size - header.position
        with self._file.use() as fd:
            os.ftruncate(fd, header.position)
        self.size = header.position
        self.index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.next_offset = self.base_offset
        self.max_timestamp = self.offset_of_max_timestamp = -1
        for h in self.headers(0):
            self._track(h)
        self._bytes_since_last_index_entry = 0
        return removed

