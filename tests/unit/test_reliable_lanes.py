"""The reliable shell's hand-off logic, without a broker: which lane takes the first stage's
next batch (``_sticky_lane``), how long the polling thread waits in ``consume``
(``_consume_timeout_s``), grouping a poll's messages by partition (``_partition_runs``), and
the spout keeping a fetched contiguous run's offsets as a ``range`` (acked and committed
exactly as a list would be)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from headrace.reliable.consumer import (
    ReliableConsumer,
    _partition_runs,
    _sticky_lane,
)
from headrace.reliable.spout import ReliableSpout, Seek, SpoutConfig, TopicPartition

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
