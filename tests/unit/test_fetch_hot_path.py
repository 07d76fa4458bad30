"""The hand-encoded Fetch path on the wire: every version decodes, partial batches are cut
whole, and a backlog above ``partition_max_bytes`` satisfies a large ``min_bytes`` at once
(Kafka's DelayedFetch counts such a partition as ``partition_max_bytes`` available)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from tests.batches import make_batch
from tests.brokerproc import BrokerProcess
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

from headrace.protocol.records import split_batches

BATCH_RECORDS = 50
VALUE = b"v" * 1000


@pytest.fixture(scope="module")
def topic_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str,
                                                                              Any]]:
    data: Path = tmp_path_factory.mktemp("fetchhot")
    with InProcessBroker(data, {"num.partitions": "1"}) as b:
        wc = WireClient.to(b.bootstrap)
        name = f"hot-{uuid.uuid4().hex[:8]}"
        resp = wc.request(19, 7, {"topics": [{
            "name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [],
            "configs": []}], "timeout": 10_000, "validate_only": False})
        assert resp.topics[0].error_code == ErrorCode.none
        topic_id = resp.topics[0].topic_id
        for _ in range(40):  # 40 batches of ~51 KB: 2 MB of backlog
            batch = make_batch([(None, VALUE, 1_700_000_000_000, [])] * BATCH_RECORDS)
            r = wc.request(0, 9, {"transactional_id": None, "acks": 1, "timeout": 10_000,
                                  "topic_data": [{"name": name, "partition_data": [
                                      {"index": 0, "records": batch}]}]})
            assert r.responses[0].partition_responses[0].error_code == ErrorCode.none
        yield b, name, (wc, topic_id)
        wc.close()


def _fetch(wc: WireClient, version: int, name: str, topic_id: Any, offset: int,
           part_max: int, min_bytes: int, max_wait_ms: int) -> Any:
    topic: dict[str, Any] = {"topic": name, "topic_id": topic_id, "partitions": [{
        "partition": 0, "fetch_offset": offset, "partition_max_bytes": part_max,
        "current_leader_epoch": -1, "log_start_offset": -1, "last_fetched_epoch": -1}]}
    resp = wc.request(1, version, {
        "replica_id": -1, "max_wait": max_wait_ms, "min_bytes": min_bytes,
        "max_bytes": 50 << 20, "isolation_level": 1, "session_id": 0, "session_epoch": -1,
        "topics": [topic], "forgotten_topics_data": [], "rack_id": ""})
    (t,) = resp.responses
    (p,) = t.partitions
    return p


@pytest.mark.parametrize("version", [4, 7, 11, 12, 13, 16])
def test_every_version_returns_whole_batches(topic_broker: Any, version: int) -> None:
    _, name, (wc, topic_id) = topic_broker
    p = _fetch(wc, version, name, topic_id, 60, 200_000, 1, 0)
    assert p.error_code == ErrorCode.none
    assert p.high_watermark == 40 * BATCH_RECORDS
    assert p.aborted_transactions == ()
    headers = split_batches(p.records, 1 << 20)
    assert 0 < len(p.records) <= 200_000
    assert sum(h.size for h in headers) == len(p.records)
    assert headers[0].base_offset == BATCH_RECORDS  # the batch holding offset 60
    assert [h.base_offset for h in headers] == [
        BATCH_RECORDS * (i + 1) for i in range(len(headers))]


def test_a_backlog_above_partition_max_bytes_meets_min_bytes_at_once(
        topic_broker: Any) -> None:
    _, name, (wc, topic_id) = topic_broker
    start = time.monotonic()
    p = _fetch(wc, 16, name, topic_id, 0, 1 << 20, 1 << 20, 5000)
    assert time.monotonic() - start < 2.0
    assert 0 < len(p.records) <= 1 << 20


def test_at_the_log_end_min_bytes_still_waits(topic_broker: Any) -> None:
    _, name, (wc, topic_id) = topic_broker
    start = time.monotonic()
    p = _fetch(wc, 16, name, topic_id, 40 * BATCH_RECORDS, 1 << 20, 1, 300)
    assert time.monotonic() - start >= 0.25
    assert p.records == b""
