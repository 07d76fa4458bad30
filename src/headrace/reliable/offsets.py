"""PURE: KafkaSpout's per-partition offset discipline (R-REL-4), one byte per offset.

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
- Batches: ``emitted_batch(offsets)`` / ``acked_batch(offsets)`` are the per-offset events
  applied to a fetched run of offsets, with the same results as one call per offset
  (``tests/unit/test_offset_manager.py`` checks them against each other with Hypothesis).
  A contiguous ascending run — what a fetch returns — is one slice assignment.

Layout: a ``bytearray`` window, ``_states[i]`` is the state of offset ``_base + i``
(``_base == committed_offset``)::

    0 GAP (not emitted)   1 IN_FLIGHT   2 ACKED   3 FAILED     (bit 0 set: blocks commits)

``emitted``/``acked``/``failed`` index one byte; a fetched run of n contiguous offsets is one
slice write; ``committed`` deletes the prefix (a memmove of at most the window). The commit
point is found without a Python scan: ``_scan`` is the index before which nothing blocks,
``_acked_end`` one past the last ACKED offset before ``_scan``; ``next_commit_offset`` moves
``_scan`` with two C ``find``s for the next blocking byte and one ``rfind`` for the last
acked byte, so each byte is looked at once between commits. Memory: one byte per offset
between the committed offset and the highest emitted one (a compaction gap of n offsets
inside the window costs n bytes while a record below it is still uncommitted).

Thread-safety: none. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from headrace.reliable.errors import ReliableUsageError

GAP = 0
IN_FLIGHT = 1
ACKED = 2
FAILED = 3
_IN_FLIGHT_B = b"\x01"
_ACKED_B = b"\x02"
_FAILED_B = b"\x03"


def _is_run(offsets: Sequence[int], first: int, n: int) -> bool:
    """True if ``offsets`` is ``first, first + 1, ..., first + n - 1``."""
    if offsets[-1] - first != n - 1:
        return False
    if isinstance(offsets, range):
        return offsets.step == 1
    return n <= 1 or list(offsets) == list(range(first, first + n))


class OffsetManager:
    __slots__ = ("_acked_end", "_base", "_num_emitted", "_scan", "_states")

    def __init__(self, initial_offset: int) -> None:
        if initial_offset < 0:
            raise ReliableUsageError(f"initial offset {initial_offset} is negative")
        self._base = initial_offset
        self._states = bytearray()
        self._num_emitted = 0  # non-GAP bytes in _states
        self._scan = 0  # _states[:_scan] holds no IN_FLIGHT or FAILED byte
        self._acked_end = 0  # one past the last ACKED offset in _states[:_scan]; 0: none

    # ------------------------------------------------------------------ questions

    @property
    def committed_offset(self) -> int:
        return self._base

    @property
    def num_uncommitted(self) -> int:
        return self._num_emitted

    def _state(self, offset: int) -> int:
        i = offset - self._base
        states = self._states
        return states[i] if 0 <= i < len(states) else GAP

    def should_emit(self, offset: int) -> bool:
        """True if a fetched record at ``offset`` must be processed: not committed, not
        acked, not in flight (a failed offset is due for its replay)."""
        if offset < self._base:
            return False
        state = self._state(offset)
        return state in (GAP, FAILED)

    def is_acked(self, offset: int) -> bool:
        return offset >= self._base and self._state(offset) == ACKED

    def is_failed(self, offset: int) -> bool:
        return offset >= self._base and self._state(offset) == FAILED

    def is_in_flight(self, offset: int) -> bool:
        return offset >= self._base and self._state(offset) == IN_FLIGHT

    @property
    def failed_offsets(self) -> list[int]:
        states, base, out = self._states, self._base, []
        i = states.find(_FAILED_B)
        while i != -1:
            out.append(base + i)
            i = states.find(_FAILED_B, i + 1)
        return out

    def next_commit_offset(self) -> int | None:
        """One past the contiguous acked prefix; None when nothing new is committable."""
        states, scan = self._states, self._scan
        end = len(states)
        a = states.find(_IN_FLIGHT_B, scan)
        b = states.find(_FAILED_B, scan, end if a == -1 else a)
        stop = end if a == -1 and b == -1 else (a if b == -1 else b)
        if stop > scan:
            last = states.rfind(_ACKED_B, scan, stop)
            if last != -1:
                self._acked_end = self._base + last + 1
            self._scan = stop
        return self._acked_end if self._acked_end > self._base else None

    # ------------------------------------------------------------------ events

    def emitted(self, offset: int) -> bool:
        """A fetched record at ``offset`` is about to be processed. Returns False, changing
        nothing, if it must not be (see ``should_emit``)."""
        i = offset - self._base
        if i < 0:
            return False
        states = self._states
        n = len(states)
        if i >= n:
            if i > n:
                states.extend(bytes(i - n))
            states.append(IN_FLIGHT)
            self._num_emitted += 1
            return True
        state = states[i]
        if state == FAILED:
            states[i] = IN_FLIGHT
            return True
        if state != GAP:
            return False
        states[i] = IN_FLIGHT  # an out-of-order emit into what looked like a gap
        self._num_emitted += 1
        self._rescan_from(i)
        return True

    def emitted_batch(self, offsets: Sequence[int]) -> Sequence[int]:
        """``emitted`` for each offset of a fetched run; returns the positions (indices into
        ``offsets``) of the offsets that must be processed, in order. A ``range`` is returned
        only for a contiguous ascending run above every offset seen so far (all of it kept;
        the spout then holds the batch's offsets as a ``range``), otherwise a list."""
        n = len(offsets)
        if n == 0:
            return ()
        first = offsets[0]
        i = first - self._base
        states = self._states
        if i >= len(states) and _is_run(offsets, first, n):
            # the fetch's common case: a contiguous ascending run above the window
            if i > len(states):
                states.extend(bytes(i - len(states)))
            states.extend(_IN_FLIGHT_B * n)
            self._num_emitted += n
            return range(n)
        return [k for k, o in enumerate(offsets) if self.emitted(o)]

    def acked(self, offset: int) -> None:
        """The record at ``offset`` was fully processed."""
        i = offset - self._base
        if i < 0:
            return
        state = self._state(offset)
        if state == ACKED:
            return
        if state == GAP:
            raise ReliableUsageError(f"offset {offset} acked but never emitted")
        self._states[i] = ACKED

    def acked_batch(self, offsets: Sequence[int]) -> None:
        """``acked`` for each offset; a contiguous ascending run is one slice write. Raises,
        changing nothing, if one of them was never emitted."""
        n = len(offsets)
        if n == 0:
            return
        first, base = offsets[0], self._base
        if first >= base and _is_run(offsets, first, n):
            lo = first - base
            states = self._states
            if lo + n <= len(states) and states.find(b"\x00", lo, lo + n) == -1:
                states[lo:lo + n] = _ACKED_B * n
                return
        for o in offsets:
            if o >= base and self._state(o) == GAP:
                raise ReliableUsageError(f"offset {o} acked but never emitted")
        for o in offsets:
            self.acked(o)

    def failed(self, offset: int) -> None:
        """Processing of ``offset`` failed; it blocks commits until replayed and acked."""
        i = offset - self._base
        if i < 0:
            return
        state = self._state(offset)
        if state == GAP:
            raise ReliableUsageError(f"offset {offset} failed but never emitted")
        if state == ACKED:
            raise ReliableUsageError(f"offset {offset} failed after it was acked")
        self._states[i] = FAILED

    def committed(self, offset: int) -> None:
        """A commit of ``offset`` (the next offset to read) succeeded."""
        k = offset - self._base
        if k <= 0:
            return
        states = self._states
        stop = min(k, len(states))
        for blocking in (_IN_FLIGHT_B, _FAILED_B):
            i = states.find(blocking, 0, stop)
            if i != -1:
                raise ReliableUsageError(
                    f"commit of {offset} passes offset {self._base + i}, which is not fully "
                    "processed")
        self._num_emitted -= stop - states.count(b"\x00", 0, stop)
        del states[:stop]
        self._base = offset
        self._scan = max(0, self._scan - k)
        if self._acked_end <= offset:
            self._acked_end = 0

    def _rescan_from(self, i: int) -> None:
        if i < self._scan:
            self._scan = i
            last = self._states.rfind(_ACKED_B, 0, i)
            self._acked_end = 0 if last == -1 else self._base + last + 1

    def __repr__(self) -> str:
        return (f"OffsetManager(committed={self._base}, "
                f"uncommitted={self.num_uncommitted}, failed={self.failed_offsets})")
