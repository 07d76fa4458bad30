"""headrace into Spark: read throughput against a Parquet ceiling, and produce → table latency.

    .venv/bin/pip install -e '.[spark,bench]'
    .venv/bin/python bench/spark_bench.py [--rows 1000000] [--reps 3] [--quick]

One run, one local[2] SparkSession, one headrace broker subprocess (fresh temp data dir):

1. produce ``--rows`` records (100-byte random values, no key) round-robin into a 2-partition
   topic, and write the same values to 2 Parquet files (one per partition, the source's schema);
2. throughput, ``--reps`` times each, alternating: ``spark.read.format("headrace")`` → noop
   sink; the same from a streaming query with ``trigger(availableNow=True)``; the Parquet
   files through the same kind of streaming query (Spark's own fixed cost of a query); and
   ``spark.read.parquet`` of the same rows → noop sink (the ceiling: Spark's vectorised reader);
3. latency: a streaming query from a fresh topic into the exactly-once warehouse table
   (``headrace.spark.warehouse``, foreachBatch) while a producer sends ``--latency-rate``
   records/s for ``--latency-seconds``; each value carries its ``time.time()`` at
   ``produce()``; a row's latency is the time its batch's directory was renamed into the table
   (it becomes visible) minus that stamp.

Markdown tables go to stdout, progress to stderr. See bench/README.md ("Spark").
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from harness.brokers import BrokerProcess, start_broker

from headrace.spark import kafka_io, local_session, warehouse

VALUE_SIZE = 100


def note(msg: str) -> None:
    print(f"[spark-bench] {msg}", file=sys.stderr, flush=True)


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


class Meter:
    """Wall time, broker CPU and whole-machine CPU over one phase."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker

    def __enter__(self) -> Meter:
        self.t0 = time.monotonic()
        self.b0 = self.broker.cpu_seconds() or 0.0
        self.m0 = machine_busy()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.t0
        self.broker_cpu = ((self.broker.cpu_seconds() or 0.0) - self.b0) / self.seconds
        m1 = machine_busy()
        cores = os.cpu_count() or 1
        self.machine_cpu = (m1[0] - self.m0[0]) / max(m1[1] - self.m0[1], 1.0) * cores


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 262144,
                     "batch.num.messages": 10000, "compression.type": "none",
                     "enable.idempotence": False, "acks": "1"})


def produce_bulk(bootstrap: str, topic: str, values: list[bytes], partitions: int) -> float:
    p = producer(bootstrap)
    t0 = time.monotonic()
    for i, v in enumerate(values):
        while True:
            try:
                p.produce(topic, value=v, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(60):
        raise RuntimeError("records not delivered within 60 s")
    return time.monotonic() - t0


def write_parquet(directory: Path, topic: str, values: list[bytes], partitions: int) -> None:
    """The same rows as the source yields, one file per partition."""
    directory.mkdir(parents=True)
    schema = kafka_io.arrow_schema(False)
    now_us = int(time.time() * 1e6)
    for part in range(partitions):
        vals = values[part::partitions]
        n = len(vals)
        table = pa.Table.from_arrays([
            pa.nulls(n, pa.binary()), pa.array(vals, pa.binary()),
            pa.array([topic] * n, pa.string()), pa.array([part] * n, pa.int32()),
            pa.array(range(n), pa.int64()), pa.array([now_us] * n, schema.field(5).type),
            pa.array([0] * n, pa.int32()),
        ], schema=schema)
        pq.write_table(table, directory / f"part-{part}.parquet")


def timed_rows(meter: Meter, action: Callable[[], int]) -> tuple[int, Meter]:
    with meter:
        rows = action()
    return rows, meter


def run_throughput(spark: Any, broker: BrokerProcess, args: argparse.Namespace,
                   work: Path) -> list[dict[str, Any]]:
    bootstrap = broker.bootstrap
    topic = "spark-bench-tput"
    create_topic(bootstrap, topic, args.partitions)
    values = [os.urandom(VALUE_SIZE) for _ in range(args.rows)]
    secs = produce_bulk(bootstrap, topic, values, args.partitions)
    note(f"produced {args.rows:,} records in {secs:.1f} s")
    parquet_dir = work / "parquet"
    write_parquet(parquet_dir, topic, values, args.partitions)
    del values

    def headrace_batch(reader: str = "wire") -> int:
        df = (spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("reader", reader).load())
        df.write.format("noop").mode("overwrite").save()
        return int(args.rows)

    run_no = [0]

    def headrace_stream() -> int:
        run_no[0] += 1
        df = (spark.readStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("commitOffsetsToGroup", "false").load())
        q = (df.writeStream.format("noop").trigger(availableNow=True)
             .option("checkpointLocation", str(work / f"ckpt-tput-{run_no[0]}")).start())
        q.awaitTermination(120)
        rows = sum(int(p["numInputRows"]) for p in q.recentProgress)
        q.stop()
        return rows

    def parquet() -> int:
        spark.read.parquet(str(parquet_dir)).write.format("noop").mode("overwrite").save()
        return int(args.rows)

    parquet_schema = spark.read.parquet(str(parquet_dir)).schema

    def parquet_stream() -> int:
        # Spark's own streaming of the same files: the fixed cost of a query (start, offset
        # and commit logs, the check for more) with a JVM source, beside the headrace one's
        run_no[0] += 1
        q = (spark.readStream.schema(parquet_schema).parquet(str(parquet_dir))
             .writeStream.format("noop").trigger(availableNow=True)
             .option("checkpointLocation", str(work / f"ckpt-pq-{run_no[0]}")).start())
        q.awaitTermination(120)
        rows = sum(int(p["numInputRows"]) for p in q.recentProgress)
        q.stop()
        return rows

    cases: list[tuple[str, Callable[[], int]]] = [
        ("headrace → noop (batch read)", headrace_batch),
        ("headrace → noop (batch read, reader=confluent)", lambda: headrace_batch("confluent")),
        ("headrace → noop (stream, availableNow)", headrace_stream),
        ("Parquet → noop (stream, availableNow)", parquet_stream),
        ("Parquet → noop (ceiling)", parquet),
    ]
    # Warm-up: JVM, Python workers, the first job (not measured).
    headrace_batch()
    headrace_batch("confluent")
    parquet()
    parquet_stream()
    results: dict[str, list[tuple[float, Meter]]] = {name: [] for name, _ in cases}
    for rep in range(args.reps):
        for name, action in cases:
            rows, m = timed_rows(Meter(broker), action)
            if rows != args.rows:
                raise RuntimeError(f"{name}: read {rows} rows, expected {args.rows}")
            results[name].append((rows / m.seconds, m))
            note(f"rep {rep + 1}: {name}: {rows / m.seconds:,.0f} rows/s "
                 f"({m.seconds:.2f} s, broker CPU {m.broker_cpu:.0%})")
    ceiling = statistics.median(r for r, _ in results["Parquet → noop (ceiling)"])
    out = []
    for name, _ in cases:
        rates = [r for r, _ in results[name]]
        meters = [m for _, m in results[name]]
        out.append({
            "case": name, "median": statistics.median(rates), "min": min(rates),
            "max": max(rates), "of_ceiling": statistics.median(rates) / ceiling,
            "broker_cpu": statistics.median(m.broker_cpu for m in meters),
            "machine_cpu": statistics.median(m.machine_cpu for m in meters),
        })
    return out


def run_latency(spark: Any, broker: BrokerProcess, args: argparse.Namespace,
                work: Path) -> dict[str, Any]:
    bootstrap = broker.bootstrap
    topic = "spark-bench-latency"
    create_topic(bootstrap, topic, args.partitions)
    table = work / "warehouse"
    visible: dict[int, float] = {}

    def sink(df: Any, batch_id: int) -> None:
        if warehouse.write_batch(df.select("partition", "offset", "value"), batch_id, table):
            visible[batch_id] = time.time()

    df = (spark.readStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", topic).option("startingOffsets", "earliest").load())
    q = (df.writeStream.foreachBatch(sink)
         .option("checkpointLocation", str(work / "ckpt-latency")).start())
    p = producer(bootstrap)
    pad = b"\0" * (VALUE_SIZE - 9)
    try:
        # Warm-up records (flag byte 0) until one is in the table: set-up is not measured.
        deadline = time.monotonic() + 60
        while not visible:
            p.produce(topic, value=struct.pack(">Bd", 0, time.time()) + pad)
            p.poll(0)
            time.sleep(0.2)
            if time.monotonic() > deadline or q.exception() is not None:
                raise RuntimeError(f"the streaming query shows no output: {q.exception()}")
        sent = 0
        t0 = time.monotonic()
        total = int(args.latency_rate * args.latency_seconds)
        while sent < total:
            due = t0 + sent / args.latency_rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            p.produce(topic, value=struct.pack(">Bd", 1, time.time()) + pad)
            p.poll(0)
            sent += 1
        kept = sent / (time.monotonic() - t0)
        p.flush(30)
        note(f"latency: sent {sent} at {kept:.0f}/s; waiting for the table")

        def seen() -> int:
            if not any(table.glob("batch_id=*")):
                return 0
            t = pq.read_table(table, columns=["value"])
            return sum(1 for v in t.column("value").to_pylist() if v[0] == 1)

        deadline = time.monotonic() + 60
        while seen() < sent:
            if time.monotonic() > deadline or q.exception() is not None:
                raise RuntimeError(f"only {seen()} of {sent} rows reached the table "
                                   f"({q.exception()})")
            time.sleep(0.5)
        batches = len(visible)
    finally:
        q.stop()
    t = pq.read_table(table, columns=["value", "batch_id"]).to_pydict()
    lat_ms = sorted(
        (visible[int(b)] - struct.unpack(">Bd", v[:9])[1]) * 1000
        for v, b in zip(t["value"], t["batch_id"], strict=True) if v[0] == 1
    )
    dupes = len(lat_ms) - sent
    return {"rate": args.latency_rate, "seconds": args.latency_seconds, "kept": kept,
            "sent": sent, "rows": len(lat_ms), "duplicates": dupes, "batches": batches,
            "p50": pct(lat_ms, 50), "p99": pct(lat_ms, 99), "max": lat_ms[-1]}


def pct(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    rank = max(1, -(-len(sorted_values) * p // 100))
    return sorted_values[int(rank) - 1]


def markdown(tput: list[dict[str, Any]], lat: dict[str, Any] | None,
             args: argparse.Namespace) -> str:
    lines = [
        f"### headrace → Spark: {args.rows:,} records x {VALUE_SIZE} B, {args.partitions} "
        f"partitions, local[2], {args.reps} runs each",
        "",
        "| read | rows/s (median) | min - max | ÷ Parquet | broker CPU | machine CPU |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in tput:
        lines.append(
            f"| {r['case']} | {r['median']:,.0f} | {r['min']:,.0f} - {r['max']:,.0f} | "
            f"{r['of_ceiling']:.0%} | {r['broker_cpu']:.0%} | {r['machine_cpu']:.0%} |"
        )
    if lat is not None:
        lines += [
            "",
            "### produce → warehouse table latency (streaming, default trigger)",
            "",
            "| rate | sent | rows in table | micro-batches | p50 ms | p99 ms | max ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| {lat['rate']}/s for {lat['seconds']:.0f} s (kept {lat['kept']:.0f}/s) | "
            f"{lat['sent']:,} | {lat['rows']:,} | {lat['batches']} | {lat['p50']:.0f} | "
            f"{lat['p99']:.0f} | {lat['max']:.0f} |",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--latency-rate", type=int, default=500)
    ap.add_argument("--latency-seconds", type=float, default=20.0)
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="200k rows, 2 runs, 5 s latency phase")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.reps, args.latency_seconds = 200_000, 2, 5.0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="spark-bench-") as tmp:
        work = Path(tmp)
        broker = start_broker("headrace", work)
        spark = None
        try:
            note(f"broker on {broker.bootstrap}; starting Spark")
            spark = local_session("headrace-spark-bench")
            tput = run_throughput(spark, broker, args, work)
            lat = None if args.no_latency else run_latency(spark, broker, args, work)
        finally:
            if spark is not None:
                spark.stop()
            broker.stop()
    print(markdown(tput, lat, args))
    note(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
