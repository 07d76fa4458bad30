"""PURE: a partition's transactions (issue 10; R-PROD-2): markers, the last stable offset
and the aborted transactions that ``read_committed`` consumers skip.

A transactional producer's batches carry the transactional bit; its transaction in this
partition starts at its first such batch and ends with a *control batch* the coordinator
has the leader write (WriteTxnMarkers): one control record whose key is (int16 version 0,
int16 type: 0 ABORT, 1 COMMIT) and whose value is Kafka's EndTransactionMarker (int16
version 0, int32 coordinator epoch). ``TxnTracker`` follows the batches as they are
appended (or replayed from the log on open) and keeps, as Kafka's
``ProducerStateManager`` does:

- the *ongoing* transactions: producer id → first offset;
- completed transactions whose marker is not yet below the high watermark (Kafka's
  ``unreplicatedTxns``): they still hold the last stable offset back;
- the *aborted* transactions (producer id, first offset, marker offset, and the first
  offset of another ongoing transaction or else the offset after the marker: Kafka's
  ``AbortedTxn``, the entry of a ``.txnindex`` file).

The last stable offset is the smallest first offset of an unstable transaction, or the
high watermark if that is smaller: ``read_committed`` fetches stop there, and return the
aborted transactions overlapping what they read so the consumer drops those records.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from headrace.protocol.records import (
    CONTROL_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    InvalidRecordError,
    build_batch,
    decode_records,
)

ABORT, COMMIT = 0, 1
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_MARKER_VALUE = struct.Struct(">hi")  # version, coordinator epoch


def control_batch(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                  timestamp_ms: int) -> bytes:
    """A transaction marker as Kafka's ``MemoryRecords.withEndTransactionMarker`` builds it
    (offset 0: the log assigns the real one)."""
    key = _CONTROL_KEY.pack(0, COMMIT if commit else ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    return build_batch([(key, value)], timestamp_ms, producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=-1,
                       attributes=TRANSACTIONAL_BIT | CONTROL_BIT)


def marker_type(batch: bytes | memoryview) -> int:
    """ABORT or COMMIT of a control batch (its first record's key); ``InvalidRecordError``
    for anything else."""
    return marker_info(batch)[0]


def marker_info(batch: bytes | memoryview) -> tuple[int, int]:
    """(ABORT or COMMIT, coordinator epoch) of a control batch: its first record's key and
    value (a value too short for the epoch: -1); ``InvalidRecordError`` for anything
    else."""
    for rec in decode_records(batch):
        key = rec.key
        if key is None or len(key) < _CONTROL_KEY.size:
            break
        version, kind = _CONTROL_KEY.unpack_from(key, 0)
        if version == 0 and kind in (ABORT, COMMIT):
            value = rec.value
            epoch = (_MARKER_VALUE.unpack_from(value, 0)[1]
                     if value is not None and len(value) >= _MARKER_VALUE.size else -1)
            return int(kind), int(epoch)
        break
    raise InvalidRecordError(ErrorCode.invalid_record, "not a transaction marker")


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


@dataclass(slots=True)
class TxnTracker:
    ongoing: dict[int, int] = field(default_factory=dict)  # producer id -> first offset
    # completed, marker not yet below the high watermark: (first offset, marker offset)
    unreplicated: list[tuple[int, int]] = field(default_factory=list)
    aborted: list[AbortedTxn] = field(default_factory=list)  # by last_offset

    def on_batch(self, h: BatchHeader, kind: int | None) -> AbortedTxn | None:
        """A batch appended at ``h.base_offset`` (``kind``: ABORT/COMMIT of a control
        batch, else None); returns the aborted transaction an ABORT marker ended (the
        entry for the segment's ``.txnindex``)."""
        if not h.is_transactional or h.producer_id < 0:
            return None
        if not h.is_control:
            self.ongoing.setdefault(h.producer_id, h.base_offset)
            return None
        marker = h.base_offset
        first = self.ongoing.pop(h.producer_id, marker)
        self.unreplicated.append((first, marker))
        if kind == ABORT:
            # Kafka's ProducerStateManager.lastStableOffset(completedTxn): the first offset
            # of another ongoing transaction, else the offset after the marker
            lso = min(self.ongoing.values(), default=marker + 1)
            txn = AbortedTxn(h.producer_id, first, marker, lso)
            self.aborted.append(txn)
            return txn
        return None

    def first_unstable(self, high_watermark: int) -> int:
        """The smallest first offset of a transaction not yet stable (ongoing, or its
        marker not below ``high_watermark``); 2**63 - 1 if none."""
        if self.unreplicated and self.unreplicated[0][1] < high_watermark:
            self.unreplicated = [u for u in self.unreplicated if u[1] >= high_watermark]
        out = min(self.ongoing.values(), default=2**63 - 1)
        for first, _ in self.unreplicated:
            out = min(out, first)
        return out

    def last_stable_offset(self, high_watermark: int) -> int:
        if not self.ongoing and not self.unreplicated:  # no transaction: the common case,
            return high_watermark  # asked per partition on every fetch
        return min(self.first_unstable(high_watermark), high_watermark)

    def aborted_in(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in [start, end): those whose marker is at or
        after ``start`` and whose first offset is before ``end``."""
        i = bisect.bisect_left(self.aborted, start, key=lambda a: a.last_offset)
        return [a for a in self.aborted[i:] if a.first_offset < end]

    def drop_before(self, log_start: int) -> None:
        """Forget aborted transactions wholly below the log start offset."""
        if self.aborted and self.aborted[0].last_offset < log_start:
            self.aborted = [a for a in self.aborted if a.last_offset >= log_start]

    def clear(self) -> None:
        self.ongoing.clear()
        self.unreplicated.clear()
        self.aborted.clear()
