"""Producer-state snapshots and aborted-transaction indexes on disk (issue 10, item 2;
R-PROD-2, R-LOG-4): Kafka's file formats, and a partition log that reopens (cleanly or after
a crash) or truncates without reading every batch header, into the same state a full scan
of the log gives."""

from __future__ import annotations

import logging
import random
import struct
from pathlib import Path

import crc32c
import pytest
from kio.schema.errors import ErrorCode
from tests.batches import make_batch, simple_batch

from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log.partition_log import PartitionLog
from headrace.log.state_files import (
    CorruptStateFileError,
    SnapshotEntry,
    decode_aborted,
    decode_snapshot,
    encode_aborted,
    encode_snapshot,
    snapshot_offsets,
    snapshot_path,
    txn_index_path,
)
from headrace.log.transactions import AbortedTxn

T0 = 1_700_000_000_000


# ---------------------------------------------------------------------------- formats


def test_snapshot_bytes_are_kafkas_version_1_layout() -> None:
    """The entries of Kafka's ProducerStateManagerTest.testProducerSnapshotCompatibility,
    laid out field by field as Kafka's PID_SNAPSHOT_MAP_SCHEMA writes them."""
    entries = [SnapshotEntry(1, 2, 1, 2, 3, -1, 3, 100),
               SnapshotEntry(11, 12, -1, -1, 0, 123456, 13, -1)]
    body = struct.pack(">i", 2)
    for e in entries:
        body += struct.pack(">q", e.producer_id) + struct.pack(">h", e.epoch)
        body += struct.pack(">i", e.last_sequence) + struct.pack(">q", e.last_offset)
        body += struct.pack(">i", e.offset_delta) + struct.pack(">q", e.timestamp)
        body += struct.pack(">i", e.coordinator_epoch) + struct.pack(">q",
                                                                    e.current_txn_first_offset)
    expected = struct.pack(">h", 1) + struct.pack(">I", crc32c.crc32c(body)) + body
    assert encode_snapshot(entries) == expected
    assert decode_snapshot(expected) == entries


@pytest.mark.parametrize("damage", ["crc", "version", "short", "count"])
def test_a_damaged_snapshot_is_refused(damage: str) -> None:
    data = bytearray(encode_snapshot([SnapshotEntry(5, 0, 9, 40, 2, T0, -1, -1)]))
    if damage == "crc":
        data[-1] ^= 1
    elif damage == "version":
        data[1] = 2
    elif damage == "short":
        del data[-3:]
    else:
        data[6:10] = struct.pack(">i", 7)
        data[2:6] = struct.pack(">I", crc32c.crc32c(bytes(data[6:])))
    with pytest.raises(CorruptStateFileError):
        decode_snapshot(bytes(data))


def test_txnindex_entries_are_34_bytes_and_a_torn_tail_is_dropped() -> None:
    txns = [AbortedTxn(7, 2, 9, 10), AbortedTxn(8, 11, 15, 12)]
    data = encode_aborted(txns)
    assert len(data) == 68
    assert data[:34] == struct.pack(">hqqqq", 0, 7, 2, 9, 10)
    assert decode_aborted(data) == txns
    assert decode_aborted(data + data[:20]) == txns  # a crash mid-append
    with pytest.raises(CorruptStateFileError):
        decode_aborted(data[34:] + data[:34])  # markers must increase
    with pytest.raises(CorruptStateFileError):
        decode_aborted(b"\x00\x01" + data[2:34])  # unknown version


# ---------------------------------------------------------------------------- the log


def config() -> LogConfig:
    return LogConfig(segment_bytes=1_500, index_interval_bytes=200)


def open_log(path: Path) -> PartitionLog:
    return PartitionLog.open(path, config(), ManualClock(wall_ms=T0))


def state(log: PartitionLog) -> dict[str, object]:
    """What a snapshot must preserve: per producer its epoch, last timestamp and last
    batch's sequences and offsets (a snapshot stores one timestamp per producer); the open
    transactions; the aborted transactions; the leader epochs."""
    producers = {pid: (e.epoch, e.last_ms, _last_batch(e.batches))
                 for pid, e in log.producer_state.producers.items()}
    return {"producers": producers, "ongoing": dict(log.txns.ongoing),
            "aborted": list(log.txns.aborted), "epochs": list(log.leader_epochs),
            "end": log.log_end_offset}


def _last_batch(batches: object) -> tuple[int, int, int, int] | None:
    b = list(batches)[-1] if batches else None  # type: ignore[call-overload]
    return None if b is None else (b.first_seq, b.last_seq, b.first_offset, b.last_offset)


def fill(log: PartitionLog, rounds: int, seed: int = 1) -> None:
    """Idempotent and transactional producers, commits and aborts, a new leader epoch now
    and then, over many segment rolls; producer 3's transaction is left open."""
    rng = random.Random(seed)
    seqs: dict[int, int] = {}
    epoch = 0
    for r in range(rounds):
        if r % 17 == 16:
            epoch += 1
        pid = rng.choice([1, 2, 3, 4])
        n = rng.randint(1, 4)
        txn = pid in (2, 3)
        seq = seqs.get(pid, 0)
        log.append_as_leader(simple_batch(n, ts=T0 + r, producer_id=pid, producer_epoch=0,
                                          base_sequence=seq, transactional=txn), epoch)
        seqs[pid] = seq + n
        if pid == 2 and rng.random() < 0.5:
            log.append_marker(2, 0, rng.random() < 0.5, 0, epoch)
        log.high_watermark = log.log_end_offset
    log.append_as_leader(simple_batch(2, ts=T0, producer_id=3, producer_epoch=0,
                                      base_sequence=seqs.get(3, 0), transactional=True), epoch)
    log.high_watermark = log.log_end_offset


def full_scan_state(directory: Path) -> dict[str, object]:
    """The state a log rebuilds with no snapshot at all (the reference)."""
    for off in snapshot_offsets(directory):
        snapshot_path(directory, off).unlink()
    log = open_log(directory)
    try:
        return state(log)
    finally:
        log.close()


def test_reopen_after_close_reads_no_batch_header_and_rebuilds_the_same_state(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "t-0")
    fill(log, 400)
    assert len(log.segments) > 10 and log.txns.aborted and 3 in log.txns.ongoing
    before = state(log)
    log.close()
    assert snapshot_offsets(tmp_path / "t-0")[-1] == before["end"]
    again = open_log(tmp_path / "t-0")
    assert again.scanned_batches == 0
    assert state(again) == before
    again.close()
    # and a log without any snapshot (a full scan of every header) agrees
    assert full_scan_state(tmp_path / "t-0") == before


def test_reopen_after_a_crash_scans_only_the_active_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    fill(log, 400, seed=2)
    before = state(log)
    active = log.active_segment
    in_active = sum(1 for _ in active.headers(0))
    # a kill -9: no close, so the newest snapshot is the one the last roll wrote
    assert snapshot_offsets(tmp_path / "t-0")[-1] == active.base_offset
    again = open_log(tmp_path / "t-0")
    assert again.scanned_batches == in_active < 400 // 5
    assert state(again) == before
    again.close()


def test_txnindex_files_hold_each_segments_aborted_transactions(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory)
    fill(log, 300, seed=3)
    for seg, nxt in zip(log.segments, [*log.segments[1:], None], strict=True):
        end = nxt.base_offset if nxt is not None else log.log_end_offset
        mine = [a for a in log.txns.aborted if seg.base_offset <= a.last_offset < end]
        path = txn_index_path(directory, seg.base_offset)
        assert (decode_aborted(path.read_bytes()) if path.exists() else []) == mine
    assert any(txn_index_path(directory, s.base_offset).exists() for s in log.segments)
    log.close()


def test_truncation_reloads_from_the_newest_snapshot_below_the_cut(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory)
    fill(log, 400, seed=4)
    cut_segment = log.segments[len(log.segments) // 2]
    cut = cut_segment.base_offset + 1
    log.truncate_to(cut)
    assert all(off <= log.log_end_offset for off in snapshot_offsets(directory))
    assert log.scanned_batches <= sum(1 for _ in log.active_segment.headers(0))
    after = state(log)
    log.close()
    assert full_scan_state(directory) == after


def test_a_corrupt_snapshot_falls_back_to_an_older_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory)
    fill(log, 300, seed=5)
    before = state(log)
    newest = snapshot_offsets(directory)[-1]
    snapshot_path(directory, newest).write_bytes(b"\x00\x01garbage")
    with caplog.at_level(logging.WARNING, logger="headrace.log"):
        again = open_log(directory)
    assert "ignoring producer snapshot" in caplog.text
    assert newest not in snapshot_offsets(directory)
    assert again.scanned_batches > sum(1 for _ in again.active_segment.headers(0))
    assert state(again) == before
    again.close()


def test_a_damaged_txnindex_below_the_snapshot_is_rebuilt_from_the_log(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory)
    fill(log, 300, seed=6)
    before = state(log)
    victim = next(s for s in log.segments[:-1] if txn_index_path(directory,
                                                                 s.base_offset).exists())
    good = txn_index_path(directory, victim.base_offset).read_bytes()
    txn_index_path(directory, victim.base_offset).write_bytes(b"\x00\x07" + good[2:])
    again = open_log(directory)
    assert state(again) == before
    assert txn_index_path(directory, victim.base_offset).read_bytes() == good
    again.close()


def test_retention_removes_txnindexes_and_old_snapshots_with_their_segments(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    log = PartitionLog.open(directory, LogConfig(segment_bytes=1_500, retention_bytes=4_000),
                            ManualClock(wall_ms=T0))
    fill(log, 300, seed=7)
    assert log.delete_old_segments() > 0
    first = log.segments[0].base_offset
    bases = {s.base_offset for s in log.segments}
    assert all(int(p.stem) in bases for p in directory.glob("*.txnindex"))
    assert [o for o in snapshot_offsets(directory) if o < first] == []
    before = state(log)
    log.close()
    again = PartitionLog.open(directory, LogConfig(segment_bytes=1_500, retention_bytes=4_000),
                              ManualClock(wall_ms=T0))
    after = state(again)
    # producers of deleted segments survive in the snapshot (Kafka's behaviour); the
    # aborted transactions and epochs below the log start are gone alike
    assert after == before
    again.close()


def test_a_retried_last_batch_is_still_a_duplicate_after_a_restart(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory)
    for i in range(60):  # several rolls, one producer
        log.append_as_leader(simple_batch(3, ts=T0, producer_id=9, producer_epoch=1,
                                          base_sequence=3 * i), 0)
    last = simple_batch(3, ts=T0, producer_id=9, producer_epoch=1, base_sequence=180)
    first = log.append_as_leader(last, 0)
    log.close()
    again = open_log(directory)
    assert again.scanned_batches == 0
    retry = again.append_as_leader(last, 0)
    assert (retry.first_offset, retry.last_offset) == (first.first_offset, first.last_offset)
    assert again.log_end_offset == first.last_offset + 1
    # and a gap is still refused
    with pytest.raises(Exception) as info:
        again.append_as_leader(simple_batch(1, ts=T0, producer_id=9, producer_epoch=1,
                                            base_sequence=200), 0)
    assert getattr(info.value, "error_code", None) == ErrorCode.out_of_order_sequence_number
    again.close()


def test_compaction_merging_segments_keeps_their_aborted_transactions(tmp_path: Path) -> None:
    """Cleaned groups of segments become one segment: its .txnindex holds the group's
    aborted transactions (written before the swap), and a reopen agrees."""
    directory = tmp_path / "t-0"
    cfg = LogConfig(segment_bytes=1_000, index_interval_bytes=150, cleanup_policy="compact")
    log = PartitionLog.open(directory, cfg, ManualClock(wall_ms=T0))
    seq = 0
    for r in range(120):
        log.append_as_leader(make_batch([(b"k%d" % (r % 3), b"v" * 30, T0 + r, [])]), 0)
        if r % 10 == 0:
            log.append_as_leader(make_batch([(b"t", b"x", T0, [])], producer_id=5,
                                            producer_epoch=0, base_sequence=seq,
                                            transactional=True), 0)
            seq += 1
            log.append_marker(5, 0, r % 20 == 0, 0, 0)
        log.high_watermark = log.log_end_offset
    segments_before = len(log.segments)
    aborted = list(log.txns.aborted)
    assert len(aborted) == 6
    stats = log.compact(T0, force=True)
    assert stats is not None and len(log.segments) < segments_before
    for seg, nxt in zip(log.segments, [*log.segments[1:], None], strict=True):
        end = nxt.base_offset if nxt is not None else log.log_end_offset
        mine = [a for a in aborted if seg.base_offset <= a.last_offset < end]
        path = txn_index_path(directory, seg.base_offset)
        assert (decode_aborted(path.read_bytes()) if path.exists() else []) == mine
    before = state(log)
    log.close()
    again = PartitionLog.open(directory, cfg, ManualClock(wall_ms=T0))
    assert state(again) == before and again.txns.aborted == aborted
    again.close()
