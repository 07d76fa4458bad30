"""PURE: build kio request and response entities for any version from plain values.

kio generates one frozen dataclass per message version, and the fields differ between
versions (``log_start_offset`` appears in Fetch v5, ``topic_id`` in v13, ...). Handlers
(and clients: the Spark fetch client, tests) describe a message once, as nested dicts with
Kafka's field names, and ``build`` turns that into the class of the negotiated version:
fields the version lacks are dropped, fields not given take their schema default, nested
entities are built recursively. Conversions: ``int`` milliseconds for ``timedelta_*``
fields, ``int`` for error codes.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_schema_field_type,
    is_optional,
)
from kio.static.primitive import i32Timedelta, i64Timedelta

Converter = Callable[[Any], Any]
_REQUIRED = object()
_DEFAULTED = object()


def _identity(v: Any) -> Any:
    return v


@cache
def _ms32(ms: int) -> Any:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


@cache
def _ms64(ms: int) -> Any:
    return i64Timedelta.parse(datetime.timedelta(milliseconds=ms))


def _timedelta32(v: Any) -> Any:
    if isinstance(v, datetime.timedelta):
        return i32Timedelta.parse(v)
    ms = int(v)
    # kio's phantom-type parse is slow; throttle times and the like repeat (mostly 0)
    return _ms32(ms) if 0 <= ms < 65536 else i32Timedelta.parse(
        datetime.timedelta(milliseconds=ms))


def _timedelta64(v: Any) -> Any:
    if isinstance(v, datetime.timedelta):
        return i64Timedelta.parse(v)
    ms = int(v)
    return _ms64(ms) if 0 <= ms < 65536 else i64Timedelta.parse(
        datetime.timedelta(milliseconds=ms))


def _error_code(v: Any) -> Any:
    return v if isinstance(v, ErrorCode) else ErrorCode(int(v))


@cache
def _plan(cls: type) -> tuple[tuple[str, Converter, Any], ...]:
    """Per field: (name, converter of a given value, implicit value or _REQUIRED)."""
    plan: list[tuple[str, Converter, Any]] = []
    for f in fields(cls):
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        kind = classify_field(f)
        conv: Converter
        if isinstance(kind, EntityTupleField):
            inner = kind.type_

            def conv(v: Any, inner: type = inner) -> Any:
                return tuple(x if isinstance(x, inner) else build(inner, x) for x in v)

            if f.type is not None and "None" in str(f.type):
                base = conv

                def conv(v: Any, base: Converter = base) -> Any:
                    return None if v is None else base(v)

        elif isinstance(kind, EntityField):
            inner = kind.type_

            def conv(v: Any, inner: type = inner) -> Any:
                if v is None or isinstance(v, inner):
                    return v
                return build(inner, v)

        else:
            kafka_type = get_schema_field_type(f)
            conv = {
                "timedelta_i32": _timedelta32,
                "timedelta_i64": _timedelta64,
                "error_code": _error_code,
            }.get(kafka_type, _identity)
        implicit: Any = _DEFAULTED if has_default else _REQUIRED
        if not has_default and conv in (_timedelta32, _timedelta64, _error_code):
            implicit = conv(0)  # throttle time and error codes default to 0
        plan.append((f.name, conv, implicit))
    return tuple(plan)


def build(cls: type, data: Mapping[str, Any]) -> Any:
    """Instantiate kio entity ``cls`` from ``data`` (extra keys are ignored)."""
    kwargs: dict[str, Any] = {}
    for name, conv, implicit in _plan(cls):
        if name in data:
            kwargs[name] = conv(data[name])
        elif implicit is _REQUIRED:
            version = getattr(cls, "__version__", "?")
            raise TypeError(f"{cls.__qualname__} v{version}: missing field {name!r}")
        elif implicit is not _DEFAULTED:
            kwargs[name] = implicit
    return cls(**kwargs)


def has_field(cls: type, name: str) -> bool:
    return any(n == name for n, _, _ in _plan(cls))


def _zero(f: Any) -> Any:
    """A required field's empty value: no items, no nested entity (or an empty one), zero,
    empty text, false, the nil UUID, the epoch."""
    kind = classify_field(f)
    if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
        return ()
    if is_optional(f):
        return None
    if isinstance(kind, EntityField):
        return _zeroes(kind.type_)
    kafka_type = get_schema_field_type(f)
    if kafka_type == "string":
        return ""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "float64":
        return 0.0
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, tz=datetime.UTC)
    return 0


def _zeroes(cls: type) -> Any:
    required = {f.name: _zero(f) for f in fields(cls)
                if f.default is MISSING and f.default_factory is MISSING}
    return build(cls, required)


def error_response(cls: type, code: ErrorCode, message: str | None = None) -> Any | None:
    """Response ``cls`` refusing its request as a whole, as Kafka's ``getErrorResponse``
    does: the top-level ``error_code`` (and ``error_message``, when the version has one)
    set, every list empty. None when the response has no top-level error code (the
    request cannot be refused in its own words)."""
    if not has_field(cls, "error_code"):
        return None
    data: dict[str, Any] = {
        f.name: _zero(f) for f in fields(cls)
        if f.default is MISSING and f.default_factory is MISSING}
    data["error_code"] = code
    if has_field(cls, "error_message"):
        data["error_message"] = message
    return build(cls, data)
