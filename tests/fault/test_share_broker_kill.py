"""Share groups across a kill -9 of the (single-node) broker (KIP-932, issue 25 item 3): every
acknowledgement a ShareConsumer's commit_sync saw succeed was written to
``__share_group_state`` before it was answered, so after the restart nothing acknowledged is
delivered again and nothing is lost (acquired, unacknowledged records come again)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from tests.brokerproc import BrokerProcess

pytestmark = pytest.mark.timeout(180)

RECORDS = 200
OVERRIDES = {"group.share.heartbeat.interval.ms": "500",
             "group.share.min.heartbeat.interval.ms": "500"}


def _consume(c: ShareConsumer, accepted: set[int], committed: set[int], until: int,
             timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(accepted) < until and time.monotonic() < deadline:
        msgs = [m for m in c.poll(0.5) or [] if not m.error()]
        for m in msgs:
            v = int(m.value())
            assert v not in committed, f"{v}: acknowledged and committed, yet delivered again"
            c.acknowledge(m, AcknowledgeType.ACCEPT)
            accepted.add(v)
        if msgs:
            try:
                c.commit_sync()
                committed |= {int(m.value()) for m in msgs}
            except Exception:  # the broker died under it: these may come again
                pass


def test_acknowledged_records_survive_a_kill_9(tmp_path: Path) -> None:
    topic, group = "sq", "sg"
    with BrokerProcess(tmp_path, OVERRIDES) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
        for f in admin.incremental_alter_configs([ConfigResource(
                ResourceType.GROUP, group, incremental_configs=[ConfigEntry(
                    "share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET)])]).values():
            f.result(15)
        p = Producer({"bootstrap.servers": b.bootstrap})
        for i in range(RECORDS):
            p.produce(topic, str(i).encode(), partition=0)
            if (i + 1) % 10 == 0:
                assert p.flush(30) == 0
        c = ShareConsumer({"bootstrap.servers": b.bootstrap, "group.id": group,
                           "share.acknowledgement.mode": "explicit",
                           "max.poll.records": 10})
        c.subscribe([topic])
        accepted: set[int] = set()
        committed: set[int] = set()
        try:
            _consume(c, accepted, committed, RECORDS // 2, 60)
            assert len(committed) >= RECORDS // 2 - 10
            b.kill()  # kill -9: nothing flushed beyond what the appends wrote
            b.start()
            _consume(c, accepted, committed, RECORDS, 90)
        finally:
            c.close()
    assert accepted == set(range(RECORDS))  # nothing lost
