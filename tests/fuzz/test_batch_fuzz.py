"""A fuzzer for produced record batches (issue 8; R-LOG-3, R-LOG-4, R-NF-1).

Valid batches in every codec (``tests.batches.make_batch``: keys, values, headers,
timestamps) are mutated as a hostile producer would (bytes flipped, varints replaced by
huge or negative ones, the records block truncated, spliced or repeated, header fields
rewritten, with the CRC recomputed so that the mutation reaches the record checks), then
go through what ``PartitionLog.append_as_leader`` runs: ``check_produce_records``,
``split_batches`` and ``validate_batches``. Either they accept the batch, and then
``decode_records`` agrees with its header (count, offsets base..base+n-1, timestamps), or
they raise ``InvalidRecordError`` — never another exception, never unbounded memory.

The checked-in corpus (``corpus/batches/``, one produce request's records per file, named
``<expected error>--<what>.bin``) holds the bad batches of issue 8: the zstd compression
bomb (48 KB inflating to 1.5 GiB), a snappy block claiming 4 GiB, an offset delta past
lastOffsetDelta, counts that disagree, torn and overrunning records, two batches in one
partition, magic 1, ... ``python -m tests.fuzz.test_batch_fuzz`` rewrites it.

Budget: ``FUZZ_BATCH_EXAMPLES`` (default 1500 mutants, ~15-25 s in all).
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import struct
import sys
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from headrace.config import LogConfig
from headrace.log.validator import validate_batches
from headrace.protocol import records as R
from tests.batches import Record, compress, encode_record, make_batch, varint

CORPUS = Path(__file__).parent / "corpus" / "batches"
EXAMPLES = int(os.environ.get("FUZZ_BATCH_EXAMPLES", "1500"))
NOW = 1_700_000_000_000
CONFIG = LogConfig()
COMPACT = LogConfig(cleanup_policy="compact")
CODECS = [None, "gzip", "snappy", "lz4", "zstd"]
_CODEC_IDS = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def append_checks(blob: bytes, config: LogConfig = CONFIG) -> list[R.BatchHeader]:
    """What a produce of ``blob`` as one partition's records goes through before offsets
    are assigned (produce.py, then PartitionLog.append_as_leader)."""
    size = R.check_produce_records(blob)
    records = memoryview(blob)[:size]
    headers = R.split_batches(records, config.max_message_bytes)
    validate_batches(records, headers, config, NOW)
    return headers


def raw_batch(body: bytes, count: int, last_delta: int | None = None, codec: int = 0,
              base_ts: int = NOW, max_ts: int = NOW, magic: int = 2) -> bytes:
    """A batch around an arbitrary (already compressed) records block; CRC computed."""
    buf = bytearray(R.HEADER_SIZE) + body
    R.HEADER.pack_into(
        buf, 0, 0, len(buf) - R.LOG_OVERHEAD, -1, magic, 0, codec,
        count - 1 if last_delta is None else last_delta, base_ts, max_ts, -1, -1, -1, count,
    )
    struct.pack_into(">I", buf, R.CRC_POS, crc32c.crc32c(bytes(buf[R.ATTRIBUTES_POS:])))
    return bytes(buf)


def with_crc(batch: bytes | bytearray) -> bytes:
    buf = bytearray(batch)
    if len(buf) >= R.HEADER_SIZE:
        struct.pack_into(">I", buf, R.CRC_POS, crc32c.crc32c(bytes(buf[R.ATTRIBUTES_POS:])))
    return bytes(buf)


# --------------------------------------------------------------------- the corpus


def zstd_bomb(size: int = 3 << 29) -> bytes:
    """One record whose value is ``size`` zero bytes (1.5 GiB), zstd-compressed as a
    stream (about 48 KB), in a batch that claims one record."""
    import zstandard

    value_prefix = b"\x00" + varint(0) + varint(0) + varint(-1) + varint(size)
    record_len = len(value_prefix) + size + 1  # + the header count
    comp = zstandard.ZstdCompressor(level=19).compressobj()
    out = [comp.compress(varint(record_len) + value_prefix)]
    chunk = bytes(1 << 24)
    for _ in range(size // len(chunk)):
        out.append(comp.compress(chunk))
    out.append(comp.compress(b"\x00"))
    out.append(comp.flush())
    return raw_batch(b"".join(out), 1, codec=4)


def snappy_length_lie() -> bytes:
    """A raw snappy block whose preamble claims 4 GiB - 1 of output."""
    body = b"\xff\xff\xff\xff\x0f" + b"\x00" * 20
    return raw_batch(body, 1, codec=2)


def _records(n: int, **kw: int) -> bytes:
    return b"".join(encode_record(kw.get("delta", i), i, b"k%d" % i, b"v%d" % i, [])
                    for i in range(n))


def corpus_cases(bomb: bool = True) -> dict[str, bytes]:
    """File name -> bytes; the prefix of the name is the expected error. Building the bomb
    takes seconds (1.5 GiB through zstd): ``bomb=False`` leaves it out."""
    good = make_batch([(b"k%d" % i, b"v%d" % i, NOW + i, []) for i in range(3)])
    delta_past = b"".join(encode_record(d, 0, b"k", b"v", []) for d in (0, 1, 7))
    dup_delta = b"".join(encode_record(d, 0, b"k", b"v", []) for d in (0, 1, 1))
    overrun = _records(2) + varint(1000) + b"\x00" * 10
    garbage = bytes(range(200, 256)) * 3
    legacy_body = struct.pack(">bbii", 1, 0, -1, -1)
    legacy = struct.pack(">qiI", 0, len(legacy_body) + 4, 0) + legacy_body
    neg_headers = (varint(7) + b"\x00" + varint(0) + varint(0) + varint(-1) + varint(-1)
                   + varint(-1) + b"\x00")
    cases = {"invalid_record--zstd-bomb-1.5GiB.bin": zstd_bomb()} if bomb else {}
    return cases | {
        "invalid_record--snappy-claims-4GiB.bin": snappy_length_lie(),
        "invalid_record--offset-delta-past-last-offset-delta.bin": raw_batch(delta_past, 3),
        "invalid_record--repeated-offset-delta.bin": raw_batch(dup_delta, 3),
        "invalid_record--zstd-offset-delta-past-last.bin": raw_batch(
            bytes(R.cramjam.zstd.compress(delta_past)), 3, codec=4),
        "invalid_record--count-above-records.bin": raw_batch(_records(2), 3),
        "invalid_record--count-below-records.bin": raw_batch(_records(3), 2),
        "invalid_record--count-disagrees-with-last-offset-delta.bin": raw_batch(
            _records(3), 3, last_delta=5),
        "invalid_record--record-length-overruns-batch.bin": raw_batch(overrun, 3),
        "invalid_record--garbage-record-bytes.bin": raw_batch(garbage, 4),
        "invalid_record--negative-header-count.bin": raw_batch(neg_headers, 1),
        "invalid_record--two-batches.bin": good + good,
        "invalid_record--torn-batch.bin": good[:-3],
        "invalid_record--empty.bin": b"",
        "invalid_record--magic-1.bin": legacy,
        "invalid_timestamp--far-future.bin": make_batch([(b"k", b"v", NOW + 86_400_000, [])]),
        "corrupt_message--bad-crc.bin": good[:-1] + bytes([good[-1] ^ 0xFF]),
        "corrupt_message--undecompressable-zstd.bin": raw_batch(b"\x28\xb5\x2f\xfd" + b"x" * 30,
                                                                1, codec=4),
        "corrupt_message--unknown-codec.bin": raw_batch(_records(1), 1, codec=6),
    }


def write_corpus() -> None:
    CORPUS.mkdir(parents=True, exist_ok=True)
    for name, data in corpus_cases().items():
        (CORPUS / name).write_bytes(data)


def corpus_files() -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in sorted(CORPUS.glob("*.bin"))]


@pytest.mark.parametrize(("name", "blob"), corpus_files(), ids=[n for n, _ in corpus_files()])
def test_corpus_batches_are_refused_with_kafkas_code(name: str, blob: bytes) -> None:
    """R-LOG-3, R-LOG-4, R-NF-1: every checked-in bad batch is refused with the error its
    name says (Kafka's codes), within bounded memory (the 1.5 GiB bomb included)."""
    expected = ErrorCode[name.split("--")[0]]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(R.InvalidRecordError) as e:
        append_checks(blob)
    assert e.value.error_code == expected, str(e.value)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < R.DEFAULT_INFLATE_LIMIT / 2**20 + 32, grown_mb


def test_corpus_is_up_to_date() -> None:
    """R-NF-1: the generator and the checked-in files agree (``python -m
    tests.fuzz.test_batch_fuzz`` rewrites them); the bomb's size is checked, not its bytes."""
    files = dict(corpus_files())
    bomb = files.pop("invalid_record--zstd-bomb-1.5GiB.bin")
    assert len(bomb) < 64 * 1024
    (h,) = R.split_batches(bomb, CONFIG.max_message_bytes)
    assert h.compression == R.CODEC_ZSTD and h.records_count == 1
    assert files == corpus_cases(bomb=False)


# --------------------------------------------------------------------- mutation fuzzing

OUTCOMES = {"accepted": 0, "refused": 0}
_HUGE_VARINTS = [varint(v) for v in (-1, -2, 2**31 - 1, -(2**31), 2**40, 1000, 0)] + [
    b"\xff" * 11, b"\x80" * 5]


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    codec = draw(st.sampled_from(CODECS))
    if draw(st.integers(0, 3)) == 0:
        # up to 64 records are walked by a plain loop, more with numpy: a large batch,
        # its records from a seeded generator (drawing each would be slow)
        rng = random.Random(draw(st.integers(0, 2**32)))
        big: list[Record] = [
            (None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 8)),
             None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 30)),
             NOW + rng.randint(-5_000, 5_000),
             [("h", rng.randbytes(2))] * rng.choice([0, 0, 1, 2]))
            for _ in range(rng.randint(65, 160))
        ]
        return make_batch(big, compression=codec)
    n = draw(st.integers(1, 12))
    rows = [
        (draw(st.one_of(st.none(), st.binary(max_size=12))),
         draw(st.one_of(st.none(), st.binary(max_size=40))),
         NOW + draw(st.integers(-5_000, 5_000)),
         draw(st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=6))),
                       max_size=2)))
        for _ in range(n)
    ]
    return make_batch(rows, compression=codec)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    batch = bytearray(draw(batches()))
    codec = batch[R.ATTRIBUTES_POS + 1] & R.CODEC_MASK
    body = bytearray(batch[R.HEADER_SIZE:])
    # mutate the uncompressed records, then compress them again (mostly)
    plain = bytearray(R.decompress(codec, bytes(body))) if codec else body
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.integers(0, 6))
        pos = draw(st.integers(0, max(len(plain) - 1, 0)))
        if op == 0 and plain:
            plain[pos] = draw(st.integers(0, 255))
        elif op == 1:
            v = draw(st.sampled_from(_HUGE_VARINTS))
            plain[pos:pos + draw(st.integers(0, len(v)))] = v
        elif op == 2:
            del plain[pos:]
        elif op == 3:
            plain[pos:pos] = plain[pos:pos + draw(st.integers(1, 30))]
        elif op == 4:
            del plain[pos:pos + draw(st.integers(1, 8))]
        elif op == 5:  # a header field: count, lastOffsetDelta, timestamps
            field = draw(st.sampled_from([(R.HEADER_SIZE - 4, ">i"), (23, ">i"), (27, ">q")]))
            struct.pack_into(field[1], batch, field[0], draw(st.integers(-3, 20)))
        else:
            plain[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    if codec and draw(st.booleans()):
        codec_name = next(k for k, v in _CODEC_IDS.items() if v == codec)
        body = bytearray(compress(codec_name, bytes(plain)))
    elif codec:
        body = bytearray(body)  # the original compressed block: header mutations only
    else:
        body = plain
    out = bytearray(batch[:R.HEADER_SIZE]) + body
    struct.pack_into(">i", out, R.LENGTH_POS, len(out) - R.LOG_OVERHEAD)
    if draw(st.integers(0, 9)) == 0:  # sometimes a stale CRC or a torn tail
        return bytes(out[:-1])
    return with_crc(out)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated(), st.booleans())
def test_mutated_batches_are_accepted_consistently_or_refused(blob: bytes, compact: bool) -> None:
    """R-LOG-3, R-LOG-4, R-NF-1: a mutated batch either passes every produce check and then
    decodes to exactly its header's records (count, offsets 0..n-1, timestamps in range),
    or raises InvalidRecordError; nothing else escapes."""
    config = COMPACT if compact else CONFIG
    try:
        headers = append_checks(blob, config)
    except R.InvalidRecordError:
        OUTCOMES["refused"] += 1
        return
    OUTCOMES["accepted"] += 1
    (h,) = headers
    recs = R.decode_records(blob)
    assert len(recs) == h.records_count == h.last_offset_delta + 1
    assert [r.offset for r in recs] == list(range(h.records_count))
    assert all(r.key is not None for r in recs) or not compact
    stamps = list(R.record_timestamps(blob))
    assert [o for o, _ in stamps] == list(range(h.records_count))
    assert all(ts <= NOW + CONFIG.message_timestamp_after_max_ms for _, ts in stamps)


@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=list(HealthCheck))
@given(batches())
def test_valid_batches_pass_and_decode(batch: bytes) -> None:
    """R-LOG-3: what a client builds (every codec, keys, nulls, headers) is accepted."""
    (h,) = append_checks(batch)
    assert [r.offset for r in R.decode_records(batch)] == list(range(h.records_count))


@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=400), st.sampled_from(list(_CODEC_IDS.values())),
       st.integers(1, 50))
def test_random_records_blocks_never_escape(body: bytes, codec: int, count: int) -> None:
    """R-NF-1: any bytes as a (compressed) records block: accepted or InvalidRecordError."""
    with contextlib.suppress(R.InvalidRecordError):
        append_checks(raw_batch(body, count, codec=codec))


def test_the_fuzzer_reaches_both_outcomes() -> None:
    """R-NF-1: the mutants are neither all refused nor all accepted (else the fuzzer tests little);
    runs after the fuzz test in file order."""
    if OUTCOMES["accepted"] + OUTCOMES["refused"] < 100:
        return  # run alone (-k): nothing to judge
    assert OUTCOMES["accepted"] > 0 and OUTCOMES["refused"] > 0, OUTCOMES


if __name__ == "__main__":
    write_corpus()
    print(f"wrote {len(corpus_cases())} files to {CORPUS}", file=sys.stderr)
