"""The log side of replication (R-REP-3, R-REP-7, R-PROD-2): follower appends byte for
byte, leader-epoch lookups (KIP-101 / KIP-279), truncation, offset checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.batches import make_batch

from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log.checkpoints import read_offset_checkpoint, write_offset_checkpoint
from headrace.log.partition_log import PartitionLog
from headrace.protocol.records import InvalidRecordError
from headrace.replication.epochs import Truncation, truncation
from headrace.replication.leader import FollowerFetchCheck, check_follower_fetch

T0 = 1_700_000_000_000


def open_log(path: Path) -> PartitionLog:
    return PartitionLog.open(path, LogConfig(), ManualClock(wall_ms=T0))


def batch(tag: str, n: int = 3, pid: int = -1, seq: int = -1) -> bytes:
    return make_batch([(None, f"{tag}-{i}".encode(), T0 + i, []) for i in range(n)],
                      producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                      base_sequence=seq)


def log_bytes(plog: PartitionLog) -> bytes:
    plog.flush()
    return b"".join(p.read_bytes() for p in sorted(plog.dir.glob("*.log")))


def everything(plog: PartitionLog) -> bytes:
    return plog.read(plog.log_start_offset, 1 << 30, max_offset=plog.log_end_offset,
                     min_one_batch=True)


def test_follower_log_is_byte_identical_to_the_leaders(tmp_path: Path) -> None:
    """R-REP-3: what the leader stored (offsets, leader epochs) is appended as is."""
    leader, follower = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    for epoch, tag in [(0, "a"), (0, "b"), (3, "c"), (5, "d")]:
        leader.append_as_leader(batch(tag), epoch)
    data = everything(leader)
    # delivered in two fetches, the first cut mid-batch (the leader's byte limit)
    cut = len(data) // 2 + 7
    first = follower.append_as_follower(data[:cut])
    assert first is not None and first.first_offset == 0
    follower.append_as_follower(data[_position_of(data, follower.log_end_offset):])
    assert follower.log_end_offset == leader.log_end_offset == 12
    assert log_bytes(follower) == log_bytes(leader)
    assert follower.leader_epochs == leader.leader_epochs == [(0, 0), (3, 6), (5, 9)]
    # a retried fetch of what it has already appends nothing
    assert follower.append_as_follower(data) is None


def _position_of(data: bytes, offset: int) -> int:
    from headrace.protocol.records import iter_batches

    for h in iter_batches(data):
        if h.base_offset >= offset:
            return h.position
    return len(data)


def test_corrupt_batch_appends_nothing(tmp_path: Path) -> None:
    leader, follower = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    leader.append_as_leader(batch("a"), 0)
    leader.append_as_leader(batch("b"), 0)
    data = bytearray(everything(leader))
    data[-1] ^= 0xFF  # the second batch's CRC no longer matches
    with pytest.raises(InvalidRecordError):
        follower.append_as_follower(bytes(data))
    assert follower.log_end_offset == 0


def test_follower_deduplicates_as_the_leader_would(tmp_path: Path) -> None:
    """R-PROD-2: the producer state comes with the replicated batches, so a producer's
    retry to the new leader is answered with the original offsets."""
    leader, follower = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    leader.append_as_leader(batch("x", pid=7, seq=0), 0)
    leader.append_as_leader(batch("y", pid=7, seq=3), 0)
    follower.append_as_follower(everything(leader))
    follower.assign_epoch(1, follower.log_end_offset)  # it becomes leader
    retry = follower.append_as_leader(batch("y", pid=7, seq=3), 1)
    assert (retry.first_offset, retry.last_offset) == (3, 5)
    assert follower.log_end_offset == 6


@pytest.mark.parametrize(("requested", "expected"), [
    (-1, (-1, -1)),        # undefined
    (0, (0, 0)),           # below the first epoch: the first epoch's start (Kafka)
    (1, (1, 4)),
    (2, (1, 4)),           # not an epoch of this log: the largest below, ending at 4
    (3, (3, 7)),
    (4, (4, 10)),          # the latest: the log end offset
    (9, (-1, -1)),         # above every epoch
])
def test_end_offset_for_epoch(tmp_path: Path, requested: int,
                              expected: tuple[int, int]) -> None:
    """Kafka's LeaderEpochFileCache.endOffsetFor."""
    plog = open_log(tmp_path / "t-0")
    plog.append_as_leader(make_batch([(None, b"v", T0, [])] * 4), 1)
    plog.append_as_leader(make_batch([(None, b"v", T0, [])] * 3), 3)
    plog.append_as_leader(make_batch([(None, b"v", T0, [])] * 3), 4)
    assert plog.leader_epochs == [(1, 0), (3, 4), (4, 7)]
    assert plog.end_offset_for_epoch(requested) == expected


def test_diverged_follower_truncates_and_converges(tmp_path: Path) -> None:
    """KIP-101 / KIP-320 with the real rules: the old leader appended at epoch 0 what no
    follower got; the new leader (epoch 1) appended other records at the same offsets. The
    old leader's fetch with its last epoch is answered a diverging epoch
    (``check_follower_fetch``), it truncates where ``truncation`` says, re-fetches, and the
    logs are identical."""
    old, new = open_log(tmp_path / "o" / "t-0"), open_log(tmp_path / "n" / "t-0")
    old.append_as_leader(batch("a"), 0)
    new.append_as_follower(everything(old))
    old.append_as_leader(batch("lost"), 0)  # never replicated
    new.assign_epoch(1, new.log_end_offset)
    new.append_as_leader(batch("b"), 1)
    check = check_follower_fetch(new.leader_epochs, new.log_start_offset,
                                 new.log_end_offset, old.latest_epoch() or 0,
                                 old.log_end_offset)
    assert check.check is FollowerFetchCheck.DIVERGING and check.diverging == (0, 3)
    t = truncation(old.leader_epochs, old.log_end_offset, old.high_watermark,
                   *check.diverging)
    assert t == Truncation(3, True)
    old.truncate_to(t.offset)
    again = check_follower_fetch(new.leader_epochs, new.log_start_offset,
                                 new.log_end_offset, old.latest_epoch() or 0,
                                 old.log_end_offset)
    assert again.check is FollowerFetchCheck.READ
    old.append_as_follower(everything(new)[_position_of(everything(new), 3):])
    assert log_bytes(old) == log_bytes(new)
    assert old.leader_epochs == new.leader_epochs == [(0, 0), (1, 3)]


def test_truncating_at_the_log_end_drops_an_epoch_never_written_in(tmp_path: Path) -> None:
    """Kafka's truncateTo: a leader that assigned epoch 2 at its log end and appended
    nothing before another broker was elected (epoch 3) must not keep claiming epoch 2, or
    its fetches would diverge forever."""
    old, new = open_log(tmp_path / "o" / "t-0"), open_log(tmp_path / "n" / "t-0")
    old.append_as_leader(batch("a"), 1)
    new.append_as_follower(everything(old))
    old.assign_epoch(2, old.log_end_offset)  # led at epoch 2, wrote nothing
    new.assign_epoch(3, new.log_end_offset)
    new.append_as_leader(batch("b"), 3)
    check = check_follower_fetch(new.leader_epochs, 0, new.log_end_offset, 2, 3)
    assert check.diverging == (1, 3)
    t = truncation(old.leader_epochs, old.log_end_offset, 0, *check.diverging)
    assert t == Truncation(3, True)
    old.truncate_to(t.offset)
    assert old.leader_epochs == [(1, 0)]
    assert open_log(tmp_path / "o" / "t-0").leader_epochs == [(1, 0)]  # checkpointed
    assert check_follower_fetch(new.leader_epochs, 0, new.log_end_offset, 1,
                                3).check is FollowerFetchCheck.READ


def test_truncate_fully_and_start_at(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0")
    plog.append_as_leader(batch("a"), 0)
    plog.truncate_fully_and_start_at(100)
    assert (plog.log_start_offset, plog.log_end_offset) == (100, 100)
    reopened = open_log(tmp_path / "t-0")
    assert reopened.log_end_offset == 100


def test_offset_checkpoint_round_trip_and_malformed(tmp_path: Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    entries = {("a.b-c_d", 0): 5, ("t", 12): 0, ("t", 3): 99}
    write_offset_checkpoint(path, entries)
    assert path.read_text().splitlines()[:2] == ["0", "3"]
    assert read_offset_checkpoint(path) == entries
    assert read_offset_checkpoint(tmp_path / "missing") == {}
    path.write_text("0\n2\nt 1 5\n")  # fewer lines than announced
    assert read_offset_checkpoint(path) == {}
    path.write_bytes(b"\xff\xfe")
    assert read_offset_checkpoint(path) == {}
