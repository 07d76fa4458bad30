"""A compacted topic on a real broker (R-LOG-6): after the cleaner runs, a consumer reading
from the beginning sees only the latest value per key in the cleaned part, and the latest
value of every key."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from tests.brokerproc import BrokerProcess, wait_until
from tests.clients import create_topic
from tests.inproc import InProcessBroker

KEYS = 8
UPDATES = 3000


@pytest.fixture(scope="module")
def compacting_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data = tmp_path_factory.mktemp("broker")
    with InProcessBroker(data, {"num.partitions": "1",
                                "log.retention.check.interval.ms": "200"}) as b:
        yield b


def _log_files(broker: BrokerProcess, topic: str) -> list[Path]:
    return sorted((broker.data_dir / f"{topic}-0").glob("*.log"))


def _consume_all(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "compaction-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, low)])
        out: list[tuple[int, bytes, bytes]] = []
        deadline = time.monotonic() + 30
        while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            out.append((msg.offset(), msg.key(), msg.value()))
        assert out and out[-1][0] == high - 1, "did not consume up to the high watermark"
        return out
    finally:
        consumer.close()


def test_compacted_topic_keeps_latest_value_per_key(compacting_broker: BrokerProcess,
                                                    topic_name: str) -> None:
    bs = compacting_broker.bootstrap
    create_topic("confluent", bs, topic_name, 1,
                 {"cleanup.policy": "compact", "segment.bytes": "4096"})
    producer = Producer({"bootstrap.servers": bs, "linger.ms": 5, "batch.num.messages": 20})
    latest: dict[bytes, bytes] = {}
    for i in range(UPDATES):
        # the second half rewrites only half of the keys: the others' latest values stay
        # in segments that get cleaned
        key = b"key-%d" % (i % (KEYS if i < UPDATES // 2 else KEYS // 2))
        value = b"value-%06d" % i
        producer.produce(topic_name, key=key, value=value, partition=0)
        latest[key] = value
        producer.poll(0)
    assert producer.flush(30) == 0

    def compacted() -> tuple[list[tuple[int, bytes, bytes]], int] | None:
        """The records and the active segment's base once every closed segment holds
        one record per key at most."""
        active_base = int(_log_files(compacting_broker, topic_name)[-1].stem)
        records = _consume_all(bs, topic_name)
        closed_keys = [k for o, k, _ in records if o < active_base]
        return (records, active_base) if len(set(closed_keys)) == len(closed_keys) else None

    records, active_base = wait_until(compacted, timeout_s=30, interval_s=0.2,
                                      what="the closed segments to be compacted")
    assert len(records) < UPDATES // 4
    offsets = [r[0] for r in records]
    assert offsets == sorted(set(offsets))
    assert {k: v for _, k, v in records} == latest  # every key's latest value, read last
    cleaned = {k: v for o, k, v in records if o < active_base}
    assert set(cleaned) >= {b"key-%d" % k for k in range(KEYS // 2, KEYS)}
    assert all(latest[k] == v for k, v in cleaned.items())
    assert active_base > 0 and all(o >= active_base for o, k, _ in records
                                   if k not in cleaned)


def test_compacted_topic_refuses_keyless_records(compacting_broker: BrokerProcess,
                                                 topic_name: str) -> None:
    """R-LOG-6, R-PROTO-4: a compacted topic refuses a record without a key with
    INVALID_RECORD (Kafka's rule), as a delivery error to the producer; keyed records before
    and after it are stored and read back, nothing else is."""
    bs = compacting_broker.bootstrap
    create_topic("confluent", bs, topic_name, 1, {"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": bs, "linger.ms": 0, "retries": 0})
    reports: list[tuple[bytes | None, str | None]] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        reports.append((msg.key(), None if err is None else err.name()))

    producer.produce(topic_name, key=b"k1", value=b"one", on_delivery=on_delivery)
    producer.flush(10)
    producer.produce(topic_name, value=b"no key", on_delivery=on_delivery)
    producer.flush(10)
    producer.produce(topic_name, key=b"k2", value=b"two", on_delivery=on_delivery)
    assert producer.flush(10) == 0
    assert reports == [(b"k1", None), (None, "INVALID_RECORD"), (b"k2", None)]
    assert [(k, v) for _, k, v in _consume_all(bs, topic_name)] == [(b"k1", b"one"),
                                                                   (b"k2", b"two")]
