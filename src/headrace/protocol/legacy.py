"""PURE: request versions Kafka 3.9 served that kio (generated from Kafka 4's schemas) lacks.

Kafka 4.0 removed old protocol versions (KIP-896), and kio's schemas follow it. Tools built
on older clients still send some of them; headrace serves what Kafka 3.9 served where a
tool needs it, and advertises what Kafka 4.0 advertises:

- **ListOffsets v0** (``ListOffsetsRequest.json`` / ``ListOffsetsResponse.json`` of Kafka
  3.9, "validVersions": "0-10"): sarama-based tools send it whatever Kafka version they are
  configured for (Burrow asks every partition's newest offset with it). Hand-decoded and
  hand-encoded here; ``codec.decode_request`` and ``codec.encode_response_chunks`` route
  (2, 0) to this module.
- **Produce v0-v2**: advertised, never served (``ADVERTISED_ONLY``). Kafka 4.0 advertises
  Produce from v0 in ApiVersions (``ApiKeys.PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION``,
  KAFKA-18659) because librdkafka before its fix (librdkafka issue 4956) checks "Produce
  v0 supported" before it compresses with gzip, snappy or lz4, and silently sends
  uncompressed batches otherwise (Debian's kcat, librdkafka 2.0.2, among them).
  A v0-v2 request is still refused as Kafka 4.0's socket server refuses it
  (``UnsupportedVersionException`` while parsing the header: the connection is closed).
  Clients pick the highest common version, so none sends them.

ListOffsets v0, non-flexible (request header v1, response header v0), every integer
big-endian::

    request body                         response body
    int32 replica_id                     int32 topic count, each:
    int32 topic count, each:               int16 name length, name (UTF-8)
      int16 name length, name (UTF-8)      int32 partition count, each:
      int32 partition count, each:           int32 partition_index
        int32 partition_index                int16 error_code
        int64 timestamp                      int32 offset count, each:
        int32 max_num_offsets                  int64 offset (newest first)

Every count and length is checked against the bytes left before anything is built
(``ProtocolError``: the peer's bytes), as the kio path's ``prescan`` does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from headrace.protocol.errors import ProtocolError

LIST_OFFSETS = 2
PRODUCE = 0

HAND_CODED: frozenset[tuple[int, int]] = frozenset({(LIST_OFFSETS, 0)})
"""(api key, version) pairs decoded and encoded by this module instead of kio."""

ADVERTISED_ONLY: dict[int, tuple[int, int]] = {PRODUCE: (0, 2)}
"""api key -> (lowest, highest) version advertised in ApiVersions but refused (KAFKA-18659)."""

LEGACY_MIN: dict[int, int] = {LIST_OFFSETS: 0, PRODUCE: 0}
"""api key -> the lowest version advertised, where below kio's lowest schema."""


def is_refused(api_key: int, api_version: int) -> bool:
    """Whether this version is advertised but refused (Produce v0-v2)."""
    lo, hi = ADVERTISED_ONLY.get(api_key, (0, -1))
    return lo <= api_version <= hi

_HEAD = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION_V0 = struct.Struct(">iqi")  # partition_index, timestamp, max_num_offsets
_PARTITION_OUT = struct.Struct(">ihi")  # partition_index, error_code, offset count


@dataclass(frozen=True, slots=True)
class ListOffsetsPartitionV0:
    """One partition of a v0 request; field names as kio's later versions name them."""

    partition_index: int
    timestamp: int
    max_num_offsets: int


@dataclass(frozen=True, slots=True)
class ListOffsetsTopicV0:
    name: str
    partitions: tuple[ListOffsetsPartitionV0, ...]


@dataclass(frozen=True, slots=True)
class ListOffsetsRequestV0:
    replica_id: int
    topics: tuple[ListOffsetsTopicV0, ...]


@dataclass(frozen=True, slots=True)
class ListOffsetsPartitionResponseV0:
    partition_index: int
    error_code: int
    old_style_offsets: tuple[int, ...]


class _Reader:
    """A cursor over one frame; every read is checked against the frame's end."""

    __slots__ = ("buf", "end", "label", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int, label: str) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf)
        self.label = label

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise ProtocolError(
                f"{self.label}: {what} needs {n} bytes, {self.end - self.pos} left")

    def unpack(self, s: struct.Struct, what: str) -> tuple[int, ...]:
        self.need(s.size, what)
        out = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return out

    def count(self, min_element: int, what: str) -> int:
        (n,) = self.unpack(_I32, what)
        if n < 0:
            raise ProtocolError(f"{self.label}: {what} is null ({n})")
        # Kafka: "Tried to allocate a collection of size N, but there are only M bytes
        # remaining"; each element takes at least ``min_element`` bytes
        if n * min_element > self.end - self.pos:
            raise ProtocolError(f"{self.label}: {what} claims {n} elements in "
                                f"{self.end - self.pos} bytes")
        return n

    def string(self, what: str) -> str:
        (n,) = self.unpack(_I16, what)
        if n < 0:
            raise ProtocolError(f"{self.label}: {what} is null")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode()
        except UnicodeDecodeError as e:
            raise ProtocolError(f"{self.label}: {what} is not UTF-8: {e}") from None


def read_header_v1(frame: bytes | memoryview) -> tuple[str | None, int]:
    """Request header v1 (key, version, correlation id, nullable client id): (client id,
    where the body starts)."""
    if len(frame) < _HEAD.size:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a v1 header")
    n = _HEAD.unpack_from(frame, 0)[3]
    pos = _HEAD.size
    if n < 0:
        return None, pos
    if n > len(frame) - pos:
        raise ProtocolError(f"client id of {n} bytes in a {len(frame)}-byte request")
    try:
        return bytes(frame[pos:pos + n]).decode(), pos + n
    except UnicodeDecodeError as e:
        raise ProtocolError(f"client id is not UTF-8: {e}") from None


def decode_list_offsets_v0(frame: bytes | memoryview, pos: int) -> ListOffsetsRequestV0:
    """The body of a ListOffsets v0 request starting at ``pos``. Bytes after it are
    ignored, as kio's path ignores them."""
    r = _Reader(frame, pos, "ListOffsets v0 request")
    (replica_id,) = r.unpack(_I32, "replica_id")
    topics = []
    # a topic is at least a name length and a partition count
    for _ in range(r.count(_I16.size + _I32.size, "topics")):
        name = r.string("topic name")
        parts = tuple(
            ListOffsetsPartitionV0(*r.unpack(_PARTITION_V0, "partition"))
            for _ in range(r.count(_PARTITION_V0.size, "partitions")))
        topics.append(ListOffsetsTopicV0(name, parts))
    return ListOffsetsRequestV0(replica_id, tuple(topics))


def encode_list_offsets_v0(
    topics: list[tuple[str, list[ListOffsetsPartitionResponseV0]]],
) -> bytes:
    """A ListOffsets v0 response body (no throttle time before v2)."""
    out = bytearray(_I32.pack(len(topics)))
    for name, partitions in topics:
        raw = name.encode()
        out += _I16.pack(len(raw)) + raw + _I32.pack(len(partitions))
        for p in partitions:
            out += _PARTITION_OUT.pack(p.partition_index, p.error_code,
                                       len(p.old_style_offsets))
            out += struct.pack(f">{len(p.old_style_offsets)}q", *p.old_style_offsets)
    return bytes(out)


def decode_list_offsets_v0_response(body: bytes | memoryview) -> list[
        tuple[str, list[ListOffsetsPartitionResponseV0]]]:
    """A v0 response body (tests and tools; the broker only encodes). Checked like a
    request: ``ProtocolError`` on anything short or inconsistent."""
    r = _Reader(body, 0, "ListOffsets v0 response")
    topics = []
    for _ in range(r.count(_I16.size + _I32.size, "topics")):
        name = r.string("topic name")
        parts = []
        for _ in range(r.count(_PARTITION_OUT.size, "partitions")):
            index, code = r.unpack(_PARTITION_OUT, "partition")[:2]
            r.pos -= _I32.size  # the offset count, read again as a checked count
            n = r.count(8, "offsets")
            offsets = r.unpack(struct.Struct(f">{n}q"), "offsets")
            parts.append(ListOffsetsPartitionResponseV0(index, code, tuple(offsets)))
        topics.append((name, parts))
    if r.pos != r.end:
        raise ProtocolError(f"{r.end - r.pos} bytes after the ListOffsets v0 response")
    return topics
