"""The sink's transactional mode when an EXECUTOR dies mid-batch (issue 10: "a replayed
batch (after a driver or executor kill) adds nothing").

One Spark session for the module on a ``local-cluster[2,1,1024]`` master: a standalone
master and two workers inside the driver JVM, each running one executor JVM of its own
(``CoarseGrainedExecutorBackend``) with one core. The sink's task failpoint
(``HEADRACE_SINK_TASK_FAILPOINT``, given to the executors with ``spark.executorEnv``) makes
the first attempt of task partition 0 of the last micro-batch kill -9 its executor JVM and
then its own Python worker, either

- ``committed``: right after the task's Kafka transaction committed, before the task could
  report success. Spark loses the executor and runs the task again (same partition, attempt
  1) on a live executor: the retry's read of the progress topic finds the batch
  committed, and it writes nothing. With the progress check disabled (``done >= batch_id``
  in ``kafka_io.produce_batches_transactional`` made false) this case fails: that task's
  150 rows are in the output twice (1350 records for 1200; checked by hand).
- ``open``: with every row of the task sent in its transaction and the transaction not
  committed. The retry's ``init_transactions`` (same transactional id) fences the dead
  attempt and aborts its transaction; read_committed never shows those rows (they are in
  the log: read_uncommitted sees them), the retry writes them once. The kill is in the
  last batch and the transaction timeout is 10 minutes, so nothing else ends that
  transaction in time: with the attempt number added to the transactional id (no fencing)
  this case fails, read_committed stopping at the dead transaction (1050 records; checked
  by hand).

Either way the output read with read_committed holds every input record exactly once.
The Worker starts a replacement executor; each test first waits for two live executors.
Waits poll with deadlines.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from headrace.spark import local_session  # noqa: E402
from headrace.spark.source import SINK_TASK_FAILPOINT_ENV, _task_failpoint  # noqa: E402
from tests.brokerproc import BrokerProcess, wait_until  # noqa: E402
from tests.clients import read_to_end  # noqa: E402

pytestmark = pytest.mark.timeout(240)

SRC = Path(__file__).resolve().parents[2] / "src"
RECORDS, PER_BATCH = 1200, 300
KILLED_BATCH = RECORDS // PER_BATCH - 1  # the last: no later task of the same id fences it
PREFIXES = {"committed": "executor-kill-committed", "open": "executor-kill-open"}


@pytest.fixture(scope="module")
def spark(broker: BrokerProcess) -> Iterator[Any]:
    """The session; it stops before the broker (no client left retrying a stopped broker)."""
    failpoints = ",".join(f"{prefix}:{when}:{KILLED_BATCH}" for when, prefix in PREFIXES.items())
    session = local_session("headrace-executor-kill", master="local-cluster[2,1,1024]", conf={
        f"spark.executorEnv.{SINK_TASK_FAILPOINT_ENV}": failpoints,
        # executor JVMs inherit the driver JVM's environment: name this checkout explicitly
        "spark.executorEnv.PYTHONPATH": os.pathsep.join(
            [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]),
    })
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()


def executor_pids(app_id: str) -> set[int]:
    """The pids of this application's executor JVMs (from /proc)."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = (Path("/proc") / entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmdline
                and app_id.encode() in cmdline):
            out.add(int(entry))
    return out


def live_executors(spark: Any) -> set[int]:
    """Executor JVM pids, once Spark has two executors registered and two are running."""
    pids = executor_pids(spark.sparkContext.applicationId)
    registered = spark.sparkContext._jsc.sc().getExecutorIds().size()
    return pids if len(pids) == 2 and registered == 2 else set()


def test_task_failpoint_is_inert_unless_its_variable_names_the_task(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SINK_TASK_FAILPOINT_ENV, raising=False)
    assert _task_failpoint("p", 3, 0, 0) is None
    monkeypatch.setenv(SINK_TASK_FAILPOINT_ENV, "a:open:3,p:x:committed:3")
    assert _task_failpoint("a", 3, 0, 0) == "open"
    assert _task_failpoint("p:x", 3, 0, 0) == "committed"
    for args in (("a", 2, 0, 0), ("a", 3, 1, 0), ("a", 3, 0, 1), ("a", None, 0, 0),
                 ("b", 3, 0, 0)):
        assert _task_failpoint(*args) is None, args


def test_executors_import_this_checkout(spark: Any) -> None:
    def where(_: Any) -> Iterator[str]:
        import headrace

        yield headrace.__file__

    files = spark.sparkContext.parallelize(range(2), 2).mapPartitions(where).collect()
    assert files == [str(SRC / "headrace" / "__init__.py")] * 2


@pytest.mark.parametrize("when", ["committed", "open"])
def test_transactional_sink_is_exactly_once_across_an_executor_kill(
    spark: Any, broker: BrokerProcess, topic_name: str, tmp_path: Path, when: str
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    out = f"{topic_name}-out"
    for t in (topic_name, out):
        admin.create_topics([NewTopic(t, 2, 1)])[t].result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for i in range(RECORDS):
        p.produce(topic_name, value=f"value-{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    before = wait_until(lambda: live_executors(spark), timeout_s=90,
                        what="two live executors")

    from pyspark.sql import functions as F

    df = (spark.readStream.format("headrace")
          .option("kafka.bootstrap.servers", broker.bootstrap)
          .option("subscribe", topic_name).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", str(PER_BATCH)).load())
    rows = df.select(F.concat_ws(":", F.col("partition").cast("string"),
                                 F.col("offset").cast("string")).alias("value"))
    q = (rows.writeStream.format("headrace")
         .option("kafka.bootstrap.servers", broker.bootstrap)
         .option("topic", out).option("transactionalIdPrefix", PREFIXES[when])
         # only fencing, not the broker's timeout, can end a dead attempt's transaction
         # within the test
         .option("kafka.transaction.timeout.ms", "600000")
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(150), "the query did not finish"
    finally:
        q.stop()
    assert q.exception() is None, q.exception()
    batches = [pr["batchId"] for pr in q.recentProgress if pr["numInputRows"] > 0]
    assert batches == list(range(RECORDS // PER_BATCH)), batches
    # the failpoint fired: an executor JVM of the ones running at the start is gone
    assert before - executor_pids(spark.sparkContext.applicationId), "no executor died"

    committed = read_to_end(broker.bootstrap, out, 2, "read_committed")
    expected = [f"{part}:{off}".encode() for part in (0, 1) for off in range(RECORDS // 2)]
    assert sorted(committed) == sorted(expected), (len(committed), len(set(committed)))
    uncommitted = read_to_end(broker.bootstrap, out, 2, "read_uncommitted")
    if when == "open":
        # the killed attempt's rows are in the log, aborted: not one of them read_committed
        assert len(uncommitted) > len(committed)
        assert set(uncommitted) == set(committed)
    else:
        # the retry wrote nothing (and nothing was aborted)
        assert sorted(uncommitted) == sorted(committed)
