"""RecordBatch v2 parsing, validation and rewrites (R-LOG-3, R-LOG-4)."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import crc32c
import pytest
from aiokafka.record.default_records import (  # type: ignore[import-untyped]
    DefaultRecordBatch,
    DefaultRecordBatchBuilder,
)
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from tests.batches import make_batch, simple_batch

from headrace.protocol import records as R

MAX = 1_000_000
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def aiokafka_batch(
    rows: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]],
    codec: int = 0, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=0, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence, batch_size=10**7,
    )
    for i, (key, value, ts, headers) in enumerate(rows):
        builder.append(i, timestamp=ts, key=key, value=value, headers=headers)
    return bytes(builder.build())


def _code(excinfo: pytest.ExceptionInfo[R.InvalidRecordError]) -> ErrorCode:
    return excinfo.value.error_code


def test_header_offsets_are_kafkas() -> None:
    """R-LOG-3: the 61-byte header and the positions of the rewritten fields."""
    assert R.HEADER_SIZE == 61
    assert (R.LENGTH_POS, R.PARTITION_LEADER_EPOCH_POS, R.MAGIC_POS, R.CRC_POS,
            R.ATTRIBUTES_POS, R.MAX_TIMESTAMP_POS) == (8, 12, 16, 17, 21, 35)


def test_encoder_matches_aiokafka() -> None:
    """The test encoder produces the same bytes as aiokafka's builder (independent check)."""
    rows = [
        (b"k1", b"value-1", 1_700_000_000_000, [("h", b"x"), ("n", None)]),
        (None, b"v2", 1_700_000_000_005, []),
        (b"k3", None, 1_700_000_000_002, []),
    ]
    ours = make_batch(rows, producer_id=7, producer_epoch=1, base_sequence=3)
    theirs = aiokafka_batch(rows, producer_id=7, producer_epoch=1, base_sequence=3)
    assert ours == theirs


def test_split_batches_reads_every_header() -> None:
    """R-LOG-4: a request of several valid batches splits into their headers."""
    blob = simple_batch(3) + simple_batch(1, ts=5_000) + simple_batch(2)
    headers = R.split_batches(blob, MAX)
    assert [h.records_count for h in headers] == [3, 1, 2]
    assert [h.position for h in headers] == [0, headers[0].size, headers[0].size + headers[1].size]
    assert headers[1].max_timestamp == 5_000
    assert sum(h.size for h in headers) == len(blob)
    assert headers[0].last_offset_delta == 2 and headers[0].next_offset == 3


def test_crc_corruption_is_corrupt_message() -> None:
    """R-LOG-4: a flipped bit anywhere after the CRC field → CORRUPT_MESSAGE."""
    batch = bytearray(simple_batch(3))
    batch[-1] ^= 0x01
    with pytest.raises(R.InvalidRecordError) as e:
        R.split_batches(bytes(batch), MAX)
    assert _code(e) == ErrorCode.corrupt_message
    assert "CRC" in str(e.value)


def _legacy_message(magic: int) -> bytes:
    # offset int64, size int32, crc int32, magic int8, attributes int8, key -1, value -1
    body = struct.pack(">bbii", magic, 0, -1, -1)
    return struct.pack(">qiI", 0, len(body) + 4, 0) + body


@pytest.mark.parametrize("magic", [0, 1])
def test_old_magic_is_invalid_record(magic: int) -> None:
    """R-LOG-3: magic 0/1 message sets are rejected with INVALID_RECORD, as Kafka's
    ProduceRequest.validateRecords answers produce v3+ ("only allowed to contain record
    batches with magic version 2")."""
    message = _legacy_message(magic)
    with pytest.raises(R.InvalidRecordError) as e:
        R.split_batches(message, MAX)
    assert _code(e) == ErrorCode.invalid_record
    with pytest.raises(R.InvalidRecordError) as e:
        R.check_produce_records(message)
    assert _code(e) == ErrorCode.invalid_record


@pytest.mark.parametrize(
    ("blob", "code"),
    [
        (None, ErrorCode.invalid_record),  # null records
        (b"", ErrorCode.invalid_record),  # no batch
        (simple_batch(2)[:-1], ErrorCode.invalid_record),  # torn: no whole batch
        (simple_batch(2)[:30], ErrorCode.invalid_record),  # torn header
        (simple_batch(2) + simple_batch(1), ErrorCode.invalid_record),  # two batches
        (_legacy_message(1), ErrorCode.invalid_record),
        (simple_batch(2)[:8] + struct.pack(">i", 10) + simple_batch(2)[12:],
         ErrorCode.corrupt_message),  # batchLength below any record's overhead
        (simple_batch(2)[:16] + b"\x07" + simple_batch(2)[17:], ErrorCode.corrupt_message),
    ],
)
def test_produce_records_are_exactly_one_batch(blob: bytes | None, code: ErrorCode) -> None:
    """R-LOG-3/R-LOG-4: Kafka's ProduceRequest.validateRecords (v3+) as its batch iterator
    sees the bytes: no whole batch, a second whole batch or magic 0/1 → INVALID_RECORD; an
    impossible length or magic → CORRUPT_MESSAGE."""
    with pytest.raises(R.InvalidRecordError) as e:
        R.check_produce_records(blob)
    assert _code(e) == code


def test_produce_records_ignore_a_torn_tail() -> None:
    """R-LOG-3: Kafka's iterator stops before bytes that are not a whole batch and the log trims
    them: the request's one batch is what is appended."""
    one = simple_batch(2)
    assert R.check_produce_records(one) == len(one)
    assert R.check_produce_records(one + simple_batch(3)[:40]) == len(one)
    assert R.check_produce_records(one + b"\x00" * 5) == len(one)


def test_oversize_batch_is_message_too_large() -> None:
    """R-LOG-3: a batch larger than max.message.bytes → MESSAGE_TOO_LARGE."""
    batch = simple_batch(10, value_size=100)
    R.split_batches(batch, len(batch))
    with pytest.raises(R.InvalidRecordError) as e:
        R.split_batches(batch, len(batch) - 1)
    assert _code(e) == ErrorCode.message_too_large


@pytest.mark.parametrize(
    "blob",
    [
        simple_batch(2)[:-1],  # torn
        simple_batch(2)[:30],  # torn header
        simple_batch(2) + b"\x00" * 5,  # trailing bytes
        simple_batch(2) + simple_batch(1)[:70],  # torn second batch
    ],
)
def test_torn_or_trailing_bytes_are_corrupt_message(blob: bytes) -> None:
    """R-LOG-4: the log's own split: incomplete batches or bytes after the last batch →
    CORRUPT_MESSAGE (a produce request's records are first cut to their one whole batch by
    check_produce_records, which answers INVALID_RECORD as Kafka does)."""
    with pytest.raises(R.InvalidRecordError) as e:
        R.split_batches(blob, MAX)
    assert _code(e) == ErrorCode.corrupt_message


def test_empty_records_are_invalid_record() -> None:
    """R-LOG-3: no batch at all → INVALID_RECORD ("at least one record batch")."""
    with pytest.raises(R.InvalidRecordError) as e:
        R.split_batches(b"", MAX)
    assert _code(e) == ErrorCode.invalid_record


def _patched(batch: bytes, fmt: str, pos: int, value: int) -> bytes:
    buf = bytearray(batch)
    struct.pack_into(fmt, buf, pos, value)
    struct.pack_into(">I", buf, R.CRC_POS, crc32c.crc32c(bytes(buf[R.ATTRIBUTES_POS:])))
    return bytes(buf)


def test_inconsistent_lengths_are_corrupt_message() -> None:
    """R-LOG-4: a batchLength smaller than a header → CORRUPT_MESSAGE."""
    batch = _patched(simple_batch(2), ">i", R.LENGTH_POS, 10)
    with pytest.raises(R.InvalidRecordError) as e:
        R.split_batches(batch, MAX)
    assert _code(e) == ErrorCode.corrupt_message


def test_zero_records_or_negative_delta_is_invalid_record() -> None:
    """R-LOG-3: well-formed but unacceptable batches → INVALID_RECORD."""
    count_pos = R.HEADER_SIZE - 4
    delta_pos = R.ATTRIBUTES_POS + 2
    for fmt, pos, value in ((">i", count_pos, 0), (">i", delta_pos, -1)):
        with pytest.raises(R.InvalidRecordError) as e:
            R.split_batches(_patched(simple_batch(2), fmt, pos, value), MAX)
        assert _code(e) == ErrorCode.invalid_record


def test_rewrites_keep_the_batch_valid() -> None:
    """R-LOG-3: base offset and leader epoch are rewritten outside the CRC; LogAppendTime
    sets the timestamp type and maxTimestamp and recomputes the CRC."""
    blob = simple_batch(3) + simple_batch(2)
    headers = R.split_batches(blob, MAX)
    buf = bytearray(blob)
    R.set_base_offset(buf, headers[1], 1234)
    R.set_partition_leader_epoch(buf, headers[1], 9)
    R.set_log_append_time(buf, headers[1], 42_000)
    again = R.split_batches(bytes(buf), MAX)  # CRCs still valid
    assert again[0] == headers[0]
    h = again[1]
    assert (h.base_offset, h.partition_leader_epoch, h.max_timestamp) == (1234, 9, 42_000)
    assert h.is_log_append_time
    parsed = DefaultRecordBatch(bytes(buf[h.position:]))
    assert parsed.validate_crc()
    assert [(r.offset, r.timestamp) for r in parsed] == [(1234, 42_000), (1235, 42_000)]
    assert list(R.record_timestamps(bytes(buf[h.position:]))) == [(1234, 42_000), (1235, 42_000)]


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_record_timestamps_decompresses_each_codec(codec: str) -> None:
    """R-LOG-3: timestamps of compressed batches written by a real client library."""
    rows: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]] = [
        (b"key", b"same value " * 20, 1_000 + 3 * i, []) for i in range(20)
    ]
    batch = aiokafka_batch(rows, codec=CODECS[codec])
    header = R.read_header(batch)
    assert header.compression == CODECS[codec]
    assert list(R.record_timestamps(batch)) == [(i, 1_000 + 3 * i) for i in range(20)]


def test_raw_snappy_is_accepted() -> None:
    """librdkafka may write unframed snappy; the Java client writes xerial framing."""
    batch = simple_batch(5, compression="snappy")
    assert list(R.record_timestamps(batch)) == [(i, 1_000 + i) for i in range(5)]


def test_last_sequence_wraps() -> None:
    """R-PROTO-7: sequences wrap from 2**31-1 to 0."""
    h = R.read_header(simple_batch(3, base_sequence=2**31 - 2, producer_id=1, producer_epoch=0))
    assert h.last_sequence == 0
    assert R.increment_sequence(2**31 - 1, 1) == 0


def test_iter_batches_stops_quietly_before_a_partial_batch() -> None:
    """A fetch response may end in a partial batch; iter_batches yields the whole ones."""
    blob = simple_batch(3) + simple_batch(2)
    assert [h.records_count for h in R.iter_batches(blob)] == [3, 2]
    assert [h.records_count for h in R.iter_batches(blob[:-1])] == [3]
    assert [h.records_count for h in R.iter_batches(blob[: len(simple_batch(3)) + 20])] == [3]


def test_whole_batches_length_stops_before_a_partial_batch() -> None:
    blob = simple_batch(3) + simple_batch(2)
    first = len(simple_batch(3))
    assert R.whole_batches_length(blob) == len(blob)
    assert R.whole_batches_length(blob[:-1]) == first
    assert R.whole_batches_length(blob[:5]) == 0


def test_records_in_batches_counts_whole_v2_batches_from_their_headers() -> None:
    """The Fetch path's records-out count: each whole batch's record count, none of a
    partial batch, nothing past a batch that is not v2 (read from the headers alone)."""
    blob = simple_batch(3) + simple_batch(2) + simple_batch(7)
    assert R.records_in_batches(blob) == 12
    assert R.records_in_batches(memoryview(blob)[:-1]) == 5
    assert R.records_in_batches(blob[:40]) == 0
    assert R.records_in_batches(b"") == 0
    first = len(simple_batch(3))
    not_v2 = bytearray(blob)
    not_v2[first + R.MAGIC_POS] = 1
    assert R.records_in_batches(not_v2) == 3
    assert R.records_in_batches(blob) == sum(h.records_count for h in R.iter_batches(blob))


@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=20)),
            st.one_of(st.none(), st.binary(max_size=200)),
            st.integers(0, 2**40),
        ),
        min_size=1, max_size=30,
    ),
    st.sampled_from([None, "gzip", "snappy", "lz4", "zstd"]),
)
def test_record_timestamps_roundtrip(
    rows: list[tuple[bytes | None, bytes | None, int]], codec: str | None
) -> None:
    """R-LOG-3: every record's (offset, timestamp) decodes back, for any codec."""
    batch = make_batch([(k, v, ts, []) for k, v, ts in rows], compression=codec)
    (header,) = R.split_batches(batch, 10**7)
    assert header.max_timestamp == max(ts for _, _, ts in rows)
    assert list(R.record_timestamps(batch)) == [(i, ts) for i, (_, _, ts) in enumerate(rows)]


@given(st.binary(max_size=300))
def test_garbage_never_escapes_as_another_error(data: bytes) -> None:
    """Any bytes either split or raise InvalidRecordError, never anything else."""
    with contextlib.suppress(R.InvalidRecordError):
        R.split_batches(data, MAX)


def test_build_batch_and_decode_records_round_trip_against_aiokafka() -> None:
    """The broker's own encoder (for __consumer_offsets) reads back with aiokafka."""
    from aiokafka.record.default_records import DefaultRecordBatch

    from headrace.protocol.records import build_batch, decode_records, split_batches

    raw = build_batch([(b"k1", b"v1"), (None, b"v2"), (b"k3", None)], 1_700_000_000_123,
                      base_offset=40, offset_deltas=[0, 3, 7])
    split_batches(raw, 1 << 20)  # valid CRC and lengths
    got = [(r.offset, r.key, r.value, r.timestamp) for r in decode_records(raw)]
    assert got == [(40, b"k1", b"v1", 1_700_000_000_123), (43, None, b"v2", 1_700_000_000_123),
                   (47, b"k3", None, 1_700_000_000_123)]
    theirs = DefaultRecordBatch(raw)
    assert [(r.offset, r.key, r.value) for r in theirs] == [(o, k, v) for o, k, v, _ in got]


def test_decode_records_with_headers_and_compression() -> None:
    from tests.batches import make_batch

    from headrace.protocol.records import decode_records

    for codec in (None, "gzip", "snappy", "lz4", "zstd"):
        raw = make_batch([(b"k", b"v", 5, [("h", b"x"), ("n", None)]), (None, None, 9, [])],
                         base_offset=3, compression=codec)
        recs = decode_records(raw)
        assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in recs] == [
            (3, 5, b"k", b"v", (("h", b"x"), ("n", None))), (4, 9, None, None, ())]


BOMB = Path(__file__).parents[1] / "fuzz" / "corpus" / "batches" / (
    "invalid_record--zstd-bomb-1.5GiB.bin")


def test_decompression_is_bounded_and_a_bomb_is_refused() -> None:
    """R-NF-1 (issue 8): a 48 KB zstd batch inflating to 1.5 GiB is refused with
    INVALID_RECORD after at most the cap is written (not 1.5 GiB), quickly; the timestamp
    search answers such a stored batch at batch level instead of failing."""
    import resource
    import time

    bomb = BOMB.read_bytes()
    h = R.read_header(bomb)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with pytest.raises(R.InvalidRecordError) as e:
        R.inflate(h.compression, memoryview(bomb)[R.HEADER_SIZE:], 1 << 20)
    assert _code(e) == ErrorCode.invalid_record
    with pytest.raises(R.InvalidRecordError):
        R.decode_records(bomb)
    assert list(R.record_timestamps(bomb)) == [(h.base_offset, h.max_timestamp)]
    assert time.monotonic() - start < 5
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < R.DEFAULT_INFLATE_LIMIT / 2**20 + 32, grown_mb


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_inflate_limit_is_exact(codec: str) -> None:
    """R-NF-1: the cap admits records of exactly ``limit`` bytes, refuses one byte more."""
    from tests.batches import compress

    data = bytes(range(256)) * 40
    block = compress(codec, data)
    assert bytes(R.inflate(CODECS[codec], block, len(data))) == data
    with pytest.raises(R.InvalidRecordError) as e:
        R.inflate(CODECS[codec], block, len(data) - 1)
    assert _code(e) == ErrorCode.invalid_record


def test_xerial_snappy_chunks_are_checked_before_decompressing() -> None:
    """R-NF-1: Java's xerial snappy framing: each chunk's length and claimed output are
    checked before it is decompressed."""
    import cramjam

    data = b"abc" * 1000
    chunk = bytes(cramjam.snappy.compress_raw(data))
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    good = framed + struct.pack(">i", len(chunk)) + chunk
    assert bytes(R.inflate(R.CODEC_SNAPPY, good)) == data
    assert bytes(R.inflate(R.CODEC_SNAPPY, good + struct.pack(">i", len(chunk)) + chunk)) == (
        data * 2)
    for bad, code in [
        (framed + struct.pack(">i", 2**31 - 1) + chunk, ErrorCode.corrupt_message),  # torn
        (framed + struct.pack(">i", -5) + chunk, ErrorCode.corrupt_message),
        (framed + b"\x00\x00", ErrorCode.corrupt_message),
        (good, ErrorCode.invalid_record),  # over a tiny cap
    ]:
        with pytest.raises(R.InvalidRecordError) as e:
            R.inflate(R.CODEC_SNAPPY, bad, 100 if bad is good else R.DEFAULT_INFLATE_LIMIT)
        assert _code(e) == code


def test_scan_records_walks_every_record_in_bulk() -> None:
    """R-LOG-3: the bulk walker reads each record's fields, headers included, and names the
    first broken record."""
    rows: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]] = [
        (None if i % 4 == 0 else b"k%d" % i, None if i % 5 == 0 else b"v" * (i % 200),
         1_000 + 7 * i, [(f"h{j}", b"x" * j) for j in range(i % 3)])
        for i in range(500)
    ]
    batch = make_batch(rows)
    h = R.read_header(batch)
    scan = R.scan_records(memoryview(batch)[R.HEADER_SIZE:], h.records_count)
    assert scan.offset_delta.tolist() == list(range(500))
    assert scan.timestamp_delta.tolist() == [7 * i for i in range(500)]
    assert scan.key_length.tolist() == [-1 if k is None else len(k) for k, _, _, _ in rows]
    assert scan.value_length.tolist() == [-1 if v is None else len(v) for _, v, _, _ in rows]
    assert scan.header_count.tolist() == [i % 3 for i in range(500)]
    body = bytearray(batch[R.HEADER_SIZE:])
    with pytest.raises(R.InvalidRecordError) as e:
        R.scan_records(bytes(body[:-1]), 500)
    assert _code(e) == ErrorCode.invalid_record and e.value.record_errors[0][0] == 499
    with pytest.raises(R.InvalidRecordError) as e:
        R.scan_records(bytes(body), 501)
    assert _code(e) == ErrorCode.invalid_record
