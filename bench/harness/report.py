"""Markdown tables and the JSON record of one run."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.machine import LimitResult
from harness.workloads import LatencyResult, ThroughputResult


@dataclass
class BrokerRun:
    """Everything measured against one broker."""

    name: str
    version: str
    throughput: list[ThroughputResult] = field(default_factory=list)
    latency: LatencyResult | None = None
    error: str | None = None  # the broker could not be started, or died during the run


@dataclass
class RunReport:
    environment: dict[str, Any]
    settings: dict[str, Any]
    limits: list[LimitResult]
    brokers: list[BrokerRun]


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} B"


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _cpu(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.0f}%"


def _workload_key(r: ThroughputResult) -> tuple[str, int, int, str]:
    return (r.op, r.record_size, r.partitions, r.acks)


def throughput_table(brokers: Sequence[BrokerRun]) -> str:
    runs = [b for b in brokers if b.throughput]
    if not runs:
        return ""
    keys: list[tuple[str, int, int, str]] = []
    for b in runs:
        for r in b.throughput:
            if _workload_key(r) not in keys:
                keys.append(_workload_key(r))
    header = ["workload", "record", "partitions", "acks"]
    for b in runs:
        header += [f"{b.name} records/s", f"{b.name} MB/s", f"{b.name} CPU"]
    if len(runs) == 2:
        header.append(f"{runs[0].name} ÷ {runs[1].name}")
    lines = [_row(header), _row(["---"] * 4 + ["---:"] * (len(header) - 4))]
    notes: list[str] = []
    for key in keys:
        op, size, partitions, acks = key
        row = [op, _size(size), str(partitions), acks]
        rates: list[float | None] = []
        for b in runs:
            found = next((r for r in b.throughput if _workload_key(r) == key), None)
            if found is None:
                row += ["—", "—", "—"]
                rates.append(None)
                continue
            r = found
            if r.records == 0 and r.error:
                row += ["error", "—", "—"]
                notes.append(f"{b.name} {op} {_size(size)} {partitions}p acks={acks}: {r.error}")
                rates.append(None)
                continue
            mark = ""
            if r.capped or r.failed:
                mark = "*"
                why = f"{r.records:,} of {r.target:,} records in {r.seconds:.1f} s"
                if r.failed:
                    why += f", {r.failed:,} failed ({r.error})"
                notes.append(f"{b.name} {op} {_size(size)} {partitions}p acks={acks}: {why}")
            cpu = _cpu(r.broker_cpu)
            if r.client_cpu is not None:
                cpu += f" (client {_cpu(r.client_cpu)})"
            row += [_num(r.records_per_s) + mark, _num(r.mb_per_s), cpu]
            rates.append(r.records_per_s)
        if len(runs) == 2:
            a, t = rates
            row.append(f"{a / t:.2f}" if a and t else "—")
        lines.append(_row(row))
    if notes:
        lines.append("")
        lines += [f"- \\* {n}" for n in notes]
    return "\n".join(lines)


def latency_table(brokers: Sequence[BrokerRun]) -> str:
    header = ["broker", "rate (records/s)", "record", "acks", "fetch wait", "sent", "received",
              "p50 ms", "p99 ms", "p99.9 ms", "max ms"]
    lines = [_row(header), _row(["---"] * 5 + ["---:"] * (len(header) - 5))]
    notes: list[str] = []
    for b in brokers:
        r = b.latency
        if r is None:
            continue
        lines.append(_row([
            b.name, f"{r.rate:,} for {r.duration_s:g} s (got {r.achieved_rate:,.0f})",
            _size(r.record_size), r.acks, f"{r.fetch_wait_ms} ms", f"{r.sent:,}",
            f"{r.received:,}",
            _ms(r.p50_ms), _ms(r.p99_ms), _ms(r.p999_ms), _ms(r.max_ms),
        ]))
        if r.error:
            notes.append(f"{b.name}: {r.error}")
    if notes:
        lines.append("")
        lines += [f"- \\* {n}" for n in notes]
    return "\n".join(lines)


def limits_table(limits: Sequence[LimitResult]) -> str:
    lines = [_row(["machine limit", "MB/s", "how"]), _row(["---", "---:", "---"])]
    for r in limits:
        value = "error" if r.error else _num(r.mb_per_s)
        lines.append(_row([r.name, value, r.error or r.detail]))
    return "\n".join(lines)


def markdown(report: RunReport) -> str:
    env = report.environment
    parts = [
        "## headrace benchmark",
        "",
        ", ".join(f"{k}: {v}" for k, v in env.items()),
        "",
    ]
    failed = [b for b in report.brokers if b.error is not None]
    for b in failed:
        assert b.error is not None
        lines = b.error.strip().splitlines() or ["?"]
        why = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1].strip()}"
        parts += [f"**{b.name} failed:** {why} (full message on stderr)", ""]
    table = throughput_table(report.brokers)
    if table:
        parts += ["### Throughput", "", table, ""]
    if any(b.latency for b in report.brokers):
        parts += ["### End-to-end latency", "", latency_table(report.brokers), ""]
    parts += ["### Machine limits (same run)", "", limits_table(report.limits), ""]
    return "\n".join(parts)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def to_json(report: RunReport) -> dict[str, Any]:
    def encode(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            data = {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                    if f.name != "latencies_ms"}
            for prop in ("records_per_s", "mb_per_s"):
                if hasattr(obj, prop):
                    data[prop] = getattr(obj, prop)
            return data
        if isinstance(obj, list):
            return [encode(x) for x in obj]
        return obj

    result: dict[str, Any] = encode(report)
    return result


def write_json(report: RunReport, directory: Path, stamp: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"bench-{stamp}.json"
    path.write_text(json.dumps(to_json(report), indent=2) + "\n")
    return path
