"""PURE: the transaction coordinator's state machine (Kafka's ``TransactionCoordinator``
with transaction version 1, the protocol every client in the census speaks).

One ``TxnMetadata`` per transactional id, in Kafka's states::

    Empty ──AddPartitions──> Ongoing ──EndTxn──> PrepareCommit ──markers──> CompleteCommit
      ^                         │                PrepareAbort  ──markers──> CompleteAbort
      └──InitProducerId─────────┴── (Complete*, Empty: epoch + 1; Ongoing: fenced, aborted)

Every change is first a record to append to ``__transaction_state`` (``TxnWrite``): the
shell appends it (acks=all), then calls ``written`` with the outcome, and only then does
the change take effect (Kafka's ``pendingState``: meanwhile every other request for the id
is CONCURRENT_TRANSACTIONS). A written PrepareCommit/PrepareAbort returns ``Markers`` for
the shell to send to the partitions' leaders (WriteTxnMarkers); ``markers_done`` then
writes the Complete state. Time is passed in (``now_ms``); producer ids come from the
injected allocator. Error codes are Kafka's, request by request:

- InitProducerId: "" → INVALID_REQUEST; a timeout outside (0, transaction.max.timeout.ms]
  → INVALID_TRANSACTION_TIMEOUT; a write in flight or a Prepare state →
  CONCURRENT_TRANSACTIONS; an Ongoing transaction is fenced (epoch + 1) and aborted, and
  the caller hears CONCURRENT_TRANSACTIONS (it retries and gets the next epoch); a
  KIP-360 caller naming a producer id and epoch that are neither the current nor the
  previous ones → PRODUCER_FENCED. Otherwise the epoch goes up by one (a new producer id
  at epoch 0 when it would overflow).
- AddPartitionsToTxn, AddOffsetsToTxn, EndTxn: unknown id or another producer id →
  INVALID_PRODUCER_ID_MAPPING; another epoch → PRODUCER_FENCED; a write in flight →
  CONCURRENT_TRANSACTIONS. EndTxn retried after it completed → NONE; the other outcome of a
  completed or preparing transaction → INVALID_TXN_STATE; EndTxn with nothing begun →
  INVALID_TXN_STATE.
- ``verify_partitions`` (AddPartitionsToTxn v4+ ``verify_only``, a partition leader asking
  before it appends a transaction's first batch, KIP-890; Kafka's
  ``handleVerifyPartitionsInTransaction``): changes nothing. "" → INVALID_REQUEST; unknown
  id or another producer id → INVALID_PRODUCER_ID_MAPPING; another epoch →
  PRODUCER_FENCED; a Prepare state → CONCURRENT_TRANSACTIONS; otherwise each partition
  NONE if it is in the transaction (added, its record written), else INVALID_TXN_STATE.
  A pending write is not looked at (the leader's append checks again, as Kafka's).
- ``timed_out``: Ongoing transactions older than their timeout are fenced and aborted
  (Kafka's ``abortTimedOutTransactions``); ``expired``: ids idle in Empty or Complete* for
  ``transactional.id.expiration.ms`` are written as tombstones and forgotten.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from kio.schema.errors import ErrorCode

from headrace.txn.records import TxnLogValue, TxnState

MAX_EPOCH = 32_767  # Short.MaxValue; an epoch that would reach it takes a new producer id
OFFSETS_TOPIC = "__consumer_offsets"

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: set[TopicPartition] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int = -1
    last_producer_id: int = -1
    last_producer_epoch: int = -1
    pending: TxnMetadata | None = None  # the state being written (Kafka's pendingState)

    def to_value(self) -> TxnLogValue:
        parts: dict[str, tuple[int, ...]] | None = None
        if self.state != TxnState.EMPTY:
            grouped: dict[str, list[int]] = {}
            for topic, p in self.partitions:
                grouped.setdefault(topic, []).append(p)
            parts = {t: tuple(sorted(ps)) for t, ps in grouped.items()}
        return TxnLogValue(self.producer_id, self.producer_epoch, self.timeout_ms, self.state,
                           parts, self.last_update_ms, self.start_ms,
                           previous_producer_id=self.last_producer_id)

    @classmethod
    def from_value(cls, tid: str, v: TxnLogValue) -> TxnMetadata:
        parts = {(t, p) for t, ps in (v.partitions or {}).items() for p in ps}
        return cls(tid, v.producer_id, v.producer_epoch, v.timeout_ms, v.state, parts,
                   v.start_ms, v.last_update_ms, v.previous_producer_id, -1)

    def copy(self, **changes: object) -> TxnMetadata:
        out = replace(self, partitions=set(self.partitions), pending=None)
        for k, v in changes.items():
            setattr(out, k, v)
        return out


@dataclass(frozen=True, slots=True)
class TxnWrite:
    """Append this to ``__transaction_state`` (value None: a tombstone), then call
    ``written``."""

    transactional_id: str
    value: TxnLogValue | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to answer, after ``write`` (if any) was appended and ``written`` called. When
    the write fails, the answer is the shell's error (NOT_COORDINATOR etc.) instead."""

    error: ErrorCode = ErrorCode.none
    producer_id: int = -1
    producer_epoch: int = -1
    write: TxnWrite | None = None


@dataclass(frozen=True, slots=True)
class Markers:
    """WriteTxnMarkers to send: a COMMIT or ABORT control batch for ``producer_id`` at
    ``producer_epoch`` in each partition; then call ``markers_done``."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[TopicPartition]


class TxnCoordinator:
    def __init__(self, allocate_producer_id: Callable[[], int], max_timeout_ms: int) -> None:
        self.allocate_producer_id = allocate_producer_id
        self.max_timeout_ms = max_timeout_ms
        self.txns: dict[str, TxnMetadata] = {}

    # ------------------------------------------------------------------ loading
    def replay(self, transactional_id: str, value: TxnLogValue | None) -> None:
        """A record read back from ``__transaction_state`` (a new leader loading its
        partition): the last value wins, a tombstone forgets the id."""
        if value is None:
            self.txns.pop(transactional_id, None)
        else:
            self.txns[transactional_id] = TxnMetadata.from_value(transactional_id, value)

    def unfinished(self) -> list[Markers]:
        """After loading: the transactions whose markers may not all have been written (a
        Prepare state): the shell sends them again (markers are idempotent)."""
        return [self._markers(m) for m in self.txns.values()
                if m.pending is None and m.state in (TxnState.PREPARE_COMMIT,
                                                     TxnState.PREPARE_ABORT)]

    # ------------------------------------------------------------------ requests
    def init_producer_id(self, tid: str, timeout_ms: int, now_ms: int,
                         expected: tuple[int, int] | None = None,
                         new_producer_id: int | None = None) -> Outcome:
        """``new_producer_id``: one the shell reserved (its allocation is I/O) for a new id
        or an exhausted epoch; else the injected allocator is asked."""
        def allocate() -> int:
            return self.allocate_producer_id() if new_producer_id is None else new_producer_id

        if tid == "":
            return Outcome(ErrorCode.invalid_request)
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return Outcome(ErrorCode.invalid_transaction_timeout)
        m = self.txns.get(tid)
        if m is None:
            m = TxnMetadata(tid, allocate(), -1, timeout_ms, TxnState.EMPTY,
                            last_update_ms=now_ms)
            self.txns[tid] = m
        if m.pending is not None:
            return Outcome(ErrorCode.concurrent_transactions)
        if expected is not None and expected != (-1, -1) and expected not in (
                (m.producer_id, m.producer_epoch), (m.last_producer_id, m.last_producer_epoch)):
            return Outcome(ErrorCode.producer_fenced)
        if m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT,
                       TxnState.PREPARE_EPOCH_FENCE, TxnState.DEAD):
            return Outcome(ErrorCode.concurrent_transactions)
        if m.state == TxnState.ONGOING:
            # a zombie's transaction: fence its epoch and abort it; the caller retries
            out = self._abort_fenced(m, now_ms)
            return Outcome(ErrorCode.concurrent_transactions, write=out)
        new = m.copy(timeout_ms=timeout_ms, state=TxnState.EMPTY, partitions=set(),
                     start_ms=-1, last_update_ms=now_ms)
        if m.producer_epoch + 1 >= MAX_EPOCH:
            new.last_producer_id, new.last_producer_epoch = m.producer_id, m.producer_epoch
            new.producer_id, new.producer_epoch = allocate(), 0
        else:
            new.last_producer_id, new.last_producer_epoch = m.producer_id, m.producer_epoch
            new.producer_epoch = m.producer_epoch + 1
        return Outcome(ErrorCode.none, new.producer_id, new.producer_epoch,
                       self._begin(m, new))

    def add_partitions(self, tid: str, producer_id: int, epoch: int,
                       partitions: Iterable[TopicPartition], now_ms: int) -> Outcome:
        m, error = self._check(tid, producer_id, epoch)
        if m is None:
            return Outcome(error)
        if m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT,
                       TxnState.PREPARE_EPOCH_FENCE):
            return Outcome(ErrorCode.concurrent_transactions)
        if m.state == TxnState.DEAD:
            return Outcome(ErrorCode.invalid_txn_state)
        wanted = set(partitions)
        if m.state == TxnState.ONGOING and wanted <= m.partitions:
            return Outcome(ErrorCode.none)
        starting = m.state != TxnState.ONGOING
        new = m.copy(state=TxnState.ONGOING,
                     partitions=(set() if starting else set(m.partitions)) | wanted,
                     start_ms=now_ms if starting else m.start_ms, last_update_ms=now_ms)
        return Outcome(ErrorCode.none, write=self._begin(m, new))

    def add_offsets(self, tid: str, producer_id: int, epoch: int, offsets_partition: int,
                    now_ms: int) -> Outcome:
        """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition joins."""
        return self.add_partitions(tid, producer_id, epoch, [(OFFSETS_TOPIC,
                                                              offsets_partition)], now_ms)

    def end_txn(self, tid: str, producer_id: int, epoch: int, commit: bool,
                now_ms: int) -> Outcome:
        m, error = self._check(tid, producer_id, epoch)
        if m is None:
            return Outcome(error)
        state = m.state
        if state == TxnState.ONGOING:
            target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            new = m.copy(state=target, last_update_ms=now_ms)
            return Outcome(ErrorCode.none, write=self._begin(m, new))
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        if state == done:
            return Outcome(ErrorCode.none)  # a retry of what already happened
        if state == preparing:
            return Outcome(ErrorCode.concurrent_transactions)
        return Outcome(ErrorCode.invalid_txn_state)

    def verify_partitions(self, tid: str, producer_id: int, epoch: int,
                          partitions: Iterable[TopicPartition]
                          ) -> dict[TopicPartition, ErrorCode]:
        """Is each partition in ``tid``'s ongoing transaction (module docstring)? Pure:
        changes nothing."""
        wanted = list(partitions)
        if tid == "":
            return dict.fromkeys(wanted, ErrorCode.invalid_request)
        m = self.txns.get(tid)
        error = ErrorCode.none
        if m is None or m.producer_id != producer_id:
            error = ErrorCode.invalid_producer_id_mapping
        elif m.producer_epoch != epoch:
            error = ErrorCode.producer_fenced
        elif m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            error = ErrorCode.concurrent_transactions
        if error is not ErrorCode.none or m is None:
            return dict.fromkeys(wanted, error)
        return {tp: ErrorCode.none if tp in m.partitions else ErrorCode.invalid_txn_state
                for tp in wanted}

    # ------------------------------------------------------------------ the shell's calls
    def written(self, tid: str, ok: bool, now_ms: int) -> Markers | None:
        """The pending record was appended (``ok``) or not. Returns the markers to send
        when the new state is a Prepare state."""
        m = self.txns.get(tid)
        if m is None or m.pending is None:
            return None
        new, m.pending = m.pending, None
        if not ok:
            if m.producer_epoch < 0:  # a new id whose first record failed: forget it
                self.txns.pop(tid, None)
            return None
        if new.state == TxnState.DEAD:
            self.txns.pop(tid, None)
            return None
        self.txns[tid] = new
        if new.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return self._markers(new)
        return None

    def markers_done(self, tid: str, now_ms: int) -> TxnWrite | None:
        """Every marker of the Prepare state was written: write the Complete state."""
        m = self.txns.get(tid)
        if m is None or m.pending is not None or m.state not in (TxnState.PREPARE_COMMIT,
                                                                 TxnState.PREPARE_ABORT):
            return None
        done = (TxnState.COMPLETE_COMMIT if m.state == TxnState.PREPARE_COMMIT
                else TxnState.COMPLETE_ABORT)
        return self._begin(m, m.copy(state=done, partitions=set(), last_update_ms=now_ms))

    def timed_out(self, now_ms: int) -> list[TxnWrite]:
        """Abort every Ongoing transaction past its timeout, fencing its producer."""
        out = []
        for m in list(self.txns.values()):
            if (m.state == TxnState.ONGOING and m.pending is None
                    and m.start_ms + m.timeout_ms < now_ms):
                out.append(self._abort_fenced(m, now_ms))
        return out

    def expired(self, now_ms: int, expiration_ms: int) -> list[TxnWrite]:
        """Tombstones for ids idle in Empty or Complete* for ``expiration_ms``."""
        out = []
        for m in list(self.txns.values()):
            if (m.pending is None and m.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT,
                                                  TxnState.COMPLETE_ABORT)
                    and m.last_update_ms + expiration_ms <= now_ms):
                dead = m.copy(state=TxnState.DEAD, last_update_ms=now_ms)
                m.pending = dead
                out.append(TxnWrite(m.transactional_id, None))
        return out

    # ------------------------------------------------------------------ helpers
    def _check(self, tid: str, producer_id: int, epoch: int
               ) -> tuple[TxnMetadata | None, ErrorCode]:
        m = self.txns.get(tid)
        if m is None or m.producer_id != producer_id:
            return None, ErrorCode.invalid_producer_id_mapping
        if epoch != m.producer_epoch:
            return None, ErrorCode.producer_fenced
        if m.pending is not None:
            return None, ErrorCode.concurrent_transactions
        return m, ErrorCode.none

    def _begin(self, m: TxnMetadata, new: TxnMetadata) -> TxnWrite:
        m.pending = new
        return TxnWrite(m.transactional_id, new.to_value())

    def _abort_fenced(self, m: TxnMetadata, now_ms: int) -> TxnWrite:
        """Kafka's fence-then-abort: the epoch goes up by one so the old producer's next
        request is fenced, and the transaction is aborted at that epoch."""
        new = m.copy(state=TxnState.PREPARE_ABORT, last_update_ms=now_ms,
                     producer_epoch=min(m.producer_epoch + 1, MAX_EPOCH - 1),
                     last_producer_id=m.producer_id, last_producer_epoch=m.producer_epoch)
        return self._begin(m, new)

    @staticmethod
    def _markers(m: TxnMetadata) -> Markers:
        return Markers(m.transactional_id, m.producer_id, m.producer_epoch,
                       m.state == TxnState.PREPARE_COMMIT, frozenset(m.partitions))
