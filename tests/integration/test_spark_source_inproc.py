"""The Spark source's work without Spark (R-SPARK-1, R-SPARK-2): the offsets a micro-batch
plans (``headrace.spark.offsets``: maxOffsetsPerTrigger, availableNow's target, ranges split
for minPartitions) and the records its tasks read (``headrace.spark.kafka_io.read_range``,
both readers: the wire reader and confluent-kafka's) against an in-process broker. Fast twin
of tests/integration/test_spark.py's stream and batch reads, which run a real Spark.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from headrace.spark import kafka_io
from headrace.spark.offsets import plan_end, plan_ranges
from tests.clients import create_topic
from tests.inproc import InProcessBroker

PARTITIONS = 3
PER_PARTITION = (40, 7, 0)  # one partition empty


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("source")) as b:
        yield b
        kafka_io.close_all()  # its cached clients, before their broker stops


@pytest.fixture(scope="module")
def topic(broker: InProcessBroker) -> str:
    name = f"src-{uuid.uuid4().hex[:6]}"
    create_topic("confluent", broker.bootstrap, name, PARTITIONS)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2})
    for part, n in enumerate(PER_PARTITION):
        for i in range(n):
            p.produce(name, key=b"k%d" % i, value=b"p%d-%d" % (part, i), partition=part,
                      headers=[("h", b"%d" % i)], timestamp=1_700_000_000_000 + i)
    assert p.flush(30) == 0
    return name


@pytest.mark.parametrize("reader", kafka_io.READERS)
def test_micro_batches_read_every_record_once_in_order(broker: InProcessBroker, topic: str,
                                                       reader: str) -> None:
    config = {"bootstrap.servers": broker.bootstrap}
    tps = [(topic, p) for p in range(PARTITIONS)]
    earliest = kafka_io.list_offsets(config, tps, "earliest", 30)
    target = kafka_io.list_offsets(config, tps, "latest", 30)  # availableNow's end
    assert target == {(topic, p): n for p, n in enumerate(PER_PARTITION)}
    settings = kafka_io.ReadSettings(tuple(config.items()), include_headers=True,
                                     fail_on_data_loss=True, poll_timeout_ms=10_000,
                                     batch_rows=8, reader=reader)
    start = dict(earliest)
    rows: list[dict[str, object]] = []
    batches = 0
    while start != target:
        plan = plan_end(start, tps, earliest, target, max_records=10, target=target)
        assert not plan.data_loss
        assert sum(plan.end[tp] - start[tp] for tp in tps) <= 10 + PARTITIONS
        for r in plan_ranges(start, plan.end, min_partitions=4):
            got = [row for b in kafka_io.read_range(r, settings) for row in b.to_pylist()]
            assert [row["offset"] for row in got] == list(range(r.from_offset, r.until_offset))
            rows += got
        start = plan.end
        batches += 1
    assert batches >= 5  # maxOffsetsPerTrigger split the backlog
    for part, n in enumerate(PER_PARTITION):
        mine = [row for row in rows if row["partition"] == part]
        assert [row["value"] for row in mine] == [b"p%d-%d" % (part, i) for i in range(n)]
        assert [row["key"] for row in mine] == [b"k%d" % i for i in range(n)]
        assert [row["headers"] for row in mine] == [[{"key": "h", "value": b"%d" % i}]
                                                    for i in range(n)]
        assert all(row["topic"] == topic for row in mine)
