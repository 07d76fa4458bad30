"""Prometheus metrics, ``/health`` and ``/ready`` of a broker (issue 13).

Names are those the Prometheus JMX exporter's Kafka rules give Kafka's MBeans
(``kafka.server<type=BrokerTopicMetrics, name=BytesInPerSec, topic=T><>Count`` →
``kafka_server_brokertopicmetrics_bytesin_total{topic="T"}``), so dashboards and alerts
written for Kafka find them; consumer group lag is named as kafka_exporter names it
(``kafka_consumergroup_lag{consumergroup,topic,partition}``). Differences from Kafka:

- per-topic series only: the exporter's label-less "all topics" series of the same name
  would be double counted by ``sum()``; sum over ``topic`` instead;
- ``kafka_network_requestmetrics_totaltimems`` is a histogram in **milliseconds** (Kafka's
  unit and name; the exporter gives percentiles), per ``request``; it measures the
  handler, from the decoded request to the encoded response (a Produce's acks=all wait
  and a Fetch's long poll included; queueing before the handler and sending not);
- counters count what the broker accepted: bytes and messages in after a successful
  append (client Produce only, not replication), bytes out of consumer Fetch responses.

Threads. Everything is counted on the event loop, per request or per batch (never per
record): plain ints in dicts, no locks. The HTTP server (``ThreadingWSGIServer`` from the
standard library, one thread per scrape) never reads broker state itself: each scrape
asks the loop for a ``Snapshot`` (copies of the counters, and the gauges computed there:
partitions, ISR, lag, connections, purgatories) and waits for it; if the loop does not
answer within ``SNAPSHOT_TIMEOUT_S`` the scrape is answered 503. ``/health`` answers 200
while the process runs; ``/ready`` 200 once logs are loaded and the listeners serve (on a
cluster: registered in ZooKeeper, a controller known, not fenced), else 503.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from headrace.broker.replica_manager import TopicPartition

if TYPE_CHECKING:
    from headrace.broker.server import Broker

log = logging.getLogger("headrace.metrics")

SNAPSHOT_TIMEOUT_S = 5.0
# upper bounds (ms) of the request latency histogram's buckets
LATENCY_BUCKETS_MS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0,
                      2500.0, 5000.0, 10000.0, 30000.0)


class _Latency:
    """One request type's histogram: counts per bucket (not cumulative), sum, count."""

    __slots__ = ("buckets", "count", "sum_ms")

    def __init__(self) -> None:
        self.buckets = [0] * (len(LATENCY_BUCKETS_MS) + 1)  # the last one: +Inf
        self.sum_ms = 0.0
        self.count = 0

    def observe(self, elapsed_ms: float) -> None:
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS_MS, elapsed_ms)] += 1
        self.sum_ms += elapsed_ms
        self.count += 1


@dataclass(frozen=True, slots=True)
class PartitionGauges:
    topic: str
    partition: int
    leading: bool
    replicas: int
    isr: int
    min_isr: int
    size_bytes: int  # -1: offline
    log_start_offset: int
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one scrape shows, copied on the event loop (read by the HTTP thread)."""

    bytes_in: dict[str, int]
    messages_in: dict[str, int]
    bytes_out: dict[str, int]
    messages_out: dict[str, int]
    requests: dict[tuple[str, int], int]
    latency: dict[str, tuple[list[int], float, int]]
    isr_shrinks: int
    isr_expands: int
    partitions: list[PartitionGauges]
    offline_partitions: int
    active_controller: int
    # (group, topic, partition) -> (committed offset, lag)
    group_offsets: dict[tuple[str, str, int], tuple[int, int]]
    connections: dict[str, int]
    purgatory: dict[str, int]
    ready: bool
    not_ready_why: str = ""
    # share groups (KIP-932): per topic, and acknowledged records per type
    share_fetches: dict[str, int] = field(default_factory=dict)
    share_fetches_failed: dict[str, int] = field(default_factory=dict)
    share_acks: dict[str, int] = field(default_factory=dict)
    share_acks_failed: dict[str, int] = field(default_factory=dict)
    record_acks: dict[str, int] = field(default_factory=dict)


class BrokerMetrics:
    """The broker's counters (bumped on the loop) and its metrics HTTP server."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.bytes_in: dict[str, int] = collections.defaultdict(int)
        self.messages_in: dict[str, int] = collections.defaultdict(int)
        self.bytes_out: dict[str, int] = collections.defaultdict(int)
        self.messages_out: dict[str, int] = collections.defaultdict(int)
        self.requests: dict[tuple[str, int], int] = collections.defaultdict(int)
        self.latency: dict[str, _Latency] = {}
        self.isr_shrinks = 0
        self.isr_expands = 0
        self.share_fetches: dict[str, int] = collections.defaultdict(int)
        self.share_fetches_failed: dict[str, int] = collections.defaultdict(int)
        self.share_acks: dict[str, int] = collections.defaultdict(int)
        self.share_acks_failed: dict[str, int] = collections.defaultdict(int)
        self.record_acks: dict[str, int] = collections.defaultdict(int)
        self.delayed_produce = 0  # acks=all Produce requests waiting for replication
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_BrokerCollector(self))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.bound_port = 0

    # ------------------------------------------------------------ counting (event loop)
    def produced(self, topic: str, size_bytes: int, records: int) -> None:
        """A client's batch appended to ``topic`` (one call per partition of a Produce)."""
        self.bytes_in[topic] += size_bytes
        self.messages_in[topic] += records

    @property
    def counting_records_out(self) -> bool:
        """Records out are read from the batch headers (~0.4 us per batch on the Fetch
        path): counted only while /metrics is served."""
        return self._server is not None

    def fetched(self, topic: str, size_bytes: int, records: int) -> None:
        """Record bytes and records of ``topic`` sent in a consumer's Fetch response."""
        self.bytes_out[topic] += size_bytes
        self.messages_out[topic] += records

    def share_fetched(self, topic: str, failed: bool) -> None:
        """A ShareFetch read ``topic`` (Kafka counts one per topic per request)."""
        self.share_fetches[topic] += 1
        if failed:
            self.share_fetches_failed[topic] += 1

    def share_acknowledged(self, topic: str, failed: bool,
                           records: dict[str, int] | None = None) -> None:
        """Acknowledgements of ``topic`` (ShareAcknowledge or within a ShareFetch), and
        the records acknowledged per type (accept, release, reject)."""
        self.share_acks[topic] += 1
        if failed:
            self.share_acks_failed[topic] += 1
        for kind, n in (records or {}).items():
            self.record_acks[kind] += n

    def topic_deleted(self, topic: str) -> None:
        """Forget a deleted topic's counters, as Kafka removes its BrokerTopicMetrics: its
        series leave /metrics (topic churn must not grow it without bound) and a topic
        created again under the name starts from zero. Its per-partition gauges go with
        its partitions (they are read from the hosted logs at each scrape)."""
        for counters in (self.bytes_in, self.messages_in, self.bytes_out, self.messages_out,
                         self.share_fetches, self.share_fetches_failed, self.share_acks,
                         self.share_acks_failed):
            counters.pop(topic, None)

    def counted_topics(self) -> set[str]:
        """The topics that have counters here."""
        return {*self.bytes_in, *self.messages_in, *self.bytes_out, *self.messages_out}

    def request_done(self, name: str, version: int, started: float) -> None:
        """A request handled (``started``: ``time.monotonic()`` when it was decoded)."""
        self.requests[(name, version)] += 1
        lat = self.latency.get(name)
        if lat is None:
            lat = self.latency[name] = _Latency()
        lat.observe((time.monotonic() - started) * 1000)

    def isr_changed(self, before: int, after: int) -> None:
        """The ISR of a partition this broker leads went from ``before`` to ``after``
        replicas."""
        if after < before:
            self.isr_shrinks += 1
        elif after > before:
            self.isr_expands += 1

    # ------------------------------------------------------------ snapshots (event loop)
    def snapshot(self) -> Snapshot:
        """Everything a scrape shows; runs on the event loop."""
        b = self.broker
        partitions: list[PartitionGauges] = []
        for tp, p in list(b.replicas.partitions.items()):
            plog = p.log
            offline = plog.offline is not None
            partitions.append(PartitionGauges(
                tp.topic, tp.partition, p.leading, len(p.state.replicas), len(p.state.isr),
                plog.config.min_insync_replicas,
                -1 if offline else plog.size_in_bytes,
                -1 if offline else plog.log_start_offset,
                -1 if offline else plog.log_end_offset))
        groups: dict[tuple[str, str, int], tuple[int, int]] = {}
        for group_id, offsets in b.groups.coordinator.offsets.items():
            for (topic, index), value in offsets.items():
                part = b.replicas.partitions.get(TopicPartition(topic, index))
                if part is None or part.log.offline is not None:
                    continue  # the high watermark is not known here
                hw = part.log.high_watermark
                groups[(group_id, topic, index)] = (value.offset, max(hw - value.offset, 0))
        connections: dict[str, int] = collections.Counter(
            c.listener for c in b.connections if not c.closed)
        parked = {f for futs in b.replicas._watchers.values() for f in futs}
        ready, why = self._readiness()
        return Snapshot(
            bytes_in=dict(self.bytes_in), messages_in=dict(self.messages_in),
            bytes_out=dict(self.bytes_out), messages_out=dict(self.messages_out),
            requests=dict(self.requests),
            latency={name: (list(lat.buckets), lat.sum_ms, lat.count)
                     for name, lat in self.latency.items()},
            isr_shrinks=self.isr_shrinks, isr_expands=self.isr_expands,
            partitions=partitions, offline_partitions=self._offline_partitions(partitions),
            active_controller=self._active_controller(), group_offsets=groups,
            connections=dict(connections),
            purgatory={"Produce": self.delayed_produce, "Fetch": len(parked)},
            ready=ready, not_ready_why=why,
            share_fetches=dict(self.share_fetches),
            share_fetches_failed=dict(self.share_fetches_failed),
            share_acks=dict(self.share_acks), share_acks_failed=dict(self.share_acks_failed),
            record_acks=dict(self.record_acks))

    def _active_controller(self) -> int:
        b = self.broker
        if b.config.clustered:
            return int(b.controller is not None and b.controller.is_active)
        return 1  # a single node decides everything itself

    def _offline_partitions(self, hosted: list[PartitionGauges]) -> int:
        """Kafka's controller metric: partitions without a live leader, reported by the
        active controller only (0 elsewhere). A single node: partitions whose log could
        not be opened (served KAFKA_STORAGE_ERROR)."""
        b = self.broker
        if not b.config.clustered:
            return sum(1 for g in hosted if g.size_bytes < 0)
        if not self._active_controller():
            return 0
        live = {info.node_id for info in b.metadata.live_brokers()}
        return sum(1 for topic in b.metadata.topics().values() for st in topic.partitions
                   if st.leader < 0 or st.leader not in live)

    def _readiness(self) -> tuple[bool, str]:
        b = self.broker
        if b.stopping:
            return False, "stopping"
        if not b._servers or not all(s.is_serving() for s in b._servers.values()):
            return False, "not listening yet (loading logs)"
        if b.config.clustered:
            if b.cluster is None or b.cluster.fenced:
                return False, "no ZooKeeper session"
            if b.node_id not in {info.node_id for info in b.metadata.live_brokers()}:
                return False, "not registered in ZooKeeper"
            if b.metadata.controller_id() < 0:
                return False, "no controller known"
        return True, ""

    # ------------------------------------------------------------ the HTTP side
    def snapshot_from_thread(self) -> Snapshot:
        """``snapshot`` taken on the event loop, from another thread; raises TimeoutError
        (or RuntimeError if the loop is gone)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the broker is not running")
        fut: concurrent.futures.Future[Snapshot] = concurrent.futures.Future()

        def run() -> None:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(self.snapshot())
                except BaseException as e:
                    fut.set_exception(e)

        loop.call_soon_threadsafe(run)
        try:
            return fut.result(SNAPSHOT_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(
                f"the event loop did not answer within {SNAPSHOT_TIMEOUT_S:g} s") from None

    async def start(self, host: str, port: int) -> None:
        """Serve /metrics, /health and /ready on ``host``:``port`` in a thread. Raises
        OSError if it cannot listen."""
        self._loop = asyncio.get_running_loop()
        app = _app(self)
        server_class = _HttpServer6 if ":" in host else _HttpServer
        server = await asyncio.to_thread(make_server, host, port, app,
                                         server_class=server_class,
                                         handler_class=_QuietHandler)
        self._server = server
        self.bound_port = int(server.server_address[1])
        self._thread = threading.Thread(target=server.serve_forever, kwargs={
            "poll_interval": 0.2}, name="headrace-metrics", daemon=True)
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics (and /health, /ready)",
                 f"[{host}]" if ":" in host else host, self.bound_port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.shutdown)
            server.server_close()
        self._thread = None


class _HttpServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds up shutdown
    allow_reuse_address = True


class _HttpServer6(_HttpServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape is noise


_Start = Callable[[str, list[tuple[str, str]]], Any]


def _app(metrics: BrokerMetrics) -> Callable[[dict[str, Any], _Start], Iterable[bytes]]:
    exposition = make_wsgi_app(metrics.registry)

    def text(start: _Start, status: str, body: str) -> list[bytes]:
        data = body.encode()
        start(status, [("Content-Type", "text/plain; charset=utf-8"),
                       ("Content-Length", str(len(data)))])
        return [data]

    def app(environ: dict[str, Any], start: _Start) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/health":
            return text(start, "200 OK", "ok\n")
        if path == "/ready":
            try:
                snap = metrics.snapshot_from_thread()
            except (TimeoutError, RuntimeError) as e:
                return text(start, "503 Service Unavailable", f"not ready: {e}\n")
            if snap.ready:
                return text(start, "200 OK", "ready\n")
            return text(start, "503 Service Unavailable", f"not ready: {snap.not_ready_why}\n")
        if path in ("/metrics", "/"):
            try:
                result: Iterable[bytes] = exposition(environ, start)
            except (TimeoutError, RuntimeError) as e:
                return text(start, "503 Service Unavailable", f"no metrics: {e}\n")
            return result
        return text(start, "404 Not Found", "try /metrics, /health or /ready\n")

    return app


class _BrokerCollector(Collector):
    """The broker's metrics, from one ``Snapshot`` per scrape."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        s = self.metrics.snapshot_from_thread()
        yield from _topic_counters(s)
        req = CounterMetricFamily("kafka_network_requestmetrics_requests",
                                  "Requests handled, per API and version (Kafka's "
                                  "RequestsPerSec).", labels=["request", "version"])
        for (name, version), n in sorted(s.requests.items()):
            req.add_metric([name, str(version)], n)
        yield req
        hist = HistogramMetricFamily(
            "kafka_network_requestmetrics_totaltimems",
            "Time to handle a request in milliseconds, from the decoded request to the "
            "encoded response (Kafka's TotalTimeMs).", labels=["request"])
        for name, (buckets, sum_ms, _) in sorted(s.latency.items()):
            cumulative, total = [], 0
            for bound, n in zip([*map(repr, LATENCY_BUCKETS_MS), "+Inf"], buckets,
                                strict=True):
                total += n
                cumulative.append((bound, total))
            hist.add_metric([name], cumulative, sum_ms)
        yield hist
        yield from _replica_gauges(s)
        acks = CounterMetricFamily("kafka_server_sharegroupmetrics_recordacknowledgements",
                                   "Share-group records acknowledged, per type (Kafka's "
                                   "ShareGroupMetrics RecordAcknowledgementsPerSec).",
                                   labels=["ackType"])
        for kind, n in sorted(s.record_acks.items()):
            acks.add_metric([kind], n)
        yield acks
        yield _gauge("kafka_controller_kafkacontroller_activecontrollercount",
                     "1 on the active controller, else 0.", s.active_controller)
        yield _gauge("kafka_controller_kafkacontroller_offlinepartitionscount",
                     "Partitions without a live leader (on the active controller; a single "
                     "node: partitions whose log cannot be opened).", s.offline_partitions)
        lag = GaugeMetricFamily("kafka_consumergroup_lag",
                                "High watermark minus the group's committed offset (for "
                                "partitions hosted by the group's coordinator).",
                                labels=["consumergroup", "topic", "partition"])
        current = GaugeMetricFamily("kafka_consumergroup_current_offset",
                                    "The group's committed offset.",
                                    labels=["consumergroup", "topic", "partition"])
        for (group, topic, index), (offset, behind) in sorted(s.group_offsets.items()):
            lag.add_metric([group, topic, str(index)], behind)
            current.add_metric([group, topic, str(index)], offset)
        yield lag
        yield current
        purgatory = GaugeMetricFamily("kafka_server_delayedoperationpurgatory_purgatorysize",
                                      "Requests waiting in a purgatory (Produce: acks=all "
                                      "waiting for replication; Fetch: long polls).",
                                      labels=["delayedOperation"])
        for op, n in sorted(s.purgatory.items()):
            purgatory.add_metric([op], n)
        yield purgatory
        conns = GaugeMetricFamily("kafka_server_socketservermetrics_connection_count",
                                  "Open client connections, per listener.",
                                  labels=["listener"])
        for listener, n in sorted(s.connections.items()):
            conns.add_metric([listener], n)
        yield conns


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _topic_counters(s: Snapshot) -> Iterator[Metric]:
    for name, doc, values in (
        ("kafka_server_brokertopicmetrics_totalsharefetchrequests", "ShareFetch requests "
         "reading the topic (Kafka's TotalShareFetchRequestsPerSec).", s.share_fetches),
        ("kafka_server_brokertopicmetrics_failedsharefetchrequests", "ShareFetch requests "
         "with an error for a partition of the topic (Kafka's "
         "FailedShareFetchRequestsPerSec).", s.share_fetches_failed),
        ("kafka_server_brokertopicmetrics_totalshareacknowledgementrequests",
         "Acknowledgements of the topic's records (Kafka's "
         "TotalShareAcknowledgementRequestsPerSec).", s.share_acks),
        ("kafka_server_brokertopicmetrics_failedshareacknowledgementrequests",
         "Acknowledgements of the topic's records that failed (Kafka's "
         "FailedShareAcknowledgementRequestsPerSec).", s.share_acks_failed),
        ("kafka_server_brokertopicmetrics_bytesin", "Record bytes appended by clients' "
         "Produce requests (Kafka's BytesInPerSec).", s.bytes_in),
        ("kafka_server_brokertopicmetrics_messagesin", "Records appended by clients' "
         "Produce requests (Kafka's MessagesInPerSec).", s.messages_in),
        ("kafka_server_brokertopicmetrics_bytesout", "Record bytes sent in consumers' Fetch "
         "responses (Kafka's BytesOutPerSec; replication not included).", s.bytes_out),
        ("kafka_server_brokertopicmetrics_messagesout", "Records sent in consumers' Fetch "
         "responses while /metrics is served, from the batch headers (headrace's; Kafka "
         "counts only MessagesIn).",
         s.messages_out),
    ):
        family = CounterMetricFamily(name, doc, labels=["topic"])
        for topic, n in sorted(values.items()):
            family.add_metric([topic], n)
        yield family


def _replica_gauges(s: Snapshot) -> Iterator[Metric]:
    led = [g for g in s.partitions if g.leading]
    yield _gauge("kafka_server_replicamanager_partitioncount",
                 "Partitions hosted by this broker.", len(s.partitions))
    yield _gauge("kafka_server_replicamanager_leadercount",
                 "Partitions led by this broker.", len(led))
    yield _gauge("kafka_server_replicamanager_underreplicatedpartitions",
                 "Partitions led here whose ISR is smaller than their replica set.",
                 sum(1 for g in led if g.isr < g.replicas))
    yield _gauge("kafka_server_replicamanager_underminisrpartitioncount",
                 "Partitions led here with fewer in-sync replicas than min.insync.replicas.",
                 sum(1 for g in led if g.isr < g.min_isr))
    yield CounterMetricFamily("kafka_server_replicamanager_isrshrinks",
                              "ISR shrinks of partitions led here (Kafka's "
                              "IsrShrinksPerSec).", value=s.isr_shrinks)
    yield CounterMetricFamily("kafka_server_replicamanager_isrexpands",
                              "ISR expansions of partitions led here (Kafka's "
                              "IsrExpandsPerSec).", value=s.isr_expands)
    families = {
        "size": GaugeMetricFamily("kafka_log_log_size", "Bytes of a partition's log "
                                  "segments (Kafka's Log Size).",
                                  labels=["topic", "partition"]),
        "start": GaugeMetricFamily("kafka_log_log_logstartoffset",
                                   "A partition's log start offset.",
                                   labels=["topic", "partition"]),
        "end": GaugeMetricFamily("kafka_log_log_logendoffset",
                                 "A partition's log end offset.",
                                 labels=["topic", "partition"]),
    }
    for g in sorted(s.partitions, key=lambda g: (g.topic, g.partition)):
        if g.size_bytes < 0:
            continue  # offline: nothing is known
        labels = [g.topic, str(g.partition)]
        families["size"].add_metric(labels, g.size_bytes)
        families["start"].add_metric(labels, g.log_start_offset)
        families["end"].add_metric(labels, g.log_end_offset)
    yield from families.values()
