"""Client quotas (issue 12, KIP-13/KIP-55/KIP-124/KIP-219/KIP-612), PURE: entities, Kafka's
precedence, the sampled rate and the throttle time. No I/O; time is an argument (``now_ms``).

Rules, as Kafka's ``ClientQuotaManager``, ``ClientRequestQuotaManager``, ``QuotaUtils`` and
``org.apache.kafka.common.metrics.stats.Rate`` have them:

* An **entity** is a user, a client id, or both (``/config/users/<user>/clients/<client>``);
  either part may be the default (``<default>``, ``DEFAULT`` here; a ``None`` part is absent).
  An IP entity (``/config/ips/<ip>``) carries only ``connection_creation_rate``.
* **Keys**: ``producer_byte_rate`` and ``consumer_byte_rate`` (bytes/s),
  ``request_percentage`` (percent of one request thread per second: handler time),
  ``controller_mutation_rate`` (stored and described, not enforced: no KIP-599 here),
  ``connection_creation_rate`` (IP entities).
* **Precedence** (per quota type: only entities that set this type's key count), first
  found wins: /config/users/<user>/clients/<client-id> > /config/users/<user>/clients/<default>
  > /config/users/<user> > /config/users/<default>/clients/<client-id> >
  /config/users/<default>/clients/<default> > /config/users/<default> >
  /config/clients/<client-id> > /config/clients/<default>. The matching level also decides
  who shares one rate (Kafka's metric tags): a quota on ``/config/users/alice`` is one rate
  for all of alice's clients; on ``/config/users/<default>`` one rate per user; on
  ``/config/clients/<default>`` one per client id.
* **Rate**: a sampled total over ``quota.window.num`` (11) samples of
  ``quota.window.size.seconds`` (1 s): a sample is complete after one window, the next
  (oldest reused) starts at the recording time, samples older than num * size are reset;
  rate = total / elapsed, elapsed = now - the oldest sample's start, never less than
  (num - 1) full windows.
* **Violation**: after recording, rate > quota. **Throttle time** (KIP-219):
  ``(rate - quota) / quota * elapsed`` ms, rounded; the request quota's is capped at one
  window. The BYTE-rate quotas are metered by KIP-599's token bucket instead
  (``TokenBucket``: the same long-run quota and initial credit, without the sampled
  rate's multi-second bursts and silences, which break a 20 s bound). The response goes
  out at once carrying it, and the connection reads nothing more
  for that long (the shell's job).

Illegal input (negative or non-finite quotas, unknown keys) raises ``QuotaError`` (whose
fault: the caller's request; handlers map it to INVALID_REQUEST) and changes nothing.
"""

from __future__ import annotations

import enum
import math
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"

# Kafka's QuotaConfigs: the keys of user and client entities (and their ConfigDef types:
# an integral value must be given for LONG/INT keys)
CLIENT_QUOTA_KEYS: Mapping[str, str] = {
    PRODUCER_BYTE_RATE: "LONG",
    CONSUMER_BYTE_RATE: "LONG",
    REQUEST_PERCENTAGE: "DOUBLE",
    CONTROLLER_MUTATION_RATE: "DOUBLE",
}
IP_QUOTA_KEYS: Mapping[str, str] = {CONNECTION_CREATION_RATE: "INT"}
USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
DEFAULT_NAME = "<default>"  # Kafka's ConfigEntityName.DEFAULT, a znode name

INACTIVE_SENSOR_EXPIRATION_MS = 3_600_000  # Kafka drops a client's sensors after 1 h idle


class QuotaError(ValueError):
    """The caller asked for something Kafka refuses (INVALID_REQUEST in a handler)."""


class Default(enum.Enum):
    """The default entity name (``<default>``; null on the wire)."""

    DEFAULT = DEFAULT_NAME


DEFAULT = Default.DEFAULT
Name = str | Default


def sanitize(name: str) -> str:
    """Kafka's ``Sanitizer.sanitize``: a name as one znode name (URL-encoded)."""
    return urllib.parse.quote(name, safe="")


def desanitize(name: str) -> str:
    return urllib.parse.unquote(name)


def _path_name(name: Name) -> str:
    return DEFAULT_NAME if name is DEFAULT else sanitize(str(name))


def _from_path_name(text: str) -> Name:
    return DEFAULT if text == DEFAULT_NAME else desanitize(text)


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """``user``/``client_id``/``ip``: a name, ``DEFAULT`` or None (not part of it)."""

    user: Name | None = None
    client_id: Name | None = None
    ip: Name | None = None

    def __post_init__(self) -> None:
        if self.ip is not None and (self.user is not None or self.client_id is not None):
            raise QuotaError("Invalid quota entity combination, IP entity should not be "
                             "combined with User or ClientId")
        if self.user is None and self.client_id is None and self.ip is None:
            raise QuotaError("Invalid empty client quota entity")

    @property
    def keys(self) -> Mapping[str, str]:
        return IP_QUOTA_KEYS if self.ip is not None else CLIENT_QUOTA_KEYS

    @property
    def path(self) -> str:
        """Kafka's ZooKeeper entity path under /config (``users/alice/clients/app``)."""
        if self.ip is not None:
            return f"ips/{_path_name(self.ip)}"
        if self.user is None:
            assert self.client_id is not None
            return f"clients/{_path_name(self.client_id)}"
        if self.client_id is None:
            return f"users/{_path_name(self.user)}"
        return f"users/{_path_name(self.user)}/clients/{_path_name(self.client_id)}"

    @classmethod
    def from_path(cls, path: str) -> QuotaEntity:
        """The inverse of ``path``; QuotaError for anything else."""
        parts = path.split("/")
        if len(parts) == 2 and parts[1]:
            kind, name = parts[0], _from_path_name(parts[1])
            if kind == "users":
                return cls(user=name)
            if kind == "clients":
                return cls(client_id=name)
            if kind == "ips":
                return cls(ip=name)
        if len(parts) == 4 and parts[0] == "users" and parts[2] == "clients" and all(parts):
            return cls(user=_from_path_name(parts[1]), client_id=_from_path_name(parts[3]))
        raise QuotaError(f"not a quota entity path: {path!r}")

    def components(self) -> list[tuple[str, str | None]]:
        """(entity type, name or None for the default), as the wire carries them."""
        out: list[tuple[str, str | None]] = []
        for kind, name in ((USER, self.user), (CLIENT_ID, self.client_id), (IP, self.ip)):
            if name is not None:
                out.append((kind, None if name is DEFAULT else str(name)))
        return out


def check_values(entity: QuotaEntity, values: Mapping[str, float]) -> dict[str, float]:
    """Kafka's AlterClientQuotas checks on values to set: a known key of the entity's kind,
    integral for LONG/INT keys (within 1e-6), finite; QuotaError otherwise."""
    out: dict[str, float] = {}
    for key, value in values.items():
        kind = entity.keys.get(key)
        if kind is None:
            raise QuotaError(f"Invalid configuration key {key}")
        if not math.isfinite(value):
            raise QuotaError(f"Configuration {key} must be a finite value")
        if kind in ("LONG", "INT"):
            integral = float(int(value + 1e-6))
            if abs(integral - value) > 1e-6:
                raise QuotaError(f"Configuration {key} must be a {kind} value")
            value = integral
        if value <= 0:
            # Kafka's DynamicConfig validators: quotas are positive
            raise QuotaError(f"Configuration {key} must be positive")
        out[key] = value
    return out


# ---------------------------------------------------------------------- the sampled rate
@dataclass(slots=True)
class _Sample:
    start_ms: int
    value: float = 0.0


@dataclass(slots=True)
class Rate:
    """Kafka's ``Rate`` over a ``SampledTotal`` (see the module docstring)."""

    samples: int = 11
    window_ms: int = 1000
    _samples: list[_Sample] = field(default_factory=list)
    _current: int = 0
    last_record_ms: int = 0

    def record(self, value: float, now_ms: int) -> None:
        self.last_record_ms = now_ms
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        sample = self._samples[self._current]
        if now_ms - sample.start_ms >= self.window_ms:  # complete: advance
            self._current = (self._current + 1) % self.samples
            if self._current >= len(self._samples):
                self._samples.append(_Sample(now_ms))
            else:
                self._samples[self._current] = _Sample(now_ms)
            sample = self._samples[self._current]
        sample.value += value

    def _purge(self, now_ms: int) -> None:
        expire = self.samples * self.window_ms
        for s in self._samples:
            if now_ms - s.start_ms >= expire:
                s.start_ms, s.value = now_ms, 0.0

    def window_size_ms(self, now_ms: int) -> int:
        """Kafka's ``Rate.windowSize``: elapsed since the oldest sample, at least
        (samples - 1) full windows."""
        self._purge(now_ms)
        oldest = min((s.start_ms for s in self._samples), default=now_ms)
        elapsed = now_ms - oldest
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return elapsed

    def total(self, now_ms: int) -> float:
        self._purge(now_ms)
        return sum(s.value for s in self._samples)

    def measure(self, now_ms: int) -> float:
        """The rate per second."""
        window = self.window_size_ms(now_ms)
        return self.total(now_ms) / (window / 1000) if window > 0 else 0.0

    def throttle_ms(self, bound: float, now_ms: int) -> int:
        """0 if the rate is within ``bound``, else KIP-219's delay (QuotaUtils.throttleTime)."""
        value = self.measure(now_ms)
        if value <= bound:
            return 0
        if bound <= 0:  # nothing allowed: one whole window
            return self.window_size_ms(now_ms)
        return round((value - bound) / bound * self.window_size_ms(now_ms))


@dataclass(slots=True)
class TokenBucket:
    """KIP-599's token bucket (Kafka's ``TokenBucket`` stat): ``tokens`` refill at the
    quota's rate up to a burst of ``samples * window`` worth of quota; a record takes its
    value out; a deficit is throttled for exactly the time the refill takes
    (``-tokens / quota``). headrace meters the byte-rate quotas with it: Kafka's sampled
    ``Rate`` lets a client that ignores throttle_time_ms (librdkafka does) burst about ten
    windows of quota each time its oldest sample expires and then sit muted for seconds
    (0.6-1.14 of the quota per 20 s window), while the bucket gives the quota steadily
    after the first burst, and never more than burst + quota * elapsed."""

    samples: int = 11
    window_ms: int = 1000
    tokens: float | None = None  # None: full (a new client starts with the burst)
    last_ms: int = 0
    last_record_ms: int = 0

    def _refill(self, bound: float, now_ms: int) -> float:
        burst = bound * self.samples * self.window_ms / 1000
        if self.tokens is None:
            self.tokens = burst
        else:
            self.tokens = min(burst, self.tokens + bound * max(0, now_ms - self.last_ms) / 1000)
        self.last_ms = now_ms
        return self.tokens

    def record(self, value: float, bound: float, now_ms: int) -> None:
        self.last_record_ms = now_ms
        self.tokens = self._refill(bound, now_ms) - value

    def throttle_ms(self, bound: float, now_ms: int) -> int:
        tokens = self._refill(bound, now_ms)
        if tokens >= 0:
            return 0
        if bound <= 0:
            return self.window_ms
        return math.ceil(-tokens / bound * 1000)


# ---------------------------------------------------------------------- precedence
Tags = tuple[str, str]
"""Kafka's metric tags (user, client id), "" for a part not used: who shares one rate."""


class QuotaTable:
    """Every entity's stored quotas (``{key: value}``); resolution per (key, user, client)."""

    def __init__(self) -> None:
        self._entities: dict[QuotaEntity, dict[str, float]] = {}
        self._resolved: dict[tuple[str, str, str], tuple[Tags, float | None]] = {}
        self.version = 0  # bumped on every change (the shell's caches compare it)

    def set(self, entity: QuotaEntity, values: Mapping[str, float]) -> None:
        """Replace the entity's quotas (empty: remove the entity)."""
        if values:
            self._entities[entity] = dict(values)
        else:
            self._entities.pop(entity, None)
        self._resolved.clear()
        self.version += 1

    def get(self, entity: QuotaEntity) -> dict[str, float]:
        return dict(self._entities.get(entity, {}))

    def items(self) -> Iterator[tuple[QuotaEntity, dict[str, float]]]:
        for e, v in self._entities.items():
            yield e, dict(v)

    def __len__(self) -> int:
        return len(self._entities)

    def has_key(self, key: str) -> bool:
        return any(key in v for v in self._entities.values())

    def _value(self, key: str, user: Name | None, client_id: Name | None) -> float | None:
        values = self._entities.get(QuotaEntity(user=user, client_id=client_id))
        return None if values is None else values.get(key)

    def resolve(self, key: str, user: str, client_id: str) -> tuple[Tags, float | None]:
        """(tags, quota or None) for a request of ``user`` (the principal's name) with
        ``client_id``: Kafka's ``quotaMetricTags`` then ``quotaLimit``."""
        memo = (key, user, client_id)
        hit = self._resolved.get(memo)
        if hit is not None:
            return hit
        out = self._resolve(key, user, client_id)
        if len(self._resolved) > 100_000:
            self._resolved.clear()
        self._resolved[memo] = out
        return out

    def _resolve(self, key: str, user: str, client_id: str) -> tuple[Tags, float | None]:
        v = self._value
        # the level that sets this key decides the tags (who shares the rate)
        for u, c, tags in (
            (user, client_id, (user, client_id)),
            (user, DEFAULT, (user, client_id)),
            (user, None, (user, "")),
            (DEFAULT, client_id, (user, client_id)),
            (DEFAULT, DEFAULT, (user, client_id)),
            (DEFAULT, None, (user, "")),
        ):
            if v(key, u, c) is not None:
                return tags, self._limit(key, tags)
        return ("", client_id), self._limit(key, ("", client_id))

    def _limit(self, key: str, tags: Tags) -> float | None:
        user, client_id = tags
        v = self._value
        if user and client_id:
            for u, c in ((user, client_id), (user, DEFAULT), (DEFAULT, client_id),
                         (DEFAULT, DEFAULT)):
                q = v(key, u, c)
                if q is not None:
                    return q
            return None
        if user:
            q = v(key, user, None)
            return q if q is not None else v(key, DEFAULT, None)
        q = v(key, None, client_id)
        return q if q is not None else v(key, None, DEFAULT)

    def ip_quota(self, ip: str) -> float | None:
        """``connection_creation_rate`` of /config/ips/<ip>, else of /config/ips/<default>."""
        for name in (ip, DEFAULT):
            values = self._entities.get(QuotaEntity(ip=name))
            if values is not None and CONNECTION_CREATION_RATE in values:
                return values[CONNECTION_CREATION_RATE]
        return None


# ---------------------------------------------------------------------- managers
_Sensor = TypeVar("_Sensor", Rate, TokenBucket)


class QuotaManager:
    """One quota type (Kafka's ClientQuotaManager for produce/fetch, or
    ClientRequestQuotaManager with ``max_throttle_ms`` one window): a rate per tags."""

    def __init__(self, table: QuotaTable, key: str, samples: int, window_ms: int,
                 max_throttle_ms: int | None = None) -> None:
        self.table = table
        self.key = key
        self.samples = samples
        self.window_ms = window_ms
        self.max_throttle_ms = max_throttle_ms
        self._rates: dict[Tags, Rate] = {}
        self._buckets: dict[Tags, TokenBucket] = {}
        self._last_expiry_ms = 0
        # the byte rates are metered by a token bucket (see TokenBucket), handler time by
        # Kafka's sampled rate (its throttle is capped at one window anyway)
        self.bucketed = key in (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)

    @property
    def enabled(self) -> bool:
        return self.table.has_key(self.key)

    def _rate(self, tags: Tags, now_ms: int) -> Rate:
        return self._sensor(self._rates, tags, now_ms, Rate)

    def _bucket(self, tags: Tags, now_ms: int) -> TokenBucket:
        return self._sensor(self._buckets, tags, now_ms, TokenBucket)

    def _sensor(self, sensors: dict[Tags, _Sensor], tags: Tags, now_ms: int,
                new: Callable[[int, int], _Sensor]) -> _Sensor:
        """The sensor of ``tags`` in ``sensors``, created if missing; when one is created,
        now and then, the ones unused for INACTIVE_SENSOR_EXPIRATION_MS are dropped."""
        sensor = sensors.get(tags)
        if sensor is None:
            if now_ms - self._last_expiry_ms >= INACTIVE_SENSOR_EXPIRATION_MS // 10:
                self._last_expiry_ms = now_ms
                for t in [t for t, s in sensors.items()
                          if now_ms - s.last_record_ms >= INACTIVE_SENSOR_EXPIRATION_MS]:
                    del sensors[t]
            sensor = sensors[tags] = new(self.samples, self.window_ms)
        return sensor

    def record(self, user: str, client_id: str, value: float, now_ms: int) -> int:
        """Record ``value``; the throttle time in ms (0: within the quota or no quota)."""
        tags, bound = self.table.resolve(self.key, user, client_id)
        if bound is None:
            return 0
        if self.bucketed:
            bucket = self._bucket(tags, now_ms)
            bucket.record(value, bound, now_ms)
            delay = bucket.throttle_ms(bound, now_ms)
        else:
            rate = self._rate(tags, now_ms)
            rate.record(value, now_ms)
            delay = rate.throttle_ms(bound, now_ms)
        if self.max_throttle_ms is not None:
            delay = min(delay, self.max_throttle_ms)
        return delay

    def unrecord(self, user: str, client_id: str, value: float, now_ms: int) -> None:
        """Take back a recorded value (a throttled Fetch answers nothing)."""
        tags, bound = self.table.resolve(self.key, user, client_id)
        if bound is not None:
            if self.bucketed:
                self._bucket(tags, now_ms).record(-value, bound, now_ms)
            else:
                self._rate(tags, now_ms).record(-value, now_ms)

    def max_value_in_window(self, user: str, client_id: str) -> float | None:
        """Kafka's ``getMaxValueInQuotaWindow``: quota * (samples - 1) * window (a Fetch's
        max_bytes cap), None without a quota."""
        _, bound = self.table.resolve(self.key, user, client_id)
        if bound is None:
            return None
        return bound * (self.samples - 1) * self.window_ms / 1000


class ConnectionRateLimiter:
    """KIP-612: ``max.connection.creation.rate`` (broker-wide) and per-IP
    ``connection_creation_rate``; both are Kafka's rates over the quota windows."""

    def __init__(self, table: QuotaTable, broker_rate: float, samples: int,
                 window_ms: int) -> None:
        self.table = table
        self.broker_rate = broker_rate
        self.samples = samples
        self.window_ms = window_ms
        self._broker = Rate(samples, window_ms)
        self._ips: dict[str, Rate] = {}

    def admit_ip(self, ip: str, now_ms: int) -> int:
        """A new connection from ``ip``: 0 to accept it (counted), else the throttle time
        (not counted: Kafka closes it)."""
        bound = self.table.ip_quota(ip)
        if bound is None:
            return 0
        rate = self._ips.get(ip)
        if rate is None:
            if len(self._ips) > 10_000:
                self._ips = {k: r for k, r in self._ips.items()
                             if now_ms - r.last_record_ms < self.samples * self.window_ms}
            rate = self._ips[ip] = Rate(self.samples, self.window_ms)
        rate.record(1.0, now_ms)
        delay = rate.throttle_ms(bound, now_ms)
        if delay:
            rate.record(-1.0, now_ms)
        return delay

    def broker_delay(self, now_ms: int) -> int:
        """A new connection, broker-wide: recorded; how long to hold it before serving it
        (Kafka's acceptor waits that long before accepting more)."""
        if self.broker_rate >= 2**31 - 1:
            return 0
        self._broker.record(1.0, now_ms)
        return self._broker.throttle_ms(self.broker_rate, now_ms)


# ---------------------------------------------------------------------- stored form
def format_value(entity: QuotaEntity, key: str, value: float) -> str:
    """A value as Kafka stores it in a config map: integral keys as integers ("1048576"),
    doubles as Java prints them ("50.0")."""
    if entity.keys.get(key) in ("LONG", "INT"):
        return str(int(value))
    return repr(float(value))


def stored_quotas(entity: QuotaEntity, config: Mapping[str, str]) -> dict[str, float]:
    """The quota keys of a stored config map (a user's also holds SCRAM credentials);
    unparsable values are left out."""
    out: dict[str, float] = {}
    for key in entity.keys:
        text = config.get(key)
        if text is None:
            continue
        try:
            value = float(text)
        except ValueError:
            continue
        if math.isfinite(value):
            out[key] = value
    return out
