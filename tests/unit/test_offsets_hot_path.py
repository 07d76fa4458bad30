"""Cheap paths for __consumer_offsets: fresh partitions, the broker's own batches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log import cleaner
from headrace.log.errors import LogError
from headrace.log.partition_log import PartitionLog
from headrace.protocol.records import (
    InvalidRecordError,
    build_batch,
    decode_records,
    split_batches,
)

T0 = 1_700_000_000_000


def _counting_fsync(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


def test_new_partition_is_created_without_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = _counting_fsync(monkeypatch)
    clock = ManualClock(wall_ms=T0)
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), clock)
    assert not fsyncs
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    names = sorted(p.name for p in (tmp_path / "t-0").iterdir())
    empty = PartitionLog.open(tmp_path / "empty-0", LogConfig(), clock)
    empty.close()  # reopened without a checkpoint: no epochs, nothing to scan
    reopened = PartitionLog.open(tmp_path / "empty-0", LogConfig(), clock)
    assert (reopened.log_end_offset, reopened.leader_epochs) == (0, [])
    reopened.close()
    # no leader-epoch checkpoint yet: the first epoch writes it (one file fewer per new
    # partition; a missing checkpoint of an empty log means no epochs)
    assert names == ["00000000000000000000.index", "00000000000000000000.log",
                     "00000000000000000000.timeindex"]
    log.append_own_batch(build_batch([(b"k", b"v")], T0), leader_epoch=0)
    assert (tmp_path / "t-0" / "leader-epoch-checkpoint").read_text() == "0\n1\n0 0\n"
    log.close()
    # an existing directory goes through recovery as before
    again = PartitionLog.open(tmp_path / "t-0", LogConfig(), clock)
    assert again.log_end_offset == 1 and again.leader_epochs == [(0, 0)]
    again.close()


def test_complete_swaps_fsyncs_only_when_it_changed_something(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = _counting_fsync(monkeypatch)
    cleaner.complete_swaps(tmp_path)
    assert not fsyncs
    (tmp_path / "00000000000000000000.log.cleaned").write_bytes(b"x")
    cleaner.complete_swaps(tmp_path)
    assert fsyncs and not list(tmp_path.iterdir())


def test_append_own_batch_stores_what_append_as_leader_would(tmp_path: Path) -> None:
    clock = ManualClock(wall_ms=T0)
    a = PartitionLog.open(tmp_path / "a-0", LogConfig(), clock)
    b = PartitionLog.open(tmp_path / "b-0", LogConfig(), clock)
    for i in range(3):
        batch = build_batch([(b"k%d" % i, b"v"), (b"x", None)], T0 + i)
        ra = a.append_as_leader(batch, leader_epoch=2)
        rb = b.append_own_batch(batch, leader_epoch=2)
        assert ra == rb
    for log in (a, b):
        log.high_watermark = log.log_end_offset
    data_a = a.read(0, 1 << 20, max_offset=6, min_one_batch=True)
    data_b = b.read(0, 1 << 20, max_offset=6, min_one_batch=True)
    assert data_a == data_b
    headers = split_batches(data_b, 1 << 20)  # CRCs valid
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [
        (0, 2), (2, 2), (4, 2)]
    assert [r.key for r in decode_records(data_b[: headers[0].size])] == [b"k0", b"x"]
    assert b.leader_epochs == [(2, 0)]
    a.close()
    b.close()


def test_append_own_batch_checks_size_and_falls_back_for_foreign_batches(
    tmp_path: Path,
) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(max_message_bytes=200),
                            ManualClock(wall_ms=T0))
    with pytest.raises(InvalidRecordError) as e:
        log.append_own_batch(build_batch([(b"k", b"v" * 500)], T0), leader_epoch=0)
    assert e.value.error_code == ErrorCode.message_too_large
    # a batch with a producer id is not one of ours: fully validated (here: a bad CRC)
    bad = bytearray(build_batch([(b"k", b"v")], T0, producer_id=7, producer_epoch=0,
                                base_sequence=0))
    bad[-1] ^= 0xFF
    with pytest.raises((InvalidRecordError, LogError)):
        log.append_own_batch(bytes(bad), leader_epoch=0)
    assert log.log_end_offset == 0
    log.close()
