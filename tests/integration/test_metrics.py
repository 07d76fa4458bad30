"""The Prometheus endpoint of a broker process (issue 13, "metrics"): ``metrics.port`` set,
real clients produce and consume, and the scraped counters move by exactly what was sent.

Exact amounts: Produce requests sent by hand (``WireClient``: so many requests, so many
bytes, so many records); bytes in, bytes out and log sizes checked against each other for
what confluent-kafka sends (a partition's stored batches are the produced bytes, byte for
byte, and a consumer reading a topic once is sent every batch once).
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from tests.batches import make_batch
from tests.brokerproc import BrokerProcess, wait_until
from tests.clients import create_topic
from tests.conftest import require_tool
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient
from tests.ports import reserve_port
from tests.readme import commands

pytestmark = pytest.mark.timeout(120)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _free_port() -> int:
    return reserve_port()  # outside the ephemeral range (tests/ports.py)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """In process (each broker has its own registry; nothing here is killed)."""
    port = _free_port()
    with InProcessBroker(tmp_path_factory.mktemp("metrics"), {
            "num.partitions": "1", "offsets.topic.num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0", "metrics.port": str(port)}) as b:
        b.metrics_url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        yield b
        text = "".join(b.stderr_lines)
        assert "Traceback" not in text, text[-3000:]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(b: InProcessBroker) -> Samples:
    status, text = _get(b.metrics_url + "/metrics")  # type: ignore[attr-defined]
    assert status == 200, text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str | int) -> float:
    return samples.get((name, frozenset((k, str(v)) for k, v in labels.items())), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str | int) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def log_size(samples: Samples, topic: str) -> float:
    return sum(v for (name, labels), v in samples.items()
               if name == "kafka_log_log_size" and ("topic", topic) in labels)


def test_health_ready_and_unknown_paths(broker: InProcessBroker) -> None:
    url = broker.metrics_url  # type: ignore[attr-defined]
    assert _get(url + "/health") == (200, "ok\n")
    assert _get(url + "/ready") == (200, "ready\n")
    assert _get(url + "/nothing")[0] == 404
    s = scrape(broker)
    # a single node is its own controller; the process collector is there too
    assert value(s, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert value(s, "kafka_controller_kafkacontroller_offlinepartitionscount") == 0
    assert value(s, "kafka_server_replicamanager_underreplicatedpartitions") == 0
    assert value(s, "process_resident_memory_bytes") > 0


def test_hand_made_produce_requests_are_counted_exactly(broker: InProcessBroker) -> None:
    topic = f"m-wire-{uuid.uuid4().hex[:6]}"
    create_topic("confluent", broker.bootstrap, topic, 2)
    batches = [make_batch([(None, f"v{i}-{j}".encode(), int(time.time() * 1000), [])
                           for j in range(5)]) for i in range(3)]
    before = scrape(broker)
    with WireClient.to(broker.bootstrap) as wc:
        for i, batch in enumerate(batches):
            resp = wc.request(0, 9, {"transactional_id": None, "acks": 1, "timeout": 10_000,
                                     "topic_data": [{"name": topic, "partition_data": [
                                         {"index": i % 2, "records": batch}]}]})
            assert resp.responses[0].partition_responses[0].error_code == 0
        # a connection of its own, counted on its listener while open
        assert value(scrape(broker), "kafka_server_socketservermetrics_connection_count",
                     listener="PLAINTEXT") >= 1
    after = scrape(broker)
    sent = sum(len(b) for b in batches)
    assert delta(before, after, "kafka_server_brokertopicmetrics_bytesin_total",
                 topic=topic) == sent
    assert delta(before, after, "kafka_server_brokertopicmetrics_messagesin_total",
                 topic=topic) == 15
    assert delta(before, after, "kafka_network_requestmetrics_requests_total",
                 request="Produce", version=9) == 3
    assert delta(before, after, "kafka_network_requestmetrics_totaltimems_count",
                 request="Produce") == 3
    assert delta(before, after, "kafka_network_requestmetrics_totaltimems_bucket",
                 request="Produce", le="+Inf") == 3
    assert value(after, "kafka_log_log_size", topic=topic, partition=0) == len(batches[0]) + len(
        batches[2])
    assert value(after, "kafka_log_log_size", topic=topic, partition=1) == len(batches[1])
    assert value(after, "kafka_log_log_logendoffset", topic=topic, partition=0) == 10
    # histogram buckets are cumulative and end at the count
    buckets = sorted((float(dict(labels)["le"]), v) for (name, labels), v in after.items()
                     if name == "kafka_network_requestmetrics_totaltimems_bucket"
                     and ("request", "Produce") in labels)
    counts = [v for _, v in buckets]
    assert counts == sorted(counts)
    assert counts[-1] == value(after, "kafka_network_requestmetrics_totaltimems_count",
                               request="Produce")


def test_confluent_produce_consume_and_group_lag(broker: InProcessBroker) -> None:
    topic = f"m-ck-{uuid.uuid4().hex[:6]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    create_topic("confluent", broker.bootstrap, topic, 1)
    before = scrape(broker)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(1000):
        p.produce(topic, value=b"x" * 100, key=str(i).encode())
    assert p.flush(15) == 0
    produced = scrape(broker)
    stored = log_size(produced, topic)
    assert stored > 100_000
    assert delta(before, produced, "kafka_server_brokertopicmetrics_messagesin_total",
                 topic=topic) == 1000
    assert delta(before, produced, "kafka_server_brokertopicmetrics_bytesin_total",
                 topic=topic) == stored
    assert delta(before, produced, "kafka_network_requestmetrics_requests_total",
                 request="Produce", version=10) >= 1

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        c.assign([CkTopicPartition(topic, 0, 0)])
        got = 0
        deadline = time.monotonic() + 20
        while got < 1000 and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                got += 1
        assert got == 1000
        c.commit(offsets=[CkTopicPartition(topic, 0, 400)], asynchronous=False)
    finally:
        c.close()
    consumed = scrape(broker)
    # every stored batch was sent to the consumer exactly once
    assert delta(produced, consumed, "kafka_server_brokertopicmetrics_bytesout_total",
                 topic=topic) == stored
    assert delta(produced, consumed, "kafka_server_brokertopicmetrics_messagesout_total",
                 topic=topic) == 1000
    assert delta(produced, consumed, "kafka_network_requestmetrics_requests_total",
                 request="OffsetCommit", version=9) == 1
    assert sum(v for (name, labels), v in consumed.items()
               if name == "kafka_network_requestmetrics_requests_total"
               and ("request", "Fetch") in labels) > sum(
        v for (name, labels), v in produced.items()
        if name == "kafka_network_requestmetrics_requests_total"
        and ("request", "Fetch") in labels)
    assert value(consumed, "kafka_consumergroup_current_offset", consumergroup=group,
                 topic=topic, partition=0) == 400
    assert value(consumed, "kafka_consumergroup_lag", consumergroup=group, topic=topic,
                 partition=0) == 600


def _churn(broker: InProcessBroker, names: list[str]) -> None:
    """Create ``names``, produce to each and read everything back (real clients), delete
    them all: every per-topic and per-partition series of theirs existed once."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for chunk in range(0, len(names), 50):
        futures = admin.create_topics([NewTopic(n, 1, 1) for n in names[chunk:chunk + 50]],
                                      request_timeout=30)
        for f in futures.values():
            f.result(30)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for n in names:
        for i in range(3):
            p.produce(n, value=b"v%d" % i)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "churn-reader",
                  "enable.auto.commit": False})
    try:
        c.assign([CkTopicPartition(n, 0, 0) for n in names])
        got = 0
        deadline = time.monotonic() + 60
        while got < 3 * len(names) and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                got += 1
        assert got == 3 * len(names)
        c.commit(offsets=[CkTopicPartition(n, 0, 2) for n in names], asynchronous=False)
    finally:
        c.close()
    during = scrape(broker)
    for n in names:  # counted (so the test proves they are removed)
        assert value(during, "kafka_server_brokertopicmetrics_bytesout_total", topic=n) > 0
        assert value(during, "kafka_log_log_logendoffset", topic=n, partition=0) == 3
        assert value(during, "kafka_consumergroup_lag", consumergroup="churn-reader",
                     topic=n, partition=0) == 1
    for chunk in range(0, len(names), 50):
        for f in admin.delete_topics(names[chunk:chunk + 50], operation_timeout=30,
                                     request_timeout=30).values():
            f.result(30)


def test_deleted_topics_leave_no_series(broker: InProcessBroker) -> None:
    """Issue 23 item 8: a deleted topic's series (bytes/messages in and out per topic, log
    size and offsets per partition, group lag and offsets) leave /metrics, as Kafka
    removes a deleted topic's BrokerTopicMetrics: 200 topics created, written, read and
    deleted leave /metrics its size (before the fix each left four counters behind, 2,000
    topics 5.4 kB -> 669 kB), and a topic created again under a deleted name counts from
    zero."""
    run = uuid.uuid4().hex[:6]
    # a first round makes the request series of these APIs and versions exist
    _churn(broker, [f"churn-{run}-warm-{i}" for i in range(3)])
    url = broker.metrics_url + "/metrics"  # type: ignore[attr-defined]
    start = len(_get(url)[1])
    names = [f"churn-{run}-{i}" for i in range(200)]
    _churn(broker, names)
    status, text = _get(url)
    assert status == 200
    # the process collector's and the histograms' digits move a little, nothing more
    assert len(text) < start + 2000, (start, len(text))
    deleted = set(names)
    left = [f"{name}{dict(labels)}" for (name, labels), _ in scrape(broker).items()
            if dict(labels).get("topic") in deleted or f"churn-{run}-warm" in str(labels)]
    assert not left, left[:10]

    # the same name again: its counters start from zero
    again = names[0]
    create_topic("confluent", broker.bootstrap, again, 1)
    batch = make_batch([(None, b"x%d" % j, int(time.time() * 1000), []) for j in range(4)])
    with WireClient.to(broker.bootstrap) as wc:
        resp = wc.request(0, 9, {"transactional_id": None, "acks": 1, "timeout": 10_000,
                                 "topic_data": [{"name": again, "partition_data": [
                                     {"index": 0, "records": batch}]}]})
        assert resp.responses[0].partition_responses[0].error_code == 0
    s = scrape(broker)
    assert value(s, "kafka_server_brokertopicmetrics_bytesin_total", topic=again) == len(batch)
    assert value(s, "kafka_server_brokertopicmetrics_messagesin_total", topic=again) == 4
    assert ("kafka_server_brokertopicmetrics_bytesout_total",
            frozenset({("topic", again)})) not in s
    assert value(s, "kafka_log_log_logendoffset", topic=again, partition=0) == 4


def test_metrics_port_taken_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        b = BrokerProcess(tmp_path, {"metrics.port": str(port)})
        with pytest.raises(RuntimeError) as e:
            b.start()
    assert "cannot serve metrics on 127.0.0.1" in str(e.value)
    assert "Traceback" not in str(e.value)


def test_off_by_default(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path) as b:
        wait_until(lambda: b.stderr_lines, what="the broker's first line")
        assert not any("metrics on http" in line for line in b.stderr_lines)


def test_readme_metrics_commands(broker: InProcessBroker) -> None:
    """The README's three curl lines as written (issue 13, item 4), port 9404 made this
    broker's metrics port: the text format, /health and /ready."""
    require_tool("curl")
    port = broker.metrics_url.rsplit(":", 1)[1]  # type: ignore[attr-defined]
    out = []
    for line in commands("metrics-endpoints"):
        r = subprocess.run(["bash", "-c", line.replace("9404", port)], capture_output=True,
                           text=True, timeout=30, check=False)
        assert r.returncode == 0, (line, r.stderr)
        out.append(r.stdout)
    metrics, health, ready = out
    assert any(f.name == "kafka_controller_kafkacontroller_activecontrollercount"
               for f in text_string_to_metric_families(metrics))
    assert (health, ready) == ("ok\n", "ready\n")
