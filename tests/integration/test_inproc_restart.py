"""Fast twins of restart and damaged-data-dir tests (issue 22 item 1): an in-process broker
(tests/inproc.py) stopped and started again on the same data dir, where the slow tests use a
broker process stopped with SIGTERM or kill -9 (tests/fault/, the ``slow`` restart tests of
test_offsets.py and test_admin_apis.py). A clean stop in the same process proves that the
state is stored and read back; what kill -9 adds (recovery of a torn tail, no stale lock) is
twinned in tests/unit/test_log.py and tests/unit/test_data_dir.py.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KTopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from tests.batches import simple_batch
from tests.clients import Rec, consume, create_topic, produce
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

FAST = {"group.initial.rebalance.delay.ms": "0", "num.partitions": "1"}


def _metadata(wc: WireClient, topic: str) -> Any:
    return wc.request(3, 12, {"topics": [{"name": topic, "topic_id": None}],
                              "allow_auto_topic_creation": False,
                              "include_topic_authorized_operations": False}).topics[0]


def _list_offset(wc: WireClient, topic: str, partition: int, timestamp: int) -> Any:
    resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [
            {"partition_index": partition, "current_leader_epoch": -1,
             "timestamp": timestamp}]}]})
    (p,) = resp.topics[0].partitions
    return p


def _produce_wire(wc: WireClient, topic: str, partition: int) -> Any:
    resp = wc.request(0, 9, {"transactional_id": None, "acks": -1, "timeout": 10_000,
                             "topic_data": [{"name": topic, "partition_data": [
                                 {"index": partition, "records": simple_batch(2)}]}]})
    (p,) = resp.responses[0].partition_responses
    return p


def _fetch_error(wc: WireClient, topic: str, partition: int) -> int:
    resp = wc.request(1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
        "isolation_level": 0, "forgotten_topics_data": [],
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
    (p,) = resp.responses[0].partitions
    return int(p.error_code)


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = c.committed([KTopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return [tp.offset for tp in tps]
    finally:
        c.close()


def test_a_restart_keeps_records_topic_ids_commits_and_the_log_start(data_dir: Path) -> None:
    """R-LOG-4, R-GRP-6, R-PROTO-2 and DeleteRecords' stored start (twins of
    test_restart_and_corruption.py's graceful restart, test_offsets.py's and
    test_group_restart.py's restarts and test_admin_apis.py's delete_records_survives_a_restart):
    every record, the topic id, the group's committed offsets and a moved log start are what
    they were before the stop."""
    b = InProcessBroker(data_dir, FAST).start()
    try:
        create_topic("confluent", b.bootstrap, "t", 3)
        recs = [Rec(p, None, f"v{p}-{i}".encode()) for p in range(3) for i in range(10)]
        produce("confluent", b.bootstrap, "t", recs)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g"})
        try:
            c.commit(offsets=[KTopicPartition("t", p, 3 + p) for p in range(3)],
                     asynchronous=False)
        finally:
            c.close()
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for fut in admin.delete_records([KTopicPartition("t", 2, 4)]).values():
            fut.result(15)
        with WireClient.to(b.bootstrap) as wc:
            topic_id = _metadata(wc, "t").topic_id
        b.stop()
        b.start()
        with WireClient.to(b.bootstrap) as wc:
            assert _metadata(wc, "t").topic_id == topic_id
            assert _list_offset(wc, "t", 2, -2).offset == 4  # earliest: the stored start
            assert _list_offset(wc, "t", 1, -2).offset == 0
            assert _list_offset(wc, "t", 0, -1).offset == 10  # latest
        assert _committed(b.bootstrap, "g", "t", 3) == [3, 4, 5]
        got = consume("confluent", b.bootstrap, "t", [0, 1], 20)
        assert sorted((r.partition, r.value) for r in got) == sorted(
            (r.partition, r.value) for r in recs if r.partition < 2)
    finally:
        b.stop()


def _damage_dir_is_a_file(d: Path) -> None:
    shutil.rmtree(d)
    d.write_bytes(b"not a directory")


def _damage_segment_is_a_dir(d: Path) -> None:
    (seg,) = sorted(d.glob("*.log"))[:1]
    seg.unlink()
    seg.mkdir()


@pytest.mark.parametrize("damage", [_damage_dir_is_a_file, _damage_segment_is_a_dir],
                         ids=["partition-dir-is-a-file", "segment-is-a-directory"])
def test_a_broker_starts_and_serves_with_one_unreadable_partition(
        data_dir: Path, damage: Callable[[Path], None], caplog: pytest.LogCaptureFixture) -> None:
    """Twin of tests/fault/test_unreadable_partition.py (issue 8 item 13, R-NF-1): one
    line for the partition it cannot open, KAFKA_STORAGE_ERROR for it, the others served."""
    b = InProcessBroker(data_dir).start()
    try:
        create_topic("confluent", b.bootstrap, "t", 3)
        produce("confluent", b.bootstrap, "t",
                [Rec(p, None, f"v{p}-{i}".encode()) for p in range(3) for i in range(10)])
        b.stop()
        damage(data_dir / "t-1")
        with caplog.at_level(logging.WARNING):
            b.start()
        lines = [r.getMessage() for r in caplog.records
                 if "t-1" in r.getMessage() and "offline" in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in caplog.records]
        with WireClient.to(b.bootstrap) as wc:
            assert _produce_wire(wc, "t", 1).error_code == ErrorCode.kafka_storage_error
            assert _fetch_error(wc, "t", 1) == ErrorCode.kafka_storage_error
            assert _list_offset(wc, "t", 1, -1).error_code == ErrorCode.kafka_storage_error
            assert _produce_wire(wc, "t", 0).error_code == ErrorCode.none
            assert _fetch_error(wc, "t", 2) == ErrorCode.none
            assert _list_offset(wc, "t", 2, -1).offset == 10
            meta = {p.partition_index: p for p in _metadata(wc, "t").partitions}
            assert meta[1].error_code == ErrorCode.leader_not_available
            assert (meta[1].leader_id, tuple(meta[1].offline_replicas)) == (-1, (0,))
            assert meta[2].error_code == ErrorCode.none and meta[2].leader_id == 0
        got = consume("confluent", b.bootstrap, "t", [0, 2], 22)
        assert sorted((r.partition, r.offset) for r in got) == (
            [(0, i) for i in range(12)] + [(2, i) for i in range(10)])
    finally:
        b.stop()


@pytest.mark.parametrize("name", ["__consumer_offsets", "__transaction_state"])
def test_delete_topics_refuses_internal_topics(data_dir: Path, name: str) -> None:
    """Twin of tests/fault/test_delete_crash.py's (issue 8 item 7): DeleteTopics of a topic
    the broker owns is refused with INVALID_TOPIC_EXCEPTION, and it stays."""
    from confluent_kafka import KafkaError

    with InProcessBroker(data_dir, FAST) as b:
        create_topic("confluent", b.bootstrap, "t", 1)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}"})
        try:  # a group commit creates __consumer_offsets
            c.commit(offsets=[KTopicPartition("t", 0, 0)], asynchronous=False)
        finally:
            c.close()
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        existed = name in admin.list_topics(timeout=10).topics
        with pytest.raises(KafkaException) as e:
            admin.delete_topics([name], operation_timeout=10)[name].result(15)
        assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION
        assert (name in admin.list_topics(timeout=10).topics) == existed
        if name == "__consumer_offsets":
            assert existed
