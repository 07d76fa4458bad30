"""The partition log: offsets, reads, recovery, retention, timestamps, idempotence
(R-LOG-1..5, R-LOG-7, R-PROTO-7)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.record.default_records import (  # type: ignore[import-untyped]
    DefaultRecordBatchBuilder,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from tests.batches import make_batch, simple_batch

from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log.errors import LogError
from headrace.log.partition_log import PartitionLog
from headrace.protocol.records import InvalidRecordError, split_batches

T0 = 1_700_000_000_000
BIG = 10**9


def small_config(**kw: object) -> LogConfig:
    defaults: dict[str, object] = {"segment_bytes": 2_000, "index_interval_bytes": 200}
    defaults.update(kw)
    return LogConfig(**defaults)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall_ms=T0)


@pytest.fixture
def plog(tmp_path: Path, clock: ManualClock) -> Iterator[PartitionLog]:
    log = PartitionLog.open(tmp_path / "t-0", small_config(), clock)
    yield log
    log.close()


def append(log: PartitionLog, n: int, ts: int = T0, **kw: int) -> tuple[int, int]:
    res = log.append_as_leader(simple_batch(n, ts=ts, **kw), leader_epoch=0)
    log.high_watermark = log.log_end_offset
    return res.first_offset, res.last_offset


def read_all(log: PartitionLog) -> bytes:
    return log.read(log.log_start_offset, BIG, max_offset=log.log_end_offset,
                    min_one_batch=True)


def offsets_of(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for h in split_batches(data, BIG)]


def error_code(fn: object, *args: object, **kw: object) -> ErrorCode:
    with pytest.raises((LogError, InvalidRecordError)) as e:
        fn(*args, **kw)  # type: ignore[operator]
    assert isinstance(e.value, (LogError, InvalidRecordError))
    return e.value.error_code


# ---------------------------------------------------------------------- offsets and reads


def test_offsets_are_contiguous_across_batches_and_rolls(plog: PartitionLog) -> None:
    """R-LOG-1/2: offsets are assigned contiguously; the active segment rolls at
    segment.bytes; stored batches carry their offsets and the leader epoch."""
    expected = 0
    for n in [1, 3, 7, 2, 5] * 10:
        first, last = append(plog, n, value_size=30)
        assert (first, last) == (expected, expected + n - 1)
        expected += n
    assert plog.log_end_offset == expected
    assert len(plog.segments) > 3
    assert all(s.size <= 2_000 for s in plog.segments)
    headers = split_batches(read_all(plog), BIG)
    assert headers[0].base_offset == 0 and headers[-1].last_offset == expected - 1
    assert all(a.next_offset == b.base_offset for a, b in itertools.pairwise(headers))
    assert {h.partition_leader_epoch for h in headers} == {0}
    seg = plog.segments[1]
    assert seg.find_position(seg.base_offset) == 0
    assert seg.find_position(plog.log_end_offset + 1) is None
    assert (plog.dir / "leader-epoch-checkpoint").read_text() == "0\n1\n0 0\n"


def test_multi_batch_request_and_result_fields(plog: PartitionLog) -> None:
    """R-LOG-3: several batches in one request get consecutive offsets."""
    res = plog.append_as_leader(simple_batch(2) + simple_batch(3), leader_epoch=4)
    assert (res.first_offset, res.last_offset, res.log_append_time_ms, res.log_start_offset) == (
        0, 4, -1, 0
    )
    plog.high_watermark = 5
    assert offsets_of(read_all(plog)) == [(0, 1), (2, 4)]


def test_invalid_requests_append_nothing(plog: PartitionLog) -> None:
    """R-LOG-4: a bad batch anywhere in the request rejects all of it."""
    bad = bytearray(simple_batch(2))
    bad[-1] ^= 0xFF
    assert error_code(plog.append_as_leader, simple_batch(1) + bytes(bad), 0) == (
        ErrorCode.corrupt_message
    )
    big = simple_batch(50, value_size=30_000)
    assert error_code(plog.append_as_leader, big, 0) == ErrorCode.message_too_large
    assert error_code(plog.append_as_leader, simple_batch(1, base_offset=5), 0) == (
        ErrorCode.invalid_record
    )
    assert plog.log_end_offset == 0 and plog.active_segment.size == 0


def test_read_limits_high_watermark_and_kip74(plog: PartitionLog) -> None:
    """R-LOG-7/R-PROTO-4: data at or past max_offset is invisible; max_bytes counts whole
    batches; min_one_batch returns one oversized batch whole (KIP-74)."""
    for _ in range(5):
        append(plog, 3, value_size=20)
    size = len(simple_batch(3, value_size=20, ts=T0))
    assert offsets_of(plog.read(0, BIG, max_offset=6, min_one_batch=False)) == [(0, 2), (3, 5)]
    assert plog.read(6, BIG, max_offset=6, min_one_batch=True) == b""
    assert plog.read(7, BIG, max_offset=6, min_one_batch=True) == b""  # above HW, below LEO
    assert plog.read(4, BIG, max_offset=5, min_one_batch=True) == b""  # batch straddles HW
    assert plog.read(15, BIG, max_offset=15, min_one_batch=True) == b""  # log end
    assert offsets_of(plog.read(4, 2 * size + 1, max_offset=15, min_one_batch=False)) == [
        (3, 5), (6, 8)
    ]
    assert plog.read(4, size - 1, max_offset=15, min_one_batch=False) == b""
    assert offsets_of(plog.read(4, size - 1, max_offset=15, min_one_batch=True)) == [(3, 5)]
    assert offsets_of(plog.read(4, 0, max_offset=15, min_one_batch=True)) == [(3, 5)]


def test_read_out_of_range(plog: PartitionLog) -> None:
    """R-PROTO-4: offsets outside [log start, log end] → OFFSET_OUT_OF_RANGE."""
    append(plog, 3)
    assert error_code(plog.read, 4, 100, max_offset=3, min_one_batch=True) == (
        ErrorCode.offset_out_of_range
    )
    assert error_code(plog.read, -1, 100, max_offset=3, min_one_batch=True) == (
        ErrorCode.offset_out_of_range
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 150)), min_size=1,
                     max_size=40),
    reads=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3_000), st.booleans(),
                             st.integers(0, 10**6)), min_size=1, max_size=20),
    interval=st.sampled_from([0, 100, 4096]),
    segment_bytes=st.sampled_from([300, 1_000, 10**6]),
    reopen=st.booleans(),
)
def test_read_matches_a_simple_model(
    batches: list[tuple[int, int]], reads: list[tuple[int, int, bool, int]], interval: int,
    segment_bytes: int, reopen: bool,
) -> None:
    """R-LOG-2: a read at any offset finds the batch containing it through the sparse
    index, across segments, before and after a reopen."""
    clock = ManualClock(wall_ms=T0)
    cfg = small_config(segment_bytes=segment_bytes, index_interval_bytes=interval)
    with tempfile.TemporaryDirectory() as d:
        log = PartitionLog.open(Path(d) / "p-0", cfg, clock)
        model: list[tuple[int, int, bytes]] = []  # (base, last, stored bytes)
        for n, size in batches:
            _first, last = append(log, n, value_size=size)
        stored = read_all(log)
        for h in split_batches(stored, BIG):
            model.append((h.base_offset, h.last_offset, stored[h.position:h.position + h.size]))
        if reopen:
            log.close()
            log = PartitionLog.open(Path(d) / "p-0", cfg, clock)
        leo = log.log_end_offset
        for raw_offset, max_bytes, min_one, raw_max in reads:
            offset = raw_offset % (leo + 1)
            max_offset = raw_max % (leo + 1)
            got = log.read(offset, max_bytes, max_offset=max_offset, min_one_batch=min_one)
            expected = b""
            for _base, last, data in model:
                if last < offset:
                    continue
                if last >= max_offset:
                    break
                if len(expected) + len(data) > max_bytes:
                    if not expected and min_one:
                        expected = data
                    break
                expected += data
            assert got == expected
        log.close()


# ---------------------------------------------------------------------- recovery


def _fill(log: PartitionLog, batches: int) -> None:
    for i in range(batches):
        append(log, 1 + i % 4, value_size=40)


@pytest.mark.parametrize("seed", range(8))
def test_recovery_truncates_a_garbage_tail(tmp_path: Path, clock: ManualClock, seed: int) -> None:
    """R-LOG-4: random garbage over the tail of the active segment is truncated at the first
    invalid batch; intact batches survive; nothing corrupt is served."""
    rnd = random.Random(seed)
    cfg = small_config()
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    _fill(log, 30)
    before = split_batches(read_all(log), BIG)
    data_before = read_all(log)
    active = log.active_segment.log_path
    log.close()
    size = active.stat().st_size
    cut = rnd.randrange(0, size)
    with open(active, "r+b") as f:
        f.seek(cut)
        f.write(rnd.randbytes(rnd.randrange(1, 300)))
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    log.high_watermark = log.log_end_offset
    after = read_all(log)
    headers = split_batches(after, BIG)  # whole, CRC-valid batches only
    assert after == data_before[: len(after)]
    intact_end = len(data_before) - size + cut  # garbage starts here
    assert len(after) >= max((h.position + h.size for h in before
                              if h.position + h.size <= intact_end), default=0)
    assert log.log_end_offset == headers[-1].next_offset
    # appends continue at the new log end
    first, _ = append(log, 2)
    assert first == log.log_end_offset - 2
    log.close()


def test_recovery_truncates_torn_batch(tmp_path: Path, clock: ManualClock) -> None:
    """R-LOG-4: a half-written last batch (kill -9 mid-append) is dropped."""
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), clock)
    append(log, 3)
    append(log, 4)
    path = log.active_segment.log_path
    log.close()
    os.truncate(path, path.stat().st_size - 7)
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), clock)
    assert log.log_end_offset == 3
    log.high_watermark = 3
    assert offsets_of(read_all(log)) == [(0, 2)]
    log.close()


@pytest.mark.parametrize("damage", ["delete", "truncate", "garble", "append", "empty"])
def test_index_damage_is_rebuilt(tmp_path: Path, clock: ManualClock, damage: str) -> None:
    """R-LOG-2/4: missing, truncated or garbage index files are rebuilt; every read gives
    the same bytes as before."""
    cfg = small_config(index_interval_bytes=100)
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    _fill(log, 60)
    leo = log.log_end_offset
    reads = [log.read(o, 500, max_offset=leo, min_one_batch=True) for o in range(leo)]
    ts_before = [log.offset_for_timestamp(T0 + k) for k in range(0, 5)]
    log.close()
    rnd = random.Random(damage)
    for p in sorted((tmp_path / "t-0").glob("*index")):
        if damage == "delete":
            p.unlink()
        elif damage == "truncate":
            os.truncate(p, max(p.stat().st_size - 5, 0))
        elif damage == "garble":
            p.write_bytes(rnd.randbytes(p.stat().st_size))
        elif damage == "append":
            with open(p, "ab") as f:
                f.write(rnd.randbytes(24))
        else:
            p.write_bytes(b"")
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    assert log.log_end_offset == leo
    assert [log.read(o, 500, max_offset=leo, min_one_batch=True) for o in range(leo)] == reads
    assert [log.offset_for_timestamp(T0 + k) for k in range(0, 5)] == ts_before
    log.close()


def test_garbage_in_a_middle_segment_drops_later_segments(
    tmp_path: Path, clock: ManualClock
) -> None:
    """R-LOG-4: a non-last segment with a bad tail is truncated and later segments, whose
    offsets would follow a hole, are deleted (Kafka's LogLoader)."""
    cfg = small_config(index_interval_bytes=4096)
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    _fill(log, 60)
    second = log.segments[1]
    base2, base3 = second.base_offset, log.segments[2].base_offset
    path = second.log_path
    log.close()
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size - 10)
        f.write(b"\xff" * 10)
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    assert len(log.segments) == 2
    assert base2 < log.log_end_offset < base3
    log.high_watermark = log.log_end_offset
    split_batches(read_all(log), BIG)
    log.close()


# ---------------------------------------------------------------------- retention


def test_retention_by_time(tmp_path: Path, clock: ManualClock) -> None:
    """R-LOG-5: whole segments older than retention.ms go; the log start offset advances and
    reads below it get OFFSET_OUT_OF_RANGE; nothing past the high watermark is deleted."""
    cfg = small_config(retention_ms=60_000)
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    for _ in range(20):
        append(log, 3, ts=clock.wall_ms(), value_size=40)
    old_segments = len(log.segments)
    clock.advance(120_000)
    for _ in range(20):
        append(log, 3, ts=clock.wall_ms(), value_size=40)
    log.high_watermark = 0
    assert log.delete_old_segments() == 0  # nothing below the high watermark
    log.high_watermark = log.log_end_offset
    deleted = log.delete_old_segments()
    assert deleted >= old_segments - 1
    assert log.log_start_offset == log.segments[0].base_offset > 0
    assert error_code(log.read, log.log_start_offset - 1, 100, max_offset=log.log_end_offset,
                      min_one_batch=True) == ErrorCode.offset_out_of_range
    assert split_batches(read_all(log), BIG)[0].base_offset == log.log_start_offset
    assert log.delete_old_segments() == 0
    log.close()


def test_retention_deletes_everything_and_remembers_the_start(
    tmp_path: Path, clock: ManualClock
) -> None:
    """R-LOG-5: when even the active segment has expired it is rolled and deleted; the log
    starts at the old log end, also after a reopen."""
    cfg = small_config(retention_ms=1_000)
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    for _ in range(10):
        append(log, 2, ts=clock.wall_ms())
    clock.advance(5_000)
    assert log.delete_old_segments() >= 1
    assert log.log_start_offset == log.log_end_offset == 20
    assert read_all(log) == b""
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    assert (log.log_start_offset, log.log_end_offset) == (20, 20)
    assert append(log, 1) == (20, 20)
    log.close()


def test_retention_by_size(tmp_path: Path, clock: ManualClock) -> None:
    """R-LOG-5: oldest segments go while the log stays at least retention.bytes large."""
    cfg = small_config(retention_bytes=3_000, segment_bytes=1_000)
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    for _ in range(40):
        append(log, 2, value_size=50)
    total = log.size_in_bytes
    deleted = log.delete_old_segments()
    assert deleted > 0
    assert 3_000 <= log.size_in_bytes < 3_000 + 1_000
    assert log.size_in_bytes < total and log.log_start_offset > 0
    assert log.delete_old_segments() == 0
    log.close()


def test_retention_only_with_cleanup_policy_delete(tmp_path: Path, clock: ManualClock) -> None:
    cfg = small_config(retention_bytes=0, cleanup_policy="compact")
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    for i in range(20):
        log.append_as_leader(make_batch([(b"k%d" % j, b"v" * 50, T0 + i, []) for j in range(2)]),
                             leader_epoch=0)
    assert log.delete_old_segments() == 0
    log.close()


@pytest.mark.parametrize("codec", [None, "gzip", "zstd"])
def test_compacted_log_refuses_records_without_a_key(tmp_path: Path, clock: ManualClock,
                                                     codec: str | None) -> None:
    """R-LOG-6 with Kafka's LogValidator rule: a compacted topic accepts only keyed records;
    a batch with one keyless record among keyed ones is refused whole (INVALID_RECORD) and
    nothing of the request is appended. A delete-policy topic takes keyless records."""
    log = PartitionLog.open(tmp_path / "t-0", small_config(cleanup_policy="compact"), clock)
    good = make_batch([(b"a", b"1", T0, []), (b"b", b"2", T0, [])], compression=codec)
    bad = make_batch([(b"a", b"1", T0, []), (None, b"2", T0, [])], compression=codec)
    assert log.append_as_leader(good, leader_epoch=0).first_offset == 0
    with pytest.raises(InvalidRecordError) as err:
        log.append_as_leader(good + bad, leader_epoch=0)
    assert err.value.error_code == ErrorCode.invalid_record
    assert "without key" in str(err.value)
    assert log.log_end_offset == 2
    log.close()
    plain = PartitionLog.open(tmp_path / "u-0", small_config(), clock)
    assert plain.append_as_leader(bad, leader_epoch=0).last_offset == 1
    plain.close()


# ---------------------------------------------------------------------- timestamps


def client_batch(codec: int, ts0: int, n: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=0, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=10**7,
    )
    for i in range(n):
        builder.append(i, timestamp=ts0 + 10 * i, key=None, value=b"compressible " * 10,
                       headers=[])
    return bytes(builder.build())


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_offset_for_timestamp(tmp_path: Path, clock: ManualClock, codec: int) -> None:
    """R-PROTO-5: the first record with a timestamp >= the target, for every codec,
    across segments; and the record with the largest timestamp."""
    log = PartitionLog.open(tmp_path / "t-0", small_config(segment_bytes=600), clock)
    for b in range(12):
        log.append_as_leader(client_batch(codec, 1_000 * b, 5), leader_epoch=0)
    log.high_watermark = log.log_end_offset
    assert len(log.segments) > 2
    # batch b holds offsets 5b..5b+4 with timestamps 1000b + 0, 10, .., 40
    assert log.offset_for_timestamp(0) == (0, 0)
    assert log.offset_for_timestamp(3_015) == (17, 3_020)
    assert log.offset_for_timestamp(3_041) == (20, 4_000)
    assert log.offset_for_timestamp(11_040) == (59, 11_040)
    assert log.offset_for_timestamp(11_041) is None
    assert log.max_timestamp() == (59, 11_040)
    log.close()


def test_max_timestamp_is_the_first_record_reaching_it(
    tmp_path: Path, clock: ManualClock
) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_config(), clock)
    append(log, 3, ts=5_000)  # 5000..5002
    append(log, 3, ts=100)
    assert log.max_timestamp() == (2, 5_002)
    assert log.offset_for_timestamp(5_001) == (1, 5_001)
    log.close()


def test_log_append_time(tmp_path: Path, clock: ManualClock) -> None:
    """R-LOG-3: LogAppendTime topics stamp batches with the broker clock."""
    log = PartitionLog.open(tmp_path / "t-0",
                            small_config(message_timestamp_type="LogAppendTime"), clock)
    res = log.append_as_leader(simple_batch(3, ts=5), leader_epoch=0)
    assert res.log_append_time_ms == T0
    log.high_watermark = 3
    (h,) = split_batches(read_all(log), BIG)
    assert h.is_log_append_time and h.max_timestamp == T0
    assert log.offset_for_timestamp(T0) == (0, T0)
    assert log.offset_for_timestamp(6) == (0, T0)
    log.close()


# ---------------------------------------------------------------------- idempotence


def idem(seq: int, n: int = 2, epoch: int = 0, pid: int = 77) -> bytes:
    return simple_batch(n, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def test_idempotent_producer(tmp_path: Path, clock: ManualClock) -> None:
    """R-PROTO-7: a duplicate gets the original offsets and appends nothing; a gap is
    OUT_OF_ORDER_SEQUENCE_NUMBER; an old epoch INVALID_PRODUCER_EPOCH; the state survives
    close and reopen."""
    cfg = small_config()
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    assert log.append_as_leader(idem(0), 0)[:2] == (0, 1)
    assert log.append_as_leader(simple_batch(3), 0)[:2] == (2, 4)
    assert log.append_as_leader(idem(2), 0)[:2] == (5, 6)
    size = log.size_in_bytes
    assert log.append_as_leader(idem(0), 0)[:2] == (0, 1)
    assert log.append_as_leader(idem(2), 0)[:2] == (5, 6)
    assert log.size_in_bytes == size and log.log_end_offset == 7
    assert error_code(log.append_as_leader, idem(7), 0) == ErrorCode.out_of_order_sequence_number
    assert log.append_as_leader(idem(0, epoch=1), 0)[:2] == (7, 8)
    assert error_code(log.append_as_leader, idem(2, epoch=0), 0) == (
        ErrorCode.invalid_producer_epoch
    )
    assert log.log_end_offset == 9
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    assert log.append_as_leader(idem(0, epoch=1), 0)[:2] == (7, 8)
    assert error_code(log.append_as_leader, idem(0, epoch=0), 0) == (
        ErrorCode.invalid_producer_epoch
    )
    assert log.append_as_leader(idem(2, epoch=1), 0)[:2] == (9, 10)
    log.close()


# ---------------------------------------------------------------------- epochs, truncation


def test_leader_epochs_and_truncate_to(tmp_path: Path, clock: ManualClock) -> None:
    """R-REP-7 groundwork: the leader-epoch checkpoint records where each epoch began and
    truncation removes whole batches at and after an offset."""
    cfg = small_config()
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    for epoch in (0, 0, 2, 2, 5):
        for _ in range(8):
            log.append_as_leader(simple_batch(3, value_size=30), leader_epoch=epoch)
    assert log.leader_epochs == [(0, 0), (2, 48), (5, 96)]
    log.high_watermark = log.log_end_offset
    log.truncate_to(50)  # inside the batch 48..50
    assert log.log_end_offset == 48 and log.high_watermark == 48
    assert log.leader_epochs == [(0, 0)]
    assert offsets_of(read_all(log))[-1] == (45, 47)
    assert append(log, 2) == (48, 49)
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    assert log.log_end_offset == 50 and log.leader_epochs == [(0, 0)]
    assert (log.dir / "leader-epoch-checkpoint").read_text() == "0\n1\n0 0\n"
    log.close()


def test_segment_ms_roll_and_flush_messages(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-LOG-2/7: segment.ms rolls by the injected clock; flush.messages fsyncs."""
    fsyncs: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    cfg = small_config(segment_bytes=10**6, segment_ms=1_000, flush_messages=4)
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    append(log, 2)
    fsyncs.clear()  # the leader-epoch checkpoint is fsynced when epoch 0 begins
    clock.advance(500)
    append(log, 1)
    assert len(log.segments) == 1 and not fsyncs
    clock.advance(600)
    append(log, 1)
    assert len(log.segments) == 2
    assert fsyncs  # 4 messages since the last flush
    log.update_config(dataclasses.replace(cfg, segment_ms=10**9))
    clock.advance(5_000)
    append(log, 1)
    assert len(log.segments) == 2
    log.delete()
    assert not (tmp_path / "t-0").exists()


def test_flush_ms_is_honoured_between_appends(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-LOG-7: data waiting longer than flush.ms is fsynced by the periodic flusher,
    even when no further append comes to trigger it."""
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    log = PartitionLog.open(tmp_path / "t-0", small_config(flush_ms=1_000), clock)
    append(log, 1)
    fsyncs.clear()
    clock.advance(999)
    assert log.flush_if_due() is False and not fsyncs
    clock.advance(1)
    assert log.flush_if_due() is True and fsyncs
    fsyncs.clear()
    clock.advance(5_000)
    assert log.flush_if_due() is False and not fsyncs  # nothing new to flush
    log.close()


# ---------------------------------------------------------------------- storage failures
# Issue 8, item 2 (R-LOG-4): a write that fails (ENOSPC, EIO) must leave the log exactly as
# before it, or take the log offline; never a torn batch in front of later, acknowledged
# appends.


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


class _DiskFull:
    """Makes writes to files whose path ends with ``suffix`` fail with ENOSPC after
    writing ``partial`` bytes of them (a torn write, as a filling disk leaves it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, suffix: str, partial: int) -> None:
        self.suffix, self.partial, self.armed, self.failures = suffix, partial, False, 0
        self.real_write, self.real_writev = os.write, os.writev
        monkeypatch.setattr(os, "write", self.write)
        monkeypatch.setattr(os, "writev", self.writev)

    def _fail(self, fd: int, data: bytes) -> int:
        self.failures += 1
        if self.partial:
            self.real_write(fd, data[: self.partial])
        raise OSError(28, "No space left on device")

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.armed and _fd_path(fd).endswith(self.suffix):
            return self._fail(fd, bytes(data))
        return self.real_write(fd, data)

    def writev(self, fd: int, parts: list[bytes | memoryview]) -> int:
        if self.armed and _fd_path(fd).endswith(self.suffix):
            return self._fail(fd, b"".join(bytes(p) for p in parts))
        return self.real_writev(fd, parts)


def _batches_with_values(log: PartitionLog) -> list[tuple[int, int, bytes]]:
    """(base offset, last offset, whole stored batch minus its 16-byte prefix)."""
    data = read_all(log)
    return [(h.base_offset, h.last_offset, data[h.position + 16 : h.position + h.size])
            for h in split_batches(data, BIG)]


@pytest.mark.parametrize("partial", [0, 7, 100])
def test_failed_log_write_is_undone_and_later_appends_stay_readable(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, partial: int
) -> None:
    """Issue 8 item 2, R-LOG-4: an append that fails with ENOSPC (after writing ``partial``
    bytes) answers KAFKA_STORAGE_ERROR and leaves no byte behind; the next appends get the
    next offsets, are read back exactly, and survive a reopen."""
    log = PartitionLog.open(tmp_path / "t-0", small_config(segment_bytes=10**6), clock)
    append(log, 3)
    disk = _DiskFull(monkeypatch, ".log", partial)
    size = log.active_segment.size
    disk.armed = True
    assert error_code(log.append_as_leader, simple_batch(2), 0) == ErrorCode.kafka_storage_error
    disk.armed = False
    assert disk.failures == 1 and log.offline is None
    assert os.path.getsize(log.active_segment.log_path) == size == log.active_segment.size
    assert log.log_end_offset == 3
    for _ in range(5):
        append(log, 2)
    before = _batches_with_values(log)
    assert [(b, e) for b, e, _ in before] == [(0, 2), (3, 4), (5, 6), (7, 8), (9, 10),
                                              (11, 12)]
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", small_config(segment_bytes=10**6), clock)
    log.high_watermark = log.log_end_offset
    assert _batches_with_values(log) == before
    log.close()


def test_failed_batch_of_a_multi_batch_request_undoes_the_whole_request(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 item 2: when the third batch of a request fails, the first two (already
    written, with index entries) are removed too: nothing of a failed request stays."""
    log = PartitionLog.open(tmp_path / "t-0", small_config(segment_bytes=10**6,
                                                           index_interval_bytes=1), clock)
    append(log, 1)
    seg = log.active_segment
    size, entries, time_entries = seg.size, len(seg.index), len(seg.time_index)
    real_writev, calls = os.writev, []

    def third_fails(fd: int, parts: list[bytes | memoryview]) -> int:
        calls.append(fd)
        if len(calls) == 3:
            real_writev(fd, [bytes(parts[0])[:5]])
            raise OSError(28, "No space left on device")
        return real_writev(fd, parts)

    monkeypatch.setattr(os, "writev", third_fails)
    request = simple_batch(2) + simple_batch(2) + simple_batch(2)
    assert error_code(log.append_as_leader, request, 0) == ErrorCode.kafka_storage_error
    monkeypatch.setattr(os, "writev", real_writev)
    assert (seg.size, len(seg.index), len(seg.time_index)) == (size, entries, time_entries)
    assert os.path.getsize(seg.log_path) == size
    assert os.path.getsize(seg.index.path) == entries * 8
    assert log.log_end_offset == 1
    append(log, 2)
    assert offsets_of(read_all(log)) == [(0, 0), (1, 2)]
    log.close()


def test_failed_index_write_undoes_the_append(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 item 2: a failed index write (also ENOSPC) undoes the log write it belongs
    to, and the index file keeps no torn entry (a reopen trusts it and finds every batch)."""
    cfg = small_config(segment_bytes=10**6, index_interval_bytes=1)
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    append(log, 1)
    append(log, 1)
    seg = log.active_segment
    size, entries = seg.size, len(seg.index)
    disk = _DiskFull(monkeypatch, ".index", 3)
    disk.armed = True
    assert error_code(log.append_as_leader, simple_batch(2), 0) == ErrorCode.kafka_storage_error
    disk.armed = False
    assert disk.failures == 1
    assert (seg.size, len(seg.index)) == (size, entries)
    assert os.path.getsize(seg.index.path) == entries * 8
    assert os.path.getsize(seg.log_path) == size
    for _ in range(3):
        append(log, 1)
    expected = _batches_with_values(log)
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    log.high_watermark = log.log_end_offset
    assert _batches_with_values(log) == expected
    assert [b for b, _, _ in expected] == [0, 1, 2, 3, 4]
    log.close()


def test_write_failure_that_cannot_be_undone_takes_the_log_offline(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 item 2 (Kafka's LogDirFailureChannel): if the torn bytes cannot be cut
    off, the log refuses every produce and fetch with KAFKA_STORAGE_ERROR until restart;
    the restart's recovery then removes the torn tail and keeps everything before it."""
    log = PartitionLog.open(tmp_path / "t-0", small_config(segment_bytes=10**6), clock)
    append(log, 4)
    good = _batches_with_values(log)
    disk = _DiskFull(monkeypatch, ".log", 30)
    disk.armed = True

    def no_truncate(fd: int, size: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "ftruncate", no_truncate)
    assert error_code(log.append_as_leader, simple_batch(2), 0) == ErrorCode.kafka_storage_error
    monkeypatch.undo()
    assert log.offline is not None
    assert error_code(log.append_as_leader, simple_batch(2), 0) == ErrorCode.kafka_storage_error
    assert error_code(log.read, 0, BIG, max_offset=4, min_one_batch=True) == (
        ErrorCode.kafka_storage_error)
    assert os.path.getsize(log.active_segment.log_path) > log.active_segment.size  # torn
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", small_config(segment_bytes=10**6), clock)
    log.high_watermark = log.log_end_offset
    assert log.offline is None and _batches_with_values(log) == good
    append(log, 1)
    assert offsets_of(read_all(log)) == [(0, 3), (4, 4)]
    log.close()


def test_failed_fsync_takes_the_log_offline(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-LOG-7, issue 8 item 2: with flush.messages=1 an append is acknowledged only once
    fsynced; a failed fsync answers KAFKA_STORAGE_ERROR (never an acknowledgement) and
    takes the log offline (after a failed fsync the page cache cannot be trusted)."""
    log = PartitionLog.open(tmp_path / "t-0", small_config(flush_messages=1), clock)
    append(log, 1)

    def eio(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", eio)
    assert error_code(log.append_as_leader, simple_batch(1), 0) == ErrorCode.kafka_storage_error
    monkeypatch.undo()
    assert log.offline is not None
    assert error_code(log.append_as_leader, simple_batch(1), 0) == ErrorCode.kafka_storage_error
    log.close()


def test_flush_messages_1_fsyncs_the_segment_before_the_append_returns(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-LOG-7, issue 8 ("kill -9 keeps the page cache, so it does not test fsync"): with
    flush.messages=1 every append returns only after an fsync of the ``.log`` file that
    holds it, also when the segment's fd was closed by the open-file LRU in between;
    with the default policy an append fsyncs nothing."""
    synced: list[tuple[str, int]] = []  # (path, file size at the fsync)
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append((_fd_path(fd), os.fstat(fd).st_size))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    log = PartitionLog.open(tmp_path / "t-0", small_config(flush_messages=1), clock)
    for i in range(12):  # rolls several segments (segment.bytes 2000)
        synced.clear()
        append(log, 3, value_size=40)
        seg = log.active_segment
        assert (str(seg.log_path), seg.size) in synced, (i, synced)
        if i == 5:  # the LRU closes the segment's fd: the next flush must still fsync it
            seg._file.close()
    assert len(log.segments) > 1
    lazy = PartitionLog.open(tmp_path / "t-1", small_config(), clock)
    synced.clear()
    for _ in range(5):
        append(lazy, 3)
    assert not [p for p, _ in synced if p.endswith(".log")]
    lazy.close()
    log.close()


def test_open_segment_files_are_capped(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 item 9: segment files are opened through a capped LRU, so the number of
    open fds stays bounded however many partitions and segments are hosted, and every
    partition still appends and reads (closed files are reopened on use)."""
    from headrace.log.index import OPEN_FILES

    monkeypatch.setattr(OPEN_FILES, "capacity", 20)
    before = len(os.listdir("/proc/self/fd"))
    logs = [PartitionLog.open(tmp_path / f"t-{i}", small_config(), clock) for i in range(60)]
    for lg in logs:
        for _ in range(4):  # several segments each
            append(lg, 5, value_size=100)
    assert all(len(lg.segments) >= 2 for lg in logs)
    assert len(os.listdir("/proc/self/fd")) - before <= 20 + 2
    for i, lg in enumerate(logs):
        append(lg, 1, value_size=100)
        assert offsets_of(read_all(lg))[-1] == (20, 20), i
    assert len(os.listdir("/proc/self/fd")) - before <= 20 + 2
    for lg in logs:
        lg.close()
    reopened = [PartitionLog.open(tmp_path / f"t-{i}", small_config(), clock)
                for i in range(60)]
    assert len(os.listdir("/proc/self/fd")) - before <= 20 + 2
    assert all(lg.log_end_offset == 21 for lg in reopened)
    for lg in reopened:
        lg.close()


# ---------------------------------------------------------------------- compaction off-loop
# Issue 8 (retention and compaction ran on the event loop): the heavy part of a compaction
# (CompactionJob.run) runs in a worker thread on a snapshot while the log appends and reads;
# the swap happens on the log's thread only if nothing changed the log under it.


def test_compaction_job_runs_in_a_thread_while_appends_go_on(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-LOG-6: appends and reads proceed while a compaction job is in the middle of its
    run in another thread (held there until the appends are done); then the swap keeps
    the latest value of every key, every record appended meanwhile, and the offsets."""
    import threading

    from tests.unit.test_cleaner import all_records, check_compacted, compact_config, fill
    from tests.unit.test_cleaner import append as kv_append

    from headrace.log import cleaner

    log = PartitionLog.open(tmp_path / "t-0", compact_config(), clock)
    fill(log, 400, keys=7)
    in_run, release = threading.Event(), threading.Event()
    real_map = cleaner.build_offset_map

    def held_map(*args: object, **kw: object) -> cleaner.OffsetMap:
        in_run.set()
        assert release.wait(10)
        return real_map(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(cleaner, "build_offset_map", held_map)
    at_prepare = all_records(log)
    job = log.prepare_compaction(clock.wall_ms())
    assert job is not None
    assert log.prepare_compaction(clock.wall_ms(), force=True) is None  # one at a time
    errors: list[BaseException] = []

    def run() -> None:
        try:
            job.run()
        except BaseException as e:  # surfaced below
            errors.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    assert in_run.wait(10)
    end_before = log.log_end_offset
    for i in range(30):  # the log keeps working while the job is mid-run
        kv_append(log, [(b"k%d" % (i % 7), b"during-%d" % i)])
    assert log.log_end_offset == end_before + 30
    assert all_records(log)[-1][3] == b"during-29"
    before = all_records(log)
    release.set()
    worker.join(10)
    assert not errors and not worker.is_alive()
    stats = log.finish_compaction(job)
    assert stats is not None and stats.groups_rewritten > 0
    after = all_records(log)
    # the job decides by what was there when it was prepared (Kafka's dirty section)
    check_compacted(at_prepare, [r for r in after if r[0] < end_before], stats.cleanable_end)
    assert [r for r in after if r[0] >= end_before] == [r for r in before if r[0] >= end_before]
    assert not list(log.dir.glob("*.cleaned")) and not list(log.dir.glob("*.swap"))
    log.close()
    reopened = PartitionLog.open(tmp_path / "t-0", compact_config(), clock)
    reopened.high_watermark = reopened.log_end_offset
    assert all_records(reopened) == after
    reopened.close()


def test_compaction_job_is_discarded_if_the_log_changed_under_it(
    tmp_path: Path, clock: ManualClock
) -> None:
    """R-LOG-6: a job whose log lost segments (retention), or changed config, while it ran
    is not swapped in: its cleaned files are removed and the log is as it was."""
    from tests.unit.test_cleaner import all_records, compact_config, fill

    cfg = compact_config(cleanup_policy="compact,delete", retention_bytes=3_000)
    log = PartitionLog.open(tmp_path / "t-0", cfg, clock)
    fill(log, 400, keys=7)
    job = log.prepare_compaction(clock.wall_ms())
    assert job is not None
    job.run()
    assert list(log.dir.glob("*.cleaned"))
    assert log.delete_old_segments() > 0  # retention while the job was out
    before = all_records(log)
    assert log.finish_compaction(job) is None
    assert not list(log.dir.glob("*.cleaned"))
    assert all_records(log) == before
    job = log.prepare_compaction(clock.wall_ms())  # the next run starts over
    assert job is not None
    job.run()
    log.update_config(cfg)
    assert log.finish_compaction(job) is None and all_records(log) == before
    assert not list(log.dir.glob("*.cleaned"))
    stats = log.compact(clock.wall_ms())
    assert stats is not None and stats.groups_rewritten > 0
    log.close()


def test_lazy_file_is_never_closed_under_a_reader(tmp_path: Path) -> None:
    """Issue 8 item 9: a segment file closed (segment deleted, or evicted) while another
    thread holds its fd keeps the fd open until that user releases it (a closed fd number
    could be reused by another file and read in its place)."""
    from headrace.log.index import OPEN_FILES, LazyFile

    path = tmp_path / "f.log"
    path.write_bytes(b"hello")
    f = LazyFile(path, os.O_RDONLY)
    fd = f.acquire()
    f.close()  # e.g. retention deleting the segment on the loop
    assert os.pread(fd, 5, 0) == b"hello"  # still this file
    f.release()
    with pytest.raises(OSError):
        os.fstat(fd)
    assert f.fd is None and id(f) not in OPEN_FILES._open
    with f.use() as fd2:  # reopened on the next use
        assert os.pread(fd2, 5, 0) == b"hello"
    f.close()


def test_open_files_evicts_the_least_recently_used_unpinned_files(tmp_path: Path) -> None:
    """Issue 8 item 9 / issue 21 item 5: at capacity, opening a file closes exactly the
    least recently used files that nobody holds (a pinned one is skipped, never closed),
    and a touched file moves to the back of the queue."""
    from headrace.log.index import LazyFile, OpenFiles

    lru = OpenFiles(capacity=3)
    files = []
    for i in range(6):
        p = tmp_path / f"{i}.log"
        p.write_bytes(b"x")
        files.append(LazyFile(p, os.O_RDONLY))
    with lru.lock:
        for f in files[:3]:
            lru.open_locked(f)
        files[0].pins = 1  # in use: must survive
        lru.touch_locked(files[1])  # recently used: order is now 0, 2, 1
        lru.open_locked(files[3])  # one over capacity: 2 goes (0 is pinned)
    assert files[2].fd is None
    assert all(f.fd is not None for f in (files[0], files[1], files[3]))
    with lru.lock:
        lru._evict_locked(1)  # down to one: everything unpinned goes, oldest first
    assert files[0].fd is not None and files[1].fd is None and files[3].fd is None
    assert len(lru) == 1 and lru.evictions == 3
    files[0].pins = 0
    with lru.lock:
        lru._evict_locked(0)
    assert len(lru) == 0 and files[0].fd is None


# ---------------------------------------------------------------------- deferred epoch files
# Issue 21 item 5: a broker writes the leader-epoch checkpoints of its logs in a worker
# thread (a failover hands it thousands of new epochs); a deferred checkpoint must never be
# older than a producer snapshot on disk (open trusts its epochs below the newest snapshot),
# and an older content must never replace a newer one.

CHECKPOINT = "leader-epoch-checkpoint"


def _deferred(tmp_path: Path, clock: ManualClock) -> tuple[PartitionLog, list[PartitionLog]]:
    log = PartitionLog.open(tmp_path / "t-0", small_config(), clock)
    queued: list[PartitionLog] = []
    log.defer_epochs = queued.append
    return log, queued


def test_a_deferred_epoch_checkpoint_is_queued_not_written(tmp_path: Path,
                                                          clock: ManualClock) -> None:
    log, queued = _deferred(tmp_path, clock)
    log.assign_epoch(3, 0)
    assert queued == [log]
    assert not (log.dir / CHECKPOINT).exists()
    version, content = log.pending_epochs() or (0, b"")
    assert content == b"0\n1\n3 0\n"
    log.assign_epoch(5, 0)  # a newer change before the first was written
    newer = log.pending_epochs()
    assert newer is not None and newer[0] > version
    log.write_epochs(*newer)
    assert (log.dir / CHECKPOINT).read_text() == "0\n1\n5 0\n"
    log.write_epochs(version, content)  # the older one arrives late: ignored
    assert (log.dir / CHECKPOINT).read_text() == "0\n1\n5 0\n"
    assert log.pending_epochs() is None
    log.close()


def test_a_pending_epoch_checkpoint_is_written_before_a_snapshot_and_at_close(
        tmp_path: Path, clock: ManualClock) -> None:
    log, _ = _deferred(tmp_path, clock)
    log.append_as_leader(simple_batch(3), leader_epoch=0)
    log.assign_epoch(2, log.log_end_offset)
    log.append_as_leader(simple_batch(3), leader_epoch=2)
    assert not (log.dir / CHECKPOINT).exists()
    log.take_snapshot()  # (a roll): the checkpoint first
    assert (log.dir / CHECKPOINT).read_text() == "0\n2\n0 0\n2 3\n"
    log.assign_epoch(4, log.log_end_offset)
    log.close()
    assert (log.dir / CHECKPOINT).read_text() == "0\n3\n0 0\n2 3\n4 6\n"
    log.write_epochs(99, b"0\n0\n")  # a deferred write after close: dropped
    assert (log.dir / CHECKPOINT).read_text() == "0\n3\n0 0\n2 3\n4 6\n"


def test_a_crash_with_a_deferred_checkpoint_recovers_the_epochs(
        tmp_path: Path, clock: ManualClock) -> None:
    """Killed before the deferred write (no close): the file is stale, the newest
    snapshot is not, and the epochs come back whole."""
    log, _ = _deferred(tmp_path, clock)
    log.append_as_leader(simple_batch(2), leader_epoch=0)
    log.assign_epoch(1, log.log_end_offset)
    log.append_as_leader(simple_batch(2), leader_epoch=1)
    log.take_snapshot()
    log.assign_epoch(7, log.log_end_offset)
    log.append_as_leader(simple_batch(2), leader_epoch=7)
    log.flush()
    assert (log.dir / CHECKPOINT).read_text() == "0\n2\n0 0\n1 2\n"  # 7 not yet
    again = PartitionLog.open(tmp_path / "t-0", small_config(), clock)  # no close: a crash
    assert again.leader_epochs == [(0, 0), (1, 2), (7, 4)]
    again.close()


def test_an_epoch_checkpoint_is_rewritten_in_place(tmp_path: Path, clock: ManualClock) -> None:
    """A failover rewrites thousands of checkpoints: each in its own inode, not a new file
    renamed over it (a new inode cost ext4 about 20 times the rewrite, measured)."""
    log, _ = _deferred(tmp_path, clock)
    log.assign_epoch(1, 0)
    log.write_epochs(*(log.pending_epochs() or (0, b"")))
    inode = (log.dir / CHECKPOINT).stat().st_ino
    log.append_as_leader(simple_batch(5), leader_epoch=1)
    log.assign_epoch(22, log.log_end_offset)
    log.write_epochs(*(log.pending_epochs() or (0, b"")))
    assert (log.dir / CHECKPOINT).read_text() == "0\n2\n1 0\n22 5\n"
    assert (log.dir / CHECKPOINT).stat().st_ino == inode
    log.close()


@pytest.mark.parametrize("torn", [
    b"0\n3\n0 0\n1 2\n7 1",        # the new content cut at the old length, mid-line
    b"0\n3\n0 0\n1 2\n",           # cut at a line: fewer entries than the count
    b"0\n2\n0 0\n1 2\n\0\0\0\0",  # the old content, then the zeros of a longer page
    b"0\n2\n0 0\n1 2\n7 10\n",      # the old length not cut yet: an entry after the count
    b"0\n3\n0 0\n1 2\n7 10",       # no newline after the last entry
])
def test_a_torn_epoch_checkpoint_is_rebuilt_not_trusted(tmp_path: Path, clock: ManualClock,
                                                        torn: bytes) -> None:
    """R-LOG: rewritten in place, the checkpoint can be torn by an OS crash; below the
    newest snapshot open trusts what it reads, so a torn file must be rejected (as Kafka's
    reader does) and the epochs rebuilt from the batch headers."""
    log = PartitionLog.open(tmp_path / "t-0", small_config(), clock)
    log.append_as_leader(simple_batch(2), leader_epoch=0)
    log.assign_epoch(1, 2)
    log.append_as_leader(simple_batch(8), leader_epoch=1)
    log.assign_epoch(7, 10)
    log.append_as_leader(simple_batch(2), leader_epoch=7)
    log.close()  # a snapshot at 12: open trusts the checkpoint below it
    assert (log.dir / CHECKPOINT).read_bytes() == b"0\n3\n0 0\n1 2\n7 10\n"
    (log.dir / CHECKPOINT).write_bytes(torn)
    again = PartitionLog.open(tmp_path / "t-0", small_config(), clock)
    assert again.leader_epochs == [(0, 0), (1, 2), (7, 10)]
    assert again.scanned_batches == 3  # rebuilt from every header
    again.close()
    assert (log.dir / CHECKPOINT).read_bytes() == b"0\n3\n0 0\n1 2\n7 10\n"


def test_a_snapshot_finds_the_epoch_checkpoint_on_disk(tmp_path: Path, clock: ManualClock,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The deferred writes are not fsynced; a page rewritten in place is not ordered with
    the journal, so before a producer snapshot (which makes open trust the checkpoint) the
    checkpoint is fsynced, whether the snapshot writes it or a deferred write did."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    log, _ = _deferred(tmp_path, clock)
    log.append_as_leader(simple_batch(2), leader_epoch=0)
    log.assign_epoch(3, 2)
    log.write_epochs(*(log.pending_epochs() or (0, b"")))  # the replica manager's thread
    assert CHECKPOINT not in synced
    log.take_snapshot()  # nothing pending: the file on disk is fsynced
    assert synced.count(CHECKPOINT) == 1
    log.take_snapshot()  # already on disk: not again
    assert synced.count(CHECKPOINT) == 1
    log.assign_epoch(4, 2)
    log.take_snapshot()  # pending: written and fsynced
    assert synced.count(CHECKPOINT) == 2
    assert (log.dir / CHECKPOINT).read_text() == "0\n2\n0 0\n4 2\n"
    log.close()


def test_the_replica_manager_writes_pending_checkpoints_once_each(tmp_path: Path,
                                                                 clock: ManualClock) -> None:
    from headrace.broker.replica_manager import ReplicaManager, _write_epochs

    logs = [PartitionLog.open(tmp_path / f"t-{i}", small_config(), clock) for i in range(3)]
    rm = ReplicaManager.__new__(ReplicaManager)  # only the checkpoint queue is used
    import threading
    rm._epochs_pending = {}
    rm._epochs_pending_lock = threading.Lock()
    for lg in logs:
        lg.defer_epochs = rm._epochs_changed
    logs[0].assign_epoch(1, 0)
    logs[0].assign_epoch(2, 0)
    logs[2].assign_epoch(4, 0)
    items = rm.take_pending_epochs()
    assert [(lg, c) for lg, _, c in items] == [(logs[0], b"0\n1\n2 0\n"),
                                              (logs[2], b"0\n1\n4 0\n")]
    assert rm.take_pending_epochs() == []
    _write_epochs(items)
    assert (logs[0].dir / CHECKPOINT).read_text() == "0\n1\n2 0\n"
    assert (logs[2].dir / CHECKPOINT).read_text() == "0\n1\n4 0\n"
    assert not (logs[1].dir / CHECKPOINT).exists()
    for lg in logs:
        lg.close()
