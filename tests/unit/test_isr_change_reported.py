"""A leader's ISR change is reported once (one "ISR changed" log line entry and one count in
/metrics), whichever it sees first: the answer to its ZooKeeper write, or the written state
coming back through the metadata watch. Loaded CI run 44 failed
tests/cluster/test_replication.py's rejoin test although the follower was back in the ISR:
the watch had settled the pending change first, and the write's answer then found nothing
pending and reported nothing (no "(broker 1 caught up)" line, no IsrExpandsPerSec count).
Run on a stand-in node with a real partition and log; the store's write is held until the
test lets it answer."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
from tests.batches import simple_batch

from headrace.broker.cluster_node import ClusterNode
from headrace.broker.metrics import BrokerMetrics
from headrace.broker.replica_manager import Partition, TopicPartition
from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log.partition_log import PartitionLog
from headrace.metadata.store import PartitionState

TP = TopicPartition("t", 0)


class HeldStore:
    """``update_isrs`` answers (the next version of each state) once ``answer`` is set."""

    def __init__(self) -> None:
        self.answer = threading.Event()
        self.asked = threading.Event()

    def update_isrs(self, items: list[tuple[str, int, PartitionState]]) -> list[int | None]:
        self.asked.set()
        assert self.answer.wait(10)
        return [st.zk_version + 1 for _, _, st in items]

    def broker(self, node_id: int) -> Any:
        return NS(node_id=node_id)

    def controlled_shutdown_requests(self) -> list[int]:
        return []


def _node(tmp_path: Path) -> tuple[Any, Partition, HeldStore]:
    clock = ManualClock()
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), clock)
    log.append_as_leader(simple_batch(3, value_size=10), leader_epoch=0)
    state = PartitionState(leader=1, leader_epoch=0, isr=[1, 2], replicas=[1, 2, 3],
                           zk_version=4)
    p = Partition(TP, log, state, leading=False)
    p.leading = True
    p.become_leader(0)
    store = HeldStore()
    node: Any = ClusterNode.__new__(ClusterNode)
    node.node_id = 1
    node.fenced = False
    node.store = store
    node.replicas = NS(partitions={TP: p}, wake=lambda tp: None)
    tasks: list[Any] = []
    node.broker = NS(clock=clock, track=tasks.append, metrics=BrokerMetrics(NS()))
    node.fetchers = NS(fetching=lambda tp: None)
    node._isr_queue = []
    node._isr_writer = None
    node._isr_changes = []
    return node, p, store


def _expand(node: Any, p: Partition) -> None:
    """Follower 3 fetched at the log end: the leader proposes it for the ISR."""
    p.follower_fetched(3, p.log.log_end_offset, 0)
    p.follower_fetched(2, p.log.log_end_offset, 0)
    ClusterNode.follower_fetched(node, p, 3)
    assert p.core is not None and p.core.pending is not None


@pytest.mark.parametrize("watch_first", [True, False])
def test_an_isr_change_is_reported_once_whichever_is_seen_first(
        tmp_path: Path, watch_first: bool) -> None:
    async def run() -> Any:
        node, p, store = _node(tmp_path)
        written = replace(p.state, isr=[1, 2, 3], zk_version=5)
        _expand(node, p)
        await asyncio.to_thread(store.asked.wait, 10)
        if watch_first:  # the watch delivers our write before its answer is read
            ClusterNode._transition(node, p, written)
            assert p.core is not None and p.core.pending is None and p.state.isr == [1, 2, 3]
            store.answer.set()
            await node._isr_writer
        else:
            store.answer.set()
            await node._isr_writer
            ClusterNode._transition(node, p, written)  # the same state: nothing new
        return node, p

    node, p = asyncio.run(run())
    assert p.state.isr == [1, 2, 3]
    metrics = node.broker.metrics
    assert (metrics.isr_expands, metrics.isr_shrinks) == (1, 0)
    assert node._isr_changes == ["t-0: [1, 2] -> [1, 2, 3] (broker 3 caught up)"]


def test_an_isr_the_controller_changes_while_ours_is_pending_is_counted(
        tmp_path: Path) -> None:
    """A state with another ISR than our pending change is someone else's decision: it is
    counted (and ours then fails), ours is not."""
    async def run() -> Any:
        node, p, store = _node(tmp_path)
        _expand(node, p)
        await asyncio.to_thread(store.asked.wait, 10)
        ClusterNode._transition(node, p, replace(p.state, isr=[1], zk_version=5))
        assert p.core is not None and p.core.pending is None
        store.answer.set()
        await node._isr_writer
        return node, p

    node, p = asyncio.run(run())
    assert p.state.isr == [1]
    assert (node.broker.metrics.isr_expands, node.broker.metrics.isr_shrinks) == (0, 1)
    assert node._isr_changes == []
