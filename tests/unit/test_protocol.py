"""Framing and the request codec (R-PROTO-1, R-PROTO-6, R-NF-1)."""

from __future__ import annotations

import contextlib
import io
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequestTopic
from kio.serial import entity_writer
from tests.fuzz import ALL_VERSIONS, claim_variants, minimal

from headrace.protocol.codec import (
    decode_request,
    encode_api_versions_fallback,
    encode_response,
    response_class,
)
from headrace.protocol.entities import build
from headrace.protocol.errors import FrameTooLargeError, ProtocolError, UnknownApiError
from headrace.protocol.framing import FrameDecoder, frame


def _request_bytes(api_key: int, version: int, body: Any, correlation_id: int = 7) -> bytes:
    cls = load_request_schema(api_key, version)
    hdr_cls = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(hdr_cls)(buf, hdr_cls(request_api_key=api_key, request_api_version=version,
                                        correlation_id=correlation_id, client_id="test"))
    entity_writer(cls)(buf, body)
    return buf.getvalue()


def _metadata_v12(topics: Any = None) -> bytes:
    cls = load_request_schema(3, 12)
    return _request_bytes(3, 12, cls(topics=topics, allow_auto_topic_creation=True,
                                     include_topic_authorized_operations=False))


# ------------------------------------------------------------------ framing


def test_frames_split_across_any_chunk_boundary() -> None:
    payloads = [b"a" * 10, b"", b"xyz" * 100, b"q"]
    wire = b"".join(frame(p) for p in payloads)
    for step in (1, 3, 4, 7, len(wire)):
        dec = FrameDecoder(1000)
        got: list[bytes] = []
        for i in range(0, len(wire), step):
            got += dec.feed(wire[i : i + step])
        assert got == payloads
        assert dec.buffered == 0


@pytest.mark.parametrize("size", [1001, 2**31 - 1, -1, -(2**31)])
def test_oversize_or_negative_prefix_is_rejected_before_buffering(size: int) -> None:
    dec = FrameDecoder(1000)
    with pytest.raises(FrameTooLargeError):
        dec.feed(struct.pack(">i", size) + b"xx")


def test_frame_at_the_limit_is_accepted() -> None:
    assert FrameDecoder(5).feed(frame(b"12345")) == [b"12345"]


# ------------------------------------------------------------------ codec


def test_decodes_a_flexible_request() -> None:
    req = decode_request(_metadata_v12())
    assert (req.header.api_key, req.header.api_version, req.header.correlation_id) == (3, 12, 7)
    assert req.header.client_id == "test"
    assert req.body.topics is None


def test_unknown_tagged_fields_are_skipped_kip_482() -> None:
    """kio raises on unknown tags; KIP-482 says skip them. Header and body both."""
    raw = _metadata_v12()
    # header v2 ends with its tagged-field count (0) right after client_id "test"
    hdr_end = 2 + 2 + 4 + 2 + 4
    assert raw[hdr_end] == 0
    with_tags = (raw[:hdr_end] + bytes([2, 5, 1, 0xCC, 40, 3, 1, 2, 3])
                 + raw[hdr_end + 1 : -1] + bytes([1, 9, 2, 0xAA, 0xBB]))
    req = decode_request(with_tags)
    assert req.header.correlation_id == 7
    assert req.body.allow_auto_topic_creation is True


def test_unknown_tag_inside_a_nested_entity() -> None:
    raw = _metadata_v12(topics=(MetadataRequestTopic(topic_id=None, name="t"),))
    # the topic entity ends with its own tag count, just before the body's last 3 fields
    # (bool, bool, tag count): body tail = [topic tags=0][allow=1][incl=0][tags=0]
    assert raw[-4:] == bytes([0, 1, 0, 0])
    patched = raw[:-4] + bytes([1, 77, 1, 0x01]) + raw[-3:]
    req = decode_request(patched)
    assert req.body.topics[0].name == "t"


def test_unknown_api_key_and_version_carry_the_correlation_id() -> None:
    with pytest.raises(UnknownApiError) as info:
        decode_request(struct.pack(">hhi", 999, 0, 42) + b"\x00\x00")
    assert info.value.correlation_id == 42
    with pytest.raises(UnknownApiError):
        decode_request(struct.pack(">hhi", 3, 99, 1) + b"\x00\x00")


@pytest.mark.parametrize("cut", [1, 5, 9, 12, 14])
def test_truncated_request_is_a_protocol_error(cut: int) -> None:
    raw = _metadata_v12()
    with pytest.raises(ProtocolError):
        decode_request(raw[:cut])


def test_api_versions_response_header_is_always_v0() -> None:
    body = build(response_class(18, 3), {"error_code": 0, "api_keys": []})
    out = encode_response(18, 3, 5, body)
    size, corr = struct.unpack_from(">ii", out)
    assert size == len(out) - 4 and corr == 5
    # v0 header: the error code follows the correlation id directly (no tag count byte)
    assert out[8:10] == b"\x00\x00"


def test_api_versions_fallback_is_a_v0_response() -> None:
    out = encode_api_versions_fallback(9, ErrorCode.unsupported_version,
                                       [(0, 3, 12), (18, 0, 4)])
    size, corr, err, n = struct.unpack_from(">iihi", out)
    assert (size, corr, err, n) == (len(out) - 4, 9, 35, 2)
    assert struct.unpack_from(">hhh", out, 14) == (0, 3, 12)


# ------------------------------------------------------------------ claimed lengths (prescan)

_METADATA_22 = struct.pack(">hhih", 3, 12, 1, -1) + b"\x00" + b"\xff\xff\xff\xff\x0f" + b"\x01\x00"


def test_22_byte_metadata_frame_is_a_protocol_error() -> None:
    """Metadata v12 whose topics array claims 2^32-1 elements: kio's native reader sized a
    Vec from the claim (~34 GB) and the process aborted; the prescan refuses it first
    (issue 8 item 1; R-NF-1)."""
    assert len(_METADATA_22) + 4 == 22
    with pytest.raises(ProtocolError, match=r"MetadataRequest\.topics: claims 4294967294"):
        decode_request(_METADATA_22)


@pytest.mark.parametrize("api_key_version", ALL_VERSIONS, ids=lambda kv: f"{kv[0]}v{kv[1]}")
def test_huge_claims_at_every_array_of_every_request_schema(
        api_key_version: tuple[int, int]) -> None:
    """Every array count (top-level, nested, compact and legacy) of every request schema kio
    has, replaced by 2^32-2, 2^31-1 and 2^20: ProtocolError, never an allocation from the
    claim (issue 8 item 1; R-NF-1). Without the prescan the first case aborts the run."""
    key, version = api_key_version
    for _path, _claim, data in claim_variants(key, version):
        with pytest.raises(ProtocolError, match="claims"):
            decode_request(data)


@pytest.mark.parametrize("api_key_version", ALL_VERSIONS, ids=lambda kv: f"{kv[0]}v{kv[1]}")
def test_prescan_accepts_every_valid_request(api_key_version: tuple[int, int]) -> None:
    """No false alarm: a request of every schema with 0, 1 and 3 elements per array (empty
    and non-empty strings) decodes (R-PROTO-1)."""
    key, version = api_key_version
    cls = load_request_schema(key, version)
    for items in (0, 1, 3):
        assert decode_request(_request_bytes(key, version, minimal(cls, items))).header.api_key \
            == key


@pytest.mark.parametrize(("frame", "message"), [
    (struct.pack(">hhih", 3, 4, 1, 32767) + b"abc", "client_id: claims 32767"),
    (struct.pack(">hhih", 3, 12, 1, -1) + b"\x00\xff\xff\xff\xff\xff\x01", "varint longer"),
    (struct.pack(">hhih", 3, 12, 1, -1) + b"\x00\x02" + bytes(16) + b"\xff\xff\xff\x7f",
     "MetadataRequestTopic.name: claims"),
    (struct.pack(">hhih", 3, 12, 1, -1) + b"\x01\x00\xff\xff\xff\xff\x0f\x01\x01\x00\x00",
     "tagged fields"),
    (struct.pack(">hhih", 3, 4, 1, -1) + struct.pack(">i", -2) + b"\x01", "length -2"),
    (struct.pack(">hhih", 8, 2, 1, -1) + b"\x00\x01g" + struct.pack(">i", 1) + b"\x00\x01m"
     + struct.pack(">q", -1) + struct.pack(">i", -1), "null, but the field is not nullable"),
])
def test_claimed_lengths_and_nulls_are_checked(frame: bytes, message: str) -> None:
    """Strings, varints, tagged-field sizes, negative counts and nulls where the schema has
    none are refused before kio reads them: Kafka's generated readers throw on each of
    these ("non-nullable field topics was serialized as null"), and the connection is
    closed (issue 8 items 1 and 11; R-NF-1)."""
    with pytest.raises(ProtocolError, match=message):
        decode_request(frame)


def _fetch_v17_hiding_a_claim_behind_a_tag() -> tuple[bytes, bytes]:
    """(valid Fetch v17, the same with partition 0's replica_directory_id tag claiming 6
    more bytes than its uuid, those bytes being a topic tag count and a 2^32-1 claim)."""
    import uuid

    cls = load_request_schema(1, 17)
    body = build(cls, {"max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "rack_id": "",
                       "forgotten_topics_data": [], "topics": [{
                           "topic_id": uuid.UUID(bytes=b"\x22" * 16), "partitions": [{
                               "partition": 0, "fetch_offset": 0, "partition_max_bytes": 1,
                               "replica_directory_id": uuid.UUID(bytes=b"\x11" * 16)}]}]})
    valid = _request_bytes(1, 17, body)
    i = valid.index(b"\x11" * 16)
    assert valid[i - 3:i] == b"\x01\x00\x10"  # one tag: number 0, 16 bytes
    hidden = b"\x00" + b"\xff\xff\xff\xff\x0f"
    bad = valid[:i - 1] + bytes([16 + len(hidden)]) + valid[i:i + 16] + hidden + valid[i + 16:]
    return valid, bad


def test_known_tagged_field_must_fill_its_declared_size() -> None:
    """kio reads a known tagged field and goes on from where its content ends, not from its
    declared end: a Fetch v17 whose partition tag claimed 6 bytes more hid a 2^32-1 array
    claim from a walk that skipped by the declared size, and kio aborted the process on it.
    The prescan requires a known tag's content to fill its size exactly (issue 8 item 1;
    R-NF-1). Found while writing the fuzzer; in the corpus as fetch-v17-tag-hides-claim."""
    valid, bad = _fetch_v17_hiding_a_claim_behind_a_tag()
    assert decode_request(valid).body.topics[0].partitions[0].replica_directory_id is not None
    with pytest.raises(ProtocolError, match="tag 0 content does not fill its 22 bytes"):
        decode_request(bad)


def test_nullable_entity_marker_other_than_minus_one_is_refused() -> None:
    """kio reads a nullable struct's marker -1 as null and every other value as present;
    a marker of -2 would make the prescan and kio disagree on where the next field starts,
    so it is refused (DescribeTopicPartitions v0 ``cursor``; R-NF-1)."""
    cls = load_request_schema(75, 0)
    raw = _request_bytes(75, 0, build(cls, {"topics": [], "response_partition_limit": 1,
                                            "cursor": None}))
    assert raw[-2:] == b"\xff\x00"
    assert decode_request(raw).body.cursor is None
    with pytest.raises(ProtocolError, match="length -2"):
        decode_request(raw[:-2] + b"\xfe\x02x" + bytes(4) + b"\x00\x00")


def test_prescan_reads_memoryview_frames() -> None:
    """The server hands the decoder a read-only view of its receive buffer (framing.py):
    the checks and the decoding work on it as on bytes (R-NF-1)."""
    def view(b: bytes) -> memoryview:
        return memoryview(bytearray(b)).toreadonly()

    with pytest.raises(ProtocolError, match="claims 4294967294"):
        decode_request(view(_METADATA_22))
    _, bad = _fetch_v17_hiding_a_claim_behind_a_tag()
    with pytest.raises(ProtocolError, match="does not fill"):
        decode_request(view(bad))
    assert decode_request(view(_metadata_v12())).header.correlation_id == 7


def _fetch_v12(partitions: int) -> bytes:
    return _request_bytes(1, 12, build(load_request_schema(1, 12), {
        "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "forgotten_topics_data": [],
        "topics": [{"topic": "t", "partitions": [
            {"partition": i, "fetch_offset": 7, "partition_max_bytes": 1 << 20}
            for i in range(partitions)]}]}))


def test_fixed_size_elements_are_skipped_in_one_step_and_checked() -> None:
    """Fetch v12+ partitions (fixed fields and an empty tagged-field section) are skipped
    at a stride of 33 bytes when every section is empty; a partition carrying a tag takes
    the element-by-element walk; a partition missing from the frame is refused (R-NF-1)."""
    raw = _fetch_v12(50)
    assert len(decode_request(raw).body.topics[0].partitions) == 50
    start = raw.index(bytes([51]), raw.index(b"\x02t")) + 1  # partitions: compact 50 + 1
    tag_at = start + 7 * 33 + 32  # partition 7's tag section
    assert raw[tag_at] == 0
    tagged = raw[:tag_at] + bytes([1, 9, 2, 0xAA, 0xBB]) + raw[tag_at + 1:]  # unknown tag 9
    body = decode_request(tagged).body
    assert [p.partition for p in body.topics[0].partitions] == list(range(50))
    with pytest.raises(ProtocolError, match="claims 50 elements"):
        decode_request(raw[:start + 10 * 33] + raw[start + 11 * 33 + 40:])
    short = raw[:start + 49 * 33] + raw[start + 50 * 33:]  # 49 partitions, claims 50
    with pytest.raises(ProtocolError):
        decode_request(short)


def test_nullable_array_may_be_null() -> None:
    """Metadata v12 topics null (every topic) and OffsetFetch v7 topics null still decode."""
    assert decode_request(_metadata_v12(None)).body.topics is None
    raw = _request_bytes(9, 7, minimal(load_request_schema(9, 7)))
    assert raw[-3:] == b"\x01\x00\x00"  # topics (compact, empty), require_stable, tags
    null_topics = raw[:-3] + b"\x00" + raw[-2:]
    assert decode_request(null_topics).body.topics is None


def test_fetch_body_encodes_the_all_zero_topic_id() -> None:
    """kio reads the all-zero topic id as None; the hand-encoded Fetch response writes it
    back as sixteen zero bytes (it raised AttributeError; issue 8 item 11)."""
    from headrace.protocol.codec import FetchPartition, encode_fetch_body

    p = FetchPartition(0, int(ErrorCode.unknown_topic_id), None)
    body = encode_fetch_body(13, 0, 0, 0, [(None, [p])])
    out = b"".join(bytes(c) for c in body.chunks)
    assert len(out) == body.size
    assert bytes(16) in out


# ------------------------------------------------------------------ fuzz


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_only_raise_protocol_errors(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_request(data)


_SEEDS = [_metadata_v12(), _request_bytes(18, 3, load_request_schema(18, 3)(
    client_software_name="x", client_software_version="1"))]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.sampled_from(_SEEDS), st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)),
                                         max_size=6), st.integers(0, 400))
def test_fuzz_mutated_requests_only_raise_protocol_errors(
    seed: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(seed)
    for pos, val in flips:
        if pos < len(data):
            data[pos] = val
    with contextlib.suppress(ProtocolError):
        decode_request(bytes(data[: max(cut, 8)]))
