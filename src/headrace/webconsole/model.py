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
- Throughput is records appended per second (offsets, control records of transactions
  included), counted per partition: only what a partition's high watermark grew past the
  highest value seen for it counts. A partition missing from a sample (no leader during a
  failover) counts nothing, and coming back counts only its growth since it was last seen,
  not its whole high watermark; a new leader's high watermark that is behind the old
  leader's (until its followers fetch) counts nothing either. A topic missing from a sample
  (deleted) loses its series, so a topic created again starts a new one.
- Counts are stale when the last sample is older than two intervals and a second: the
  sampler is waiting on the cluster; the pages say so rather than showing old counts as
  current.
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


class AppendRate:
    """Records appended per second to one topic, from samples of its partitions' high
    watermarks (see the module's rules: only growth past the highest value seen counts)."""

    def __init__(self, capacity: int) -> None:
        self.series = Series(capacity)
        self._last_ms: int | None = None
        self._highest: dict[int, int] = {}

    def sample(self, now_ms: int, high_watermarks: Mapping[int, int]) -> float | None:
        """Record the high watermarks known at ``now_ms`` (partitions without a leader
        left out); returns the rate since the previous sample (None for the first one or
        a repeated time)."""
        last_ms = self._last_ms
        if last_ms is not None and now_ms <= last_ms:
            return None  # a repeated or late sample changes nothing
        appended = 0
        for partition, high in high_watermarks.items():
            if high < 0:
                continue  # not known this time
            highest = self._highest.get(partition)
            if highest is None or high > highest:
                if highest is not None:
                    appended += high - highest
                self._highest[partition] = high
        self._last_ms = now_ms
        if last_ms is None:
            return None
        rate = appended * 1000.0 / (now_ms - last_ms)
        self.series.append(now_ms, round(rate, 3))
        return rate


class Samples:
    """Every chart's series: records/s per topic and total lag per group."""

    def __init__(self, capacity: int = 600, max_series: int = 500) -> None:
        self.capacity = capacity
        self.max_series = max_series
        self.throughput: dict[str, AppendRate] = {}
        self.lag: dict[str, Series] = {}
        self.last_sample_ms: int | None = None

    def record(self, now_ms: int, high_watermarks: Mapping[str, Mapping[int, int]],
               group_lags: Mapping[str, int | None]) -> None:
        """One sample: each topic's high watermark per partition (those with a leader)
        and each group's total lag (None: not known this time, e.g. its coordinator
        does not answer: the series keeps its points and gets none). Topics and groups
        not in the sample lose their series."""
        self.last_sample_ms = now_ms
        _keep(self.throughput, high_watermarks)
        for topic in _bounded(high_watermarks, self.throughput, self.max_series):
            rates = self.throughput.setdefault(topic, AppendRate(self.capacity))
            rates.sample(now_ms, high_watermarks[topic])
        _keep(self.lag, group_lags)
        for group in _bounded(group_lags, self.lag, self.max_series):
            series = self.lag.setdefault(group, Series(self.capacity))
            lag = group_lags[group]
            if lag is not None:
                series.append(now_ms, lag)

    def throughput_doc(self) -> dict[str, dict[str, list[float] | list[int]]]:
        return {topic: r.series.doc() for topic, r in sorted(self.throughput.items())}

    def lag_doc(self, group: str) -> dict[str, list[float] | list[int]] | None:
        series = self.lag.get(group)
        return None if series is None else series.doc()


def is_stale(now_ms: int, sampled_at_ms: int | None, interval_s: float) -> bool:
    """Whether counts sampled at ``sampled_at_ms`` are too old to show as current at
    ``now_ms``: older than two intervals and a second (a sample is overdue)."""
    if sampled_at_ms is None:
        return False
    return now_ms - sampled_at_ms > 2 * interval_s * 1000 + 1000


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



# ------------------------------------------------------------------ groups by coordinator


def merge_group_answers(answers: Mapping[int, list[dict[str, Any]] | str],
                        known: Mapping[str, dict[str, Any]], now_ms: int
                        ) -> dict[str, dict[str, Any]]:
    """This sample's groups, from each broker's answer about the groups it coordinates.

    ``answers``: per live broker id, its groups' docs (each with ``group`` and ``lag``) or,
    when it did not answer in time, why not. ``known``: the previous result. A group its
    coordinator listed is fresh; a known group whose coordinator did not answer (or is no
    longer in the cluster) and that no other broker lists keeps its last doc with ``lag``
    None, ``error`` saying why and ``error_since_ms``: the outage shows on the groups it
    concerns only. A known group its coordinator answered without is gone (deleted)."""
    out: dict[str, dict[str, Any]] = {}
    for broker_id, answer in answers.items():
        if isinstance(answer, str):
            continue
        for doc in answer:
            out[doc["group"]] = {"error": None, "error_since_ms": None, **doc,
                                 "coordinator": broker_id}
    for group, doc in known.items():
        if group in out:
            continue
        coordinator = doc.get("coordinator")
        said = answers.get(coordinator) if isinstance(coordinator, int) else None
        if isinstance(said, list):
            continue  # its coordinator answered without it: deleted
        why = (f"its coordinator (broker {coordinator}) does not answer: {said}"
               if isinstance(said, str)
               else f"its coordinator (broker {coordinator}) is not in the cluster")
        out[group] = {**doc, "lag": None, "error": why,
                      "error_since_ms": doc.get("error_since_ms") or now_ms}
    return dict(sorted(out.items()))
