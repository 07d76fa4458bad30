"""A follower's Fetch v12, encoded and decoded by hand (protocol/replica_fetch.py): the
request is kio's byte for byte, the response reads as kio reads it, and bytes that do not
parse raise FetchDecodeError and nothing else (R-REP-3, R-NF-1)."""

from __future__ import annotations

import contextlib
import datetime
import io
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from headrace.protocol.codec import encode_response, response_class
from headrace.protocol.entities import build
from headrace.protocol.replica_fetch import (
    FetchDecodeError,
    decode_fetch_response,
    encode_fetch_request,
)

_i32 = st.integers(-(2**31), 2**31 - 1)
_i64 = st.integers(-(2**63), 2**63 - 1)
_name = st.text(min_size=1, max_size=20)
_partition_req = st.tuples(st.integers(0, 2**31 - 1), _i32, _i64, _i32, _i64, _i32)


@settings(max_examples=200, deadline=None)
@given(cid=st.integers(0, 2**31 - 1), client=st.one_of(st.none(), st.text(max_size=20)),
       head=st.tuples(_i32, _i32, _i32, _i32, _i32, _i32),
       topics=st.lists(st.tuples(_name, st.lists(_partition_req, max_size=3)), max_size=3),
       forgotten=st.lists(st.tuples(_name, st.lists(_i32, max_size=3)), max_size=2),
       rack=st.text(max_size=10))
def test_the_request_is_kios(cid: int, client: str | None,
                             head: tuple[int, int, int, int, int, int],
                             topics: list[tuple[str, list[tuple[int, ...]]]],
                             forgotten: list[tuple[str, list[int]]], rack: str) -> None:
    replica, wait, min_bytes, max_bytes, session, epoch = head
    ours = encode_fetch_request(cid, client, replica, wait, min_bytes, max_bytes, session,
                                epoch, topics, forgotten, rack)  # type: ignore[arg-type]
    cls = load_request_schema(1, 12)
    hdr = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(hdr)(buf, hdr(request_api_key=i16(1), request_api_version=i16(12),
                                correlation_id=i32(cid), client_id=client))
    entity_writer(cls)(buf, build(cls, {
        "replica_id": replica, "max_wait": wait, "min_bytes": min_bytes,
        "max_bytes": max_bytes, "isolation_level": 0, "session_id": session,
        "session_epoch": epoch,
        "topics": [{"topic": t, "partitions": [
            {"partition": p, "current_leader_epoch": le, "fetch_offset": fo,
             "last_fetched_epoch": lfe, "log_start_offset": ls, "partition_max_bytes": mb}
            for p, le, fo, lfe, ls, mb in ps]} for t, ps in topics],
        "forgotten_topics_data": [{"topic": t, "partitions": ps} for t, ps in forgotten],
        "rack_id": rack}))
    theirs = buf.getvalue()
    assert ours == struct.pack(">i", len(theirs)) + theirs


_aborted = st.one_of(st.none(), st.lists(st.tuples(_i64, _i64), max_size=2))
_partition_resp = st.fixed_dictionaries({
    "partition_index": st.integers(0, 2**31 - 1),
    "error_code": st.sampled_from([0, 1, 6, 74, 75]),
    "high_watermark": _i64, "last_stable_offset": _i64, "log_start_offset": _i64,
    "aborted_transactions": _aborted, "preferred_read_replica": _i32,
    "records": st.one_of(st.none(), st.binary(max_size=40)),
    "diverging": st.one_of(st.none(), st.tuples(_i32, _i64)),
})


def _kio_frame(cid: int, throttle: int, error: int, session: int,
               topics: list[tuple[str, list[dict]]]) -> bytes:  # type: ignore[type-arg]
    data = {
        "throttle_time": throttle, "error_code": error, "session_id": session,
        "responses": [{"topic": t, "partitions": [{
            "partition_index": p["partition_index"], "error_code": p["error_code"],
            "high_watermark": p["high_watermark"],
            "last_stable_offset": p["last_stable_offset"],
            "log_start_offset": p["log_start_offset"],
            "aborted_transactions": None if p["aborted_transactions"] is None else [
                {"producer_id": a, "first_offset": b} for a, b in p["aborted_transactions"]],
            "preferred_read_replica": p["preferred_read_replica"],
            "records": p["records"],
            **({} if p["diverging"] is None else {"diverging_epoch": {
                "epoch": p["diverging"][0], "end_offset": p["diverging"][1]}}),
        } for p in ps]} for t, ps in topics],
    }
    whole = encode_response(1, 12, cid, build(response_class(1, 12), data))
    return whole[4:]


_topics = st.lists(st.tuples(_name, st.lists(_partition_resp, max_size=3)), max_size=3)


@settings(max_examples=200, deadline=None)
@given(cid=st.integers(0, 2**31 - 1), throttle=st.integers(0, 2**31 - 1),
       error=st.sampled_from([0, 70, 71]), session=_i32, topics=_topics)
def test_the_response_reads_as_kio_reads_it(cid: int, throttle: int, error: int,
                                            session: int, topics: list) -> None:  # type: ignore[type-arg]
    frame = _kio_frame(cid, throttle, error, session, topics)
    answered, ours = decode_fetch_response(frame)
    rcls = load_response_schema(1, 12)
    header, n = entity_reader(rcls.__header_schema__)(frame, 0)
    theirs, _ = entity_reader(rcls)(frame, n)
    assert answered == header.correlation_id == cid
    ms = datetime.timedelta(milliseconds=1)
    assert (ours.throttle_time_ms, ours.error_code, ours.session_id) == (
        theirs.throttle_time // ms, theirs.error_code, theirs.session_id)
    assert len(ours.responses) == len(theirs.responses)
    for o, t in zip(ours.responses, theirs.responses, strict=True):
        assert o.topic == t.topic
        assert len(o.partitions) == len(t.partitions)
        for op, tp in zip(o.partitions, t.partitions, strict=True):
            assert (op.partition_index, op.error_code, op.high_watermark,
                    op.last_stable_offset, op.log_start_offset, op.preferred_read_replica) == (
                tp.partition_index, tp.error_code, tp.high_watermark, tp.last_stable_offset,
                tp.log_start_offset, tp.preferred_read_replica)
            assert (None if op.records is None else bytes(op.records)) == tp.records
            theirs_aborted = (None if tp.aborted_transactions is None else tuple(
                (a.producer_id, a.first_offset) for a in tp.aborted_transactions))
            assert op.aborted_transactions == theirs_aborted
            assert (op.diverging_epoch.epoch, op.diverging_epoch.end_offset) == (
                tp.diverging_epoch.epoch, tp.diverging_epoch.end_offset)


@settings(max_examples=300, deadline=None)
@given(topics=_topics, cut=st.integers(0, 10**6), flip=st.tuples(st.integers(0, 10**6),
                                                                    st.integers(1, 255)))
def test_damaged_responses_raise_fetch_decode_error_only(topics: list, cut: int,  # type: ignore[type-arg]
                                                         flip: tuple[int, int]) -> None:
    frame = bytearray(_kio_frame(7, 0, 0, 1, topics))
    frame[flip[0] % len(frame)] ^= flip[1]
    for damaged in (bytes(frame), bytes(frame[:cut % len(frame)])):
        with contextlib.suppress(FetchDecodeError):  # and nothing else
            decode_fetch_response(damaged)


def test_a_count_the_bytes_cannot_hold_is_refused_before_allocation() -> None:
    # header (correlation id, no tags), throttle, error, session, then 2**28 topics
    frame = struct.pack(">i", 1) + b"\0" + struct.pack(">ihi", 0, 0, 0) + b"\xff\xff\xff\xff\x01"
    try:
        decode_fetch_response(frame)
    except FetchDecodeError as e:
        assert "elements" in str(e)
    else:
        raise AssertionError("accepted")

