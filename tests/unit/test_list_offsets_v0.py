"""ListOffsets v0 by hand (kio has no schema for it), Produce v0-v2 advertised but refused
(KAFKA-18659), and Kafka 3.9's legacy offset lookup (issue 11 items 1 and 2; R-PROTO-1,
R-PROTO-5, R-NF-1).

The expected bytes are derived from Kafka 3.9's own message schemas: ``_SCHEMAS`` holds the
fields of ``ListOffsetsRequest.json`` and ``ListOffsetsResponse.json`` (names, types and
"versions" exactly as Kafka 3.9 ships them, ``about`` texts left out) and ``_encode``
serialises an object the way Kafka's generated non-flexible code does, for any version,
from those fields alone. The hand-written codec must agree with it byte for byte; sarama's
own test vectors (``offset_request_test.go``, ``offset_response_test.go``: what Burrow's
client sends and expects) are checked too.
"""

from __future__ import annotations

import contextlib
import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.broker.handlers.api_versions import advertised_versions
from headrace.broker.handlers.list_offsets import legacy_offsets_before
from headrace.protocol.codec import (
    EncodedBody,
    decode_request,
    encode_response_chunks,
    supported_versions,
)
from headrace.protocol.errors import ProtocolError, UnsupportedVersionError
from headrace.protocol.legacy import (
    ListOffsetsPartitionResponseV0,
    ListOffsetsPartitionV0,
    ListOffsetsRequestV0,
    ListOffsetsTopicV0,
    decode_list_offsets_v0,
    decode_list_offsets_v0_response,
    encode_list_offsets_v0,
)

# Kafka 3.9 clients/src/main/resources/common/message/ListOffsets{Request,Response}.json
# ("validVersions": "0-10", "flexibleVersions": "6+"), fields only
_SCHEMAS = json.loads("""{
  "request": [
    {"name": "ReplicaId", "type": "int32", "versions": "0+"},
    {"name": "IsolationLevel", "type": "int8", "versions": "2+"},
    {"name": "Topics", "type": "[]ListOffsetsTopic", "versions": "0+", "fields": [
      {"name": "Name", "type": "string", "versions": "0+"},
      {"name": "Partitions", "type": "[]ListOffsetsPartition", "versions": "0+", "fields": [
        {"name": "PartitionIndex", "type": "int32", "versions": "0+"},
        {"name": "CurrentLeaderEpoch", "type": "int32", "versions": "4+", "default": "-1"},
        {"name": "Timestamp", "type": "int64", "versions": "0+"},
        {"name": "MaxNumOffsets", "type": "int32", "versions": "0", "default": "1"}]}]},
    {"name": "TimeoutMs", "type": "int32", "versions": "10+"}],
  "response": [
    {"name": "ThrottleTimeMs", "type": "int32", "versions": "2+"},
    {"name": "Topics", "type": "[]ListOffsetsTopicResponse", "versions": "0+", "fields": [
      {"name": "Name", "type": "string", "versions": "0+"},
      {"name": "Partitions", "type": "[]ListOffsetsPartitionResponse", "versions": "0+",
       "fields": [
        {"name": "PartitionIndex", "type": "int32", "versions": "0+"},
        {"name": "ErrorCode", "type": "int16", "versions": "0+"},
        {"name": "OldStyleOffsets", "type": "[]int64", "versions": "0"},
        {"name": "Timestamp", "type": "int64", "versions": "1+", "default": "-1"},
        {"name": "Offset", "type": "int64", "versions": "1+", "default": "-1"},
        {"name": "LeaderEpoch", "type": "int32", "versions": "4+", "default": "-1"}]}]}]
}""")
_INTS = {"int8": "b", "int16": "h", "int32": "i", "int64": "q"}


def _in(versions: str, version: int) -> bool:
    if versions.endswith("+"):
        return version >= int(versions[:-1])
    lo, _, hi = versions.partition("-")
    return int(lo) <= version <= int(hi or lo)


def _encode(fields: list[dict[str, Any]], obj: dict[str, Any], version: int) -> bytes:
    """Kafka's generated ``write`` for a non-flexible version, driven by the schema."""
    out = b""
    for f in fields:
        if not _in(f["versions"], version):
            continue
        value = obj[f["name"]]
        kind = f["type"]
        if kind in _INTS:
            out += struct.pack(">" + _INTS[kind], value)
        elif kind == "string":
            raw = value.encode()
            out += struct.pack(">h", len(raw)) + raw
        elif kind.startswith("[]") and kind[2:] in _INTS:
            out += struct.pack(">i", len(value))
            out += b"".join(struct.pack(">" + _INTS[kind[2:]], v) for v in value)
        else:
            assert kind.startswith("[]"), kind
            out += struct.pack(">i", len(value))
            out += b"".join(_encode(f["fields"], v, version) for v in value)
    return out


def _request_obj(req: ListOffsetsRequestV0) -> dict[str, Any]:
    return {"ReplicaId": req.replica_id, "Topics": [
        {"Name": t.name, "Partitions": [
            {"PartitionIndex": p.partition_index, "Timestamp": p.timestamp,
             "MaxNumOffsets": p.max_num_offsets} for p in t.partitions]}
        for t in req.topics]}


def _response_obj(topics: list[tuple[str, list[ListOffsetsPartitionResponseV0]]]
                  ) -> dict[str, Any]:
    return {"Topics": [
        {"Name": name, "Partitions": [
            {"PartitionIndex": p.partition_index, "ErrorCode": p.error_code,
             "OldStyleOffsets": list(p.old_style_offsets)} for p in parts]}
        for name, parts in topics]}


def _header_v1(api_key: int, version: int, correlation_id: int, client_id: str | None) -> bytes:
    if client_id is None:
        return struct.pack(">hhih", api_key, version, correlation_id, -1)
    raw = client_id.encode()
    return struct.pack(">hhih", api_key, version, correlation_id, len(raw)) + raw


_names = st.text(st.characters(codec="utf-8"), max_size=20)
_i32 = st.integers(-(2**31), 2**31 - 1)
_requests = st.builds(
    ListOffsetsRequestV0, _i32,
    st.lists(st.builds(ListOffsetsTopicV0, _names, st.lists(st.builds(
        ListOffsetsPartitionV0, _i32, st.integers(-(2**63), 2**63 - 1), _i32),
        max_size=4).map(tuple)), max_size=4).map(tuple))
_responses = st.lists(st.tuples(_names, st.lists(st.builds(
    ListOffsetsPartitionResponseV0, _i32, st.integers(-(2**15), 2**15 - 1),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5).map(tuple)), max_size=4)),
    max_size=4)


# ------------------------------------------------------------------ bytes as Kafka 3.9 writes


@settings(max_examples=300, deadline=None)
@given(_requests)
def test_request_v0_decodes_what_kafkas_schema_encodes(req: ListOffsetsRequestV0) -> None:
    wire = _encode(_SCHEMAS["request"], _request_obj(req), 0)
    assert decode_list_offsets_v0(wire, 0) == req
    # the v1 encoding of the same request differs (no max_num_offsets): v0 is its own
    if any(t.partitions for t in req.topics):
        assert _encode(_SCHEMAS["request"], {**_request_obj(req)}, 1) != wire


@settings(max_examples=300, deadline=None)
@given(_responses)
def test_response_v0_is_what_kafkas_schema_encodes(topics: list[
        tuple[str, list[ListOffsetsPartitionResponseV0]]]) -> None:
    out = encode_list_offsets_v0(topics)
    assert out == _encode(_SCHEMAS["response"], _response_obj(topics), 0)
    assert decode_list_offsets_v0_response(out) == topics


def test_one_request_and_response_byte_by_byte() -> None:
    """One example written out, field by field, as Kafka 3.9 writes it."""
    req = (b"\xff\xff\xff\xff"                   # replica_id -1 (a consumer)
           b"\x00\x00\x00\x01"                   # 1 topic
           b"\x00\x06events"                     # name
           b"\x00\x00\x00\x02"                   # 2 partitions
           b"\x00\x00\x00\x00" + struct.pack(">q", -1) + b"\x00\x00\x00\x01"   # p0 latest, 1
           + b"\x00\x00\x00\x03" + struct.pack(">q", -2) + b"\x00\x00\x00\x0a")  # p3 earliest
    assert decode_list_offsets_v0(req, 0) == ListOffsetsRequestV0(-1, (ListOffsetsTopicV0(
        "events", (ListOffsetsPartitionV0(0, -1, 1), ListOffsetsPartitionV0(3, -2, 10))),))
    resp = encode_list_offsets_v0([("events", [
        ListOffsetsPartitionResponseV0(0, 0, (42,)),
        ListOffsetsPartitionResponseV0(3, 3, ())])])
    assert resp == (b"\x00\x00\x00\x01" b"\x00\x06events" b"\x00\x00\x00\x02"
                    b"\x00\x00\x00\x00" b"\x00\x00" b"\x00\x00\x00\x01" + struct.pack(">q", 42)
                    + b"\x00\x00\x00\x03" b"\x00\x03" b"\x00\x00\x00\x00")


def test_sarama_vectors() -> None:
    """What sarama (Burrow's client) sends as ListOffsets v0 and how it reads the answer."""
    one_block = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 1, 0, 3, *b"foo", 0, 0, 0, 1,
                       0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2])
    assert decode_list_offsets_v0(one_block, 0) == ListOffsetsRequestV0(
        -1, (ListOffsetsTopicV0("foo", (ListOffsetsPartitionV0(4, 1, 2),)),))
    normal_response = bytes([0, 0, 0, 2, 0, 1, *b"a", 0, 0, 0, 0,
                             0, 1, *b"z", 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 2,
                             0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 6])
    topics = [("a", []), ("z", [ListOffsetsPartitionResponseV0(2, 0, (5, 6))])]
    assert encode_list_offsets_v0(topics) == normal_response
    assert decode_list_offsets_v0_response(normal_response) == topics


# ------------------------------------------------------------------ routing through the codec


def test_decode_request_routes_v0_to_the_hand_codec() -> None:
    body = _encode(_SCHEMAS["request"], _request_obj(ListOffsetsRequestV0(-1, (
        ListOffsetsTopicV0("t", (ListOffsetsPartitionV0(0, -1, 1),)),))), 0)
    for client_id in ("sarama", None, "é"):
        r = decode_request(_header_v1(2, 0, 99, client_id) + body)
        assert (r.header.api_key, r.header.api_version, r.header.correlation_id,
                r.header.client_id) == (2, 0, 99, client_id)
        assert r.body == ListOffsetsRequestV0(-1, (ListOffsetsTopicV0(
            "t", (ListOffsetsPartitionV0(0, -1, 1),)),))
    # v1 still goes through kio (its own layout: no max_num_offsets)
    v1 = decode_request(_header_v1(2, 1, 5, "c") + _encode(
        _SCHEMAS["request"], {"ReplicaId": -1, "Topics": [{"Name": "t", "Partitions": [
            {"PartitionIndex": 0, "Timestamp": -1}]}]}, 1))
    assert not isinstance(v1.body, ListOffsetsRequestV0)
    assert v1.body.topics[0].partitions[0].timestamp == -1


def test_v0_response_frame_has_a_v0_header() -> None:
    body = encode_list_offsets_v0([("t", [ListOffsetsPartitionResponseV0(0, 0, (7,))])])
    chunks = encode_response_chunks(2, 0, 1234, EncodedBody([body], len(body)))
    frame = b"".join(bytes(c) for c in chunks)
    size, cid = struct.unpack_from(">ii", frame)
    assert (size, cid) == (len(frame) - 4, 1234)
    assert frame[8:] == body  # no tagged-field byte: response header v0


def test_api_versions_advertise_produce_from_v0_and_list_offsets_from_v0() -> None:
    ranges = {k: (lo, hi) for k, lo, hi in advertised_versions()}
    assert ranges[0] == (0, 12)   # Kafka 4.0: Produce 0-12 in ApiVersions (KAFKA-18659)
    assert ranges[2] == (0, 10)   # Kafka 3.9: ListOffsets 0-9 (here up to 10)
    assert ranges[1][0] == 4 and ranges[3][0] == 0  # Fetch v4+, Metadata v0+
    assert supported_versions(2) == (0, 11) and supported_versions(0) == (0, 13)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_produce_v0_to_v2_are_refused(version: int) -> None:
    """Kafka 4.0's socket server throws UnsupportedVersionException for Produce v0-v2
    although ApiVersions lists them; the server closes the connection (an UnknownApiError
    that is not ApiVersions)."""
    frame = _header_v1(0, version, 3, "rdkafka") + struct.pack(">hii", 1, 1000, 0)
    with pytest.raises(UnsupportedVersionError, match="UNSUPPORTED_VERSION"):
        decode_request(frame)


# ------------------------------------------------------------------ hostile bytes


def test_every_truncation_is_a_protocol_error() -> None:
    body = _encode(_SCHEMAS["request"], _request_obj(ListOffsetsRequestV0(-1, (
        ListOffsetsTopicV0("topic-a", (ListOffsetsPartitionV0(0, -1, 1),
                                       ListOffsetsPartitionV0(1, -2, 5))),
        ListOffsetsTopicV0("b", ()),))), 0)
    frame = _header_v1(2, 0, 1, "x") + body
    decode_request(frame)
    for n in range(len(frame)):
        with pytest.raises(ProtocolError):
            decode_request(frame[:n])


@pytest.mark.parametrize("claim", [2**31 - 1, 2**20, 3, -1, -(2**31)])
def test_huge_or_null_claims_are_refused_before_allocating(claim: int) -> None:
    head = _header_v1(2, 0, 1, None) + b"\xff\xff\xff\xff"
    partition = struct.pack(">iqi", 0, -1, 1)
    for body in (struct.pack(">i", claim) + b"\x00\x01t\x00\x00\x00\x00",       # topics
                 b"\x00\x00\x00\x01\x00\x01t" + struct.pack(">i", claim) + partition):
        with pytest.raises(ProtocolError):
            decode_request(head + body)
    with pytest.raises(ProtocolError):  # a null topic name
        decode_request(head + b"\x00\x00\x00\x01\xff\xff\x00\x00\x00\x00")
    with pytest.raises(ProtocolError):  # a name that is not UTF-8
        decode_request(head + b"\x00\x00\x00\x01\x00\x01\xff\x00\x00\x00\x00")


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=80))
def test_random_bodies_decode_or_raise_protocol_error(junk: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_request(_header_v1(2, 0, 1, "f") + junk)


# ------------------------------------------------------------------ legacyFetchOffsetsBefore


_SEGS = [(0, 1000), (100, 2000), (250, 3000), (400, 9000)]  # last: (log end, now)


@pytest.mark.parametrize("timestamp,max_num,expected", [
    (-1, 1, [400]), (-1, 3, [400, 250, 100]), (-1, 10, [400, 250, 100, 0]),
    (-2, 1, [0]), (-2, 5, [0]),
    (2500, 1, [100]), (2500, 5, [100, 0]), (2000, 5, [100, 0]), (999, 5, []),
    (10_000, 2, [400, 250]), (-1, 0, []),
])
def test_legacy_offsets_before(timestamp: int, max_num: int, expected: list[int]) -> None:
    assert legacy_offsets_before(_SEGS, timestamp, max_num) == expected


def test_legacy_offsets_before_negative_count_fails_the_partition() -> None:
    with pytest.raises(ValueError):
        legacy_offsets_before(_SEGS, -1, -1)


def test_the_fuzz_harness_reads_a_v0_answer_with_the_hand_codec() -> None:
    """The request fuzzer draws ListOffsets v0 now and then (an advertised version kio has
    no schema for): its checker reads the broker's answer with this module's decoder, and
    refuses a torn one, instead of failing on kio's missing schema (a loaded run's
    ``test_mutant_stream_against_broker`` failed so)."""
    from tests.fuzz.wire import check_response

    request = struct.pack(">hhi", 2, 0, 77) + b"\x00\x02me" + (
        b"\xff\xff\xff\xff" b"\x00\x00\x00\x01" b"\x00\x01t" b"\x00\x00\x00\x01"
        b"\x00\x00\x00\x00" + struct.pack(">q", -1) + b"\x00\x00\x00\x01")
    body = encode_list_offsets_v0([("t", [ListOffsetsPartitionResponseV0(0, 0, (5,))])])
    check_response(request, struct.pack(">i", 77) + body)
    with pytest.raises(ProtocolError):
        check_response(request, struct.pack(">i", 77) + body[:-3])
