"""Process lanes (issue 14): a CPU-bound handler in worker processes, on a real broker.

- with 2 process lanes a pure-Python CPU-bound handler runs faster than with 1 on this
  2-core machine (thread lanes cannot: the GIL), every record processed; skipped when the
  machine has no second core free (2 bare worker processes measured alongside gain < 1.4x);
- a process bolt's emits reach the next stage (in the consumer process) anchored to their
  record, and a record whose handler raises is retried until it succeeds.

The kill -9 of a worker process is in tests/fault/test_process_lane_kill.py.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from headrace.reliable import Item, ReliableConsumer, Topology
from headrace.reliable.processes import ProcessWorker
from headrace.reliable.topology import Record
from tests.brokerproc import BrokerProcess
from tests.integration.test_reliable import create_and_fill

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("process-lanes-broker")
    with BrokerProcess(data, {"group.initial.rebalance.delay.ms": "0"}) as b:
        yield b


def burn(record: Record) -> None:
    """About 0.3 ms of pure-Python CPU per record (holds the GIL throughout)."""
    x = 0
    for i in range(6_000):
        x += i * i
    assert x > 0


def once_then_emit(marks: str, record: Record) -> list[tuple[Any, ...]]:
    """Raises the first time it sees every 10th record (a marker file per record, created
    exclusively: the retry, maybe in another worker, finds it); emits (offset, value)."""
    if record.offset % 10 == 3:
        try:
            fd = os.open(os.path.join(marks, f"{record.partition}-{record.offset}"),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.close(fd)
            raise RuntimeError("first attempt fails")
    return [(record.partition, record.offset, record.value)]


def consume_all(rc: ReliableConsumer, n: int, timeout_s: float = 120.0) -> float:
    """Poll until ``n`` roots were dispatched and none is pending; records/s from the first
    dispatched record."""
    dispatched = 0
    t0 = None
    deadline = time.monotonic() + timeout_s
    while dispatched < n or rc.spout.num_pending_roots:
        assert time.monotonic() < deadline, (dispatched, rc.spout.num_pending_roots)
        got = rc.poll_once()
        if got and t0 is None:
            t0 = time.perf_counter()
        dispatched += got
    assert t0 is not None
    return n / (time.perf_counter() - t0)


def conf(broker: BrokerProcess) -> dict[str, Any]:
    return {"bootstrap.servers": broker.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest"}


def raw_workers(k: int, n: int) -> float:
    """records/s of ``burn`` in ``k`` bare worker processes (no consumer): what this machine
    can give 1 or 2 CPU-bound processes right now (other tests and users load it too)."""
    workers = [ProcessWorker(burn, f"raw-{i}") for i in range(k)]
    for w in workers:
        w.start()
    records = [("t", 0, o, None, b"v", (), None) for o in range(100)]
    threads = [threading.Thread(target=lambda w=w: [w.call(records)
                                                    for _ in range(n // 100 // k)])
               for w in workers]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = n / (time.perf_counter() - t0)
    for w in workers:
        w.stop()
    return rate


def test_a_cpu_bound_handler_gains_throughput_with_two_process_lanes(
        broker: BrokerProcess) -> None:
    """2 process lanes ≥ 1.3x 1 process lane and ≥ 1.3x 2 thread lanes, for a handler that
    holds the GIL. Skipped (with the numbers) when 2 bare worker processes measured in the
    same rounds gain less than 1.4x over 1: the machine has no second core to give."""
    topic = f"cpu-{uuid.uuid4().hex[:6]}"
    n = 3_000
    create_and_fill(broker.bootstrap, topic, 4, [f"v{i}" for i in range(n)])
    labels = ["raw-1", "raw-2", "process-1", "process-2", "thread-2"]
    rates: dict[str, list[float]] = {label: [] for label in labels}
    for _ in range(2):  # interleaved, best of 2 each
        for label in labels:
            kind, lanes = label.split("-")
            if kind == "raw":
                rates[label].append(raw_workers(int(lanes), n))
                continue
            topology = (Topology().process_bolt("burn", burn, int(lanes)) if kind == "process"
                        else Topology().basic_bolt("burn", lambda item, _o: burn(item.source),
                                                   int(lanes)))
            rc = ReliableConsumer(conf(broker), [topic], topology, poll_batch=100,
                                  offset_commit_period_ms=200)
            try:
                rates[label].append(consume_all(rc, n))
                assert rc.spout.num_pending_roots == 0
            finally:
                rc.close()
    best = {label: round(max(r)) for label, r in rates.items()}
    print(f"load {os.getloadavg()}: best records/s {best}")
    if best["raw-2"] < 1.4 * best["raw-1"]:
        pytest.skip(f"machine busy (load {os.getloadavg()[0]:.1f}): 2 bare workers gain only "
                    f"{best['raw-2'] / best['raw-1']:.2f}x over 1 ({best})")
    assert best["process-2"] >= 1.3 * best["process-1"], best
    assert best["process-2"] >= 1.3 * best["thread-2"], best


def test_emits_reach_the_next_stage_and_failed_records_are_retried(
        broker: BrokerProcess, tmp_path: Path) -> None:
    topic = f"emit-{uuid.uuid4().hex[:6]}"
    n = 400
    create_and_fill(broker.bootstrap, topic, 2, [f"v{i}" for i in range(n)])
    seen: list[tuple[int, int, bytes]] = []

    def sink(item: Item, _out: Any) -> None:
        seen.append(item.values)  # type: ignore[arg-type]
        assert item.source.offset == item.values[1]  # anchored to its own record

    commits: dict[Any, int] = {}
    topology = (Topology().process_bolt("work", partial(once_then_emit, str(tmp_path)), 2)
                .basic_bolt("sink", sink))
    rc = ReliableConsumer(conf(broker), [topic], topology, offset_commit_period_ms=50,
                          retry_backoff_ms=10, on_commit=commits.update)
    try:
        deadline = time.monotonic() + 60
        while sum(commits.values()) < n:
            assert time.monotonic() < deadline, commits
            rc.poll_once()
        assert rc.worker_pids() and len(set(rc.worker_pids())) == 2
    finally:
        rc.close()
    by_record = {(p, o) for p, o, _v in seen}
    assert len(by_record) == n  # every record reached the sink
    retried = len(os.listdir(tmp_path))
    assert retried == sum(1 for p in range(2) for o in range(n // 2) if o % 10 == 3)
    assert len(seen) == n  # each exactly once: the failed attempts emitted nothing
