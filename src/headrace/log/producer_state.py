"""Idempotent-producer state of one partition (R-PROTO-7), Kafka's rules. PURE.

Per producer id we keep its epoch and the metadata of its last ``MAX_BATCHES`` (5) batches,
as many as a producer may have in flight, so that any retried batch is recognised:

* ``producerId == -1``: not idempotent, no checks.
* epoch below the current one: INVALID_PRODUCER_EPOCH (the producer is fenced).
* epoch above the current one: the sequence must restart at 0 (else
  OUT_OF_ORDER_SEQUENCE_NUMBER); the producer's batch history is reset.
* same epoch: a batch whose (baseSequence, lastSequence) equals one of the last five is a
  duplicate (a retry of a batch already written): the produce succeeds with the ORIGINAL
  offsets and nothing is appended. Otherwise baseSequence must be lastSequence + 1
  (wrapping from 2**31-1 to 0), else OUT_OF_ORDER_SEQUENCE_NUMBER.
* an unknown producer id: with ``strict_new_producers`` (this object's default) it must
  start at sequence 0, else OUT_OF_ORDER_SEQUENCE_NUMBER, so a lost first batch is a
  detected gap. Kafka 2.5+ accepts any sequence here, because its state for the producer
  may have gone with retention or producer-id expiry; ``PartitionLog`` passes
  ``strict_new_producers=False`` and follows Kafka, as clients expect.

``PartitionLog`` saves the state in Kafka's snapshot files (``headrace.log.state_files``:
``snapshot_entries`` / ``load_snapshot``, each producer's last batch only, as Kafka) when a
segment rolls and at close, and on open replays only the batch headers after the newest
snapshot (``update``).

Transaction verification (KIP-890 part 1, Kafka's ``VerificationStateEntry``): before
the first batch of a producer's transaction is appended here, the leader asks the
transaction coordinator whether the partition is in that producer's ongoing transaction.
``start_verification`` hands out a ``VerificationGuard``, a unique token per producer kept
until a transactional batch or marker of that producer is written (``update`` / ``marker``
clear it) or it expires; the append carries the guard back and is refused unless it is
still the producer's current one. So a verification that raced with a marker (the
transaction aborted meanwhile, a new one begun without this partition: the ABA case) is
refused, as Kafka's is.

Thread-safety: none; one event-loop thread. ``check_append`` changes nothing; only
``update`` (after the append succeeded) does, so a rejected request leaves no trace.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from headrace.log.state_files import SnapshotEntry
from headrace.protocol.records import (
    INT32_MAX,
    NO_PRODUCER_ID,
    BatchHeader,
    InvalidRecordError,
    increment_sequence,
)

MAX_BATCHES = 5


def marker_refusal(current_epoch: int, current_coordinator_epoch: int, epoch: int,
                   coordinator_epoch: int) -> ErrorCode | None:
    """Kafka's ``appendEndTxnMarker`` checks, for a producer whose newest epoch and
    newest marker's coordinator epoch are the ``current_`` ones (-1: none): a marker at
    an older producer epoch is INVALID_PRODUCER_EPOCH, one from an older coordinator
    epoch TRANSACTION_COORDINATOR_FENCED; None: it may be written. (The simulation's
    leaders use it too.)"""
    if epoch < current_epoch:
        return ErrorCode.invalid_producer_epoch
    if coordinator_epoch < current_coordinator_epoch:
        return ErrorCode.transaction_coordinator_fenced
    return None


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=MAX_BATCHES))
    last_ms: int = -1  # the last batch's (or marker's) timestamp: producer id expiry
    # the newest transaction coordinator epoch of its markers (-1: none): an older
    # coordinator's marker is fenced (Kafka's TRANSACTION_COORDINATOR_FENCED)
    coordinator_epoch: int = -1

    @property
    def last_seq(self) -> int | None:
        return self.batches[-1].last_seq if self.batches else None


class VerificationGuard:
    """A unique token for one verification of a producer's transaction on one partition
    (identity is what counts: Kafka's ``VerificationGuard``)."""

    __slots__ = ("created_ms",)

    def __init__(self, created_ms: int) -> None:
        self.created_ms = created_ms

    def __repr__(self) -> str:
        return f"VerificationGuard(created_ms={self.created_ms}, id={id(self):#x})"


class Duplicate(NamedTuple):
    """A retried request: the offsets its batches were first written at, and the last
    batch's max timestamp (its log append time on a LogAppendTime topic)."""

    first_offset: int
    last_offset: int
    timestamp: int


class ProducerStateManager:
    """The per-producer epochs and recent batches of one partition (see module docstring)."""

    def __init__(self, *, strict_new_producers: bool = True) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self.strict_new_producers = strict_new_producers
        # producer id -> the guard of its verification in progress (not persisted: a
        # restarted leader verifies again)
        self.verifications: dict[int, VerificationGuard] = {}

    # ------------------------------------------------------------------ verification
    def start_verification(self, producer_id: int, now_ms: int) -> VerificationGuard:
        """The guard of ``producer_id``'s verification: the one in progress, or a new one
        (Kafka's ``maybeCreateVerificationStateEntry``: concurrent requests share it)."""
        guard = self.verifications.get(producer_id)
        if guard is None:
            guard = self.verifications[producer_id] = VerificationGuard(now_ms)
        return guard

    def is_verified(self, producer_id: int, guard: VerificationGuard | None) -> bool:
        """``guard`` is still ``producer_id``'s current one (no transactional batch or
        marker of the producer was written since it was handed out)."""
        return guard is not None and self.verifications.get(producer_id) is guard

    def abandon_verification(self, producer_id: int, guard: VerificationGuard) -> None:
        """A verification failed: forget its guard (unless a newer one replaced it), so
        refused requests leave no state behind."""
        if self.verifications.get(producer_id) is guard:
            del self.verifications[producer_id]

    def check_append(self, headers: Sequence[BatchHeader]) -> Duplicate | None:
        """Check the batches of one append, in order; changes nothing.

        Returns ``Duplicate`` if every batch is a duplicate, None if none is; raises
        ``InvalidRecordError`` with INVALID_PRODUCER_EPOCH or OUT_OF_ORDER_SEQUENCE_NUMBER,
        or INVALID_RECORD for a request mixing duplicates and new batches.
        """
        # Epoch and last sequence per producer as earlier batches of this request leave them.
        staged: dict[int, tuple[int, int | None, tuple[BatchMetadata, ...]]] = {}
        duplicates: list[BatchMetadata] = []
        for h in headers:
            pid = h.producer_id
            if pid == NO_PRODUCER_ID:
                continue
            if pid in staged:
                epoch, last_seq, batches = staged[pid]
            elif pid in self.producers:
                entry = self.producers[pid]
                epoch, last_seq, batches = entry.epoch, entry.last_seq, tuple(entry.batches)
            else:
                epoch, last_seq, batches = -1, None, ()
            dup = self._check_one(h, epoch, last_seq, batches)
            if dup is not None:
                duplicates.append(dup)
                continue
            if h.producer_epoch != epoch:
                batches = ()
            staged[pid] = (h.producer_epoch, h.last_sequence, batches)
        if not duplicates:
            return None
        if len(duplicates) != len(headers):
            raise InvalidRecordError(
                ErrorCode.invalid_record,
                "a request mixes duplicate (retried) batches with new ones",
            )
        return Duplicate(
            duplicates[0].first_offset, duplicates[-1].last_offset, duplicates[-1].timestamp
        )

    def _check_one(
        self, h: BatchHeader, epoch: int, last_seq: int | None,
        batches: tuple[BatchMetadata, ...],
    ) -> BatchMetadata | None:
        pid, seq = h.producer_id, h.base_sequence
        if h.producer_epoch < epoch:
            raise InvalidRecordError(
                ErrorCode.invalid_producer_epoch,
                f"producer {pid} has epoch {h.producer_epoch}, older than the current {epoch}",
            )
        if h.producer_epoch > epoch:
            if seq != 0 and (epoch != -1 or self.strict_new_producers):
                what = "a new epoch" if epoch != -1 else "an unknown producer"
                raise InvalidRecordError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {pid} epoch {h.producer_epoch}: {what} must start at sequence "
                    f"0, got {seq}",
                )
            return None
        for b in batches:
            if b.first_seq == seq and b.last_seq == h.last_sequence:
                return b
        if last_seq is not None and seq != increment_sequence(last_seq, 1):
            raise InvalidRecordError(
                ErrorCode.out_of_order_sequence_number,
                f"producer {pid} epoch {epoch}: sequence {seq} does not follow {last_seq}",
            )
        return None

    def update(self, header: BatchHeader) -> None:
        """Record a batch written to the log (its offsets assigned). No checks: also used to
        rebuild the state from the log."""
        pid = header.producer_id
        if pid == NO_PRODUCER_ID:
            return
        if header.is_transactional and self.verifications:
            self.verifications.pop(pid, None)  # its transaction has a first offset now
        entry = self.producers.get(pid)
        if entry is None or entry.epoch != header.producer_epoch:
            entry = ProducerEntry(pid, header.producer_epoch, coordinator_epoch=(
                entry.coordinator_epoch if entry is not None else -1))
            self.producers[pid] = entry
        entry.batches.append(
            BatchMetadata(header.base_sequence, header.last_sequence, header.base_offset,
                          header.last_offset, header.max_timestamp)
        )
        entry.last_ms = max(entry.last_ms, header.max_timestamp)

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """Kafka's ``appendEndTxnMarker`` checks before a marker is written: an epoch older
        than the producer's is INVALID_PRODUCER_EPOCH; a coordinator epoch older than the
        newest of its markers is TRANSACTION_COORDINATOR_FENCED (a deposed coordinator's
        late marker would otherwise end the transaction the producer began since)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        refusal = marker_refusal(entry.epoch, entry.coordinator_epoch, epoch,
                                 coordinator_epoch)
        if refusal is ErrorCode.invalid_producer_epoch:
            raise InvalidRecordError(
                refusal, f"marker for producer {producer_id} at epoch {epoch}, older than "
                f"its current epoch {entry.epoch}")
        if refusal is not None:
            raise InvalidRecordError(
                refusal, f"marker for producer {producer_id} from coordinator epoch "
                f"{coordinator_epoch}, older than {entry.coordinator_epoch}")

    def marker(self, producer_id: int, epoch: int, timestamp_ms: int = -1,
               coordinator_epoch: int = -1) -> None:
        """A transaction marker for ``producer_id`` was written at ``epoch``: a newer epoch
        (a fenced producer's transaction aborted by the coordinator) becomes the current
        one, and its batches must start again at sequence 0; sequences are otherwise left
        alone; the coordinator epoch is remembered (Kafka's ``appendEndTxnMarker``)."""
        if self.verifications:
            self.verifications.pop(producer_id, None)  # the transaction here is over
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = self.producers[producer_id] = ProducerEntry(
                producer_id, epoch,
                coordinator_epoch=entry.coordinator_epoch if entry is not None else -1)
        entry.last_ms = max(entry.last_ms, timestamp_ms)
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)

    def expire(self, now_ms: int, expiration_ms: int, keep: set[int]) -> int:
        """Forget producers whose last batch is ``expiration_ms`` old, except those in
        ``keep`` (an open transaction), as Kafka's ``removeExpiredProducers``
        (``producer.id.expiration.ms``); a forgotten producer's next batch is accepted at
        any sequence. Returns how many were forgotten."""
        gone = [pid for pid, e in self.producers.items()
                if pid not in keep and now_ms - e.last_ms >= expiration_ms]
        for pid in gone:
            del self.producers[pid]
        if self.verifications:  # verifications never completed (Kafka expires them too)
            for pid in [pid for pid, g in self.verifications.items()
                        if now_ms - g.created_ms >= expiration_ms]:
                del self.verifications[pid]
        return len(gone)

    def snapshot_entries(self, ongoing: dict[int, int]) -> list[SnapshotEntry]:
        """The state as Kafka's snapshot entries; ``ongoing``: producer id -> first offset
        of its open transaction (``TxnTracker.ongoing``)."""
        out = []
        for pid in sorted(self.producers.keys() | ongoing.keys()):
            entry = self.producers.get(pid)
            epoch = entry.epoch if entry is not None else 0
            last = entry.batches[-1] if entry is not None and entry.batches else None
            out.append(SnapshotEntry(
                pid, epoch,
                last.last_seq if last else -1, last.last_offset if last else -1,
                last.last_offset - last.first_offset if last else 0,
                entry.last_ms if entry is not None else -1,
                entry.coordinator_epoch if entry is not None else -1, ongoing.get(pid, -1)))
        return out

    def load_snapshot(self, entries: Iterable[SnapshotEntry]) -> None:
        """Replace the state by a snapshot's (open transactions are the caller's)."""
        self.producers.clear()
        for e in entries:
            entry = ProducerEntry(e.producer_id, e.epoch, last_ms=e.timestamp,
                                  coordinator_epoch=e.coordinator_epoch)
            if e.last_offset >= 0:
                first_seq = e.last_sequence - e.offset_delta
                if first_seq < 0:  # the batch's sequences wrapped past 2**31 - 1
                    first_seq += INT32_MAX + 1
                entry.batches.append(BatchMetadata(
                    first_seq, e.last_sequence, e.last_offset - e.offset_delta,
                    e.last_offset, e.timestamp))
            self.producers[e.producer_id] = entry

    def load(self, headers: Iterable[BatchHeader]) -> None:
        """Rebuild from the headers of every batch in the log, oldest first."""
        self.producers.clear()
        for h in headers:
            self.update(h)

    def truncate_to(self, offset: int) -> None:
        """Forget batches at or after ``offset`` (log truncation); a producer left with no
        batch keeps its epoch."""
        for entry in self.producers.values():
            kept = [b for b in entry.batches if b.last_offset < offset]
            entry.batches.clear()
            entry.batches.extend(kept)
