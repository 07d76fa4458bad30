"""Produce requests pipelined on one connection (fast twin of tests/cluster/test_failover.py's
``test_produce_requests_pipeline_on_one_connection``): consecutive Produce requests are applied
in request order and answered in request order, and a request of another kind after them is
answered after them, on an in-process broker. (What only a cluster shows, the acks=all waits
side by side, is the leader partition's rule in tests/unit/replication/.)
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

from kio.schema.errors import ErrorCode

from tests.batches import simple_batch
from tests.clients import create_topic
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient


def test_pipelined_produce_requests_are_applied_and_answered_in_order(data_dir: Path) -> None:
    with InProcessBroker(data_dir) as b:
        create_topic("confluent", b.bootstrap, "t", 2)
        with WireClient.to(b.bootstrap, timeout_s=30) as wc:
            frames, expected = b"", []
            for i in range(24):
                if i == 12:  # another API in the middle waits for the produces before it
                    frames += wc.encode(18, 3, {"client_software_name": "x",
                                                "client_software_version": "1"})
                    expected.append((wc.correlation_id, None))
                frames += wc.encode(0, 9, {
                    "transactional_id": None, "acks": -1, "timeout": 10_000,
                    "topic_data": [{"name": "t", "partition_data": [
                        {"index": i % 2, "records": simple_batch(1 + i % 3)}]}]})
                expected.append((wc.correlation_id, i % 2))
            wc.send_raw(frames)
            got = []
            deadline = time.monotonic() + 30
            for _ in expected:
                assert time.monotonic() < deadline
                got.append(struct.unpack(">i", wc.recv_frame()[:4])[0])
            assert got == [cid for cid, _ in expected]
        # applied in request order: each partition's batches at consecutive base offsets
        with WireClient.to(b.bootstrap) as wc:
            resp = wc.request(1, 12, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                "isolation_level": 0, "forgotten_topics_data": [],
                "topics": [{"topic": "t", "partitions": [
                    {"partition": p, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                    for p in (0, 1)]}]})
            for p in resp.responses[0].partitions:
                assert p.error_code == ErrorCode.none
                sizes = [1 + i % 3 for i in range(24) if i % 2 == p.partition_index]
                assert p.high_watermark == sum(sizes)
                bases, pos, raw = [], 0, bytes(p.records or b"")
                while pos < len(raw):
                    base, length = struct.unpack_from(">qi", raw, pos)
                    bases.append(base)
                    pos += 12 + length
                assert bases == [sum(sizes[:k]) for k in range(len(sizes))]
