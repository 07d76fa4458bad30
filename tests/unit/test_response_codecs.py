"""The hand-written ProduceResponse and OffsetCommitResponse encoders write what kio's
generic writer writes, at every version the broker serves (Produce v3-v12, v0-v2 being
refused before the handler, ``protocol/legacy.py``; OffsetCommit v2-v9) (R-PROTO-3): a
client reads the same answer."""

from __future__ import annotations

import datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from headrace.protocol.codec import (
    ProducePartition,
    encode_offset_commit_body,
    encode_produce_body,
    encode_response,
    encode_response_chunks,
    response_class,
)
from headrace.protocol.entities import build

_codes = st.sampled_from([ErrorCode.none, ErrorCode.not_leader_or_follower,
                          ErrorCode.invalid_record, ErrorCode.request_timed_out,
                          ErrorCode.not_enough_replicas_after_append])
_text = st.text(max_size=40)
_partition = st.builds(
    ProducePartition,
    index=st.integers(0, 2**31 - 1),
    error_code=_codes,
    base_offset=st.integers(-1, 2**63 - 1),
    log_append_time_ms=st.one_of(st.just(-1), st.integers(0, 2**45)),
    log_start_offset=st.integers(-1, 2**63 - 1),
    error_message=st.one_of(st.none(), _text),
    record_errors=st.lists(st.tuples(st.integers(0, 2**31 - 1), _text), max_size=3)
    .map(tuple),
)
_responses = st.lists(st.tuples(st.text(min_size=1, max_size=30),
                                st.lists(_partition, max_size=4)), max_size=4)


def _kio_bytes(version: int, cid: int, responses: list[tuple[str, list[ProducePartition]]],
               throttle_ms: int) -> bytes:
    """The same response through kio (what the handler answered before)."""
    data = {
        "responses": [
            {"name": name, "partition_responses": [
                {"index": p.index, "error_code": p.error_code, "base_offset": p.base_offset,
                 "log_append_time": None if p.log_append_time_ms < 0 else
                 datetime.datetime.fromtimestamp(p.log_append_time_ms / 1000, datetime.UTC),
                 "log_start_offset": p.log_start_offset,
                 "record_errors": tuple({"batch_index": i, "batch_index_error_message": m}
                                        for i, m in p.record_errors),
                 "error_message": p.error_message} for p in parts]}
            for name, parts in responses],
        "throttle_time": throttle_ms,
    }
    return encode_response(0, version, cid, build(response_class(0, version), data))


@settings(max_examples=300, deadline=None)
@given(version=st.integers(3, 12), cid=st.integers(0, 2**31 - 1), responses=_responses,
       throttle_ms=st.integers(0, 10**6))
def test_the_hand_written_produce_response_is_kios(
        version: int, cid: int, responses: list[tuple[str, list[ProducePartition]]],
        throttle_ms: int) -> None:
    for _, parts in responses:  # what a version cannot carry is not written
        for p in parts:
            if version < 8:
                p.record_errors, p.error_message = (), None
            if version < 5:
                p.log_start_offset = -1
    body = encode_produce_body(version, responses)
    ours = b"".join(encode_response_chunks(0, version, cid, body))
    assert ours == _kio_bytes(version, cid, responses, 0)
    # a quota's throttle time lands in the field (``with_throttle_time``)
    throttled = b"".join(encode_response_chunks(
        0, version, cid, body.with_throttle_time(throttle_ms)))
    assert throttled == _kio_bytes(version, cid, responses, throttle_ms)


@settings(max_examples=200, deadline=None)
@given(version=st.integers(2, 9), cid=st.integers(0, 2**31 - 1),
       topics=st.lists(st.tuples(st.text(min_size=1, max_size=30), st.lists(
           st.tuples(st.integers(0, 2**31 - 1), _codes.map(int)), max_size=4)), max_size=4),
       throttle_ms=st.integers(0, 10**6))
def test_the_hand_written_offset_commit_response_is_kios(
        version: int, cid: int, topics: list[tuple[str, list[tuple[int, int]]]],
        throttle_ms: int) -> None:
    """OffsetCommit's answer (every synchronous commit waits for it) is kio's too."""
    body = encode_offset_commit_body(version, topics)

    def kio_bytes(throttle: int) -> bytes:
        data: dict[str, object] = {"topics": [
            {"name": name, "partitions": [{"partition_index": i, "error_code": c}
                                          for i, c in parts]} for name, parts in topics]}
        if version >= 3:
            data["throttle_time"] = throttle
        return encode_response(8, version, cid, build(response_class(8, version), data))

    assert b"".join(encode_response_chunks(8, version, cid, body)) == kio_bytes(0)
    throttled = body.with_throttle_time(throttle_ms)
    if version >= 3:
        assert b"".join(encode_response_chunks(8, version, cid, throttled)) == kio_bytes(
            throttle_ms)
    else:
        assert throttled is body
