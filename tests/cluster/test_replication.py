"""Replication on a 3-broker cluster with real processes and a real ZooKeeper (R-REP-1..9).

Brokers run as ``headrace broker --broker-id N --zookeeper ...`` processes; clients are
confluent-kafka. Topics: replication factor 3, ``min.insync.replicas=2``.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.brokerproc import wait_until
from tests.clusterproc import Cluster

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def producer(cluster: Cluster, **extra: Any) -> Producer:
    return Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True,
                     "acks": "all", "linger.ms": 5, "message.timeout.ms": 120_000,
                     "retry.backoff.ms": 100, "topic.metadata.refresh.interval.ms": 1000,
                     "socket.connection.setup.timeout.ms": 3000, **extra})


def read_all(cluster: Cluster, topic: str, partitions: int, expect: int,
             timeout_s: float = 60.0) -> dict[int, list[bytes]]:
    """Every record of ``topic`` from the beginning (read_uncommitted below the HW)."""
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"read-{uuid.uuid4()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "topic.metadata.refresh.interval.ms": 1000})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    got = 0
    deadline = time.monotonic() + timeout_s
    try:
        while got < expect and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is not None:
                    continue
                out[m.partition()].append(m.value())
                got += 1
    finally:
        c.close()
    return out


def segment_bytes(data_dir: Path, topic: str, partition: int) -> bytes:
    d = data_dir / f"{topic}-{partition}"
    return b"".join(p.read_bytes() for p in sorted(d.glob("*.log")))


def test_rf3_topic_replicates_byte_for_byte(healthy: Cluster) -> None:
    """R-REP-1/3: every replica's log is the leader's, byte for byte, and every broker's
    Metadata shows the same leaders, replicas and ISR."""
    cluster = healthy
    topic = _topic("bytes")
    cluster.create_topic(topic, 2, 3, {"min.insync.replicas": "2"})
    for p in range(2):
        md = cluster.describe(topic)[p]
        assert sorted(md.replicas) == [1, 2, 3]
        assert sorted(md.isrs) == [1, 2, 3]
    prod = producer(cluster)
    errors: list[Any] = []
    for i in range(3000):
        prod.produce(topic, f"v{i}".encode(), partition=i % 2,
                     on_delivery=lambda e, m: errors.append(e) if e else None)
        if i % 500 == 0:
            prod.poll(0)
    assert prod.flush(60) == 0
    assert errors == []
    got = read_all(cluster, topic, 2, 3000)
    assert got[0] == [f"v{i}".encode() for i in range(0, 3000, 2)]
    assert got[1] == [f"v{i}".encode() for i in range(1, 3000, 2)]

    def identical() -> bool:
        for p in range(2):
            logs = [segment_bytes(b.data_dir, topic, p) for b in cluster.brokers.values()]
            if not logs[0] or any(x != logs[0] for x in logs):
                return False
        return True

    wait_until(identical, 30, 0.2, "every replica's segments to equal the leader's")


def test_kill_leader_of_every_partition_in_turn(healthy: Cluster) -> None:
    """R-REP-5, R-PROD-2 (Kafka's ducktape ReplicationTest): with RF 3,
    min.insync.replicas=2 and an idempotent acks=all producer, kill -9 the leader of every
    partition in turn during a produce stream; every acknowledged record is read back
    exactly once, in order."""
    cluster = healthy
    topic = _topic("killlead")
    partitions = 3
    cluster.create_topic(topic, partitions, 3, {"min.insync.replicas": "2"})
    prod = producer(cluster)
    acked: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    failed: list[str] = []
    stop = threading.Event()

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            acked[msg.partition()].append(msg.value())

    def run() -> None:
        i = 0
        while not stop.is_set():
            try:
                prod.produce(topic, f"r{i}".encode(), partition=i % partitions,
                             on_delivery=on_delivery)
                i += 1
            except BufferError:
                prod.poll(0.05)
            if i % 100 == 0:
                prod.poll(0)
                time.sleep(0.005)
        prod.flush(120)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        wait_until(lambda: sum(map(len, acked.values())) > 300, 30, what="first acks")
        for p in range(partitions):
            leader = cluster.wait_leader(topic, p)
            cluster.brokers[leader].kill()
            new = cluster.wait_leader(topic, p, ok=lambda x, old=leader: x != old)
            assert new != leader
            before = sum(map(len, acked.values()))
            wait_until(lambda b=before: sum(map(len, acked.values())) > b + 200, 60,
                       what="acks after the failover")
            cluster.brokers[leader].start()
            cluster.wait_isr(topic, p, lambda isr: len(isr) == 3, 60)
    finally:
        stop.set()
        t.join(150)
    assert not t.is_alive()
    assert failed == []
    total = sum(map(len, acked.values()))
    got = read_all(cluster, topic, partitions, total)
    for p in range(partitions):
        values = got[p]
        assert len(values) == len(set(values)), f"duplicates in partition {p}"
        assert values[: len(acked[p])] == acked[p] or set(acked[p]) <= set(values)
        # every acked record is there, exactly once, in the order it was acknowledged
        at = {v: i for i, v in enumerate(values)}  # unique: asserted above
        positions = [at[v] for v in acked[p]]
        assert positions == sorted(positions)


def test_caught_up_follower_taken_out_of_the_isr_rejoins_without_new_records(
        healthy: Cluster) -> None:
    """R-REP-3: a follower that is caught up but was taken out of the ISR by the controller
    (as when its ZooKeeper session expired while it was paused, then it came back) rejoins
    on its next fetch although no record arrives meanwhile: its partition is quiet in the
    follower's KIP-227 fetch session, and the leader must still see it caught up. (It
    stayed out for good before: the CI failure of test_paused_follower_leaves_isr_and_
    rejoins when the paused follower was also the controller.)"""
    from kazoo.client import KazooClient

    from headrace.cluster import zk_layout as L

    cluster = healthy
    topic = _topic("rejoin")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    prod = producer(cluster)
    for i in range(10):
        prod.produce(topic, f"q{i}".encode(), partition=0)
    assert prod.flush(60) == 0
    cluster.wait_isr(topic, 0, lambda isr: isr == {1, 2, 3}, 30)
    leader = cluster.wait_leader(topic, 0)
    follower = next(b for b in (1, 2, 3) if b != leader)
    zk = KazooClient(hosts=cluster.brokers[1].zk_connect, timeout=10)
    zk.start(timeout=10)
    try:
        path = L.state_path(topic, 0)
        data, stat = zk.get(path)
        lead, epoch, isr, controller_epoch = L.decode_state(path, data)
        assert lead == leader and follower in isr
        # what the controller writes for a dead ISR member: same leader and epoch, with
        # its state change notification (how brokers learn of it)
        out = [r for r in isr if r != follower]
        data = L.encode_state(_state(lead, epoch, out), controller_epoch)
        t = zk.transaction()
        t.set_data(path, data, version=stat.version)
        t.create(f"{L.STATE_CHANGES}/{L.STATE_CHANGE_PREFIX}",
                 L.encode_state_change(topic, 0, stat.version + 1, data), sequence=True)
        assert not any(isinstance(r, Exception) for r in t.commit())
    finally:
        zk.stop()
        zk.close()
    # the leader itself writes the follower back (it is caught up), and says so
    wait_until(lambda: any(f"{topic}-0:" in line and f"(broker {follower} caught up)" in line
                           for line in list(cluster.brokers[leader].log)), 20, 0.1,
               f"the leader to take broker {follower} back into the ISR")
    cluster.wait_isr(topic, 0, lambda isr: isr == {1, 2, 3}, 20)


def _state(leader: int, epoch: int, isr: list[int]) -> Any:
    from headrace.metadata.store import PartitionState

    return PartitionState(leader=leader, leader_epoch=epoch, isr=isr, replicas=[1, 2, 3])
