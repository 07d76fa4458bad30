"""A follower's fetch session costs the leader what changed, not the session's size
(fetch_sessions.py, handlers/fetch.py ``_session_plan``; issue 21 item 5, R-REP-3).

The rules: a wake of a partition (``ReplicaManager.wake``: an append, a high watermark, a
leadership, ISR or log start change) marks it dirty in every session holding it and
completes the session's parked fetch; an incremental round looks at the partitions it
names and the dirty ones, and a partition it finds with something to send stays dirty;
every ``full_pass_ms`` a round looks at all of them, renewing the caught-up time of the
quiet ones."""

from __future__ import annotations

import asyncio
import gc
import random
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

from headrace.broker.fetch_sessions import FetchSessionCache
from headrace.broker.handlers.fetch import _full_pass_ms, _session_plan
from headrace.broker.replica_manager import ReplicaManager, TopicPartition
from headrace.broker.server import make_config
from headrace.clock import ManualClock
from headrace.metadata.store import BrokerInfo, LocalMetadataStore

FOLLOWER = 2


class FakePartition:
    """What ``_session_plan`` reads of a led partition."""

    def __init__(self, leo: int) -> None:
        self.leading = True
        self.leader_epoch = 1
        self.log = NS(log_end_offset=leo, high_watermark=leo, last_stable_offset=leo,
                      log_start_offset=0, leader_epochs=[(1, 0)])
        self.state = NS(replicas=(1, FOLLOWER), isr=(1, FOLLOWER))
        self.caught_up: list[int] = []

    def follower_caught_up(self, node_id: int, now_ms: int) -> None:
        self.caught_up.append(now_ms)


def make(n: int) -> tuple[Any, Any, dict[tuple[str, int], FakePartition]]:
    parts = {("t", i): FakePartition(10) for i in range(n)}
    state = NS(partitions=[None] * n)
    broker = NS(clock=NS(wall_ms=lambda: 1000), replicas=NS(partitions=parts),
                metadata=NS(topic=lambda name: state if name == "t" else None),
                follower_fetched=lambda *a: None)
    cache = FetchSessionCache(rng=random.Random(3))
    session = cache.create(FOLLOWER, [NS(topic="t", partitions=[
        NS(partition=i, fetch_offset=10, partition_max_bytes=1 << 20,
           current_leader_epoch=1, log_start_offset=0, last_fetched_epoch=1)
        for i in range(n)])], 0)
    assert session is not None
    for c in session.partitions.values():  # the full fetch told the follower this much
        c.must_respond(0, 0, 10, 10, 0)
    return broker, session, parts


def planned(plan: Any) -> set[tuple[str, int]]:
    return {(tp.topic, tp.partition) for tp in plan.tps()}


def test_a_round_reads_what_was_named_or_woken_not_the_whole_session() -> None:
    broker, session, parts = make(1000)
    parts[("t", 7)].log.log_end_offset = 11  # an append the follower has not fetched
    parts[("t", 9)].log.log_end_offset = 12
    session.dirty = {("t", 7)}  # only 7's append woke the session
    plan = _session_plan(broker, session, {("t", 3)}, FOLLOWER, False, True,
                         {("t", 3)} | session.dirty)
    # 3 is read because the follower named it (its read is its caught-up proof), 7 because
    # it was woken; 9 was not looked at, nor were the 997 others
    assert planned(plan) == {("t", 3), ("t", 7)}
    assert session.dirty == {("t", 3), ("t", 7)}  # looked at again next round
    assert not any(p.caught_up for p in parts.values())
    # the full pass finds 9 too, and renews every quiet partition's caught-up time
    plan = _session_plan(broker, session, set(), FOLLOWER, False, True, None)
    assert planned(plan) == {("t", 7), ("t", 9)}
    assert sum(1 for p in parts.values() if p.caught_up) == 998


def test_a_woken_partition_found_quiet_leaves_the_dirty_set() -> None:
    broker, session, parts = make(3)
    # woken (e.g. an ISR change that left nothing to send); the round takes the dirty set
    woken, session.dirty = {("t", 1)}, set()
    plan = _session_plan(broker, session, set(), FOLLOWER, False, True, woken)
    assert planned(plan) == set() and session.dirty == set()
    assert parts[("t", 1)].caught_up == [1000]  # looked at: caught up, as a read would say


def test_a_quiet_follower_out_of_the_isr_woken_while_parked_rejoins_at_the_next_round(
        ) -> None:
    """The controller took the caught-up follower out of the ISR (its session expired and
    came back) while its fetch was parked: the wake's re-read finds the partition quiet,
    but only a round's bookkeeping (``first``) proposes the follower again. It stays dirty
    for the next round instead of waiting for the full pass (up to 5 s)."""
    broker, session, parts = make(3)
    fetched: list[tuple[Any, int, int]] = []
    broker.follower_fetched = lambda part, replica, offset: fetched.append(
        (part, replica, offset))
    parts[("t", 1)].state.isr = (1,)  # update_state woke it: dirty, the parked fetch woken
    woken, session.dirty = {("t", 1)}, set()
    plan = _session_plan(broker, session, set(), FOLLOWER, False, False, woken)
    assert planned(plan) == set() and fetched == []
    assert session.dirty == {("t", 1)}  # kept for the next round
    # the follower's next request (an incremental round: named | dirty)
    candidates, session.dirty = session.dirty, set()
    plan = _session_plan(broker, session, set(), FOLLOWER, False, True, candidates)
    assert planned(plan) == set()
    assert fetched == [(parts[("t", 1)], FOLLOWER, 10)]  # proposed for the ISR again
    assert session.dirty == set()


def test_the_full_pass_comes_every_quarter_of_the_lag_time() -> None:
    broker = NS(config={"replica.lag.time.max.ms": "30000"})
    assert _full_pass_ms(broker) == 5000  # capped
    broker.config["replica.lag.time.max.ms"] = "3000"
    assert _full_pass_ms(broker) == 750
    broker.config["replica.lag.time.max.ms"] = "100"
    assert _full_pass_ms(broker) == 100
    _, session, _ = make(1)
    assert session.full_pass_due(10**6, 750)
    session.last_full_ms = 10**6
    assert not session.full_pass_due(10**6 + 749, 750)
    assert session.full_pass_due(10**6 + 750, 750)


def test_a_wake_marks_every_subscribed_session_and_completes_its_parked_fetch(
        tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    store = LocalMetadataStore(tmp_path, BrokerInfo(cfg.node_id, "127.0.0.1", 9092))
    rm = ReplicaManager(tmp_path, cfg, store, ManualClock())
    _, a, _ = make(2)
    _, b, _ = make(2)
    rm.subscribe_session(a, a.partitions)
    rm.subscribe_session(b, [("t", 1)])

    async def run() -> None:
        a.waiter = asyncio.get_running_loop().create_future()
        rm.wake(TopicPartition("t", 1))
        assert a.waiter.done()
        assert a.dirty == {("t", 1)} and b.dirty == {("t", 1)}
        rm.unsubscribe_session(b, [("t", 1)])
        rm.wake(TopicPartition("t", 0))
        assert a.dirty == {("t", 0), ("t", 1)} and b.dirty == {("t", 1)}
        # the broker stopping wakes every parked session
        a.waiter = asyncio.get_running_loop().create_future()
        rm.wake_sessions()
        assert a.waiter.done()

    asyncio.run(run())
    # a session dropped by the cache (evicted, closed) is forgotten with it
    _, c, _ = make(2)
    rm.subscribe_session(c, [("t", 1)])
    assert len(rm._session_subs[("t", 1)]) == 2
    del c
    gc.collect()
    assert list(rm._session_subs[("t", 1)]) == [a]
