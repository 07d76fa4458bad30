"""Process lanes (issue 14): a CPU-bound handler in worker processes, on a real broker.

- with 2 process lanes the handler runs in two worker processes (their pids), both get
  work, and every record is handled exactly once with its own value (whether that is
  faster than 1 lane needs a free second core: bench/process_lanes.py measures it);
- a process bolt's emits reach the next stage (in the consumer process) anchored to their
  record, and a record whose handler raises is retried until it succeeds.

The kill -9 of a worker process is in tests/fault/test_process_lane_kill.py.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from headrace.reliable import Item, ReliableConsumer, Topology
from headrace.reliable.topology import Record
from tests.brokerproc import BrokerProcess
from tests.integration.test_reliable import create_and_fill

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("process-lanes-broker")
    with BrokerProcess(data, {"group.initial.rebalance.delay.ms": "0"}) as b:
        yield b


def pid_and_value(record: Record) -> list[tuple[Any, ...]]:
    """Emits (worker pid, partition, offset, value): which process handled the record. A
    little CPU per record, so a lane is still busy when the next batch comes and the
    consumer hands that batch to the other lane."""
    x = 0
    for i in range(3_000):
        x += i * i
    assert x > 0
    return [(os.getpid(), record.partition, record.offset, record.value)]


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


def conf(broker: BrokerProcess) -> dict[str, Any]:
    return {"bootstrap.servers": broker.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest"}


def test_two_process_lanes_run_the_handler_in_two_worker_processes(
        broker: BrokerProcess) -> None:
    """2 process lanes: the handler runs in two worker processes (neither is the consumer's
    own), both get batches, and every record is handled exactly once with its own value,
    the results reaching the next stage in the consumer process. Whether that is faster
    than 1 lane depends on a free second core: bench/process_lanes.py measures it."""
    topic = f"cpu-{uuid.uuid4().hex[:6]}"
    n = 2_000
    values = [f"v{i}" for i in range(n)]
    create_and_fill(broker.bootstrap, topic, 4, values)
    seen: list[tuple[int, int, int, bytes]] = []

    def sink(item: Item, _out: Any) -> None:
        seen.append(item.values)  # type: ignore[arg-type]

    commits: dict[Any, int] = {}
    topology = Topology().process_bolt("work", pid_and_value, 2).basic_bolt("sink", sink)
    rc = ReliableConsumer(conf(broker), [topic], topology, poll_batch=50,
                          offset_commit_period_ms=50, on_commit=commits.update)
    try:
        deadline = time.monotonic() + 120
        while sum(commits.values()) < n:
            assert time.monotonic() < deadline, commits
            rc.poll_once()
        workers = set(rc.worker_pids())
    finally:
        rc.close()
    assert len(workers) == 2 and os.getpid() not in workers, workers
    handled_by = {pid for pid, _p, _o, _v in seen}
    assert handled_by == workers, (handled_by, workers)  # both lanes' processes did work
    assert len(seen) == n and len({(p, o) for _pid, p, o, _v in seen}) == n
    # fill() sends value i to partition i % 4: offset o of partition p holds v(4o + p)
    assert all(v == values[4 * o + p].encode() for _pid, p, o, v in seen)
    assert sorted(commits.values()) == [n // 4] * 4, commits  # all committed, per partition


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
