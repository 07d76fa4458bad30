"""KIP-932 share-partition rules, in the manner of Kafka's ``SharePartitionTest``: a
``SharePartition`` driven by method calls with a manual clock (``now_ms`` arguments).

Kafka classes cited: ``SharePartition`` (acquire, acknowledge, releaseAcquiredRecords,
releaseAcquisitionLockOnTimeout, maybeUpdateCachedStateAndOffsets, updateCacheAndOffsets,
filterAbortedTransactionalAcquiredRecords), ``InFlightState.tryUpdateState``,
``RecordState``, ``AcknowledgeType``, ``PersisterStateBatch``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from headrace.share.partition import (
    DEFAULT_MAX_IN_FLIGHT_RECORDS,
    TRANSITIONS,
    AcknowledgementBatch,
    AcquiredRecords,
    FetchedBatch,
    IsolationLevel,
    PersisterStateBatch,
    RecordState,
    SharePartition,
    SharePartitionState,
    ShareStateError,
    _InFlightState,
)

T0 = 1_000_000
LOCK = 30_000
ACCEPT, RELEASE, REJECT, GAP, RENEW = 1, 2, 3, 0, 4


def ack(first: int, last: int, *types: int) -> AcknowledgementBatch:
    return AcknowledgementBatch(first, last, tuple(types))


def fetched(*ranges: tuple[int, int]) -> list[FetchedBatch]:
    return [FetchedBatch(a, b) for a, b in ranges]


def state(sp: SharePartition, offset: int) -> RecordState | None:
    s = sp.record_state(offset)
    return None if s is None else s[0]


def acquired_0_9(sp: SharePartition | None = None, member: str = "a") -> SharePartition:
    sp = sp or SharePartition(0)
    assert sp.acquire(member, fetched((0, 4), (5, 9)), 500, T0) == [AcquiredRecords(0, 9, 1)]
    return sp


# -- lifecycle ----------------------------------------------------------------------------

def test_an_uninitialized_share_partition_refuses_work_and_initializes_once() -> None:
    """KIP-932: the start offset comes from share.auto.offset.reset or the persister
    (Kafka's SharePartitionState EMPTY -> ACTIVE); the shell resolves it."""
    sp = SharePartition()
    assert sp.partition_state is SharePartitionState.EMPTY
    with pytest.raises(ShareStateError):
        sp.acquire("a", fetched((0, 0)), 10, T0)
    sp.initialize(42)
    assert (sp.partition_state, sp.start_offset, sp.end_offset) == (
        SharePartitionState.ACTIVE, 42, 42)
    assert sp.next_fetch_offset() == 42
    with pytest.raises(ShareStateError):
        sp.initialize(0)
    assert sp.start_offset == 42


def test_the_record_state_table_is_kafkas_and_an_illegal_move_changes_nothing() -> None:
    """RecordState.validateTransition: ACKNOWLEDGED and ARCHIVED are terminal; AVAILABLE
    only becomes ACQUIRED (or is archived)."""
    assert TRANSITIONS[RecordState.ACKNOWLEDGED] == frozenset()
    assert TRANSITIONS[RecordState.ARCHIVED] == frozenset()
    assert RecordState.ACKNOWLEDGED not in TRANSITIONS[RecordState.AVAILABLE]
    s = _InFlightState(RecordState.ACKNOWLEDGED, 1)
    with pytest.raises(ShareStateError):
        s.move(RecordState.AVAILABLE, 2)
    assert (s.state, s.delivery_count) == (RecordState.ACKNOWLEDGED, 1)
    assert [r.value for r in RecordState] == [0, 1, 2, 4]


# -- acquire ------------------------------------------------------------------------------

def test_new_records_are_acquired_whole_with_delivery_count_one_and_a_lock() -> None:
    """SharePartition.acquire / acquireNewBatchRecords: the fetched batches become one
    in-flight batch, locked for record_lock_duration_ms."""
    sp = acquired_0_9()
    assert (sp.start_offset, sp.end_offset, sp.in_flight_records()) == (0, 9, 10)
    assert sp.record_state(3) == (RecordState.ACQUIRED, 1, "a")
    assert sp.next_deadline() == T0 + LOCK
    assert sp.next_fetch_offset() == 10
    assert len(sp._batches) == 1  # untouched: one state for the whole batch


def test_a_fetch_that_starts_before_the_spso_acquires_from_the_spso() -> None:
    """SharePartition.acquire: the base offset is moved up to the start offset."""
    sp = SharePartition(3)
    assert sp.acquire("a", fetched((0, 5)), 100, T0) == [AcquiredRecords(3, 5, 1)]
    assert sp.start_offset == 3


def test_max_fetch_records_is_a_soft_limit_ending_at_a_batch_boundary() -> None:
    """acquireNewBatchRecords / lastOffsetFromBatchWithRequestOffset."""
    sp = SharePartition(0)
    assert sp.acquire("a", fetched((0, 3), (4, 7), (8, 11)), 5, T0) == [
        AcquiredRecords(0, 7, 1)]
    assert sp.next_fetch_offset() == 8


def test_record_limit_mode_acquires_exactly_max_records() -> None:
    """ShareFetch v2's record_limit acquire mode (KIP-1206): the limit is exact, a log
    batch is split where it falls, and the rest of it is acquired by the next fetch (read
    from next_fetch_offset, inside the batch); a released cached batch is split too."""
    sp = SharePartition(0)
    assert sp.acquire("a", fetched((0, 3), (4, 7)), 5, T0, strict=True) == [
        AcquiredRecords(0, 4, 1)]
    assert sp.next_fetch_offset() == 5
    assert sp.acquire("b", fetched((4, 7)), 2, T0, strict=True) == [AcquiredRecords(5, 6, 1)]
    assert sp.acknowledge("a", [ack(0, 4, RELEASE)], T0) is ErrorCode.none
    assert sp.acquire("c", fetched((0, 3), (4, 7)), 3, T0, strict=True) == [
        AcquiredRecords(0, 2, 2)]


def test_the_in_flight_window_stops_new_acquisitions_at_max_record_locks() -> None:
    """group.share.partition.max.record.locks (Kafka 4.2: 2000) and
    lastOffsetAndMaxRecordsToAcquire: a full window acquires nothing new, but a released
    record inside it can be re-acquired."""
    assert DEFAULT_MAX_IN_FLIGHT_RECORDS == 2000
    sp = SharePartition(0, max_in_flight_records=10)
    assert sp.acquire("a", fetched((0, 5)), 100, T0) == [AcquiredRecords(0, 5, 1)]
    # 4 slots left: the batch 6-11 is taken whole (soft limit), then the window is full
    assert sp.acquire("a", fetched((6, 11)), 100, T0) == [AcquiredRecords(6, 11, 1)]
    assert not sp.can_acquire_records()
    assert sp.acquire("b", fetched((12, 20)), 100, T0) == []
    assert sp.acknowledge("a", [ack(8, 8, RELEASE)], T0) == ErrorCode.none
    assert sp.can_acquire_records() and sp.next_fetch_offset() == 8
    assert sp.acquire("b", fetched((6, 11), (12, 20)), 100, T0) == [AcquiredRecords(8, 8, 2)]
    assert sp.end_offset == 11


def test_released_records_are_redelivered_first_with_a_higher_delivery_count() -> None:
    """SharePartition.acquire: AVAILABLE in-flight records are re-acquired before new
    ones; a batch untouched by the request is re-acquired whole."""
    sp = acquired_0_9()
    assert sp.acknowledge("a", [ack(0, 9, RELEASE)], T0) == ErrorCode.none
    assert sp.next_fetch_offset() == 0
    got = sp.acquire("b", fetched((0, 4), (5, 9), (10, 14)), 500, T0 + 1)
    assert got == [AcquiredRecords(0, 9, 2), AcquiredRecords(10, 14, 1)]
    assert len(sp._batches) == 2 and all(b.offset_state is None for b in sp._batches.values())


def test_a_fetch_inside_a_batch_tracks_offsets_and_takes_only_the_available_ones() -> None:
    """InFlightBatch.maybeInitializeOffsetStateUpdate and acquireSubsetBatchRecords."""
    sp = acquired_0_9()
    assert sp.acknowledge("a", [ack(3, 6, ACCEPT, RELEASE, ACCEPT, RELEASE)], T0) == ErrorCode.none
    assert sp.next_fetch_offset() == 4
    got = sp.acquire("b", fetched((0, 9)), 500, T0)
    assert got == [AcquiredRecords(4, 4, 2), AcquiredRecords(6, 6, 2)]
    assert sp.record_state(4) == (RecordState.ACQUIRED, 2, "b")
    assert sp.record_state(5) == (RecordState.ACKNOWLEDGED, 1, "")


def test_a_fetch_ending_inside_a_released_batch_acquires_only_what_was_fetched() -> None:
    """SharePartition.acquire / checkForFullMatch: a cached batch the fetch covers only in
    part is tracked per offset, and only the fetched offsets are acquired."""
    sp = acquired_0_9()
    sp.acknowledge("a", [ack(0, 9, RELEASE)], T0)
    assert sp.acquire("b", fetched((0, 4)), 500, T0) == [AcquiredRecords(0, 4, 2)]
    assert sp.record_state(5) == (RecordState.AVAILABLE, 1, "")
    assert sp.next_fetch_offset() == 5


def test_control_batches_are_never_delivered() -> None:
    """KIP-932: transaction markers are not records; Kafka's client acknowledges them as
    GAP, we archive them when fetched so no lock is held on them."""
    sp = SharePartition(0)
    got = sp.acquire("a", [FetchedBatch(0, 2), FetchedBatch(3, 3, is_control=True),
                           FetchedBatch(4, 6)], 100, T0)
    assert got == [AcquiredRecords(0, 2, 1), AcquiredRecords(4, 6, 1)]
    assert state(sp, 3) is RecordState.ARCHIVED


def test_a_lone_control_batch_moves_the_spso_past_it() -> None:
    sp = SharePartition(0)
    assert sp.acquire("a", [FetchedBatch(0, 0, is_control=True)], 100, T0) == []
    assert (sp.start_offset, sp.in_flight_records(), sp.next_fetch_offset()) == (1, 0, 1)


def test_aborted_records_are_archived_under_read_committed_only() -> None:
    """share.isolation.level=read_committed:
    SharePartition.filterAbortedTransactionalAcquiredRecords archives aborted batches."""
    batches = [FetchedBatch(0, 1), FetchedBatch(2, 4, is_aborted=True),
               FetchedBatch(5, 5, is_control=True), FetchedBatch(6, 7)]
    rc = SharePartition(0, isolation_level=IsolationLevel.READ_COMMITTED)
    assert rc.acquire("a", batches, 100, T0) == [AcquiredRecords(0, 1, 1), AcquiredRecords(6, 7, 1)]
    assert [state(rc, o) for o in (2, 3, 4, 5)] == [RecordState.ARCHIVED] * 4
    ru = SharePartition(0)
    assert ru.acquire("a", batches, 100, T0) == [AcquiredRecords(0, 4, 1), AcquiredRecords(6, 7, 1)]


def test_available_records_under_an_aborted_batch_are_archived_when_fetched_again() -> None:
    """After recovery a gap is AVAILABLE; fetching it under read_committed archives the
    aborted part instead of delivering it."""
    sp = SharePartition.recover(0, [PersisterStateBatch(5, 5, RecordState.ACKNOWLEDGED.value, 1)],
                                isolation_level=IsolationLevel.READ_COMMITTED)
    got = sp.acquire("a", [FetchedBatch(0, 1), FetchedBatch(2, 4, is_aborted=True)], 100, T0)
    assert got == [AcquiredRecords(0, 1, 1)]
    assert state(sp, 2) is RecordState.ARCHIVED


# -- acknowledge --------------------------------------------------------------------------

def test_accept_moves_the_spso_and_drops_the_batch() -> None:
    """maybeUpdateCachedStateAndOffsets: the SPSO passes done records; memory is freed."""
    sp = acquired_0_9()
    assert sp.acknowledge("a", [ack(0, 9, ACCEPT)], T0) == ErrorCode.none
    assert (sp.start_offset, sp.end_offset, sp.in_flight_records()) == (10, 10, 0)
    assert sp._batches == {} and sp.next_fetch_offset() == 10
    assert sp.next_deadline() is None


def test_the_spso_stops_at_the_first_record_not_done() -> None:
    sp = acquired_0_9()
    assert sp.acknowledge("a", [ack(0, 3, ACCEPT), ack(5, 6, REJECT)], T0) == ErrorCode.none
    assert sp.start_offset == 4
    assert sp.acknowledge("a", [ack(4, 4, GAP)], T0) == ErrorCode.none
    assert sp.start_offset == 7
    assert sp.describe().archived == 0 and sp.describe().acquired == 3


def test_the_spso_passes_whole_batches_and_drops_them() -> None:
    sp = acquired_0_9()
    sp.acquire("a", fetched((10, 19)), 100, T0)
    assert sp.acknowledge("a", [ack(0, 9, ACCEPT)], T0) == ErrorCode.none
    assert sp.start_offset == 10 and list(sp._batches) == [10]


def test_per_offset_acknowledge_types() -> None:
    """AcknowledgeType per offset: ACCEPT(1) ACKNOWLEDGED, RELEASE(2) AVAILABLE,
    REJECT(3) and GAP(0) ARCHIVED."""
    sp = acquired_0_9()
    assert sp.acknowledge("a", [ack(1, 4, ACCEPT, RELEASE, REJECT, GAP)], T0) == ErrorCode.none
    assert [state(sp, o) for o in range(0, 6)] == [
        RecordState.ACQUIRED, RecordState.ACKNOWLEDGED, RecordState.AVAILABLE,
        RecordState.ARCHIVED, RecordState.ARCHIVED, RecordState.ACQUIRED]
    assert sp.record_state(2) == (RecordState.AVAILABLE, 1, "")


def test_release_at_the_delivery_limit_archives() -> None:
    """InFlightState.tryUpdateState: AVAILABLE at group.share.delivery.count.limit
    becomes ARCHIVED."""
    sp = SharePartition(0, max_delivery_count=2)
    sp.acquire("a", fetched((0, 0)), 10, T0)
    assert sp.acknowledge("a", [ack(0, 0, RELEASE)], T0) == ErrorCode.none
    assert sp.acquire("a", fetched((0, 0)), 10, T0) == [AcquiredRecords(0, 0, 2)]
    assert sp.acknowledge("a", [ack(0, 0, RELEASE)], T0) == ErrorCode.none
    assert sp.start_offset == 1  # archived, so done
    assert sp.acquire("a", fetched((0, 0)), 10, T0) == []


def test_acknowledging_records_not_acquired_is_invalid_record_state() -> None:
    sp = acquired_0_9()
    assert sp.acknowledge("a", [ack(0, 4, RELEASE)], T0) == ErrorCode.none
    assert sp.acknowledge("a", [ack(2, 2, ACCEPT)], T0) == ErrorCode.invalid_record_state


def test_acknowledging_another_members_records_is_invalid_record_state() -> None:
    sp = acquired_0_9()
    assert sp.acknowledge("b", [ack(0, 9, ACCEPT)], T0) == ErrorCode.invalid_record_state
    assert sp.acknowledge("b", [ack(3, 3, ACCEPT)], T0) == ErrorCode.invalid_record_state
    assert state(sp, 3) is RecordState.ACQUIRED


def test_acknowledging_available_records_is_invalid_record_state_whoever_asks() -> None:
    """SharePartition.acknowledgeCompleteBatch: only ACQUIRED records can be acknowledged,
    even by a request naming no member (EMPTY_MEMBER_ID)."""
    sp = acquired_0_9()
    sp.acknowledge("a", [ack(0, 9, RELEASE)], T0)
    assert sp.acknowledge("", [ack(0, 9, ACCEPT)], T0) == ErrorCode.invalid_record_state
    assert sp.acknowledge("", [ack(2, 2, ACCEPT)], T0) == ErrorCode.invalid_record_state
    assert state(sp, 2) is RecordState.AVAILABLE


def test_acknowledging_twice_is_invalid_record_state() -> None:
    sp = acquired_0_9()
    sp.acquire("a", fetched((10, 12)), 10, T0)
    assert sp.acknowledge("a", [ack(5, 6, ACCEPT)], T0) == ErrorCode.none
    assert sp.acknowledge("a", [ack(5, 5, REJECT)], T0) == ErrorCode.invalid_record_state


def test_nothing_in_flight_is_invalid_record_state() -> None:
    sp = SharePartition(5)
    assert sp.acknowledge("a", [ack(5, 6, ACCEPT)], T0) == ErrorCode.invalid_record_state


@pytest.mark.parametrize("bad", [
    [ack(3, 2, ACCEPT)],                       # first > last
    [ack(0, 2, ACCEPT, ACCEPT)],               # neither one type nor one per offset
    [ack(0, 2)],                               # no type
    [ack(0, 0, 5)],                            # unknown type
    [ack(0, 4, ACCEPT), ack(4, 6, ACCEPT)],    # overlapping
    [ack(5, 6, ACCEPT), ack(0, 1, ACCEPT)],    # out of order
    [ack(8, 12, ACCEPT)],                      # past the in-flight records
    [ack(12, 14, ACCEPT)],                     # wholly past them
])
def test_malformed_acknowledgements_are_invalid_request(bad: list[AcknowledgementBatch]) -> None:
    """ShareAcknowledge validation and fetchSubMapForAcknowledgementBatch."""
    sp = acquired_0_9()
    assert sp.acknowledge("a", bad, T0) == ErrorCode.invalid_request
    assert sp.describe().acquired == 10


def test_a_failed_acknowledgement_changes_nothing() -> None:
    """rollbackOrProcessStateUpdates: one bad batch rolls the whole request back."""
    sp = acquired_0_9()
    sp.take_changes()
    before = [sp.record_state(o) for o in range(10)]
    got = sp.acknowledge("a", [ack(0, 4, ACCEPT), ack(5, 5, RELEASE), ack(6, 6, 9)], T0)
    assert got == ErrorCode.invalid_request
    got = sp.acknowledge("a", [ack(0, 4, ACCEPT), ack(20, 21, ACCEPT)], T0)
    assert got == ErrorCode.invalid_request
    sp.acquire("b", fetched((10, 11)), 10, T0)
    got = sp.acknowledge("a", [ack(0, 4, ACCEPT), ack(10, 10, ACCEPT)], T0)
    assert got == ErrorCode.invalid_record_state
    assert sp.start_offset == 0 and state(sp, 0) is RecordState.ACQUIRED
    assert [sp.record_state(o) for o in range(10)] == before and sp.take_changes() is None


def test_acknowledgements_below_the_spso_are_skipped() -> None:
    sp = acquired_0_9()
    assert sp.acknowledge("a", [ack(0, 4, ACCEPT)], T0) == ErrorCode.none
    assert sp.acknowledge("a", [ack(0, 4, ACCEPT), ack(5, 5, ACCEPT)], T0) == ErrorCode.none
    assert sp.acknowledge("a", [ack(3, 6, ACCEPT)], T0) == ErrorCode.none
    assert sp.start_offset == 7


def test_renew_restarts_the_lock_without_changing_the_state() -> None:
    """AcknowledgeType.RENEW (4): the acquisition lock restarts."""
    sp = acquired_0_9()
    assert sp.acknowledge("a", [ack(0, 9, RENEW)], T0 + 20_000) == ErrorCode.none
    assert sp.expire_locks(T0 + LOCK) == []
    assert state(sp, 0) is RecordState.ACQUIRED
    assert sp.next_deadline() == T0 + 20_000 + LOCK
    assert sp.take_changes() is None  # nothing to persist


# -- locks and members ----------------------------------------------------------------------

def test_an_expired_lock_makes_records_available_with_the_count_kept() -> None:
    """releaseAcquisitionLockOnTimeout (DeliveryCountOps.NO_OP)."""
    sp = acquired_0_9()
    assert sp.expire_locks(T0 + LOCK - 1) == []
    assert sp.expire_locks(T0 + LOCK) == [PersisterStateBatch(0, 9, 0, 1)]
    assert sp.record_state(0) == (RecordState.AVAILABLE, 1, "")
    assert sp.next_deadline() is None and sp.next_fetch_offset() == 0


def test_an_expired_lock_at_the_delivery_limit_archives() -> None:
    """A record that keeps timing out is delivered group.share.delivery.count.limit times."""
    sp = SharePartition(0)
    now = T0
    for n in range(1, 6):
        assert sp.acquire("a", fetched((0, 1)), 10, now) == [AcquiredRecords(0, 1, n)]
        now += LOCK
        sp.expire_locks(now)
    assert sp.start_offset == 2 and sp.acquire("a", fetched((0, 1)), 10, now) == []


def test_a_lock_only_covers_the_acquisition_that_set_it() -> None:
    sp = acquired_0_9()
    sp.acknowledge("a", [ack(0, 9, RELEASE)], T0)
    sp.acquire("b", fetched((0, 9)), 100, T0 + 100)
    assert sp.expire_locks(T0 + LOCK) == []
    assert sp.next_deadline() == T0 + 100 + LOCK


def test_releasing_a_member_makes_its_records_available_not_counted() -> None:
    """releaseAcquiredRecords (DeliveryCountOps.DECREASE): a share session closed."""
    sp = acquired_0_9(member="a")
    sp.acquire("b", fetched((10, 14)), 100, T0)
    changed = sp.release_member("a", T0)
    assert changed == [PersisterStateBatch(0, 9, 0, 0)]
    assert sp.record_state(0) == (RecordState.AVAILABLE, 0, "")
    assert sp.record_state(10) == (RecordState.ACQUIRED, 1, "b")
    assert sp.acquire("b", fetched((0, 9)), 100, T0) == [AcquiredRecords(0, 9, 1)]


def test_releasing_a_member_never_archives_at_the_limit() -> None:
    sp = SharePartition(0, max_delivery_count=1)
    sp.acquire("a", fetched((0, 0)), 10, T0)
    sp.release_member("a", T0)
    assert sp.acquire("a", fetched((0, 0)), 10, T0) == [AcquiredRecords(0, 0, 1)]


# -- log start, describe ------------------------------------------------------------------

def test_a_new_log_start_archives_available_records_below_it() -> None:
    """updateCacheAndOffsets."""
    sp = acquired_0_9()
    sp.acknowledge("a", [ack(0, 4, RELEASE)], T0)
    sp.update_log_start_offset(7)
    assert sp.start_offset == 7
    assert sp.next_fetch_offset() == 10
    assert sp.acknowledge("a", [ack(5, 9, ACCEPT)], T0) == ErrorCode.none
    # 5 and 6 are below the SPSO: the acknowledgement skips them, their lock archives them
    assert state(sp, 9) is RecordState.ACKNOWLEDGED and sp.start_offset == 7
    assert sp.expire_locks(T0 + LOCK) == [PersisterStateBatch(5, 5, 4, 1),
                                         PersisterStateBatch(6, 6, 4, 1)]
    assert sp.start_offset == 10 and sp._batches == {}


def test_a_log_start_past_everything_moves_both_offsets() -> None:
    sp = SharePartition(0)
    sp.update_log_start_offset(50)
    assert (sp.start_offset, sp.end_offset, sp.next_fetch_offset()) == (50, 50, 50)
    sp.update_log_start_offset(10)
    assert sp.start_offset == 50


def test_describe_counts_and_lag() -> None:
    sp = acquired_0_9()
    sp.acknowledge("a", [ack(2, 5, ACCEPT, REJECT, RELEASE, ACCEPT)], T0)
    d = sp.describe()
    assert (d.start_offset, d.end_offset, d.in_flight_records) == (0, 9, 10)
    assert (d.available, d.acquired, d.acknowledged, d.archived) == (1, 6, 2, 1)
    assert sp.delivery_complete_count() == 3
    assert sp.lag(high_watermark=15) == 15 - 0 - 3


# -- persistence --------------------------------------------------------------------------

def test_state_batches_never_write_acquired() -> None:
    """PersisterStateBatch: an acquired record is written as AVAILABLE with the count it
    had before the acquisition; never delivered ones are not written."""
    sp = acquired_0_9()
    sp.acknowledge("a", [ack(0, 1, ACCEPT), ack(5, 5, RELEASE)], T0)
    sp.acquire("b", fetched((5, 5)), 10, T0)
    assert sp.state_batches() == [
        PersisterStateBatch(2, 4, 0, 0), PersisterStateBatch(5, 5, 0, 1),
        PersisterStateBatch(6, 9, 0, 0)]
    snap = sp.snapshot()
    assert (snap.start_offset, snap.state_epoch) == (2, 0)


def test_recover_keeps_counts_and_never_redelivers_done_records() -> None:
    """SharePartition.maybeInitialize from ReadShareGroupState."""
    sp = SharePartition.recover(10, [
        PersisterStateBatch(10, 12, RecordState.ACKNOWLEDGED.value, 1),
        PersisterStateBatch(13, 14, RecordState.AVAILABLE.value, 3),
        PersisterStateBatch(15, 15, RecordState.ARCHIVED.value, 5),
        PersisterStateBatch(18, 19, RecordState.ACQUIRED.value, 2),
    ], state_epoch=4)
    assert sp.start_offset == 13 and sp.end_offset == 19 and sp.state_epoch == 4
    assert sp.next_fetch_offset() == 13
    got = sp.acquire("a", fetched((10, 14), (15, 19), (20, 21)), 100, T0)
    assert got == [AcquiredRecords(13, 14, 4), AcquiredRecords(16, 17, 1),
                   AcquiredRecords(18, 19, 3), AcquiredRecords(20, 21, 1)]


def test_recover_archives_records_already_at_the_limit_and_fills_a_leading_gap() -> None:
    sp = SharePartition.recover(0, [PersisterStateBatch(3, 3, RecordState.AVAILABLE.value, 5)])
    assert state(sp, 3) is RecordState.ARCHIVED
    assert sp.acquire("a", fetched((0, 3)), 100, T0) == [AcquiredRecords(0, 2, 1)]


def test_recover_refuses_bad_state_batches() -> None:
    with pytest.raises(ValueError):
        SharePartition.recover(5, [PersisterStateBatch(3, 6, 0, 1)])
    with pytest.raises(ValueError):
        SharePartition.recover(0, [PersisterStateBatch(3, 6, 0, 1),
                                   PersisterStateBatch(5, 6, 0, 1)])


def test_recover_of_an_empty_state_starts_at_the_start_offset() -> None:
    sp = SharePartition.recover(7, [])
    assert (sp.start_offset, sp.end_offset, sp.next_fetch_offset()) == (7, 7, 7)


def test_take_changes_returns_only_what_changed_since_the_last_write() -> None:
    """Kafka writes the in-flight state on each acknowledgement: only the changed batches
    and the start offset."""
    sp = acquired_0_9()
    sp.acquire("a", fetched((10, 19)), 100, T0)
    assert sp.take_changes() is None  # acquisitions are not written
    sp.acknowledge("a", [ack(12, 13, REJECT)], T0)
    w = sp.take_changes()
    assert w is not None and w.start_offset == 0
    assert w.state_batches == (PersisterStateBatch(12, 13, RecordState.ARCHIVED.value, 1),)
    sp.acknowledge("a", [ack(0, 9, ACCEPT)], T0)
    w = sp.take_changes()
    assert w is not None and w.start_offset == 10 and w.state_batches == ()
    assert w.delivery_complete_count == 2
    assert sp.take_changes() is None


def test_recover_from_a_snapshot_continues_the_same() -> None:
    sp = acquired_0_9()
    sp.acknowledge("a", [ack(0, 2, ACCEPT, REJECT, RELEASE), ack(4, 4, ACCEPT)], T0)
    back = SharePartition.recover(sp.start_offset, sp.state_batches())
    assert back.start_offset == 2 and back.end_offset == 9
    got = back.acquire("b", fetched((0, 9)), 100, T0)
    assert got == [AcquiredRecords(2, 2, 2), AcquiredRecords(3, 3, 1), AcquiredRecords(5, 9, 1)]


# -- property -----------------------------------------------------------------------------

LOG_BATCHES: list[FetchedBatch] = []
_o = 0
for _i in range(40):
    _size = 1 + (_i * 7) % 4
    LOG_BATCHES.append(FetchedBatch(_o, _o + _size - 1, is_control=_i % 9 == 8,
                                    is_aborted=_i % 11 == 5))
    _o += _size
LOG_END = _o
CONTROL = {o for b in LOG_BATCHES if b.is_control for o in range(b.base_offset, b.last_offset + 1)}
ABORTED = {o for b in LOG_BATCHES if b.is_aborted for o in range(b.base_offset, b.last_offset + 1)}


def read_log(offset: int, max_batches: int) -> list[FetchedBatch]:
    return [b for b in LOG_BATCHES if b.last_offset >= offset][:max_batches]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_share_sessions_keep_the_invariants(data: st.DataObject) -> None:
    """KIP-932 invariants under random acquire / acknowledge / release / lock timeout /
    recover sequences for 2-4 members: no offset is delivered after it was accepted,
    rejected or gapped; no record is held by two members; delivery counts never exceed
    group.share.delivery.count.limit; the SPSO never goes back; control and aborted
    (read_committed) records are never delivered; a member's acknowledgement of what it
    holds always succeeds; recover(state_batches()) keeps all of it."""
    limit = data.draw(st.integers(2, 5), label="limit")
    window = data.draw(st.integers(4, 40), label="window")
    members = [f"m{i}" for i in range(data.draw(st.integers(2, 4), label="members"))]
    config: dict[str, Any] = dict(max_in_flight_records=window, max_delivery_count=limit,
                  record_lock_duration_ms=LOCK, isolation_level=IsolationLevel.READ_COMMITTED)
    sp = SharePartition(0, **config)
    now = T0
    held: dict[int, str] = {}
    done: set[int] = set()
    last_spso = 0
    for _ in range(data.draw(st.integers(5, 60), label="steps")):
        op = data.draw(st.sampled_from(["acquire", "acquire", "ack", "ack", "release",
                                        "time", "recover"]))
        if op == "acquire":
            m = data.draw(st.sampled_from(members))
            got = sp.acquire(m, read_log(sp.next_fetch_offset(), data.draw(st.integers(1, 4))),
                             data.draw(st.integers(1, 12)), now)
            for r in got:
                assert 1 <= r.delivery_count <= limit
                for o in range(r.first_offset, r.last_offset + 1):
                    assert o not in held, f"{o} held by {held[o]} and {m}"
                    assert o not in done and o not in CONTROL and o not in ABORTED
                    assert o >= sp.start_offset
                    held[o] = m
        elif op == "ack" and held:
            m = data.draw(st.sampled_from(sorted(set(held.values()))))
            mine = sorted(o for o, h in held.items() if h == m)
            chosen = sorted(data.draw(st.sets(st.sampled_from(mine), min_size=1)))
            kind = data.draw(st.sampled_from([ACCEPT, RELEASE, REJECT, GAP]))
            per_offset = data.draw(st.booleans())
            batches: list[list[int]] = []
            for o in chosen:
                if batches and batches[-1][1] == o - 1:
                    batches[-1][1] = o
                else:
                    batches.append([o, o])
            acks = [AcknowledgementBatch(a, b, (kind,) * ((b - a + 1) if per_offset else 1))
                    for a, b in batches]
            assert sp.acknowledge(m, acks, now) == ErrorCode.none
            for o in chosen:
                del held[o]
                if kind != RELEASE:
                    done.add(o)
            # someone else's records are refused
            other = next((o for o, h in held.items() if h != m), None)
            if other is not None:
                assert sp.acknowledge(m, [ack(other, other, ACCEPT)], now) \
                    == ErrorCode.invalid_record_state
        elif op == "release":
            m = data.draw(st.sampled_from(members))
            sp.release_member(m, now)
            held = {o: h for o, h in held.items() if h != m}
        elif op == "time":
            now += data.draw(st.integers(1, LOCK))
            for sb in sp.expire_locks(now):
                for o in range(sb.first_offset, sb.last_offset + 1):
                    held.pop(o, None)
            deadline = sp.next_deadline()
            assert deadline is None or deadline > now
        elif op == "recover":
            sp = SharePartition.recover(sp.start_offset, sp.state_batches(), **config)
            held.clear()  # acquisitions are not persisted: the records are available again
        # invariants after every step
        assert sp.start_offset >= last_spso
        last_spso = sp.start_offset
        assert all(o >= sp.start_offset for o in held)
        for o in range(sp.start_offset, min(sp.end_offset + 1, LOG_END)):
            s = sp.record_state(o)
            if s is None:
                continue
            assert s[1] <= limit
            if o in held:
                assert s[0] is RecordState.ACQUIRED and s[2] == held[o]
            else:
                assert s[0] is not RecordState.ACQUIRED
            if o in done:
                assert s[0].is_terminal
        assert sp.in_flight_records() <= window + 12  # the soft limit: one batch over at most
