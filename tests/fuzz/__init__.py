"""Request fuzzing helpers (issue 8; R-NF-1, R-PROTO-1): valid requests of every API key and
version generated from kio's schemas, hostile mutations of them, claim variants at every
array count, and the checked-in corpus (``corpus/requests/``: one raw frame per file, size
prefix included)."""

from __future__ import annotations

import datetime
import io
import random
import struct
import uuid
from collections.abc import Callable, Iterator
from dataclasses import fields
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
)
from kio.static.constants import EntityType
from kio.static.primitive import i32Timedelta, i64Timedelta

from headrace.protocol.prescan import _nullable

CORPUS = Path(__file__).parent / "corpus" / "requests"

# --------------------------------------------------------------------- generation


def request_versions() -> list[tuple[int, int]]:
    """Every (api key, version) with a request and a response schema in kio."""
    out = []
    for key, name in sorted(api_key_map.items()):
        for version, kinds in sorted(schema_name_map[name].items()):
            if EntityType.request in kinds and EntityType.response in kinds:
                out.append((int(key), int(version)))
    return out


ALL_VERSIONS = request_versions()

_INT_BOUNDS = {"int8": 7, "int16": 15, "int32": 31, "int64": 63}


def _ints(bits: int) -> st.SearchStrategy[int]:
    lo, hi = -(2**bits), 2**bits - 1
    return st.one_of(st.integers(-2, 5), st.integers(lo, hi), st.sampled_from([lo, hi]))


def _primitive(kafka_type: str) -> st.SearchStrategy[Any]:
    if kafka_type in _INT_BOUNDS:
        return _ints(_INT_BOUNDS[kafka_type])
    if kafka_type == "uint16":
        return st.integers(0, 2**16 - 1)
    if kafka_type == "bool":
        return st.booleans()
    if kafka_type == "float64":
        return st.floats(allow_nan=False)
    if kafka_type == "string":
        return st.text(max_size=12)
    if kafka_type in ("bytes", "records"):
        return st.binary(max_size=40)
    if kafka_type == "uuid":
        return st.one_of(st.none(), st.uuids(), st.just(uuid.UUID(int=0)))
    if kafka_type == "timedelta_i32":
        return st.integers(-1, 2**31 - 1).map(
            lambda ms: i32Timedelta.parse(datetime.timedelta(milliseconds=ms)))
    if kafka_type == "timedelta_i64":
        return st.integers(-1, 2**40).map(
            lambda ms: i64Timedelta.parse(datetime.timedelta(milliseconds=ms)))
    raise NotImplementedError(kafka_type)


@cache
def entity_strategy(cls: Any) -> st.SearchStrategy[Any]:
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for f in fields(cls):
        kind = classify_field(f)
        nullable = _nullable(f)
        strat: st.SearchStrategy[Any]
        if isinstance(kind, PrimitiveField):
            kafka_type = get_schema_field_type(f)
            strat = _primitive(kafka_type)
            if kafka_type == "uuid":
                pass
            elif nullable:
                strat = st.one_of(st.none(), strat)
        elif isinstance(kind, PrimitiveTupleField):
            strat = st.lists(_primitive(get_schema_field_type(f)), max_size=4).map(tuple)
            if nullable:
                strat = st.one_of(st.none(), strat)
        elif isinstance(kind, EntityField):
            strat = st.deferred(lambda t=kind.type_: entity_strategy(t))
            if nullable:
                strat = st.one_of(st.none(), strat)
        else:
            assert isinstance(kind, EntityTupleField)
            strat = st.lists(st.deferred(lambda t=kind.type_: entity_strategy(t)),
                             max_size=3).map(tuple)
            if nullable:
                strat = st.one_of(st.none(), strat)
        if get_field_tag(f) is not None:
            strat = st.one_of(st.just(f.default), strat) if f.default is not None else strat
        kwargs[f.name] = strat
    return st.builds(cls, **kwargs)


def encode_request(api_key: int, version: int, body: Any, correlation_id: int,
                   client_id: str | None = "fuzz") -> bytes:
    """A request frame without its size prefix."""
    cls = load_request_schema(api_key, version)
    hdr = cls.__header_schema__
    buf = io.BytesIO()
    kw: dict[str, Any] = {"request_api_key": api_key, "request_api_version": version,
                          "correlation_id": correlation_id}
    if any(f.name == "client_id" for f in fields(hdr)):
        kw["client_id"] = client_id
    entity_writer(hdr)(buf, hdr(**kw))
    entity_writer(cls)(buf, body)
    return buf.getvalue()


@st.composite
def valid_requests(draw: Callable[..., Any],
                   versions: list[tuple[int, int]] = ALL_VERSIONS) -> bytes:
    api_key, version = draw(st.sampled_from(versions))
    body = draw(entity_strategy(load_request_schema(api_key, version)))
    return encode_request(api_key, version, body, draw(st.integers(0, 2**31 - 1)))


# --------------------------------------------------------------------- mutation

# claimed lengths a hostile peer likes: int32, int16 and unsigned-varint encodings
_HUGE = [
    b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00", b"\x00\x10\x00\x00",
    b"\xff\xfe", b"\x7f\xff", b"\x80\x00", b"\xff\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x10",
    b"\x81\x80\x40", b"\xff\xff\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff",
]


def mutate(rng: random.Random, data: bytes, others: list[bytes]) -> bytes:
    """One to four mutations; the 8-byte header (key, version, correlation id) is kept
    most of the time so that the body's decoding is what gets exercised. The last kind
    grows a length or tagged-field size and hides a claim in the bytes it now covers (the
    way a known tag's size hid a claim from the first prescan)."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        lo = 8 if rng.random() < 0.9 and len(b) > 8 else 0
        pos = rng.randint(lo, max(lo, len(b)))
        op = rng.randrange(8)
        if op == 0 and pos < len(b):  # flip a byte
            b[pos] = rng.randrange(256)
        elif op == 1:  # a huge / negative / varint claim over whatever was there
            huge = rng.choice(_HUGE)
            b[pos:pos + len(huge)] = huge
        elif op == 2:  # truncate
            del b[pos:]
        elif op == 3:  # insert random bytes
            b[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 4 and others:  # splice with another request's tail
            other = rng.choice(others)
            b[pos:] = other[rng.randrange(len(other)):]
        elif op == 5:  # drop a segment
            del b[pos:pos + rng.randint(1, 16)]
        elif op == 6:  # repeat a segment
            b[pos:pos] = b[pos:pos + rng.randint(1, 16)]
        elif pos < len(b):  # a size grown by k, with k bytes of claim hidden behind it
            huge = rng.choice(_HUGE)
            b[pos] = (b[pos] + len(huge)) & 0xFF
            at = min(len(b), pos + 1 + rng.randint(0, 24))
            b[at:at] = huge
    return bytes(b)


def corpus_frames() -> list[tuple[str, bytes]]:
    """The checked-in corpus: (file name, raw bytes as sent: size prefix included, which
    may lie on purpose)."""
    return [(path.name, path.read_bytes()) for path in sorted(CORPUS.glob("*.bin"))]




# --------------------------------------------------------------------- minimal requests


def minimal(cls: Any, items: int = 0) -> Any:
    """A small valid entity: zero / empty values, ``items`` elements in every array."""
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if get_field_tag(f) is not None:
            continue  # tagged fields keep their defaults (and are not written)
        kind = classify_field(f)
        if isinstance(kind, PrimitiveField):
            t = get_schema_field_type(f)
            kwargs[f.name] = {
                "string": "x", "bytes": b"", "records": b"", "uuid": None, "bool": False,
                "float64": 0.0,
                "timedelta_i32": i32Timedelta.parse(datetime.timedelta(0)),
                "timedelta_i64": i64Timedelta.parse(datetime.timedelta(0)),
            }.get(t, 0)
        elif isinstance(kind, EntityField):
            kwargs[f.name] = minimal(kind.type_, items)
        elif isinstance(kind, PrimitiveTupleField):
            t = get_schema_field_type(f)
            one = {"string": "x", "uuid": None}.get(t, 0)
            kwargs[f.name] = (one,) * items
        else:
            kwargs[f.name] = tuple(minimal(kind.type_, items) for _ in range(items))
    return cls(**kwargs)


class Span(NamedTuple):
    """A length on the wire: ``kind`` is "array" (a count), "length" (string / bytes /
    records) or "tag" (a tagged field's size; ``end`` is where its content ends)."""

    kind: str
    path: str
    pos: int
    width: int
    flexible: bool
    end: int


def length_spans(cls: Any, buf: bytes, pos: int) -> list[Span]:
    """Every length, count and tagged-field size of an entity encoded at ``pos`` (a walk
    of kio's schema, as the decoder's own), in wire order."""
    out: list[Span] = []
    _walk(cls, buf, pos, out, "")
    return out


def request_spans(frame: bytes) -> list[Span]:
    """``length_spans`` of a whole request frame (no size prefix), header included."""
    api_key, version = struct.unpack_from(">hh", frame, 0)
    cls = load_request_schema(api_key, version)
    out = [Span("length", "client_id", 8, 2, False, 0)]
    start = header_size(frame)
    if cls.__header_schema__.__flexible__:
        _tags(frame, start - 1, out, "header.")
    _walk(cls, frame, start, out, "")
    return out


def array_count_positions(cls: Any, buf: bytes, pos: int) -> Iterator[tuple[str, int, int]]:
    """(field path, offset, encoded width) of every array count in an entity at ``pos``."""
    for span in length_spans(cls, buf, pos):
        if span.kind == "array":
            yield span.path, span.pos, span.width


def _uvarint_at(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift, start = 0, 0, pos
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos - start
        shift += 7


_FIXED = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "int64": 8,
          "float64": 8, "uuid": 16, "timedelta_i32": 4, "timedelta_i64": 8}


def _tags(buf: bytes, pos: int, out: list[Span], path: str) -> int:
    n, w = _uvarint_at(buf, pos)
    pos += w
    for _ in range(n):
        tag, w = _uvarint_at(buf, pos)
        pos += w
        size, w = _uvarint_at(buf, pos)
        out.append(Span("tag", f"{path}tag{tag}", pos, w, True, pos + w + size))
        pos += w + size
    return pos


def _walk(cls: Any, buf: bytes, pos: int, out: list[Span], path: str) -> int:
    flexible = bool(cls.__flexible__)

    def length(kind: str, name: str, width: int) -> tuple[int, int]:
        if flexible:
            n, w = _uvarint_at(buf, pos)
            n -= 1
        else:
            n = struct.unpack_from(">h" if width == 2 else ">i", buf, pos)[0]
            w = width
        out.append(Span(kind, name, pos, w, flexible, 0))
        return n, w

    for f in fields(cls):
        if get_field_tag(f) is not None:
            continue
        kind = classify_field(f)
        name = path + f.name
        if isinstance(kind, PrimitiveField):
            t = get_schema_field_type(f)
            if t in _FIXED:
                pos += _FIXED[t]
            else:
                n, w = length("length", name, 2 if t == "string" else 4)
                pos += w + max(n, 0)
        elif isinstance(kind, EntityField):
            if _nullable(f):
                pos += 1
                if buf[pos - 1] == 0xFF:
                    continue
            pos = _walk(kind.type_, buf, pos, out, name + ".")
        else:
            n, w = length("array", name, 4)
            pos += w
            for _ in range(max(n, 0)):
                if isinstance(kind, PrimitiveTupleField):
                    t = get_schema_field_type(f)
                    if t in _FIXED:
                        pos += _FIXED[t]
                    else:
                        m, mw = length("length", name + "[]", 2)
                        pos += mw + max(m, 0)
                else:
                    pos = _walk(kind.type_, buf, pos, out, name + ".")
    if flexible:
        pos = _tags(buf, pos, out, path)
    return pos


def mutate_structured(rng: random.Random, frame: bytes) -> bytes:
    """One mutation at a real length of a valid request: a count or length replaced by a
    huge, negative or zero claim, or a tagged field's size grown over a hidden claim."""
    spans = request_spans(frame)
    span = rng.choice(spans)
    b = bytearray(frame)
    if span.kind == "tag" and rng.random() < 0.8:
        # empty tag sections or null markers may stand between the content and a count
        huge = b"\x00" * rng.randint(0, 2) + rng.choice(_HUGE)
        size, w = _uvarint_at(frame, span.pos)
        grown = encode_claim(True, size + len(huge) - 1)  # count + 1 encoding: size itself
        return bytes(b[:span.pos] + grown + b[span.pos + w:span.end] + huge + b[span.end:])
    if span.flexible:
        claim = encode_claim(True, rng.choice([2**32 - 2, 2**31, 2**20, 2**28, 0, -1, 127]))
    elif span.width == 2:
        claim = struct.pack(">h", rng.choice([32767, -2, -1, 0x4000]))
    else:
        claim = struct.pack(">i", rng.choice([2**31 - 1, -2, -1, 2**20, 2**28]))
    return bytes(b[:span.pos] + claim + b[span.pos + span.width:])


def header_size(frame: bytes) -> int:
    """The request header's length in ``frame`` (no size prefix): key, version, correlation
    id, client id, and the tagged-field byte of header v2."""
    api_key, version = struct.unpack_from(">hh", frame, 0)
    (client_len,) = struct.unpack_from(">h", frame, 8)
    n = 10 + max(client_len, 0)
    if load_request_schema(api_key, version).__header_schema__.__flexible__:
        n += 1
    return n


def encode_claim(flexible: bool, count: int) -> bytes:
    """An array count as the wire says it (compact: count + 1 as an unsigned varint)."""
    if not flexible:
        return struct.pack(">i", count)
    n = count + 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def claim_variants(api_key: int, version: int,
                   claims: tuple[int, ...] = (2**32 - 2, 2**31 - 1, 2**20)
                   ) -> Iterator[tuple[str, int, bytes]]:
    """(array path, claimed count, frame without size prefix) for every array count of a
    request with one element in each array, each replaced in turn by each huge claim."""
    cls = load_request_schema(api_key, version)
    frame = encode_request(api_key, version, minimal(cls, 1), 7)
    start = header_size(frame)
    flexible = bool(cls.__flexible__)
    for path, pos, width in array_count_positions(cls, frame, start):
        for claim in claims:
            if not flexible and claim >= 2**31:
                claim = 2**31 - 1
            yield path, claim, frame[:pos] + encode_claim(flexible, claim) + frame[pos + width:]


# --------------------------------------------------------------------- seeded random requests


def _random_primitive(kafka_type: str, rng: random.Random) -> Any:
    if kafka_type in ("int8", "int16", "int32", "int64"):
        bits = {"int8": 7, "int16": 15, "int32": 31, "int64": 63}[kafka_type]
        r = rng.random()
        if r < 0.8:
            return rng.randint(-1, 5)
        return rng.choice([-(2**bits), 2**bits - 1, rng.randint(-(2**bits), 2**bits - 1)])
    if kafka_type == "uint16":
        return rng.randint(0, 2**16 - 1)
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "float64":
        return rng.uniform(-1e6, 1e6)
    if kafka_type == "string":
        return rng.choice(["", "fuzz", "x" * rng.randint(1, 30), "__consumer_offsets", "é"])
    if kafka_type in ("bytes", "records"):
        return rng.randbytes(rng.randint(0, 80))
    if kafka_type == "uuid":
        return rng.choice([None, uuid.UUID(int=rng.getrandbits(128))])
    ms = rng.choice([0, 1, 100, 2**31 - 1, -1])
    if kafka_type == "timedelta_i32":
        return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))
    return i64Timedelta.parse(datetime.timedelta(milliseconds=ms))


_HINT_TYPES: dict[str, tuple[type, ...]] = {
    "int8": (int,), "int16": (int,), "int32": (int,), "int64": (int,), "uint16": (int,),
    "bool": (bool,), "float64": (float,), "string": (str,), "bytes": (bytes,),
    "records": (bytes,)}


def _hint(hints: dict[str, list[Any]] | None, name: str, kafka_type: str,
          rng: random.Random, nullable: bool = False) -> tuple[bool, Any]:
    """(True, a value of ``hints[name]`` of the field's type, None if it is nullable), most
    of the time when there is one; (False, None) when the field keeps its random value."""
    if not hints or name not in hints or rng.random() < 0.25:
        return False, None
    types = _HINT_TYPES.get(kafka_type)
    fit = [v for v in hints[name] if (v is None and nullable) or (
        types is not None and isinstance(v, types)
        and (kafka_type == "bool" or not isinstance(v, bool)))]
    return (True, rng.choice(fit)) if fit else (False, None)


def random_entity(cls: Any, rng: random.Random, depth: int = 0,
                  hints: dict[str, list[Any]] | None = None) -> Any:
    """A valid entity with random values (arrays of 0-3 elements, nulls where allowed).
    ``hints`` (field name: values) gives fields values that mean something to a broker (a
    topic that exists, a producer id it gave out, a user it knows), 3 times in 4, so that
    a request gets past the first lookup to the code behind it."""
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        kind = classify_field(f)
        if get_field_tag(f) is not None and rng.random() < 0.7:
            continue  # keep the tagged default
        if _nullable(f) and not isinstance(kind, PrimitiveField) and rng.random() < 0.2:
            kwargs[f.name] = None
            continue
        if isinstance(kind, PrimitiveField):
            t = get_schema_field_type(f)
            hinted, value = _hint(hints, f.name, t, rng, _nullable(f))
            if hinted:
                kwargs[f.name] = value
            else:
                kwargs[f.name] = (None if _nullable(f) and t != "uuid" and rng.random() < 0.15
                                  else _random_primitive(t, rng))
        elif isinstance(kind, EntityField):
            kwargs[f.name] = random_entity(kind.type_, rng, depth + 1, hints)
        elif isinstance(kind, PrimitiveTupleField):
            t = get_schema_field_type(f)
            items = []
            for _ in range(rng.randint(0, 3)):
                hinted, value = _hint(hints, f.name, t, rng)
                items.append(value if hinted else _random_primitive(t, rng))
            kwargs[f.name] = tuple(items)
        else:
            kwargs[f.name] = tuple(random_entity(kind.type_, rng, depth + 1, hints)
                                   for _ in range(rng.randint(0, 3 if depth < 2 else 1)))
    return cls(**kwargs)


def _has_known_tags(cls: Any) -> bool:
    for f in fields(cls):
        if get_field_tag(f) is not None:
            return True
        kind = classify_field(f)
        if isinstance(kind, EntityField | EntityTupleField) and _has_known_tags(kind.type_):
            return True
    return False


TAGGED_VERSIONS = [kv for kv in ALL_VERSIONS if _has_known_tags(load_request_schema(*kv))]
"""Request versions whose schema knows tagged fields (kio parses their content)."""
