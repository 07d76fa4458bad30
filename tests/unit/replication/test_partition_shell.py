"""``broker.replica_manager.Partition``, the shell the broker runs over ``PartitionLeader``:
a newer partition state at the leader's epoch settles a pending ISR change, and when it
does not list that change's ISR (the controller decided otherwise) the leader takes the
state's ISR, never keeps its own (Kafka's ``Partition`` takes the ISR of a newer partition
epoch). The simulation's shell found the second half missing in itself (seed 24946:
the high watermark moved past a follower ZooKeeper listed in sync, which was then
elected, and an acknowledged record was lost)."""

from __future__ import annotations

from pathlib import Path

from tests.batches import make_batch

from headrace.broker.replica_manager import Partition, TopicPartition
from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log.partition_log import PartitionLog
from headrace.metadata.store import PartitionState

T0 = 1_700_000_000_000


def leader_of(tmp_path: Path, isr: list[int]) -> Partition:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), ManualClock(wall_ms=T0))
    log.assign_epoch(0, 0)
    state = PartitionState([1, 2, 0], 1, 0, isr, zk_version=1)
    p = Partition(TopicPartition("t", 0), log, state)
    p.become_leader(T0)
    return p


def produce(p: Partition, n: int) -> None:
    p.log.append_as_leader(
        make_batch([(None, b"v%d" % i, T0 + i, []) for i in range(n)]), 0)


def test_a_newer_state_not_listing_the_pending_isr_is_taken_whole(tmp_path: Path) -> None:
    p = leader_of(tmp_path, [1, 2])
    produce(p, 10)
    p.follower_fetched(2, 10, T0)  # broker 2 in sync at 10
    assert p.core is not None and p.core.high_watermark == 10
    p.follower_fetched(0, 10, T0)  # broker 0 caught up to the high watermark
    change = p.maybe_expand_isr(0)
    assert change is not None and change.isr == (1, 2, 0)
    produce(p, 4)  # 14: brokers 0 and 2 at 10
    # the controller, from a state it read with broker 0 in the ISR, removed broker 2
    p.update_state(PartitionState([1, 2, 0], 1, 0, [1, 0], zk_version=3), T0 + 1)
    assert p.core.pending is None
    assert set(p.core.isr) == {1, 0}
    # broker 2 catches up; the high watermark must still wait for broker 0 (in sync in
    # ZooKeeper), never move over the leader's old ISR [1, 2]
    p.follower_fetched(2, 14, T0 + 2)
    assert p.core.high_watermark == p.log.high_watermark == 10
    p.follower_fetched(0, 14, T0 + 3)
    assert p.core.high_watermark == p.log.high_watermark == 14


def test_a_newer_state_listing_the_pending_isr_commits_it(tmp_path: Path) -> None:
    p = leader_of(tmp_path, [1, 2])
    produce(p, 10)
    p.follower_fetched(2, 10, T0)
    p.follower_fetched(0, 10, T0)
    change = p.maybe_expand_isr(0)
    assert change is not None and p.core is not None
    p.update_state(PartitionState([1, 2, 0], 1, 0, [1, 2, 0], zk_version=2), T0 + 1)
    assert p.core.pending is None and set(p.core.isr) == {1, 2, 0}
