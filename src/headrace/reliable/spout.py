"""PURE: the KafkaSpout core (R-REL-4, R-REL-5) — records in, effects out.

``ReliableSpout`` ties the pieces together for every assigned partition: a consumed record
becomes a root item (``TupleTracker`` + ``AckerPool``); the root's completion acks its offset
in that partition's ``OffsetManager``; its failure (``fail`` or the message timeout)
schedules a retry or, after ``max_retries``, a dead letter. ``tick(now_ms)`` returns what the
shell must do, as effects: ``Seek``, ``Pause``, ``Resume``, ``Commit``, ``DeadLetter``.

Rules:

- A fetched record is processed (``on_record`` returns its root item) unless its offset is
  below the committed offset, acked, in flight, or failed with its retry not yet due.
  Skipping never loses a record: a skipped failed offset is fetched again by its retry seek.
- Retries: the n-th failure of an offset waits ``retry_backoff_ms * 2**(n-1)`` (capped at
  ``retry_backoff_max_ms``); when due, the partition seeks back to its lowest due offset
  (once; ``Seek`` is not repeated until the seek's records arrive). The replay fetches the
  following offsets too; acked and in-flight ones are skipped (seed 000).
- After ``max_retries`` retries the next failure gives ``DeadLetter``; when the shell
  reports the dead letter delivered (``dead_lettered``) the offset counts as processed and
  is committed past. If the delivery fails, the offset is retried again.
- A partition with ``num_uncommitted >= max_uncommitted_offsets`` and no retry due is
  paused, and resumed once commits bring it below the limit. The bound is soft by one fetch
  batch (as in Storm: "up to maxUncommittedOffsets + maxPollRecords - 1"): records already
  returned by a poll are processed, never dropped (dropping would move the consumer's
  position past them).
- ``Commit`` every ``offset_commit_period_ms`` with each partition's ``next_commit_offset``.
- ``revoked(tp)`` returns the final committable offset and drops the partition's state and
  roots; late acks for those roots are ignored, and their queued items are not run
  (``is_live``). ``assigned(tp, committed)`` starts a
  partition at its committed offset (or, if none, at the first record fetched).

Thread-safety: none; the shell holds one lock around every call. Time is an argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from headrace.reliable.acker import (
    DEFAULT_MESSAGE_TIMEOUT_MS,
    AckerEvent,
    AckerPool,
    RootCompleted,
)
from headrace.reliable.errors import ReliableConfigError
from headrace.reliable.offsets import OffsetManager
from headrace.reliable.tuples import IdSource, Item, TupleTracker, random_id


class TopicPartition(NamedTuple):
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class SpoutConfig:
    max_uncommitted_offsets: int = 10_000
    offset_commit_period_ms: int = 5_000
    max_retries: int | None = None  # None: retry for ever (Storm's default)
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 10_000
    message_timeout_ms: int = DEFAULT_MESSAGE_TIMEOUT_MS
    num_ackers: int = 1

    def __post_init__(self) -> None:
        if self.max_uncommitted_offsets < 1:
            raise ReliableConfigError("max_uncommitted_offsets must be >= 1")
        if self.offset_commit_period_ms < 0:
            raise ReliableConfigError("offset_commit_period_ms must be >= 0")
        if self.max_retries is not None and self.max_retries < 0:
            raise ReliableConfigError("max_retries must be >= 0 or None")
        if not 0 <= self.retry_backoff_ms <= self.retry_backoff_max_ms:
            raise ReliableConfigError("need 0 <= retry_backoff_ms <= retry_backoff_max_ms")

    def backoff_ms(self, failures: int) -> int:
        return int(min(self.retry_backoff_max_ms,
                       self.retry_backoff_ms * 2 ** min(failures - 1, 62)))


# ---------------------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Seek:
    tp: TopicPartition
    offset: int


@dataclass(frozen=True, slots=True)
class Pause:
    tp: TopicPartition


@dataclass(frozen=True, slots=True)
class Resume:
    tp: TopicPartition


@dataclass(frozen=True, slots=True)
class Commit:
    offsets: dict[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    tp: TopicPartition
    offset: int
    payload: Any
    error: str
    attempts: int


Effect = Seek | Pause | Resume | Commit | DeadLetter


# ---------------------------------------------------------------------------- state


@dataclass(slots=True)
class _Retry:
    failures: int
    due_ms: int
    dead_lettering: bool = False


@dataclass(slots=True)
class _Partition:
    offsets: OffsetManager | None
    retries: dict[int, _Retry] = field(default_factory=dict)
    paused: bool = False
    seek_pending: int | None = None


class _RootRef(NamedTuple):
    tp: TopicPartition
    offset: int
    payload: Any


class ReliableSpout:
    def __init__(self, config: SpoutConfig | None = None, now_ms: int = 0, owner: int = 0,
                 id_source: IdSource = random_id) -> None:
        self.config = config or SpoutConfig()
        self.owner = owner
        self.tracker = TupleTracker(
            AckerPool(self.config.num_ackers, self.config.message_timeout_ms, now_ms),
            id_source)
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._roots: dict[int, _RootRef] = {}
        self._outbox: list[Effect] = []
        self._next_commit_ms = now_ms + self.config.offset_commit_period_ms

    # ------------------------------------------------------------------ questions

    @property
    def assignment(self) -> list[TopicPartition]:
        return list(self._partitions)

    @property
    def num_pending_roots(self) -> int:
        return len(self._roots)

    def is_live(self, item: Item) -> bool:
        """False if every tree the item belongs to is gone (completed, failed, timed out or
        revoked): processing it would be wasted, its root is replayed or owned elsewhere."""
        roots = item.anchors_to_ids
        return not roots or any(r in self._roots for r in roots)

    def offset_manager(self, tp: TopicPartition) -> OffsetManager | None:
        p = self._partitions.get(tp)
        return None if p is None else p.offsets

    def is_paused(self, tp: TopicPartition) -> bool:
        p = self._partitions.get(tp)
        return p is not None and p.paused

    def committable(self) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for tp, p in self._partitions.items():
            if p.offsets is not None:
                offset = p.offsets.next_commit_offset()
                if offset is not None:
                    out[tp] = offset
        return out

    # ------------------------------------------------------------------ rebalance

    def assigned(self, tp: TopicPartition, committed_offset: int | None) -> None:
        """Start ``tp`` at its committed offset (None: at the first record fetched)."""
        self._drop(tp)
        offsets = None if committed_offset is None else OffsetManager(committed_offset)
        self._partitions[tp] = _Partition(offsets)

    def revoked(self, tp: TopicPartition) -> int | None:
        """Drop ``tp``; returns the offset to commit before it goes (None: nothing new)."""
        p = self._partitions.get(tp)
        commit = None if p is None or p.offsets is None else p.offsets.next_commit_offset()
        self._drop(tp)
        return commit

    def _drop(self, tp: TopicPartition) -> None:
        if self._partitions.pop(tp, None) is None:
            return
        for root_id in [r for r, ref in self._roots.items() if ref.tp == tp]:
            del self._roots[root_id]
            self.tracker.ackers.forget(root_id)
        self._outbox = [e for e in self._outbox
                        if not (isinstance(e, DeadLetter) and e.tp == tp)]

    # ------------------------------------------------------------------ records and items

    def on_record(self, tp: TopicPartition, offset: int, now_ms: int, *,
                  values: tuple[Any, ...] = (), payload: Any = None,
                  tracked: bool = True) -> Item | None:
        """A fetched record: its root item if it must be processed, else None."""
        p = self._partitions.get(tp)
        if p is None:
            return None  # fetched before a revoke took effect
        if p.offsets is None:
            p.offsets = OffsetManager(offset)
        if p.seek_pending is not None and offset >= p.seek_pending:
            p.seek_pending = None
        retry = p.retries.get(offset)
        if retry is not None and p.offsets.is_failed(offset) and (
                retry.dead_lettering or now_ms < retry.due_ms):
            return None
        if not p.offsets.emitted(offset):
            return None
        item, root_id, events = self.tracker.root(values, self.owner, now_ms,
                                                  source=payload, tracked=tracked)
        self._roots[root_id] = _RootRef(tp, offset, payload)
        self._handle(events, now_ms)
        return item

    def emit(self, values: tuple[Any, ...], anchors: Sequence[Item] = ()) -> Item:
        return self.tracker.emit(values, anchors)

    def ack(self, item: Item, now_ms: int) -> None:
        self._handle(self.tracker.ack(item), now_ms)

    def fail(self, item: Item, now_ms: int, error: str = "failed") -> None:
        self._handle(self.tracker.fail(item, error), now_ms)

    def _handle(self, events: list[AckerEvent], now_ms: int) -> None:
        for event in events:
            ref = self._roots.pop(event.root_id, None)
            if ref is None:
                continue
            p = self._partitions[ref.tp]
            assert p.offsets is not None
            if isinstance(event, RootCompleted):
                p.offsets.acked(ref.offset)
                p.retries.pop(ref.offset, None)
                continue
            p.offsets.failed(ref.offset)
            retry = p.retries.get(ref.offset)
            failures = 1 if retry is None else retry.failures + 1
            max_retries = self.config.max_retries
            if max_retries is not None and failures > max_retries:
                p.retries[ref.offset] = _Retry(failures, now_ms, dead_lettering=True)
                self._outbox.append(DeadLetter(ref.tp, ref.offset, ref.payload, event.error,
                                               failures))
            else:
                due = now_ms + self.config.backoff_ms(failures)
                p.retries[ref.offset] = _Retry(failures, due)

    # ------------------------------------------------------------------ the shell reports

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            p = self._partitions.get(tp)
            if p is None or p.offsets is None:
                continue
            p.offsets.committed(offset)
            for o in [o for o in p.retries if o < offset]:
                del p.retries[o]

    def seek_failed(self, tp: TopicPartition) -> None:
        """The shell could not seek; the next ``tick`` asks again."""
        p = self._partitions.get(tp)
        if p is not None:
            p.seek_pending = None

    def dead_lettered(self, tp: TopicPartition, offset: int) -> None:
        p = self._partitions.get(tp)
        if p is None or p.offsets is None:
            return
        p.retries.pop(offset, None)
        p.offsets.acked(offset)

    def dead_letter_failed(self, tp: TopicPartition, offset: int, now_ms: int) -> None:
        p = self._partitions.get(tp)
        retry = None if p is None else p.retries.get(offset)
        if retry is not None:
            retry.dead_lettering = False
            retry.due_ms = now_ms + self.config.backoff_ms(retry.failures)

    # ------------------------------------------------------------------ time

    def tick(self, now_ms: int) -> list[Effect]:
        self._handle(self.tracker.expire(now_ms), now_ms)
        effects, self._outbox = self._outbox, []
        limit = self.config.max_uncommitted_offsets
        for tp, p in self._partitions.items():
            offsets = p.offsets
            if offsets is None:
                continue
            due = [o for o, r in p.retries.items()
                   if not r.dead_lettering and r.due_ms <= now_ms and offsets.is_failed(o)]
            if due and p.paused:
                p.paused = False
                effects.append(Resume(tp))
            if due and (p.seek_pending is None or min(due) < p.seek_pending):
                p.seek_pending = min(due)
                effects.append(Seek(tp, p.seek_pending))
            full = offsets.num_uncommitted >= limit
            if full and not p.paused and not due and p.seek_pending is None:
                p.paused = True
                effects.append(Pause(tp))
            elif p.paused and not full:
                p.paused = False
                effects.append(Resume(tp))
        if now_ms >= self._next_commit_ms:
            self._next_commit_ms = now_ms + self.config.offset_commit_period_ms
            commit = self.committable()
            if commit:
                effects.append(Commit(commit))
        return effects
