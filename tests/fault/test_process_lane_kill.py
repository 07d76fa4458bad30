"""kill -9 of a process lane's worker (issue 14): nothing is lost, nothing is committed past
an unprocessed record.

A ``process_bolt`` with 2 worker processes burns CPU per record and emits (partition,
offset) to a basic bolt in the consumer process, which records it. While batches are in
flight one worker is killed with SIGKILL: its batch's roots fail, are replayed by the
spout's seek and processed by the restarted worker. Every commit is checked as it happens:
each offset below it reached the sink. At the end every record reached the sink and both
partitions are committed to their end.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from headrace.reliable import Item, ReliableConsumer, Topology
from headrace.reliable.topology import Record
from tests.brokerproc import BrokerProcess
from tests.integration.test_reliable import create_and_fill

PARTITIONS, PER_PARTITION = 2, 400
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("process-kill-broker")
    with BrokerProcess(data, {"group.initial.rebalance.delay.ms": "0"}) as b:
        yield b


def slow_emit(record: Record) -> list[tuple[Any, ...]]:
    """About 1 ms of CPU per record, then (partition, offset) to the next stage."""
    deadline = time.process_time() + 0.001
    while time.process_time() < deadline:
        pass
    return [(record.partition, record.offset)]


def test_kill_9_of_a_worker_process_loses_nothing(broker: BrokerProcess,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "headrace.reliable")
    topic = f"pkill-{uuid.uuid4().hex[:6]}"
    n = PARTITIONS * PER_PARTITION
    create_and_fill(broker.bootstrap, topic, PARTITIONS, [f"v{i}" for i in range(n)])
    done: set[tuple[int, int]] = set()
    commits: list[dict[int, int]] = []

    def sink(item: Item, _out: Any) -> None:
        done.add((item.values[0], item.values[1]))

    def on_commit(offsets: dict[Any, int]) -> None:
        for tp, offset in offsets.items():  # R-REL-4 at every commit, as it happens
            missing = [o for o in range(offset) if (tp.partition, o) not in done]
            assert not missing, f"commit {offset} on {tp} passes unprocessed {missing[:5]}"
        commits.append({tp.partition: o for tp, o in offsets.items()})

    rc = ReliableConsumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
         "auto.offset.reset": "earliest"}, [topic],
        Topology().process_bolt("work", slow_emit, 2).basic_bolt("sink", sink),
        poll_batch=50, offset_commit_period_ms=50, retry_backoff_ms=20,
        on_commit=on_commit)
    try:
        first_pids = rc.worker_pids()
        assert len(first_pids) == 2
        killed = None
        final: dict[int, int] = {}
        deadline = time.monotonic() + 90
        while any(final.get(p) != PER_PARTITION for p in range(PARTITIONS)):
            assert time.monotonic() < deadline, (final, len(done))
            rc.poll_once()
            for c in commits:
                final.update(c)
            if killed is None and len(done) >= n // 4:
                killed = first_pids[0]
                os.kill(killed, signal.SIGKILL)  # mid-stream: it holds a batch
        pids = rc.worker_pids()
    finally:
        rc.close()
    assert killed is not None and killed not in pids and len(pids) == 2
    assert first_pids[1] in pids  # only the killed lane restarted
    died = [r.getMessage() for r in caplog.records if "died" in r.getMessage()]
    assert len(died) == 1 and "failing" in died[0], died  # its batch failed, was replayed
    assert done == {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
