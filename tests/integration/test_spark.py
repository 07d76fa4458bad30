"""The ``headrace`` PySpark data source against a real broker and a real local Spark.

R-SPARK-1 (source/sink, Kafka connector schema and options), R-SPARK-2 (checkpointed offsets,
group commits, replay without loss, a broker restarted under a stream, retention under a
read). One ``local[2]`` SparkSession for the module; a broker process per module (conftest)
plus private ones for the broker-restart and retention tests. Waits poll with deadlines.

The Spark tests are split by what they start, so that pytest-xdist can put them on both
workers (a module is a unit, tests/conftest.py): this module; ``test_spark_driver_kill.py``
(a job's process group killed with -9, restarted from its checkpoint);
``test_spark_demo_kill.py`` (the demo killed with -9 and rerun); ``test_spark_demo.py``
(demo runs of their own: a broker other programs used, Ctrl-C, invalid input).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewPartitions  # noqa: E402

from headrace.spark import local_session, warehouse  # noqa: E402
from tests.brokerproc import BrokerProcess, wait_until  # noqa: E402
from tests.readme import readme_block  # noqa: E402
from tests.spark_jobs import (  # noqa: E402
    by_partition,
    committed,
    create_topic,
    produce,
    rows_by_partition,
    stream,
    table_rows,
    to_table,
)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = local_session("headrace-tests")
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()


# --- the README's pipeline -----------------------------------------------------------------


def test_readme_spark_pipeline_as_written(spark: Any, broker: BrokerProcess,
                                          tmp_path: Path) -> None:
    """The README's pasteable pipeline (issue 13, item 4), run in this module's session with
    the broker's address and its relative paths under tmp_path: the latest count per user in
    its Parquet table and in its transactional topic equal the greetings produced."""
    code = (readme_block("spark-pipeline").replace("127.0.0.1:9092", broker.bootstrap)
            .replace('"warehouse/', f'"{tmp_path}/warehouse/')
            .replace('"checkpoints/', f'"{tmp_path}/checkpoints/'))
    create_topic(broker.bootstrap, "greetings", 3)
    sent = {"alice": 3, "bob": 2, "carol": 1}
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for user, n in sent.items():
        for i in range(n):
            p.produce("greetings", key=user.encode(), value=f"hello {i}".encode())
    assert p.flush(30) == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md:spark-pipeline", "exec"), {})
    printed = re.findall(r"Row\(user='(\w+)', max\(count\)=(\d+)\)", out.getvalue())
    assert {u: int(n) for u, n in printed} == sent, out.getvalue()
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"r-{uuid.uuid4()}",
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    parts = c.list_topics("greetings-per-user", timeout=10).topics["greetings-per-user"]
    c.assign([TopicPartition("greetings-per-user", q, 0) for q in parts.partitions])
    latest: dict[str, int] = {}
    eof: set[int] = set()

    def drained() -> bool:
        for m in c.consume(100, 0.5):
            if m.error() is None:
                latest[m.key().decode()] = max(latest.get(m.key().decode(), 0),
                                               int(m.value()))
            elif m.error().code() == KafkaError._PARTITION_EOF:
                eof.add(m.partition())
        return len(eof) == len(parts.partitions)

    wait_until(drained, 30, 0, "the result topic's end")
    c.close()
    assert latest == sent


# --- the source --------------------------------------------------------------------------


def test_stream_reads_exactly_what_was_produced_across_micro_batches(
    spark: Any, broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    """R-SPARK-1, R-SPARK-2: maxOffsetsPerTrigger splits the backlog into many batches;
    availableNow terminates; every record once, content and per-partition order intact;
    the consumer group shows the committed end offsets."""
    create_topic(broker.bootstrap, topic_name, 3)
    sent = produce(broker.bootstrap, topic_name, 3000, 3)
    df = stream(spark, broker.bootstrap, topic_name, maxOffsetsPerTrigger="400",
                includeHeaders="true", **{"kafka.group.id": f"g-{topic_name}"})
    name = topic_name.replace("-", "_")
    q = (df.writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(180), "availableNow query did not terminate"
    assert q.exception() is None
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 3000 // 400
    assert max(p["numInputRows"] for p in batches) <= 400 + 3
    rows = spark.sql(f"select * from {name}").collect()
    assert len(rows) == 3000
    assert rows_by_partition(rows) == by_partition(sent)
    first = min(rows, key=lambda r: (r["partition"], r["offset"]))
    assert first["topic"] == topic_name and first["timestampType"] == 0
    assert [(h["key"], bytes(h["value"])) for h in first["headers"]] == [
        ("seq", b"0"), ("empty", b"")]
    assert abs(first["timestamp"].timestamp() - time.time()) < 600
    # the last batch's end is committed when the next batch is planned or the query stops
    # its source; availableNow's final commit comes from commit(): poll for it.
    wait_until(lambda: committed(broker.bootstrap, f"g-{topic_name}",
                                 [(topic_name, p) for p in range(3)]) == {0: 1000, 1: 1000,
                                                                          2: 1000},
               timeout_s=30, what="group commit of the final offsets")


def test_stream_picks_up_new_records_and_new_partitions(
    spark: Any, broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, topic_name, 1)
    sent = produce(broker.bootstrap, topic_name, 100, 1)
    name = topic_name.replace("-", "_")
    q = (stream(spark, broker.bootstrap, topic_name).writeStream.format("memory")
         .queryName(name).option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="500 milliseconds").start())
    try:
        def count() -> int:
            if q.exception() is not None:
                raise AssertionError(q.exception())
            return int(spark.sql(f"select count(*) from {name}").collect()[0][0])
        wait_until(lambda: count() == 100, timeout_s=120, what="first 100 records")
        sent += produce(broker.bootstrap, topic_name, 100, 1, start=100)
        wait_until(lambda: count() == 200, timeout_s=60, what="200 records")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_partitions([NewPartitions(topic_name, 2)])[topic_name].result(15)
        sent += produce(broker.bootstrap, topic_name, 50, 2, start=200, partition=1)
        wait_until(lambda: count() == 250, timeout_s=60, what="records of the new partition")
    finally:
        q.stop()
    assert rows_by_partition(spark.sql(f"select * from {name}").collect()) == by_partition(sent)


def test_batch_read_with_starting_and_ending_offsets(
    spark: Any, broker: BrokerProcess, topic_name: str
) -> None:
    create_topic(broker.bootstrap, topic_name, 2)
    produce(broker.bootstrap, topic_name, 400, 2)
    base = (spark.read.format("headrace").option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", topic_name))
    assert base.load().count() == 400
    some = (base.option("startingOffsets", json.dumps({topic_name: {"0": 10, "1": -2}}))
            .option("endingOffsets", json.dumps({topic_name: {"0": 50, "1": -1}}))
            .option("minPartitions", "5").load())
    rows = some.select("partition", "offset").collect()
    assert sorted((r[0], r[1]) for r in rows) == (
        [(0, o) for o in range(10, 50)] + [(1, o) for o in range(200)])
    assert some.rdd.getNumPartitions() >= 5
    with pytest.raises(Exception, match="subscribe"):
        spark.read.format("headrace").option("kafka.bootstrap.servers", broker.bootstrap).load() \
            .count()


# --- the sink ----------------------------------------------------------------------------


def test_sink_batch_and_stream_write_keys_values_headers(
    spark: Any, broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, topic_name, 2)
    rows = [(f"k{i}", f"v{i}".encode(), [("h", f"{i}".encode())], i % 2) for i in range(200)]
    df = spark.createDataFrame(
        rows, "key string, value binary, headers array<struct<key:string,value:binary>>, "
              "partition int")
    (df.write.format("headrace").option("kafka.bootstrap.servers", broker.bootstrap)
     .option("topic", topic_name).mode("append").save())
    # streaming: copy the topic to a second topic through the stream writer
    out_topic = topic_name + "-out"
    create_topic(broker.bootstrap, out_topic, 1)
    q = (stream(spark, broker.bootstrap, topic_name, includeHeaders="true")
         .selectExpr("key", "value", "headers", "concat(topic, '-out') as topic")
         .writeStream.format("headrace").option("kafka.bootstrap.servers", broker.bootstrap)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True)
         .start())
    assert q.awaitTermination(120)
    assert q.exception() is None
    for topic, parts in ((topic_name, 2), (out_topic, 1)):
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"read-{topic}",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.assign([TopicPartition(topic, p, 0) for p in range(parts)])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < 200 and time.monotonic() < deadline:
            got += [m for m in c.consume(200, 1.0) if m.error() is None]
        c.close()
        assert sorted((m.key(), m.value(), tuple(m.headers() or ())) for m in got) == sorted(
            (k.encode(), v, tuple(h)) for k, v, h, _ in rows)
        if topic == topic_name:
            assert {int(m.key()[1:]) % 2 for m in got if m.partition() == 1} == {1}


def test_sink_requires_a_value_column(spark: Any, broker: BrokerProcess) -> None:
    df = spark.createDataFrame([("k",)], "key string")
    with pytest.raises(Exception, match="value"):
        (df.write.format("headrace").option("kafka.bootstrap.servers", broker.bootstrap)
         .option("topic", "x").mode("append").save())


# --- exactly-once table, restarts, kills ---------------------------------------------------


def test_restart_from_checkpoint_no_loss_no_duplicates(
    spark: Any, broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, topic_name, 2)
    table, ckpt = tmp_path / "table", tmp_path / "ckpt"
    sent = produce(broker.bootstrap, topic_name, 600, 2)
    for more in (300, 0):
        q = (stream(spark, broker.bootstrap, topic_name, maxOffsetsPerTrigger="250")
             .writeStream.foreachBatch(to_table(table)).option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
        assert q.awaitTermination(120)
        assert q.exception() is None
        if more:
            sent += produce(broker.bootstrap, topic_name, more, 2, start=len(sent))
    # replay of a committed batch id writes nothing
    last = max(int(p.name.split("=")[1]) for p in table.glob("batch_id=*"))
    assert not warehouse.write_batch(spark.range(1), last, table)
    assert rows_by_partition(table_rows(spark, table)) == by_partition(sent)




def test_broker_restart_mid_stream_recovers_without_loss(
    spark: Any, tmp_path: Path
) -> None:
    topic = "restarted"
    with BrokerProcess(tmp_path / "data", {"num.partitions": "2"}) as b:
        create_topic(b.bootstrap, topic, 2)
        sent = produce(b.bootstrap, topic, 500, 2)
        table = tmp_path / "table"
        q = (stream(spark, b.bootstrap, topic, maxOffsetsPerTrigger="200")
             .writeStream.foreachBatch(to_table(table))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="200 milliseconds").start())
        try:
            def landed() -> int:
                if q.exception() is not None:
                    raise AssertionError(f"query failed: {q.exception()}")
                return len(table_rows(spark, table))
            wait_until(lambda: landed() >= 200, timeout_s=120, what="first batches")
            b.restart(graceful=False)  # kill -9 the broker, start it on the same port
            sent += produce(b.bootstrap, topic, 500, 2, start=500)
            wait_until(lambda: landed() == 1000, timeout_s=120, what="all 1000 records")
        finally:
            q.stop()
        assert rows_by_partition(table_rows(spark, table)) == by_partition(sent)


def test_fail_on_data_loss_both_ways(spark: Any, tmp_path: Path) -> None:
    """Retention deletes records a read still wants: failOnDataLoss=true fails with a clear
    message, false skips to the log start and reads the rest."""
    topic = "retained"
    with BrokerProcess(tmp_path / "data", {"log.retention.check.interval.ms": "200"}) as b:
        create_topic(b.bootstrap, topic, 1, {"segment.bytes": "2048", "retention.bytes": "4096"})
        for start in range(0, 300, 10):  # small batches: many 2 KB segments
            produce(b.bootstrap, topic, 10, 1, start=start)

        def log_start() -> int:
            c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "w"})
            try:
                return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[0])
            finally:
                c.close()
        start = wait_until(log_start, timeout_s=30, what="retention to delete old segments")

        def read(fail: str) -> Any:
            return (spark.read.format("headrace").option("kafka.bootstrap.servers", b.bootstrap)
                    .option("subscribe", topic).option("failOnDataLoss", fail)
                    .option("startingOffsets", json.dumps({topic: {"0": 0}})).load())
        with pytest.raises(Exception, match="data loss"):
            read("true").count()
        offsets = [r[0] for r in read("false").select("offset").collect()]
        assert offsets == list(range(start, 300))

