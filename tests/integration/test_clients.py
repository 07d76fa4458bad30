"""Each real client produces and consumes through headrace unchanged (issue 2; R-LOG-1,
R-LOG-3, R-PROTO-3, R-PROTO-4): keys, headers, timestamps, every codec, 8 partitions, order
per partition, acks 0/1/all, a record near message.max.bytes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.brokerproc import BrokerProcess
from tests.clients import CLIENTS, CODECS, Rec, by_partition, consume, create_topic, produce
from tests.inproc import InProcessBroker


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """The module's broker in process (tests/conftest.py's ``broker`` is a process):
    nothing here kills, pauses or restarts it."""
    with InProcessBroker(tmp_path_factory.mktemp("broker"), {"num.partitions": "1"}) as b:
        yield b

PARTITIONS = 8
PER_PARTITION = 40
BASE_TS = 1_700_000_000_000


def _records(tag: str) -> list[Rec]:
    out = []
    for i in range(PER_PARTITION):
        for p in range(PARTITIONS):
            out.append(Rec(
                partition=p,
                key=f"k{p}-{i}".encode(),
                value=f"{tag} value {p}/{i} ".encode() * (1 + i % 5),
                headers=(("seq", str(i).encode()), ("src", tag.encode())),
                timestamp=BASE_TS + i * 1000 + p,
            ))
    return out


def _check_round_trip(sent: list[Rec], got: list[Rec], offsets: list[tuple[int, int]] | None
                      ) -> None:
    assert len(got) == len(sent)
    want, have = by_partition(sent), by_partition(got)
    assert set(have) == set(range(PARTITIONS))
    for p in range(PARTITIONS):
        w, h = want[p], have[p]
        assert [r.offset for r in h] == list(range(len(w))), f"partition {p}: offsets"
        assert [(r.key, r.value, r.headers, r.timestamp) for r in h] == [
            (r.key, r.value, r.headers, r.timestamp) for r in w], f"partition {p}: content"
    if offsets is not None:
        per_p: dict[int, list[int]] = {}
        for part, off in offsets:
            per_p.setdefault(part, []).append(off)
        assert all(v == list(range(len(v))) for v in per_p.values())


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", CLIENTS)
def test_round_trip_every_codec(broker: BrokerProcess, topic_name: str, client: str,
                                codec: str) -> None:
    create_topic(client, broker.bootstrap, topic_name, PARTITIONS)
    sent = _records(f"{client}/{codec}")
    offsets = produce(client, broker.bootstrap, topic_name, sent, codec=codec, acks="all")
    _check_round_trip(sent, consume(client, broker.bootstrap, topic_name,
                                    list(range(PARTITIONS)), len(sent)), offsets)


@pytest.mark.parametrize("acks", [0, 1, "all"])
@pytest.mark.parametrize("client", CLIENTS)
def test_acks_levels(broker: BrokerProcess, topic_name: str, client: str,
                     acks: int | str) -> None:
    """R-PROTO-3: acks=0 gets no response but is still stored; 1 and all are answered."""
    create_topic("confluent", broker.bootstrap, topic_name, PARTITIONS)
    sent = _records(f"acks={acks}")
    produce(client, broker.bootstrap, topic_name, sent, acks=acks)
    got = consume("confluent", broker.bootstrap, topic_name, list(range(PARTITIONS)), len(sent))
    _check_round_trip(sent, got, None)


@pytest.mark.parametrize("client", CLIENTS)
def test_record_near_message_max_bytes(broker: BrokerProcess, topic_name: str,
                                       client: str) -> None:
    """A single record just under the broker's 1 MiB message.max.bytes goes through."""
    create_topic("confluent", broker.bootstrap, topic_name, 1)
    value = bytes(range(256)) * ((1_048_588 - 200) // 256)
    extra = ({"message.max.bytes": 1_100_000} if client == "confluent"
             else {"max_request_size": 1_100_000})
    produce(client, broker.bootstrap, topic_name, [Rec(0, b"big", value)], extra=extra)
    cextra = ({"fetch.max.bytes": 2_000_000, "max.partition.fetch.bytes": 2_000_000}
              if client == "confluent" else {"max_partition_fetch_bytes": 2_000_000})
    got = consume(client, broker.bootstrap, topic_name, [0], 1, extra=cextra)
    assert len(got) == 1 and got[0].value == value


def test_batch_over_message_max_bytes_is_rejected(broker: BrokerProcess, topic_name: str) -> None:
    """MESSAGE_TOO_LARGE from the broker (the topic's max.message.bytes), and the partition
    keeps working."""
    from confluent_kafka import KafkaError, Producer

    create_topic("confluent", broker.bootstrap, topic_name, 1,
                 {"max.message.bytes": "10000"})
    # the client's own limit is far above the record: only the broker can refuse it
    p = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 1_000_000,
                  "compression.type": "none", "message.send.max.retries": 0})
    errors: list[object] = []
    p.produce(topic_name, b"x" * 20_000, partition=0,
              on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(15) == 0
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, errors[0]  # type: ignore[attr-defined]
    produce("confluent", broker.bootstrap, topic_name, [Rec(0, None, b"small")])
    got = consume("confluent", broker.bootstrap, topic_name, [0], 1)
    assert [r.value for r in got] == [b"small"]


def _batch_producer_fields(bootstrap: str, topic: str, partition: int
                           ) -> list[tuple[int, int, int, int]]:
    """(base offset, producer id, producer epoch, base sequence) of every stored batch, read
    on the wire (the clients hide them)."""
    from aiokafka.record.memory_records import MemoryRecords

    from tests.kafka_wire import WireClient

    with WireClient.to(bootstrap) as wc:
        resp = wc.request(1, 12, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "forgotten_topics_data": [],
            "topics": [{"topic": topic, "partitions": [{
                "partition": partition, "fetch_offset": 0,
                "partition_max_bytes": 1 << 20}]}]})
    (part,) = resp.responses[0].partitions
    out = []
    mr = MemoryRecords(bytes(part.records or b""))
    while (batch := mr.next_batch()) is not None:
        out.append((batch.base_offset, batch.producer_id, batch.producer_epoch,
                    batch.base_sequence))
    return out


def test_kafka_python_default_idempotent_producer(broker: BrokerProcess, topic_name: str) -> None:
    """R-PROTO-7: kafka-python 3.x is idempotent by default: it gets a producer id
    (InitProducerId) and numbers its batches; the stored batches carry that id and
    sequences that follow the offsets, and every record is there once."""
    from kafka import KafkaProducer

    create_topic("kafka-python", broker.bootstrap, topic_name, 2)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    try:
        futs = [p.send(topic_name, value=f"v{i}".encode(), partition=i % 2) for i in range(100)]
        p.flush(30)
        mds = [f.get(10) for f in futs]
    finally:
        p.close(10)
    assert sorted(m.offset for m in mds if m.partition == 0) == list(range(50))
    got = consume("kafka-python", broker.bootstrap, topic_name, [0, 1], 100)
    assert sorted(r.value for r in got) == sorted(f"v{i}".encode() for i in range(100))
    pids = set()
    for partition in (0, 1):
        batches = _batch_producer_fields(broker.bootstrap, topic_name, partition)
        assert batches, f"partition {partition}: no batch"
        for base_offset, pid, epoch, base_seq in batches:
            assert pid >= 0 and epoch >= 0, "a batch without a producer id: not idempotent"
            assert base_seq == base_offset  # one producer, sequences from 0 per partition
            pids.add(pid)
    assert len(pids) == 1
