"""``headrace demo``: the seeds' pipeline on Spark, end to end, from one command.

    producers (simulated hosts) --> activity, sentences --> Spark --> warehouse + results topics
          \\--> __audit (produced counts per host and minute)          \\--> audit

1. A broker: embedded, on a temporary data dir (or ``--bootstrap``).
2. Producers: user activity (page views, clicks, searches) from hosts web-1..web-3, and
   sentences from host writer-1; each record carries headers ``producer.host``,
   ``produce.time`` and ``event.id``; acknowledged counts per (host, minute) go to ``__audit``.
3. Spark (local[2]), three streaming queries reading through the ``headrace`` source:
   - ``landing``: every record, exactly once, into the warehouse table ``landing`` (one
     Parquet directory per micro-batch, committed by rename: a replay writes nothing);
   - ``activity``: counts per (10 s event-time window, event type, page) with a 10 s
     watermark, into table ``activity_counts`` and topic ``activity-counts``;
   - ``wordcount``: seed 001's word count over the sentences, into table ``word_counts`` and
     topic ``word-counts``.
   Each commits its offsets to a consumer group (``headrace-demo-<query>``) after each batch.
4. When the producers stop and the queries have caught up: a summary and the audit, which
   compares the landing table with ``__audit`` per window. With ``--json`` the last line
   printed is one JSON object.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from headrace.fsutil import write_atomically
from headrace.spark.audit import (
    AUDIT_TOPIC,
    DEMO_TOPICS,
    HOST_HEADER,
    ID_HEADER,
    TIME_HEADER,
    audit_record,
)

# topics of the demo's own: the README's other examples (the word count's ``sentences``)
# never collide with them. Records in them that the demo's producers did not write (no
# audit headers) are skipped by every query and counted by the audit.
ACTIVITY_TOPIC, SENTENCES_TOPIC = DEMO_TOPICS
ACTIVITY_RESULTS = "headrace-demo-activity-counts"
WORD_RESULTS = "headrace-demo-word-counts"
WEB_HOSTS = ("web-1", "web-2", "web-3")
WRITER_HOST = "writer-1"
PAGES = ("/", "/search", "/products", "/products/42", "/cart", "/checkout", "/help")
EVENT_TYPES = ("page_view", "page_view", "page_view", "click", "click", "search")
QUERIES = ("kafka broker", "spark streaming", "exactly once", "python", "storm topology")
SENTENCES = (
    "the quick brown fox jumps over the lazy dog",
    "four score and seven years ago",
    "an apple a day keeps the doctor away",
    "snow white and the seven dwarfs",
    "i am at two with nature",
)  # seed 001's RandomSentenceSpout


# --- producing ------------------------------------------------------------------------------


@dataclass
class ProducerStats:
    sent: int = 0
    acked: int = 0
    failed: int = 0
    by_window: Counter[tuple[str, str, int]] = field(default_factory=Counter)


class EventProducer(threading.Thread):
    """Produces activity events at ``rate`` per second and sentences at a tenth of it, for
    ``duration_s``; publishes acknowledged counts per (topic, host, minute) to ``__audit``."""

    def __init__(self, bootstrap: str, rate: int, duration_s: float, seed: int = 7) -> None:
        super().__init__(name="demo-producer", daemon=True)
        self.bootstrap = bootstrap
        self.rate = rate
        self.duration_s = duration_s
        self.stats = ProducerStats()
        self.stop_requested = threading.Event()
        self.error: BaseException | None = None
        self._rng = random.Random(seed)
        self._published: dict[tuple[str, str, int], int] = {}
        # event ids are unique across runs (a rerun in the same work directory lands in
        # the same warehouse table), and counts go on from what earlier runs announced
        self._run_id = uuid.uuid4().hex[:8]
        self._announced_before: dict[tuple[str, str, int], int] = {}

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:
            self.error = e

    def _run(self) -> None:
        from confluent_kafka import Producer

        self._announced_before = announced_counts(self.bootstrap)
        p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                      "linger.ms": 20, "acks": "all"})
        seq = 0
        start = time.monotonic()
        last_audit = start
        sentence_every = 10
        while not self.stop_requested.is_set():
            elapsed = time.monotonic() - start
            if elapsed >= self.duration_s:
                break
            due = int(elapsed * self.rate) - self.stats.sent
            for _ in range(max(0, due)):
                seq += 1
                if seq % sentence_every == 0:
                    self._produce(p, SENTENCES_TOPIC, WRITER_HOST, seq, None,
                                  self._rng.choice(SENTENCES).encode())
                else:
                    host = WEB_HOSTS[seq % len(WEB_HOSTS)]
                    user = f"user-{self._rng.randrange(50)}"
                    self._produce(p, ACTIVITY_TOPIC, host, seq, user.encode(), None, user=user)
            p.poll(0)
            if time.monotonic() - last_audit >= 5.0:
                self._publish_audit(p)
                last_audit = time.monotonic()
            self.stop_requested.wait(0.02)  # pacing to the target rate
        remaining = p.flush(60)
        if remaining:
            raise RuntimeError(f"{remaining} records were not acknowledged by the broker")
        self._publish_audit(p)
        if p.flush(30):
            raise RuntimeError("audit counts were not acknowledged by the broker")

    def _produce(self, p: Any, topic: str, host: str, seq: int, key: bytes | None,
                 value: bytes | None, user: str = "") -> None:
        now_ms = int(time.time() * 1000)
        event_id = f"{host}-{self._run_id}-{seq}"
        if value is None:
            kind = self._rng.choice(EVENT_TYPES)
            event = {"event_id": event_id, "host": host, "user": user, "type": kind,
                     "page": "/search" if kind == "search" else self._rng.choice(PAGES),
                     "query": self._rng.choice(QUERIES) if kind == "search" else None,
                     "ts": now_ms}
            value = json.dumps(event).encode()
        window = (topic, host, now_ms // 60000)
        stats = self.stats

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is None:
                stats.acked += 1
                stats.by_window[window] += 1
            else:
                stats.failed += 1

        headers = [(HOST_HEADER, host.encode()), (TIME_HEADER, str(now_ms).encode()),
                   (ID_HEADER, event_id.encode())]
        while True:
            try:
                p.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        stats.sent += 1

    def _publish_audit(self, p: Any) -> None:
        for window, acked in list(self.stats.by_window.items()):
            count = self._announced_before.get(window, 0) + acked
            if self._published.get(window) != count:
                p.produce(AUDIT_TOPIC, key=f"{window[1]}:{window[2]}".encode(),
                          value=audit_record(window[0], window[1], window[2], count))
                self._published[window] = count
        p.poll(0)


def announced_counts(bootstrap: str) -> dict[tuple[str, str, int], int]:
    """What ``__audit`` holds already: the largest count per (topic, host, minute)."""
    start = {tp: 0 for tp in _latest(bootstrap, (AUDIT_TOPIC,))}
    out: dict[tuple[str, str, int], int] = {}
    for value in _committed_values(bootstrap, AUDIT_TOPIC, start):
        try:
            a = json.loads(value)
            window = (str(a["topic"]), str(a["host"]), int(a["minute"]))
            out[window] = max(out.get(window, 0), int(a["count"]))
        except (ValueError, KeyError, TypeError):
            continue  # not the demo's
    return out


# --- the Spark jobs --------------------------------------------------------------------------


def _source(spark: Any, bootstrap: str, topics: str, group: str, headers: bool = False) -> Any:
    return (spark.readStream.format("headrace")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topics)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", str(headers).lower())
            .option("kafka.group.id", group)
            .load())


def start_queries(spark: Any, bootstrap: str, work: Path, trigger_s: float,
                  interrupted: threading.Event | None = None) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from headrace.spark import warehouse
    from headrace.spark.audit import header_columns

    wh = work / "warehouse"
    ckpt = work / "checkpoints"
    trigger = f"{trigger_s} seconds"

    def demo_records(df: Any) -> Any:
        """The records the demo's producers wrote: every audit header present."""
        return header_columns(df).where(F.col("host").isNotNull()
                                        & F.col("produce_ms").isNotNull()
                                        & F.col("event_id").isNotNull())

    landing = demo_records(_source(spark, bootstrap, f"{ACTIVITY_TOPIC},{SENTENCES_TOPIC}",
                                   "headrace-demo-landing", headers=True)).select(
        "topic", "partition", "offset", "timestamp", F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"), "host", "produce_ms", "event_id")

    def land(df: Any, batch_id: int) -> None:
        warehouse.write_batch(df, batch_id, wh / "landing")

    activity = (
        demo_records(_source(spark, bootstrap, ACTIVITY_TOPIC, "headrace-demo-activity",
                             headers=True))
        .select(F.from_json(F.col("value").cast("string"),
                            "event_id string, host string, user string, type string, "
                            "page string, query string, ts long").alias("e"))
        .select("e.*").where(F.col("ts").isNotNull())
        .withColumn("event_time", F.timestamp_millis("ts"))
        .withWatermark("event_time", "10 seconds")
        .groupBy(F.window("event_time", "10 seconds"), "type", "page").count()
        .select(F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"), "type", "page", "count")
    )
    words = (
        demo_records(_source(spark, bootstrap, SENTENCES_TOPIC, "headrace-demo-wordcount",
                             headers=True))
        .select(F.explode(F.split(F.lower(F.col("value").cast("string")), "[^a-z']+"))
                .alias("word"))
        .where(F.col("word") != "").groupBy("word").count()
    )

    def to_table_and_topic(table: str, topic: str, key: Any) -> Callable[[Any, int], None]:
        # the result topic is written in Kafka transactions, one per task and micro-batch,
        # skipped when a replayed batch was committed already (the sink's transactional
        # mode): exactly once, like the table. The prefix is this checkpoint's own, so a
        # later demo on the same broker never matches this one's progress.
        prefix = "headrace-demo-" + hashlib.sha1(str(ckpt / table).encode()).hexdigest()[:12]

        def sink(df: Any, batch_id: int) -> None:
            df.persist()
            try:
                warehouse.write_batch(df, batch_id, wh / table)
                (df.select(key.alias("key"), F.to_json(F.struct("*")).alias("value"))
                 .write.format("headrace").option("kafka.bootstrap.servers", bootstrap)
                 .option("topic", topic).option("transactionalIdPrefix", prefix)
                 .option("transactionBatchId", str(batch_id)).mode("append").save())
            finally:
                df.unpersist()
            failpoint = os.environ.get(DEMO_FAILPOINT_ENV)
            if failpoint is not None and batch_id >= int(failpoint):
                # crash tests: the whole demo (its process group: driver, JVM, workers and
                # the embedded broker) dies after a batch's table and topic writes committed
                # and before Spark's checkpoint recorded the batch
                os.killpg(os.getpgid(0), signal.SIGKILL)
        return sink

    writers = {
        "landing": landing.writeStream.queryName("landing").foreachBatch(land)
        .option("checkpointLocation", str(ckpt / "landing")).trigger(processingTime=trigger),
        "activity": activity.writeStream.queryName("activity").outputMode("update")
        .foreachBatch(to_table_and_topic("activity_counts", ACTIVITY_RESULTS,
                                         F.concat_ws(":", "type", "page")))
        .option("checkpointLocation", str(ckpt / "activity")).trigger(processingTime=trigger),
        "wordcount": words.writeStream.queryName("wordcount").outputMode("update")
        .foreachBatch(to_table_and_topic("word_counts", WORD_RESULTS, F.col("word")))
        .option("checkpointLocation", str(ckpt / "wordcount")).trigger(processingTime=trigger),
    }
    queries: dict[str, Any] = {}
    for name, writer in writers.items():
        queries[name] = writer.start()
        _wait_sources_initialized(queries[name], SOURCE_START_TIMEOUT_S,
                                  interrupted or threading.Event())
    return queries


SOURCE_START_TIMEOUT_S = 120.0


def _wait_sources_initialized(query: Any, timeout_s: float,
                              interrupted: threading.Event) -> None:
    """Until ``query`` has started its source (Spark launches a Python process for it,
    which must connect back to the JVM within Spark's fixed 10 s): the queries start one
    after another, not three interpreters importing PySpark at once on a loaded machine.
    A query that failed is left for the caller's check of ``exception()``."""
    deadline = time.monotonic() + timeout_s
    # "Initializing StreamExecution", then "Initializing sources" (the source's process
    # starts here), then the trigger's own messages
    while (query.isActive and query.status["message"].startswith("Initializing")
           and time.monotonic() < deadline and not interrupted.is_set()):
        interrupted.wait(0.1)  # Spark has no event for it: poll until the deadline


# --- watching progress -------------------------------------------------------------------------


def _processed(query: Any) -> dict[tuple[str, int], int]:
    from headrace.spark.offsets import from_json

    progress = query.lastProgress
    if not progress:
        return {}
    end = json.loads(progress["sources"][0]["endOffset"] or "{}")
    return from_json({k: v for k, v in end.items() if not k.startswith("$")})


def _input_rows(query: Any) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


# How long a required end-offset query may wait for leaders: Kafka's
# default.api.timeout.ms. With --cluster a partition of the killed (or just restarted)
# broker has no leader for the session timeout plus the election, which a loaded machine
# stretched past 10 s (a CI run with a busy core beside it failed so).
LATEST_TIMEOUT_S = 60.0


def _latest(bootstrap: str, topics: tuple[str, ...],
            timeout_s: float = LATEST_TIMEOUT_S) -> dict[tuple[str, int], int]:
    from headrace.spark import kafka_io

    conf = {"bootstrap.servers": bootstrap}
    md = kafka_io.topic_partitions(conf, min(timeout_s, 10.0))
    tps = {(t, p) for t in topics if t in md for p in range(md[t])}
    return kafka_io.list_offsets(conf, tps, "latest", timeout_s)


DEMO_FAILPOINT_ENV = "HEADRACE_DEMO_FAILPOINT_BATCH"

TRIGGER_S = 2.0  # the queries' processing-time trigger
INTERRUPT_GRACE_S = 180.0
"""After Ctrl-C: how long the running micro-batches may take to finish before the queries
are stopped where they are (a second Ctrl-C stops them at once, a third the demo)."""

QUERY_TOPICS = {"landing": (ACTIVITY_TOPIC, SENTENCES_TOPIC), "activity": (ACTIVITY_TOPIC,),
                "wordcount": (SENTENCES_TOPIC,)}


def stop_when_idle(query: Any, timeout_s: float = 30.0) -> None:
    """Stop ``query`` between two micro-batches: stopping one mid-batch interrupts its
    ``foreachBatch`` callback (harmless to the exactly-once table, but noisy)."""
    deadline = time.monotonic() + timeout_s
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


def stop_between_batches(queries: dict[str, Any], trigger_s: float, timeout_s: float,
                         hurry: threading.Event) -> None:
    """Stop every query in ``queries`` while it waits for its next trigger, so that no
    micro-batch is interrupted: the running ones finish first (up to ``timeout_s`` in all,
    or until ``hurry`` is set; then the rest are stopped where they are).

    A processing-time trigger fires at multiples of its interval on the wall clock (Spark's
    ``ProcessingTimeExecutor``): a query that is idle now and not close to the next multiple
    stays idle for the ``stop()`` call, which then only interrupts the wait."""
    interval_ms = max(1, int(trigger_s * 1000))
    margin_ms = min(500, interval_ms // 4)
    deadline = time.monotonic() + timeout_s
    left = dict(queries)
    while left and time.monotonic() < deadline and not hurry.is_set():
        for name, q in list(left.items()):
            if not q.isActive:
                left.pop(name)
                continue
            if q.status["isTriggerActive"]:
                continue
            to_next_trigger_ms = interval_ms - int(time.time() * 1000) % interval_ms
            if to_next_trigger_ms > margin_ms:
                q.stop()
                left.pop(name)
        hurry.wait(0.05)
    for q in left.values():
        with contextlib.suppress(Exception):
            q.stop()


def _query_error(query: Any) -> str:
    """A failed query's error without the logical plan Spark appends to it (the plan is
    thousands of characters; the cause is the first lines)."""
    text = str(query.exception())
    return text.split("=== Streaming Query ===")[0].strip()[:4000]


def _caught_up(query: Any, latest: dict[tuple[str, int], int]) -> bool:
    if query.exception() is not None:
        raise RuntimeError(f"query {query.name} failed: {_query_error(query)}")
    done = _processed(query)
    return all(done.get(tp, -1) >= off for tp, off in latest.items())


def _group_lag(bootstrap: str, group: str, latest: dict[tuple[str, int], int]) -> int | None:
    """Records behind for ``group`` from the broker's committed offsets; None if unknown."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        committed = c.committed([TopicPartition(t, p) for t, p in latest], timeout=5.0)
        total = 0
        for tp in committed:
            if tp.error is not None or tp.offset < 0:
                return None
            total += max(0, latest[(tp.topic, tp.partition)] - tp.offset)
        return total
    except KafkaException:
        return None
    finally:
        c.close()


# --- the result topics against the tables -------------------------------------------------


def _committed_values(bootstrap: str, topic: str, start: dict[tuple[str, int], int],
                      timeout_s: float = 60.0) -> list[str]:
    """``topic``'s values from ``start`` (offsets per partition) to its end, read with
    read_committed."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    parts = sorted(p for t, p in start if t == topic)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "headrace-demo-results-audit",
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, start[(topic, p)]) for p in parts])
    out: list[str] = []
    eof: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(eof) < len(parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} took over {timeout_s:.0f} s")
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            part = m.partition()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF and part is not None:
                    eof.add(part)
                continue
            eof.discard(part if part is not None else -1)
            out.append((m.value() or b"").decode())
    finally:
        c.close()
    return out


RESULTS_START_FILE = "results-start.json"
"""In a demo's work directory: where the result topics ended before its first run (the
warehouse tables there hold the rows of every run since), for ``headrace audit``."""


def results_start(work: Path, bootstrap: str) -> dict[tuple[str, int], int]:
    """The result topics' offsets before the first run in ``work``: read from
    ``RESULTS_START_FILE``, or now (and written there) on a first run."""
    path = work / RESULTS_START_FILE
    if path.is_file():
        return load_results_start(path)
    start = _latest(bootstrap, (ACTIVITY_RESULTS, WORD_RESULTS))
    write_atomically(path, json.dumps({f"{t}:{p}": o for (t, p), o in sorted(start.items())},
                                      indent=1).encode())
    return start


def load_results_start(path: Path) -> dict[tuple[str, int], int]:
    raw = json.loads(path.read_text())
    out: dict[tuple[str, int], int] = {}
    for key, offset in raw.items():
        topic, _, part = str(key).rpartition(":")
        out[(topic, int(part))] = int(offset)
    return out


def audit_results(spark: Any, bootstrap: str, warehouse_dir: Path,
                  start: dict[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """Each result topic, read with read_committed from ``start`` (where it ended before
    the work directory's first run), holds exactly the rows of its warehouse table in
    ``warehouse_dir`` (as the JSON the sink wrote): lost = table rows missing from the
    topic, duplicated = topic records beyond the table's."""
    from collections import Counter

    from pyspark.sql import functions as F

    from headrace.spark import warehouse

    out: dict[str, dict[str, int]] = {}
    for table, topic in (("activity_counts", ACTIVITY_RESULTS), ("word_counts", WORD_RESULTS)):
        df = warehouse.read_table(spark, warehouse_dir / table)
        rows: Counter[str] = Counter()
        if df is not None:
            rows = Counter(r[0] for r in df.drop("batch_id")
                           .select(F.to_json(F.struct("*"))).collect())
        got = Counter(_committed_values(bootstrap, topic, start))
        out[topic] = {"table_rows": sum(rows.values()), "topic_records": sum(got.values()),
                      "lost": sum((rows - got).values()),
                      "duplicated": sum((got - rows).values())}
    return out


# --- the command ---------------------------------------------------------------------------


def _create_topics(bootstrap: str, replication: int = 1) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = {ACTIVITY_TOPIC: 2, SENTENCES_TOPIC: 2, ACTIVITY_RESULTS: 1, WORD_RESULTS: 1,
              AUDIT_TOPIC: 1}
    existing = admin.list_topics(timeout=10).topics
    configs = {"min.insync.replicas": "2"} if replication >= 3 else {}
    new = [NewTopic(t, n, replication, config=configs) for t, n in wanted.items()
           if t not in existing]
    for topic, fut in (admin.create_topics(new).items() if new else []):
        try:
            fut.result(40)
        except Exception as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise RuntimeError(f"cannot create topic {topic}: {e}") from e
    _wait_for_leaders(admin, wanted, LEADER_TIMEOUT_S)


LEADER_TIMEOUT_S = 60.0


def _wait_for_leaders(admin: Any, topics: Iterable[str], timeout_s: float) -> None:
    """Until every partition of ``topics`` has a leader: a topic just created on a cluster
    has partitions without one for a moment, and the queries' first offsets need them
    all."""
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(timeout=10).topics
        leaderless = sorted(
            [t for t in topics if t not in md or not md[t].partitions]
            + [f"{t}-{p}" for t in topics if t in md
               for p, part in md[t].partitions.items() if part.leader < 0])
        if not leaderless:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"partitions without a leader {timeout_s:.0f} s after their "
                               f"topics were created: {', '.join(leaderless)}")
        time.sleep(0.2)  # poll until the deadline: metadata has no event to wait on


class BrokerFault(threading.Thread):
    """``--cluster``: kill -9 the broker leading ``activity``-0 a third of the way through
    the run and start it again at two thirds (R-REP-5 under the pipeline)."""

    def __init__(self, cluster: Any, bootstrap: str, duration_s: float,
                 say: Callable[[str], None]) -> None:
        super().__init__(name="demo-broker-fault", daemon=True)
        self.cluster = cluster
        self.bootstrap = bootstrap
        self.duration_s = duration_s
        self.say = say
        self.killed: int | None = None
        self.error: str | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        from confluent_kafka.admin import AdminClient

        try:
            if self._stop_event.wait(self.duration_s / 3):
                return
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            md = admin.list_topics(topic=ACTIVITY_TOPIC, timeout=10)
            leader = int(md.topics[ACTIVITY_TOPIC].partitions[0].leader)
            if leader not in self.cluster.brokers:
                leader = 1
            self.cluster.brokers[leader].kill()
            self.killed = leader
            self.say(f"  fault: killed broker {leader} (kill -9), the leader of "
                     f"{ACTIVITY_TOPIC}-0")
            if self._stop_event.wait(self.duration_s / 3):
                return
            self.cluster.restart(leader)
            self.say(f"  fault: broker {leader} restarted; it catches up as a follower")
        except Exception as e:  # reported in the summary; the audit decides
            self.error = str(e)
            self.say(f"  fault injection failed: {e}")

    def stop(self) -> None:
        self._stop_event.set()


class DemoInterrupted(Exception):
    """Ctrl-C (SIGINT) during the demo: raised at the next safe point of the main loop, not
    in the middle of a call into Spark's JVM."""


@contextlib.contextmanager
def _sigint_as_flag(flag: threading.Event, hurry: threading.Event) -> Any:
    """While inside: the first SIGINT sets ``flag`` (the demo stops at its next check,
    letting running micro-batches finish), a second one ``hurry`` (the stop does not wait
    for them), a third raises KeyboardInterrupt wherever the demo is. The first two never
    break a call in the middle: the stop stays ordered, its output silenced."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(_signum: int, _frame: Any) -> None:
        if hurry.is_set():
            raise KeyboardInterrupt
        (hurry if flag.is_set() else flag).set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _quiet_py4j() -> None:
    """After an interrupt: Spark's Python bridge logs every broken call with a traceback."""
    import logging

    for name in ("py4j", "py4j.java_gateway", "py4j.clientserver", "pyspark"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)



def _quiet_accumulator_server() -> None:
    """The driver's accumulator server (a socketserver thread) prints a traceback for every
    update connection cut short, which a Ctrl-C's stop does, even before the demo's own
    stop begins: its errors are not the user's to read."""
    try:
        from pyspark import accumulators
    except ImportError:  # pragma: no cover - the spark extra is there when Spark runs
        return
    for name in ("AccumulatorTCPServer", "AccumulatorUnixServer"):
        server = getattr(accumulators, name, None)
        if server is not None:
            server.handle_error = lambda *_args: None


def _shell_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def query_hints(python: str, wh: Path) -> list[str]:
    """Commands that read the warehouse tables with pandas (in the spark extra), as printed
    at the end of the demo; each works as written in a POSIX shell."""
    def one(code: str) -> str:
        return f"{_shell_quote(python)} -c {_shell_quote(code)}"

    def path(table: str) -> str:
        return json.dumps(str(wh / table))  # a Python string literal in double quotes

    return [
        one(f"import pandas as pd; t = pd.read_parquet({path('word_counts')}); "
            'print(t.groupby("word")["count"].max().sort_values(ascending=False).head(10))'),
        one(f"import pandas as pd; t = pd.read_parquet({path('activity_counts')}); "
            'print(t.groupby(["window_start", "type", "page"])["count"].max()'
            '.groupby(["type", "page"]).sum().sort_values(ascending=False).head(10))'),
        one(f"import pandas as pd; t = pd.read_parquet({path('landing')}); "
            'print(len(t), "rows"); print(t[["topic", "host", "event_id", "value"]].head())'),
    ]


def run_demo(duration_s: float, rate: int, bootstrap: str | None, workdir: Path | None,
             as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
             cluster: bool = False) -> dict[str, Any]:
    """Run the demo; raises ``DemoInterrupted`` after a clean stop on SIGINT."""
    _quiet_accumulator_server()
    interrupted, hurry = threading.Event(), threading.Event()
    with _sigint_as_flag(interrupted, hurry):
        try:
            return _run_demo(duration_s, rate, bootstrap, workdir, as_json, out, err, cluster,
                             interrupted, hurry)
        except Exception:
            if interrupted.is_set():  # a call broken by the interrupt: not an error
                raise DemoInterrupted() from None
            raise


def _run_demo(duration_s: float, rate: int, bootstrap: str | None, workdir: Path | None,
              as_json: bool, out: TextIO, err: TextIO, cluster: bool,
              interrupted: threading.Event, hurry: threading.Event) -> dict[str, Any]:
    from headrace.broker.embedded import EmbeddedBroker
    from headrace.spark import local_session, warehouse
    from headrace.spark.audit import format_report, run_audit

    t_start = time.monotonic()
    work = workdir or Path(tempfile.mkdtemp(prefix="headrace-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    wh = work / "warehouse"
    info = err if as_json else out

    def say(msg: str) -> None:
        print(msg, file=info, flush=True)

    def check() -> None:
        if interrupted.is_set():
            raise DemoInterrupted()

    say(f"workdir: {work} (warehouse, checkpoints, embedded broker; "
        + ("kept after the run: a new temporary directory, delete it when done)"
           if workdir is None else "kept after the run)"))
    broker = None
    local_cluster = None
    fault: BrokerFault | None = None
    producer: EventProducer | None = None
    if cluster:
        from headrace.cluster.local import LocalCluster

        say(f"cluster: starting ZooKeeper and 3 brokers in {work / 'cluster'} ...")
        local_cluster = LocalCluster(work / "cluster", 3)
        bootstrap = local_cluster.start()
        say(f"cluster: {bootstrap} (topics with replication factor 3, "
            "min.insync.replicas=2)")
    elif bootstrap is None:
        broker = EmbeddedBroker(work / "broker", config={"num.partitions": "2"}).start()
        bootstrap = broker.bootstrap_servers
        say(f"broker: embedded, {bootstrap}, data in {work / 'broker'}")
    else:
        say(f"broker: {bootstrap}")
    queries: dict[str, Any] = {}
    spark = None
    try:
        _create_topics(bootstrap, 3 if cluster else 1)
        check()
        say("spark: starting (first start takes ~20 s) ...")
        t_spark = time.monotonic()
        on_sigint = signal.getsignal(signal.SIGINT)
        spark = local_session("headrace-demo")
        if threading.current_thread() is threading.main_thread():
            # PySpark's SparkContext takes SIGINT for its own handler (cancel every job:
            # micro-batches die mid-write, each logged by the JVM with a traceback): Ctrl-C
            # stays the demo's, which lets the running batches finish (``_stop_all``)
            signal.signal(signal.SIGINT, on_sigint)
        check()
        start_offsets = results_start(work, bootstrap)
        queries = start_queries(spark, bootstrap, work, TRIGGER_S, interrupted)
        spark_start_s = time.monotonic() - t_spark
        say(f"spark: session up in {spark_start_s:.1f} s; 3 streaming queries (landing, "
            "activity, wordcount) starting")
        check()
        producer = EventProducer(bootstrap, rate, duration_s)
        t_produce = time.monotonic()
        producer.start()
        if local_cluster is not None:
            fault = BrokerFault(local_cluster, bootstrap, duration_s, say)
            fault.start()
        say(f"producing ~{rate} events/s for {duration_s:g} s from {', '.join(WEB_HOSTS)} "
            f"and {WRITER_HOST} to {ACTIVITY_TOPIC}, {SENTENCES_TOPIC}; warehouse in {wh}")
        topics = (ACTIVITY_TOPIC, SENTENCES_TOPIC)
        t_first_rows: float | None = None  # Spark's first rows landed: start-up is over

        def note_first_rows() -> None:
            nonlocal t_first_rows
            if t_first_rows is not None:
                return
            rows = _input_rows(queries["landing"])
            if rows > 0:
                t_first_rows = time.monotonic()
                say(f"spark: first micro-batch landed {rows} rows after "
                    f"{t_first_rows - t_produce:.1f} s")

        next_report = time.monotonic() + 5
        while producer.is_alive():
            producer.join(timeout=0.5)
            check()
            for name, q in queries.items():
                if q.exception() is not None:
                    raise RuntimeError(f"query {name} failed: {_query_error(q)}")
            note_first_rows()
            if time.monotonic() >= next_report:
                next_report += 5
                try:
                    latest = _latest(bootstrap, topics, 10.0)  # a progress line only
                except Exception:  # a leader moving (the --cluster fault): no line this time
                    say(f"  {time.monotonic() - t_produce:5.1f} s  produced "
                        f"{producer.stats.acked:7d}  (end offsets unavailable while a "
                        "leader moves)")
                    continue
                behind = sum(max(0, off - _processed(queries["landing"]).get(tp, 0))
                             for tp, off in latest.items())
                landed = _input_rows(queries["landing"])
                note = ("  (Spark is starting its queries: the first micro-batch takes a "
                        "while)" if t_first_rows is None else "")
                say(f"  {time.monotonic() - t_produce:5.1f} s  produced {producer.stats.acked:7d}"
                    f"  landed {landed:7d}  lag {behind:6d}{note}")
        if producer.error is not None:
            raise RuntimeError(f"producer failed: {producer.error}")
        t_produced = time.monotonic()
        final = _latest(bootstrap, topics)
        say("producers done; waiting for the queries to catch up ...")
        deadline = time.monotonic() + 120
        for name, q in queries.items():
            want = {tp: o for tp, o in final.items() if tp[0] in QUERY_TOPICS[name]}
            while not _caught_up(q, want):
                check()
                note_first_rows()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"query {name} did not catch up within 120 s")
                time.sleep(0.2)
        t_caught_up = time.monotonic()

        def group_lags() -> dict[str, int | None]:
            return {name: _group_lag(bootstrap, f"headrace-demo-{name}",
                                     {tp: o for tp, o in final.items()
                                      if tp[0] in QUERY_TOPICS[name]})
                    for name in queries}

        # Each query commits a batch's end to its group when it plans the next trigger.
        lags = group_lags()
        lag_deadline = time.monotonic() + 15
        while any(lags.values()) and time.monotonic() < lag_deadline:
            check()
            time.sleep(0.5)
            lags = group_lags()
        for q in queries.values():
            stop_when_idle(q)
        queries = {}
        check()
        say(f"audit: comparing the landing table with {AUDIT_TOPIC} ...")
        report = run_audit(spark, bootstrap, wh / "landing", topics)
        check()
        landing_rows = report.consumed
        tables = {}
        for table in ("landing", "activity_counts", "word_counts"):
            df = warehouse.read_table(spark, wh / table)
            tables[table] = 0 if df is None else df.count()
        results = _latest(bootstrap, (ACTIVITY_RESULTS, WORD_RESULTS))
        records_out = tables["landing"] + sum(results.values())
        from pyspark.sql import functions as F

        # update mode: one row per key per batch, each with the key's count so far (counts
        # only grow): a key's latest row is its largest count
        top_words: list[tuple[str, int]] = []
        wc = warehouse.read_table(spark, wh / "word_counts")
        if wc is not None:
            latest_counts = wc.groupBy("word").agg(F.max("count").alias("count"))
            top_words = [(r["word"], int(r["count"])) for r in
                         latest_counts.orderBy(F.desc("count"), "word").limit(5).collect()]
        top_pages: list[tuple[str, str, int]] = []
        ac = warehouse.read_table(spark, wh / "activity_counts")
        if ac is not None:
            per_window = (ac.groupBy("window_start", "type", "page")
                          .agg(F.max("count").alias("count")))
            top_pages = [(r["type"], r["page"], int(r["n"])) for r in
                         per_window.groupBy("type", "page").agg(F.sum("count").alias("n"))
                         .orderBy(F.desc("n"), "type", "page").limit(5).collect()]
        check()
        results_audit = audit_results(spark, bootstrap, wh, start_offsets)
        # throughput from Spark's first landed rows to caught up: its start-up excluded
        busy_s = max(0.001, t_caught_up - (t_first_rows or t_produce))
        summary: dict[str, Any] = {
            "produced": report.produced,
            "consumed": report.consumed,
            "lost": report.lost,
            "duplicated": report.duplicated,
            "skipped": report.skipped,
            "skipped_announcements": report.skipped_announcements,
            "warehouse_rows": landing_rows,
            "warehouse_tables": tables,
            "results_topics": {f"{t}-{p}": o for (t, p), o in sorted(results.items())},
            # each result topic, read with read_committed, against its warehouse table
            "results_audit": results_audit,
            "results_lost": sum(a["lost"] for a in results_audit.values()),
            "results_duplicated": sum(a["duplicated"] for a in results_audit.values()),
            "records_in": sum(final.values()),
            "records_out": records_out,
            "producer_failures": producer.stats.failed,
            "group_lag": lags,
            "throughput_rows_per_s": round(report.consumed / busy_s, 1),
            "spark_start_s": round(spark_start_s + ((t_first_rows or t_produce) - t_produce),
                                   1),
            "catch_up_s": round(t_caught_up - t_produced, 2),
            "top_words": top_words,
            "top_pages": top_pages,
            "audit_windows": len(report.windows),
            "runtime_s": round(time.monotonic() - t_start, 1),
            "workdir": str(work),
            "warehouse": str(wh),
        }
        if fault is not None:
            summary["cluster"] = {"brokers": 3, "replication_factor": 3,
                                  "broker_killed": fault.killed, "fault_error": fault.error}
        say(format_report(report))
        say(format_summary(summary, results_audit))
        if as_json:
            print(json.dumps(summary), file=out, flush=True)
        return summary
    finally:
        quiet = _Silenced() if interrupted.is_set() else None
        if quiet is not None:
            _quiet_py4j()
            quiet.__enter__()
        try:
            _stop_all(producer, queries, spark, fault, broker, local_cluster,
                      interrupted.is_set(), hurry)
        finally:
            if quiet is not None:
                quiet.__exit__()


class _Silenced:
    """After Ctrl-C: this process's stderr (Python's and file descriptor 2) goes to
    /dev/null while Spark stops; its threads (the accumulator server, py4j) print a
    traceback for every connection the stop breaks."""

    def __enter__(self) -> None:
        sys.stderr.flush()
        self._saved_fd = os.dup(2)
        self._saved = sys.stderr
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        sys.stderr = open(os.devnull, "w")

    def __exit__(self, *exc: object) -> None:
        sys.stderr.close()
        sys.stderr = self._saved
        os.dup2(self._saved_fd, 2)
        os.close(self._saved_fd)


def _stop_all(producer: EventProducer | None, queries: dict[str, Any], spark: Any,
              fault: BrokerFault | None, broker: Any, local_cluster: Any,
              interrupted: bool, hurry: threading.Event | None = None) -> None:
    if producer is not None:
        producer.stop_requested.set()
    if interrupted and spark is not None:
        # the JVM writes its log to the stderr it inherited (which ``_Silenced`` does not
        # reach); a clean stop logs nothing, and one cut short (the graceful wait timed out,
        # a second Ctrl-C) is not the user's to read either
        from headrace.spark.session import silence_jvm_log

        with contextlib.suppress(Exception):
            silence_jvm_log(spark)
    if interrupted:
        # Ctrl-C: the micro-batches running now finish (their tables and topics committed,
        # their checkpoints written), then the queries stop; generous, for a loaded machine.
        # A second Ctrl-C (``hurry``) ends the wait: the rest stops at once, in order (the
        # broker processes too)
        with contextlib.suppress(Exception):
            stop_between_batches(queries, TRIGGER_S, INTERRUPT_GRACE_S,
                                 hurry or threading.Event())
    for q in queries.values():
        with contextlib.suppress(Exception):
            q.stop()
    if spark is not None:
        with contextlib.suppress(Exception):
            spark.stop()
    # the driver's cached clients (metadata, offsets) close before the broker goes, or
    # librdkafka logs "connection refused" as it tries to reconnect
    from headrace.spark import kafka_io

    kafka_io.close_all()
    if producer is not None and producer.is_alive():
        producer.join(70)
    if fault is not None:
        fault.stop()
        fault.join(70)
    if broker is not None:
        broker.stop()
    if local_cluster is not None:
        local_cluster.stop()


def format_summary(summary: dict[str, Any], results_audit: dict[str, dict[str, int]]) -> str:
    """The demo's closing summary for people: plain lines and one table, no reprs."""
    wh = Path(summary["warehouse"])
    tables = summary["warehouse_tables"]
    lines = [
        "",
        "summary",
        f"  records in        {summary['records_in']:>8}  (topics {ACTIVITY_TOPIC}, "
        f"{SENTENCES_TOPIC})",
        f"  skipped           {summary['skipped']:>8}  (records without the demo's headers: "
        "not written by its producers, not counted)",
        f"  throughput        {summary['throughput_rows_per_s']:>8}  rows/s (from Spark's "
        f"first batch to caught up; its start-up, {summary['spark_start_s']} s, excluded)",
        f"  caught up         {summary['catch_up_s']:>8}  s after the producers stopped",
        "  consumer lag      " + ", ".join(
            f"headrace-demo-{q} {'?' if n is None else n}"
            for q, n in summary["group_lag"].items()),
        "",
        f"  {'result':<42} {'rows':>7}  where",
    ]
    notes = {"landing": "one row per record, exactly once",
             "activity_counts": "update mode: one row per key per batch",
             "word_counts": "update mode: one row per key per batch"}
    for table, n in tables.items():
        lines.append(f"  {'table ' + table:<42} {n:>7}  {wh / table}  ({notes[table]})")
    for topic, a in results_audit.items():
        lines.append(f"  {'topic ' + topic:<42} {a['topic_records']:>7}  read_committed: "
                     f"lost {a['lost']}, duplicated {a['duplicated']} against its table")
    lines += [
        "",
        "The result tables are written in update mode: they hold one row per key per "
        "micro-batch, with the",
        "key's count so far. A key's latest (largest) count is its result; summing the rows "
        "over-counts.",
        "  top words (latest count per word): " + ", ".join(
            f"{w} {n}" for w, n in summary["top_words"]),
        "  top pages (latest count per 10 s window, summed): " + ", ".join(
            f"{t} {p} {n}" for t, p, n in summary["top_pages"]),
        "",
        "Query the warehouse with pandas (Parquet; in the spark extra):",
        *(f"  {hint}" for hint in query_hints(sys.executable, wh)),
        "",
        f"warehouse: {wh}",
        f"runtime {summary['runtime_s']} s",
    ]
    return "\n".join(lines)


# ``headrace audit`` could not run (not a verdict): exit 1 is kept for loss found
from headrace.cli_support import EXIT_AUDIT_ERROR  # noqa: E402


def run_audit_command(bootstrap: str, warehouse_dir: Path | None, topics: tuple[str, ...],
                      as_json: bool, out: TextIO = sys.stdout) -> int:
    from headrace.spark import local_session
    from headrace.spark.audit import format_report, run_audit

    err = sys.stderr
    print("audit: starting Spark (first start takes ~20 s) ...", file=err, flush=True)
    spark = local_session("headrace-audit")
    results: dict[str, dict[str, int]] = {}
    try:
        table = warehouse_dir / "landing" if warehouse_dir is not None else None
        if table is not None and not table.is_dir():
            table = warehouse_dir  # given the table itself
        report = run_audit(spark, bootstrap, table, topics)
        # a demo's warehouse: its result topics (read_committed) against its tables too
        start_file = (warehouse_dir.parent / RESULTS_START_FILE
                      if warehouse_dir is not None else None)
        if warehouse_dir is not None and start_file is not None and start_file.is_file():
            results = audit_results(spark, bootstrap, warehouse_dir,
                                    load_results_start(start_file))
    finally:
        spark.stop()
    text = format_report(report)
    for topic, a in results.items():
        text += (f"\nresult topic {topic} (read_committed) against its table: "
                 f"{a['topic_records']} records for {a['table_rows']} rows, lost {a['lost']}, "
                 f"duplicated {a['duplicated']}")
    print(text, file=sys.stderr if as_json else out, flush=True)
    ok = report.ok and all(a["lost"] == a["duplicated"] == 0 for a in results.values())
    if as_json:
        doc = report.to_json()
        if results:
            doc["results_audit"] = results
        print(json.dumps(doc), file=out, flush=True)
    return 0 if ok else 1


# --- click commands (registered by headrace.cli) --------------------------------------------

import click  # noqa: E402

from headrace.cli_support import (  # noqa: E402
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    bootstrap_option,
    check_reachable,
    fail,
    verbose,
)


def require_spark(command: str) -> None:
    """One line and exit 2 when the spark extra or Java is missing, before anything starts."""
    import importlib
    import shutil

    try:
        for module in ("pyspark", "pyarrow", "pandas"):
            importlib.import_module(module)
    except ImportError as e:
        fail(f"{command} needs the spark extra ({e.name or e} is not installed): install it "
             "with bash scripts/setup.sh spark, or pip install -e '.[spark]' in the headrace "
             "clone", EXIT_USAGE)
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and Path(java_home, "bin", "java").exists()) and not shutil.which("java"):
        fail(f"{command} needs Java 17+ for Spark (no java on PATH, no JAVA_HOME): e.g. "
             "apt-get install openjdk-17-jre-headless, or . scripts/spark-env.sh", EXIT_USAGE)


@click.command("demo")
@click.option("--duration", "duration_s", type=click.FloatRange(min=0, min_open=True),
              default=30.0, show_default=True, help="Seconds the producers run.")
@click.option("--rate", type=click.IntRange(min=1), default=200, show_default=True,
              help="Records per second produced (activity events; sentences are a tenth).")
@bootstrap_option(default=None,
                  help="Use this broker instead of starting an embedded one.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the warehouse, checkpoints and embedded broker go (default: a new "
                   "temporary directory headrace-demo-* under $TMPDIR or /tmp, kept after "
                   "the run and printed at its start and end).")
@click.option("--json", "as_json", is_flag=True,
              help="Print progress to stderr and, as the last line of stdout, one JSON object.")
@click.option("--cluster", is_flag=True,
              help="Run on a local 3-broker cluster (ZooKeeper from Debian's package; topics "
                   "with replication factor 3) and kill -9 one broker mid-run, restarting it "
                   "later.")
def demo_command(duration_s: float, rate: int, bootstrap: str | None, workdir: Path | None,
                 as_json: bool, cluster: bool) -> None:
    """Run the demo pipeline: producers -> headrace -> Spark -> warehouse, then the audit.

    Its topics are headrace-demo-activity and headrace-demo-sentences (results in
    headrace-demo-activity-counts and headrace-demo-word-counts, produced counts in
    __audit); records in them that the demo did not write are skipped and counted."""
    if cluster and bootstrap is not None:
        raise click.UsageError("--cluster starts its own brokers: drop --bootstrap-server")
    require_spark("demo")
    if bootstrap is not None:
        check_reachable(bootstrap)
    try:
        summary = run_demo(duration_s, rate, bootstrap, workdir, as_json, cluster=cluster)
    except (DemoInterrupted, KeyboardInterrupt):
        where = f"; work directory kept: {workdir}" if workdir is not None else ""
        click.echo(f"headrace demo: interrupted: stopped the producers, Spark and the "
                   f"broker{where}", err=True)
        sys.stderr.flush()
        # Spark's JVM and its Python workers are gone; nothing left to wait for
        os._exit(EXIT_INTERRUPTED)
    sys.exit(0 if summary["lost"] == summary["duplicated"] == summary["results_lost"]
             == summary["results_duplicated"] == 0 else 1)


@click.command("audit")
@bootstrap_option()
@click.option("--warehouse", "warehouse_dir", type=click.Path(path_type=Path), default=None,
              help="Count consumed records in this warehouse's landing table (a demo's "
                   "WORKDIR/warehouse), and check the demo's result topics, read with "
                   "read_committed, against its result tables; without it, count the "
                   "records in the topics.")
@click.option("--topics", default=",".join(DEMO_TOPICS), show_default=True,
              help="The demo's topics: read back when no --warehouse is given; records in "
                   "them without the demo's headers are skipped and counted.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON line.")
def audit_command(bootstrap: str, warehouse_dir: Path | None, topics: str,
                  as_json: bool) -> None:
    """Compare produced counts in __audit with consumed counts, per (host, minute).

    Exits 0 when nothing was lost or duplicated, 1 when something was, 5 when the audit
    could not run (an error, not a verdict)."""
    names = tuple(t.strip() for t in topics.split(",") if t.strip())
    if not names:
        raise click.BadParameter("no topic given", param_hint="--topics")
    require_spark("audit")
    check_reachable(bootstrap)
    try:
        rc = run_audit_command(bootstrap, warehouse_dir, names, as_json)
    except KeyboardInterrupt:
        raise
    except Exception as e:
        if verbose():
            import traceback

            traceback.print_exc()
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fail(f"audit could not run (no verdict): {type(e).__name__}: {msg}",
             EXIT_AUDIT_ERROR)
    sys.exit(rc)
