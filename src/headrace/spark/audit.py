"""The audit (R-SPARK-4, seed 003): did every produced record arrive exactly once?

Producers tag every record with headers ``producer.host``, ``produce.time`` (ms since the
epoch) and ``event.id`` (unique per record), and publish to the ``__audit`` topic, per
(host, minute of produce time), the number of records the broker acknowledged: JSON
``{"host": ..., "minute": <epoch minute>, "topic": ..., "count": N}``, cumulative, so the
largest count for a window is the final one.

The audit job (Spark, batch) counts consumed records per window — rows of the warehouse's
landing table, or records read back from the topics — and compares:
``lost = produced - distinct event ids consumed`` (never below 0) and
``duplicated = rows consumed - distinct event ids consumed``; distinct ids beyond the
announced count are ``unannounced`` (acknowledged records whose producer was killed before
it published their count, say): reported, but not a failure, since no record arrived twice.
``compare`` is the pure part.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

AUDIT_TOPIC = "__audit"
HOST_HEADER = "producer.host"
TIME_HEADER = "produce.time"
ID_HEADER = "event.id"

Window = tuple[str, str, int]
"""(topic, producer host, epoch minute of produce time)."""


@dataclass(frozen=True)
class WindowReport:
    topic: str
    host: str
    minute: int
    produced: int
    consumed: int
    distinct: int
    lost: int
    duplicated: int
    unannounced: int = 0


@dataclass(frozen=True)
class AuditReport:
    windows: tuple[WindowReport, ...]

    @property
    def produced(self) -> int:
        return sum(w.produced for w in self.windows)

    @property
    def consumed(self) -> int:
        return sum(w.consumed for w in self.windows)

    @property
    def lost(self) -> int:
        return sum(w.lost for w in self.windows)

    @property
    def duplicated(self) -> int:
        return sum(w.duplicated for w in self.windows)

    @property
    def unannounced(self) -> int:
        return sum(w.unannounced for w in self.windows)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "produced": self.produced, "consumed": self.consumed, "lost": self.lost,
            "duplicated": self.duplicated, "unannounced": self.unannounced,
            "windows": [asdict(w) for w in self.windows],
        }


def compare(
    produced: Mapping[Window, int], consumed: Mapping[Window, tuple[int, int]]
) -> AuditReport:
    """``produced``: window -> acknowledged count; ``consumed``: window -> (rows, distinct ids).
    Distinct ids beyond a window's announced count (all of a window never announced) are
    ``unannounced``, not duplicates."""
    out = []
    for w in sorted(set(produced) | set(consumed)):
        p = produced.get(w, 0)
        rows, distinct = consumed.get(w, (0, 0))
        lost = max(0, p - distinct)
        out.append(WindowReport(w[0], w[1], w[2], p, rows, distinct, lost, rows - distinct,
                                max(0, distinct - p)))
    return AuditReport(tuple(out))


def format_report(report: AuditReport) -> str:
    lines = [f"{'topic':<12} {'host':<10} {'minute (UTC)':<17} {'produced':>9} "
             f"{'consumed':>9} {'lost':>6} {'dup':>6}"]
    import datetime as dt

    for w in report.windows:
        when = dt.datetime.fromtimestamp(w.minute * 60, dt.UTC).strftime("%Y-%m-%d %H:%M")
        lines.append(f"{w.topic:<12} {w.host:<10} {when:<17} {w.produced:>9} {w.consumed:>9} "
                     f"{w.lost:>6} {w.duplicated:>6}")
    verdict = "OK: no loss, no duplicates" if report.ok else "FAILED"
    lines.append(f"audit: produced {report.produced}, consumed {report.consumed}, "
                 f"lost {report.lost}, duplicated {report.duplicated} -> {verdict}")
    if report.unannounced:
        lines.append(f"audit: {report.unannounced} record(s) arrived once each beyond the "
                     "announced counts (acknowledged after their producer last published "
                     "its counts to __audit, e.g. before it was killed): not a failure")
    return "\n".join(lines)


# --- the Spark job -------------------------------------------------------------------------


def header_columns(df: Any) -> Any:
    """Add ``host``, ``produce_ms`` and ``event_id`` columns from a headrace DataFrame's
    ``headers`` (read with ``includeHeaders=true``)."""
    from pyspark.sql import functions as F

    def header(name: str) -> Any:
        found = F.filter(F.col("headers"), lambda h: h["key"] == F.lit(name))
        return F.element_at(found, 1)["value"].cast("string")

    return (df.withColumn("host", header(HOST_HEADER))
              .withColumn("produce_ms", header(TIME_HEADER).cast("long"))
              .withColumn("event_id", header(ID_HEADER)))


def run_audit(
    spark: Any, bootstrap: str, warehouse_table: Path | str | None = None,
    topics: tuple[str, ...] = ("activity", "sentences"),
) -> AuditReport:
    """Compare ``__audit``'s produced counts with what was consumed: the landing table's rows
    if ``warehouse_table`` is given, else the records read back from ``topics``."""
    from pyspark.sql import functions as F

    from headrace.spark import warehouse

    announced = (
        spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", AUDIT_TOPIC).option("startingOffsets", "earliest").load()
        .select(F.from_json(F.col("value").cast("string"),
                            "topic string, host string, minute long, count long").alias("a"))
        .groupBy("a.topic", "a.host", "a.minute").agg(F.max("a.count").alias("count"))
        .collect()
    )
    produced = {(r["topic"], r["host"], int(r["minute"])): int(r["count"]) for r in announced}

    if warehouse_table is not None:
        landed = warehouse.read_table(spark, warehouse_table)
    else:
        landed = header_columns(
            spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", ",".join(topics)).option("includeHeaders", "true").load()
        )
    consumed: dict[Window, tuple[int, int]] = {}
    if landed is not None:
        rows = (
            landed.where(F.col("host").isNotNull())
            .groupBy("topic", "host", (F.col("produce_ms") / 60000).cast("long").alias("minute"))
            .agg(F.count(F.lit(1)).alias("rows"),
                 F.count_distinct("event_id").alias("distinct"))
            .collect()
        )
        consumed = {(r["topic"], r["host"], int(r["minute"])): (int(r["rows"]),
                                                                 int(r["distinct"]))
                    for r in rows}
    return compare(produced, consumed)


def audit_record(topic: str, host: str, minute: int, count: int) -> bytes:
    return json.dumps({"topic": topic, "host": host, "minute": minute,
                       "count": count}).encode()
