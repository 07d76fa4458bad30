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

Thread-safety: none; the owning log is used from one event-loop thread.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import struct
import sys
from array import array
from bisect import bisect_right
from pathlib import Path

from headrace.fsutil import write_atomically

log = logging.getLogger("headrace.log")

_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")
UINT32_MAX = 2**32 - 1


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
        self._fd: int | None = None

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def is_full(self) -> bool:
        return (len(self) + 1) * self.entry_size > self.max_index_bytes

    def _append_bytes(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self._fd, data)

    def _read_file(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def _truncate_file(self, entries: int) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.truncate(self.path, entries * self.entry_size)

    def flush(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        """Close the append fd (reopened on the next append)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

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
