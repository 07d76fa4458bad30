"""Sparse offset and time indexes of one log segment (Kafka's ``.index`` / ``.timeindex``).

File formats (big-endian, fixed-size entries, no header; offsets are relative to the
segment's base offset so they fit in 4 bytes)::

    .index      entry = relativeOffset uint32 | position uint32            (8 bytes)
                relativeOffset: last offset of the batch that starts at ``position``
    .timeindex  entry = timestamp int64 | relativeOffset uint32            (12 bytes)
                timestamp: the largest timestamp in the segment up to that entry;
                relativeOffset: the last offset of the batch that first reached it

An entry is added once at least ``index.interval.bytes`` of log were written since the last
one, so the indexes stay small; a lookup binary-searches the in-memory copy and the caller
scans at most about one interval of batch headers. Both keys strictly increase.

The indexes are derived data. Entries are kept in memory (arrays) and appended to the file
with one ``os.write``; the files are not preallocated. ``load`` sanity-checks a file (size a
multiple of the entry size, keys increasing, positions inside the segment, offsets below
the segment's end) and reports "rebuild needed" instead of trusting garbage; the segment then
rebuilds the index from the log. A crash can leave an entry the log does not have (the index
write survived, the log write did not), which this check or the segment's recovery catches.

Open files: every segment file (a ``.log`` and, while appended to, its indexes) is a
``LazyFile`` registered in ``OPEN_FILES``, a process-wide LRU that keeps at most
``capacity`` of them open (sized from the open-file limit at start-up) and closes the least
recently used ones beyond that; a closed one is reopened on its next use. So a broker hosts
any number of partitions whatever its fd limit (issue 8, item 9). A file in use is pinned
(``LazyFile.use``) and never closed under its user, also across threads.

Thread-safety: the owning log is used from one thread at a time; ``OPEN_FILES`` is shared
and locked.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import logging
import os
import struct
import sys
import threading
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from headrace.fsutil import write_atomically

log = logging.getLogger("headrace.log")

_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")
UINT32_MAX = 2**32 - 1


class OpenFiles:
    """A process-wide LRU of open ``LazyFile`` fds (see the module docstring)."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self.lock = threading.Lock()
        self._open: OrderedDict[int, LazyFile] = OrderedDict()
        self.evictions = 0

    def size_for_limit(self, soft_limit: int) -> None:
        """Use at most half of the open-file limit for segment files (the rest is for
        sockets, the metadata store and the interpreter), and at least 16."""
        self.capacity = max(16, soft_limit // 2)
        with self.lock:
            self._evict_locked()

    def __len__(self) -> int:
        return len(self._open)

    def _evict_locked(self, target: int | None = None) -> None:
        limit = self.capacity if target is None else target
        excess = len(self._open) - limit
        if excess <= 0:
            return
        # the least recently used unpinned files, found from the front of the LRU without
        # copying it: at capacity every open evicts one, and a copy of the whole LRU per
        # open (10,000 entries) was a quarter of a broker's event loop while it wrote into
        # 30,000 partitions (bench/cluster_bench.py --scale 30000)
        victims = []
        for key, f in self._open.items():
            if not f.pins:
                victims.append(key)
                if len(victims) >= excess:
                    break
        for key in victims:
            f = self._open.pop(key)
            fd, f.fd = f.fd, None
            if fd is not None:
                os.close(fd)
                self.evictions += 1

    def open_locked(self, f: LazyFile) -> int:
        """Open ``f`` (the lock is held), closing unused files beyond the capacity first;
        on EMFILE/ENFILE close half of the unused ones and try once more."""
        self._evict_locked(self.capacity - 1)
        try:
            fd = os.open(f.path, f.flags, 0o644)
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            self._evict_locked(len(self._open) // 2)
            fd = os.open(f.path, f.flags, 0o644)
        f.fd = fd
        self._open[id(f)] = f
        return fd

    def touch_locked(self, f: LazyFile) -> None:
        self._open.move_to_end(id(f))

    def forget_locked(self, f: LazyFile) -> None:
        self._open.pop(id(f), None)


OPEN_FILES = OpenFiles()

# Pins given back by a finalizer (``FileRegion.__del__``): the garbage collector may run it
# while this thread holds ``OPEN_FILES.lock`` (not reentrant), so it only queues the file
# here (``deque.append`` takes no lock) and the next acquire or release gives the pins back.
_RELEASE_LATER: collections.deque[LazyFile] = collections.deque()


def release_later(f: LazyFile) -> None:
    """``f.release()`` at the next acquire or release of any file (safe in a finalizer)."""
    _RELEASE_LATER.append(f)


def _released_later_locked() -> None:
    while _RELEASE_LATER:
        _RELEASE_LATER.popleft()._release_locked()


class LazyFile:
    """A file opened on demand through ``OPEN_FILES`` (closed again when unused ones are
    evicted). ``flags`` must not contain O_TRUNC or O_EXCL (reopens use them);
    ``open_now(extra)`` opens it at once, e.g. with O_TRUNC the first time."""

    __slots__ = ("close_pending", "dirty", "fd", "flags", "path", "pins")

    def __init__(self, path: Path, flags: int) -> None:
        self.path = path
        self.flags = flags | os.O_CLOEXEC
        self.fd: int | None = None
        self.pins = 0
        self.dirty = False  # written since the last fsync
        self.close_pending = False  # closed while pinned: the last user closes the fd

    def open_now(self, extra_flags: int = 0) -> None:
        with OPEN_FILES.lock:
            if self.fd is None:
                flags = self.flags
                self.flags |= extra_flags
                try:
                    OPEN_FILES.open_locked(self)
                finally:
                    self.flags = flags

    def acquire(self) -> int:
        """The fd, pinned open until ``release`` (the hot paths' cheaper ``use``)."""
        with OPEN_FILES.lock:
            if _RELEASE_LATER:
                _released_later_locked()
            fd = self.fd
            if fd is None:
                fd = OPEN_FILES.open_locked(self)
            elif not self.close_pending:
                OPEN_FILES.touch_locked(self)
            self.pins += 1
            return fd

    def release(self) -> None:
        with OPEN_FILES.lock:
            if _RELEASE_LATER:
                _released_later_locked()
            self._release_locked()

    def _release_locked(self) -> None:
        self.pins -= 1
        if not self.pins and self.close_pending:
            self.close_pending = False
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None

    @contextlib.contextmanager
    def use(self) -> Iterator[int]:
        """The fd, pinned open for the block."""
        fd = self.acquire()
        try:
            yield fd
        finally:
            self.release()

    def fsync(self) -> None:
        """fsync the file if it was written since the last fsync (through any fd: fsync
        flushes the file, so an fd closed by eviction loses nothing)."""
        if self.dirty:
            with self.use() as fd:
                os.fsync(fd)
            self.dirty = False

    def close(self) -> None:
        """Close the fd, or, while another thread uses it, have that user close it when
        done (an fd is never closed under a reader, whose number could then be reused)."""
        with OPEN_FILES.lock:
            OPEN_FILES.forget_locked(self)
            if self.pins:
                self.close_pending = self.fd is not None
                return
            fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def _be_array(typecode: str, data: bytes) -> array[int]:
    a = array(typecode)
    a.frombytes(data)
    if sys.byteorder == "little":
        a.byteswap()
    return a


def _strictly_increasing(values: array[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


class _IndexFile:
    """An append-only file of fixed-size entries, opened lazily for appends."""

    entry_size: int

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_index_bytes = max_index_bytes
        self._file = LazyFile(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def is_full(self) -> bool:
        return (len(self) + 1) * self.entry_size > self.max_index_bytes

    def _append_bytes(self, data: bytes) -> None:
        """Append whole entries; on a failed or short write the file is cut back to the
        entries in memory (so it never keeps a torn entry) and the OSError propagates."""
        self._file.dirty = True
        try:
            with self._file.use() as fd:
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, "short write to index")
        except OSError:
            self.restore(len(self))
            raise

    def restore(self, entries: int) -> None:
        """Cut the file back to its first ``entries`` entries (and memory, if longer): the
        undo of appends since the index had ``entries`` entries. Raises OSError if the
        file cannot be cut back."""
        self._drop_entries(entries)
        self.close()
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return
        if size != entries * self.entry_size:
            os.truncate(self.path, entries * self.entry_size)
            if os.stat(self.path).st_size != entries * self.entry_size:
                raise OSError(errno.EIO, f"could not truncate {self.path}")

    def _drop_entries(self, entries: int) -> None:
        raise NotImplementedError

    def _read_file(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def _truncate_file(self, entries: int) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.truncate(self.path, entries * self.entry_size)

    def clear(self) -> None:
        """Empty the file (creating it if missing) and memory: one ``open`` with O_TRUNC,
        atomic as ``rebuild([])`` is (a crash leaves the old file or an empty one, and an
        index of a new segment has nothing to lose) at a third of its file-system work: no
        temporary file and no rename per new segment, which counts when a topic of
        thousands of partitions is created."""
        self.close()
        self._drop_entries(0)
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                         0o644))

    def flush(self) -> None:
        self._file.fsync()

    def close(self) -> None:
        """Close the append fd (reopened on the next append)."""
        self._file.close()

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class OffsetIndex(_IndexFile):
    """Maps the last offset of some batches to their file position (see module docstring)."""

    entry_size = _OFFSET_ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        super().__init__(path, base_offset, max_index_bytes)
        self._offsets: array[int] = array("q")
        self._positions: array[int] = array("q")

    def __len__(self) -> int:
        return len(self._offsets)

    def _drop_entries(self, entries: int) -> None:
        del self._offsets[entries:]
        del self._positions[entries:]

    def load(self, log_size: int, offset_limit: int | None) -> bool:
        """Read the file; False (and an empty index) if it is missing or fails the checks.

        ``offset_limit``: offsets must be below it (the next segment's base offset), if known.
        """
        data = self._read_file()
        if data is None:
            log.info("offset index %s is missing", self.path)
            return False
        if len(data) % self.entry_size:
            log.warning("offset index %s has a size of %d, not a multiple of %d",
                        self.path, len(data), self.entry_size)
            return False
        raw = _be_array("I", data)
        relative, positions = array("q", raw[0::2]), array("q", raw[1::2])
        ok = (
            _strictly_increasing(relative)
            and _strictly_increasing(positions)
            and (not positions or positions[-1] < log_size)
            and (offset_limit is None or not relative
                 or relative[-1] + self.base_offset < offset_limit)
        )
        if not ok:
            log.warning("offset index %s is inconsistent with its segment", self.path)
            return False
        self._offsets = array("q", (o + self.base_offset for o in relative))
        self._positions = positions
        return True

    def rebuild(self, entries: list[tuple[int, int]]) -> None:
        """Replace the file and memory with ``entries`` (offset, position), atomically."""
        self.close()
        self._offsets = array("q", (o for o, _ in entries))
        self._positions = array("q", (p for _, p in entries))
        write_atomically(
            self.path,
            b"".join(_OFFSET_ENTRY.pack(o - self.base_offset, p) for o, p in entries),
            fsync=False,  # an index is rebuilt from its log if it is lost
        )

    @property
    def last_entry(self) -> tuple[int, int] | None:
        if not self._offsets:
            return None
        return self._offsets[-1], self._positions[-1]

    def lookup(self, offset: int) -> int:
        """Position of the last indexed batch whose last offset is <= ``offset`` (else 0)."""
        i = bisect_right(self._offsets, offset) - 1
        return self._positions[i] if i >= 0 else 0

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        if not 0 <= relative <= UINT32_MAX or position > UINT32_MAX:
            raise ValueError(f"index entry ({offset}, {position}) out of range")
        if self._offsets and (offset <= self._offsets[-1] or position <= self._positions[-1]):
            raise ValueError(f"index entry ({offset}, {position}) does not increase")
        self._append_bytes(_OFFSET_ENTRY.pack(relative, position))
        self._offsets.append(offset)
        self._positions.append(position)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose offset is >= ``offset``."""
        keep = bisect_right(self._offsets, offset - 1)
        if keep < len(self._offsets):
            del self._offsets[keep:]
            del self._positions[keep:]
            self._truncate_file(keep)


class TimeIndex(_IndexFile):
    """Maps the running maximum timestamp to the offset that reached it."""

    entry_size = _TIME_ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        super().__init__(path, base_offset, max_index_bytes)
        self._timestamps: array[int] = array("q")
        self._offsets: array[int] = array("q")

    def __len__(self) -> int:
        return len(self._timestamps)

    def _drop_entries(self, entries: int) -> None:
        del self._timestamps[entries:]
        del self._offsets[entries:]

    def load(self, offset_limit: int | None) -> bool:
        """Read the file; False (and an empty index) if it is missing or fails the checks."""
        data = self._read_file()
        if data is None:
            log.info("time index %s is missing", self.path)
            return False
        if len(data) % self.entry_size:
            log.warning("time index %s has a size of %d, not a multiple of %d",
                        self.path, len(data), self.entry_size)
            return False
        timestamps: array[int] = array("q")
        offsets: array[int] = array("q")
        for ts, rel in _TIME_ENTRY.iter_unpack(data):
            timestamps.append(ts)
            offsets.append(rel + self.base_offset)
        ok = (
            _strictly_increasing(timestamps)
            and all(a <= b for a, b in itertools.pairwise(offsets))
            and (offset_limit is None or not offsets or offsets[-1] < offset_limit)
        )
        if not ok:
            log.warning("time index %s is inconsistent with its segment", self.path)
            return False
        self._timestamps, self._offsets = timestamps, offsets
        return True

    def rebuild(self, entries: list[tuple[int, int]]) -> None:
        """Replace the file and memory with ``entries`` (timestamp, offset), atomically."""
        self.close()
        self._timestamps = array("q", (t for t, _ in entries))
        self._offsets = array("q", (o for _, o in entries))
        write_atomically(
            self.path,
            b"".join(_TIME_ENTRY.pack(t, o - self.base_offset) for t, o in entries),
            fsync=False,  # an index is rebuilt from its log if it is lost
        )

    @property
    def last_entry(self) -> tuple[int, int] | None:
        if not self._timestamps:
            return None
        return self._timestamps[-1], self._offsets[-1]

    def lookup(self, timestamp: int) -> int:
        """An offset at or before the first record with a timestamp >= ``timestamp``.

        The entry with the largest timestamp <= ``timestamp``: every batch before the one
        that first reached that timestamp is older, so the search starts there (or at the
        segment's base offset).
        """
        i = bisect_right(self._timestamps, timestamp) - 1
        return self._offsets[i] if i >= 0 else self.base_offset

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Append (timestamp, offset) if the timestamp is larger than the last entry's."""
        if self._timestamps and timestamp <= self._timestamps[-1]:
            return
        relative = offset - self.base_offset
        if not 0 <= relative <= UINT32_MAX:
            raise ValueError(f"time index offset {offset} out of range")
        self._append_bytes(_TIME_ENTRY.pack(timestamp, relative))
        self._timestamps.append(timestamp)
        self._offsets.append(offset)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose offset is >= ``offset``."""
        keep = len(self._offsets)
        while keep and self._offsets[keep - 1] >= offset:
            keep -= 1
        if keep < len(self._offsets):
            del self._timestamps[keep:]
            del self._offsets[keep:]
            self._truncate_file(keep)
