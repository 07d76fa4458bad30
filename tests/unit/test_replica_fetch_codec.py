"""A follower's Fetch v12 request, encoded by hand (protocol/replica_fetch.py), is kio's
byte for byte (R-REP-3)."""

from __future__ import annotations

import io
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from headrace.protocol.entities import build
from headrace.protocol.replica_fetch import (
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
