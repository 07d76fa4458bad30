"""The three Python Kafka clients behind one small interface, for integration tests.

Each function drives the named client the way its users do (its own admin API, producer
and consumer), so a test parametrised over ``CLIENTS`` checks headrace against all three.
Consumers use ``assign()`` (no group membership) and read from the beginning.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

CLIENTS = ("confluent", "kafka-python", "aiokafka")
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


@dataclass(frozen=True)
class Rec:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int | None = None
    offset: int = -1


# ------------------------------------------------------------------ admin


def create_topic(client: str, bootstrap: str, topic: str, partitions: int,
                 configs: dict[str, str] | None = None) -> None:
    configs = configs or {}
    if client == "confluent":
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        fut = admin.create_topics([NewTopic(topic, partitions, 1, config=configs)])[topic]
        fut.result(15)
    elif client == "kafka-python":
        from kafka.admin import KafkaAdminClient
        from kafka.admin import NewTopic as KNewTopic

        kadmin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
        try:
            kadmin.create_topics([KNewTopic(topic, partitions, 1, topic_configs=configs)])
        finally:
            kadmin.close()
    else:
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.admin import NewTopic as ANewTopic

        async def run() -> None:
            aadmin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await aadmin.start()
            try:
                await aadmin.create_topics([ANewTopic(topic, partitions, 1,
                                                      topic_configs=configs)])
            finally:
                await aadmin.close()

        asyncio.run(run())


# ------------------------------------------------------------------ produce


def produce(client: str, bootstrap: str, topic: str, records: list[Rec], *,
            codec: str = "none", acks: int | str = "all",
            extra: dict[str, Any] | None = None) -> list[tuple[int, int]]:
    """Send ``records`` in order; return (partition, offset) per record (-1 if acks=0)."""
    if client == "confluent":
        return _produce_confluent(bootstrap, topic, records, codec, acks, extra or {})
    if client == "kafka-python":
        return _produce_kafka_python(bootstrap, topic, records, codec, acks, extra or {})
    return asyncio.run(_produce_aiokafka(bootstrap, topic, records, codec, acks, extra or {}))


def _produce_confluent(bootstrap: str, topic: str, records: list[Rec], codec: str,
                       acks: int | str, extra: dict[str, Any]) -> list[tuple[int, int]]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                  "acks": str(acks), "linger.ms": 5, **extra})
    results: list[tuple[int, int] | None] = [None] * len(records)
    errors: list[Any] = []

    def cb(i: int) -> Any:
        def done(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                results[i] = (msg.partition(), msg.offset())
        return done

    for i, r in enumerate(records):
        kw: dict[str, Any] = {"partition": r.partition, "on_delivery": cb(i),
                              "headers": list(r.headers)}
        if r.timestamp is not None:
            kw["timestamp"] = r.timestamp
        while True:
            try:
                p.produce(topic, r.value, r.key, **kw)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(30)
    assert left == 0, f"{left} records not delivered"
    assert not errors, errors
    return [r if r is not None else (-1, -1) for r in results]


def _produce_kafka_python(bootstrap: str, topic: str, records: list[Rec], codec: str,
                          acks: int | str, extra: dict[str, Any]) -> list[tuple[int, int]]:
    from kafka import KafkaProducer

    kacks: int | str = "all" if acks in ("all", -1) else int(acks)
    kw: dict[str, Any] = {"bootstrap_servers": bootstrap, "acks": kacks, "linger_ms": 5,
                          "compression_type": None if codec == "none" else codec, **extra}
    if kacks != "all":
        kw.setdefault("enable_idempotence", False)
    p = KafkaProducer(**kw)
    try:
        futures = [p.send(topic, value=r.value, key=r.key, partition=r.partition,
                          headers=list(r.headers), timestamp_ms=r.timestamp) for r in records]
        p.flush(30)
        out = []
        for f in futures:
            md = f.get(30)
            out.append((md.partition, md.offset))
        return out
    finally:
        p.close(10)


async def _produce_aiokafka(bootstrap: str, topic: str, records: list[Rec], codec: str,
                            acks: int | str, extra: dict[str, Any]) -> list[tuple[int, int]]:
    from aiokafka import AIOKafkaProducer

    aacks: int | str = "all" if acks in ("all", -1) else int(acks)
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=aacks, linger_ms=5,
                         compression_type=None if codec == "none" else codec, **extra)
    await p.start()
    try:
        futs = [await p.send(topic, value=r.value, key=r.key, partition=r.partition,
                             headers=list(r.headers), timestamp_ms=r.timestamp)
                for r in records]
        out = []
        for f in futs:
            md = await asyncio.wait_for(f, 30)
            out.append((-1, -1) if md is None else (md.partition, md.offset))  # None: acks=0
        return out
    finally:
        await p.stop()


# ------------------------------------------------------------------ consume


def consume(client: str, bootstrap: str, topic: str, partitions: list[int], count: int,
            timeout_s: float = 30.0, extra: dict[str, Any] | None = None) -> list[Rec]:
    """Read ``count`` records from the beginning of ``partitions`` (assign mode)."""
    if client == "confluent":
        return _consume_confluent(bootstrap, topic, partitions, count, timeout_s, extra or {})
    if client == "kafka-python":
        return _consume_kafka_python(bootstrap, topic, partitions, count, timeout_s,
                                     extra or {})
    return asyncio.run(_consume_aiokafka(bootstrap, topic, partitions, count, timeout_s,
                                         extra or {}))


def _consume_confluent(bootstrap: str, topic: str, partitions: list[int], count: int,
                       timeout_s: float, extra: dict[str, Any]) -> list[Rec]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"assign-{topic}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", **extra})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    out: list[Rec] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < count and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is not None:
                    raise AssertionError(f"consume error: {m.error()}")
                out.append(Rec(m.partition(), m.key(), m.value(),
                               tuple((k, v) for k, v in (m.headers() or [])),
                               m.timestamp()[1], m.offset()))
    finally:
        c.close()
    return out


def _consume_kafka_python(bootstrap: str, topic: str, partitions: list[int], count: int,
                          timeout_s: float, extra: dict[str, Any]) -> list[Rec]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", **extra)
    c.assign([TopicPartition(topic, p) for p in partitions])
    out: list[Rec] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < count and time.monotonic() < deadline:
            for tp, msgs in c.poll(500).items():
                for m in msgs:
                    out.append(Rec(tp.partition, m.key, m.value, tuple(m.headers or ()),
                                   m.timestamp, m.offset))
    finally:
        c.close()
    return out


async def _consume_aiokafka(bootstrap: str, topic: str, partitions: list[int], count: int,
                            timeout_s: float, extra: dict[str, Any]) -> list[Rec]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="earliest", **extra)
    await c.start()
    c.assign([TopicPartition(topic, p) for p in partitions])
    out: list[Rec] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < count and time.monotonic() < deadline:
            batch = await c.getmany(timeout_ms=500)
            for tp, msgs in batch.items():
                for m in msgs:
                    out.append(Rec(tp.partition, m.key, m.value, tuple(m.headers or ()),
                                   m.timestamp, m.offset))
    finally:
        await c.stop()
    return out


def by_partition(recs: list[Rec]) -> dict[int, list[Rec]]:
    out: dict[int, list[Rec]] = {}
    for r in recs:
        out.setdefault(r.partition, []).append(r)
    return out


def read_to_end(bootstrap: str, topic: str, partitions: int, isolation: str,
                timeout_s: float = 60.0) -> list[bytes]:
    """Every value of ``topic`` from offset 0 up to its end for ``isolation``
    (read_committed stops at the last stable offset), with confluent-kafka."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                  "isolation.level": isolation, "enable.partition.eof": True,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(eof) < partitions:
            assert time.monotonic() < deadline, f"reading {topic}: end of {sorted(eof)} only"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    continue
                if m.error().fatal():
                    raise AssertionError(str(m.error()))
                continue  # transient (a broker restarting): the deadline bounds it
            eof.discard(m.partition())
            out.append(m.value())
    finally:
        c.close()
    return out
