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
- ``Commit`` every ``offset_commit_period_ms`` with each partition's ``next_commit_offset``,
  and at once (at the next ``tick``) when a partition holds at least half of
  ``max_uncommitted_offsets`` uncommitted offsets of which a quarter could be committed: a
  quick handler would otherwise reach the limit, pause and wait for the period (a no-op
  handler moved 10,000 records per 5 s per partition with a limit of 10,000). Storm commits
  on its period only, with a limit of 10,000,000; this keeps the bound low (50,000 by
  default: what a crash may have processed again) and the throughput of a limit no
  handler reaches.
- ``revoked(tp)`` returns the final committable offset and drops the partition's state and
  roots; late acks for those roots are ignored, and their queued items are not run
  (``is_live``). ``assigned(tp, committed)`` starts a
  partition at its committed offset (or, if none, at the first record fetched).

Batches (the fast path, same rules): ``on_batch(tp, offsets, now_ms, payloads=...)`` takes
a fetched run of one partition and returns a ``RootBatch`` — the roots of the records to
process, as one object: their offsets enter the ``OffsetManager`` with one slice write,
each root's state is one byte, and a root's id is ``batch_id << 24 | index`` (``batch_id``
random 40 bits, redrawn while a live batch has it), so finding a root's record takes no
dict entry per root. ``ack_batch(batch)`` completes every root still pending whose tree
never grew with one more slice write; a root whose handler emitted anchored children goes
through the acker (see tuples.py). The message timeout of roots that never reached the
acker is kept per batch: a batch older than ``message_timeout_ms`` fails its pending
roots with ``"timeout"`` at the next ``tick``. ``on_record`` is a batch of one.

Thread-safety: none; the shell holds one lock around every call. Time is an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

from headrace.reliable.acker import (
    DEFAULT_MESSAGE_TIMEOUT_MS,
    AckerEvent,
    AckerPool,
    RootCompleted,
)
from headrace.reliable.errors import ReliableConfigError
from headrace.reliable.offsets import OffsetManager
from headrace.reliable.tuples import (
    BATCH_INDEX_BITS,
    ChildItem,
    IdSource,
    Item,
    ItemState,
    RootItem,
    TupleTracker,
    fast_random_id,
)

MAX_BATCH = 1 << BATCH_INDEX_BITS
_INDEX_MASK = MAX_BATCH - 1
PENDING, COMPLETED, FAILED = 0, 1, 2


class TopicPartition(NamedTuple):
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class SpoutConfig:
    max_uncommitted_offsets: int = 50_000
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


def _identity(payload: Any) -> Any:
    return payload


def _no_values(_payload: Any) -> tuple[Any, ...]:
    return ()


class RootBatch:
    """The roots of a fetched run of one partition's records. ``offsets[i]`` and
    ``payloads[i]`` are record ``i``; ``states[i]`` is PENDING, COMPLETED or FAILED.
    ``source_of(i)`` / ``values_of(i)`` turn a payload into the record handed to handlers
    and the root item's values (the shell passes converters; built on first use)."""

    __slots__ = ("_items", "_sources", "_to_source", "_to_values", "batch_id", "created_ms",
                 "offsets", "owner", "payloads", "pending", "states", "tp", "tracked")

    def __init__(self, tp: TopicPartition, batch_id: int, offsets: Sequence[int],
                 payloads: Sequence[Any], created_ms: int, owner: int, tracked: bool,
                 to_source: Callable[[Any], Any] = _identity,
                 to_values: Callable[[Any], tuple[Any, ...]] = _no_values) -> None:
        self.tp = tp
        self.batch_id = batch_id
        self.offsets = offsets
        self.payloads = payloads
        self.created_ms = created_ms
        self.owner = owner
        self.tracked = tracked
        self.states = bytearray(len(offsets))
        self.pending = len(offsets)
        self._items: dict[int, RootItem] | None = None
        self._sources: dict[int, Any] | None = None
        self._to_source = to_source
        self._to_values = to_values

    def __len__(self) -> int:
        return len(self.offsets)

    def root_id(self, index: int) -> int:
        return (self.batch_id << BATCH_INDEX_BITS) | index

    def item(self, index: int) -> RootItem:
        """Record ``index``'s root item (one object per record, made on first use)."""
        items = self._items
        if items is None:
            items = self._items = {}
        it = items.get(index)
        if it is None:
            it = items[index] = RootItem(self, index)
        return it

    def items(self) -> list[RootItem]:
        items = self._items
        if not items:  # all made at once
            made = list(map(RootItem, repeat(self), range(len(self.offsets))))
            self._items = dict(enumerate(made))
            return made
        return [self.item(i) for i in range(len(self.offsets))]

    def source_of(self, index: int) -> Any:
        if self._to_source is _identity:
            return self.payloads[index]
        sources = self._sources
        if sources is None:
            sources = self._sources = {}
        src = sources.get(index)
        if src is None:
            src = sources[index] = self._to_source(self.payloads[index])
        return src

    def values_of(self, index: int) -> tuple[Any, ...]:
        return self._to_values(self.payloads[index])

    def __repr__(self) -> str:
        return (f"RootBatch({self.tp}, {len(self.offsets)} roots, "
                f"{self.pending} pending)")


class SpoutBase:
    """The transport-independent half of a spout: root batches, their trees (the
    ``TupleTracker`` and its ackers), emit / ack / fail / ``ack_batch``, and the message
    timeout. What a root's completion or failure means for its record is the subclass's:
    ``_roots_completed(batch, offsets)`` and ``_root_failed_after(batch, index, error,
    now_ms)`` (``ReliableSpout``: offsets to commit, retries by seek; ``ShareSpout``:
    acknowledgements to the share group). Both are called under the shell's lock, with
    the batch's bookkeeping done (completion: before it, so that a hook that raises
    changes nothing)."""

    def __init__(self, message_timeout_ms: int, num_ackers: int, now_ms: int, owner: int,
                 id_source: IdSource) -> None:
        self.owner = owner
        self.message_timeout_ms = message_timeout_ms
        self.tracker = TupleTracker(AckerPool(num_ackers, message_timeout_ms, now_ms),
                                    id_source)
        self._batches: dict[int, RootBatch] = {}  # insertion order = creation order
        self._num_pending = 0

    # ------------------------------------------------------------------ hooks

    def _roots_completed(self, batch: RootBatch, offsets: Sequence[int]) -> None:
        raise NotImplementedError

    def _root_failed_after(self, batch: RootBatch, index: int, error: str,
                           now_ms: int) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ questions

    @property
    def num_pending_roots(self) -> int:
        return self._num_pending

    def _root(self, root_id: int) -> tuple[RootBatch, int] | None:
        batch = self._batches.get(root_id >> BATCH_INDEX_BITS)
        if batch is None:
            return None
        index = root_id & _INDEX_MASK
        if index >= len(batch.states) or batch.states[index] != PENDING:
            return None
        return batch, index

    def is_live(self, item: Item) -> bool:
        """False if every tree the item belongs to is gone (completed, failed, timed out or
        revoked): processing it would be wasted, its root is replayed or owned elsewhere."""
        if type(item) is RootItem:
            batch = item.batch
            if not batch.tracked:
                return True
            return self._batches.get(batch.batch_id) is batch and \
                batch.states[item.index] == PENDING
        if type(item) is ChildItem:
            return self._root(item.root_id) is not None
        roots = item.anchors_to_ids
        return not roots or any(self._root(r) is not None for r in roots)

    def is_batch_live(self, batch: RootBatch) -> bool:
        """False if none of the batch's roots is pending any more (all completed or failed,
        timed out, or its partition revoked)."""
        return not batch.tracked or self._batches.get(batch.batch_id) is batch

    # ------------------------------------------------------------------ records and items

    def _new_batch_id(self) -> int:
        """A random 40-bit batch id no live batch has."""
        batch_id = fast_random_id() >> 24
        while batch_id in self._batches:
            batch_id = fast_random_id() >> 24
        return batch_id

    def emit(self, values: tuple[Any, ...], anchors: Sequence[Item] = ()) -> Item:
        return self.tracker.emit(values, anchors)

    def ack(self, item: Item, now_ms: int) -> None:
        self._handle(self.tracker.ack(item), now_ms)

    def ack_many(self, items: Sequence[Item], now_ms: int) -> None:
        """``ack`` for each item, settled in bulk."""
        completed, events = self.tracker.ack_many_ids(items)
        if events:
            self._handle(events, now_ms)
        if completed:
            self._completed(completed)

    def fail(self, item: Item, now_ms: int, error: str = "failed") -> None:
        self._handle(self.tracker.fail(item, error), now_ms)

    def ack_batch(self, batch: RootBatch, now_ms: int,
                  failed: dict[int, str] | None = None,
                  indices: Sequence[int] | None = None) -> None:
        """Settle a batch processed as a whole (or the roots ``indices`` of it): root ``i``
        fails with ``failed[i]``; every other root whose item is still pending (or was
        never made) is acked. Roots already completed or failed (timed out, or acked one by
        one) are left as they are."""
        items = batch._items
        if failed:
            for i, error in failed.items():
                it = batch.item(i)
                if it.state is ItemState.PENDING:
                    self.fail(it, now_ms, error)
        chosen = None if indices is None else set(indices)
        grown: list[Item] = []
        trees: set[int] = set()  # roots whose tree grew: settled by the acker
        if items:
            pending = ItemState.PENDING
            for i, it in items.items():
                if chosen is not None and i not in chosen:
                    continue
                if it.item_id:
                    trees.add(i)
                    if it.state is pending:
                        grown.append(it)
                elif it.state is pending:
                    it.state = ItemState.ACKED
            if grown:
                self.ack_many(grown, now_ms)
        if not batch.tracked or self._batches.get(batch.batch_id) is not batch:
            return  # untracked, revoked or already settled
        states = batch.states
        if chosen is None and batch.pending == len(states) and not trees:
            self._complete_all(batch)
            return
        every = range(len(states)) if indices is None else indices
        if len(trees) < len(every):
            self._complete(batch, [i for i in every
                                   if states[i] == PENDING and i not in trees])

    def _complete_all(self, batch: RootBatch) -> None:
        self._roots_completed(batch, batch.offsets)
        batch.states[:] = b"\x01" * len(batch.states)
        self._num_pending -= batch.pending
        batch.pending = 0
        del self._batches[batch.batch_id]

    def _complete(self, batch: RootBatch, indices: Sequence[int]) -> None:
        if not indices:
            return
        states = batch.states
        self._roots_completed(batch, [batch.offsets[i] for i in indices])
        for i in indices:
            states[i] = COMPLETED
        batch.pending -= len(indices)
        self._num_pending -= len(indices)
        if batch.pending == 0:
            del self._batches[batch.batch_id]

    def _forget_batch(self, batch: RootBatch) -> None:
        """Drop a batch without events (its partition was revoked)."""
        items = batch._items
        if items:
            ackers = self.tracker.ackers
            for it in items.values():
                if it.item_id:
                    ackers.forget(batch.root_id(it.index))
        self._num_pending -= batch.pending
        batch.pending = 0
        del self._batches[batch.batch_id]

    def _handle(self, events: list[AckerEvent], now_ms: int) -> None:
        completed: dict[int, list[int]] = {}
        for event in events:
            found = self._root(event.root_id)
            if found is None:
                continue
            batch, index = found
            if isinstance(event, RootCompleted):
                completed.setdefault(batch.batch_id, []).append(index)
                continue
            self._root_failed(batch, index, event.error, now_ms)
        for batch_id, indices in completed.items():
            done = self._batches.get(batch_id)
            if done is not None:
                self._complete(done, [i for i in indices if done.states[i] == PENDING])

    def _completed(self, root_ids: list[int]) -> None:
        """Roots the acker completed (ids of this spout's batches)."""
        by_batch: dict[int, list[int]] = {}
        mask = _INDEX_MASK
        for root_id in root_ids:
            batch_id = root_id >> BATCH_INDEX_BITS
            indices = by_batch.get(batch_id)
            if indices is None:
                by_batch[batch_id] = [root_id & mask]
            else:
                indices.append(root_id & mask)
        batches = self._batches
        for batch_id, indices in by_batch.items():
            batch = batches.get(batch_id)
            if batch is not None:
                states = batch.states
                n = len(states)
                self._complete(batch, [i for i in indices if i < n and states[i] == PENDING])

    def _root_failed(self, batch: RootBatch, index: int, error: str, now_ms: int) -> None:
        batch.states[index] = FAILED
        batch.pending -= 1
        self._num_pending -= 1
        items = batch._items
        if items and index in items:
            it = items[index]
            if it.item_id:  # its late acks are ignored; the item itself stays as it is
                self.tracker.ackers.forget(batch.root_id(index))
        if batch.pending == 0:
            del self._batches[batch.batch_id]
        self._root_failed_after(batch, index, error, now_ms)

    def _expire_batches(self, now_ms: int) -> None:
        deadline = now_ms - self.message_timeout_ms
        while self._batches:
            batch = next(iter(self._batches.values()))
            if batch.created_ms > deadline:
                return
            states = batch.states
            for i in range(len(states)):
                if states[i] == PENDING and self._batches.get(batch.batch_id) is batch:
                    self._root_failed(batch, i, "timeout", now_ms)
            if self._batches.get(batch.batch_id) is batch:  # cannot happen; never loop
                self._forget_batch(batch)


class ReliableSpout(SpoutBase):
    """The partition-bound spout: KafkaSpout's offsets, retries by seek, dead letters
    committed past (see the module's rules)."""

    def __init__(self, config: SpoutConfig | None = None, now_ms: int = 0, owner: int = 0,
                 id_source: IdSource = fast_random_id) -> None:
        self.config = config or SpoutConfig()
        super().__init__(self.config.message_timeout_ms, self.config.num_ackers, now_ms,
                         owner, id_source)
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._outbox: list[Effect] = []
        self._next_commit_ms = now_ms + self.config.offset_commit_period_ms

    @property
    def assignment(self) -> list[TopicPartition]:
        return list(self._partitions)

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
        for batch in [b for b in self._batches.values() if b.tp == tp]:
            self._forget_batch(batch)
        self._outbox = [e for e in self._outbox
                        if not (isinstance(e, DeadLetter) and e.tp == tp)]

    def on_record(self, tp: TopicPartition, offset: int, now_ms: int, *,
                  values: tuple[Any, ...] = (), payload: Any = None,
                  tracked: bool = True) -> Item | None:
        """A fetched record: its root item if it must be processed, else None."""
        batch = self.on_batch(tp, [offset], now_ms, payloads=[payload], tracked=tracked,
                              to_values=lambda _p: values)
        return None if batch is None else batch.item(0)

    def on_batch(self, tp: TopicPartition, offsets: Sequence[int], now_ms: int, *,
                 payloads: Sequence[Any] | None = None, tracked: bool = True,
                 to_source: Callable[[Any], Any] = _identity,
                 to_values: Callable[[Any], tuple[Any, ...]] = _no_values,
                 ) -> RootBatch | None:
        """A fetched run of ``tp``'s records (ascending offsets): the roots of those that
        must be processed, or None if none must."""
        p = self._partitions.get(tp)
        if p is None or not offsets:
            return None  # fetched before a revoke took effect
        if payloads is None:
            payloads = [None] * len(offsets)
        if p.offsets is None:
            p.offsets = OffsetManager(offsets[0])
        if p.seek_pending is not None and max(offsets) >= p.seek_pending:
            p.seek_pending = None
        if p.retries:
            keep = [k for k, o in enumerate(offsets) if not self._retry_not_due(p, o, now_ms)]
            if len(keep) < len(offsets):
                offsets = [offsets[k] for k in keep]
                payloads = [payloads[k] for k in keep]
        kept = p.offsets.emitted_batch(offsets)
        if not kept:
            return None
        if len(kept) < len(offsets):
            offsets = [offsets[k] for k in kept]
            payloads = [payloads[k] for k in kept]
        elif type(kept) is range and type(offsets) is not range:
            # a verified contiguous ascending run (see emitted_batch): kept as a range, the
            # batch's ack is one slice write with no second check of the offsets
            offsets = range(offsets[0], offsets[0] + len(offsets))
        if len(offsets) > MAX_BATCH:
            raise ReliableConfigError(f"a batch holds at most {MAX_BATCH} records")
        tracked = tracked and self.tracker.ackers.enabled
        batch_id = self._new_batch_id()
        batch = RootBatch(tp, batch_id, offsets, payloads, now_ms, self.owner, tracked,
                          to_source, to_values)
        if not tracked:  # no message id / no ackers: complete at once (R-REL-3)
            batch.states[:] = b"\x01" * len(offsets)
            batch.pending = 0
            p.offsets.acked_batch(offsets)
            if p.retries:
                for o in offsets:
                    p.retries.pop(o, None)
            return batch
        self._batches[batch_id] = batch
        self._num_pending += len(offsets)
        return batch

    @staticmethod
    def _retry_not_due(p: _Partition, offset: int, now_ms: int) -> bool:
        retry = p.retries.get(offset)
        return retry is not None and p.offsets is not None and p.offsets.is_failed(offset) \
            and (retry.dead_lettering or now_ms < retry.due_ms)

    # ------------------------------------------------------------------ the hooks

    def _roots_completed(self, batch: RootBatch, offsets: Sequence[int]) -> None:
        p = self._partitions[batch.tp]
        assert p.offsets is not None
        p.offsets.acked_batch(offsets)
        if p.retries:
            for o in offsets:
                p.retries.pop(o, None)

    def _root_failed_after(self, batch: RootBatch, index: int, error: str,
                           now_ms: int) -> None:
        tp, offset = batch.tp, batch.offsets[index]
        p = self._partitions[tp]
        assert p.offsets is not None
        p.offsets.failed(offset)
        retry = p.retries.get(offset)
        failures = 1 if retry is None else retry.failures + 1
        max_retries = self.config.max_retries
        if max_retries is not None and failures > max_retries:
            p.retries[offset] = _Retry(failures, now_ms, dead_lettering=True)
            self._outbox.append(DeadLetter(tp, offset, batch.source_of(index), error,
                                           failures))
        else:
            due = now_ms + self.config.backoff_ms(failures)
            p.retries[offset] = _Retry(failures, due)

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
        self._expire_batches(now_ms)
        effects, self._outbox = self._outbox, []
        limit = self.config.max_uncommitted_offsets
        early_at = (limit + 1) // 2  # uncommitted offsets that make a commit due at once
        early_gain = max(1, limit // 4)  # ... if it would commit at least this many
        commit_now = False
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
            held = offsets.num_uncommitted
            if held >= early_at and not commit_now:
                nxt = offsets.next_commit_offset()
                commit_now = nxt is not None and nxt - offsets.committed_offset >= early_gain
            full = held >= limit
            if full and not p.paused and not due and p.seek_pending is None:
                p.paused = True
                effects.append(Pause(tp))
            elif p.paused and not full:
                p.paused = False
                effects.append(Resume(tp))
        if commit_now or now_ms >= self._next_commit_ms:
            self._next_commit_ms = now_ms + self.config.offset_commit_period_ms
            commit = self.committable()
            if commit:
                effects.append(Commit(commit))
        return effects
