"""One unreadable partition at start-up (issue 8, item 13; R-NF-1).

Before the fix one partition whose log could not be opened stopped the whole broker from
starting. Now the broker starts, logs one line naming the partition, and answers produce,
fetch and list-offsets on it with KAFKA_STORAGE_ERROR while every other partition works.
The damage is made as a person or a failing disk would: the partition directory replaced
by a file, or a segment file replaced by a directory (file permissions do not stop root,
which the tests run as).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tests.batches import simple_batch
from tests.brokerproc import BrokerProcess
from tests.clients import Rec, consume, create_topic, produce
from tests.kafka_wire import WireClient


def _produce(wc: WireClient, topic: str, partition: int) -> Any:
    resp = wc.request(0, 9, {"transactional_id": None, "acks": -1, "timeout": 10_000,
                             "topic_data": [{"name": topic, "partition_data": [
                                 {"index": partition, "records": simple_batch(2)}]}]})
    (p,) = resp.responses[0].partition_responses
    return p


def _fetch(wc: WireClient, topic: str, partition: int) -> Any:
    resp = wc.request(1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
        "isolation_level": 0, "forgotten_topics_data": [],
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
    (p,) = resp.responses[0].partitions
    return p


def _list_latest(wc: WireClient, topic: str, partition: int) -> Any:
    resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [
            {"partition_index": partition, "current_leader_epoch": -1, "timestamp": -1}]}]})
    (p,) = resp.topics[0].partitions
    return p


def _damage_dir_is_a_file(d: Path) -> None:
    shutil.rmtree(d)
    d.write_bytes(b"not a directory")


def _damage_segment_is_a_dir(d: Path) -> None:
    (seg,) = sorted(d.glob("*.log"))[:1]
    seg.unlink()
    seg.mkdir()


@pytest.mark.parametrize("damage", [_damage_dir_is_a_file, _damage_segment_is_a_dir],
                         ids=["partition-dir-is-a-file", "segment-is-a-directory"])
def test_broker_starts_and_serves_with_one_unreadable_partition(
    data_dir: Path, damage: Any
) -> None:
    """Issue 8 item 13, R-NF-1: the broker starts with one partition it cannot open,
    logs one line for it, answers KAFKA_STORAGE_ERROR for it, serves the others."""
    b = BrokerProcess(data_dir).start()
    try:
        create_topic("confluent", b.bootstrap, "t", 3)
        produce("confluent", b.bootstrap, "t",
                [Rec(p, None, f"v{p}-{i}".encode()) for p in range(3) for i in range(10)])
        b.stop()
        damage(data_dir / "t-1")
        b.start()
        lines = [ln for ln in b.stderr_lines if "t-1" in ln and "offline" in ln]
        assert len(lines) == 1, b.stderr_lines
        assert not [ln for ln in b.stderr_lines if "Traceback" in ln]
        with WireClient.to(b.bootstrap) as wc:
            assert _produce(wc, "t", 1).error_code == ErrorCode.kafka_storage_error
            assert _fetch(wc, "t", 1).error_code == ErrorCode.kafka_storage_error
            assert _produce(wc, "t", 0).error_code == ErrorCode.none
            assert _fetch(wc, "t", 2).error_code == ErrorCode.none
            assert _list_latest(wc, "t", 1).error_code == ErrorCode.kafka_storage_error
            assert _list_latest(wc, "t", 2).offset == 10
            # Metadata says what Kafka says of a replica on an offline log dir
            meta = {p.partition_index: p for p in wc.request(3, 12, {
                "topics": [{"name": "t", "topic_id": None}],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False}).topics[0].partitions}
            assert meta[1].error_code == ErrorCode.leader_not_available
            assert (meta[1].leader_id, tuple(meta[1].offline_replicas)) == (-1, (0,))
            assert meta[2].error_code == ErrorCode.none and meta[2].leader_id == 0
        got = consume("confluent", b.bootstrap, "t", [0, 2], 22)
        assert sorted((r.partition, r.offset) for r in got) == (
            [(0, i) for i in range(12)] + [(2, i) for i in range(10)])
        assert not [ln for ln in b.stderr_lines if "Traceback" in ln]
    finally:
        b.kill()
