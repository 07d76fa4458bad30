"""KafkaSpout's offset discipline (R-REL-4, R-REL-5): OffsetManager and the ReliableSpout."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.reliable import (
    Commit,
    DeadLetter,
    Effect,
    OffsetManager,
    Pause,
    ReliableSpout,
    ReliableUsageError,
    Resume,
    Seek,
    SpoutConfig,
    TopicPartition,
)

TP = TopicPartition("events", 0)
TP2 = TopicPartition("events", 1)


# ------------------------------------------------------------------ the seed's picture


def test_seed_000_picture_exactly() -> None:
    """11-13 acked, 14 failed, 15-18 acked → commit 14; replay from 14 processes only 14;
    then commit 19."""
    om = OffsetManager(11)
    for o in range(11, 19):
        assert om.emitted(o)
    for o in (11, 12, 13):
        om.acked(o)
    om.failed(14)
    for o in (15, 16, 17, 18):
        om.acked(o)
    assert om.next_commit_offset() == 14
    om.committed(14)
    assert om.next_commit_offset() is None
    assert om.num_uncommitted == 5  # 14 (failed) and 15-18 (acked, held)
    # the replay: a seek back to 14 fetches 14..18 again
    reprocessed = [o for o in range(14, 19) if om.emitted(o)]
    assert reprocessed == [14]
    assert om.next_commit_offset() is None  # 14 in flight again
    om.acked(14)
    assert om.next_commit_offset() == 19
    om.committed(19)
    assert om.num_uncommitted == 0
    assert om.next_commit_offset() is None


def test_seed_picture_through_the_spout_with_a_seek() -> None:
    spout = ReliableSpout(SpoutConfig(offset_commit_period_ms=1_000, retry_backoff_ms=100),
                          now_ms=0)
    spout.assigned(TP, 11)
    items = {o: spout.on_record(TP, o, 0) for o in range(11, 19)}
    for o, item in items.items():
        assert item is not None
        if o == 14:
            spout.fail(item, 0, "boom")
        else:
            spout.ack(item, 0)
    assert spout.tick(50) == []  # retry not due yet, commit period not reached
    assert spout.tick(100) == [Seek(TP, 14)]
    assert spout.tick(150) == []  # the seek is not repeated
    replayed = []
    for o in range(14, 19):
        it = spout.on_record(TP, o, 160)
        if it is not None:
            replayed.append(o)
            spout.ack(it, 160)
    assert replayed == [14]
    assert spout.tick(1_000) == [Commit({TP: 19})]


# ------------------------------------------------------------------ OffsetManager rules


def test_gaps_in_the_log_do_not_block_commits() -> None:
    om = OffsetManager(0)
    for o in (0, 1, 5, 6, 9):  # 2-4 and 7-8 do not exist (compaction, markers)
        om.emitted(o)
        om.acked(o)
    assert om.next_commit_offset() == 10


def test_in_flight_offset_blocks_and_is_not_emitted_twice() -> None:
    om = OffsetManager(0)
    om.emitted(0)
    om.emitted(1)
    om.acked(1)
    assert om.next_commit_offset() is None
    assert not om.emitted(0)  # in flight: a refetch does not emit it again
    assert not om.should_emit(1)
    assert om.is_in_flight(0)
    om.acked(0)
    assert om.next_commit_offset() == 2


def test_committing_past_an_unprocessed_offset_raises_and_changes_nothing() -> None:
    om = OffsetManager(0)
    for o in range(3):
        om.emitted(o)
    om.acked(0)
    om.failed(1)
    om.acked(2)
    with pytest.raises(ReliableUsageError):
        om.committed(3)
    assert om.committed_offset == 0 and om.num_uncommitted == 3
    om.committed(1)
    om.committed(1)  # a stale or repeated commit is ignored
    om.committed(0)
    assert om.committed_offset == 1 and om.num_uncommitted == 2


def test_illegal_events_raise() -> None:
    om = OffsetManager(5)
    with pytest.raises(ReliableUsageError):
        om.acked(5)  # never emitted
    with pytest.raises(ReliableUsageError):
        om.failed(6)
    om.emitted(5)
    om.acked(5)
    with pytest.raises(ReliableUsageError):
        om.failed(5)  # cannot un-ack
    assert not om.emitted(4)  # below the committed offset
    with pytest.raises(ReliableUsageError):
        OffsetManager(-1)


def test_a_late_success_of_a_failed_offset_counts() -> None:
    om = OffsetManager(0)
    om.emitted(0)
    om.failed(0)
    om.acked(0)
    assert om.next_commit_offset() == 1


def test_out_of_order_emits_keep_the_prefix_right() -> None:
    om = OffsetManager(0)
    om.emitted(0)
    om.acked(0)
    om.emitted(2)
    om.acked(2)
    assert om.next_commit_offset() == 3  # 1 looks like a gap so far
    om.emitted(1)  # ...until it turns up
    assert om.next_commit_offset() == 1
    om.acked(1)
    assert om.next_commit_offset() == 3


# ------------------------------------------------------------------ retries, dead letters


def test_retry_backoff_doubles_up_to_the_cap() -> None:
    cfg = SpoutConfig(retry_backoff_ms=100, retry_backoff_max_ms=1_000)
    assert [cfg.backoff_ms(n) for n in range(1, 7)] == [100, 200, 400, 800, 1_000, 1_000]


def test_poison_record_goes_to_the_dead_letter_after_max_retries() -> None:
    spout = ReliableSpout(SpoutConfig(max_retries=2, retry_backoff_ms=10,
                                      offset_commit_period_ms=0), now_ms=0)
    spout.assigned(TP, 0)
    now = 0
    item = spout.on_record(TP, 0, now, payload="poison")
    assert item is not None
    ok = spout.on_record(TP, 1, now)
    assert ok is not None
    spout.ack(ok, now)
    effects: list[Effect] = []
    for attempt in (1, 2, 3):
        spout.fail(item, now, "bad input")
        effects = spout.tick(now)
        if attempt <= 2:
            assert Seek(TP, 0) not in effects  # backoff first
            now += 10 * 2 ** (attempt - 1)
            assert Seek(TP, 0) in spout.tick(now)
            item = spout.on_record(TP, 0, now, payload="poison")
            assert item is not None
            assert spout.on_record(TP, 1, now) is None  # acked, held: not re-processed
    assert [e for e in effects if isinstance(e, DeadLetter)] == [
        DeadLetter(TP, 0, "poison", "bad input", 3)]
    assert spout.committable() == {}  # not past it until the dead letter is delivered
    spout.dead_lettered(TP, 0)
    assert spout.tick(now + 1) == [Commit({TP: 2})]


def test_a_failed_dead_letter_is_retried() -> None:
    spout = ReliableSpout(SpoutConfig(max_retries=0, retry_backoff_ms=10), now_ms=0)
    spout.assigned(TP, 0)
    item = spout.on_record(TP, 0, 0, payload="p")
    assert item is not None
    spout.fail(item, 0, "e")
    assert isinstance(spout.tick(0)[0], DeadLetter)
    spout.dead_letter_failed(TP, 0, 0)
    assert spout.tick(10) == [Seek(TP, 0)]


def test_timed_out_root_is_retried_and_its_late_ack_ignored() -> None:
    spout = ReliableSpout(SpoutConfig(message_timeout_ms=1_000, retry_backoff_ms=0), now_ms=0)
    spout.assigned(TP, 0)
    slow = spout.on_record(TP, 0, 0)
    assert slow is not None
    assert Seek(TP, 0) in spout.tick(1_500)
    spout.ack(slow, 1_600)  # the first attempt finishes late: ignored
    assert spout.committable() == {}
    again = spout.on_record(TP, 0, 1_600)
    assert again is not None
    spout.ack(again, 1_700)
    assert spout.committable() == {TP: 1}


# ------------------------------------------------------------------ flow control, rebalance


def test_max_uncommitted_offsets_pauses_until_commits_catch_up() -> None:
    spout = ReliableSpout(SpoutConfig(max_uncommitted_offsets=3, offset_commit_period_ms=100),
                          now_ms=0)
    spout.assigned(TP, 0)
    items = [spout.on_record(TP, o, 0) for o in range(3)]
    assert spout.tick(1) == [Pause(TP)]
    assert spout.tick(2) == []
    for it in items:
        assert it is not None
        spout.ack(it, 3)
    # acked but not committed: still at the limit, so the commit is due at once (not at
    # the period's end, 100)
    assert spout.tick(50) == [Commit({TP: 3})]
    spout.committed({TP: 3})
    assert spout.tick(51) == [Resume(TP)]


def test_a_partition_half_full_of_committable_offsets_commits_before_the_period() -> None:
    """Issue 24: with the defaults (10,000 uncommitted, a commit every 5 s) a quick handler
    reached the limit, paused and waited for the period: 1% of a plain consumer. A partition
    holding half the limit commits at the next tick if a quarter of the limit would be
    committed; below either threshold the period rules (no commit per acked record)."""
    spout = ReliableSpout(SpoutConfig(max_uncommitted_offsets=8, offset_commit_period_ms=5_000),
                          now_ms=0)
    spout.assigned(TP, 0)
    spout.assigned(TP2, 0)
    items = [spout.on_record(TP, o, 0) for o in range(4)]
    other = [spout.on_record(TP2, o, 0) for o in range(3)]
    assert all(items) and all(other)
    spout.ack(items[0], 1)  # type: ignore[arg-type]
    assert spout.tick(2) == []  # half full, but one committable offset is not a quarter
    spout.ack(other[0], 3)  # type: ignore[arg-type]
    spout.ack(other[1], 3)  # type: ignore[arg-type]
    assert spout.tick(4) == []  # TP2 could commit 2, but holds less than half the limit
    spout.ack(items[1], 5)  # type: ignore[arg-type]
    # TP holds 4 of 8 and 2 are committable: everything committable goes now
    assert spout.tick(6) == [Commit({TP: 2, TP2: 2})]
    spout.committed({TP: 2, TP2: 2})
    assert spout.tick(7) == []  # and the period restarted
    spout.ack(items[2], 8)  # type: ignore[arg-type]
    assert spout.tick(4_999) == []
    assert spout.tick(5_006) == [Commit({TP: 3})]


def test_a_due_retry_resumes_a_paused_partition() -> None:
    spout = ReliableSpout(SpoutConfig(max_uncommitted_offsets=2, retry_backoff_ms=10),
                          now_ms=0)
    spout.assigned(TP, 0)
    a = spout.on_record(TP, 0, 0)
    b = spout.on_record(TP, 1, 0)
    assert a is not None and b is not None
    assert spout.tick(0) == [Pause(TP)]
    spout.fail(a, 0, "x")
    assert spout.tick(10) == [Resume(TP), Seek(TP, 0)]


def test_revoke_returns_the_final_commit_and_drops_state() -> None:
    spout = ReliableSpout(now_ms=0)
    spout.assigned(TP, 100)
    a = spout.on_record(TP, 100, 0)
    b = spout.on_record(TP, 101, 0)
    assert a is not None and b is not None
    spout.ack(a, 0)
    assert spout.is_live(b)
    assert spout.revoked(TP) == 101
    assert spout.assignment == [] and spout.num_pending_roots == 0
    assert not spout.is_live(b)  # queued work of a revoked partition is not run
    spout.ack(b, 0)  # a late ack of a revoked partition's record: ignored
    assert spout.on_record(TP, 102, 0) is None  # fetched before the revoke took effect
    spout.assigned(TP, 101)  # assigned again: starts at the committed offset
    c = spout.on_record(TP, 101, 0)
    assert c is not None


def test_unknown_committed_offset_starts_at_the_first_record() -> None:
    spout = ReliableSpout(now_ms=0)
    spout.assigned(TP, None)
    it = spout.on_record(TP, 40, 0)
    assert it is not None
    spout.ack(it, 0)
    assert spout.committable() == {TP: 41}


def test_untracked_records_are_committable_at_once() -> None:
    spout = ReliableSpout(now_ms=0)
    spout.assigned(TP, 0)
    assert spout.on_record(TP, 0, 0, tracked=False) is not None
    assert spout.committable() == {TP: 1}
    off = ReliableSpout(SpoutConfig(num_ackers=0), now_ms=0)
    off.assigned(TP, 0)
    assert off.on_record(TP, 0, 0) is not None
    assert off.committable() == {TP: 1}


# ------------------------------------------------------------------ batches


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["emit", "ack", "fail", "commit"]),
                              st.integers(0, 40), st.integers(1, 12)), max_size=40))
def test_batch_events_equal_the_same_events_one_by_one(
        ops: list[tuple[str, int, int]]) -> None:
    """``emitted_batch``/``acked_batch`` on a run give the state and results of calling
    ``emitted``/``acked`` per offset (contiguous runs take the slice path)."""
    bulk, single = OffsetManager(3), OffsetManager(3)
    for op, start, length in ops:
        run = list(range(start, start + length))
        if op == "emit":
            kept = bulk.emitted_batch(run)
            assert [run[k] for k in kept] == [o for o in run if single.emitted(o)]
        elif op == "ack":
            errors = []
            for m in (bulk, single):
                try:
                    if m is bulk:
                        m.acked_batch(run)
                    else:
                        if any(o >= m.committed_offset and not (
                                m.is_in_flight(o) or m.is_failed(o) or m.is_acked(o))
                               for o in run):
                            raise ReliableUsageError("never emitted")
                        for o in run:
                            m.acked(o)
                    errors.append(False)
                except ReliableUsageError:
                    errors.append(True)
            assert errors[0] == errors[1]
        elif op == "fail":
            for m in (bulk, single):
                if m.is_in_flight(start):
                    m.failed(start)
        else:
            nxt = single.next_commit_offset()
            assert bulk.next_commit_offset() == nxt
            if nxt is not None:
                bulk.committed(nxt)
                single.committed(nxt)
        assert bulk.num_uncommitted == single.num_uncommitted
        assert bulk.failed_offsets == single.failed_offsets
        assert bulk.next_commit_offset() == single.next_commit_offset()
        for o in range(0, 60):
            assert bulk.should_emit(o) == single.should_emit(o)
            assert bulk.is_acked(o) == single.is_acked(o)


def test_batch_roots_partial_acks_failures_and_timeouts() -> None:
    spout = ReliableSpout(SpoutConfig(message_timeout_ms=1_000, retry_backoff_ms=0,
                                      offset_commit_period_ms=0), now_ms=0)
    spout.assigned(TP, 0)
    batch = spout.on_batch(TP, range(10), 0)
    assert batch is not None and spout.num_pending_roots == 10
    assert spout.on_batch(TP, range(10), 0) is None  # in flight: not emitted twice
    spout.ack(batch.item(0), 0)  # one root acked on its own
    child = spout.emit(("c",), [batch.item(1)])  # root 1's tree grows
    spout.ack_batch(batch, 0, {5: "boom"}, indices=range(0, 8))
    assert spout.committable() == {TP: 1}  # 1 waits for its child, 5 failed, 8-9 pending
    spout.ack(child, 0)
    assert spout.committable() == {TP: 5}
    assert spout.num_pending_roots == 2  # 8 and 9
    assert Seek(TP, 5) in spout.tick(1)
    effects = spout.tick(1_000)  # 8 and 9 time out with their batch
    assert spout.num_pending_roots == 0
    assert Commit({TP: 5}) in effects
    again = spout.on_batch(TP, range(5, 10), 1_000)  # the replay: 6-7 acked, skipped
    assert again is not None and list(again.offsets) == [5, 8, 9]
    spout.ack_batch(again, 1_000)
    assert spout.committable() == {TP: 10}
