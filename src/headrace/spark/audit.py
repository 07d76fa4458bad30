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
# the demo's input topics (names of its own: other examples' topics, such as the word-count
# example's ``sentences``, are not the demo's)
DEMO_TOPICS = ("headrace-demo-activity", "headrace-demo-sentences")
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
    # records the audit did not count because the demo's producers did not write them:
    # records in the topics without the audit headers, entries in __audit not in its format
    skipped: int = 0
    skipped_announcements: int = 0

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
            "skipped": self.skipped, "skipped_announcements": self.skipped_announcements,
            "windows": [asdict(w) for w in self.windows],
        }


def compare(
    produced: Mapping[Window, int], consumed: Mapping[Window, tuple[int, int]],
    skipped: int = 0, skipped_announcements: int = 0,
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
    return AuditReport(tuple(out), skipped, skipped_announcements)


def format_report(report: AuditReport) -> str:
    width = max([12, *(len(w.topic) for w in report.windows)])
    lines = [f"{'topic':<{width}} {'host':<10} {'minute (UTC)':<17} {'produced':>9} "
             f"{'consumed':>9} {'lost':>6} {'dup':>6}"]
    import datetime as dt

    for w in report.windows:
        when = dt.datetime.fromtimestamp(w.minute * 60, dt.UTC).strftime("%Y-%m-%d %H:%M")
        lines.append(f"{w.topic:<{width}} {w.host:<10} {when:<17} {w.produced:>9} {w.consumed:>9} "
                     f"{w.lost:>6} {w.duplicated:>6}")
    verdict = "OK: no loss, no duplicates" if report.ok else "FAILED"
    lines.append(f"audit: produced {report.produced}, consumed {report.consumed}, "
                 f"lost {report.lost}, duplicated {report.duplicated} -> {verdict}")
    if report.unannounced:
        lines.append(f"audit: {report.unannounced} record(s) arrived once each beyond the "
                     "announced counts (acknowledged after their producer last published "
                     "its counts to __audit, e.g. before it was killed): not a failure")
    if report.skipped:
        lines.append(f"audit: skipped {report.skipped} record(s) without the demo's headers "
                     f"({HOST_HEADER}, {TIME_HEADER}, {ID_HEADER}): written by something other "
                     "than the demo's producers, so not counted")
    if report.skipped_announcements:
        lines.append(f"audit: skipped {report.skipped_announcements} record(s) in "
                     f"{AUDIT_TOPIC} that are not produced counts in the demo's format")
    return "\n".join(lines)


# --- the Spark job -------------------------------------------------------------------------


def header_columns(df: Any) -> Any:
    """Add ``host``, ``produce_ms`` and ``event_id`` columns from a headrace DataFrame's
    ``headers`` (read with ``includeHeaders=true``)."""
    from pyspark.sql import functions as F

    def header(name: str) -> Any:
        # try_element_at: a record without the header (not the demo's) gets null, where
        # element_at fails the whole query under ANSI mode (INVALID_ARRAY_INDEX_IN_ELEMENT_AT)
        found = F.filter(F.coalesce(F.col("headers"), F.array()),
                         lambda h: h["key"] == F.lit(name))
        return F.try_element_at(found, F.lit(1))["value"].cast("string")

    return (df.withColumn("host", header(HOST_HEADER))
              .withColumn("produce_ms", header(TIME_HEADER).cast("long"))
              .withColumn("event_id", header(ID_HEADER)))


def run_audit(
    spark: Any, bootstrap: str, warehouse_table: Path | str | None = None,
    topics: tuple[str, ...] = DEMO_TOPICS,
) -> AuditReport:
    """Compare ``__audit``'s produced counts with what was consumed: the landing table's rows
    if ``warehouse_table`` is given, else the records read back from ``topics``. Records the
    demo's producers did not write (no audit headers in ``topics``, entries of another
    format in ``__audit``) are skipped and counted in the report."""
    from pyspark.sql import functions as F

    from headrace.spark import warehouse

    parsed = (
        spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", AUDIT_TOPIC).option("startingOffsets", "earliest").load()
        .select(F.from_json(F.col("value").cast("string"),
                            "topic string, host string, minute long, count long").alias("a"))
    )
    valid = (F.col("a.topic").isNotNull() & F.col("a.host").isNotNull()
             & F.col("a.minute").isNotNull() & F.col("a.count").isNotNull())
    parsed = parsed.withColumn("valid", F.coalesce(valid, F.lit(False)))
    announced = (parsed.where("valid").groupBy("a.topic", "a.host", "a.minute")
                 .agg(F.max("a.count").alias("count")).collect())
    skipped_announcements = parsed.where(~F.col("valid")).count()
    produced = {(r["topic"], r["host"], int(r["minute"])): int(r["count"]) for r in announced}

    in_topics = None
    if topics:
        in_topics = header_columns(
            spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", ",".join(topics)).option("includeHeaders", "true").load()
        )
    demo_record = (F.col("host").isNotNull() & F.col("produce_ms").isNotNull()
                   & F.col("event_id").isNotNull())
    skipped = 0 if in_topics is None else in_topics.where(~demo_record).count()
    landed = warehouse.read_table(spark, warehouse_table) if warehouse_table is not None \
        else in_topics
    consumed: dict[Window, tuple[int, int]] = {}
    if landed is not None:
        rows = (
            landed.where(demo_record)
            .groupBy("topic", "host", (F.col("produce_ms") / 60000).cast("long").alias("minute"))
            .agg(F.count(F.lit(1)).alias("rows"),
                 F.count_distinct("event_id").alias("distinct"))
            .collect()
        )
        consumed = {(r["topic"], r["host"], int(r["minute"])): (int(r["rows"]),
                                                                 int(r["distinct"]))
                    for r in rows}
    return compare(produced, consumed, skipped, skipped_announcements)


def audit_record(topic: str, host: str, minute: int, count: int) -> bytes:
    return json.dumps({"topic": topic, "host": host, "minute": minute,
                       "count": count}).encode()
