"""Metrics of a 3-broker cluster (issue 13): exactly one broker reports an active
controller, every broker is ready, and a killed follower shows on its leader as an
under-replicated partition and an ISR shrink, then an ISR expansion when it is back.

Each broker of the shared cluster serves metrics on a port of its own
(``Cluster(metrics=True)``).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from prometheus_client.parser import text_string_to_metric_families

from tests.brokerproc import wait_until
from tests.clusterproc import Cluster

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]


def _get(broker_port: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{broker_port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(cluster: Cluster, broker_id: int, name: str) -> float:
    """The value of a label-less sample of broker ``broker_id``."""
    status, text = _get(cluster.brokers[broker_id].overrides["metrics.port"], "/metrics")
    assert status == 200, text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and not s.labels:
                return float(s.value)
    raise AssertionError(f"{name} not scraped from broker {broker_id}")


def _one_active_controller(cluster: Cluster) -> list[int] | None:
    live = [i for i, b in cluster.brokers.items() if b.alive]
    active = [i for i in live
              if metric(cluster, i, "kafka_controller_kafkacontroller_activecontrollercount")]
    return active if len(active) == 1 else None


def test_one_active_controller_and_every_broker_ready(healthy: Cluster) -> None:
    cluster = healthy
    wait_until(lambda: _one_active_controller(cluster), 30, 0.2, "one active controller")
    for b in cluster.brokers.values():
        wait_until(lambda b=b: _get(b.overrides["metrics.port"], "/ready")[0] == 200, 30,
                   0.2, f"broker {b.broker_id} ready")
        assert _get(b.overrides["metrics.port"], "/health")[0] == 200


def test_killed_follower_is_under_replicated_and_shrinks_the_isr(healthy: Cluster) -> None:
    cluster = healthy
    topic = f"mc-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, 1, 3)
    cluster.wait_isr(topic, 0, lambda isr: len(isr) == 3)
    leader = cluster.wait_leader(topic, 0)
    p = Producer({"bootstrap.servers": cluster.live_bootstrap(), "acks": "all"})
    for i in range(50):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(20) == 0
    follower = next(i for i in cluster.brokers if i != leader)
    wait_until(lambda: metric(cluster, leader,
                              "kafka_server_replicamanager_underreplicatedpartitions") == 0,
               30, 0.2, "nothing under-replicated")
    shrinks = metric(cluster, leader, "kafka_server_replicamanager_isrshrinks_total")
    expands = metric(cluster, leader, "kafka_server_replicamanager_isrexpands_total")

    cluster.brokers[follower].kill()
    # the cluster is shared: the leader's other partitions (some it takes over from the
    # follower if that was their leader) can make it under-replicated before this
    # partition's ISR change is applied there (CI run on a clean clone: URP 1, shrinks
    # still 0), so the shrink is awaited, not read once
    cluster.wait_isr(topic, 0, lambda isr: follower not in isr)
    wait_until(lambda: metric(cluster, leader,
                              "kafka_server_replicamanager_isrshrinks_total") > shrinks,
               60, 0.2, "the leader's ISR shrink counted")
    wait_until(lambda: metric(cluster, leader,
                              "kafka_server_replicamanager_underreplicatedpartitions") >= 1,
               60, 0.2, "an under-replicated partition on the leader")
    wait_until(lambda: _one_active_controller(cluster), 30, 0.2, "one active controller")
    active = _one_active_controller(cluster)
    assert active is not None
    # a follower down takes no partition offline but those it alone holds (a shared
    # cluster: other modules' topics of replication factor 1 are on it too)
    _, _, parts, _ = cluster.zk_partitions()
    alone = sum(1 for replicas, _, _ in parts.values() if replicas == [follower])
    wait_until(lambda: metric(cluster, active[0],
                              "kafka_controller_kafkacontroller_offlinepartitionscount")
               == alone, 30, 0.2, f"{alone} offline partition(s)")

    cluster.brokers[follower].start()
    wait_until(lambda: metric(cluster, leader,
                              "kafka_server_replicamanager_underreplicatedpartitions") == 0,
               60, 0.2, "the follower back in the ISR")
    wait_until(lambda: metric(cluster, leader,
                              "kafka_server_replicamanager_isrexpands_total") > expands,
               30, 0.2, "the leader's ISR expansion counted")
    wait_until(lambda: _get(cluster.brokers[follower].overrides["metrics.port"],
                            "/ready")[0] == 200, 30, 0.2, "the restarted follower ready")


def _topic_series(cluster: Cluster, topics: set[str]) -> dict[int, list[str]]:
    """Broker id -> the series of ``topics`` that broker's /metrics shows."""
    out: dict[int, list[str]] = {}
    for i, b in cluster.brokers.items():
        status, text = _get(b.overrides["metrics.port"], "/metrics")
        assert status == 200, text
        out[i] = [f"{s.name}{s.labels}" for family in text_string_to_metric_families(text)
                  for s in family.samples if s.labels.get("topic") in topics]
    return out


def _counter(cluster: Cluster, name: str, topic: str) -> float:
    """``name``{topic} summed over the brokers."""
    total = 0.0
    for b in cluster.brokers.values():
        _, text = _get(b.overrides["metrics.port"], "/metrics")
        total += sum(s.value for family in text_string_to_metric_families(text)
                     for s in family.samples if s.name == name and s.labels == {"topic": topic})
    return total


def test_topics_deleted_through_the_controller_leave_no_series(healthy: Cluster) -> None:
    """Issue 23 item 8 on a cluster: topics written and read on their leaders, then deleted
    with DeleteTopics (through the controller), leave no series on any broker (per topic
    and per partition: leaders and followers), and a topic created again under a deleted
    name counts from zero."""
    cluster = healthy
    names = [f"mcdel-{uuid.uuid4().hex[:6]}-{i}" for i in range(4)]
    for n in names:
        cluster.create_topic(n, 2, 3)
    p = Producer({"bootstrap.servers": cluster.live_bootstrap(), "acks": "all"})
    for n in names:
        for i in range(10):
            p.produce(n, value=b"%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": cluster.live_bootstrap(), "group.id": "mcdel",
                  "enable.auto.commit": False})
    try:
        c.assign([CkTopicPartition(n, part, 0) for n in names for part in (0, 1)])
        got, deadline = 0, time.monotonic() + 60
        while got < 10 * len(names) and time.monotonic() < deadline:
            got += sum(1 for m in c.consume(100, 1.0) if m.error() is None)
        assert got == 10 * len(names)
    finally:
        c.close()
    wait_until(lambda: all(_counter(cluster, f"kafka_server_brokertopicmetrics_{what}_total",
                                    n) == 10
                           for n in names for what in ("messagesin", "messagesout")),
               30, 0.2, "every topic counted in and out")
    before = _topic_series(cluster, set(names))
    assert all(before.values()), before  # every broker hosts a replica: log gauges

    admin = cluster.admin()
    for f in admin.delete_topics(names, operation_timeout=30, request_timeout=40).values():
        f.result(45)
    wait_until(lambda: not any(_topic_series(cluster, set(names)).values()), 60, 0.2,
               "no broker showing a series of a deleted topic")

    again = names[0]
    cluster.create_topic(again, 1, 3)
    p = Producer({"bootstrap.servers": cluster.live_bootstrap(), "acks": "all"})
    p.produce(again, value=b"once")
    assert p.flush(30) == 0
    wait_until(lambda: _counter(cluster, "kafka_server_brokertopicmetrics_messagesin_total",
                                again) == 1, 30, 0.2, "the re-created topic counted from 0")
    assert _counter(cluster, "kafka_server_brokertopicmetrics_messagesout_total", again) == 0
