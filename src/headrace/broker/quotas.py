"""The broker's client quotas (issue 12): the shell around the pure ``security.quotas`` core
and the metadata store's quota entities.

Enforcement, as Kafka's ``KafkaApis`` does it: after a handler ran,

* Produce records the request's size against ``producer_byte_rate`` (Kafka:
  ``request.sizeInBytes``) and, unless acks=0, its handler time against
  ``request_percentage``;
* a consumer's Fetch (not a follower's: replication is exempt) has its ``max_bytes`` (and
  ``min_bytes``) capped at what the quota allows in a window (``getMaxValueInQuotaWindow``)
  before it runs, then records the response size against ``consumer_byte_rate`` and its
  handler time; throttled, the size is taken back and the answer is an empty response;
* every other request records its handler time against ``request_percentage``.

Handler time is Kafka's request-thread time: only the time the handler's code runs
(``Timed`` measures each step of the coroutine), never the time it is parked (a long poll,
acks=all). The larger throttle time goes into the response's ``throttle_time_ms`` and the
connection is muted that long (``Connection.throttle``). Nothing is recorded while no
quota is stored at all (``enabled``).

Connections (KIP-612): ``max.connection.creation.rate`` broker-wide holds a new connection
unread for the throttle time (Kafka's acceptor waits); a per-IP ``connection_creation_rate``
over its quota closes the new connection at once.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Awaitable, Coroutine, Generator, Mapping
from typing import TYPE_CHECKING, Any

from kio.static.primitive import i32Timedelta

from headrace.broker.security import store_change
from headrace.protocol.codec import EncodedBody, encode_fetch_body
from headrace.security.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ConnectionRateLimiter,
    QuotaEntity,
    QuotaManager,
    QuotaTable,
)

if TYPE_CHECKING:
    from headrace.broker.handlers.base import HandlerFn, RequestContext
    from headrace.broker.server import Broker

PRODUCE = 0
FETCH = 1
WRITE_TXN_MARKERS = 27  # inter-broker (CLUSTER_ACTION): exempt, as Kafka's maybeRecordExempt
NANOS_TO_PERCENTAGE = 100 / 1e9  # ClientRequestQuotaManager.NanosToPercentagePerSecond


class Timed:
    """Await a coroutine and add up the time its own code runs (each step between
    suspensions): Kafka's request-thread time, without the time spent parked."""

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self.ns = 0

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        send: Any = None
        throw: BaseException | None = None
        while True:
            t0 = time.perf_counter_ns()
            try:
                yielded = coro.throw(throw) if throw is not None else coro.send(send)
            except StopIteration as stop:
                self.ns += time.perf_counter_ns() - t0
                return stop.value
            self.ns += time.perf_counter_ns() - t0
            try:
                send, throw = (yield yielded), None
            except BaseException as e:  # cancellation and the like: into the handler
                send, throw = None, e


def with_throttle(body: Any, throttle_ms: int) -> Any:
    """``body`` with its ``throttle_time_ms`` set (responses without the field unchanged)."""
    if throttle_ms <= 0 or body is None:
        return body
    if isinstance(body, EncodedBody):  # encoded by hand (Metadata): its own field, if any
        return body.with_throttle_time(throttle_ms)
    if any(f.name == "throttle_time" for f in dataclasses.fields(body)):
        return dataclasses.replace(body, throttle_time=i32Timedelta.parse(
            datetime.timedelta(milliseconds=throttle_ms)))
    return body


class ClientQuotas:
    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._store = broker.metadata
        config = broker.config
        samples = int(config["quota.window.num"])
        window_ms = int(config["quota.window.size.seconds"]) * 1000
        table = self._store.quota_table
        self._table = table
        self.produce = QuotaManager(table, PRODUCER_BYTE_RATE, samples, window_ms)
        self.fetch = QuotaManager(table, CONSUMER_BYTE_RATE, samples, window_ms)
        # Kafka caps the request quota's throttle at one window
        self.request = QuotaManager(table, REQUEST_PERCENTAGE, samples, window_ms,
                                    max_throttle_ms=window_ms)
        self.connections = ConnectionRateLimiter(
            table, float(config["max.connection.creation.rate"]), samples, window_ms)

    def _current_table(self) -> QuotaTable:
        """The store's table (a ZooKeeper store replaces it when its session is renewed)."""
        table = self._store.quota_table
        if table is not self._table:
            self._table = table
            for m in (self.produce, self.fetch, self.request, self.connections):
                m.table = table
        return table

    @property
    def enabled(self) -> bool:
        return len(self._current_table()) > 0

    # ---------------------------------------------------------------- enforcement
    def _is_follower_fetch(self, ctx: RequestContext, req: Any) -> bool:
        if self._broker.cluster is None:
            return False
        from headrace.broker.handlers.fetch import _replica_id

        return _replica_id(ctx, req) >= 0

    async def run(self, fn: HandlerFn, ctx: RequestContext, req: Any,
                  request_size: int) -> tuple[Any, int]:
        """Run the handler with the quotas of its (user, client id): the response (its
        throttle_time_ms set) and the throttle time the connection is muted for."""
        broker = self._broker
        api = ctx.header.api_key
        user = ctx.principal.name
        client_id = ctx.header.client_id or ""
        exempt = api == WRITE_TXN_MARKERS or (api == FETCH and self._is_follower_fetch(ctx, req))
        if api == FETCH and not exempt:
            cap = self.fetch.max_value_in_window(user, client_id)
            if cap is not None and int(req.max_bytes) > cap:
                max_bytes = max(int(cap), 1)
                req = dataclasses.replace(req, max_bytes=max_bytes,
                                          min_bytes=min(int(req.min_bytes), max_bytes))
        timed = Timed(_coroutine(fn(broker, ctx, req)))
        body = await timed
        if exempt:
            return body, 0
        now_ms = broker.clock.monotonic_ms()
        request_ms = 0
        if not (api == PRODUCE and int(req.acks) == 0):
            request_ms = self.request.record(user, client_id, timed.ns * NANOS_TO_PERCENTAGE,
                                             now_ms)
        bandwidth_ms = 0
        if api == PRODUCE:
            bandwidth_ms = self.produce.record(user, client_id, request_size, now_ms)
        elif api == FETCH and isinstance(body, EncodedBody):
            size = body.size
            bandwidth_ms = self.fetch.record(user, client_id, size, now_ms)
            throttle_ms = max(bandwidth_ms, request_ms)
            if throttle_ms:
                # Kafka: a throttled Fetch answers nothing, and its bytes are taken back
                self.fetch.unrecord(user, client_id, size, now_ms)
                return encode_fetch_body(ctx.api_version, throttle_ms, 0, 0, []), throttle_ms
            return body, 0
        throttle_ms = max(bandwidth_ms, request_ms)
        return with_throttle(body, throttle_ms), throttle_ms

    def admit_connection(self, ip: str) -> tuple[str | None, int]:
        """(why it is refused, or None; how long to hold it unread, ms)."""
        if len(self._current_table()):
            ip_ms = self.connections.admit_ip(ip, self._broker.clock.monotonic_ms())
            if ip_ms:
                return (f"connection_creation_rate of {ip} exceeded (throttled "
                        f"{ip_ms} ms)"), 0
        return None, self.connections.broker_delay(self._broker.clock.monotonic_ms())

    # ---------------------------------------------------------------- storage
    async def change(self, entity: QuotaEntity, upsert: Mapping[str, float],
                     remove: set[str]) -> dict[str, float]:
        store = self._store
        after = await store_change(self._broker.config.clustered, store.change_client_quotas,
                                   entity, upsert, remove)
        store.install_client_quotas(entity, after)
        return after


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


def _coroutine(aw: Awaitable[Any]) -> Coroutine[Any, Any, Any]:
    return aw if isinstance(aw, Coroutine) else _await(aw)
