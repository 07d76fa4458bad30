"""DeleteRecords' storage side: ``PartitionLog.increment_log_start_offset`` and the
``log-start-offset`` file (Kafka's ``maybeIncrementLogStartOffset`` and
``log-start-offset-checkpoint``), and ``ReplicaManager.delete_records``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from tests.batches import simple_batch

from headrace.broker.replica_manager import Partition, ReplicaManager, TopicPartition
from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log.errors import LogError
from headrace.log.partition_log import LOG_START_OFFSET_FILE, PartitionLog
from headrace.metadata.store import PartitionState
from headrace.protocol.records import split_batches

T0 = 1_700_000_000_000
BIG = 10**9


def cfg(**kw: object) -> LogConfig:
    base: dict[str, object] = {"segment_bytes": 1_000, "index_interval_bytes": 200}
    base.update(kw)
    return LogConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall_ms=T0)


def filled(path: Path, clock: ManualClock, batches: int = 30, epoch: int = 0,
           **kw: object) -> PartitionLog:
    log = PartitionLog.open(path, cfg(**kw), clock)
    for _ in range(batches):
        log.append_as_leader(simple_batch(2, value_size=60), leader_epoch=epoch)
    log.high_watermark = log.log_end_offset
    return log


def error_of(fn: object, *args: object) -> ErrorCode:
    with pytest.raises(LogError) as e:
        fn(*args)  # type: ignore[operator]
    return e.value.error_code


def first_offset_read(log: PartitionLog, offset: int) -> int:
    data = log.read(offset, BIG, max_offset=log.log_end_offset, min_one_batch=True)
    return split_batches(data, BIG)[0].base_offset


def test_increment_moves_the_start_deletes_segments_and_survives_reopen(
        tmp_path: Path, clock: ManualClock) -> None:
    log = filled(tmp_path / "t-0", clock)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 4
    cut = bases[2] + 3  # inside the third segment, inside a batch
    assert log.increment_log_start_offset(cut) is True
    assert log.log_start_offset == cut
    assert [s.base_offset for s in log.segments] == bases[2:]
    with pytest.raises(LogError) as e:
        log.read(cut - 1, BIG, max_offset=log.log_end_offset, min_one_batch=True)
    assert e.value.error_code == ErrorCode.offset_out_of_range
    # a read at the start returns the whole batch holding it (Kafka does the same)
    assert first_offset_read(log, cut) == cut - 1
    # not backwards, not past the high watermark
    assert log.increment_log_start_offset(cut - 2) is False
    assert log.log_start_offset == cut
    log.high_watermark = log.log_end_offset - 5
    assert error_of(log.increment_log_start_offset, log.log_end_offset - 4) == (
        ErrorCode.offset_out_of_range)
    assert log.log_start_offset == cut
    end = log.log_end_offset
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", cfg(), clock)
    assert (log.log_start_offset, log.log_end_offset) == (cut, end)
    assert [s.base_offset for s in log.segments] == bases[2:]
    log.close()


def test_open_deletes_segments_below_a_stored_start(tmp_path: Path, clock: ManualClock) -> None:
    """A crash between storing the start and deleting the segments: open finishes it."""
    log = filled(tmp_path / "t-0", clock)
    bases = [s.base_offset for s in log.segments]
    log.close()
    (tmp_path / "t-0" / LOG_START_OFFSET_FILE).write_text(f"0\n{bases[3]}\n")
    log = PartitionLog.open(tmp_path / "t-0", cfg(), clock)
    assert log.log_start_offset == bases[3]
    assert [s.base_offset for s in log.segments] == bases[3:]
    log.close()


def test_stored_start_past_the_recovered_end_empties_the_log(
        tmp_path: Path, clock: ManualClock) -> None:
    """Kafka's deleteSegmentsIfLogStartGreaterThanLogEnd: the log restarts at the stored
    start and appends go on from there."""
    log = filled(tmp_path / "t-0", clock, batches=5)
    log.close()
    (tmp_path / "t-0" / LOG_START_OFFSET_FILE).write_text("0\n25\n")
    log = PartitionLog.open(tmp_path / "t-0", cfg(), clock)
    assert (log.log_start_offset, log.log_end_offset) == (25, 25)
    res = log.append_as_leader(simple_batch(2), leader_epoch=0)
    assert res.first_offset == 25
    log.close()


@pytest.mark.parametrize("text", ["", "0\n", "0\nabc\n", "7\n12\n", "0\n-4\n", "\xff"])
def test_a_malformed_start_file_is_ignored(tmp_path: Path, clock: ManualClock,
                                           text: str) -> None:
    log = filled(tmp_path / "t-0", clock, batches=5)
    log.close()
    (tmp_path / "t-0" / LOG_START_OFFSET_FILE).write_text(text)
    log = PartitionLog.open(tmp_path / "t-0", cfg(), clock)
    assert (log.log_start_offset, log.log_end_offset) == (0, 10)
    log.close()


def test_truncation_below_the_start_forgets_it(tmp_path: Path, clock: ManualClock) -> None:
    """A follower truncated (or restarted) at or below its old start must not come back at
    the old start after a reopen."""
    log = filled(tmp_path / "t-0", clock)
    assert log.increment_log_start_offset(20)
    log.truncate_to(10)
    assert (log.log_start_offset, log.log_end_offset) == (10, 10)
    assert not (tmp_path / "t-0" / LOG_START_OFFSET_FILE).exists()
    for _ in range(3):
        log.append_as_leader(simple_batch(2), leader_epoch=0)
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", cfg(), clock)
    assert (log.log_start_offset, log.log_end_offset) == (10, 16)
    log.high_watermark = log.log_end_offset
    assert log.increment_log_start_offset(12)
    log.truncate_fully_and_start_at(5)
    assert not (tmp_path / "t-0" / LOG_START_OFFSET_FILE).exists()
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", cfg(), clock)
    assert (log.log_start_offset, log.log_end_offset) == (5, 5)
    log.close()


def test_retention_keeps_a_start_inside_a_segment(tmp_path: Path, clock: ManualClock) -> None:
    """Retention deleting older segments never moves the start backwards to a segment
    base below it."""
    log = filled(tmp_path / "t-0", clock, retention_bytes=2_500)
    bases = [s.base_offset for s in log.segments]
    cut = bases[1] + 1
    assert log.increment_log_start_offset(cut)
    log.delete_old_segments()
    assert log.log_start_offset == max(cut, log.segments[0].base_offset)
    assert log.log_start_offset >= cut
    log.close()


def test_leader_epochs_are_cut_at_the_start(tmp_path: Path, clock: ManualClock) -> None:
    log = PartitionLog.open(tmp_path / "t-0", cfg(), clock)
    for epoch in (0, 0, 3, 3, 6):
        for _ in range(4):
            log.append_as_leader(simple_batch(2, value_size=60), leader_epoch=epoch)
    log.high_watermark = log.log_end_offset
    assert log.leader_epochs == [(0, 0), (3, 16), (6, 32)]
    assert log.increment_log_start_offset(20)
    assert log.leader_epochs == [(3, 20), (6, 32)]
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", cfg(), clock)
    assert log.leader_epochs == [(3, 20), (6, 32)]
    assert log.end_offset_for_epoch(3) == (3, 32)
    log.close()


def test_producer_state_stays(tmp_path: Path, clock: ManualClock) -> None:
    """Kafka keeps producer state when the start moves (only expiry removes it)."""
    log = PartitionLog.open(tmp_path / "t-0", cfg(), clock)
    for seq in range(0, 20, 2):
        log.append_as_leader(simple_batch(2, producer_id=9, producer_epoch=1,
                                          base_sequence=seq), leader_epoch=0)
    log.high_watermark = log.log_end_offset
    assert log.increment_log_start_offset(log.log_end_offset)
    entry = log.producer_state.producers[9]
    assert (entry.epoch, entry.last_seq) == (1, 19)
    log.close()


# ---------------------------------------------------------------------- replica manager


def test_replica_manager_delete_records(tmp_path: Path, clock: ManualClock) -> None:
    """Leader only; -1 is the high watermark; a compact-only log is POLICY_VIOLATION;
    negative offsets OFFSET_OUT_OF_RANGE; the low watermark is the new start; the stored
    start is fsynced by ``sync_log_starts``."""
    rm = ReplicaManager.__new__(ReplicaManager)
    rm.node_id = 1
    rm.partitions = {}
    tp, ctp = TopicPartition("t", 0), TopicPartition("c", 0)
    log = filled(tmp_path / "t-0", clock, batches=10)
    clog = filled(tmp_path / "c-0", clock, batches=0, cleanup_policy="compact")
    rm.partitions[tp] = Partition(tp, log, PartitionState(replicas=[1, 2], leader=1))
    rm.partitions[ctp] = Partition(ctp, clog, PartitionState(replicas=[1], leader=1))
    assert rm.delete_records(tp, 4) == 4
    assert rm.delete_records(tp, 2) == 4
    log.high_watermark = 15
    assert rm.delete_records(tp, ReplicaManager.HIGH_WATERMARK) == 15
    assert error_of(rm.delete_records, tp, -5) == ErrorCode.offset_out_of_range
    assert error_of(rm.delete_records, tp, 16) == ErrorCode.offset_out_of_range
    assert error_of(rm.delete_records, ctp, 1) == ErrorCode.policy_violation
    assert error_of(rm.delete_records, TopicPartition("t", 1), 1) == (
        ErrorCode.not_leader_or_follower)
    rm.partitions[tp].leading = False
    assert error_of(rm.delete_records, tp, 15) == ErrorCode.not_leader_or_follower
    rm.partitions[tp].leading = True
    rm.partitions[tp].state = PartitionState(replicas=[1, 2], leader=2)
    assert error_of(rm.delete_records, tp, 15) == ErrorCode.not_leader_or_follower
    assert asyncio.run(rm.sync_log_starts([tp, TopicPartition("gone", 0)])) == set()
    assert (tmp_path / "t-0" / LOG_START_OFFSET_FILE).read_text() == "0\n15\n"
    log.close()
    clog.close()
