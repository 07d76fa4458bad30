"""PURE: the spout of a share group (KIP-932) — records in, acknowledgements out.

A share group hands a partition's records to many consumers at once, each record acquired
by one consumer for the group's record lock duration (``share.record.lock.duration.ms``).
There are no offsets to commit and nothing to seek: the consumer acknowledges each record
it received, and the broker redelivers what it releases (or what stays unacknowledged past
the lock) with its delivery count raised (Kafka's SharePartition.acknowledge /
releaseAcquiredRecords; ShareAcknowledge's AcknowledgeTypes 1 accept, 2 release, 3 reject).

``ShareSpout`` reuses everything of the partition spout that is not about offsets
(``SpoutBase``: root batches, tuple trees and their ackers, emit / ack / fail /
``ack_batch``, ``message_timeout_ms``), so bolts, anchoring and timeouts behave exactly as
in partition mode. Its effects are ``Acknowledge(tp, offsets, ack_type)`` and
``DeadLetter``.

Rules:

- ``on_batch(tp, offsets, delivery_counts, now_ms)`` makes a root per delivered record,
  except for a record this spout still holds (its root pending or its dead letter in
  flight): the earlier root settles it, and its acknowledgement covers the new acquisition
  (acknowledgements name a record by topic, partition and offset). A delivery count below
  1 is our caller's error (``ReliableUsageError``, nothing changes): the shell validates
  what the broker sent.
- A root's completion gives ``Acknowledge(ACCEPT)`` (one per settled run of a batch).
- A root's failure (``fail``, an exception, ``message_timeout_ms``) of the record's
  ``d``-th delivery counts as failure ``d`` (``d - 1`` deliveries before it failed):
  with ``max_retries`` None, or ``d <= max_retries``, it gives ``Acknowledge(RELEASE)`` and
  the broker redelivers it (to any member; no backoff: Kafka has none for a release);
  with ``d > max_retries`` it gives ``DeadLetter`` and the record stays held.
- ``dead_lettered(tp, offset)`` (the dead letter is produced and acknowledged by its
  broker) gives ``Acknowledge(REJECT)``: the record is never delivered again. REJECT comes
  only after the dead letter exists, as partition mode commits past a dead letter only once
  it is produced. ``dead_letter_failed`` gives ``Acknowledge(RELEASE)``: the record comes
  back, and its next failure is dead-lettered again.
- A record with tracking off (``tracked=False`` or no ackers) is accepted at once.
- ``is_settled()``: every record delivered so far has its acknowledgement in an effect
  ``tick`` returned. confluent-kafka's ``ShareConsumer`` in explicit mode refuses to poll
  before that (every record of the previous poll must be acknowledged), so the shell polls
  only when settled.
- ``release_all()`` (shutdown after the drain timeout): every pending root is dropped (its
  late acks are ignored) and released; records being dead-lettered stay held.

The broker archives a record released on its ``group.share.delivery.count.limit``-th
delivery (5 by default) instead of redelivering it, so ``max_retries`` must stay below that
limit for every poison record to reach the dead-letter topic; and a root should complete
within the record lock duration (``message_timeout_ms`` below it), or the broker gives the
record to another member meanwhile and this member's acknowledgement fails.

Thread-safety: none; the shell holds one lock around every call. Time is an argument.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from headrace.reliable.acker import DEFAULT_MESSAGE_TIMEOUT_MS
from headrace.reliable.errors import ReliableConfigError, ReliableUsageError
from headrace.reliable.spout import (
    FAILED,
    MAX_BATCH,
    PENDING,
    DeadLetter,
    RootBatch,
    SpoutBase,
    TopicPartition,
    _identity,
    _no_values,
)
from headrace.reliable.tuples import IdSource, fast_random_id


class AckType(enum.IntEnum):
    """Kafka's AcknowledgeType (ShareAcknowledge / ShareFetch AcknowledgeTypes)."""

    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


@dataclass(frozen=True, slots=True)
class ShareSpoutConfig:
    max_retries: int | None = None  # None: release for ever (the broker's limit archives)
    message_timeout_ms: int = DEFAULT_MESSAGE_TIMEOUT_MS
    num_ackers: int = 1

    def __post_init__(self) -> None:
        if self.max_retries is not None and self.max_retries < 0:
            raise ReliableConfigError("max_retries must be >= 0 or None")
        if self.num_ackers < 0:
            raise ReliableConfigError("num_ackers must be >= 0")


@dataclass(frozen=True, slots=True)
class Acknowledge:
    tp: TopicPartition
    offsets: tuple[int, ...]
    ack_type: AckType


ShareEffect = Acknowledge | DeadLetter


class ShareRootBatch(RootBatch):
    """A ``RootBatch`` whose records carry their delivery counts."""

    __slots__ = ("delivery_counts",)

    def __init__(self, tp: TopicPartition, batch_id: int, offsets: Sequence[int],
                 payloads: Sequence[Any], delivery_counts: Sequence[int], created_ms: int,
                 owner: int, tracked: bool, to_source: Callable[[Any], Any],
                 to_values: Callable[[Any], tuple[Any, ...]]) -> None:
        super().__init__(tp, batch_id, offsets, payloads, created_ms, owner, tracked,
                         to_source, to_values)
        self.delivery_counts = delivery_counts


class ShareSpout(SpoutBase):
    def __init__(self, config: ShareSpoutConfig | None = None, now_ms: int = 0,
                 owner: int = 0, id_source: IdSource = fast_random_id) -> None:
        self.config = config or ShareSpoutConfig()
        super().__init__(self.config.message_timeout_ms, self.config.num_ackers, now_ms,
                         owner, id_source)
        self._held: dict[TopicPartition, set[int]] = {}  # acquired, not acknowledged yet
        self._num_held = 0
        self._dead_lettering: set[tuple[TopicPartition, int]] = set()
        self._outbox: list[ShareEffect] = []

    # ------------------------------------------------------------------ questions

    @property
    def num_held(self) -> int:
        """Records delivered whose acknowledgement is not decided yet (pending roots and
        dead letters in flight)."""
        return self._num_held

    def is_held(self, tp: TopicPartition, offset: int) -> bool:
        held = self._held.get(tp)
        return held is not None and offset in held

    def is_settled(self) -> bool:
        """Every record delivered so far is acknowledged by an effect ``tick`` returned:
        the shell may poll again."""
        return self._num_held == 0 and not self._outbox

    # ------------------------------------------------------------------ records

    def on_record(self, tp: TopicPartition, offset: int, delivery_count: int, now_ms: int,
                  *, payload: Any = None, tracked: bool = True,
                  to_source: Callable[[Any], Any] = _identity,
                  to_values: Callable[[Any], tuple[Any, ...]] = _no_values,
                  ) -> ShareRootBatch | None:
        return self.on_batch(tp, [offset], [delivery_count], now_ms, payloads=[payload],
                             tracked=tracked, to_source=to_source, to_values=to_values)

    def on_batch(self, tp: TopicPartition, offsets: Sequence[int],
                 delivery_counts: Sequence[int], now_ms: int, *,
                 payloads: Sequence[Any] | None = None, tracked: bool = True,
                 to_source: Callable[[Any], Any] = _identity,
                 to_values: Callable[[Any], tuple[Any, ...]] = _no_values,
                 ) -> ShareRootBatch | None:
        """Delivered records of ``tp`` (``delivery_counts[i]`` is record i's): the roots of
        those to process, or None if none."""
        if len(delivery_counts) != len(offsets) or (
                payloads is not None and len(payloads) != len(offsets)):
            raise ReliableUsageError("offsets, delivery_counts and payloads differ in length")
        if any(d < 1 for d in delivery_counts):
            raise ReliableUsageError("a delivery count is below 1")
        if len(offsets) > MAX_BATCH:
            raise ReliableConfigError(f"a batch holds at most {MAX_BATCH} records")
        if not offsets:
            return None
        if payloads is None:
            payloads = [None] * len(offsets)
        held = self._held.get(tp)
        if held:
            keep = [k for k, o in enumerate(offsets) if o not in held]
            if len(keep) < len(offsets):
                offsets = [offsets[k] for k in keep]
                delivery_counts = [delivery_counts[k] for k in keep]
                payloads = [payloads[k] for k in keep]
                if not offsets:
                    return None
        if len(set(offsets)) != len(offsets):
            raise ReliableUsageError("an offset twice in one batch")
        tracked = tracked and self.tracker.ackers.enabled
        batch = ShareRootBatch(tp, self._new_batch_id(), offsets, payloads, delivery_counts,
                               now_ms, self.owner, tracked, to_source, to_values)
        if not tracked:  # no message id / no ackers: accepted at once (R-REL-3)
            batch.states[:] = b"\x01" * len(offsets)
            batch.pending = 0
            self._outbox.append(Acknowledge(tp, tuple(offsets), AckType.ACCEPT))
            return batch
        if held is None:
            held = self._held[tp] = set()
        held.update(offsets)
        self._num_held += len(offsets)
        self._batches[batch.batch_id] = batch
        self._num_pending += len(offsets)
        return batch

    def _unhold(self, tp: TopicPartition, offsets: Sequence[int]) -> None:
        held = self._held[tp]
        held.difference_update(offsets)
        self._num_held -= len(offsets)
        if not held:
            del self._held[tp]

    # ------------------------------------------------------------------ the hooks

    def _roots_completed(self, batch: RootBatch, offsets: Sequence[int]) -> None:
        self._unhold(batch.tp, offsets)
        self._outbox.append(Acknowledge(batch.tp, tuple(offsets), AckType.ACCEPT))

    def _root_failed_after(self, batch: RootBatch, index: int, error: str,
                           now_ms: int) -> None:
        assert isinstance(batch, ShareRootBatch)
        tp, offset = batch.tp, batch.offsets[index]
        failures = batch.delivery_counts[index]
        max_retries = self.config.max_retries
        if max_retries is not None and failures > max_retries:
            self._dead_lettering.add((tp, offset))
            self._outbox.append(DeadLetter(tp, offset, batch.source_of(index), error,
                                           failures))
            return
        self._unhold(tp, (offset,))
        self._outbox.append(Acknowledge(tp, (offset,), AckType.RELEASE))

    # ------------------------------------------------------------------ the shell reports

    def dead_lettered(self, tp: TopicPartition, offset: int) -> None:
        """The dead letter of ``tp``@``offset`` is produced: reject the record."""
        self._dead_letter_done(tp, offset, AckType.REJECT)

    def dead_letter_failed(self, tp: TopicPartition, offset: int, now_ms: int = 0) -> None:
        """Its dead letter could not be produced: release the record (it comes back)."""
        self._dead_letter_done(tp, offset, AckType.RELEASE)

    def _dead_letter_done(self, tp: TopicPartition, offset: int, ack_type: AckType) -> None:
        key = (tp, offset)
        if key not in self._dead_lettering:
            return  # not ours (a duplicate report): ignored
        self._dead_lettering.discard(key)
        self._unhold(tp, (offset,))
        self._outbox.append(Acknowledge(tp, (offset,), ack_type))

    def release_all(self) -> None:
        """Drop every pending root (late acks ignored) and release its record."""
        for batch in list(self._batches.values()):
            states = batch.states
            pending = [i for i in range(len(states)) if states[i] == PENDING]
            offsets = [batch.offsets[i] for i in pending]
            for i in pending:
                states[i] = FAILED  # a lane that has not run it yet skips it
            self._forget_batch(batch)
            if offsets:
                self._unhold(batch.tp, offsets)
                self._outbox.append(Acknowledge(batch.tp, tuple(offsets), AckType.RELEASE))

    # ------------------------------------------------------------------ time

    def tick(self, now_ms: int) -> list[ShareEffect]:
        """Time out roots, and hand out the effects due."""
        self._handle(self.tracker.expire(now_ms), now_ms)
        self._expire_batches(now_ms)
        effects, self._outbox = self._outbox, []
        return effects
