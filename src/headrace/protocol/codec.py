"""PURE: request/response headers and bodies through kio's generated schemas.

Request frame (after the size prefix), R-PROTO-1::

    int16 request_api_key | int16 request_api_version | int32 correlation_id
    | nullable legacy string client_id | [tagged fields, header v2 only] | body

The header version follows the body's: flexible versions (KIP-482) use request header v2
(tagged fields), older ones v1. Responses carry ``correlation_id`` and, for flexible
versions, tagged fields (header v1) — except ApiVersions, whose response header is always
v0 so that a client that does not yet know our versions can read it.

kio's native reader raises ``KeyError`` on a tagged field it does not know; KIP-482 says a
receiver must skip them. ``decode_request`` therefore retries such a frame with
``_TolerantReader``, a schema walker built on kio's own field introspection and primitive
readers that skips unknown tags. It runs only for frames carrying unknown tags, so the
common path stays native.

Before kio sees a frame, ``prescan`` checks every length and count it claims against the
bytes it has (kio's native reader allocates from the claimed count: a 22-byte frame could
abort the process).

Readers and writers are cached per (api key, version): a kio lookup costs microseconds.

Fetch responses are the one hot path encoded by hand (``encode_fetch_body``): kio's writer
copies every record byte through a ``BytesIO`` (70-105 µs per MiB plus page faults on fresh
buffers), so the body is produced as a chunk list around the records as read from the
segment files, and ``encode_response_chunks`` frames it for ``writelines``/``writev``. Its
bytes equal kio's (``tests/unit/test_fetch_encoding.py``).
"""

from __future__ import annotations

import io
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, NamedTuple

from kio._kio_native import (
    get_reader,
    read_int8,
    read_int32,
    read_nullable_legacy_string,
    read_unsigned_varint,
)
from kio.index import load_request_schema, load_response_schema
from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader, entity_writer
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial.errors import SerialError  # DecodeError and OutOfBoundValue
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32

from headrace.protocol import legacy
from headrace.protocol.errors import ProtocolError, UnknownApiError, UnsupportedVersionError
from headrace.protocol.prescan import LengthError, prescanner

API_VERSIONS_KEY = 18
_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id
_SIZE = struct.Struct(">i")
_SIZE_CID = struct.Struct(">ii")


@dataclass(frozen=True, slots=True)
class RequestHeaderInfo:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeaderInfo
    body: Any


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a frame; ProtocolError if too short."""
    if len(frame) < _HEAD.size:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a header")
    key, version, correlation_id = _HEAD.unpack_from(frame, 0)
    return int(key), int(version), int(correlation_id)


@cache
def supported_versions(api_key: int) -> tuple[int, int] | None:
    """The (min, max) request versions kio has schemas for, or None; extended down to the
    older versions ``legacy`` decodes by hand (ListOffsets v0) or only advertises (Produce
    v0-v2, KAFKA-18659)."""
    name = api_key_map.get(api_key)  # type: ignore[call-overload,unused-ignore]
    if name is None:
        return None
    versions = [
        v for v, kinds in schema_name_map[name].items()
        if EntityType.request in kinds and EntityType.response in kinds
    ]
    if not versions:
        return None
    return min(min(versions), legacy.LEGACY_MIN.get(api_key, 2**15)), max(versions)


@cache
def request_class(api_key: int, api_version: int) -> Any:
    return load_request_schema(api_key, api_version)


@cache
def response_class(api_key: int, api_version: int) -> Any:
    return load_response_schema(api_key, api_version)


@cache
def _readers(api_key: int, api_version: int) -> tuple[
        Any, Any, Any, Any, Callable[[Any, int], int]]:
    req_cls = request_class(api_key, api_version)
    header_cls = req_cls.__header_schema__
    return (header_cls, entity_reader(header_cls), req_cls, entity_reader(req_cls),
            prescanner(api_key, api_version))


def decode_request(frame: bytes | memoryview) -> Request:
    """Decode one request frame. Raises ``UnknownApiError`` / ``ProtocolError``."""
    api_key, api_version, correlation_id = peek_header(frame)
    if supported_versions(api_key) is None:
        raise UnknownApiError(api_key, api_version, correlation_id)
    if (api_key, api_version) in legacy.HAND_CODED:
        client_id, n = legacy.read_header_v1(frame)
        return Request(RequestHeaderInfo(api_key, api_version, correlation_id, client_id),
                       legacy.decode_list_offsets_v0(frame, n))
    if legacy.is_refused(api_key, api_version):
        # Produce v0-v2: advertised as Kafka 4.0 does (KAFKA-18659), refused as it refuses
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    try:
        header_cls, read_header, req_cls, read_body, check_lengths = _readers(api_key,
                                                                              api_version)
    except Exception:
        raise UnknownApiError(api_key, api_version, correlation_id) from None
    # kio's native reader allocates from claimed counts before reading (2^32-1 elements:
    # ~34 GB, then abort): every claimed length is checked first (protocol/prescan.py)
    try:
        check_lengths(frame, len(frame))
    except LengthError as e:
        raise ProtocolError(f"API {api_key} v{api_version} request: {e}") from None
    try:
        try:
            header, n = read_header(frame, 0)
            body, _ = read_body(frame, n)
        except KeyError:  # an unknown tagged field (KIP-482): skip it, slowly
            header, n = _TolerantReader.read(header_cls, frame, 0, is_header=True)
            body, _ = _TolerantReader.read(req_cls, frame, n)
    except (SerialError, ValueError, TypeError, KeyError, IndexError, OverflowError) as e:
        raise ProtocolError(
            f"malformed API {api_key} v{api_version} request: "
            f"{type(e).__name__}: {e}"
        ) from None
    info = RequestHeaderInfo(api_key, api_version, correlation_id, header.client_id)
    return Request(info, body)


_Writers = tuple[Callable[..., None], Any, Callable[..., None]]


@cache
def _writers(api_key: int, api_version: int) -> _Writers:
    resp_cls = response_class(api_key, api_version)
    header_cls = ResponseHeaderV0 if api_key == API_VERSIONS_KEY else resp_cls.__header_schema__
    return entity_writer(header_cls), header_cls, entity_writer(resp_cls)


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> bytes:
    """The whole response frame, size prefix included."""
    write_header, header_cls, write_body = _writers(api_key, api_version)
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    write_header(buf, header_cls(correlation_id=correlation_id))
    write_body(buf, body)
    out = buf.getbuffer()
    _SIZE.pack_into(out, 0, len(out) - 4)
    del out
    return buf.getvalue()


class EncodedBody:
    """A response body already encoded: ``chunks`` written in order, ``size`` bytes.
    ``throttle_chunk``: the index of the chunk that is exactly the response's
    throttle_time_ms (4 bytes), so that a quota can set it (``with_throttle``); None when
    the response has no such field."""

    __slots__ = ("chunks", "regions", "size", "throttle_chunk")

    def __init__(self, chunks: list[Any], size: int,
                 throttle_chunk: int | None = None) -> None:
        self.chunks = chunks
        self.size = size
        self.throttle_chunk = throttle_chunk
        # some chunks are file regions (``headrace.log.segment.FileRegion``, a Fetch
        # response's records), not bytes: written by the connection with sendfile
        self.regions = False

    def with_throttle_time(self, throttle_ms: int) -> EncodedBody:
        """This body with its throttle_time_ms set (unchanged without the field)."""
        at = self.throttle_chunk
        if at is None:
            return self
        chunks = list(self.chunks)
        chunks[at] = _I32.pack(throttle_ms)
        body = EncodedBody(chunks, self.size, at)
        body.regions = self.regions
        return body


class RegionChunks(list):  # type: ignore[type-arg]
    """A response frame's chunks of which some are file regions (``EncodedBody.regions``):
    the connection sends those with sendfile, or reads them where it cannot."""

    __slots__ = ()


@cache
def _flexible_header(api_key: int, api_version: int) -> bool:
    """Whether the response header is v1 (a tagged-field section after the correlation id)."""
    if api_key == API_VERSIONS_KEY or (api_key, api_version) in legacy.HAND_CODED:
        return False
    return bool(response_class(api_key, api_version).__header_schema__.__flexible__)


def encode_response_chunks(
    api_key: int, api_version: int, correlation_id: int, body: Any
) -> list[bytes | memoryview]:
    """The whole response frame as chunks (no copy of an ``EncodedBody``'s chunks)."""
    if not isinstance(body, EncodedBody):
        return [encode_response(api_key, api_version, correlation_id, body)]
    if _flexible_header(api_key, api_version):
        head = _SIZE_CID.pack(body.size + 5, correlation_id) + b"\0"
    else:
        head = _SIZE_CID.pack(body.size + 4, correlation_id)
    if body.regions:
        return RegionChunks((head, *body.chunks))
    return [head, *body.chunks]


# ---------------------------------------------------------------------- Fetch by hand

FETCH_FLEXIBLE_VERSION = 12
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I32_I16 = struct.Struct(">ih")
_I16_I32 = struct.Struct(">hi")
_I64 = struct.Struct(">q")
_I64_I64 = struct.Struct(">qq")
_I32_I16_I64_I64 = struct.Struct(">ihqq")
_ZERO_UUID = bytes(16)


def _uvarint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class FetchPartition:
    """One partition of a Fetch response; ``records`` are the stored batches as chunks."""

    __slots__ = (
        "aborted_transactions",
        "diverging_epoch",
        "error_code",
        "high_watermark",
        "index",
        "last_stable_offset",
        "log_start_offset",
        "records",
        "records_size",
    )

    def __init__(self, index: int, error_code: int, aborted_transactions: (
            list[tuple[int, int]] | None)) -> None:
        self.index = index
        self.error_code = error_code
        self.high_watermark = -1
        self.last_stable_offset = -1
        self.log_start_offset = -1
        self.aborted_transactions = aborted_transactions  # (producer id, first offset)
        self.records: list[Any] = []  # bytes, memoryviews or FileRegions (see EncodedBody)
        self.records_size = 0
        self.diverging_epoch: tuple[int, int] | None = None  # (epoch, end offset), v12+


# A partition's tagged DivergingEpoch (tag 0, v12+): EpochEndOffset {epoch int32,
# end_offset int64, no tagged fields}: one tagged field, tag 0, size 13.
_DIVERGING_EPOCH = struct.Struct(">BBBiqB")


def encode_fetch_body(
    api_version: int, throttle_time_ms: int, error_code: int, session_id: int,
    topics: list[tuple[Any, list[FetchPartition]]],
) -> EncodedBody:
    """A FetchResponse (v4-v16) body; ``topics`` holds (name, or UUID from v13, partitions).

    Of the tagged fields only a partition's diverging epoch is written (to a follower whose
    log diverged, Fetch v12+); current leader, snapshot id and node endpoints keep their
    defaults, as Kafka does for a leader's answer. Records are never null.
    """
    flexible = api_version >= FETCH_FLEXIBLE_VERSION
    chunks: list[bytes | memoryview] = []
    size = 0
    head = bytearray()
    if api_version >= 7:
        head += _I32_I16.pack(throttle_time_ms, error_code) + _I32.pack(session_id)
    else:
        head += _I32.pack(throttle_time_ms)
    head += _uvarint(len(topics) + 1) if flexible else _I32.pack(len(topics))
    for topic, partitions in topics:
        if api_version >= 13:
            head += topic.bytes if topic is not None else _ZERO_UUID  # kio reads 0 as None
        else:
            name = topic.encode()
            head += _uvarint(len(name) + 1) if flexible else _I16.pack(len(name))
            head += name
        head += _uvarint(len(partitions) + 1) if flexible else _I32.pack(len(partitions))
        for p in partitions:
            head += _I32_I16_I64_I64.pack(p.index, p.error_code, p.high_watermark,
                                          p.last_stable_offset)
            if api_version >= 5:
                head += _I64.pack(p.log_start_offset)
            aborted = p.aborted_transactions
            if aborted is None:
                head += b"\0" if flexible else b"\xff\xff\xff\xff"
            else:
                head += _uvarint(len(aborted) + 1) if flexible else _I32.pack(len(aborted))
                for producer_id, first_offset in aborted:
                    head += _I64_I64.pack(producer_id, first_offset)
                    if flexible:
                        head += b"\0"
            if api_version >= 11:
                head += b"\xff\xff\xff\xff"  # preferred read replica: none
            n = p.records_size
            head += _uvarint(n + 1) if flexible else _I32.pack(n)
            if n:
                chunks.append(bytes(head))
                size += len(head)
                head.clear()
                chunks.extend(p.records)
                size += n
            if flexible:
                if p.diverging_epoch is None:
                    head += b"\0"
                else:
                    head += _DIVERGING_EPOCH.pack(1, 0, 13, *p.diverging_epoch, 0)
        if flexible:
            head += b"\0"
    if flexible:
        head += b"\0"
    chunks.append(bytes(head))
    size += len(head)
    return EncodedBody(chunks, size)


# ---------------------------------------------------------------------- Produce by hand

PRODUCE_FLEXIBLE_VERSION = 9
_I32_I16_I64 = struct.Struct(">ihq")


@dataclass(slots=True)
class ProducePartition:
    """One partition's answer in a ProduceResponse (``encode_produce_body``); the produce
    handler fills it in and may change ``error_code`` while it waits for replication."""

    index: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()


def encode_produce_body(api_version: int,
                        responses: list[tuple[str, list[ProducePartition]]]) -> EncodedBody:
    """A ProduceResponse (v0-v12) body, its throttle_time_ms (v1+) a chunk of its own
    (``EncodedBody.with_throttle_time``). Every request's hot path: kio's generic writer
    took about an eighth of a one-record Produce's broker CPU. The tagged fields of v10+
    (KIP-951's current leader and node endpoints) keep their defaults, so are not
    written."""
    flexible = api_version >= PRODUCE_FLEXIBLE_VERSION
    out = bytearray(_length(flexible, len(responses)))
    for name, partitions in responses:
        out += _string(flexible, name)
        out += _length(flexible, len(partitions))
        for p in partitions:
            out += _I32_I16_I64.pack(p.index, p.error_code, p.base_offset)
            if api_version >= 2:
                out += _I64.pack(p.log_append_time_ms)
            if api_version >= 5:
                out += _I64.pack(p.log_start_offset)
            if api_version >= 8:
                out += _length(flexible, len(p.record_errors))
                for batch_index, message in p.record_errors:
                    out += _I32.pack(batch_index)
                    out += _string(flexible, message)
                    if flexible:
                        out += b"\0"
                out += _string(flexible, p.error_message)
            if flexible:
                out += b"\0"
        if flexible:
            out += b"\0"
    head = bytes(out)
    if api_version < 1:
        return EncodedBody([head], len(head))
    tail = b"\0" if flexible else b""
    return EncodedBody([head, _NO_THROTTLE, tail], len(head) + 4 + len(tail), 1)


_NO_THROTTLE = bytes(4)


# ---------------------------------------------------------------------- OffsetCommit by hand

OFFSET_COMMIT_FLEXIBLE_VERSION = 8


def encode_offset_commit_body(api_version: int,
                              topics: list[tuple[str, list[tuple[int, int]]]]) -> EncodedBody:
    """An OffsetCommitResponse (v0-v9) body from (topic, [(partition, error code)]); its
    throttle_time_ms (v3+) a chunk of its own (``EncodedBody.with_throttle_time``). Every
    commit's hot path: a synchronous committer waits for it."""
    flexible = api_version >= OFFSET_COMMIT_FLEXIBLE_VERSION
    out = bytearray(_length(flexible, len(topics)))
    for name, partitions in topics:
        out += _string(flexible, name)
        out += _length(flexible, len(partitions))
        for index, error_code in partitions:
            out += _I32_I16.pack(index, error_code)
            if flexible:
                out += b"\0"
        if flexible:
            out += b"\0"
    if flexible:
        out += b"\0"
    body = bytes(out)
    if api_version < 3:
        return EncodedBody([body], len(body))
    return EncodedBody([_NO_THROTTLE, body], 4 + len(body), 0)


# ---------------------------------------------------------------------- Metadata by hand

METADATA_FLEXIBLE_VERSION = 9
_BOOL = struct.Struct(">?")
_I16_I32_I32 = struct.Struct(">hii")
_I16_I32_I32_I32 = struct.Struct(">hiii")


class MetadataPartition(NamedTuple):
    error_code: int
    partition_index: int
    leader_id: int
    leader_epoch: int
    replica_nodes: tuple[int, ...]
    isr_nodes: tuple[int, ...]
    offline_replicas: tuple[int, ...]


class MetadataTopic(NamedTuple):
    error_code: int
    name: str | None
    topic_id: uuid.UUID
    is_internal: bool
    partitions: Sequence[MetadataPartition]
    topic_authorized_operations: int


def encode_metadata_body(
    api_version: int, throttle_time_ms: int, brokers: Sequence[tuple[int, str, int, str | None]],
    cluster_id: str | None, controller_id: int, topics: Sequence[MetadataTopic],
    cluster_authorized_operations: int,
    topic_bytes: Callable[[MetadataTopic], bytes] | None = None,
) -> EncodedBody:
    """A MetadataResponse (v0-v12) body, the bytes kio writes for the same fields (a unit
    test compares them for every version). By hand because kio's generic writer took about
    0.1 ms per partition: a Metadata of every topic held the event loop for a second at
    10,000 partitions (``bench/cluster_bench.py --scale``). ``brokers``: (node id, host,
    port, rack). ``topic_bytes``: a topic's encoding at this version
    (``encode_metadata_topic``), where the caller keeps them (a topic that did not change
    is not encoded again); None encodes every topic here.

    Fields by version: throttle_time_ms v3+; a broker's rack v1+; cluster_id v2+;
    controller_id v1+; cluster_authorized_operations v8-v10; compact arrays and strings and
    an (empty) tagged-field section per structure from v9; a topic's fields at
    ``encode_metadata_topic``.
    """
    v = api_version
    flexible = v >= METADATA_FLEXIBLE_VERSION
    out = bytearray()
    tag = b"\0" if flexible else b""
    out += _length(flexible, len(brokers))
    for node_id, host, port, rack in brokers:
        out += _I32.pack(node_id) + _string(flexible, host) + _I32.pack(port)
        if v >= 1:
            out += _string(flexible, rack)
        out += tag
    if v >= 2:
        out += _string(flexible, cluster_id)
    if v >= 1:
        out += _I32.pack(controller_id)
    out += _length(flexible, len(topics))
    if topic_bytes is None:
        arrays: dict[tuple[int, ...], bytes] = {}
        for t in topics:
            out += encode_metadata_topic(v, t, arrays)
    else:
        for t in topics:
            out += topic_bytes(t)
    if 8 <= v <= 10:
        out += _I32.pack(cluster_authorized_operations)
    out += tag
    if v >= 3:  # throttle_time_ms first, a chunk of its own (a quota may set it)
        return EncodedBody([_I32.pack(throttle_time_ms), bytes(out)], 4 + len(out), 0)
    return EncodedBody([bytes(out)], len(out))


def _length(flexible: bool, n: int) -> bytes:
    return _uvarint(n + 1) if flexible else _I32.pack(n)


def _string(flexible: bool, text: str | None) -> bytes:
    if text is None:
        return b"\0" if flexible else b"\xff\xff"
    raw = text.encode()
    return (_uvarint(len(raw) + 1) if flexible else _I16.pack(len(raw))) + raw


def encode_metadata_topic(api_version: int, t: MetadataTopic,
                          arrays: dict[tuple[int, ...], bytes] | None = None) -> bytes:
    """One topic of a MetadataResponse at ``api_version`` (``metadata_topic_ends`` around
    ``encode_metadata_partition`` of each partition)."""
    if arrays is None:
        arrays = {}
    head, tail = metadata_topic_ends(api_version, t)
    return b"".join([head, *(encode_metadata_partition(api_version, p, arrays)
                             for p in t.partitions), tail])


def metadata_topic_ends(api_version: int, t: MetadataTopic) -> tuple[bytes, bytes]:
    """A MetadataResponse topic's bytes before its partitions and after them. Fields by
    version: topic_id v10+, is_internal v1+, authorized operations v8+, the name nullable
    from v12."""
    v = api_version
    flexible = v >= METADATA_FLEXIBLE_VERSION
    head = _I16.pack(t.error_code) + _string(flexible, t.name)
    if v >= 10:
        head += t.topic_id.bytes
    if v >= 1:
        head += _BOOL.pack(t.is_internal)
    head += _length(flexible, len(t.partitions))
    tail = _I32.pack(t.topic_authorized_operations) if v >= 8 else b""
    return head, tail + b"\0" if flexible else tail


def encode_metadata_partition(api_version: int, p: MetadataPartition,
                              arrays: dict[tuple[int, ...], bytes]) -> bytes:
    """One partition of a MetadataResponse topic: its leader_epoch v7+, offline_replicas
    v5+. ``arrays``: replica lists already encoded at this version (a few distinct ones,
    many times)."""
    v = api_version
    flexible = v >= METADATA_FLEXIBLE_VERSION

    def int32s(nodes: tuple[int, ...]) -> bytes:
        b = arrays.get(nodes)
        if b is None:
            b = arrays[nodes] = (_length(flexible, len(nodes))
                                 + struct.pack(f">{len(nodes)}i", *nodes))
        return b

    if v >= 7:
        out = _I16_I32_I32_I32.pack(p.error_code, p.partition_index, p.leader_id,
                                    p.leader_epoch)
    else:
        out = _I16_I32_I32.pack(p.error_code, p.partition_index, p.leader_id)
    out += int32s(p.replica_nodes) + int32s(p.isr_nodes)
    if v >= 5:
        out += int32s(p.offline_replicas)
    return out + b"\0" if flexible else out


def encode_api_versions_fallback(
    correlation_id: int, error_code: ErrorCode, versions: list[tuple[int, int, int]]
) -> bytes:
    """An ApiVersions v0 response: what Kafka sends to a version it does not know."""
    body = ApiVersionsResponseV0(
        error_code=error_code,
        api_keys=tuple(
            ApiVersionV0(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
            for k, lo, hi in versions
        ),
    )
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    entity_writer(ResponseHeaderV0)(buf, ResponseHeaderV0(correlation_id=i32(correlation_id)))
    entity_writer(ApiVersionsResponseV0)(buf, body)
    out = buf.getvalue()
    return _SIZE.pack(len(out) - 4) + out[4:]


class _TolerantReader:
    """Decode a kio entity, skipping tagged fields the schema does not know (KIP-482)."""

    @classmethod
    def read(cls, entity_type: Any, buf: bytes | memoryview, pos: int,
             is_header: bool = False) -> tuple[Any, int]:
        flexible = bool(entity_type.__flexible__)
        kwargs: dict[str, Any] = {}
        tagged: dict[int, Any] = {}
        for f in fields(entity_type):
            tag = get_field_tag(f)
            if tag is not None:
                tagged[int(tag)] = f
                kwargs[f.name] = get_tagged_field_default(f)
                continue
            kwargs[f.name], pos = cls._field(f, flexible, buf, pos,
                                             is_header and f.name == "client_id", False)
        if flexible:
            count, n = read_unsigned_varint(buf, pos)
            pos += n
            for _ in range(count):
                tag, n = read_unsigned_varint(buf, pos)
                pos += n
                size, n = read_unsigned_varint(buf, pos)
                pos += n
                known = tagged.get(int(tag))
                if known is not None:
                    kwargs[known.name], _ = cls._field(known, flexible, buf, pos, False, True)
                pos += size
                if pos > len(buf):
                    raise ValueError("tagged field runs past the end of the frame")
        return entity_type(**kwargs), pos

    @classmethod
    def _field(cls, f: Any, flexible: bool, buf: bytes | memoryview, pos: int,
               legacy_client_id: bool, is_tag: bool) -> tuple[Any, int]:
        if legacy_client_id:
            value, n = read_nullable_legacy_string(buf, pos)
            return value, pos + n
        optional = False if is_tag else is_optional(f)
        kind = classify_field(f)
        if isinstance(kind, PrimitiveField):
            value, n = get_reader(get_schema_field_type(f), flexible, optional)(buf, pos)
            return value, pos + n
        if isinstance(kind, EntityField):
            if optional:
                marker, n = read_int8(buf, pos)
                pos += n
                if marker < 0:
                    return None, pos
            return cls.read(kind.type_, buf, pos)
        count, pos = cls._array_length(flexible, buf, pos)
        if count is None:
            return None, pos
        items = []
        for _ in range(count):
            if isinstance(kind, PrimitiveTupleField):
                item, n = get_reader(get_schema_field_type(f), flexible, False)(buf, pos)
                pos += n
            else:
                assert isinstance(kind, EntityTupleField)
                item, pos = cls.read(kind.type_, buf, pos)
            items.append(item)
        return tuple(items), pos

    @staticmethod
    def _array_length(flexible: bool, buf: bytes | memoryview, pos: int) -> tuple[int | None, int]:
        if flexible:
            n_plus_1, n = read_unsigned_varint(buf, pos)
            return (None if n_plus_1 == 0 else int(n_plus_1) - 1), pos + n
        count, n = read_int32(buf, pos)
        return (None if count < 0 else int(count)), pos + n
