"""PURE: Fetch v12 as a follower speaks it, by hand (R-REP-3).

A follower sends a Fetch to its leader for every round of replication: with RF 3 and acks=all
each acknowledged Produce costs two of them on the leader's followers, and kio's generic
writer and reader (a dataclass and a validated primitive per field) were most of a
follower's CPU. ``encode_fetch_request`` writes the request frame (size prefix and request
header v2 included) byte for byte as kio writes it; ``decode_fetch_response`` reads a
FetchResponse v12 frame (after its size prefix) into plain objects with the names kio's
entities use, the records as zero-copy slices of the frame.

Hostile input: every length and count the leader claims is checked against the bytes it
sent before anything is allocated; anything that does not parse raises
``FetchDecodeError``, never another exception.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

FETCH_KEY = 1
FETCH_VERSION = 12

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")  # api key, api version, correlation id
_BODY_HEAD = struct.Struct(">iiiibii")  # replica, max wait, min bytes, max bytes, iso, session
_PARTITION = struct.Struct(">iiqiqi")  # partition, leader epoch, offset, last epoch, start, max
_RESP_HEAD = struct.Struct(">ihi")  # throttle, error, session
_PART_HEAD = struct.Struct(">ihqqq")  # index, error, hw, lso, log start
_ABORTED = struct.Struct(">qq")
_DIVERGING = struct.Struct(">iq")

# (partition, current_leader_epoch, fetch_offset, last_fetched_epoch, log_start_offset,
#  partition_max_bytes)
PartitionRequest = tuple[int, int, int, int, int, int]


class FetchDecodeError(ValueError):
    """A FetchResponse that does not parse: the connection is not to be trusted."""


class DivergingEpoch(NamedTuple):
    epoch: int
    end_offset: int


NO_DIVERGENCE = DivergingEpoch(-1, -1)


class FetchedPartition(NamedTuple):
    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: tuple[tuple[int, int], ...] | None
    preferred_read_replica: int
    records: memoryview | None
    diverging_epoch: DivergingEpoch


class FetchedTopic(NamedTuple):
    topic: str
    partitions: list[FetchedPartition]


class FetchResponse(NamedTuple):
    throttle_time_ms: int
    error_code: int
    session_id: int
    responses: list[FetchedTopic]


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _compact_string(text: str) -> bytes:
    raw = text.encode()
    return _uvarint(len(raw) + 1) + raw


def encode_fetch_request(
    correlation_id: int, client_id: str | None, replica_id: int, max_wait_ms: int,
    min_bytes: int, max_bytes: int, session_id: int, session_epoch: int,
    topics: Sequence[tuple[str, Sequence[PartitionRequest]]],
    forgotten: Sequence[tuple[str, Sequence[int]]], rack_id: str = "",
    isolation_level: int = 0,
) -> bytes:
    """The whole Fetch v12 request frame, its size prefix included."""
    out = bytearray(4)
    out += _HEADER.pack(FETCH_KEY, FETCH_VERSION, correlation_id)
    if client_id is None:
        out += b"\xff\xff"
    else:
        raw = client_id.encode()
        out += _I16.pack(len(raw)) + raw
    out += b"\0"  # the header's tagged fields
    out += _BODY_HEAD.pack(replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level,
                           session_id, session_epoch)
    out += _uvarint(len(topics) + 1)
    for topic, partitions in topics:
        out += _compact_string(topic)
        out += _uvarint(len(partitions) + 1)
        for p in partitions:
            out += _PARTITION.pack(*p)
            out += b"\0"
        out += b"\0"
    out += _uvarint(len(forgotten) + 1)
    for topic, indexes in forgotten:
        out += _compact_string(topic)
        out += _uvarint(len(indexes) + 1)
        for i in indexes:
            out += _I32.pack(i)
        out += b"\0"
    out += _compact_string(rack_id)
    out += b"\0"
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


class _Reader:
    """Bounds-checked reads from one frame."""

    __slots__ = ("data", "end", "pos", "view")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.view = memoryview(data)
        self.pos = 0
        self.end = len(data)

    def unpack(self, s: struct.Struct) -> tuple[int, ...]:
        pos = self.pos
        if pos + s.size > self.end:
            raise FetchDecodeError(f"the response ends inside a field at byte {pos}")
        self.pos = pos + s.size
        return s.unpack_from(self.data, pos)

    def uvarint(self) -> int:
        data, pos, end = self.data, self.pos, self.end
        value = shift = 0
        for _ in range(5):
            if pos >= end:
                raise FetchDecodeError("the response ends inside a varint")
            b = data[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return value
            shift += 7
        raise FetchDecodeError("a varint longer than 5 bytes")

    def count(self, least_size: int) -> int:
        """A compact array's length (-1: null), each element at least ``least_size`` bytes:
        a count the remaining bytes cannot hold is refused before anything is allocated."""
        n = self.uvarint() - 1
        if n > (self.end - self.pos) // least_size:
            raise FetchDecodeError(f"an array of {n} elements in {self.end - self.pos} bytes")
        return n

    def bytes_(self) -> memoryview | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        pos = self.pos
        if pos + n > self.end:
            raise FetchDecodeError(f"{n} bytes claimed, {self.end - pos} left")
        self.pos = pos + n
        return self.view[pos:pos + n]

    def string(self) -> str:
        raw = self.bytes_()
        if raw is None:
            raise FetchDecodeError("a null topic name")
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise FetchDecodeError("a topic name that is not UTF-8") from None

    def tags(self) -> dict[int, memoryview]:
        """A tagged-field section: {tag: its bytes} (skipped by size when not wanted)."""
        n = self.uvarint()  # a plain count, not a compact array's count + 1
        if n > (self.end - self.pos) // 2:
            raise FetchDecodeError(f"{n} tagged fields in {self.end - self.pos} bytes")
        found: dict[int, memoryview] = {}
        for _ in range(n):
            tag = self.uvarint()
            raw = self.bytes_sized(self.uvarint())
            found[tag] = raw
        return found

    def bytes_sized(self, n: int) -> memoryview:
        pos = self.pos
        if pos + n > self.end:
            raise FetchDecodeError(f"a tagged field of {n} bytes, {self.end - pos} left")
        self.pos = pos + n
        return self.view[pos:pos + n]


def decode_fetch_response(frame: bytes) -> tuple[int, FetchResponse]:
    """(correlation id, the response) of a FetchResponse v12 frame (after its size
    prefix). Raises ``FetchDecodeError`` for anything that does not parse."""
    r = _Reader(frame)
    (correlation_id,) = r.unpack(_I32)
    r.tags()  # response header v1
    throttle, error, session = r.unpack(_RESP_HEAD)
    topics: list[FetchedTopic] = []
    for _ in range(max(r.count(3), 0)):
        name = r.string()
        partitions: list[FetchedPartition] = []
        for _ in range(max(r.count(_PART_HEAD.size + 7), 0)):
            index, code, hw, lso, start = r.unpack(_PART_HEAD)
            n_aborted = r.count(_ABORTED.size + 1)
            aborted: tuple[tuple[int, int], ...] | None = None
            if n_aborted >= 0:
                items = []
                for _ in range(n_aborted):
                    producer_id, first_offset = r.unpack(_ABORTED)
                    r.tags()
                    items.append((producer_id, first_offset))
                aborted = tuple(items)
            (preferred,) = r.unpack(_I32)
            records = r.bytes_()
            diverging = NO_DIVERGENCE
            tagged = r.tags()
            raw = tagged.get(0)
            if raw is not None:
                sub = _Reader(bytes(raw))
                epoch, end_offset = sub.unpack(_DIVERGING)
                sub.tags()
                diverging = DivergingEpoch(epoch, end_offset)
            partitions.append(FetchedPartition(index, code, hw, lso, start, aborted,
                                               preferred, records, diverging))
        r.tags()
        topics.append(FetchedTopic(name, partitions))
    r.tags()
    if r.pos != r.end:
        raise FetchDecodeError(f"{r.end - r.pos} bytes after the response")
    return correlation_id, FetchResponse(throttle, error, session, topics)
