"""PURE: KafkaSpout's per-partition offset discipline (R-REL-4).

States of an offset at or above the committed offset::

    (not emitted) --emitted--> IN_FLIGHT --acked--> ACKED --committed past--> (dropped)
                                   |  ^
                              failed  | emitted (a replay)
                                   v  |
                                 FAILED --acked (a late success)--> ACKED

Rules:

- The value to commit is one past the end of the contiguous ACKED prefix of the emitted
  offsets, starting at the committed offset. Offsets never emitted between two emitted ones
  are log gaps (compaction, transaction markers) and do not block; an emitted offset that is
  in flight or failed does. Seed 000: 11-13 acked, 14 failed, 15-18 acked → commit 14.
- ACKED offsets above a gap stay remembered until a commit covers them, and are not emitted
  again when a replay (a seek back to a failed offset) fetches them: ``emitted`` returns
  False and changes nothing. The same holds for offsets in flight and offsets below the
  committed offset. So after 14's replay only 14 is processed again, then the commit is 19.
- ``committed(offset)`` drops everything below ``offset``. Committing past an offset that is
  in flight or failed raises ``ReliableUsageError`` (it would lose that record); a commit at
  or below the current one is stale and ignored.
- ``num_uncommitted`` counts emitted offsets not yet covered by a commit (in flight, failed
  and acked-but-held); the consumer pauses the partition when it reaches
  ``max_uncommitted_offsets``.

Cost: offsets arrive in ascending order, so the sorted list grows by appends; the acked
prefix is remembered between calls, so ``next_commit_offset`` is amortised O(1) per record.
Thread-safety: none. No I/O, no clock.
"""

from __future__ import annotations

import bisect

from headrace.reliable.errors import ReliableUsageError


class OffsetManager:
    def __init__(self, initial_offset: int) -> None:
        if initial_offset < 0:
            raise ReliableUsageError(f"initial offset {initial_offset} is negative")
        self.committed_offset = initial_offset
        self._emitted: list[int] = []  # sorted: every emitted offset >= committed_offset
        self._acked: set[int] = set()
        self._failed: set[int] = set()
        self._prefix = 0  # _emitted[:_prefix] are all acked

    # ------------------------------------------------------------------ questions

    @property
    def num_uncommitted(self) -> int:
        return len(self._emitted)

    def should_emit(self, offset: int) -> bool:
        """True if a fetched record at ``offset`` must be processed: not committed, not
        acked, not in flight (a failed offset is due for its replay)."""
        if offset < self.committed_offset or offset in self._acked:
            return False
        return offset in self._failed or not self._is_emitted(offset)

    def is_acked(self, offset: int) -> bool:
        return offset in self._acked

    def is_failed(self, offset: int) -> bool:
        return offset in self._failed

    def is_in_flight(self, offset: int) -> bool:
        return (self._is_emitted(offset) and offset not in self._acked
                and offset not in self._failed)

    @property
    def failed_offsets(self) -> list[int]:
        return sorted(self._failed)

    def next_commit_offset(self) -> int | None:
        """One past the contiguous acked prefix; None when nothing new is committable."""
        emitted, acked = self._emitted, self._acked
        i = self._prefix
        while i < len(emitted) and emitted[i] in acked:
            i += 1
        self._prefix = i
        if i == 0:
            return None
        return emitted[i - 1] + 1

    # ------------------------------------------------------------------ events

    def emitted(self, offset: int) -> bool:
        """A fetched record at ``offset`` is about to be processed. Returns False, changing
        nothing, if it must not be (see ``should_emit``)."""
        if not self.should_emit(offset):
            return False
        if offset in self._failed:
            self._failed.discard(offset)
            return True
        emitted = self._emitted
        if not emitted or offset > emitted[-1]:
            emitted.append(offset)
        else:
            pos = bisect.bisect_left(emitted, offset)
            emitted.insert(pos, offset)
            self._prefix = min(self._prefix, pos)
        return True

    def acked(self, offset: int) -> None:
        """The record at ``offset`` was fully processed."""
        if offset < self.committed_offset or offset in self._acked:
            return
        if not self._is_emitted(offset):
            raise ReliableUsageError(f"offset {offset} acked but never emitted")
        self._failed.discard(offset)
        self._acked.add(offset)

    def failed(self, offset: int) -> None:
        """Processing of ``offset`` failed; it blocks commits until replayed and acked."""
        if offset < self.committed_offset:
            return
        if not self._is_emitted(offset):
            raise ReliableUsageError(f"offset {offset} failed but never emitted")
        if offset in self._acked:
            raise ReliableUsageError(f"offset {offset} failed after it was acked")
        self._failed.add(offset)

    def committed(self, offset: int) -> None:
        """A commit of ``offset`` (the next offset to read) succeeded."""
        if offset <= self.committed_offset:
            return
        emitted = self._emitted
        end = bisect.bisect_left(emitted, offset)
        for o in emitted[:end]:
            if o not in self._acked:
                raise ReliableUsageError(
                    f"commit of {offset} passes offset {o}, which is not fully processed")
        for o in emitted[:end]:
            self._acked.discard(o)
        del emitted[:end]
        self._prefix = max(0, self._prefix - end)
        self.committed_offset = offset

    def _is_emitted(self, offset: int) -> bool:
        emitted = self._emitted
        pos = bisect.bisect_left(emitted, offset)
        return pos < len(emitted) and emitted[pos] == offset

    def __repr__(self) -> str:
        return (f"OffsetManager(committed={self.committed_offset}, "
                f"uncommitted={self.num_uncommitted}, failed={self.failed_offsets})")
