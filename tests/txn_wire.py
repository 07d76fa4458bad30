"""A transactional producer spoken by hand over the wire (issue 23): FindCoordinator,
InitProducerId, AddPartitionsToTxn, Produce and EndTxn as a client sends them, so that a
test can also send what no well-behaved client would (a producer id never issued, a
partition never added)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from tests.batches import make_batch
from tests.kafka_wire import WireClient

RETRIABLE = (ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
             ErrorCode.not_coordinator, ErrorCode.concurrent_transactions)


def now_ms() -> int:
    """A record timestamp a minute in the past, taken when the batch is made (not at
    import: a test run can start its module's tests many minutes after collecting it, and
    a transaction "started" then looks hanging to ``find-hanging``'s 15-minute default)."""
    return (int(time.time()) - 60) * 1000


def _retry(fn: Any, what: str, timeout_s: float = 60.0) -> Any:
    """``fn()`` until its error is not a retriable coordinator error."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = fn()
        code = ErrorCode(r.error_code)
        if code not in RETRIABLE or time.monotonic() > deadline:
            assert code == ErrorCode.none, f"{what}: {code.name}"
            return r
        time.sleep(0.1)


def coordinator(wc: WireClient, tid: str, timeout_s: float = 60.0) -> tuple[int, str, int]:
    """(node id, host, port) of ``tid``'s transaction coordinator (FindCoordinator v4)."""
    def find() -> Any:
        r = wc.request(10, 4, {"key_type": 1, "coordinator_keys": [tid]})
        return r.coordinators[0]
    c = _retry(find, f"FindCoordinator {tid}", timeout_s)
    return int(c.node_id), str(c.host), int(c.port)


def init_producer(wc: WireClient, tid: str, timeout_ms: int = 60_000) -> tuple[int, int]:
    """InitProducerId v3 for ``tid`` on its coordinator ``wc``: (producer id, epoch)."""
    r = _retry(lambda: wc.request(22, 3, {
        "transactional_id": tid, "transaction_timeout": timeout_ms,
        "producer_id": -1, "producer_epoch": -1}), f"InitProducerId {tid}")
    return int(r.producer_id), int(r.producer_epoch)


def add_partitions(wc: WireClient, tid: str, pid: int, epoch: int, topic: str,
                   partitions: list[int]) -> None:
    def add() -> Any:
        r = wc.request(24, 3, {"v3_and_below_transactional_id": tid,
                               "v3_and_below_producer_id": pid,
                               "v3_and_below_producer_epoch": epoch,
                               "v3_and_below_topics": [{"name": topic,
                                                        "partitions": partitions}]})
        first = r.results_by_topic_v3_and_below[0].results_by_partition[0]
        return SimpleNamespace(error_code=first.partition_error_code)

    _retry(add, f"AddPartitionsToTxn {tid}")


def end_txn(wc: WireClient, tid: str, pid: int, epoch: int, commit: bool) -> None:
    _retry(lambda: wc.request(26, 3, {"transactional_id": tid, "producer_id": pid,
                                      "producer_epoch": epoch, "committed": commit}),
           f"EndTxn {tid}")


def txn_batch(pid: int, epoch: int, seq: int, values: list[bytes]) -> bytes:
    ts = now_ms()
    return make_batch([(None, v, ts + i, []) for i, v in enumerate(values)],
                      producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                      transactional=True)


def produce(wc: WireClient, tid: str | None, topic: str, partition: int, records: bytes,
            acks: int = -1) -> Any:
    """Produce v9 of one batch: the partition's response (error_code, error_message,
    base_offset)."""
    resp = wc.request(0, 9, {"transactional_id": tid, "acks": acks, "timeout": 10_000,
                             "topic_data": [{"name": topic, "partition_data": [
                                 {"index": partition, "records": records}]}]})
    (p,) = resp.responses[0].partition_responses
    return p


def offsets(wc: WireClient, topic: str, partition: int) -> tuple[int, int]:
    """(high watermark, last stable offset) by ListOffsets latest, read_uncommitted and
    read_committed."""
    out = []
    for isolation in (0, 1):
        resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": isolation, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition,
                                            "timestamp": -1}]}]})
        (p,) = resp.topics[0].partitions
        assert p.error_code == ErrorCode.none, ErrorCode(p.error_code).name
        out.append(int(p.offset))
    return out[0], out[1]
