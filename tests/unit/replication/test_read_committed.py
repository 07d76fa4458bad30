"""read_committed never returns an aborted record (R-TXN, issue 21's fourth one-line
change): the aborted transactions a fetch must name are found by their *last* offset (the
abort marker), so a fetch that starts inside an aborted transaction still names it."""

from __future__ import annotations

from pathlib import Path

from tests.batches import make_batch

from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log.partition_log import PartitionLog

T0 = 1_700_000_000_000
PID = 42


def _txn_batch(seq: int, n: int) -> bytes:
    return make_batch([(None, f"v{seq + i}".encode(), T0, []) for i in range(n)],
                      producer_id=PID, producer_epoch=0, base_sequence=seq,
                      transactional=True)


def _log(tmp_path: Path) -> PartitionLog:
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig(), ManualClock(wall_ms=T0))
    plog.append_as_leader(make_batch([(None, b"before", T0, [])]), 0)  # offset 0
    plog.append_as_leader(_txn_batch(0, 3), 0)                          # offsets 1-3
    plog.append_as_leader(_txn_batch(3, 3), 0)                          # offsets 4-6
    plog.append_marker(PID, 0, False, 0, 0)                             # abort at 7
    plog.append_as_leader(make_batch([(None, b"after", T0, [])]), 0)    # offset 8
    plog.high_watermark = plog.log_end_offset
    return plog


def test_fetch_starting_inside_an_aborted_transaction_names_it(tmp_path: Path) -> None:
    plog = _log(tmp_path)
    assert plog.last_stable_offset == 9
    for start in (0, 1, 4, 5, 7):
        aborted = plog.aborted_transactions(start, plog.last_stable_offset)
        assert [(a.producer_id, a.first_offset) for a in aborted] == [(PID, 1)], start


def test_fetch_after_the_abort_marker_names_nothing(tmp_path: Path) -> None:
    plog = _log(tmp_path)
    assert plog.aborted_transactions(8, plog.last_stable_offset) == []


def test_fetch_ending_before_the_transaction_names_nothing(tmp_path: Path) -> None:
    plog = _log(tmp_path)
    assert plog.aborted_transactions(0, 1) == []
