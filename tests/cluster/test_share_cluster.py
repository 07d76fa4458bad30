"""Share groups through a leader failover on a 3-broker cluster (KIP-932, issue 25): the
share-partition's state is reloaded by the new leader from ``__share_group_state``
(RF 3): nothing acknowledged is delivered again, nothing is lost."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from tests.clusterproc import Cluster
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]

RECORDS = 100


def test_a_share_partitions_state_survives_its_leaders_death(healthy: Cluster) -> None:
    cluster = healthy
    topic, group = f"sq-{uuid.uuid4().hex[:6]}", f"sg-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for f in admin.incremental_alter_configs([ConfigResource(
            ResourceType.GROUP, group, incremental_configs=[ConfigEntry(
                "share.auto.offset.reset", "earliest",
                incremental_operation=AlterConfigOpType.SET)])]).values():
        f.result(15)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(RECORDS):
        p.produce(topic, str(i).encode(), partition=0)
        if (i + 1) % 10 == 0:
            assert p.flush(30) == 0
    c = ShareConsumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                       "share.acknowledgement.mode": "explicit", "max.poll.records": 10})
    c.subscribe([topic])
    accepted: set[int] = set()
    delivered: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(accepted) < 40 and time.monotonic() < deadline:
            for m in c.poll(0.5) or []:
                if m.error():
                    continue
                delivered.append(int(m.value()))
                c.acknowledge(m, AcknowledgeType.ACCEPT)
                accepted.add(int(m.value()))
            c.commit_sync()
        assert len(accepted) >= 40
        committed = set(accepted)  # every commit_sync above succeeded
        victim = cluster.leader(topic, 0)
        cluster.brokers[victim].kill()  # the share-partition's leader, with its memory
        cluster.wait_leader(topic, 0, lambda x: x >= 0 and x != victim)
        deadline = time.monotonic() + 120
        while len(accepted) < RECORDS and time.monotonic() < deadline:
            for m in c.poll(0.5) or []:
                if m.error():
                    continue
                value = int(m.value())
                assert value not in committed, \
                    f"{value}: its acknowledgement was committed, yet it came again"
                delivered.append(value)
                c.acknowledge(m, AcknowledgeType.ACCEPT)
                accepted.add(value)
            pending = accepted - committed
            try:
                c.commit_sync()
                committed |= pending
            except Exception:  # the leader moved under it: it may come again (at least once)
                pass
    finally:
        c.close()
    assert accepted == set(range(RECORDS))  # nothing lost
    # DescribeShareGroupOffsets v1 from the group's coordinator: the start offset past
    # every record and lag 0, the high watermark asked of the partition's leader
    with WireClient.to(cluster.live_bootstrap().split(",")[0]) as wc:
        (c0,) = wc.request(10, 4, {"key_type": 0, "coordinator_keys": [group]}).coordinators
    assert c0.error_code == 0
    deadline = time.monotonic() + 30
    while True:
        with WireClient(str(c0.host), int(c0.port)) as wc:
            resp = wc.request(90, 1, {"groups": [{"group_id": group, "topics": None}]})
        (g,) = resp.groups
        rows = [(int(p.start_offset), int(p.lag)) for t in g.topics for p in t.partitions]
        if rows == [(RECORDS, 0)] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert rows == [(RECORDS, 0)]
