"""The web console's pure parts: API errors, request-parameter validation, and the sampled
time series behind its charts.

Rules:

- Every query parameter and body field is checked here before anything talks to a
  broker; a bad one raises :class:`BadRequest` with a message for the person at the
  browser (shown as is in the UI, so it names the field and the allowed range).
- Topic names follow Kafka's rules (``org.apache.kafka.common.internals.Topic``): 1 to
  249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``.
- Time is an argument (``now_ms``); nothing here sleeps, reads a clock or does I/O.
- Series are bounded rings (``capacity`` points each) and the number of series is bounded
  too (``max_series``): a cluster with many topics or groups cannot grow the console's
  memory without limit. A topic or group missing from a sample loses its series.
- Throughput is the rate of the sum of a topic's high watermarks (offsets per second, i.e.
  records appended, control records of transactions included). A sum that goes down (a
  topic deleted and created again) restarts the rate instead of producing a negative one.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

MAX_TOPIC_NAME = 249
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_GROUP_ID = 255
MAX_MESSAGES = 500
MAX_PARTITIONS = 10_000
MAX_REPLICATION_FACTOR = 32
MAX_CONFIGS = 100
MAX_INT64 = 2**63 - 1


class ApiError(Exception):
    """A request the console answers with an error status and a one-line message."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(ApiError):
    """The caller's fault: a parameter or body field out of range or malformed."""

    status = 400


class Forbidden(ApiError):
    """A request the console does not serve (a cross-site POST)."""

    status = 403


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    """E.g. creating a topic that exists."""

    status = 409


class Unavailable(ApiError):
    """No broker answered (in time): the cluster's fault or the network's, not the caller's."""

    status = 503


class AuthFailed(ApiError):
    """TLS or SASL with the cluster failed (the console's client settings)."""

    status = 502


class BrokerRefused(ApiError):
    """The broker answered with an error that is not the caller's input (authorization,
    authentication, an internal error)."""

    status = 502


# ------------------------------------------------------------------ validation


def topic_name(value: object, field: str = "topic") -> str:
    """A valid Kafka topic name, or BadRequest saying why not."""
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{field}: a topic name is required")
    if len(value) > MAX_TOPIC_NAME:
        raise BadRequest(f"{field}: a topic name has at most {MAX_TOPIC_NAME} characters")
    if value in (".", ".."):
        raise BadRequest(f"{field}: a topic cannot be named '.' or '..'")
    if not _TOPIC_NAME.fullmatch(value):
        raise BadRequest(f"{field}: a topic name may contain only ASCII letters, digits, "
                         "'.', '_' and '-'")
    return value


def group_id(value: object) -> str:
    """A consumer group id: 1 to 255 printable characters."""
    if not isinstance(value, str) or not value:
        raise BadRequest("group: a group id is required")
    if len(value) > MAX_GROUP_ID:
        raise BadRequest(f"group: a group id has at most {MAX_GROUP_ID} characters")
    if not value.isprintable():
        raise BadRequest("group: a group id may not contain control characters")
    return value


def int_value(value: object, field: str, lo: int, hi: int) -> int:
    """An integer in ``[lo, hi]`` from a query string or a JSON body (not a bool, not a
    float with a fraction)."""
    if isinstance(value, bool):
        raise BadRequest(f"{field}: expected an integer")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    elif isinstance(value, str) and re.fullmatch(r"[+-]?\d{1,19}", value.strip()):
        n = int(value.strip())
    else:
        raise BadRequest(f"{field}: expected an integer, got {str(value)[:40]!r}")
    if not lo <= n <= hi:
        raise BadRequest(f"{field}: must be between {lo} and {hi}, got {n}")
    return n


@dataclass(frozen=True)
class MessageQuery:
    """What ``GET /api/messages`` asks for: one partition, from an offset, from the first
    record at or after a time, or the newest ``limit`` records."""

    topic: str
    partition: int
    limit: int
    offset: int | None = None
    timestamp_ms: int | None = None  # neither: the newest ``limit`` records


def message_query(params: Mapping[str, str]) -> MessageQuery:
    """Validate ``topic``, ``partition``, ``offset`` | ``timestamp`` and ``limit``."""
    topic = topic_name(params.get("topic"))
    partition = int_value(params.get("partition", "0"), "partition", 0, MAX_PARTITIONS - 1)
    limit = int_value(params.get("limit", "50"), "limit", 1, MAX_MESSAGES)
    offset = params.get("offset") or None
    timestamp = params.get("timestamp") or None
    if offset is not None and timestamp is not None:
        raise BadRequest("give either offset or timestamp, not both")
    return MessageQuery(
        topic, partition, limit,
        offset=None if offset is None else int_value(offset, "offset", 0, MAX_INT64),
        timestamp_ms=None if timestamp is None else int_value(timestamp, "timestamp", 0,
                                                              MAX_INT64))


@dataclass(frozen=True)
class NewTopicRequest:
    name: str
    partitions: int | None  # None: the broker's num.partitions
    replication_factor: int | None  # None: the broker's default.replication.factor
    configs: dict[str, str]


def new_topic_request(body: object) -> NewTopicRequest:
    """Validate a ``POST /api/topics`` body: ``{"name", "partitions"?,
    "replication_factor"?, "configs"?: {key: value}}``."""
    if not isinstance(body, dict):
        raise BadRequest("expected a JSON object")
    unknown = set(body) - {"name", "partitions", "replication_factor", "configs"}
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(sorted(unknown))[:100]}")
    name = topic_name(body.get("name"), "name")
    partitions = body.get("partitions")
    rf = body.get("replication_factor")
    configs = body.get("configs")
    configs = {} if configs is None else configs
    if not isinstance(configs, dict) or len(configs) > MAX_CONFIGS:
        raise BadRequest(f"configs: expected an object of at most {MAX_CONFIGS} entries")
    clean: dict[str, str] = {}
    for key, value in configs.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z0-9._-]{1,100}", key):
            raise BadRequest(f"configs: {str(key)[:40]!r} is not a config name")
        if not isinstance(value, str | int) or isinstance(value, bool) or len(str(value)) > 1000:
            raise BadRequest(f"configs: {key}: expected a string or an integer")
        clean[key] = str(value)
    return NewTopicRequest(
        name,
        None if partitions in (None, "") else int_value(partitions, "partitions", 1,
                                                        MAX_PARTITIONS),
        None if rf in (None, "") else int_value(rf, "replication_factor", 1,
                                                MAX_REPLICATION_FACTOR),
        clean)


# ------------------------------------------------------------------ lag


def partition_lag(committed: int, high_watermark: int) -> int | None:
    """High watermark minus the committed offset; None when nothing is committed (a
    negative offset: librdkafka's OFFSET_INVALID)."""
    if committed < 0:
        return None
    return max(0, high_watermark - committed)


def total_lag(committed: Mapping[tuple[str, int], int],
              high_watermarks: Mapping[tuple[str, int], int]) -> int:
    """The sum of partition lags over the partitions with a commit and a known high
    watermark."""
    total = 0
    for tp, offset in committed.items():
        high = high_watermarks.get(tp)
        lag = None if high is None else partition_lag(offset, high)
        total += lag or 0
    return total


# ------------------------------------------------------------------ time series


class Series:
    """The last ``capacity`` points ``(time_ms, value)`` of one measurement."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._points: deque[tuple[int, float]] = deque(maxlen=capacity)

    def append(self, now_ms: int, value: float) -> None:
        if self._points and now_ms <= self._points[-1][0]:
            return  # time must move forward; a repeated or late sample is dropped
        self._points.append((now_ms, value))

    def __len__(self) -> int:
        return len(self._points)

    def doc(self) -> dict[str, list[float] | list[int]]:
        """``{"t": [time_ms...], "v": [value...]}`` for the charts."""
        return {"t": [t for t, _ in self._points], "v": [v for _, v in self._points]}


class RateSeries:
    """A per-second rate from samples of a counter that only grows (until it restarts)."""

    def __init__(self, capacity: int) -> None:
        self.series = Series(capacity)
        self._last: tuple[int, int] | None = None

    def sample(self, now_ms: int, counter: int) -> float | None:
        """Record the counter's value at ``now_ms``; returns the rate since the previous
        sample (None for the first one, a repeated time or a restart)."""
        last = self._last
        if last is not None and now_ms <= last[0]:
            return None  # a repeated or late sample changes nothing
        self._last = (now_ms, counter)
        if last is None or counter < last[1]:
            return None  # the first sample, or the counter restarted (topic created again)
        rate = (counter - last[1]) * 1000.0 / (now_ms - last[0])
        self.series.append(now_ms, round(rate, 3))
        return rate


class Samples:
    """Every chart's series: records/s per topic and total lag per group."""

    def __init__(self, capacity: int = 600, max_series: int = 500) -> None:
        self.capacity = capacity
        self.max_series = max_series
        self.throughput: dict[str, RateSeries] = {}
        self.lag: dict[str, Series] = {}
        self.last_sample_ms: int | None = None

    def record(self, now_ms: int, topic_offsets: Mapping[str, int],
               group_lags: Mapping[str, int]) -> None:
        """One sample: each topic's sum of high watermarks and each group's total lag.
        Topics and groups not in the sample lose their series."""
        self.last_sample_ms = now_ms
        _keep(self.throughput, topic_offsets)
        for topic in _bounded(topic_offsets, self.throughput, self.max_series):
            rates = self.throughput.setdefault(topic, RateSeries(self.capacity))
            rates.sample(now_ms, topic_offsets[topic])
        _keep(self.lag, group_lags)
        for group in _bounded(group_lags, self.lag, self.max_series):
            self.lag.setdefault(group, Series(self.capacity)).append(now_ms, group_lags[group])

    def throughput_doc(self) -> dict[str, dict[str, list[float] | list[int]]]:
        return {topic: r.series.doc() for topic, r in sorted(self.throughput.items())}

    def lag_doc(self, group: str) -> dict[str, list[float] | list[int]] | None:
        series = self.lag.get(group)
        return None if series is None else series.doc()


def _keep(series: MutableMapping[str, Any], present: Iterable[str]) -> None:
    wanted = set(present)
    for name in [n for n in series if n not in wanted]:
        del series[name]


def _bounded(names: Iterable[str], existing: Mapping[str, object], limit: int) -> list[str]:
    """The names to sample: those with a series already, then new ones (sorted) while
    fewer than ``limit`` are tracked."""
    out = sorted(n for n in names if n in existing)
    room = limit - len(out)
    if room > 0:
        out += sorted(n for n in names if n not in existing)[:room]
    return out

