"""Kafka's LogValidator on produced batches (issue 8; R-LOG-3, R-LOG-4, KIP-937).

Every record of a produced batch is checked before offsets are assigned: framing, offset
deltas 0..n-1, key presence on compacted topics, CreateTime timestamps within
message.timestamp.before/after.max.ms of the broker's clock; bad records are named in
``record_errors`` (Produce v8+) as Kafka's ``processRecordErrors`` reports them.
"""

from __future__ import annotations

import struct
from unittest.mock import patch

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from tests.batches import encode_record, make_batch

from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log import validator
from headrace.log.partition_log import PartitionLog
from headrace.log.validator import validate_batches
from headrace.protocol import records as R

NOW = 1_700_000_000_000
HOUR = 3_600_000


@pytest.fixture(autouse=True, params=["c", "python"])
def _check_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test twice: with the C check in front (where it was built; the Python paths
    then word the errors) and with the Python paths alone."""
    if request.param == "python":
        monkeypatch.setattr(validator, "_speedups", None)
    elif validator._speedups is None:
        pytest.skip("headrace._speedups was not built here")


def check(batch: bytes, config: LogConfig | None = None, now: int = NOW) -> None:
    config = config or LogConfig()
    validate_batches(batch, R.split_batches(batch, 10**7), config, now)


def refused(batch: bytes, config: LogConfig | None = None,
            now: int = NOW) -> R.InvalidRecordError:
    with pytest.raises(R.InvalidRecordError) as e:
        check(batch, config, now)
    return e.value


def raw_batch(body: bytes, count: int, last_delta: int | None = None, codec: int = 0,
              attributes: int = 0) -> bytes:
    buf = bytearray(R.HEADER_SIZE) + body
    R.HEADER.pack_into(buf, 0, 0, len(buf) - R.LOG_OVERHEAD, -1, 2, 0, codec | attributes,
                       count - 1 if last_delta is None else last_delta, NOW, NOW, -1, -1, -1,
                       count)
    struct.pack_into(">I", buf, R.CRC_POS, crc32c.crc32c(bytes(buf[R.ATTRIBUTES_POS:])))
    return bytes(buf)


def records_with_deltas(deltas: list[int], codec: int = 0) -> bytes:
    body = b"".join(encode_record(d, 0, b"k", b"v", []) for d in deltas)
    if codec:
        body = bytes(R.cramjam.zstd.compress(body))
    return raw_batch(body, len(deltas), codec=codec)


@pytest.mark.parametrize("codec", [0, R.CODEC_ZSTD])
@pytest.mark.parametrize("deltas", [[0, 1, 7], [0, 0, 1], [1, 2, 3], [0, 2, 1], [0, -1, 2],
                                    [*range(150), 151, 151], [*range(99), 5]])
def test_offset_deltas_must_be_0_to_n_minus_1(deltas: list[int], codec: int) -> None:
    """R-LOG-3: a record offset delta past lastOffsetDelta, repeated, negative or out of
    order is INVALID_RECORD naming the records (Kafka: "inner records offset should always
    be continuous"); such a batch used to be stored and stall every consumer."""
    e = refused(records_with_deltas(deltas, codec))
    assert e.error_code == ErrorCode.invalid_record
    bad = [i for i, d in enumerate(deltas) if d != i]
    assert [i for i, _ in e.record_errors] == bad
    assert "record errors in total" in str(e)


def test_count_must_match_last_offset_delta_and_the_records() -> None:
    """R-LOG-3: Kafka's validateBatch: lastOffsetDelta + 1 == recordsCount, and the records
    block holds exactly recordsCount records."""
    body = b"".join(encode_record(i, 0, b"k", b"v", []) for i in range(3))
    assert refused(raw_batch(body, 3, last_delta=4)).error_code == ErrorCode.invalid_record
    assert refused(raw_batch(body, 4)).error_code == ErrorCode.invalid_record
    assert refused(raw_batch(body, 2)).error_code == ErrorCode.invalid_record
    check(raw_batch(body, 3))


@pytest.mark.parametrize("tail", [
    pytest.param(b"\x0c\x00\x00\x00", id="record-length-overruns"),
    pytest.param(b"\x01", id="record-too-short"),
    pytest.param(b"\xff\xff\xff\xff\xff\xff", id="length-varint-too-long"),
    pytest.param(b"\x0e\x00\x00\x06\x02k\x02v\x01", id="negative-header-count"),
    pytest.param(b"\x10\x00\x00\x06\x02k\x02v\x02\x01\x00", id="negative-header-key-length"),
    pytest.param(b"\x10\x00\x00\x06\x02k\x02v\x00\x00\x00", id="bytes-left-in-the-record"),
])
@pytest.mark.parametrize("good", [3, 200], ids=["loop", "numpy"])
def test_broken_record_framing_is_invalid_record(tail: bytes, good: int) -> None:
    """R-LOG-4: DefaultRecord.readFrom's checks: lengths that overrun, impossible sizes,
    negative header counts or header keys, bytes left over → INVALID_RECORD, with the
    index of the broken record (the last) in record_errors; both walkers (a plain loop for
    small batches, numpy for large ones) agree."""
    body = b"".join(encode_record(i, 0, b"k", b"v", [("h", b"x")] * (i % 2))
                    for i in range(good)) + tail
    e = refused(raw_batch(body, good + 1))
    assert e.error_code == ErrorCode.invalid_record
    assert e.record_errors and e.record_errors[0][0] == good, e.record_errors


def test_undecompressable_records_are_corrupt_message() -> None:
    """R-LOG-4: a compressed records block that does not decompress → CORRUPT_MESSAGE."""
    body = b"\x28\xb5\x2f\xfd" + b"garbage" * 5
    assert refused(raw_batch(body, 1, codec=R.CODEC_ZSTD)).error_code == (
        ErrorCode.corrupt_message)


def test_a_compression_bomb_is_refused_at_the_topic_cap() -> None:
    """R-NF-1: records inflating past 64 x max.message.bytes (at least 16 MiB) are
    INVALID_RECORD; a smaller max.message.bytes lowers the cap."""
    body = encode_record(0, 0, b"k", bytes(20 << 20), [])
    batch = raw_batch(bytes(R.cramjam.zstd.compress(body)), 1, codec=R.CODEC_ZSTD)
    check(batch, LogConfig(max_message_bytes=1 << 20))  # 64 MiB cap: fine
    e = refused(batch, LogConfig(max_message_bytes=100_000))  # 16 MiB cap
    assert e.error_code == ErrorCode.invalid_record and "inflate past" in str(e)
    assert R.inflate_limit(100_000) == 16 << 20 and R.inflate_limit(1 << 20) == 64 << 20


def test_compacted_topics_refuse_keyless_records_by_index() -> None:
    """R-LOG-6: Kafka's validateKey: a compacted topic refuses records without a key
    (INVALID_RECORD), naming each one in record_errors."""
    rows = [(b"k", b"v", NOW, []), (None, b"v", NOW, []), (b"k", b"v", NOW, []),
            (None, None, NOW, [])]
    batch = make_batch(rows, compression="lz4")  # type: ignore[arg-type]
    check(batch)
    e = refused(batch, LogConfig(cleanup_policy="compact"))
    assert e.error_code == ErrorCode.invalid_record
    assert [i for i, _ in e.record_errors] == [1, 3]


def test_create_time_out_of_range_is_invalid_timestamp() -> None:
    """KIP-937: a CreateTime timestamp more than message.timestamp.after.max.ms after the
    broker's clock, or more than before.max.ms before it, is INVALID_TIMESTAMP; the bounds
    themselves are accepted; -1 (no timestamp) is never checked; every bad record is
    named (Kafka's validateTimestamp / processRecordErrors)."""
    config = LogConfig(message_timestamp_before_max_ms=HOUR, message_timestamp_after_max_ms=HOUR)
    ok = [NOW - HOUR, NOW, NOW + HOUR]
    check(make_batch([(b"k", b"v", ts, []) for ts in ok]), config)
    stamps = [NOW, NOW + HOUR + 1, NOW - HOUR - 1, NOW + 10 * HOUR]
    e = refused(make_batch([(b"k", b"v", ts, []) for ts in stamps], compression="gzip"),
                config)
    assert e.error_code == ErrorCode.invalid_timestamp
    assert [i for i, _ in e.record_errors] == [1, 2, 3]
    assert f"should be within [{NOW - HOUR}, {NOW + HOUR}]" in e.record_errors[0][1]
    # the defaults: no lower bound, one hour ahead
    check(make_batch([(b"k", b"v", 0, [])]))
    assert refused(make_batch([(b"k", b"v", NOW + HOUR + 1, [])])).error_code == (
        ErrorCode.invalid_timestamp)
    # no timestamp (-1): not checked
    body = encode_record(0, 0, b"k", b"v", [])
    buf = bytearray(raw_batch(body, 1))
    struct.pack_into(">qq", buf, 27, -1, -1)
    check(with_crc(buf), config)


def test_a_lying_batch_max_timestamp_is_invalid_timestamp() -> None:
    """KIP-937: the header's maxTimestamp (what the time index and retention use) may not
    escape the bounds either, even when every record is in range."""
    body = encode_record(0, 0, b"k", b"v", [])
    buf = bytearray(raw_batch(body, 1))
    struct.pack_into(">q", buf, 35, NOW + 1000 * HOUR)  # maxTimestamp
    assert refused(with_crc(buf)).error_code == ErrorCode.invalid_timestamp
    check(raw_batch(body, 1))


def test_timestamp_errors_win_over_record_errors() -> None:
    """R-LOG-3, KIP-937: Kafka's processRecordErrors: INVALID_TIMESTAMP if any record's
    timestamp is bad,
    with every record error listed."""
    rows = [(None, b"v", NOW, []), (b"k", b"v", NOW + 10 * HOUR, [])]
    e = refused(make_batch(rows), LogConfig(cleanup_policy="compact"))  # type: ignore[arg-type]
    assert e.error_code == ErrorCode.invalid_timestamp
    assert [i for i, _ in e.record_errors] == [0, 1]


def test_log_append_time_topics_do_not_check_create_times() -> None:
    """KIP-937: the bounds apply to CreateTime topics only."""
    config = LogConfig(message_timestamp_type="LogAppendTime")
    check(make_batch([(b"k", b"v", NOW + 100 * HOUR, [])]), config)


def test_client_may_not_set_log_append_time() -> None:
    """R-LOG-3: Kafka: "Producer should not set timestamp type to LogAppendTime"."""
    batch = raw_batch(encode_record(0, 0, b"k", b"v", []), 1, attributes=R.TIMESTAMP_TYPE_BIT)
    assert refused(batch).error_code == ErrorCode.invalid_timestamp


def with_crc(buf: bytearray) -> bytes:
    struct.pack_into(">I", buf, R.CRC_POS, crc32c.crc32c(bytes(buf[R.ATTRIBUTES_POS:])))
    return bytes(buf)


def test_partition_log_appends_nothing_of_a_refused_batch(tmp_path: object) -> None:
    """R-LOG-3: append_as_leader calls the validator before offsets are assigned."""
    from pathlib import Path

    clock = ManualClock(wall_ms=NOW)
    log = PartitionLog.open(Path(str(tmp_path)) / "t-0", LogConfig(), clock)
    try:
        with pytest.raises(R.InvalidRecordError):
            log.append_as_leader(records_with_deltas([0, 1, 7]), leader_epoch=0)
        assert log.log_end_offset == 0
        assert log.append_as_leader(records_with_deltas([0, 1, 2]), 0).first_offset == 0
        assert log.log_end_offset == 3
    finally:
        log.close()


def _tiny_records(n: int) -> bytes:
    """``n`` minimal records (no key, no value, no headers): 7-9 bytes each."""
    from tests.batches import varint

    enc = [varint(i) for i in range(n)]
    return b"".join(varint(5 + len(e)) + b"\x00\x00" + e + b"\x01\x01\x00" for e in enc)


def test_chunk_boundaries_keep_absolute_record_indexes(monkeypatch: pytest.MonkeyPatch) -> None:
    """R-LOG-3: records are scanned a chunk at a time; errors in later chunks name the
    record's index in the batch, and both walkers (loop and numpy) cross chunks."""
    monkeypatch.setattr(R, "SCAN_CHUNK", 300)
    body = bytearray(_tiny_records(2500))
    check(raw_batch(bytes(body), 2500))
    rows = [encode_record(i if i != 1750 else 3, 0, b"k", b"v", []) for i in range(2500)]
    e = refused(raw_batch(b"".join(rows), 2500))
    assert e.error_code == ErrorCode.invalid_record
    assert [i for i, _ in e.record_errors] == [1750]
    broken = b"".join(rows[:2000]) + b"\x01" + b"".join(rows[2001:])
    e = refused(raw_batch(broken, 2500))
    assert e.record_errors[0][0] == 2000, e.record_errors
    stamps = [(b"k", b"v", NOW + (10 * HOUR if i in (601, 2499) else 0), []) for i in range(2500)]
    e = refused(make_batch(stamps))  # type: ignore[arg-type]
    assert e.error_code == ErrorCode.invalid_timestamp
    assert [i for i, _ in e.record_errors] == [601, 2499]
    assert list(R.record_timestamps(make_batch(stamps)))[2499] == (2499, NOW + 10 * HOUR)  # type: ignore[arg-type]


def test_a_batch_of_a_million_tiny_records_is_checked_in_bounded_memory() -> None:
    """R-NF-1: a batch may claim millions of 7-byte records (a 64 MiB records block holds
    9.6 M): scanning them a chunk at a time keeps numpy's arrays to a few MB, not ~15
    int64 per record at once (120 MB here); all-bad records are reported as a count and
    the first MAX_RECORD_ERRORS of them."""
    import tracemalloc

    from headrace.log import validator

    n = 1_000_000
    batch = raw_batch(_tiny_records(n), n)
    config = LogConfig(max_message_bytes=len(batch) + 1)
    tracemalloc.start()
    try:
        check(batch, config)
        e = refused(batch, LogConfig(max_message_bytes=len(batch) + 1, cleanup_policy="compact"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, peak
    assert e.error_code == ErrorCode.invalid_record
    assert len(e.record_errors) == validator.MAX_RECORD_ERRORS
    assert f"due to {n} record errors in total" in str(e)


_small_record = st.tuples(
    st.integers(-3, 3),  # offset delta: its index plus this (mostly 0)
    st.one_of(st.integers(-2 * HOUR, 2 * HOUR), st.sampled_from(
        [-NOW - 1, 2**63 - 1 - NOW, -(2**63) - NOW, 10**16])),  # timestamp delta
    st.one_of(st.none(), st.binary(max_size=4)),  # key
    st.one_of(st.none(), st.binary(max_size=8)),  # value
)


@settings(max_examples=400, deadline=None)
@given(records=st.lists(_small_record, min_size=1, max_size=R.SMALL_BATCH),
       compact=st.booleans(), log_append_time=st.booleans(),
       shift=st.sampled_from([0, 0, 0, 1, -1]),
       flip=st.one_of(st.none(), st.tuples(st.integers(0, 10**6), st.integers(1, 255))))
def test_a_small_batch_is_judged_as_the_numpy_path_judges_it(
        records: list[tuple[int, int, bytes | None, bytes | None]], compact: bool,
        log_append_time: bool, shift: int, flip: tuple[int, int] | None) -> None:
    """Batches of up to SMALL_BATCH records are checked by plain loops (numpy's fixed cost
    was most of a one-record Produce's validation): whatever the records, broken framing
    included, the outcome is the numpy path's, error code, message and record errors."""
    body = bytearray(b"".join(
        encode_record(i + (d if i % 3 == 0 else 0), t, k, v, [])
        for i, (d, t, k, v) in enumerate(records)))
    if flip is not None and body:  # a damaged byte: framing errors too
        body[flip[0] % len(body)] ^= flip[1]
    batch = raw_batch(bytes(body), max(len(records) + shift, 1))
    config = LogConfig(cleanup_policy="compact" if compact else "delete",
                       message_timestamp_type="LogAppendTime" if log_append_time
                       else "CreateTime")

    def outcome() -> tuple[int, str, tuple[tuple[int, str], ...]] | None:
        try:
            check(batch, config)
        except R.InvalidRecordError as e:
            return int(e.error_code), str(e), e.record_errors
        return None

    small = outcome()
    with patch.object(validator, "SMALL_BATCH", 0):  # every batch through numpy
        bulk = outcome()
    assert small == bulk


def test_a_ten_byte_timestamp_delta_wraps_to_int64_as_kafka_reads_it() -> None:
    """A timestamp delta varint of ten bytes whose high bits pass int64 (Java's
    readVarlong drops them) is read as int64, then judged: INVALID_TIMESTAMP, not an
    overflow escaping the validator (it closed the producer's connection)."""
    delta = bytes([0xFF] * 9 + [0x7F])  # 70 bits set: wraps to -(2**63) after zigzag
    body = b"\x00" + delta + b"\x00" + b"\x01" + b"\x01" + b"\x00"  # no key, no value
    batch = raw_batch(bytes([len(body) * 2]) + body, 1)
    assert refused(batch).error_code == ErrorCode.invalid_timestamp
