"""Helpers of the Spark integration tests (``tests/integration/test_spark*.py``): topics,
records produced with keys, values and headers derived from their sequence number, streams
through the ``headrace`` source, warehouse tables, and a group's committed offsets. Import
only where pyspark is installed (the modules skip first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from headrace.spark import warehouse


def create_topic(bootstrap: str, topic: str, partitions: int,
                 config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic].result(15)


def produce(bootstrap: str, topic: str, n: int, partitions: int, start: int = 0,
            partition: int | None = None) -> list[tuple[int, bytes, bytes]]:
    """``n`` records with keys/values/headers derived from their sequence number; returns
    (partition, key, value) in produce order."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    sent = []
    for i in range(start, start + n):
        part = partition if partition is not None else i % partitions
        key, value = f"k{i}".encode(), f"value-{i}".encode() * 3
        while True:
            try:
                p.produce(topic, key=key, value=value, partition=part,
                          headers=[("seq", str(i).encode()), ("empty", b"")])
                break
            except BufferError:
                p.poll(0.05)
        sent.append((part, key, value))
    assert p.flush(30) == 0
    return sent


def by_partition(sent: list[tuple[int, bytes, bytes]]) -> dict[int, list[tuple[bytes, bytes]]]:
    out: dict[int, list[tuple[bytes, bytes]]] = {}
    for part, key, value in sent:
        out.setdefault(part, []).append((key, value))
    return out


def rows_by_partition(rows: list[Any]) -> dict[int, list[tuple[bytes, bytes]]]:
    """Rows sorted by offset per partition, after checking offsets are 0..n-1 exactly once."""
    out: dict[int, list[tuple[bytes, bytes]]] = {}
    for part in sorted({r["partition"] for r in rows}):
        mine = sorted((r for r in rows if r["partition"] == part), key=lambda r: r["offset"])
        assert [r["offset"] for r in mine] == list(range(len(mine))), f"partition {part}"
        out[part] = [(bytes(r["key"]), bytes(r["value"])) for r in mine]
    return out


def stream(spark: Any, bootstrap: str, topic: str, **options: str) -> Any:
    reader = (spark.readStream.format("headrace")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def table_rows(spark: Any, table: Path) -> list[Any]:
    df = warehouse.read_table(spark, table)
    return [] if df is None else df.collect()


def to_table(table: Path) -> Any:
    def sink(df: Any, batch_id: int) -> None:
        warehouse.write_batch(df.select("topic", "partition", "offset", "key", "value"),
                              batch_id, table)
    return sink


def committed(bootstrap: str, group: str, tps: list[tuple[str, int]]) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(t, p) for t, p in tps], timeout=10)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()

