"""The bulk record-batch decoder of the Spark source's wire reader, against tests/batches.py."""

from __future__ import annotations

from typing import Any

import pytest

# the decoder builds Arrow batches: without the spark extra (pyarrow, numpy) this module is
# skipped, visibly, instead of failing collection (under CI an unexpected skip fails the run,
# and the README's test command installs the extra)
NO_SPARK_EXTRA = "the spark extra is not installed (pip install -e '.[spark]')"
pytest.importorskip("numpy", reason=NO_SPARK_EXTRA)
pytest.importorskip("pyarrow", reason=NO_SPARK_EXTRA)

from tests.batches import Record, make_batch  # noqa: E402

from headrace.protocol.records import InvalidRecordError  # noqa: E402
from headrace.spark.batch_decode import decode_fetched  # noqa: E402
from headrace.spark.kafka_io import arrow_schema  # noqa: E402

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


@pytest.fixture(autouse=True, params=["c", "numpy"])
def _fields_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test twice: the records' fields read by the C pass (where it was built) and by
    numpy alone."""
    from headrace import speedups

    if request.param == "numpy":
        monkeypatch.setattr(speedups, "native", None)
    elif speedups.native is None:
        pytest.skip("headrace._speedups was not built here")


def decode(blob: bytes, start: int = 0, until: int = 1 << 62,
           headers: bool = True) -> tuple[list[dict[str, Any]], int]:
    batch, nxt = decode_fetched(blob, start, until, "t", 3, arrow_schema(headers), headers)
    return ([] if batch is None else batch.to_pylist()), nxt


def expected(records: list[Record], base: int, headers: bool = True) -> list[dict[str, Any]]:
    out = []
    for i, (k, v, _ts, hs) in enumerate(records):
        row: dict[str, Any] = {"key": k, "value": v, "topic": "t", "partition": 3,
                               "offset": base + i, "timestampType": 0}
        if headers:
            row["headers"] = [{"key": hk, "value": hv} for hk, hv in hs]
        out.append(row)
    return out


def ms(row: dict[str, Any]) -> int:
    return round(float(row["timestamp"].timestamp()) * 1000)


def strip_ts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "timestamp"} for r in rows]


MIXED: list[Record] = [
    (b"k1", b"v" * 300, 1_000, []),
    (None, b"short", 1_005, [("h", b"x"), ("empty", None)]),
    (b"a-longer-key-than-twelve", None, 999, []),
    (None, None, 1_010, []),
    (b"", b"", 1_011, [("u\u00e9", b"")]),
    (b"k" * 12, b"v" * 13, 1_012, []),
]


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_keys_values_headers_nulls(codec: str | None) -> None:
    blob = make_batch(MIXED, base_offset=40, compression=codec)
    rows, nxt = decode(blob)
    assert strip_ts(rows) == expected(MIXED, 40)
    assert [ms(r) for r in rows] == [r[2] for r in MIXED]
    assert nxt == 40 + len(MIXED)


@pytest.mark.parametrize("codec", CODECS)
def test_uniform_records_many_batches_and_range_cut(codec: str | None) -> None:
    recs: list[Record] = [(None, b"%06d" % i + b"x" * 94, 5_000 + i, []) for i in range(300)]
    blob = b"".join(make_batch(recs[i:i + 100], base_offset=i, compression=codec)
                    for i in range(0, 300, 100))
    rows, nxt = decode(blob, headers=False)
    assert strip_ts(rows) == expected(recs, 0, headers=False)
    rows, nxt = decode(blob, start=150, until=250, headers=False)
    assert [r["offset"] for r in rows] == list(range(150, 250))
    assert rows[0]["value"] == recs[150][1]
    assert nxt == 250


def test_without_headers_column_and_all_null_keys() -> None:
    recs: list[Record] = [(None, b"v%d" % i, 7, [("h", b"1")]) for i in range(5)]
    rows, _ = decode(make_batch(recs), headers=False)
    assert rows == [{**r, "timestamp": rows[0]["timestamp"]} for r in expected(recs, 0, False)]


def test_torn_last_batch_and_batches_before_the_start() -> None:
    a = make_batch([(None, b"a", 1, [])] * 3, base_offset=0)
    b = make_batch([(None, b"b", 1, [])] * 3, base_offset=3)
    rows, nxt = decode(a + b[:-5], start=1)
    assert [r["offset"] for r in rows] == [1, 2] and nxt == 3
    rows, nxt = decode(a + b, start=3)
    assert [r["offset"] for r in rows] == [3, 4, 5] and nxt == 6
    assert decode(b"", start=9) == ([], 9)


def test_control_batch_is_skipped_but_counted() -> None:
    ctrl = bytearray(make_batch([(b"\x00\x00\x00\x00", b"\x00" * 6, 1, [])], base_offset=2))
    ctrl[22] |= 0x20  # attributes low byte: control bit (CRC is not checked here)
    data = make_batch([(None, b"x", 1, [])] * 2, base_offset=0) + bytes(ctrl)
    rows, nxt = decode(data)
    assert [r["offset"] for r in rows] == [0, 1] and nxt == 3
    assert decode(bytes(ctrl), start=2) == ([], 3)


def test_log_append_time() -> None:
    blob = bytearray(make_batch([(None, b"x", 1, []), (None, b"y", 2, [])]))
    blob[22] |= 0x08
    rows, _ = decode(bytes(blob))
    assert [r["timestampType"] for r in rows] == [1, 1]
    assert [ms(r) for r in rows] == [2, 2]  # maxTimestamp


def test_corrupt_records_raise() -> None:
    blob = bytearray(make_batch([(None, b"abcdef", 1, [])] * 3))
    blob[61] = 0x7E  # first record length: far too long
    with pytest.raises(InvalidRecordError):
        decode(bytes(blob))


def test_bytes_left_after_the_records_are_corrupt() -> None:
    """A batch whose records block holds more bytes than its records (the count satisfied
    before the end) is refused, not read as if the rest were not there."""
    import struct

    import crc32c

    from headrace.protocol.records import ATTRIBUTES_POS, CRC_POS, LENGTH_POS

    blob = bytearray(make_batch([(None, b"abcdef", 1, [])] * 3) + b"\x00\x00")
    struct.pack_into(">i", blob, LENGTH_POS, len(blob) - 12)
    struct.pack_into(">I", blob, CRC_POS, crc32c.crc32c(bytes(blob[ATTRIBUTES_POS:])))
    with pytest.raises(InvalidRecordError):
        decode(bytes(blob))


def _bodies(batches: list[bytes]) -> tuple[Any, Any, Any, Any, bytes]:
    """What decode_fetched builds from uncompressed batches: the records regions back to
    back (then PAD zero bytes), their positions, lengths and record counts."""
    import numpy as np

    from headrace.protocol.records import HEADER_SIZE, read_header
    from headrace.spark.batch_decode import PAD

    bodies = [b[HEADER_SIZE:] for b in batches]
    lengths = np.array([len(x) for x in bodies], dtype=np.int64)
    counts = np.array([read_header(b).records_count for b in batches], dtype=np.int64)
    data = b"".join(bodies) + bytes(PAD)
    return np.frombuffer(data, dtype=np.uint8), np.cumsum(lengths) - lengths, lengths, \
        counts, data


def test_producer_batches_have_their_record_starts_predicted() -> None:
    """issue 24: a producer's batches (offset deltas 0, 1, 2, ..., one timestamp, values of
    one size) get every record start from one vectorised prediction and check, not a walk
    of the length varints: the starts must be exactly the walk's, across the offset
    delta's varint growing at 64 and at 8,192 records."""
    from headrace.protocol import records as rec
    from headrace.spark.batch_decode import predicted_starts

    batches, base = [], 0
    for n, size in ((1, 100), (63, 100), (64, 7), (65, 300), (9000, 20), (200, 0)):
        batches.append(make_batch([(None, b"v" * size, 1_000, [])] * n, base_offset=base))
        base += n
    arr, pos, lengths, counts, data = _bodies(batches)
    got = predicted_starts(arr, pos, lengths, counts)
    assert got is not None, "a producer's batches should be predicted"
    walked, _ = rec.record_starts(memoryview(data)[:-16], arr[:-16], int(counts.sum()), 0)
    assert got.tolist() == walked.tolist()
    rows, nxt = decode(b"".join(batches), headers=False)
    assert nxt == base and [r["offset"] for r in rows] == list(range(base))
    assert [len(r["value"]) for r in rows[:129]] == [100] * 64 + [7] * 64 + [300]


def test_record_starts_that_cannot_be_predicted_are_walked() -> None:
    """Records whose sizes change otherwise (keys, values, headers, growing timestamp
    deltas) are not predicted (None), and decode as before."""
    from headrace.spark.batch_decode import predicted_starts

    growing = [(None, b"x" * 50, 1_000 + i, []) for i in range(100)]  # ts delta 64 → 2 bytes
    mixed_sizes = [(None, b"x" * (50 if i != 30 else 51), 1_000, []) for i in range(100)]
    for recs in (MIXED, growing, mixed_sizes):
        batch = make_batch(recs, base_offset=0)
        arr, pos, lengths, counts, _ = _bodies([batch])
        assert predicted_starts(arr, pos, lengths, counts) is None
        rows, _ = decode(batch)
        assert [r["value"] for r in rows] == [v for _, v, _, _ in recs]

