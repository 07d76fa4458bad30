"""OffsetFetch ``require_stable`` (KIP-447) on the wire: a confluent-kafka transactional
producer sends offsets to its open transaction (TxnOffsetCommit), and until the transaction
is committed or aborted an OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for
those partitions (v7 and, per partition within the group, v8+), while one without it, and
other partitions, answer the committed offsets; after the commit the new offsets, after an
abort the old ones. A read_committed confluent-kafka consumer (which sends require_stable)
waits for the transaction and then starts from the committed offset."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from tests.brokerproc import BrokerProcess, wait_until
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("stable"), {
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1"}) as b:
        yield b


def fetch_v7(wc: WireClient, group: str, topic: str, stable: bool) -> dict[int, Any]:
    r = wc.request(9, 7, {"group_id": group, "require_stable": stable,
                          "topics": [{"name": topic, "partition_indexes": [0, 1]}]})
    assert r.error_code == ErrorCode.none
    return {p.partition_index: p for t in r.topics for p in t.partitions}


def fetch_v8(wc: WireClient, group: str, topic: str | None, stable: bool) -> Any:
    topics = None if topic is None else [{"name": topic, "partition_indexes": [0, 1]}]
    r = wc.request(9, 8, {"require_stable": stable,
                          "groups": [{"group_id": group, "topics": topics}]})
    (g,) = r.groups
    return g


def setup(b: BrokerProcess) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    topic, group = f"stable-{tag}", f"stable-g-{tag}"
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    a.create_topics([NewTopic(topic, 2, 1)])[topic].result(15)
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:  # committed before the transaction: p0 at 1, p1 at 2
        c.commit(offsets=[TopicPartition(topic, 0, 1), TopicPartition(topic, 1, 2)],
                 asynchronous=False)
    finally:
        c.close()
    return topic, group


def open_txn(b: BrokerProcess, topic: str, group: str) -> Producer:
    p = Producer({"bootstrap.servers": b.bootstrap,
                  "transactional.id": f"stable-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(15)
    p.begin_transaction()
    for _ in range(5):
        p.produce(topic, b"v", partition=0)
    assert p.flush(15) == 0
    meta = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group})
    try:  # the offset of partition 0 only, inside the transaction
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 5)],
                                      meta.consumer_group_metadata(), 15)
    finally:
        meta.close()
    return p


def test_pending_offsets_are_unstable_until_commit(broker: BrokerProcess) -> None:
    topic, group = setup(broker)
    p = open_txn(broker, topic, group)
    with WireClient.to(broker.bootstrap) as wc:
        got = fetch_v7(wc, group, topic, stable=True)
        assert got[0].error_code == ErrorCode.unstable_offset_commit
        assert got[0].committed_offset == -1
        assert (got[1].error_code, got[1].committed_offset) == (0, 2)  # nothing pending
        got = fetch_v7(wc, group, topic, stable=False)
        assert (got[0].error_code, got[0].committed_offset) == (0, 1)  # the committed one
        g = fetch_v8(wc, group, topic, stable=True)
        assert g.error_code == ErrorCode.none  # the group itself is fine
        parts = {q.partition_index: q for t in g.topics for q in t.partitions}
        assert parts[0].error_code == ErrorCode.unstable_offset_commit
        assert (parts[1].error_code, parts[1].committed_offset) == (0, 2)
        # every partition: those with a committed offset, partition 0 unstable
        g = fetch_v8(wc, group, None, stable=True)
        parts = {q.partition_index: q.error_code for t in g.topics for q in t.partitions}
        assert parts == {0: ErrorCode.unstable_offset_commit, 1: ErrorCode.none}

        p.commit_transaction(15)

        def stable() -> Any:
            q = fetch_v7(wc, group, topic, stable=True)[0]
            return q if q.error_code == ErrorCode.none else None

        assert wait_until(stable, 15, what="a stable offset").committed_offset == 5
        g = fetch_v8(wc, group, topic, stable=True)
        assert {q.partition_index: (q.error_code, q.committed_offset)
                for t in g.topics for q in t.partitions} == {0: (0, 5), 1: (0, 2)}


def test_pending_offsets_are_unstable_until_abort(broker: BrokerProcess) -> None:
    topic, group = setup(broker)
    p = open_txn(broker, topic, group)
    with WireClient.to(broker.bootstrap) as wc:
        assert fetch_v7(wc, group, topic, stable=True)[0].error_code == \
            ErrorCode.unstable_offset_commit
        p.abort_transaction(15)

        def stable() -> Any:
            q = fetch_v7(wc, group, topic, stable=True)[0]
            return q if q.error_code == ErrorCode.none else None

        assert wait_until(stable, 15, what="a stable offset").committed_offset == 1


def test_read_committed_consumer_waits_for_the_transaction(broker: BrokerProcess) -> None:
    """librdkafka sends require_stable (isolation.level=read_committed) and retries on
    UNSTABLE_OFFSET_COMMIT: while the transaction is open ``committed`` gets no answer
    within its timeout (it would get the old offset 1 without KIP-447); after the commit,
    the transaction's offset."""
    topic, group = setup(broker)
    p = open_txn(broker, topic, group)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        with pytest.raises(KafkaException) as e:
            c.committed([TopicPartition(topic, 0)], timeout=3)
        assert e.value.args[0].code() == KafkaError._TIMED_OUT
        p.commit_transaction(15)
        got = c.committed([TopicPartition(topic, 0)], timeout=15)
        assert got[0].offset == 5
    finally:
        c.close()
