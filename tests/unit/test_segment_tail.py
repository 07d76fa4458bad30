"""A fetch at a segment's tail finds its batch with one header read (``LogSegment._tail``;
R-LOG-2, issue 24). ``find_batch`` used to read every batch header from the last offset
index entry on: with batches of one small record, ~40 reads per partition of every
follower fetch and of every consumer caught up. The batches last appended are now kept
as last offsets and positions (16 bytes a batch, 16 to 32 batches, dropped when the
segment rolls), and an offset among them is found by a binary search and one read.

The rule that must hold: ``find_batch`` answers exactly what a scan of every header from
the start answers, for every offset, after any mix of appends, undone appends (a failed
request), truncations (a follower's) and recovery (a restart), and across the tail's
trimming; and an offset in the tail costs one header read."""

from __future__ import annotations

import random
from pathlib import Path

from tests.batches import make_batch

from headrace.log import segment as segment_module
from headrace.log.segment import TAIL_BATCHES, LogSegment
from headrace.protocol.records import read_header


def _segment(tmp_path: Path) -> LogSegment:
    return LogSegment.create(tmp_path, 0, index_interval_bytes=4096, max_index_bytes=1 << 20,
                             now_ms=0)


def _append(seg: LogSegment, n: int) -> None:
    batch = make_batch([(None, b"v" * 20, 1_000, [])] * n, base_offset=seg.next_offset)
    seg.append(batch, read_header(batch))


def _reference(seg: LogSegment, offset: int) -> int | None:
    """The position ``find_batch`` must answer: a scan of every header from the start."""
    for h in seg.headers(0):
        if h.last_offset >= offset:
            return h.position
    return None


def _check_all(seg: LogSegment) -> None:
    for offset in range(seg.base_offset, seg.next_offset + 2):
        found = seg.find_batch(offset)
        assert (None if found is None else found.position) == _reference(seg, offset), offset


def test_find_batch_agrees_with_a_full_scan_through_every_change(tmp_path: Path) -> None:
    rng = random.Random(11)
    seg = _segment(tmp_path)
    for step in range(400):
        op = rng.random()
        if op < 0.75 or seg.next_offset == 0:
            _append(seg, rng.choice((1, 1, 1, 3, 7)))
        elif op < 0.85:  # a request that failed after its appends: put back
            mark = seg.mark()
            for _ in range(rng.randint(1, 4)):
                _append(seg, 1)
            seg.undo_to(mark)
        elif op < 0.95:  # a follower truncating its divergent suffix
            seg.truncate_to(rng.randrange(0, seg.next_offset))
        else:  # a restart's recovery
            seg.recover()
        if step % 20 == 0 or op >= 0.75:
            _check_all(seg)
    assert len(seg._tail_last) == len(seg._tail_pos) <= 2 * TAIL_BATCHES
    _check_all(seg)
    seg.on_become_inactive()  # rolled: fetches go to the next segment
    assert not seg._tail_last
    _check_all(seg)


def test_an_offset_in_the_tail_costs_one_header_read(tmp_path: Path,
                                                     monkeypatch: object) -> None:
    seg = _segment(tmp_path)
    for _ in range(3 * TAIL_BATCHES):  # ~100 bytes each: many batches per index entry
        _append(seg, 1)
    reads = 0
    real = LogSegment._read_header_at

    def counting(self: LogSegment, position: int) -> object:
        nonlocal reads
        reads += 1
        return real(self, position)

    monkeypatch.setattr(LogSegment, "_read_header_at", counting)  # type: ignore[attr-defined]
    last = seg.next_offset - 1
    assert seg.find_batch(last).base_offset == last  # type: ignore[union-attr]
    assert reads == 1
    reads = 0
    assert seg.find_batch(last + 1) is None and reads == 0  # past the end: no read at all
    # an offset older than the tail: the index and a scan, as before
    reads = 0
    assert seg.find_batch(2).base_offset == 2  # type: ignore[union-attr]
    assert reads > 1
    assert segment_module.TAIL_BATCHES == TAIL_BATCHES


def test_the_trimmed_tail_covers_exactly_its_batches(tmp_path: Path) -> None:
    """Trimmed (at 2 x TAIL_BATCHES), the tail starts at the base offset of its first
    kept batch: an offset of the batch before it is found by the index, not by the tail."""
    seg = _segment(tmp_path)
    for n in [1, 3, 1, 2] * (TAIL_BATCHES // 2) + [1] * 9:
        _append(seg, n)
        _check_all(seg)
    assert TAIL_BATCHES <= len(seg._tail_last) < 2 * TAIL_BATCHES
