"""The leader's partition rules (R-REP-3, R-REP-4, R-REP-6), in the manner of Kafka's
``PartitionTest``: a ``PartitionLeader`` driven by method calls with a manual clock.

Each of issue 21's leader-side defects is a test here that fails on the old rules:
the ISR expansion race (the high watermark over the committed ISR only), follower state
recorded before the read (a fetch past the leader's log end counted as caught up), and a
follower that rejoins the ISR without having caught up."""

from __future__ import annotations

import pytest

from headrace.replication.leader import (
    AcksAll,
    FetchPastEndError,
    FollowerFetchCheck,
    IsrChangeInFlightError,
    IsrChangeKind,
    NotAReplicaError,
    PartitionLeader,
    check_follower_fetch,
)

LAG_MS = 10_000
T0 = 1_000_000


def leader(isr: tuple[int, ...] = (1, 2, 3), leo: int = 0, hw: int = 0,
           now: int = T0) -> PartitionLeader:
    """Broker 1 leads replicas 1, 2, 3 at epoch 5, its epoch starting at ``leo``."""
    return PartitionLeader(1, 5, (1, 2, 3), isr, leo, hw, now)


# ---------------------------------------------------------------------- high watermark
def test_high_watermark_is_the_smallest_log_end_offset_over_the_isr() -> None:
    p = leader()
    assert not p.maybe_increment_high_watermark(10)  # followers unknown: it waits
    p.follower_fetched(2, 10, 10, T0)
    assert p.high_watermark == 0
    p.follower_fetched(3, 7, 10, T0)
    assert p.high_watermark == 7
    p.follower_fetched(3, 10, 10, T0)
    assert p.high_watermark == 10


def test_high_watermark_ignores_followers_outside_the_isr() -> None:
    p = leader(isr=(1, 2))
    p.follower_fetched(2, 8, 8, T0)
    assert p.high_watermark == 8
    assert p.follower_log_end_offset(3) == -1


def test_high_watermark_never_moves_back() -> None:
    p = leader()
    p.follower_fetched(2, 10, 10, T0)
    p.follower_fetched(3, 10, 10, T0)
    assert p.high_watermark == 10
    p.follower_fetched(3, 4, 12, T0)  # a follower that truncated and fetches again
    assert p.high_watermark == 10


def test_a_single_replica_high_watermark_is_the_log_end_offset() -> None:
    p = PartitionLeader(1, 0, (1,), (1,), 0, 0, T0)
    assert p.maybe_increment_high_watermark(5)
    assert p.high_watermark == 5


def test_new_leader_waits_for_every_isr_follower_to_fetch() -> None:
    """Kafka's makeLeader: follower LEOs are unknown until they fetch under this leader, so
    nothing the old leader had not committed is committed by the new one's own log alone."""
    p = leader(leo=20, hw=15)
    assert not p.maybe_increment_high_watermark(20)
    p.follower_fetched(2, 20, 20, T0)
    assert p.high_watermark == 15
    p.follower_fetched(3, 18, 20, T0)
    assert p.high_watermark == 18


# ---------------------------------------------------------------------- follower state
def test_follower_at_the_log_end_is_caught_up_now() -> None:
    p = leader()
    p.follower_fetched(2, 10, 10, T0 + 5)
    assert p.followers[2].last_caught_up_ms == T0 + 5


def test_follower_behind_is_caught_up_as_of_its_previous_fetch() -> None:
    """Kafka's Replica.updateFetchState: reaching the leader's LEO of the previous fetch
    means the follower was caught up at that fetch's time."""
    p = leader(isr=(1, 2))
    p.follower_fetched(2, 5, 10, T0 + 100)   # behind; the leader's LEO was 10
    assert p.followers[2].last_caught_up_ms == T0  # from becoming leader
    p.follower_fetched(2, 10, 14, T0 + 200)  # reached 10, leader at 14 now
    assert p.followers[2].last_caught_up_ms == T0 + 100
    p.follower_fetched(2, 12, 16, T0 + 300)  # not at 14: nothing new
    assert p.followers[2].last_caught_up_ms == T0 + 100


def test_fetch_past_the_log_end_is_never_counted() -> None:
    """Issue 21 defect 2: a diverged follower fetching past the leader's log end must not
    count as caught up nor move the high watermark; its read fails out of range and
    nothing is recorded (Kafka updates follower state only after a valid read)."""
    p = leader(leo=10, hw=10)
    p.follower_fetched(3, 10, 10, T0)
    check = check_follower_fetch([(5, 10)], 0, 12, -1, 15)
    assert check.check is FollowerFetchCheck.OUT_OF_RANGE
    with pytest.raises(FetchPastEndError):
        p.follower_fetched(2, 15, 12, T0 + 1)
    assert p.follower_log_end_offset(2) == -1
    assert p.high_watermark == 10


def test_fetch_by_a_non_replica_raises_and_changes_nothing() -> None:
    p = leader()
    with pytest.raises(NotAReplicaError):
        p.follower_fetched(7, 0, 0, T0)
    with pytest.raises(NotAReplicaError):
        p.follower_fetched(1, 0, 0, T0)  # the leader itself
    assert set(p.followers) == {2, 3}


# ---------------------------------------------------------------------- follower fetch check
@pytest.mark.parametrize(("last_epoch", "offset", "expected"), [
    (-1, 7, FollowerFetchCheck.READ),         # no epoch sent: not checked
    (3, 7, FollowerFetchCheck.READ),          # epoch 3 ends at 10 here
    (3, 10, FollowerFetchCheck.READ),
    (3, 11, FollowerFetchCheck.DIVERGING),    # past epoch 3's end on the leader
    (4, 11, FollowerFetchCheck.DIVERGING),    # an epoch the leader never had
    (6, 12, FollowerFetchCheck.READ),
    (6, 13, FollowerFetchCheck.DIVERGING),     # past the LEO in the same epoch
    (-1, 13, FollowerFetchCheck.OUT_OF_RANGE),
    (-1, 1, FollowerFetchCheck.OUT_OF_RANGE),  # below the log start
])
def test_check_follower_fetch(last_epoch: int, offset: int,
                              expected: FollowerFetchCheck) -> None:
    epochs = [(1, 2), (3, 5), (6, 10)]
    assert check_follower_fetch(epochs, 2, 12, last_epoch, offset).check is expected


def test_diverging_answer_names_the_epoch_and_where_it_ends() -> None:
    epochs = [(1, 2), (3, 5), (6, 10)]
    assert check_follower_fetch(epochs, 2, 12, 4, 11).diverging == (3, 10)
    assert check_follower_fetch(epochs, 2, 12, 3, 11).diverging == (3, 10)


# ---------------------------------------------------------------------- ISR expansion
def test_follower_that_reached_the_high_watermark_joins() -> None:
    p = leader(isr=(1, 2))
    p.follower_fetched(2, 10, 10, T0)
    p.follower_fetched(3, 10, 10, T0)
    change = p.maybe_expand_isr(3)
    assert change is not None and change.kind is IsrChangeKind.EXPAND
    assert change.isr == (1, 2, 3) and change.replicas == (3,)
    assert p.isr == (1, 2)  # not before it is committed
    p.isr_committed(change, 10, T0)
    assert p.isr == (1, 2, 3) and p.pending is None


def test_follower_below_the_high_watermark_does_not_join() -> None:
    """Issue 21's first one-line change: 'a follower rejoins the ISR without having
    caught up'."""
    p = leader(isr=(1, 2))
    p.follower_fetched(2, 10, 10, T0)
    p.follower_fetched(3, 9, 10, T0)
    assert not p.is_follower_in_sync(3)
    assert p.maybe_expand_isr(3) is None
    assert p.pending is None


def test_follower_below_the_leaders_epoch_start_does_not_join() -> None:
    """Kafka's isFollowerInSync: also at or past the start of the leader's epoch."""
    p = leader(isr=(1,), leo=20, hw=5)
    p.follower_fetched(3, 12, 20, T0)  # above the HW (5), below the epoch start (20)
    assert p.maybe_expand_isr(3) is None
    p.follower_fetched(3, 20, 20, T0)
    assert p.maybe_expand_isr(3) is not None


def test_isr_expansion_race_high_watermark_waits_for_the_joiner() -> None:
    """Issue 21 defect 1 (KIP-497): while broker 3's addition is being written, appends
    continue and broker 2 keeps up. The high watermark must not pass broker 3's log end
    (it counts in the maximal ISR), so broker 3 never enters the ISR below it: were it
    elected, nothing acknowledged would be truncated."""
    p = leader(isr=(1, 2))
    p.follower_fetched(2, 10, 10, T0)
    p.follower_fetched(3, 10, 10, T0)
    change = p.maybe_expand_isr(3)
    assert change is not None
    assert p.maximal_isr == (1, 2, 3)
    p.follower_fetched(2, 30, 30, T0 + 1)  # the leader appended 20 more; 2 has them
    assert p.high_watermark == 10          # 3 is still at 10
    p.isr_committed(change, 30, T0 + 2)
    assert p.high_watermark <= p.follower_log_end_offset(3)
    p.follower_fetched(3, 30, 30, T0 + 3)
    assert p.high_watermark == 30


def test_only_one_isr_change_in_flight() -> None:
    p = leader(isr=(1,))
    p.follower_fetched(2, 0, 0, T0)
    p.follower_fetched(3, 0, 0, T0)
    first = p.maybe_expand_isr(2)
    assert first is not None
    assert p.maybe_expand_isr(3) is None
    assert p.maybe_shrink_isr(0, T0 + LAG_MS * 10, LAG_MS) is None
    with pytest.raises(IsrChangeInFlightError):
        p.isr_committed(type(first)(first.kind, (1, 3), (3,), "forged"), 0, T0)
    assert p.pending is first and p.isr == (1,)


def test_failed_isr_change_changes_nothing() -> None:
    p = leader(isr=(1, 2))
    p.follower_fetched(2, 10, 10, T0)
    p.follower_fetched(3, 10, 10, T0)
    change = p.maybe_expand_isr(3)
    assert change is not None
    p.isr_failed(change)
    assert p.isr == (1, 2) and p.pending is None and p.maximal_isr == (1, 2)
    assert p.maybe_expand_isr(3) is not None  # may be proposed again


# ---------------------------------------------------------------------- ISR shrink
def test_follower_not_caught_up_for_the_lag_time_is_removed() -> None:
    p = leader()
    p.follower_fetched(2, 10, 10, T0 + 1)
    p.follower_fetched(3, 4, 10, T0 + 1)
    assert p.maybe_shrink_isr(10, T0 + LAG_MS, LAG_MS) is None  # not yet: lag == limit
    change = p.maybe_shrink_isr(10, T0 + LAG_MS + 2, LAG_MS)
    assert change is not None and change.kind is IsrChangeKind.SHRINK
    assert change.isr == (1, 2) and change.replicas == (3,)


def test_pending_shrink_still_counts_the_removed_follower() -> None:
    """Kafka's PendingShrinkIsr: the maximal ISR is the old ISR until the removal is
    committed, so the high watermark does not pass the follower early."""
    p = leader()
    p.follower_fetched(2, 10, 10, T0 + 1)
    p.follower_fetched(3, 4, 10, T0 + 1)
    change = p.maybe_shrink_isr(10, T0 + LAG_MS + 2, LAG_MS)
    assert change is not None and p.maximal_isr == (1, 2, 3)
    assert p.high_watermark == 4
    assert p.isr_committed(change, 10, T0 + LAG_MS + 3)
    assert p.high_watermark == 10


def test_a_follower_at_the_log_end_is_never_out_of_sync() -> None:
    """Kafka's isFollowerOutOfSync: an idle partition's followers stay (their LEO is the
    leader's) however long since they last fetched with anything new."""
    p = leader()
    p.follower_fetched(2, 10, 10, T0)
    p.follower_fetched(3, 10, 10, T0)
    assert p.out_of_sync(10, T0 + 10 * LAG_MS, LAG_MS) == []


def test_unknown_isr_follower_is_removed_after_the_lag_time() -> None:
    p = leader()
    p.follower_fetched(2, 0, 0, T0)
    assert p.out_of_sync(0, T0 + LAG_MS + 1, LAG_MS) == [3]


def test_controller_set_isr_is_taken_at_once() -> None:
    p = leader()
    p.follower_fetched(2, 10, 10, T0)
    assert p.set_isr((1, 2), 10, T0)  # 3 (unknown) no longer holds the HW back
    assert p.high_watermark == 10


# ---------------------------------------------------------------------- acks=all
def test_acks_all_waits_for_the_high_watermark() -> None:
    p = leader()
    assert p.acks_all(10, 2) is AcksAll.WAIT
    p.follower_fetched(2, 10, 10, T0)
    p.follower_fetched(3, 10, 10, T0)
    assert p.acks_all(10, 2) is AcksAll.DONE


def test_acks_all_below_min_insync_after_the_append() -> None:
    p = PartitionLeader(1, 0, (1, 2, 3), (1,), 0, 0, T0)
    p.maybe_increment_high_watermark(10)
    assert p.acks_all(10, 2) is AcksAll.NOT_ENOUGH_REPLICAS
    assert p.acks_all(10, 1) is AcksAll.DONE


def test_reassignment_adds_followers_unknown() -> None:
    p = leader()
    p.set_replicas((1, 2, 3, 4))
    assert p.follower_log_end_offset(4) == -1
    p.set_replicas((1, 4))
    assert set(p.followers) == {4}


def test_an_isr_member_a_reassignment_removed_leaves_the_isr_at_once() -> None:
    """tests/cluster/test_failover.py's reassignment (loaded run, this machine): the
    controller completed the move of replicas [1, 2] to [2, 3] (ISR [2, 3]), the new
    leader still had the old assignment when broker 1's last fetch came, took it back in
    (ISR [2, 3, 1]) and then learnt the assignment [2, 3]. Broker 1 never fetched again,
    so it was never out of sync by the lag rule, and it held the high watermark back."""
    p = PartitionLeader(2, 7, (2, 3, 1), (2, 3), 10, 10, T0)
    p.follower_fetched(3, 10, 10, T0)
    p.follower_fetched(1, 10, 10, T0)
    change = p.maybe_expand_isr(1)
    assert change is not None
    p.isr_committed(change, 10, T0)
    assert p.isr == (2, 3, 1)
    p.set_replicas((2, 3))
    assert p.out_of_sync(10, T0 + 1, LAG_MS) == [1]  # not a replica: no lag wait
    shrink = p.maybe_shrink_isr(10, T0 + 1, LAG_MS)
    assert shrink is not None and shrink.isr == (2, 3) and shrink.replicas == (1,)
    p.isr_committed(shrink, 10, T0 + 1)
    p.follower_fetched(3, 12, 12, T0 + 2)
    p.maybe_increment_high_watermark(12)
    assert p.high_watermark == 12  # broker 1 no longer holds it


def test_a_follower_whose_broker_is_not_eligible_is_not_taken_back() -> None:
    """KIP-841: the controller took broker 3 out (its registration vanished); the leader
    must not add it back while it is not registered, or the two fight over it."""
    p = leader(isr=(1, 2))
    p.follower_fetched(2, 10, 10, T0)
    p.follower_fetched(3, 10, 10, T0)
    assert p.maybe_expand_isr(3, eligible=False) is None
    assert p.pending is None
    assert p.maybe_expand_isr(3, eligible=True) is not None
