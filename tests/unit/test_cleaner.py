"""Log compaction (R-LOG-6): latest record per key, offsets kept, tombstones expire,
crash-safe file swaps, idempotent re-runs."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.batches import Record, make_batch

from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log import cleaner
from headrace.log.partition_log import PartitionLog
from headrace.log.segment import LogSegment
from headrace.protocol.records import decode_records, split_batches

T0 = 1_700_000_000_000
BIG = 10**9
DAY_MS = 86_400_000


def compact_config(**kw: object) -> LogConfig:
    defaults: dict[str, object] = {"segment_bytes": 1_000, "index_interval_bytes": 150,
                                   "cleanup_policy": "compact"}
    defaults.update(kw)
    return LogConfig(**defaults)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall_ms=T0)


@pytest.fixture
def plog(tmp_path: Path, clock: ManualClock) -> Iterator[PartitionLog]:
    log = PartitionLog.open(tmp_path / "t-0", compact_config(), clock)
    yield log
    log.close()


def append(log: PartitionLog, kvs: list[tuple[bytes | None, bytes | None]], ts: int = T0,
           **kw: object) -> int:
    records: list[Record] = [(k, v, ts + i, [("h", b"x")]) for i, (k, v) in enumerate(kvs)]
    res = log.append_as_leader(make_batch(records, **kw), leader_epoch=0)  # type: ignore[arg-type]
    log.high_watermark = log.log_end_offset
    return res.first_offset


def all_records(log: PartitionLog) -> list[tuple[int, int, bytes | None, bytes | None]]:
    data = log.read(log.log_start_offset, BIG, max_offset=log.log_end_offset,
                    min_one_batch=True)
    out = []
    for h in split_batches(data, BIG):
        for r in decode_records(data[h.position : h.position + h.size]):
            out.append((r.offset, r.timestamp, r.key, r.value))
    return out


def fill(log: PartitionLog, updates: int, keys: int, seed: int = 1) -> None:
    rnd = random.Random(seed)
    i = 0
    while i < updates:
        n = rnd.randint(1, 4)
        append(log, [(b"k%d" % rnd.randrange(keys), b"value-%06d" % (i + j)) for j in range(n)],
               ts=T0 + i)
        i += n


def check_compacted(before: list[tuple[int, int, bytes | None, bytes | None]],
                    after: list[tuple[int, int, bytes | None, bytes | None]],
                    cleaned_below: int) -> None:
    """Survivors are original records (same offset, timestamp, key, value); below
    ``cleaned_below`` only the latest per key; at and above it nothing is lost; the
    latest value of every key is present."""
    by_offset = {r[0]: r for r in before}
    latest = {r[2]: r[0] for r in before}
    offsets = [r[0] for r in after]
    assert offsets == sorted(set(offsets))
    for r in after:
        assert by_offset[r[0]] == r
        if r[0] < cleaned_below:
            assert latest[r[2]] == r[0]
    assert {r[0] for r in before if r[0] >= cleaned_below} <= set(offsets)
    assert set(latest.values()) <= set(offsets)


def test_latest_record_per_key_kept_with_original_offsets(plog: PartitionLog,
                                                          clock: ManualClock) -> None:
    fill(plog, 400, keys=7)
    before = all_records(plog)
    segments_before = len(plog.segments)
    end_before = plog.log_end_offset
    stats = plog.compact(clock.wall_ms())
    assert stats is not None and stats.groups_rewritten > 0 and stats.records_removed > 300
    after = all_records(plog)
    check_compacted(before, after, plog.active_segment.base_offset)
    assert plog.log_end_offset == end_before and plog.log_start_offset == 0
    assert len(plog.segments) < segments_before  # small cleaned segments were merged
    # a reopen sees the same log
    plog.close()
    reopened = PartitionLog.open(plog.dir, plog.config, clock)
    try:
        reopened.high_watermark = reopened.log_end_offset
        assert all_records(reopened) == after
    finally:
        reopened.close()


def test_reads_by_any_offset_work_across_gaps(plog: PartitionLog, clock: ManualClock) -> None:
    fill(plog, 300, keys=5)
    plog.compact(clock.wall_ms())
    survivors = [r[0] for r in all_records(plog)]
    for offset in range(plog.log_start_offset, plog.log_end_offset):
        data = plog.read(offset, 200, max_offset=plog.log_end_offset, min_one_batch=True)
        first = split_batches(data, BIG)[0]
        expected = next(o for o in survivors if o >= offset)
        got = [r.offset for r in decode_records(data[: first.size]) if r.offset >= offset]
        assert got[0] == expected


def test_keys_rewritten_in_the_active_segment_lose_older_copies(
    plog: PartitionLog, clock: ManualClock
) -> None:
    fill(plog, 200, keys=3)
    plog.roll()
    append(plog, [(b"k0", b"newest")])
    plog.compact(clock.wall_ms())
    closed = [r for r in all_records(plog) if r[0] < plog.active_segment.base_offset]
    assert closed and b"k0" not in {r[2] for r in closed}
    assert all_records(plog)[-1][2:] == (b"k0", b"newest")


def test_nothing_above_the_high_watermark_is_cleaned_or_decides(
    plog: PartitionLog, clock: ManualClock
) -> None:
    fill(plog, 200, keys=3)
    hw = plog.log_end_offset
    fill(plog, 200, keys=3, seed=2)
    plog.high_watermark = hw
    before = all_records(plog)
    plog.compact(clock.wall_ms())
    after = all_records(plog)
    check_compacted([r for r in before if r[0] < hw], [r for r in after if r[0] < hw],
                    max(s.base_offset for s in plog.segments if s.base_offset <= hw))
    assert [r for r in before if r[0] >= hw] == [r for r in after if r[0] >= hw]


def test_tombstones_dropped_after_delete_retention(tmp_path: Path, clock: ManualClock) -> None:
    log = PartitionLog.open(tmp_path / "t-0", compact_config(delete_retention_ms=DAY_MS), clock)
    try:
        append(log, [(b"gone", b"v1"), (b"kept", b"v1")])
        append(log, [(b"gone", None)], ts=T0 + 10)
        fill(log, 200, keys=3)
        stats = log.compact(clock.wall_ms())
        assert stats is not None and stats.next_tombstone_expiry_ms == T0 + 10 + DAY_MS
        assert [r[3] for r in all_records(log) if r[2] == b"gone"] == [None]
        clock.advance(DAY_MS)
        assert log.compact(clock.wall_ms()) is None  # nothing new, not yet expired
        clock.advance(11)
        stats = log.compact(clock.wall_ms())  # the expiry triggers a run
        assert stats is not None and stats.records_removed == 1
        keys = [r[2] for r in all_records(log)]
        assert b"gone" not in keys and b"kept" in keys
    finally:
        log.close()


def test_rerun_is_idempotent_and_skipped_when_nothing_changed(
    plog: PartitionLog, clock: ManualClock
) -> None:
    fill(plog, 300, keys=6)
    assert plog.compact(clock.wall_ms()) is not None
    files = {p.name: p.read_bytes() for p in plog.dir.iterdir()}
    assert plog.compact(clock.wall_ms()) is None
    stats = plog.compact(clock.wall_ms(), force=True)
    assert stats is not None and stats.groups_rewritten == 0
    assert {p.name: p.read_bytes() for p in plog.dir.iterdir()} == files


def test_only_compact_logs_are_compacted(tmp_path: Path, clock: ManualClock) -> None:
    log = PartitionLog.open(tmp_path / "t-0", compact_config(cleanup_policy="delete"), clock)
    try:
        fill(log, 200, keys=2)
        assert log.compact(clock.wall_ms(), force=True) is None
    finally:
        log.close()


def test_compressed_batches_keep_their_surviving_records(plog: PartitionLog,
                                                         clock: ManualClock) -> None:
    for i in range(40):
        append(plog, [(b"a", b"a%d" % i), (b"b%d" % i, b"b"), (b"c", b"c%d" % i)],
               ts=T0 + i, compression="gzip")
    before = all_records(plog)
    plog.compact(clock.wall_ms())
    check_compacted(before, all_records(plog), plog.active_segment.base_offset)


def test_producer_state_survives_when_a_producers_records_are_all_superseded(
    tmp_path: Path, clock: ManualClock
) -> None:
    log = PartitionLog.open(tmp_path / "t-0", compact_config(), clock)
    append(log, [(b"k", b"old1"), (b"k", b"old2")], producer_id=7, producer_epoch=0,
           base_sequence=0)
    fill(log, 200, keys=1)  # key k0 only; k is rewritten below
    append(log, [(b"k", b"new")])
    fill(log, 100, keys=1, seed=3)
    log.compact(clock.wall_ms())
    assert log.producer_state.producers[7].last_seq == 1
    log.close()
    reopened = PartitionLog.open(tmp_path / "t-0", compact_config(), clock)
    try:
        assert reopened.producer_state.producers[7].last_seq == 1
    finally:
        reopened.close()


# ---------------------------------------------------------------------- crash safety


class Crash(Exception):
    pass


def _expected_after_compaction(src: Path, dst: Path, clock: ManualClock
                               ) -> list[tuple[int, int, bytes | None, bytes | None]]:
    shutil.copytree(src, dst)
    log = PartitionLog.open(dst, compact_config(), clock)
    try:
        log.high_watermark = log.log_end_offset
        log.compact(clock.wall_ms())
        return all_records(log)
    finally:
        log.close()


def _reopen_records(directory: Path, clock: ManualClock
                    ) -> list[tuple[int, int, bytes | None, bytes | None]]:
    log = PartitionLog.open(directory, compact_config(), clock)
    try:
        log.high_watermark = log.log_end_offset
        return all_records(log)
    finally:
        log.close()


def _crash_on_replace(monkeypatch: pytest.MonkeyPatch, suffix: str) -> None:
    real = os.replace

    def replace(src: object, dst: object) -> None:
        if str(dst).endswith(suffix):
            raise Crash(str(dst))
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(cleaner.os, "replace", replace)


def _crash_on_second_delete(monkeypatch: pytest.MonkeyPatch) -> None:
    real = LogSegment.delete
    calls = 0

    def delete(self: LogSegment) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise Crash("mid-deletion")
        real(self)

    monkeypatch.setattr(LogSegment, "delete", delete)


@pytest.mark.parametrize("crash_point", ["before-swap", "after-swap", "mid-deletion"])
def test_a_crash_at_any_point_leaves_a_readable_log(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, crash_point: str
) -> None:
    directory = tmp_path / "t-0"
    log = PartitionLog.open(directory, compact_config(), clock)
    fill(log, 400, keys=5)
    log.flush()
    original = all_records(log)
    expected = _expected_after_compaction(directory, tmp_path / "copy", clock)
    if crash_point == "before-swap":
        _crash_on_replace(monkeypatch, cleaner.SWAP_SUFFIX)
    elif crash_point == "after-swap":
        _crash_on_replace(monkeypatch, ".log")
    else:
        _crash_on_second_delete(monkeypatch)
    with pytest.raises(Crash):
        log.compact(clock.wall_ms())
    monkeypatch.undo()
    leftovers = {p.suffix for p in directory.iterdir()}
    assert (cleaner.CLEANED_SUFFIX if crash_point == "before-swap"
            else cleaner.SWAP_SUFFIX) in leftovers
    # the "crashed" process's fds are abandoned; a new one opens the directory
    records = _reopen_records(directory, clock)
    assert not [p for p in directory.iterdir()
                if p.suffix in (cleaner.CLEANED_SUFFIX, cleaner.SWAP_SUFFIX)]
    if crash_point == "before-swap":
        assert records == original
    else:
        # the swapped group completed on open; groups not reached yet are uncleaned:
        # every record is an original one and nothing the full run keeps is missing
        by_offset = {r[0]: r for r in original}
        assert all(by_offset[r[0]] == r for r in records)
        assert {r[0] for r in expected} <= {r[0] for r in records}
    # and compaction afterwards converges to the same result as an uninterrupted run
    log2 = PartitionLog.open(directory, compact_config(), clock)
    try:
        log2.high_watermark = log2.log_end_offset
        log2.compact(clock.wall_ms(), force=True)
        assert all_records(log2) == expected
    finally:
        log2.close()


def test_leftover_cleaned_and_swap_files_from_other_runs(tmp_path: Path,
                                                         clock: ManualClock) -> None:
    directory = tmp_path / "t-0"
    log = PartitionLog.open(directory, compact_config(), clock)
    fill(log, 100, keys=3)
    original = all_records(log)
    log.close()
    (directory / f"{0:020d}.log.cleaned").write_bytes(b"garbage")
    assert _reopen_records(directory, clock) == original
    assert not (directory / f"{0:020d}.log.cleaned").exists()


BOMB = Path(__file__).parents[1] / "fuzz" / "corpus" / "batches" / (
    "invalid_record--zstd-bomb-1.5GiB.bin")


def _plant_bomb(log: PartitionLog, clock: ManualClock) -> tuple[PartitionLog, int]:
    """Write the 48 KB zstd batch that inflates to 1.5 GiB straight into the active
    segment's file (as a broker without record validation stored it) and reopen."""
    import struct

    bomb = bytearray(BOMB.read_bytes())
    offset = log.log_end_offset
    struct.pack_into(">q", bomb, 0, offset)
    path = log.active_segment.log_path
    log.close()
    with open(path, "ab") as f:
        f.write(bomb)
    reopened = PartitionLog.open(log.dir, log.config, clock)
    assert reopened.log_end_offset == offset + 1
    return reopened, offset


def test_cleaner_survives_a_compression_bomb_on_disk(tmp_path: Path, clock: ManualClock) -> None:
    """R-LOG-6, R-NF-1 (issue 8): a stored zstd bomb (1.5 GiB of zeros in 48 KB) does not
    make every cleaner pass fail with MemoryError: the batch is kept as it is, the others
    are compacted, memory stays bounded; a timestamp search over it answers at batch level."""
    import resource

    log = PartitionLog.open(tmp_path / "t-0", compact_config(), clock)
    fill(log, 100, keys=3)
    log, bomb_offset = _plant_bomb(log, clock)
    try:
        fill(log, 200, keys=3, seed=2)
        log.high_watermark = log.log_end_offset
        assert log.segments[0].base_offset <= bomb_offset < log.active_segment.base_offset
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        stats = log.compact(clock.wall_ms())
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        assert stats is not None and stats.unreadable_batches == 1
        assert stats.records_removed > 200
        assert grown_mb < 160, grown_mb  # the cap (64 MiB) and a copy, not 1.5 GiB
        # the bomb batch is still there, byte for byte, at its offset
        data = log.read(bomb_offset, BIG, max_offset=bomb_offset + 1, min_one_batch=True)
        h = split_batches(data, BIG)[0]
        assert (h.base_offset, h.compression, h.records_count) == (bomb_offset, 4, 1)
        # a second pass skips it again instead of dying
        assert log.compact(clock.wall_ms(), force=True) is not None
        # ListOffsets by timestamp over it does not die either (bounded memory)
        found = log.offset_for_timestamp(T0)
        assert found is not None and found[0] <= bomb_offset
    finally:
        log.close()


def test_an_aborted_transactional_record_never_hides_the_committed_value(
        tmp_path: Path, clock: ManualClock) -> None:
    """Issue 10: a transactional record is not the latest for its key (it may be aborted,
    and read_committed consumers skip it): compaction keeps the value before it, and keeps
    the transactional batch and its marker whole."""
    log = PartitionLog.open(tmp_path / "t-0", compact_config(), clock)
    try:
        append(log, [(b"k", b"committed")])
        append(log, [(b"k", b"aborted")], producer_id=7, producer_epoch=0, base_sequence=0,
               transactional=True)
        log.append_marker(7, 0, False, 0, 0)
        fill(log, 200, keys=3)  # other keys, enough to roll segments past the above
        log.high_watermark = log.log_end_offset
        log.compact(clock.wall_ms(), force=True)
        values = [v for _, _, k, v in all_records(log) if k == b"k"]
        assert values == [b"committed", b"aborted"]
        assert log.aborted_transactions(0, log.log_end_offset)[0].producer_id == 7
    finally:
        log.close()
