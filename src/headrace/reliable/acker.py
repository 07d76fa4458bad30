"""PURE: Storm's acker (R-REL-2, R-REL-3) — fixed memory per root, XOR of item ids.

Rules (everything that decides whether a root is complete lives here):

- ``init(root_id, owner, ack_val, now_ms)`` registers a root. ``ack_val`` is the XOR of the
  ids of the root's first items (normally the one root item). ``owner`` is the task that
  created the root and is told when it completes (in Storm: the spout task id).
- ``update(root_id, xor_val)`` XORs a value into the root's ``ack_val``. An item's ack sends
  ``its id ^ XOR(ids of the items newly anchored to it)``: the item leaves the tree at the
  same moment its children join, so a tree cannot complete early. ``ack_val == 0`` means
  every item created in the tree was acked: ``RootCompleted``, and the entry is removed.
- ``fail(root_id, error)`` fails the root at once: ``RootFailed``, entry removed.
- A root not complete within ``message_timeout_ms`` fails with error ``"timeout"``.
- Updates, fails and forgets for unknown roots are ignored: the root already completed,
  failed or timed out, and a replay runs under a new root id. This makes late acks of a
  timed-out attempt harmless.

Memory: per pending root the acker holds one dict entry ``root_id -> ack_val`` and nothing
else — no item list, no timestamp; an owner other than 0 costs one more entry in
``_owners``. Measured with tracemalloc (``bench/reliable_bench.py``,
``tests/unit/test_acker.py``): about 110 bytes per pending root on CPython 3.11 (two
36-byte ints and ~35 bytes of dict slot), for trees of 1 item and of 100 items alike.
Storm's Java acker quotes "about 20 bytes"; Python objects cost more, the bound is as fixed.
Roots whose tree never grows (a record processed without anchored emits) never reach the
acker at all: ``ReliableSpout`` settles them per batch (see spout.py).

Bulk: ``update_many`` applies a list of ``(root_id, xor_val)`` in one call (a fan-out's
acks); the results are those of the calls one by one. ``complete_many`` does the same and
returns only the completed root ids (no event object per root: the spout's path).

Timeouts without a timestamp per root: Storm's ``RotatingMap``. Roots live in
``NUM_BUCKETS`` buckets; every ``message_timeout_ms / (NUM_BUCKETS - 1)`` the oldest bucket
is expired and a new one opened. A root therefore fails between ``message_timeout_ms`` and
``1.5 * message_timeout_ms`` after ``init`` — never earlier.

Several ackers share the work by hashing the root id (``AckerPool``: ``root_id % n``);
``AckerPool(0)`` switches reliability off for the pipeline (every root completes at ``init``).

Thread-safety: none; the shell serialises calls. Time is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.reliable.errors import ReliableConfigError, ReliableUsageError

DEFAULT_MESSAGE_TIMEOUT_MS = 30_000
NUM_BUCKETS = 3


@dataclass(frozen=True, slots=True)
class RootCompleted:
    root_id: int
    owner: int


@dataclass(frozen=True, slots=True)
class RootFailed:
    root_id: int
    owner: int
    error: str


AckerEvent = RootCompleted | RootFailed


class Acker:
    """One acker task: ``root_id -> [owner, ack_val]`` in rotating buckets."""

    def __init__(self, message_timeout_ms: int = DEFAULT_MESSAGE_TIMEOUT_MS,
                 now_ms: int = 0) -> None:
        if message_timeout_ms < NUM_BUCKETS - 1:
            raise ReliableConfigError(f"message_timeout_ms={message_timeout_ms} is too small")
        self.message_timeout_ms = message_timeout_ms
        self._rotation_ms = message_timeout_ms // (NUM_BUCKETS - 1)
        self._next_rotation_ms = now_ms + self._rotation_ms
        # _buckets[0] is the newest; the last one is expired at the next rotation.
        self._buckets: list[dict[int, int]] = [{} for _ in range(NUM_BUCKETS)]
        self._owners: dict[int, int] = {}  # only roots whose owner is not 0

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets)

    def __contains__(self, root_id: int) -> bool:
        return self._find(root_id) is not None

    def init(self, root_id: int, owner: int, ack_val: int, now_ms: int) -> list[AckerEvent]:
        """Track a new root. Returns roots that timed out by ``now_ms`` (and this root's
        completion if ``ack_val`` is already 0, i.e. an empty tree)."""
        if self._find(root_id) is not None:
            raise ReliableUsageError(f"root {root_id:#x} is already tracked")
        events = self.expire(now_ms) if now_ms >= self._next_rotation_ms else []
        if ack_val == 0:
            events.append(RootCompleted(root_id, owner))
        else:
            self._buckets[0][root_id] = ack_val
            if owner:
                self._owners[root_id] = owner
        return events

    def start(self, root_id: int, owner: int, ack_val: int) -> None:
        """``init`` without expiring anything (a root whose tree starts to grow; its
        timeout is also kept by its batch)."""
        self._buckets[0][root_id] = ack_val
        if owner:
            self._owners[root_id] = owner

    def update(self, root_id: int, xor_val: int) -> AckerEvent | None:
        for bucket in self._buckets:
            val = bucket.get(root_id)
            if val is None:
                continue
            val ^= xor_val
            if val:
                bucket[root_id] = val
                return None
            del bucket[root_id]
            return RootCompleted(root_id, self._owners.pop(root_id, 0) if self._owners else 0)
        return None

    def update_many(self, updates: list[tuple[int, int]]) -> list[AckerEvent]:
        """``update`` for each ``(root_id, xor_val)``, in order; the completions."""
        newest = self._buckets[0]
        events: list[AckerEvent] = []
        for root_id, xor_val in updates:
            val = newest.get(root_id)
            if val is not None and val != xor_val:
                newest[root_id] = val ^ xor_val
                continue
            event = self.update(root_id, xor_val)
            if event is not None:
                events.append(event)
        return events

    def complete_many(self, updates: list[tuple[int, int]]) -> list[int]:
        """``update_many`` without events: the ids of the roots completed, in order (their
        owners are dropped; for a caller that owns every root)."""
        newest = self._buckets[0]
        owners = self._owners
        done: list[int] = []
        for root_id, xor_val in updates:
            val = newest.get(root_id)
            if val is not None:
                if val != xor_val:
                    newest[root_id] = val ^ xor_val
                    continue
                del newest[root_id]
                done.append(root_id)
                if owners:
                    owners.pop(root_id, None)
                continue
            if self.update(root_id, xor_val) is not None:
                done.append(root_id)
        return done

    def fail(self, root_id: int, error: str) -> AckerEvent | None:
        bucket = self._find(root_id)
        if bucket is None:
            return None
        del bucket[root_id]
        return RootFailed(root_id, self._owners.pop(root_id, 0), error)

    def forget(self, root_id: int) -> None:
        """Stop tracking a root without an event (its partition was revoked)."""
        bucket = self._find(root_id)
        if bucket is not None:
            del bucket[root_id]
            self._owners.pop(root_id, None)

    def expire(self, now_ms: int) -> list[AckerEvent]:
        """Rotate the buckets up to ``now_ms``; roots rotated out fail with ``"timeout"``."""
        events: list[AckerEvent] = []
        while now_ms >= self._next_rotation_ms:
            dead = self._buckets.pop()
            self._buckets.insert(0, {})
            self._next_rotation_ms += self._rotation_ms
            owners = self._owners
            events.extend(RootFailed(r, owners.pop(r, 0), "timeout") for r in dead)
            if not any(self._buckets) and now_ms >= self._next_rotation_ms:
                # Nothing left to expire: jump instead of rotating once per period.
                periods = (now_ms - self._next_rotation_ms) // self._rotation_ms + 1
                self._next_rotation_ms += periods * self._rotation_ms
        return events

    def _find(self, root_id: int) -> dict[int, int] | None:
        for bucket in self._buckets:
            if root_id in bucket:
                return bucket
        return None


class AckerPool:
    """``num_ackers`` ackers selected by ``root_id % num_ackers``; 0 ackers: ack at once."""

    def __init__(self, num_ackers: int = 1,
                 message_timeout_ms: int = DEFAULT_MESSAGE_TIMEOUT_MS, now_ms: int = 0) -> None:
        if num_ackers < 0:
            raise ReliableConfigError(f"num_ackers={num_ackers} must be >= 0")
        self.num_ackers = num_ackers
        self.ackers = [Acker(message_timeout_ms, now_ms) for _ in range(num_ackers)]

    @property
    def enabled(self) -> bool:
        return self.num_ackers > 0

    def __len__(self) -> int:
        return sum(len(a) for a in self.ackers)

    def acker_for(self, root_id: int) -> Acker:
        return self.ackers[root_id % self.num_ackers]

    def init(self, root_id: int, owner: int, ack_val: int, now_ms: int) -> list[AckerEvent]:
        if not self.ackers:
            return [RootCompleted(root_id, owner)]
        return self.acker_for(root_id).init(root_id, owner, ack_val, now_ms)

    def update(self, root_id: int, xor_val: int) -> AckerEvent | None:
        if not self.ackers:
            return None
        return self.acker_for(root_id).update(root_id, xor_val)

    def update_many(self, updates: list[tuple[int, int]]) -> list[AckerEvent]:
        if not self.ackers:
            return []
        if self.num_ackers == 1:
            return self.ackers[0].update_many(updates)
        events: list[AckerEvent] = []
        for root_id, xor_val in updates:
            event = self.acker_for(root_id).update(root_id, xor_val)
            if event is not None:
                events.append(event)
        return events

    def complete_many(self, updates: list[tuple[int, int]]) -> list[int]:
        if not self.ackers:
            return []
        if self.num_ackers == 1:
            return self.ackers[0].complete_many(updates)
        return [e.root_id for e in self.update_many(updates)]

    def fail(self, root_id: int, error: str) -> AckerEvent | None:
        if not self.ackers:
            return None
        return self.acker_for(root_id).fail(root_id, error)

    def forget(self, root_id: int) -> None:
        if self.ackers:
            self.acker_for(root_id).forget(root_id)

    def expire(self, now_ms: int) -> list[AckerEvent]:
        events: list[AckerEvent] = []
        for acker in self.ackers:
            events.extend(acker.expire(now_ms))
        return events
