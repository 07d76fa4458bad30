"""Throughput and latency of headrace and Tansu, side by side, with confluent-kafka.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/run.py [--broker headrace|tansu|both] [--quick] [--json]

Starts each broker as a subprocess on 127.0.0.1 (headrace on a fresh temp data dir, Tansu
with its in-memory storage engine), runs the same workloads against each, measures the
machine's disk and loopback limits in the same run, and prints Markdown tables.
See bench/README.md for what each column means.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import confluent_kafka
from harness import machine, workloads
from harness.brokers import (
    BROKER_NAMES,
    BrokerProcess,
    BrokerStartError,
    broker_version,
    start_broker,
)
from harness.report import BrokerRun, RunReport, markdown, write_json
from harness.workloads import ThroughputResult

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Plan:
    """How much work each phase does; ``--quick`` shrinks everything."""

    records_by_size: dict[int, int]  # record size in bytes -> records per produce phase
    partitions: tuple[int, ...]
    acks: tuple[str, ...]
    phase_seconds: float  # cap on each produce/consume phase
    latency_rate: int
    latency_seconds: float
    latency_record_size: int
    latency_acks: str
    latency_fetch_wait_ms: int
    disk_bytes: int
    loopback_bytes: int
    loadgen: str = "python"  # "c": bench/build/loadgen (bench/setup.sh builds it)

    @classmethod
    def full(cls) -> Plan:
        return cls({100: 1_000_000, 1024: 250_000}, (1, 8), ("1", "all"), 20.0,
                   2000, 10.0, 100, "1", 100, 512 << 20, 2 << 30)

    @classmethod
    def quick(cls) -> Plan:
        return cls({100: 100_000, 1024: 25_000}, (1, 8), ("1", "all"), 5.0,
                   2000, 3.0, 100, "1", 100, 64 << 20, 256 << 20)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_limits(plan: Plan, data_root: Path | None) -> list[machine.LimitResult]:
    limits: list[machine.LimitResult] = []
    for name in ("disk sequential write", "loopback TCP"):
        try:
            if name == "loopback TCP":
                result = machine.loopback_tcp(plan.loopback_bytes, plan.phase_seconds)
            else:
                result = machine.disk_write(data_root, plan.disk_bytes, plan.phase_seconds)
        except Exception as e:
            result = machine.LimitResult(name, 0, 0.0, "", error=_describe(e))
        log(f"[machine] {result.name}: {result.mb_per_s:,.0f} MB/s{_err(result.error)}")
        limits.append(result)
    return limits


def run_throughput(broker: BrokerProcess, plan: Plan) -> list[ThroughputResult]:
    """For each record size and partition count: produce with each acks, consume one topic."""
    results: list[ThroughputResult] = []
    bootstrap = broker.bootstrap
    for size, count in plan.records_by_size.items():
        for partitions in plan.partitions:
            topics: list[str] = []
            produced: dict[str, int] = {}
            if not broker.alive:
                return results  # run_broker reports the exit and the log
            for acks in plan.acks:
                topic = workloads.unique_topic(f"bench-{size}b-{partitions}p-acks{acks}")
                try:
                    workloads.create_topic(bootstrap, topic, partitions)
                    topics.append(topic)
                    produce = (workloads.produce_c if plan.loadgen == "c"
                               else workloads.produce)
                    r = produce(bootstrap, topic, partitions=partitions,
                                record_size=size, count=count, acks=acks,
                                max_seconds=plan.phase_seconds, cpu=broker.cpu_seconds)
                    produced[topic] = r.records
                except Exception as e:
                    r = ThroughputResult("produce", size, partitions, acks, count,
                                         error=_describe(e))
                _log_phase(broker.name, r)
                results.append(r)
            # Consume what the first acks setting wrote: consumption does not depend on acks.
            source = next((t for t in topics if produced.get(t)), None)
            if source is None:
                r = ThroughputResult("consume", size, partitions, "-", 0,
                                     error="nothing was produced to consume")
            else:
                try:
                    consume = (workloads.consume_c if plan.loadgen == "c"
                               else workloads.consume)
                    r = consume(bootstrap, source, partitions=partitions, record_size=size,
                                expected=produced[source], max_seconds=plan.phase_seconds,
                                cpu=broker.cpu_seconds)
                except Exception as e:
                    r = ThroughputResult("consume", size, partitions, "-", produced[source],
                                         error=_describe(e))
            _log_phase(broker.name, r)
            results.append(r)
            workloads.delete_topics(bootstrap, topics)
    return results


def run_latency(broker: BrokerProcess, plan: Plan) -> workloads.LatencyResult:
    topic = workloads.unique_topic("bench-latency")
    try:
        workloads.create_topic(broker.bootstrap, topic, 1)
        r = workloads.latency(broker.bootstrap, topic, rate=plan.latency_rate,
                              seconds=plan.latency_seconds,
                              record_size=plan.latency_record_size, acks=plan.latency_acks,
                              fetch_wait_ms=plan.latency_fetch_wait_ms)
    except Exception as e:
        r = workloads.LatencyResult(plan.latency_rate, plan.latency_seconds,
                                    plan.latency_record_size, plan.latency_acks,
                                    plan.latency_fetch_wait_ms, error=_describe(e))
    workloads.delete_topics(broker.bootstrap, [topic])
    log(f"[{broker.name}] latency at {r.rate}/s: p50 {_ms(r.p50_ms)} ms, p99 {_ms(r.p99_ms)} ms, "
        f"p99.9 {_ms(r.p999_ms)} ms ({r.received:,}/{r.sent:,} received){_err(r.error)}")
    return r


def run_broker(name: str, plan: Plan, data_root: Path | None) -> BrokerRun:
    run = BrokerRun(name, broker_version(name))
    log(f"[{name}] starting {run.version}")
    try:
        broker = start_broker(name, data_root)
    except (BrokerStartError, OSError) as e:
        run.error = str(e)
        log(f"[{name}] could not start: {e}")
        return run
    try:
        run.throughput = run_throughput(broker, plan)
        if broker.alive:
            run.latency = run_latency(broker, plan)
        if not broker.alive:
            run.error = (f"exited with code {broker.process.returncode} during the run; "
                         f"log ends:\n{broker.log_tail()}")
    finally:
        broker.stop()
    return run


def environment(plan: Plan) -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "confluent-kafka": importlib.metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "phase cap": f"{plan.phase_seconds:g} s",
        "load generator": ("C on librdkafka (bench/build/loadgen)" if plan.loadgen == "c"
                           else "Python confluent-kafka"),
    }


def _log_phase(broker: str, r: ThroughputResult) -> None:
    what = f"{r.op} {r.record_size} B {r.partitions}p acks={r.acks}"
    log(f"[{broker}] {what}: {r.records:,}/{r.target:,} records, "
        f"{r.records_per_s:,.0f} records/s, {r.mb_per_s:.1f} MB/s{_err(r.error)}")


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _err(error: str | None) -> str:
    return f" [{error}]" if error else ""


def _describe(e: BaseException) -> str:
    if os.environ.get("BENCH_TRACEBACK"):
        traceback.print_exception(e)
    return f"{type(e).__name__}: {e}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=[*BROKER_NAMES, "both"], default="both",
                        help="which broker(s) to run against (default: both)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run of well under a minute: 10x fewer records, 5 s caps")
    parser.add_argument("--json", action="store_true",
                        help="also write the results to bench/results/bench-<time>.json")
    parser.add_argument("--data-root", type=Path, default=None,
                        help="where headrace's temp data dir and the disk test go "
                             "(default: the system temp dir)")
    parser.add_argument("--phase-seconds", type=float, default=None,
                        help="cap on each produce/consume phase (default 20, quick 5)")
    parser.add_argument("--latency-rate", type=int, default=None,
                        help="records/s for the latency phase (default 2000)")
    parser.add_argument("--latency-seconds", type=float, default=None,
                        help="length of the latency phase (default 10, quick 3)")
    parser.add_argument("--fetch-wait-ms", type=int, default=None,
                        help="the latency consumer's fetch.wait.max.ms (default 100)")
    parser.add_argument("--loadgen", choices=["c", "python"], default=None,
                        help="throughput phases' client: the C load generator (default when "
                             "bash bench/setup.sh built it) or the Python producer/consumer")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply the record counts of the throughput phases")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = Plan.quick() if args.quick else Plan.full()
    overrides: dict[str, Any] = {
        "phase_seconds": args.phase_seconds, "latency_rate": args.latency_rate,
        "latency_seconds": args.latency_seconds, "latency_fetch_wait_ms": args.fetch_wait_ms,
        "loadgen": args.loadgen or ("c" if workloads.loadgen_available() else "python"),
        "records_by_size": {size: max(int(n * args.scale), 1)
                            for size, n in plan.records_by_size.items()},
    }
    plan = Plan(**{**plan.__dict__, **{k: v for k, v in overrides.items() if v is not None}})
    names = list(BROKER_NAMES) if args.broker == "both" else [args.broker]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    started = time.monotonic()

    limits = measure_limits(plan, args.data_root)
    runs = [run_broker(name, plan, args.data_root) for name in names]

    settings = {k: (dict(v) if isinstance(v, dict) else v) for k, v in plan.__dict__.items()}
    settings["producer"] = {k: v for k, v in workloads.PRODUCER_DEFAULTS.items()
                            if k != "logger"}
    report = RunReport(environment(plan), settings, limits, runs)
    print(markdown(report))
    log(f"total {time.monotonic() - started:.0f} s")
    if args.json:
        path = write_json(report, RESULTS_DIR, stamp)
        log(f"wrote {path}")
    return 0 if all(r.error is None for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
