"""Consumer groups on a cluster (R-GRP-2 with replication): the coordinator is the leader
of the group's ``__consumer_offsets`` partition (RF 3); when its broker dies, the new
leader loads the group and the members carry on."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.brokerproc import wait_until
from tests.cluster.test_replication import producer
from tests.clusterproc import Cluster

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]

PARTITIONS = 6


def coordinator(cluster: Cluster, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": cluster.live_bootstrap()})
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(15)
    return int(desc.coordinator.id)


def test_group_survives_the_coordinators_death(healthy: Cluster) -> None:
    cluster = healthy
    topic = f"grp-{uuid.uuid4().hex[:6]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, PARTITIONS, 3, {"min.insync.replicas": "2"})
    prod = producer(cluster)
    total = 3000
    for i in range(total // 2):
        prod.produce(topic, f"m{i}".encode(), partition=i % PARTITIONS)
    assert prod.flush(60) == 0

    seen: set[bytes] = set()
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []

    def member(n: int) -> None:
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                      "auto.offset.reset": "earliest", "enable.auto.commit": False,
                      "session.timeout.ms": 10_000, "heartbeat.interval.ms": 500,
                      "topic.metadata.refresh.interval.ms": 1000,
                      "socket.connection.setup.timeout.ms": 3000,
                      "client.id": f"member-{n}"})
        c.subscribe([topic])
        try:
            while not stop.is_set():
                msgs = c.consume(200, 0.3)
                got = [m.value() for m in msgs if m.error() is None]
                if got:
                    with lock:
                        seen.update(got)
                    try:
                        c.commit(asynchronous=False)
                    except KafkaException as e:  # retriable during the failover
                        errors.append(str(e))
        finally:
            c.close()

    threads = [threading.Thread(target=member, args=(n,), daemon=True) for n in range(3)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(seen) >= total // 4, 60, 0.1, "the group to consume")
        coord = wait_until(lambda: coordinator(cluster, group), 20, 0.2, "a coordinator")
        cluster.brokers[coord].kill()
        for i in range(total // 2, total):
            prod.produce(topic, f"m{i}".encode(), partition=i % PARTITIONS)
        assert prod.flush(90) == 0
        wait_until(lambda: len(seen) == total, 120, 0.2, "every record consumed")
        new = wait_until(lambda: (x := coordinator(cluster, group)) != coord and x, 30, 0.3,
                         "a new coordinator")
        assert new != coord
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert seen == {f"m{i}".encode() for i in range(total)}
    # the group's committed offsets reach the end of every partition (commits go on)
    c = Consumer({"bootstrap.servers": cluster.live_bootstrap(), "group.id": group})
    try:
        def committed_all() -> bool:
            got: Any = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                   timeout=10)
            return sum(tp.offset for tp in got if tp.offset >= 0) == total
        wait_until(committed_all, 30, 0.5, "commits up to the end")
    finally:
        c.close()
