"""The C check of produced records (``headrace._speedups.records_ok``, issue 24) against
the Python validator it stands in front of (``headrace/log/validator.py``).

``records_ok`` may only say True when the Python paths accept the batch (R-LOG-3, R-LOG-4:
every record validated before it is stored); it should say True whenever they do, or the
fast path is never taken. Both directions are checked here on records of every shape
(null keys and values, headers, multi-byte varints, extreme timestamps, wrong offset
deltas, counts, damaged bytes, truncations), for the plain-loop, the numpy-walk and the
numpy-guess sizes of the Python path.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from unittest.mock import patch

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.batches import varint

from headrace.config import LogConfig
from headrace.log import validator
from headrace.protocol import records as R

speedups = validator._speedups
pytestmark = pytest.mark.skipif(speedups is None and os.environ.get("CI") != "true",
                                reason="headrace._speedups was not built here")

NOW = 1_700_000_000_000
HOUR = 3_600_000


def test_the_extension_is_built_where_ci_runs() -> None:
    """CI installs with a C compiler: the fast path must be there, not silently absent
    (``setup.py`` makes the extension optional for machines without one)."""
    assert speedups is not None
    assert validator._speedups is speedups


Header = tuple[bytes | None, bytes | None]


def _field(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def _record(offset_delta: int, ts_delta: int, key: bytes | None, value: bytes | None,
            headers: list[Header]) -> bytes:
    body = b"\x00" + varint(ts_delta) + varint(offset_delta) + _field(key) + _field(value)
    body += varint(len(headers)) + b"".join(_field(k) + _field(v) for k, v in headers)
    return varint(len(body)) + body


def _python_accepts(batch: bytes, config: LogConfig, now: int) -> bool:
    with patch.object(validator, "_speedups", None):
        try:
            validator.validate_batches(batch, R.split_batches(batch, 10**8), config, now)
        except R.InvalidRecordError:
            return False
    return True


def _c_accepts(batch: bytes, config: LogConfig, now: int) -> bool:
    """What validate_batches asks records_ok, from the same header and config."""
    assert speedups is not None
    (h,) = R.split_batches(batch, 10**8)
    lo = max(now - config.message_timestamp_before_max_ms, -(2**63))
    hi = min(now + config.message_timestamp_after_max_ms, 2**63 - 1)
    flags = speedups.CHECK_OFFSETS
    if config.message_timestamp_type != validator.LOG_APPEND_TIME:
        flags |= speedups.CHECK_TIMES
    if config.compact:
        flags |= speedups.REQUIRE_KEYS
    return bool(speedups.records_ok(memoryview(batch)[R.HEADER_SIZE:], h.records_count,
                                    h.base_timestamp, lo, hi, flags))


def _batch(body: bytes, count: int, base_ts: int = NOW) -> bytes:
    buf = bytearray(R.HEADER_SIZE) + body
    R.HEADER.pack_into(buf, 0, 0, len(buf) - R.LOG_OVERHEAD, -1, 2, 0, 0, max(count - 1, 0),
                       base_ts, base_ts, -1, -1, -1, count)
    struct.pack_into(">I", buf, R.CRC_POS, crc32c.crc32c(memoryview(buf)[R.ATTRIBUTES_POS:]))
    return bytes(buf)


_headers = st.lists(st.tuples(st.one_of(st.just(None), st.binary(max_size=3)),
                              st.one_of(st.none(), st.binary(max_size=5))), max_size=3)
_record_st = st.tuples(
    st.one_of(st.integers(-2 * HOUR, 2 * HOUR), st.just(-NOW - 1)),  # timestamp delta (-1)
    st.one_of(st.none(), st.binary(max_size=4), st.just(b"k" * 70)),  # key
    st.one_of(st.none(), st.binary(max_size=8), st.just(b"v" * 200)),  # value
    st.one_of(st.just([]), _headers),
)
_configs = st.builds(
    LogConfig,
    cleanup_policy=st.sampled_from(["delete", "delete", "compact"]),
    message_timestamp_type=st.sampled_from(["CreateTime", "CreateTime", "LogAppendTime"]),
)
_breakage = st.one_of(
    st.just(None), st.just(None), st.just(None),
    st.tuples(st.just("offset delta"), st.integers(0, 10**6),
              st.sampled_from([1, -1, 64, -(2**31)])),
    st.tuples(st.just("timestamp"), st.integers(0, 10**6),
              st.sampled_from([1 << 40, 2**63 - 1 - NOW, -(2**63) - NOW, 10**16, -NOW - 2])),
    st.tuples(st.just("count"), st.sampled_from([1, -1, -5])),
    st.tuples(st.just("cut"), st.integers(-8, 8).filter(bool)),
    st.tuples(st.just("damage"), st.lists(st.tuples(st.integers(0, 10**7),
                                                    st.integers(1, 255)), min_size=1,
                                          max_size=3)),
)


@settings(max_examples=600, deadline=None)
@given(records=st.lists(_record_st, min_size=1, max_size=12),
       repeat=st.sampled_from([1, 1, 1, 10, 120]), config=_configs, breakage=_breakage)
def test_records_ok_agrees_with_the_python_validator(
        records: list[tuple[int, bytes | None, bytes | None, list[Header]]], repeat: int,
        config: LogConfig, breakage: tuple[object, ...] | None) -> None:
    """Whatever the records (up to 1,440 per batch: every size class of the Python path),
    well formed or broken one way (an offset delta, a timestamp, the count, a cut or
    padded end, damaged bytes), the C check accepts exactly the batches the Python
    validator accepts."""
    rows = records * repeat
    kind, *args = breakage if breakage is not None else (None,)
    at = int(args[0]) % len(rows) if kind in ("offset delta", "timestamp") else -1  # type: ignore[call-overload]
    body = bytearray(b"".join(
        _record(i + (int(args[1]) if i == at and kind == "offset delta" else 0),  # type: ignore[call-overload]
                int(args[1]) if i == at and kind == "timestamp" else t, k, v, hs)  # type: ignore[call-overload]
        for i, (t, k, v, hs) in enumerate(rows)))
    count = len(rows)
    if kind == "count":
        count = max(count + int(args[0]), 1)  # type: ignore[call-overload]  # 0: refused before
    if kind == "cut":
        cut = int(args[0])  # type: ignore[call-overload]
        body = body[:len(body) + cut] if cut < 0 else body + bytes(cut)
    if kind == "damage":
        for pos, bits in args[0]:  # type: ignore[attr-defined]
            body[pos % len(body)] ^= bits
    batch = _batch(bytes(body), count)
    c = _c_accepts(batch, config, NOW)
    py = _python_accepts(batch, config, NOW)
    assert c == py, (c, py)


def _tiny_batches() -> Iterator[tuple[str, bytes]]:
    yield "one record", _batch(_record(0, 0, b"k", b"v", []), 1)
    body = b"".join(_record(i, i, None, b"x" * 100, [(b"h", None)]) for i in range(5000))
    yield "5,000 records with a header each", _batch(body, 5000)
    body = b"".join(_record(i, 0, b"key", bytes(1024), []) for i in range(300))
    yield "300 records of 1 KiB", _batch(body, 300)


@pytest.mark.parametrize("name,batch", list(_tiny_batches()), ids=lambda x: str(x)[:20])
def test_good_batches_take_the_fast_path(name: str, batch: bytes,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Ordinary batches are accepted by the C check alone: the Python paths are not run."""
    calls: list[object] = []

    def record(*a: object) -> None:
        calls.append(a)

    monkeypatch.setattr(validator, "iter_record_scans", record)
    monkeypatch.setattr(validator, "scan_small_records", record)
    validator.validate_batches(batch, R.split_batches(batch, 10**8), LogConfig(), NOW)
    assert calls == []


def _padded(value: int, size: int) -> bytes:
    """``value``'s zigzag varint in exactly ``size`` bytes (high groups of zero bits)."""
    z = (value << 1) ^ (value >> 63)
    return bytes([((z >> (7 * i)) & 0x7F) | (0x80 if i < size - 1 else 0) for i in range(size)])


def _raw(*fields: bytes) -> bytes:
    """A record of these fields after its attributes byte, its length a plain varint."""
    body = b"\x00" + b"".join(fields)
    return varint(len(body)) + body


_NO_KEY_VALUE_HEADERS = (varint(-1), varint(-1), varint(0))


@pytest.mark.parametrize("body,count,reason", [
    (_record(0, 0, b"k", b"v", [(None, b"x")]), 1, "a null header key"),
    (_record(0, 0, b"k", b"v", []) + b"\x00", 1, "a byte after the last record"),
    (_record(0, 0, b"k", b"v", [])[:-1], 1, "a record cut short"),
    (_record(0, 0, b"k", b"v", []) * 2, 1, "more records than the count"),
    (_record(1, 0, b"k", b"v", []), 1, "offset delta 1 for record 0"),
    (_record(0, 10 * HOUR * 24 * 365, b"k", b"v", []), 1, "a timestamp years ahead"),
    (_record(0, -2 * HOUR, b"k", b"v", []), 1, "a timestamp two hours behind"),
    (_raw(varint(0), varint(0), varint(-1), varint(-1), varint(-1)), 1,
     "a negative header count"),
    (_raw(varint(0), varint(0), varint(-1), varint(-1), varint(1), varint(-1)), 1,
     "a header with a null key"),
    (_record(0, 0, b"k", b"v", [(b"h", b"x")] * 2).replace(b"v\x04", b"v\x02"), 1,
     "header count 1 but two headers' bytes"),
    (_padded(6, 6) + b"\x00" + varint(0) + varint(0) + b"".join(_NO_KEY_VALUE_HEADERS), 1,
     "a 6-byte length varint"),
    (_raw(_padded(0, 11), varint(0), *_NO_KEY_VALUE_HEADERS), 1,
     "an 11-byte timestamp delta"),
    (_raw(varint(0), _padded(0, 6), *_NO_KEY_VALUE_HEADERS), 1, "a 6-byte offset delta"),
    (_raw(varint(0), varint(0), _padded(-1, 6), varint(-1), varint(0)), 1,
     "a 6-byte key length"),
    (b"", 0, "no records: a count of 0"),
    (_record(0, 0, b"k", b"v", []), 0, "a count of 0"),
    (_record(0, 0, b"k", b"v", []), -1, "a negative count"),
])
def test_each_rule_is_checked(body: bytes, count: int, reason: str) -> None:
    """One broken rule each (the bytes of a record checked by hand): refused by the C
    check, whatever else the record gets right."""
    assert speedups is not None
    assert not speedups.records_ok(body, count, NOW, NOW - HOUR, NOW + HOUR, 3), reason
    if count >= 1:  # the Python validator refuses each as well
        config = LogConfig(message_timestamp_before_max_ms=HOUR,
                           message_timestamp_after_max_ms=HOUR)
        assert not _python_accepts(_batch(body, count), config, NOW), reason


def test_five_and_ten_byte_varints_are_read() -> None:
    """The longest varints Kafka reads (5 bytes for int32 fields, 10 for the timestamp
    delta) are accepted, padded or not."""
    assert speedups is not None
    body = b"\x00" + _padded(0, 10) + _padded(0, 5) + b"".join(_NO_KEY_VALUE_HEADERS)
    record = _padded(len(body), 5) + body
    assert speedups.records_ok(record, 1, NOW, NOW - HOUR, NOW + HOUR, 3)
    assert _python_accepts(_batch(record, 1), LogConfig(), NOW)


def test_keys_and_times_only_when_asked() -> None:
    assert speedups is not None
    keyless = _record(0, 100 * HOUR, None, b"v", [])
    assert speedups.records_ok(keyless, 1, NOW, NOW - HOUR, NOW + HOUR, 1)
    assert not speedups.records_ok(keyless, 1, NOW, NOW - HOUR, NOW + HOUR, 1 | 2)
    assert not speedups.records_ok(keyless, 1, NOW, NOW - HOUR, NOW + HOUR, 1 | 4)
    # timestamp -1 (none) is always allowed; the sum wraps as int64
    none = _record(0, -NOW - 1, b"k", b"v", [])
    assert speedups.records_ok(none, 1, NOW, NOW - HOUR, NOW + HOUR, 7)
    assert speedups.records_ok(_record(5, 0, b"k", b"v", []), 1, NOW, 0, 0, 0)
    with pytest.raises(TypeError):
        speedups.records_ok(keyless, 1, NOW, 0, 0)
    with pytest.raises(TypeError):
        speedups.records_ok("text", 1, NOW, 0, 0, 0)


# The Spark decoder's walk (record_fields, headrace/spark/batch_decode.py): against its numpy
# path. Its own tests (tests/unit/test_spark_batch_decode.py) run with and without it.
pytest.importorskip("pyarrow", reason="the spark extra is not installed")
from tests.batches import Record as _SparkRecord  # noqa: E402
from tests.batches import make_batch  # noqa: E402
from tests.unit.test_spark_batch_decode import MIXED, decode, expected, strip_ts  # noqa: E402

from headrace import speedups as headrace_speedups  # noqa: E402
from headrace.protocol.records import InvalidRecordError  # noqa: E402


def test_spark_decoder_reads_good_records_by_the_c_pass_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 24: with the extension built, ordinary batches never reach the numpy path."""
    from headrace.spark import batch_decode

    def refuse(*_: object) -> None:
        raise AssertionError("the numpy path ran")

    monkeypatch.setattr(batch_decode, "_numpy_fields", refuse)
    blob = make_batch(MIXED) + make_batch([(None, b"v" * 40, 5, [])] * 300, base_offset=6)
    rows, nxt = decode(blob)
    assert nxt == 306 and len(rows) == 306
    assert strip_ts(rows[:6]) == expected(MIXED, 0)


@settings(max_examples=300, deadline=None)
@given(records=st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=20)),
                                  st.one_of(st.none(), st.binary(max_size=200)),
                                  st.integers(0, 10**6),
                                  st.lists(st.tuples(st.sampled_from(["a", "bb"]),
                                                     st.one_of(st.none(), st.binary(max_size=4))),
                                           max_size=2)),
                        min_size=1, max_size=40),
       damage=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=2))
def test_spark_decoder_c_pass_and_numpy_read_the_same(records: list[_SparkRecord],
                                             damage: list[tuple[int, int]]) -> None:
    """Whatever the bytes (records of any shape, a few damaged bytes after the batch
    header), the C pass and numpy give the same rows or both refuse."""
    blob = bytearray(make_batch(records))
    for at, bits in damage:
        blob[R.HEADER_SIZE + at % (len(blob) - R.HEADER_SIZE)] ^= bits

    def outcome() -> object:
        try:
            return decode(bytes(blob))
        except InvalidRecordError as e:
            return ("refused", int(e.error_code))

    with_c = outcome()
    with patch.object(headrace_speedups, "native", None):
        with_numpy = outcome()
    assert with_c == with_numpy


def test_binary_column_refuses_slices_past_the_data() -> None:
    """The Arrow buffers are built only from slices inside ``data`` (the decoder's numpy
    path then says what is wrong); a null (negative length) takes no bytes."""
    import numpy as np

    assert speedups is not None
    data = b"0123456789"
    ok = speedups.binary_column(data, np.array([0, 4, 9], dtype=np.int64),
                                np.array([2, -1, 1], dtype=np.int64))
    assert ok is not None
    offsets, values, validity, nulls = ok
    assert np.frombuffer(offsets, dtype=np.int32).tolist() == [0, 2, 2, 3]
    assert values == b"019" and nulls == 1 and validity == bytes([0b101])
    for pos, length in ((9, 2), (11, 0), (-1, 1), (0, 11)):
        assert speedups.binary_column(data, np.array([pos], dtype=np.int64),
                                      np.array([length], dtype=np.int64)) is None, (pos,
                                                                                    length)
