"""A Spark job's driver killed with -9 mid-stream, restarted from its checkpoint (R-SPARK-2;
issue 10 item 3 for the sink's transactional mode).

The job runs as a process of its own, in its own process group (Python driver, Spark's JVM,
its Python workers), and the whole group is killed with -9: on an event, never after a
time (the third ``committed batch`` line it prints; the sink's failpoint). The restart is
the same query, from the same checkpoint, in this module's ``local[2]`` session (one JVM
for the module, not a second job process per test): a driver that never saw the killed
one's memory, only its checkpoint, its table and the broker's log. Waits poll with
deadlines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")

from pyspark.sql import functions as F  # noqa: E402

from headrace.spark import local_session  # noqa: E402
from tests.brokerproc import BrokerProcess  # noqa: E402
from tests.clients import read_to_end  # noqa: E402
from tests.spark_jobs import (  # noqa: E402
    by_partition,
    create_topic,
    produce,
    rows_by_partition,
    stream,
    table_rows,
    to_table,
)

pytestmark = pytest.mark.timeout(600)

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = local_session("headrace-driver-kill-tests")
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()


def job_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])}


# the killed job: processing-time trigger "0 seconds" (one micro-batch after another); the
# restart in this module's session runs the same query with availableNow
JOB = """
import sys
from headrace.spark import local_session, warehouse
bootstrap, topic, table, ckpt = sys.argv[1:5]
spark = local_session("killed-job")
df = (spark.readStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
      .option("subscribe", topic).option("startingOffsets", "earliest")
      .option("maxOffsetsPerTrigger", "150").load())
def sink(batch, batch_id):
    warehouse.write_batch(batch.select("topic", "partition", "offset", "key", "value"),
                          batch_id, table)
    print(f"committed batch {batch_id}", flush=True)
w = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt)
w.trigger(processingTime="0 seconds").start().awaitTermination()
"""
JOB_RECORDS = 1200  # 8 micro-batches of 150: killed after the third, 5 or fewer left


def test_kill_9_the_driver_mid_stream_then_restart(
    spark: Any, broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    """The job runs in its own process group (Python driver, JVM, Python workers); SIGKILL
    to all of them mid-stream (once it printed its third committed batch: the next one is
    under way), then a restart from the checkpoint: the table is the input, every record
    once, in order per partition."""
    create_topic(broker.bootstrap, topic_name, 2)
    sent = produce(broker.bootstrap, topic_name, JOB_RECORDS, 2)
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    table, ckpt = tmp_path / "table", tmp_path / "ckpt"
    job = subprocess.Popen(
        [sys.executable, str(script), broker.bootstrap, topic_name, str(table), str(ckpt)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
        env=job_env())
    try:
        assert job.stdout is not None
        deadline = time.monotonic() + 300
        committed_batches = 0
        for line in job.stdout:
            committed_batches += line.startswith("committed batch")
            if committed_batches >= 3 or time.monotonic() > deadline:
                break
        assert committed_batches >= 3, "the job did not commit 3 batches in time"
        os.killpg(job.pid, signal.SIGKILL)  # mid-stream: the next batch is under way
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    assert job.returncode == -signal.SIGKILL
    partial = len(table_rows(spark, table))
    assert 0 < partial < JOB_RECORDS
    q = (stream(spark, broker.bootstrap, topic_name, maxOffsetsPerTrigger="150")
         .writeStream.foreachBatch(to_table(table)).option("checkpointLocation", str(ckpt))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(300), "the restarted query did not finish"
    assert q.exception() is None
    assert rows_by_partition(table_rows(spark, table)) == by_partition(sent)


# the killed job: the sink's transactional mode; its failpoint
# (HEADRACE_SINK_FAILPOINT_BATCH) kills the job's process group right after that batch's
# tasks committed their transactions, before Spark's checkpoint recorded the batch
TXN_JOB = """
import os
import sys
from pyspark.sql import functions as F
from headrace.spark import local_session
bootstrap, topic, out, ckpt, prefix = sys.argv[1:6]
os.environ["HEADRACE_SINK_FAILPOINT_PGID"] = str(os.getpgid(0))  # the failpoint kills all
spark = local_session("txn-sink-job")
df = (spark.readStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
      .option("subscribe", topic).option("startingOffsets", "earliest")
      .option("maxOffsetsPerTrigger", "300").load())
rows = df.select(F.concat_ws(":", F.col("partition").cast("string"),
                             F.col("offset").cast("string")).alias("value"))
(rows.writeStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
 .option("topic", out).option("transactionalIdPrefix", prefix)
 .option("checkpointLocation", ckpt).trigger(processingTime="0 seconds").start()
 .awaitTermination())
"""
TXN_RECORDS, TXN_KILLED_BATCH = 1500, 2  # ~5 micro-batches of 300: killed after the third


def _read_committed(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    return read_to_end(bootstrap, topic, partitions, "read_committed")


def test_transactional_sink_is_exactly_once_across_a_driver_kill(
    spark: Any, broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    """Issue 10 item 3: the sink's transactional mode. The whole job (driver, JVM, Python
    workers) is killed with -9 right after a micro-batch's tasks committed their
    transactions and before Spark recorded the batch in its checkpoint, the one replay a
    plain sink duplicates; restarted from the checkpoint, the replayed batch writes
    nothing, and the output read with read_committed holds every input record once."""
    create_topic(broker.bootstrap, topic_name, 2)
    sent = produce(broker.bootstrap, topic_name, TXN_RECORDS, 2)
    out = f"{topic_name}-out"
    create_topic(broker.bootstrap, out, 2)
    script = tmp_path / "txn_job.py"
    script.write_text(textwrap.dedent(TXN_JOB))
    ckpt, prefix = tmp_path / "ckpt", f"sink-{topic_name}"
    killed = subprocess.run(
        [sys.executable, str(script), broker.bootstrap, topic_name, out, str(ckpt), prefix],
        capture_output=True, text=True, timeout=400, start_new_session=True,
        env={**job_env(), "HEADRACE_SINK_FAILPOINT_BATCH": str(TXN_KILLED_BATCH)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # the killed batch is in the output and not in the checkpoint: the restart replays it
    assert not (ckpt / "commits" / str(TXN_KILLED_BATCH)).exists()
    partial = _read_committed(broker.bootstrap, out, 2)
    assert 0 < len(partial) < len(sent), len(partial)
    rows = stream(spark, broker.bootstrap, topic_name, maxOffsetsPerTrigger="300").select(
        F.concat_ws(":", F.col("partition").cast("string"),
                    F.col("offset").cast("string")).alias("value"))
    q = (rows.writeStream.format("headrace").option("kafka.bootstrap.servers", broker.bootstrap)
         .option("topic", out).option("transactionalIdPrefix", prefix)
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    assert q.awaitTermination(300), "the restarted query did not finish"
    assert q.exception() is None
    got = _read_committed(broker.bootstrap, out, 2)
    expected = [f"{part}:{off}".encode() for part in (0, 1)
                for off in range(sum(1 for s in sent if s[0] == part))]
    assert sorted(got) == sorted(expected), (len(got), len(set(got)), len(expected))
