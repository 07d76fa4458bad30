"""PURE: one share-partition — a (group, topic, partition) on the partition leader (KIP-932).

Kafka's ``kafka.server.share.SharePartition`` (4.2) with its ``InFlightBatch`` and
``InFlightState``, as a plain object driven by method calls with the time passed in. The
shell reads the log from ``next_fetch_offset()``, hands the fetched batches to ``acquire``,
answers ShareAcknowledge with ``acknowledge``, calls ``release_member`` when a member's
share session closes or it leaves, ``expire_locks`` when the timer set from
``next_deadline()`` fires, and writes ``take_changes()`` to the share coordinator
(WriteShareGroupState). It never touches a socket, a clock or the log.

## Offsets

- **SPSO** (``start_offset``): every record below it is done (delivered and acknowledged,
  or archived). **SPEO** (``end_offset``): the last offset in flight; with nothing in
  flight it equals the SPSO, the next offset to fetch (Kafka's convention).
- In-flight records live between them in *in-flight batches*: one state for the whole
  batch while every record in it shares it, or a state per offset once a request touches
  only part of it (Kafka's ``maybeInitializeOffsetStateUpdate``). Batches are never split
  otherwise, so an untouched batch costs one state however many records it holds.

## Record states (Kafka's ``RecordState``) — ``TRANSITIONS`` below

| from         | to           | by                                                        |
|--------------|--------------|-----------------------------------------------------------|
| AVAILABLE    | ACQUIRED     | ``acquire``: delivery count + 1, member, lock deadline     |
| AVAILABLE    | ARCHIVED     | a control or aborted batch fetched over it; log start moved |
| ACQUIRED     | AVAILABLE    | RELEASE, lock timeout (count kept), member released (count - 1) |
| ACQUIRED     | ACKNOWLEDGED | ACCEPT                                                    |
| ACQUIRED     | ARCHIVED     | REJECT, GAP; RELEASE or lock timeout at the delivery limit  |
| ACKNOWLEDGED, ARCHIVED | —  | terminal: never delivered again                            |

An illegal transition raises ``ShareStateError`` (our bug) before anything changed.

## Rules

1. **Acquire** (``SharePartition.acquire``): AVAILABLE in-flight records in the fetched
   range are re-acquired first (redelivery), a whole batch at once when the fetch covers
   it; then new records after the SPEO, as one in-flight batch per run of deliverable log
   batches (holes inside a run are acquired with it; the client reports them as GAP, as
   Kafka's client does for offsets it found no record at). ``max_fetch_records`` is a
   soft limit: a new run ends at the end of the log batch holding the last record that
   fits, and a whole cached batch is taken even if it goes past it. The in-flight window
   (SPEO - SPSO + 1) never grows past ``max_in_flight_records``
   (``group.share.partition.max.record.locks``, 2000 in Kafka 4.2); when it is full only
   records inside it can be re-acquired (``lastOffsetAndMaxRecordsToAcquire``). In
   ShareFetch v2's ``record_limit`` mode (``strict``, KIP-1206) the limit is exact: the
   run ends where it falls, inside a log batch or a cached batch.
2. **Never delivered**: control batches, and under ``read_committed`` the batches of
   aborted transactions, are ARCHIVED when fetched (Kafka archives the aborted ones in
   ``filterAbortedTransactionalAcquiredRecords``; it hands control records out and the
   client acknowledges them as GAP — we archive them at once, so they never hold a lock
   and the client never sees their offsets).
3. **Acknowledge** (``SharePartition.acknowledge``): each range carries one acknowledge
   type for all its offsets or one per offset. GAP(0) and REJECT(3) archive, ACCEPT(1)
   acknowledges, RELEASE(2) makes the record AVAILABLE again — ARCHIVED once its delivery
   count reached ``max_delivery_count`` (``group.share.delivery.count.limit``, 5;
   ``InFlightState.tryUpdateState``); RENEW(4) restarts the lock. Offsets below the SPSO
   are skipped. A record not ACQUIRED, or acquired by another member, is
   INVALID_RECORD_STATE; a range that is malformed (first > last, wrong number of types,
   unknown type, ranges out of order or overlapping) or reaches past the in-flight records
   is INVALID_REQUEST. A request that fails changes nothing (Kafka rolls the whole
   request back, ``rollbackOrProcessStateUpdates``).
4. **Locks**: every acquisition sets a deadline ``now_ms + record_lock_duration_ms``.
   ``expire_locks`` makes records whose deadline passed AVAILABLE with their delivery
   count kept, or ARCHIVED at the limit (``releaseAcquisitionLockOnTimeout``).
5. **Member released** (``releaseAcquiredRecords``, share session closed / member left
   or fenced): its ACQUIRED records become AVAILABLE with the delivery count decreased —
   Kafka counts them as never delivered — so this never archives (below the SPSO it does).
6. **SPSO** (``maybeUpdateCachedStateAndOffsets``): advances over the longest prefix of
   in-flight records that are ACKNOWLEDGED or ARCHIVED (holes in the log are skipped);
   batches wholly below it are dropped, so memory is bounded by the in-flight window. It
   never moves back. ``update_log_start_offset`` moves it to a newer log start, archiving
   AVAILABLE records below (``updateCacheAndOffsets``).
7. **Persistence** (WriteShareGroupState's StateBatches): ACQUIRED is never written as
   such: an acquired record is written AVAILABLE with the delivery count it had before
   this acquisition (what Kafka's persister holds for it), and an AVAILABLE record never
   delivered is not written at all (a gap, fetched again). ``recover`` rebuilds the
   in-flight state: gaps between state batches become AVAILABLE, delivery counts are
   kept, ACKNOWLEDGED/ARCHIVED records are never delivered again.
"""

from __future__ import annotations

import enum
import heapq
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

DEFAULT_MAX_IN_FLIGHT_RECORDS = 2000  # group.share.partition.max.record.locks (Kafka 4.2)
DEFAULT_MAX_DELIVERY_COUNT = 5  # group.share.delivery.count.limit
DEFAULT_RECORD_LOCK_DURATION_MS = 30_000  # group.share.record.lock.duration.ms

EMPTY_MEMBER_ID = ""  # SharePartition.EMPTY_MEMBER_ID: no member holds the record


class ShareStateError(RuntimeError):
    """Our misuse or bug: a call in the wrong partition state, or an illegal record state
    transition. Nothing was changed. (A client's bad acknowledgement is not this: it is
    answered with an error code.)"""


class RecordState(enum.Enum):
    """Kafka's ``RecordState``; the values are the ids written in state batches."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4

    @property
    def is_terminal(self) -> bool:
        return self in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


TRANSITIONS: dict[RecordState, frozenset[RecordState]] = {
    RecordState.AVAILABLE: frozenset({RecordState.ACQUIRED, RecordState.ARCHIVED}),
    RecordState.ACQUIRED: frozenset(
        {RecordState.AVAILABLE, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED}),
    RecordState.ACKNOWLEDGED: frozenset(),
    RecordState.ARCHIVED: frozenset(),
}


class AcknowledgeType(enum.IntEnum):
    """Kafka's ``AcknowledgeType`` ids as sent in ShareFetch/ShareAcknowledge; 0 is a gap."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


_ACK_TYPE_IDS = frozenset(t.value for t in AcknowledgeType)

_ACK_TO_STATE = {
    AcknowledgeType.GAP: RecordState.ARCHIVED,
    AcknowledgeType.ACCEPT: RecordState.ACKNOWLEDGED,
    AcknowledgeType.RELEASE: RecordState.AVAILABLE,
    AcknowledgeType.REJECT: RecordState.ARCHIVED,
}


class IsolationLevel(enum.Enum):
    """``share.isolation.level``."""

    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"


class SharePartitionState(enum.Enum):
    """Kafka's ``SharePartitionState``, the part that is ours: EMPTY until the start offset
    is known (``initialize``), then ACTIVE. (INITIALIZING, FAILED and FENCED are the
    shell's: reading the persister, failing to, losing leadership.)"""

    EMPTY = "empty"
    ACTIVE = "active"


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    """One log batch the shell read for ``acquire``: its offsets, whether it is a control
    batch (transaction markers), and whether it belongs to an aborted transaction (the
    shell knows from the fetch's aborted transactions, as for a read_committed consumer)."""

    base_offset: int
    last_offset: int
    is_control: bool = False
    is_aborted: bool = False

    def __post_init__(self) -> None:
        if self.last_offset < self.base_offset:
            raise ValueError(f"batch {self.base_offset}-{self.last_offset} is empty")


@dataclass(frozen=True, slots=True)
class AcquiredRecords:
    """ShareFetchResponse's ``AcquiredRecords``."""

    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class AcknowledgementBatch:
    """ShareAcknowledge's ``AcknowledgementBatches`` entry (Kafka's
    ``ShareAcknowledgementBatch``): one type for the whole range, or one per offset."""

    first_offset: int
    last_offset: int
    acknowledge_types: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PersisterStateBatch:
    """WriteShareGroupState's ``StateBatches`` entry (Kafka's ``PersisterStateBatch``);
    ``delivery_state`` is a ``RecordState`` value."""

    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class ShareStateWrite:
    """What the shell writes with WriteShareGroupState for this partition."""

    start_offset: int
    state_epoch: int
    delivery_complete_count: int
    state_batches: tuple[PersisterStateBatch, ...]


@dataclass(frozen=True, slots=True)
class ShareDescription:
    """For the console and DescribeShareGroupOffsets: SPSO, SPEO, in-flight counts."""

    start_offset: int
    end_offset: int
    in_flight_records: int
    available: int
    acquired: int
    acknowledged: int
    archived: int


# -- mutable internals ----------------------------------------------------------------


@dataclass(slots=True)
class _InFlightState:
    """Kafka's ``InFlightState``: one state for a batch or an offset."""

    state: RecordState
    delivery_count: int
    member_id: str = EMPTY_MEMBER_ID
    lock_deadline_ms: int | None = None

    def copy(self) -> _InFlightState:
        return _InFlightState(self.state, self.delivery_count, self.member_id,
                              self.lock_deadline_ms)

    def move(self, new: RecordState, delivery_count: int, member_id: str = EMPTY_MEMBER_ID,
             lock_deadline_ms: int | None = None) -> None:
        if new not in TRANSITIONS[self.state]:
            raise ShareStateError(f"illegal record state transition {self.state.name} -> "
                                  f"{new.name}")
        self.state = new
        self.delivery_count = delivery_count
        self.member_id = member_id
        self.lock_deadline_ms = lock_deadline_ms


@dataclass(slots=True)
class _InFlightBatch:
    """Kafka's ``InFlightBatch``: ``batch_state`` while one state fits all its offsets,
    else ``offset_state`` with one entry per offset, in offset order."""

    first_offset: int
    last_offset: int
    batch_state: _InFlightState | None
    offset_state: dict[int, _InFlightState] | None = None

    def split(self) -> dict[int, _InFlightState]:
        if self.offset_state is None:
            assert self.batch_state is not None
            whole = self.batch_state
            self.offset_state = {o: whole.copy()
                                 for o in range(self.first_offset, self.last_offset + 1)}
            self.batch_state = None
        return self.offset_state

    def units(self, first: int, last: int) -> Iterator[tuple[int, int, _InFlightState]]:
        """(first, last, state) for the states covering [first, last], unclipped for a
        whole batch."""
        if self.offset_state is None:
            assert self.batch_state is not None
            yield self.first_offset, self.last_offset, self.batch_state
            return
        for o in range(max(first, self.first_offset), min(last, self.last_offset) + 1):
            yield o, o, self.offset_state[o]


class SharePartition:
    """One share-partition's in-flight records (see the module docstring for the rules)."""

    def __init__(self, start_offset: int | None = None, *,
                 max_in_flight_records: int = DEFAULT_MAX_IN_FLIGHT_RECORDS,
                 max_delivery_count: int = DEFAULT_MAX_DELIVERY_COUNT,
                 record_lock_duration_ms: int = DEFAULT_RECORD_LOCK_DURATION_MS,
                 isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
                 state_epoch: int = 0) -> None:
        if max_in_flight_records < 1 or max_delivery_count < 1 or record_lock_duration_ms < 1:
            raise ValueError("max_in_flight_records, max_delivery_count and "
                             "record_lock_duration_ms must be positive")
        self.max_in_flight_records = max_in_flight_records
        self.max_delivery_count = max_delivery_count
        self.record_lock_duration_ms = record_lock_duration_ms
        self.isolation_level = isolation_level
        self.state_epoch = state_epoch
        self.partition_state = SharePartitionState.EMPTY
        self._start_offset = 0
        self._next_new = 0  # the first offset never acquired (SPEO + 1 while in flight)
        self._keys: list[int] = []  # first offsets of the in-flight batches, ascending
        self._batches: dict[int, _InFlightBatch] = {}
        # (deadline, first, last): some record in [first, last] was locked until deadline.
        self._locks: list[tuple[int, int, int]] = []
        self._dirty: list[tuple[int, int]] = []  # ranges changed since take_changes()
        self._written_start_offset: int | None = None
        if start_offset is not None:
            self.initialize(start_offset)

    # -- lifecycle ---------------------------------------------------------------------

    def initialize(self, start_offset: int) -> None:
        """EMPTY -> ACTIVE at ``start_offset`` (the shell resolved share.auto.offset.reset
        or read it from the persister)."""
        if self.partition_state is not SharePartitionState.EMPTY:
            raise ShareStateError("the share-partition is already initialized")
        if start_offset < 0:
            raise ValueError(f"start offset {start_offset} is negative")
        self._start_offset = self._next_new = start_offset
        self._written_start_offset = start_offset  # the shell writes the initial state
        self.partition_state = SharePartitionState.ACTIVE

    @classmethod
    def recover(cls, start_offset: int, state_batches: Iterable[PersisterStateBatch], *,
                state_epoch: int = 0, max_in_flight_records: int = DEFAULT_MAX_IN_FLIGHT_RECORDS,
                max_delivery_count: int = DEFAULT_MAX_DELIVERY_COUNT,
                record_lock_duration_ms: int = DEFAULT_RECORD_LOCK_DURATION_MS,
                isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
                ) -> SharePartition:
        """Rebuild from ReadShareGroupState (Kafka's ``maybeInitialize``). State batches
        must be in order, not overlap and not start below ``start_offset`` (Kafka fails
        the load otherwise: ``ValueError``). A gap between them was acquired and never
        acknowledged: it becomes AVAILABLE again. ACQUIRED (never written by us) and
        AVAILABLE are recovered AVAILABLE; one already at the delivery limit is
        ARCHIVED (it cannot be delivered again)."""
        sp = cls(start_offset, max_in_flight_records=max_in_flight_records,
                 max_delivery_count=max_delivery_count,
                 record_lock_duration_ms=record_lock_duration_ms,
                 isolation_level=isolation_level, state_epoch=state_epoch)
        next_offset = start_offset
        for sb in state_batches:
            if sb.first_offset < next_offset or sb.last_offset < sb.first_offset:
                raise ValueError(f"state batch {sb.first_offset}-{sb.last_offset} is out of "
                                 f"order, overlaps or starts below {start_offset}")
            if sb.delivery_count < 0:
                raise ValueError(f"state batch {sb.first_offset}-{sb.last_offset} has a "
                                 f"negative delivery count")
            state = RecordState(sb.delivery_state)
            if sb.first_offset > next_offset and sp._keys:
                sp._put(next_offset, sb.first_offset - 1,
                        _InFlightState(RecordState.AVAILABLE, 0))
            if not state.is_terminal:
                state = (RecordState.ARCHIVED if sb.delivery_count >= max_delivery_count
                         else RecordState.AVAILABLE)
            sp._put(sb.first_offset, sb.last_offset, _InFlightState(state, sb.delivery_count))
            next_offset = sb.last_offset + 1
        if sp._keys:
            first = sp._keys[0]
            if first > start_offset:  # a leading gap: fetched again
                sp._put(start_offset, first - 1, _InFlightState(RecordState.AVAILABLE, 0))
            sp._next_new = next_offset
            sp._maybe_advance_start()
        sp._written_start_offset = start_offset
        return sp

    def _require_active(self) -> None:
        if self.partition_state is not SharePartitionState.ACTIVE:
            raise ShareStateError("the share-partition is not initialized")

    # -- reading -----------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """The SPSO."""
        return self._start_offset

    @property
    def end_offset(self) -> int:
        """The SPEO (equal to the SPSO when nothing is in flight)."""
        return self._next_new - 1 if self._next_new > self._start_offset else self._start_offset

    def next_fetch_offset(self) -> int:
        """Where the shell reads the log next (``SharePartition.nextFetchOffset``): the
        first AVAILABLE in-flight record, else the offset after the in-flight records."""
        for key in self._keys:
            b = self._batches[key]
            for first, _last, st in b.units(b.first_offset, b.last_offset):
                if st.state is RecordState.AVAILABLE and _last >= self._start_offset:
                    return max(first, self._start_offset)
        return self._next_new

    def in_flight_records(self) -> int:
        """SPEO - SPSO + 1 while anything is in flight (``numInFlightRecords``)."""
        return self._next_new - self._start_offset

    def can_acquire_records(self) -> bool:
        """``canAcquireRecords``: something is AVAILABLE inside the window, or it has room."""
        if self.next_fetch_offset() != self._next_new:
            return True
        return self.in_flight_records() < self.max_in_flight_records

    def record_state(self, offset: int) -> tuple[RecordState, int, str] | None:
        """(state, delivery count, member id) of an in-flight offset, or None."""
        b = self._batch_at(offset)
        if b is None or offset < self._start_offset:
            return None
        st = b.batch_state if b.offset_state is None else b.offset_state[offset]
        assert st is not None
        return st.state, st.delivery_count, st.member_id

    def describe(self) -> ShareDescription:
        counts = dict.fromkeys(RecordState, 0)
        for first, last, st in self._all_units():
            counts[st.state] += last - first + 1
        return ShareDescription(self._start_offset, self.end_offset, self.in_flight_records(),
                                counts[RecordState.AVAILABLE], counts[RecordState.ACQUIRED],
                                counts[RecordState.ACKNOWLEDGED], counts[RecordState.ARCHIVED])

    def delivery_complete_count(self) -> int:
        """ACKNOWLEDGED/ARCHIVED records at or above the SPSO (Kafka's
        ``deliveryCompleteCount``, written with the state for the lag)."""
        return sum(last - first + 1 for first, last, st in self._all_units()
                   if st.state.is_terminal)

    def lag(self, high_watermark: int) -> int:
        """Records not yet done below ``high_watermark``: HWM - SPSO - the done ones."""
        return max(0, high_watermark - self._start_offset - self.delivery_complete_count())

    def next_deadline(self) -> int | None:
        """The earliest acquisition-lock deadline, for the shell's one timer."""
        while self._locks:
            deadline, first, last = self._locks[0]
            if self._lock_is_live(deadline, first, last):
                return deadline
            heapq.heappop(self._locks)
        return None

    # -- acquire -----------------------------------------------------------------------

    def acquire(self, member_id: str, batches: Sequence[FetchedBatch], max_fetch_records: int,
                now_ms: int, *, isolation_level: IsolationLevel | None = None,
                strict: bool = False) -> list[AcquiredRecords]:
        """Acquire the fetched records for ``member_id`` (rules 1-2); ``batches`` in
        offset order, as read from ``next_fetch_offset()``. ``strict`` (ShareFetch v2's
        ``record_limit`` acquire mode, KIP-1206): never more than ``max_fetch_records``,
        a log batch or a cached batch split where the limit falls."""
        self._require_active()
        if member_id == EMPTY_MEMBER_ID:
            raise ValueError("a member id is required")
        if not batches or max_fetch_records <= 0:
            return []
        isolation = self.isolation_level if isolation_level is None else isolation_level
        lo = max(batches[0].base_offset, self._start_offset)
        hi = batches[-1].last_offset
        if hi < lo:
            return []
        # lastOffsetAndMaxRecordsToAcquire
        max_records = min(max_fetch_records,
                          self.max_in_flight_records - self.in_flight_records())
        if max_records <= 0:
            if lo >= self._next_new:
                return []
            max_records = min(max_fetch_records, self._next_new - lo)
            hi = min(hi, self._next_new - 1)
        skipped = [b for b in batches if b.is_control
                   or (b.is_aborted and isolation is IsolationLevel.READ_COMMITTED)]
        deadline = now_ms + self.record_lock_duration_ms
        acquired: list[tuple[int, int, int]] = []
        count = 0
        if self._keys:
            for sb in skipped:  # cached records a control/aborted batch covers: never delivered
                self._archive_available(max(sb.base_offset, lo), min(sb.last_offset, hi))
            for b in self._overlapping(lo, min(hi, self._next_new - 1)):
                if count >= max_records:
                    break
                if b.offset_state is None:
                    st = b.batch_state
                    assert st is not None
                    if st.state is not RecordState.AVAILABLE:
                        continue
                    whole = b.last_offset - b.first_offset + 1
                    if lo <= b.first_offset and b.last_offset <= hi and (
                            not strict or count + whole <= max_records):
                        st.move(RecordState.ACQUIRED, st.delivery_count + 1, member_id, deadline)
                        acquired.append((b.first_offset, b.last_offset, st.delivery_count))
                        count += b.last_offset - b.first_offset + 1
                        continue
                for o, ost in b.split().items():
                    if o < lo:
                        continue
                    if o > hi or count >= max_records:
                        break
                    if ost.state is RecordState.AVAILABLE:
                        ost.move(RecordState.ACQUIRED, ost.delivery_count + 1, member_id,
                                 deadline)
                        acquired.append((o, o, ost.delivery_count))
                        count += 1
        # New records after the in-flight ones (acquireNewBatchRecords).
        first_new = max(lo, self._next_new)
        if count < max_records and first_new <= hi:
            last_new = hi
            room = max_records - count
            if room < last_new - first_new + 1:
                target = first_new + room - 1
                last_new = target if strict else next(
                    (min(b.last_offset, hi) for b in batches
                     if b.base_offset <= target <= b.last_offset), target)
            was_empty = self._next_new == self._start_offset
            run_first = first_new
            for sb in skipped:
                if sb.last_offset < first_new or sb.base_offset > last_new:
                    continue
                if sb.base_offset > run_first:
                    self._put_acquired(run_first, sb.base_offset - 1, member_id, deadline,
                                       acquired)
                s_first = max(sb.base_offset, run_first)
                s_last = min(sb.last_offset, last_new)
                self._put(s_first, s_last, _InFlightState(RecordState.ARCHIVED, 0))
                self._mark_dirty(s_first, s_last)
                run_first = s_last + 1
            if run_first <= last_new:
                self._put_acquired(run_first, last_new, member_id, deadline, acquired)
            if was_empty:
                self._start_offset = first_new
            self._next_new = max(self._next_new, last_new + 1)
        if acquired:
            acquired.sort()
            heapq.heappush(self._locks, (deadline, acquired[0][0], acquired[-1][1]))
        self._maybe_advance_start()
        return _merge(acquired)

    def _put_acquired(self, first: int, last: int, member_id: str, deadline: int,
                      acquired: list[tuple[int, int, int]]) -> None:
        self._put(first, last, _InFlightState(RecordState.ACQUIRED, 1, member_id, deadline))
        acquired.append((first, last, 1))

    # -- acknowledge -------------------------------------------------------------------

    def acknowledge(self, member_id: str, batches: Sequence[AcknowledgementBatch],
                    now_ms: int) -> ErrorCode:
        """Apply ``member_id``'s acknowledgements (rule 3): all of them, or none and the
        error for the partition."""
        self._require_active()
        error = self._validate_acknowledgements(member_id, batches)
        if error is not ErrorCode.none:
            return error
        renew_deadline = now_ms + self.record_lock_duration_ms
        for ack in batches:
            first = max(ack.first_offset, self._start_offset)
            if ack.last_offset < first:
                continue
            per_offset = len(ack.acknowledge_types) > 1
            for b in self._overlapping(first, ack.last_offset):
                whole = (b.offset_state is None and not per_offset
                         and first <= b.first_offset and b.last_offset <= ack.last_offset)
                if whole:
                    st = b.batch_state
                    assert st is not None
                    self._apply_ack(st, AcknowledgeType(ack.acknowledge_types[0]),
                                    b.first_offset, b.last_offset, renew_deadline)
                    continue
                states = b.split()
                for o in range(max(first, b.first_offset), min(ack.last_offset, b.last_offset) + 1):
                    kind = ack.acknowledge_types[o - ack.first_offset if per_offset else 0]
                    self._apply_ack(states[o], AcknowledgeType(kind), o, o, renew_deadline)
        self._maybe_advance_start()
        return ErrorCode.none

    def _validate_acknowledgements(self, member_id: str,
                                   batches: Sequence[AcknowledgementBatch]) -> ErrorCode:
        previous_last = -1
        for ack in batches:
            size = ack.last_offset - ack.first_offset + 1
            if (ack.first_offset < 0 or size <= 0 or ack.first_offset <= previous_last
                    or len(ack.acknowledge_types) not in (1, size)
                    or any(t not in _ACK_TYPE_IDS for t in ack.acknowledge_types)):
                return ErrorCode.invalid_request
            previous_last = ack.last_offset
        for ack in batches:
            if ack.last_offset < self._start_offset:
                continue  # already done: Kafka skips it
            # fetchSubMapForAcknowledgementBatch
            anchor = ack.first_offset
            if bisect_right(self._keys, anchor) == 0:
                if not (anchor < self._start_offset <= ack.last_offset):
                    return ErrorCode.invalid_record_state
                anchor = self._start_offset
                if bisect_right(self._keys, anchor) == 0:
                    return ErrorCode.invalid_record_state
            sub = self._overlapping(anchor, ack.last_offset)
            last_cached = self._batches[self._keys[bisect_right(self._keys, ack.last_offset) - 1]]
            if last_cached.last_offset < ack.first_offset or not sub:
                return ErrorCode.invalid_request
            if ack.last_offset > last_cached.last_offset:
                return ErrorCode.invalid_request
            first = max(ack.first_offset, self._start_offset)
            for b in sub:
                if b.last_offset < first:
                    continue
                for _f, _l, st in b.units(first, ack.last_offset):
                    if st.state is not RecordState.ACQUIRED or st.member_id != member_id:
                        return ErrorCode.invalid_record_state
        return ErrorCode.none

    def _apply_ack(self, st: _InFlightState, kind: AcknowledgeType, first: int, last: int,
                   renew_deadline: int) -> None:
        if kind is AcknowledgeType.RENEW:
            st.lock_deadline_ms = renew_deadline
            heapq.heappush(self._locks, (renew_deadline, first, last))
            return
        new = _ACK_TO_STATE[kind]
        if new is RecordState.AVAILABLE and st.delivery_count >= self.max_delivery_count:
            new = RecordState.ARCHIVED
        st.move(new, st.delivery_count)
        self._mark_dirty(first, last)

    # -- release and locks -------------------------------------------------------------

    def release_member(self, member_id: str, now_ms: int) -> list[PersisterStateBatch]:
        """Rule 5: the member's acquired records become AVAILABLE (delivery count - 1)."""
        self._require_active()
        changed: list[PersisterStateBatch] = []
        for first, last, st in self._all_units(include_below_start=True):
            if st.state is RecordState.ACQUIRED and st.member_id == member_id:
                if last < self._start_offset:
                    st.move(RecordState.ARCHIVED, st.delivery_count)
                else:
                    st.move(RecordState.AVAILABLE, max(0, st.delivery_count - 1))
                self._mark_dirty(first, last)
                changed.append(_persisted(first, last, st))
        self._maybe_advance_start()
        return changed

    def expire_locks(self, now_ms: int) -> list[PersisterStateBatch]:
        """Rule 4: records whose lock deadline is at or before ``now_ms`` are released."""
        self._require_active()
        changed: list[PersisterStateBatch] = []
        while self._locks and self._locks[0][0] <= now_ms:
            _deadline, lock_first, lock_last = heapq.heappop(self._locks)
            for b in self._overlapping(lock_first, lock_last):
                for first, last, st in b.units(lock_first, lock_last):
                    if (st.state is not RecordState.ACQUIRED or st.lock_deadline_ms is None
                            or st.lock_deadline_ms > now_ms):
                        continue
                    new = RecordState.AVAILABLE
                    if last < self._start_offset or st.delivery_count >= self.max_delivery_count:
                        new = RecordState.ARCHIVED
                    st.move(new, st.delivery_count)
                    self._mark_dirty(first, last)
                    changed.append(_persisted(first, last, st))
        self._maybe_advance_start()
        return changed

    def update_log_start_offset(self, log_start_offset: int) -> None:
        """The log start moved past the SPSO (retention, DeleteRecords): AVAILABLE records
        below it are archived and the SPSO moves to it (``updateCacheAndOffsets``).
        ACQUIRED ones stay with their member until acknowledged or timed out."""
        self._require_active()
        if log_start_offset <= self._start_offset:
            return
        if self._keys:
            self._archive_available(self._start_offset, log_start_offset - 1)
            straddling = self._batch_at(log_start_offset)
            if straddling is not None and straddling.first_offset < log_start_offset:
                straddling.split()  # per-offset from here: the part below is handled alone
        self._start_offset = log_start_offset
        self._next_new = max(self._next_new, log_start_offset)
        self._maybe_advance_start()

    # -- persistence -------------------------------------------------------------------

    def state_batches(self) -> list[PersisterStateBatch]:
        """The whole in-flight state as WriteShareGroupState's StateBatches (rule 7)."""
        return _coalesce(_persisted(first, last, st) for first, last, st in self._all_units()
                         if not (st.state is RecordState.AVAILABLE and st.delivery_count == 0))

    def snapshot(self) -> ShareStateWrite:
        """Everything: start offset, state epoch and ``state_batches()``."""
        return ShareStateWrite(self._start_offset, self.state_epoch,
                               self.delivery_complete_count(), tuple(self.state_batches()))

    def take_changes(self) -> ShareStateWrite | None:
        """What changed since the last call (the records acknowledged, released, timed out
        or archived, with their new state, and the start offset), or None. Kafka writes this
        on each acknowledgement; the shell writes it and calls this again next time."""
        if not self._dirty and self._written_start_offset == self._start_offset:
            return None
        ranges = sorted(self._dirty)
        merged: list[tuple[int, int]] = []
        for first, last in ranges:
            if merged and first <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], last))
            else:
                merged.append((first, last))
        out: list[PersisterStateBatch] = []
        for first, last in merged:
            first = max(first, self._start_offset)
            for b in self._overlapping(first, last):
                for u_first, u_last, st in b.units(first, last):
                    out.append(_persisted(max(u_first, first), min(u_last, last), st))
        self._dirty.clear()
        self._written_start_offset = self._start_offset
        return ShareStateWrite(self._start_offset, self.state_epoch,
                               self.delivery_complete_count(), tuple(_coalesce(out)))

    # -- internals ---------------------------------------------------------------------

    def _put(self, first: int, last: int, state: _InFlightState) -> None:
        idx = bisect_right(self._keys, first)
        self._keys.insert(idx, first)
        self._batches[first] = _InFlightBatch(first, last, state)

    def _batch_at(self, offset: int) -> _InFlightBatch | None:
        idx = bisect_right(self._keys, offset) - 1
        if idx < 0:
            return None
        b = self._batches[self._keys[idx]]
        return b if b.last_offset >= offset else None

    def _overlapping(self, first: int, last: int) -> list[_InFlightBatch]:
        idx = max(0, bisect_right(self._keys, first) - 1)
        out: list[_InFlightBatch] = []
        for key in self._keys[idx:]:
            if key > last:
                break
            b = self._batches[key]
            if b.last_offset >= first:
                out.append(b)
        return out

    def _all_units(self, include_below_start: bool = False,
                   ) -> Iterator[tuple[int, int, _InFlightState]]:
        """(first, last, state) over the in-flight records, clipped to the SPSO."""
        floor = 0 if include_below_start else self._start_offset
        for key in self._keys:
            b = self._batches[key]
            if b.last_offset < floor:
                continue
            for first, last, st in b.units(floor, b.last_offset):
                yield max(first, floor), last, st

    def _archive_available(self, first: int, last: int) -> None:
        for b in self._overlapping(first, last):
            if b.offset_state is None:
                st = b.batch_state
                assert st is not None
                if st.state is not RecordState.AVAILABLE:
                    continue
                if first <= b.first_offset and b.last_offset <= last:
                    st.move(RecordState.ARCHIVED, st.delivery_count)
                    self._mark_dirty(b.first_offset, b.last_offset)
                    continue
            states = b.split()
            for o in range(max(first, b.first_offset), min(last, b.last_offset) + 1):
                if states[o].state is RecordState.AVAILABLE:
                    states[o].move(RecordState.ARCHIVED, states[o].delivery_count)
                    self._mark_dirty(o, o)

    def _mark_dirty(self, first: int, last: int) -> None:
        if self._dirty and self._dirty[-1][1] + 1 == first:
            self._dirty[-1] = (self._dirty[-1][0], last)
        else:
            self._dirty.append((first, last))

    def _lock_is_live(self, deadline: int, first: int, last: int) -> bool:
        for b in self._overlapping(first, last):
            for _f, _l, st in b.units(first, last):
                if st.state is RecordState.ACQUIRED and st.lock_deadline_ms == deadline:
                    return True
        return False

    def _maybe_advance_start(self) -> None:
        """Rule 6 (``maybeUpdateCachedStateAndOffsets``)."""
        if not self._keys:
            return
        last_done: int | None = None
        for key in self._keys:
            b = self._batches[key]
            stop = False
            for _first, last, st in b.units(b.first_offset, b.last_offset):
                if not st.state.is_terminal:
                    stop = True
                    break
                last_done = last
            if stop:
                break
        if last_done is None or last_done < self._start_offset:
            return
        last_cached = self._batches[self._keys[-1]].last_offset
        if last_done == last_cached:
            self._start_offset = max(self._start_offset, last_cached + 1)
            self._next_new = max(self._next_new, self._start_offset)
            self._keys.clear()
            self._batches.clear()
            return
        idx = bisect_right(self._keys, last_done) - 1
        b = self._batches[self._keys[idx]]
        if last_done == b.last_offset:
            self._start_offset = max(self._start_offset, self._keys[idx + 1])
            drop = idx + 1
        else:
            self._start_offset = max(self._start_offset, last_done + 1)
            drop = idx
        for key in self._keys[:drop]:
            del self._batches[key]
        del self._keys[:drop]


def _persisted(first: int, last: int, st: _InFlightState) -> PersisterStateBatch:
    if st.state is RecordState.ACQUIRED:  # written as before this acquisition (rule 7)
        return PersisterStateBatch(first, last, RecordState.AVAILABLE.value,
                                   max(0, st.delivery_count - 1))
    return PersisterStateBatch(first, last, st.state.value, st.delivery_count)


def _coalesce(batches: Iterable[PersisterStateBatch]) -> list[PersisterStateBatch]:
    out: list[PersisterStateBatch] = []
    for sb in batches:
        if out:
            prev = out[-1]
            if (prev.last_offset + 1 == sb.first_offset and prev.delivery_state
                    == sb.delivery_state and prev.delivery_count == sb.delivery_count):
                out[-1] = PersisterStateBatch(prev.first_offset, sb.last_offset,
                                              sb.delivery_state, sb.delivery_count)
                continue
        out.append(sb)
    return out


def _merge(acquired: list[tuple[int, int, int]]) -> list[AcquiredRecords]:
    """Adjacent acquired ranges with one delivery count become one AcquiredRecords."""
    out: list[AcquiredRecords] = []
    for first, last, count in acquired:
        if out and out[-1].last_offset + 1 == first and out[-1].delivery_count == count:
            out[-1] = AcquiredRecords(out[-1].first_offset, last, count)
        else:
            out.append(AcquiredRecords(first, last, count))
    return out
