"""The Spark sink's transactional mode without Spark (issue 10: "a replayed batch (after a
driver or executor kill) adds nothing"): ``headrace.spark.kafka_io.
produce_batches_transactional``, the function each sink task runs, called as a task runs it
against an in-process broker. Fast twin of tests/integration/test_spark_executor_kill.py and
of test_spark_driver_kill.py's transactional driver kill, where Spark's executor or driver
is killed:

- a task whose batch committed, then runs again (a replay after the driver died before
  recording the batch, or a retried task whose first attempt committed) writes nothing;
- a task that died with its transaction open leaves nothing a read_committed reader sees,
  and its retry (same transactional id) fences and aborts it, then commits the rows once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from headrace.spark import kafka_io
from tests.clients import create_topic, read_to_end
from tests.inproc import InProcessBroker
from tests.tcpproxy import TcpProxy

CREATE_TOPICS = 19  # the API key


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("txn-sink"),
                         {"num.partitions": "1", "transaction.state.log.num.partitions": "1",
                          "transaction.state.log.replication.factor": "1"}) as b:
        yield b
        kafka_io.close_all()  # its cached clients, before their broker stops


def _rows(tag: str, n: int) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"key": [f"k{i}".encode() for i in range(n)],
                                        "value": [f"{tag}-{i}".encode() for i in range(n)]})]


def _setup(broker: InProcessBroker) -> tuple[dict[str, str], str, str]:
    out, commits = f"out-{uuid.uuid4().hex[:6]}", f"commits-{uuid.uuid4().hex[:6]}"
    create_topic("confluent", broker.bootstrap, out, 1)
    config = {"bootstrap.servers": broker.bootstrap}
    kafka_io.ensure_compacted_topic(config, commits)
    return config, out, commits


def test_a_replayed_committed_batch_writes_nothing(broker: InProcessBroker) -> None:
    config, out, commits = _setup(broker)
    tid = f"sink-q-0-{uuid.uuid4().hex[:6]}"
    assert kafka_io.produce_batches_transactional(
        config, _rows("b3", 5), out, tid, 3, commits, timeout_s=30) == 5
    # the driver died before recording batch 3: Spark runs it again, same task id
    assert kafka_io.produce_batches_transactional(
        config, _rows("b3", 5), out, tid, 3, commits, timeout_s=30) == 0
    assert kafka_io.last_committed_batch(config, commits, tid, 30) == 3
    assert kafka_io.produce_batches_transactional(
        config, _rows("b4", 2), out, tid, 4, commits, timeout_s=30) == 2
    got = read_to_end(broker.bootstrap, out, 1, "read_committed")
    assert got == [f"b3-{i}".encode() for i in range(5)] + [b"b4-0", b"b4-1"]


def test_a_task_that_died_with_its_transaction_open_is_fenced_and_retried_once(
        broker: InProcessBroker) -> None:
    config, out, commits = _setup(broker)
    tid = f"sink-q-1-{uuid.uuid4().hex[:6]}"
    dead = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": tid,
                     "linger.ms": 5})
    dead.init_transactions(30)
    dead.begin_transaction()
    for i in range(5):
        dead.produce(out, key=b"k%d" % i, value=b"b7-%d" % i)
    assert dead.flush(30) == 0  # every row sent, the transaction never ends: the task died
    assert read_to_end(broker.bootstrap, out, 1, "read_committed") == []
    assert kafka_io.produce_batches_transactional(
        config, _rows("b7", 5), out, tid, 7, commits, timeout_s=30) == 5
    assert read_to_end(broker.bootstrap, out, 1, "read_committed") == [
        f"b7-{i}".encode() for i in range(5)]
    # the dead attempt's rows are there, aborted: a read_uncommitted reader sees both
    assert len(read_to_end(broker.bootstrap, out, 1, "read_uncommitted")) == 10
    del dead


def test_the_commits_topic_is_created_when_the_first_create_is_lost(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The sink's progress topic is created on every micro-batch write until it exists; a
    broker (or controller) killed with the CreateTopics in flight fails it with a transport
    error, which librdkafka does not retry (CI's ``headrace demo --cluster`` run failed so:
    "Failed while waiting for response from broker"). ``ensure_compacted_topic`` retries it
    as Kafka's AdminClient does. Here a proxy, advertised as the broker, closes the
    connection carrying the first CreateTopics before the broker sees it."""
    with TcpProxy("127.0.0.1", 0, kafka=True) as proxy, \
            InProcessBroker(tmp_path_factory.mktemp("lost-create"),
                            {"num.partitions": "1",
                             "advertised.port": str(proxy.port)}) as b:
        proxy.target = ("127.0.0.1", b.port)
        proxy.cut_at_request(CREATE_TOPICS, 1)
        config = {"bootstrap.servers": proxy.address}
        name = f"commits-{uuid.uuid4().hex[:6]}"
        kafka_io.ensure_compacted_topic(config, name, timeout_s=60)
        assert proxy.cut_requests == [CREATE_TOPICS]  # the first attempt was lost
        admin = AdminClient(config)
        assert name in admin.list_topics(timeout=10).topics
        res = ConfigResource(ConfigResource.Type.TOPIC, name)
        described = admin.describe_configs([res])[res].result(10)
        assert described["cleanup.policy"].value == "compact"
