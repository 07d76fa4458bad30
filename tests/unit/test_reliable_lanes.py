"""The reliable shell's hand-off logic, without a broker: which lane takes the first stage's
next batch (``_sticky_lane``), how long the polling thread waits in ``consume``
(``_consume_timeout_s``), grouping a poll's messages by partition (``_partition_runs``), and
the spout keeping a fetched contiguous run's offsets as a ``range`` (acked and committed
exactly as a list would be), and when the polling thread runs a batch itself (caller
runs), and the periodic commits sent without waiting for their answer."""

from __future__ import annotations

from typing import Any, cast

import pytest
from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from headrace.reliable.consumer import (
    CALLER_RUNS_MAX_US,
    CALLER_RUNS_PROBE_EVERY,
    ReliableConsumer,
    _partition_runs,
    _sticky_lane,
)
from headrace.reliable.spout import Commit, ReliableSpout, Seek, SpoutConfig, TopicPartition
from headrace.reliable.topology import Topology

TP = TopicPartition("t", 0)


# ------------------------------------------------------------------ _sticky_lane


def test_a_lane_that_keeps_up_takes_every_batch() -> None:
    assert _sticky_lane([0, 0, 0, 0], 2) == 2
    assert _sticky_lane([1, 0, 0, 0], 0) == 0  # one batch queued or running: still it


def test_a_lane_behind_hands_the_next_batch_to_the_least_busy_lane() -> None:
    assert _sticky_lane([2, 5, 1, 3], 0) == 2
    assert _sticky_lane([2, 0, 0, 0], 0) == 1  # ties: the next in round-robin order
    assert _sticky_lane([0, 0, 0, 2], 3) == 0
    assert _sticky_lane([7, 3, 3, 9], 3) == 1


def test_when_every_lane_is_as_busy_the_batch_stays() -> None:
    assert _sticky_lane([4, 4, 4], 1) == 1
    assert _sticky_lane([5], 0) == 0


@given(st.lists(st.integers(0, 20), min_size=1, max_size=8), st.data())
def test_the_chosen_lane_is_current_or_one_with_the_smallest_backlog(
        backlogs: list[int], data: st.DataObject) -> None:
    current = data.draw(st.integers(0, len(backlogs) - 1))
    chosen = _sticky_lane(backlogs, current)
    if backlogs[current] < 2:
        assert chosen == current
    else:
        assert backlogs[chosen] == min(backlogs)
        if backlogs[current] == min(backlogs):
            assert chosen == current


@given(st.integers(1, 6), st.lists(st.integers(0, 5), min_size=1, max_size=200))
def test_busy_lanes_share_the_batches(k: int, finished: list[int]) -> None:
    """Lanes that never finish (all slow): batches spread so that backlogs differ by at most
    one past the sticky threshold; lanes that finish some keep the backlogs bounded."""
    sent, done = [0] * k, [0] * k
    current = 0
    for f in finished:
        current = _sticky_lane([s - d for s, d in zip(sent, done, strict=True)], current)
        sent[current] += 1
        lane = f % k
        if f % 2 and done[lane] < sent[lane]:
            done[lane] += 1
    backlogs = [s - d for s, d in zip(sent, done, strict=True)]
    assert max(backlogs) - min(backlogs) <= 2


# ------------------------------------------------------------------ consume timeout


def _shell(pending: int) -> Any:
    """The part of a ``ReliableConsumer`` that ``_consume_timeout_s`` reads."""
    rc: Any = ReliableConsumer.__new__(ReliableConsumer)
    rc.spout = ReliableSpout(SpoutConfig(), 0)
    rc.spout._num_pending = pending
    rc._poll_timeout_s = 0.05
    rc._busy_poll_timeout_s = 0.005
    return rc


def test_the_polling_thread_waits_a_whole_poll_timeout_only_when_nothing_is_pending() -> None:
    assert ReliableConsumer._consume_timeout_s(_shell(0)) == 0.05
    assert ReliableConsumer._consume_timeout_s(_shell(1)) == 0.005
    assert ReliableConsumer._consume_timeout_s(_shell(40_000)) == 0.005


# ------------------------------------------------------------------ _partition_runs


def _msgs(spec: list[tuple[str, int, int]]) -> list[Message]:
    return [Message(topic=t, partition=p, offset=o, key=None, value=b"v") for t, p, o in spec]


@pytest.mark.parametrize("one_topic", [False, True])
def test_one_partition_is_one_run(one_topic: bool) -> None:
    msgs = _msgs([("t", 3, o) for o in range(10, 20)])
    [(tp, run, offsets)] = _partition_runs(msgs, one_topic)
    assert tp == TopicPartition("t", 3)
    assert run == msgs
    assert offsets == list(range(10, 20))


@pytest.mark.parametrize("one_topic", [False, True])
def test_several_partitions_keep_their_fetch_order(one_topic: bool) -> None:
    msgs = _msgs([("t", 0, 5), ("t", 1, 7), ("t", 0, 6), ("t", 1, 8), ("t", 2, 0)])
    runs = _partition_runs(msgs, one_topic)
    assert [(tp, offs) for tp, _, offs in runs] == [
        (TopicPartition("t", 0), [5, 6]), (TopicPartition("t", 1), [7, 8]),
        (TopicPartition("t", 2), [0])]


def test_two_topics_are_told_apart_without_the_one_topic_shortcut() -> None:
    msgs = _msgs([("a", 0, 1), ("b", 0, 1), ("a", 0, 2)])
    runs = _partition_runs(msgs)
    assert [(tp, offs) for tp, _, offs in runs] == [
        (TopicPartition("a", 0), [1, 2]), (TopicPartition("b", 0), [1])]


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3),
                          st.integers(1, 40)), max_size=12), st.booleans())
def test_runs_of_any_shape_group_as_message_by_message(
        shape: list[tuple[str, int, int]], one_topic: bool) -> None:
    """Whatever the interleaving (runs of any length, a partition coming back later, two
    topics), the runs found with ``groupby`` and slices are what grouping message by
    message gives: each partition's messages and offsets in fetch order, partitions in
    the order first seen."""
    spec: list[tuple[str, int, int]] = []
    nxt: dict[tuple[str, int], int] = {}
    for topic, p, k in shape:
        t = "a" if one_topic else topic
        for _ in range(k):
            spec.append((t, p, nxt.get((t, p), 0)))
            nxt[(t, p)] = nxt.get((t, p), 0) + 1
    msgs = _msgs(spec)
    want: dict[TopicPartition, tuple[list[Message], list[int]]] = {}
    for m in msgs:
        run = want.setdefault(TopicPartition(m.topic(), m.partition()), ([], []))
        run[0].append(m)
        run[1].append(m.offset())
    got = _partition_runs(msgs, one_topic) if msgs else []
    assert [(tp, run, offs) for tp, run, offs in got] == [
        (tp, ms, offs) for tp, (ms, offs) in want.items()]


# ------------------------------------------------------------------ range offsets


def _spout() -> ReliableSpout:
    spout = ReliableSpout(SpoutConfig(max_uncommitted_offsets=1 << 20), 0)
    spout.assigned(TP, 100)
    return spout


def test_a_fetched_contiguous_run_is_kept_as_a_range_and_commits_past_its_end() -> None:
    spout = _spout()
    batch = spout.on_batch(TP, list(range(100, 600)), 0, payloads=list(range(500)))
    assert batch is not None
    assert batch.offsets == range(100, 600)
    spout.ack_batch(batch, 0)
    assert spout.committable() == {TP: 600}
    assert spout.num_pending_roots == 0


def test_a_run_with_a_gap_stays_a_list_and_its_gap_does_not_block() -> None:
    spout = _spout()
    offsets = [100, 101, 103, 104]  # 102: a compacted record or a transaction marker
    batch = spout.on_batch(TP, offsets, 0, payloads=offsets)
    assert batch is not None
    assert isinstance(batch.offsets, list)
    spout.ack_batch(batch, 0)
    assert spout.committable() == {TP: 105}


def test_a_range_batch_with_a_failed_root_commits_up_to_it_and_replays_it() -> None:
    spout = _spout()
    batch = spout.on_batch(TP, list(range(100, 110)), 0, payloads=list(range(10)))
    assert batch is not None and isinstance(batch.offsets, range)
    spout.ack_batch(batch, 0, failed={4: "boom"})
    assert spout.committable() == {TP: 104}  # never past the failed offset 104
    effects = spout.tick(10_000)
    assert Seek(TP, 104) in effects  # the replay
    replay = spout.on_batch(TP, list(range(104, 110)), 10_000, payloads=list(range(6)))
    assert replay is not None
    assert list(replay.offsets) == [104]  # 105-109 are acked: not processed again
    spout.ack_batch(replay, 10_000)
    assert spout.committable() == {TP: 110}


def test_roots_of_a_range_batch_settled_in_parts() -> None:
    spout = _spout()
    batch = spout.on_batch(TP, list(range(100, 106)), 0, payloads=list(range(6)))
    assert batch is not None and isinstance(batch.offsets, range)
    spout.ack_batch(batch, 0, indices=[3, 4, 5])
    assert spout.committable() == {}  # 100-102 still in flight
    spout.ack_batch(batch, 0, indices=[0, 1, 2])
    assert spout.committable() == {TP: 106}


# ------------------------------------------------------------------ caller runs


class _FakeLane:
    """A first-stage lane: what it was handed, what ran on the caller's thread."""

    def __init__(self, clock: list[float]) -> None:
        self.sent = 0
        self.done = 0
        self.inline = False
        self.queued: list[object] = []
        self.ran_here: list[object] = []
        self.clock = clock
        self.us_per_record = 0.5  # the handler's cost, on the fake clock

    def put(self, obj: object) -> None:
        if self.inline:
            self.process(obj)
        else:
            self.queued.append(obj)

    def process(self, obj: object) -> None:
        batch, _ = cast(tuple[Any, Any], obj)
        self.ran_here.append(batch)
        self.clock[0] += len(batch) * self.us_per_record / 1e6


def _caller_shell(lanes: int) -> tuple[Any, list[_FakeLane]]:
    clock = [0.0]
    rc: Any = ReliableConsumer.__new__(ReliableConsumer)
    fakes = [_FakeLane(clock) for _ in range(lanes)]
    rc._lanes = [fakes]
    rc.topology = Topology().basic_bolt("h", lambda item, out: None, lanes)
    rc._round_robin = [0]
    rc._caller_runs = True
    rc._handler_us = None
    rc._probe_in = 0
    rc._clock = lambda: clock[0]
    return rc, fakes


def _dispatch_idle(rc: Any, fakes: list[_FakeLane], batches: int, size: int) -> None:
    """Dispatch ``batches`` batches, every lane finishing what it had after each."""
    for _ in range(batches):
        ReliableConsumer._dispatch_batch(rc, [0] * size)
        for f in fakes:
            f.done = f.sent


@pytest.mark.parametrize("lanes", [1, 4])
def test_a_quick_handler_runs_on_the_polling_thread_while_the_lanes_are_idle(
        lanes: int) -> None:
    rc, fakes = _caller_shell(lanes)
    for _ in range(10):
        ReliableConsumer._dispatch_batch(rc, [0] * 500)
    assert len(fakes[0].ran_here) == 10
    assert not any(f.queued for f in fakes)


def test_a_slow_handler_goes_to_the_lanes_and_is_probed_now_and_then() -> None:
    rc, fakes = _caller_shell(4)
    for f in fakes:
        f.us_per_record = 10 * CALLER_RUNS_MAX_US  # e.g. waiting on I/O
    _dispatch_idle(rc, fakes, 1 + 2 * CALLER_RUNS_PROBE_EVERY, 100)
    here = sum(len(f.ran_here) for f in fakes)
    queued = sum(len(f.queued) for f in fakes)
    assert here == 3  # the first batch (measured), then one probe per PROBE_EVERY
    assert queued == 2 * CALLER_RUNS_PROBE_EVERY - 2


def test_a_batch_is_never_run_here_while_a_lane_is_busy() -> None:
    """Never more handlers at once than lanes: a lane with a batch unfinished keeps the
    polling thread out, however quick the handler."""
    rc, fakes = _caller_shell(2)
    ReliableConsumer._dispatch_batch(rc, [0] * 500)  # measured quick, run here
    fakes[1].sent = 1  # a batch given to lane 1 and not finished
    for _ in range(5):
        ReliableConsumer._dispatch_batch(rc, [0] * 500)
    assert len(fakes[0].ran_here) == 1
    assert sum(len(f.queued) for f in fakes) == 5


def test_a_handler_that_becomes_quick_comes_back_to_the_polling_thread() -> None:
    rc, fakes = _caller_shell(2)
    for f in fakes:
        f.us_per_record = 100.0
    _dispatch_idle(rc, fakes, 3 * CALLER_RUNS_PROBE_EVERY, 100)
    for f in fakes:
        f.us_per_record = 0.1
    _dispatch_idle(rc, fakes, 40 * CALLER_RUNS_PROBE_EVERY, 100)
    queued_before = sum(len(f.queued) for f in fakes)
    for _ in range(10):
        ReliableConsumer._dispatch_batch(rc, [0] * 100)
    assert sum(len(f.queued) for f in fakes) == queued_before  # all ten run here


# ------------------------------------------------------------------ asynchronous commits


class _FakeCommitter:
    def __init__(self) -> None:
        self.sent: list[tuple[list[tuple[str, int, int]], bool]] = []

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.sent.append(([(kp.topic, kp.partition, kp.offset) for kp in offsets],
                          asynchronous))


class _FakeSpout:
    def __init__(self) -> None:
        self.committed_offsets: list[dict[TopicPartition, int]] = []

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        self.committed_offsets.append(dict(offsets))


def _commit_shell() -> tuple[Any, _FakeCommitter, _FakeSpout, list[dict[Any, int]]]:
    import threading

    rc: Any = ReliableConsumer.__new__(ReliableConsumer)
    rc.consumer = _FakeCommitter()
    rc._pspout = _FakeSpout()
    rc._lock = threading.Lock()
    told: list[dict[Any, int]] = []
    rc.on_commit = told.append
    rc._config_on_commit = None
    rc._commit_in_flight = False
    rc._commit_sent_at = 0.0
    return rc, rc.consumer, rc._pspout, told


def test_periodic_commits_go_out_asynchronously_one_at_a_time() -> None:
    from confluent_kafka import TopicPartition as KTP

    rc, consumer, spout, told = _commit_shell()
    ReliableConsumer._apply(rc, [Commit({TP: 5})])
    assert consumer.sent == [([("t", 0, 5)], True)]  # the polling thread does not wait
    assert spout.committed_offsets == [] and told == []  # not committed until answered
    ReliableConsumer._apply(rc, [Commit({TP: 7})])  # one unanswered: not sent again
    assert len(consumer.sent) == 1
    ReliableConsumer._committed_async(rc, None, [KTP("t", 0, 5)])
    assert spout.committed_offsets == [{TP: 5}] and told == [{TP: 5}]
    ReliableConsumer._apply(rc, [Commit({TP: 7})])
    assert consumer.sent[-1] == ([("t", 0, 7)], True)


def test_a_failed_asynchronous_commit_counts_nothing_and_frees_the_next() -> None:
    from confluent_kafka import KafkaError

    rc, consumer, spout, told = _commit_shell()
    ReliableConsumer._apply(rc, [Commit({TP: 5})])
    ReliableConsumer._committed_async(rc, KafkaError(KafkaError.REQUEST_TIMED_OUT), [])
    assert spout.committed_offsets == [] and told == []
    ReliableConsumer._apply(rc, [Commit({TP: 6})])
    assert consumer.sent[-1] == ([("t", 0, 6)], True)


# ------------------------------------------------------------------ back-pressure


def _backlog_shell(lanes: int) -> tuple[Any, list[_FakeLane]]:
    import threading

    rc, fakes = _caller_shell(lanes)
    rc._lane_finished = threading.Event()
    rc._backlogged_since = None
    rc._poll_timeout_s = 0.001
    return rc, fakes


def test_the_polling_thread_fetches_nothing_while_the_lanes_are_far_behind() -> None:
    from headrace.reliable.consumer import LANE_BACKLOG_BATCHES

    rc, fakes = _backlog_shell(4)
    for f in fakes:
        f.sent = LANE_BACKLOG_BATCHES - 1
    fakes[0].sent += 1  # 4 * (LANE_BACKLOG_BATCHES - 1) + 1 unfinished: not yet
    assert not ReliableConsumer._held_back(rc)
    for f in fakes:
        f.sent = LANE_BACKLOG_BATCHES
    assert ReliableConsumer._held_back(rc)
    fakes[2].done = 1  # one finished: fetching again
    assert not ReliableConsumer._held_back(rc)


def test_back_pressure_still_polls_once_in_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """The group must see the consumer poll (max.poll.interval.ms), however slow the
    handler."""
    from headrace.reliable import consumer as module

    monkeypatch.setattr(module, "BACKPRESSURE_MAX_S", 0.0)
    rc, fakes = _backlog_shell(1)
    fakes[0].sent = 100
    assert ReliableConsumer._held_back(rc)  # held back since now
    assert not ReliableConsumer._held_back(rc)  # BACKPRESSURE_MAX_S later: poll once
    assert ReliableConsumer._held_back(rc)


def test_an_inline_first_stage_is_never_held_back() -> None:
    """parallelism=0: the polling thread runs each batch in ``put``; nothing is ever
    unfinished, however many batches went through."""
    rc, fakes = _backlog_shell(1)
    fakes[0].inline = True
    rc._caller_runs = False  # as the constructor sets it for an inline stage
    for _ in range(10):
        ReliableConsumer._dispatch_batch(rc, [0] * 10)
    assert fakes[0].sent == 0
    assert not ReliableConsumer._held_back(rc)
