"""Transactions on a 3-broker cluster (issue 10; R-PROD-2): markers reach partitions led
by other brokers (WriteTxnMarkers), and a consume-transform-produce loop stays exactly
once while the transaction coordinator's broker and a partition leader are killed."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer

from tests.brokerproc import wait_until
from tests.clients import read_to_end
from tests.clusterproc import Cluster

pytestmark = pytest.mark.timeout(300)

PARTS = 3


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def read_all(cluster: Cluster, name: str, isolation: str, timeout_s: float = 60) -> list[bytes]:
    return read_to_end(cluster.live_bootstrap(), name, PARTS, isolation, timeout_s)


def txn_producer(cluster: Cluster, tid: str) -> Producer:
    p = Producer({"bootstrap.servers": cluster.live_bootstrap(), "transactional.id": tid,
                  "linger.ms": 2, "transaction.timeout.ms": 20_000})
    p.init_transactions(60)
    return p


def test_markers_reach_every_leader(healthy: Cluster) -> None:
    """A transaction over partitions led by all three brokers commits (and one aborts)
    wherever the coordinator is."""
    cluster = healthy
    out = _topic("txout")
    cluster.create_topic(out, PARTS, 3, {"min.insync.replicas": "2"})
    leaders = {cluster.wait_leader(out, p) for p in range(PARTS)}
    assert len(leaders) > 1  # the markers cross brokers
    p = txn_producer(cluster, _topic("tid"))
    p.begin_transaction()
    for i in range(30):
        p.produce(out, b"c%d" % i, partition=i % PARTS)
    p.commit_transaction(60)
    p.begin_transaction()
    for i in range(30):
        p.produce(out, b"a%d" % i, partition=i % PARTS)
    p.flush(60)
    p.abort_transaction(60)
    assert sorted(read_all(cluster, out, "read_committed")) == sorted(
        b"c%d" % i for i in range(30))
    assert len(read_all(cluster, out, "read_uncommitted")) == 60


def _coordinator(cluster: Cluster, tid: str) -> int:
    from tests.kafka_wire import WireClient

    def find() -> int | None:
        for b in cluster.brokers.values():
            if not b.alive:
                continue
            try:
                with WireClient.to(b.address) as wc:
                    r = wc.request(10, 4, {"key_type": 1, "coordinator_keys": [tid]})
            except OSError:
                continue
            c = r.coordinators[0]
            if int(c.error_code) == 0 and int(c.node_id) > 0:
                return int(c.node_id)
        return None

    return int(wait_until(find, 30, 0.2, "the transaction coordinator"))


def test_exactly_once_while_the_coordinator_and_a_leader_are_killed(healthy: Cluster) -> None:
    cluster = healthy
    out = _topic("eo")
    cluster.create_topic(out, PARTS, 3, {"min.insync.replicas": "2"})
    tid = _topic("eo-tid")
    p = txn_producer(cluster, tid)
    committed: list[bytes] = []
    victims: list[int] = []
    i = 0
    deadline = time.monotonic() + 180
    while len(committed) < 600:
        assert time.monotonic() < deadline, f"{len(committed)} committed; killed {victims}"
        if len(committed) >= 200 and not victims:
            victims.append(_coordinator(cluster, tid))
            cluster.brokers[victims[0]].kill()
        if len(committed) >= 400 and len(victims) == 1:
            cluster.brokers[victims[0]].start()
            leader = cluster.wait_leader(out, 0)
            victims.append(leader)
            cluster.brokers[leader].kill()
        batch = [b"r%d" % (i + k) for k in range(20)]
        i += len(batch)
        p.begin_transaction()
        for k, v in enumerate(batch):
            p.produce(out, v, partition=k % PARTS)
        while True:  # librdkafka's rules: retry a retriable commit, abort an abortable one
            assert time.monotonic() < deadline
            try:
                p.commit_transaction(60)
                committed += batch
                break
            except KafkaException as e:
                err: Any = e.args[0]
                if err.retriable():
                    continue
                if err.txn_requires_abort():
                    p.abort_transaction(60)
                    break  # nothing of it may be read committed
                raise
    for b in cluster.brokers.values():
        if not b.alive:
            b.start()
    got = read_all(cluster, out, "read_committed", timeout_s=90)
    assert sorted(got) == sorted(committed), (len(got), len(committed), victims)
