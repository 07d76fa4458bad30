"""The workloads, run with confluent-kafka against any broker's bootstrap address.

- ``produce``: ``count`` records of ``record_size`` random bytes, spread round-robin over the
  topic's partitions, as fast as the Producer takes them. Throughput is the records confirmed
  by delivery callbacks divided by the time from the first ``produce()`` until ``flush()``
  returns.
- ``consume``: a Consumer ``assign()``s every partition at OFFSET_BEGINNING (no consumer group
  features needed) and reads until it has seen the expected number of records.
- ``latency``: a paced producer stamps ``time.monotonic_ns()`` into each value; a consumer in
  another thread computes now - stamp on receipt.

Every phase stops at a deadline, so a slow or broken broker cannot hang the run.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # NewTopic: not re-exported
    AdminClient,
    NewTopic,
)

from harness.brokers import QUIET_LOGGER

ADMIN_TIMEOUT_S = 15.0
FLUSH_GRACE_S = 5.0
MB = 1_000_000  # throughput is reported in decimal megabytes of record values

PRODUCER_DEFAULTS: dict[str, Any] = {
    "linger.ms": 5,
    "batch.size": 256 * 1024,
    "batch.num.messages": 10_000,
    "compression.type": "none",
    "enable.idempotence": False,
    "queue.buffering.max.messages": 200_000,
    "logger": QUIET_LOGGER,
}

CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": False,
    "auto.offset.reset": "earliest",
    # Once 100k records sit in the local queue librdkafka postpones the partition's next fetch
    # by this much (default 1000 ms), which would make a reading-back consumer measure that
    # pause instead of the broker.
    "fetch.queue.backoff.ms": 10,
    "logger": QUIET_LOGGER,
}

CpuProbe = Callable[[], float | None]


@dataclass
class ThroughputResult:
    """One produce or consume phase."""

    op: str  # "produce" | "consume"
    record_size: int
    partitions: int
    acks: str  # "1" | "all" for produce; "-" for consume
    target: int  # records asked for
    records: int = 0  # records delivered (produce) or received (consume)
    seconds: float = 0.0
    failed: int = 0  # delivery reports or consumer messages carrying an error
    capped: bool = False  # stopped by the phase deadline before reaching ``target``
    broker_cpu: float | None = None  # broker CPU seconds / wall seconds (1.0 = one core)
    client_cpu: float | None = None  # the load generator's own CPU (C load generator only)
    error: str | None = None  # the phase could not run at all

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.records_per_s * self.record_size / MB


@dataclass
class LatencyResult:
    """End-to-end latency at a fixed rate."""

    rate: int  # records per second asked for
    duration_s: float
    record_size: int
    acks: str
    # The consumer's fetch.wait.max.ms: a broker that answers a waiting fetch as soon as
    # records arrive is unaffected by it; one that does not adds up to this much latency.
    fetch_wait_ms: int
    sent: int = 0  # records confirmed by delivery callbacks
    received: int = 0
    failed: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    max_ms: float | None = None
    achieved_rate: float = 0.0  # records per second actually produced
    error: str | None = None
    latencies_ms: list[float] = field(default_factory=list, repr=False)


# -- topics -------------------------------------------------------------------------------------


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Create ``name`` and wait until every partition has a leader in the metadata."""
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=QUIET_LOGGER)
    futures = admin.create_topics([NewTopic(name, partitions, 1)],
                                  operation_timeout=ADMIN_TIMEOUT_S,
                                  request_timeout=ADMIN_TIMEOUT_S)
    futures[name].result(timeout=ADMIN_TIMEOUT_S)
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=5.0).topics.get(name)
        if (topic is not None and topic.error is None and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {name} has no leader for all {partitions} partitions")


def delete_topics(bootstrap: str, names: Sequence[str]) -> None:
    """Best effort: free the broker's memory/disk between workloads."""
    if not names:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=QUIET_LOGGER)
    try:
        futures = admin.delete_topics(list(names), operation_timeout=ADMIN_TIMEOUT_S,
                                      request_timeout=ADMIN_TIMEOUT_S)
        for future in futures.values():
            future.result(timeout=ADMIN_TIMEOUT_S)
    except Exception:  # DeleteTopics missing or failing must not spoil the run
        pass


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- produce ------------------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, *, partitions: int, record_size: int, count: int,
            acks: str, max_seconds: float, cpu: CpuProbe) -> ThroughputResult:
    result = ThroughputResult("produce", record_size, partitions, acks, count)
    failed_reasons: list[str] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            result.records += 1
        else:
            result.failed += 1
            if len(failed_reasons) < 3:
                failed_reasons.append(str(err))

    producer = Producer({**PRODUCER_DEFAULTS, "bootstrap.servers": bootstrap, "acks": acks})
    producer.list_topics(topic, timeout=ADMIN_TIMEOUT_S)  # connect before the clock starts
    payload = os.urandom(record_size)
    cpu_start = cpu()
    start = time.perf_counter()
    stop_at = start + max_seconds
    sent = 0
    while sent < count:
        try:
            producer.produce(topic, payload, partition=sent % partitions, on_delivery=on_delivery)
        except BufferError:  # local queue full: let librdkafka drain it
            producer.poll(0.005)
            if time.perf_counter() > stop_at:
                break
            continue
        sent += 1
        if sent % 1000 == 0:
            producer.poll(0)
            if time.perf_counter() > stop_at:
                break
    flush_for = max(stop_at - time.perf_counter(), 0.0) + FLUSH_GRACE_S
    remaining = producer.flush(flush_for)
    result.seconds = time.perf_counter() - start
    result.broker_cpu = _cpu_share(cpu_start, cpu(), result.seconds)
    if remaining:
        producer.purge()
        producer.flush(1.0)
    result.capped = result.records < count
    if failed_reasons:
        result.error = "; ".join(failed_reasons)
    return result


# -- consume ------------------------------------------------------------------------------------


def consume(bootstrap: str, topic: str, *, partitions: int, record_size: int, expected: int,
            max_seconds: float, cpu: CpuProbe) -> ThroughputResult:
    result = ThroughputResult("consume", record_size, partitions, "-", expected)
    consumer = Consumer({**CONSUMER_DEFAULTS, "bootstrap.servers": bootstrap,
                         "group.id": unique_topic("bench")})
    try:
        # Connect and learn the leaders before the clock starts, as for the producer; without
        # this librdkafka spends ~0.5 s on start-up that a short phase would count.
        consumer.list_topics(topic, timeout=ADMIN_TIMEOUT_S)
        cpu_start = cpu()
        start = time.perf_counter()
        stop_at = start + max_seconds
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        received = 0
        while received < expected and time.perf_counter() < stop_at:
            # consume(n, timeout) waits until it has n records or the timeout is over, so
            # take what is already queued, and block (for one record) only when nothing is.
            batch = consumer.consume(num_messages=10_000, timeout=0)
            if not batch:
                batch = consumer.consume(num_messages=1, timeout=0.1)
            for msg in batch:
                if msg.error() is None:
                    received += 1
                else:
                    result.failed += 1
                    result.error = str(msg.error())
        result.seconds = time.perf_counter() - start
        result.broker_cpu = _cpu_share(cpu_start, cpu(), result.seconds)
        result.records = received
        result.capped = received < expected
    finally:
        consumer.close()
    return result


# -- the C load generator (bench/loadgen.c) -------------------------------------------------------

LOADGEN = Path(__file__).resolve().parent.parent / "build" / "loadgen"


def loadgen_available() -> bool:
    return LOADGEN.is_file() and os.access(LOADGEN, os.X_OK)


def _x_args(conf: dict[str, Any]) -> list[str]:
    """librdkafka properties as ``-X key=value`` (Python-only settings left out)."""
    out: list[str] = []
    for k, v in conf.items():
        if k == "logger" or callable(v):
            continue
        out += ["-X", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    return out


def _run_loadgen(args: list[str], max_seconds: float) -> dict[str, Any]:
    out = subprocess.run([str(LOADGEN), *args, "-T", str(max_seconds + FLUSH_GRACE_S)],
                         capture_output=True, text=True, timeout=max_seconds + 60)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"loadgen exited {out.returncode}: {out.stderr.strip()[-300:]}")
    return dict(json.loads(lines[-1]))


def produce_c(bootstrap: str, topic: str, *, partitions: int, record_size: int, count: int,
              acks: str, max_seconds: float, cpu: CpuProbe) -> ThroughputResult:
    """``produce`` with the C load generator: the same settings, no Python in the loop."""
    result = ThroughputResult("produce", record_size, partitions, acks, count)
    conf = {**PRODUCER_DEFAULTS, "acks": acks}
    cpu_start = cpu()
    start = time.perf_counter()
    r = _run_loadgen(["-P", "-b", bootstrap, "-t", topic, "-p", str(partitions),
                      "-s", str(record_size), "-n", str(count), *_x_args(conf)], max_seconds)
    wall = time.perf_counter() - start
    result.records = int(r["delivered"])
    result.failed = int(r["failed"])
    result.seconds = float(r["seconds"])
    result.broker_cpu = _cpu_share(cpu_start, cpu(), wall)
    result.client_cpu = float(r["client_cpu"])
    result.capped = result.records < count
    return result


def consume_c(bootstrap: str, topic: str, *, partitions: int, record_size: int, expected: int,
              max_seconds: float, cpu: CpuProbe) -> ThroughputResult:
    """``consume`` with the C load generator (timed from the first record)."""
    result = ThroughputResult("consume", record_size, partitions, "-", expected)
    cpu_start = cpu()
    start = time.perf_counter()
    r = _run_loadgen(["-C", "-b", bootstrap, "-t", topic, "-p", str(partitions),
                      "-n", str(expected), *_x_args(CONSUMER_DEFAULTS)], max_seconds)
    wall = time.perf_counter() - start
    result.records = int(r["records"])
    result.failed = int(r["errors"])
    result.seconds = float(r["seconds"])
    result.broker_cpu = _cpu_share(cpu_start, cpu(), wall)
    result.client_cpu = float(r["client_cpu"])
    result.capped = result.records < expected
    return result


# -- latency ------------------------------------------------------------------------------------

_STAMP = struct.Struct(">qq")  # sequence number (-1 = warm-up), send time in monotonic ns


def latency(bootstrap: str, topic: str, *, rate: int, seconds: float, record_size: int,
            acks: str, fetch_wait_ms: int) -> LatencyResult:
    result = LatencyResult(rate, seconds, record_size, acks, fetch_wait_ms)
    padding = os.urandom(max(record_size - _STAMP.size, 0))
    latencies_ns: list[int] = []
    ready = threading.Event()
    stop = threading.Event()
    consumer_error: list[str] = []

    def consume_loop() -> None:
        consumer = Consumer({**CONSUMER_DEFAULTS, "bootstrap.servers": bootstrap,
                             "group.id": unique_topic("bench-latency"),
                             "fetch.wait.max.ms": fetch_wait_ms})
        try:
            consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            while not stop.is_set():
                # poll(), not consume(n): consume waits for n records or its timeout.
                msg = consumer.poll(0.05)
                if msg is None:
                    continue
                now = time.monotonic_ns()
                if msg.error() is not None:
                    consumer_error[:] = [str(msg.error())]
                    continue
                seq, stamp = _STAMP.unpack_from(msg.value() or b"")
                if seq < 0:
                    ready.set()
                else:
                    latencies_ns.append(now - stamp)
        except Exception as e:
            consumer_error[:] = [repr(e)]
        finally:
            consumer.close()

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            result.sent += 1
        else:
            result.failed += 1

    thread = threading.Thread(target=consume_loop, name="latency-consumer", daemon=True)
    thread.start()
    producer = Producer({**PRODUCER_DEFAULTS, "bootstrap.servers": bootstrap, "acks": acks})
    try:
        # Warm up until the consumer sees records, so connection set-up is not measured.
        warmup_deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while not ready.is_set() and time.monotonic() < warmup_deadline:
            producer.produce(topic, _STAMP.pack(-1, 0) + padding, partition=0)
            producer.flush(1.0)
            ready.wait(0.2)
        if not ready.is_set():
            result.error = "the consumer never received a warm-up record"
            return result

        total = int(rate * seconds)
        start = time.monotonic()
        for seq in range(total):
            delay = start + seq / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            value = _STAMP.pack(seq, time.monotonic_ns()) + padding
            producer.produce(topic, value, partition=0, on_delivery=on_delivery)
            producer.poll(0)
        producer.flush(FLUSH_GRACE_S)
        result.achieved_rate = total / (time.monotonic() - start)
        drain_deadline = time.monotonic() + FLUSH_GRACE_S
        while len(latencies_ns) < result.sent and time.monotonic() < drain_deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(ADMIN_TIMEOUT_S)
        producer.purge()
        producer.flush(1.0)

    result.received = len(latencies_ns)
    result.latencies_ms = sorted(ns / 1e6 for ns in latencies_ns)
    if result.latencies_ms:
        result.p50_ms = percentile(result.latencies_ms, 0.50)
        result.p99_ms = percentile(result.latencies_ms, 0.99)
        result.p999_ms = percentile(result.latencies_ms, 0.999)
        result.max_ms = result.latencies_ms[-1]
    if consumer_error:
        result.error = consumer_error[0]
    return result


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(math.ceil(q * len(sorted_values)), 1)
    return sorted_values[rank - 1]


MIN_CPU_WALL_S = 0.5  # /proc counts CPU in clock ticks (10 ms): shorter phases say little


def _cpu_share(before: float | None, after: float | None, wall: float) -> float | None:
    if before is None or after is None or wall < MIN_CPU_WALL_S:
        return None
    return (after - before) / wall
