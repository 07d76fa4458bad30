"""PURE: tuple trees (R-REL-1, R-REL-3) — items, anchoring, ack and fail, as in Storm.

An ``Item`` is Storm's tuple: ``values`` plus, per root it belongs to, the XOR of the edge
ids that link it into that root's tree (``anchors_to_ids``), and ``ack_val``: the XOR of the
edge ids of the items anchored to it since it was created.

Rules:

- ``root(...)`` makes a root item for a consumed record: a random 64-bit root id and a
  random item id; the acker starts with ``ack_val = item id``. ``tracked=False`` (no message
  id) or an ``AckerPool(0)`` makes an untracked root: ``RootCompleted`` at once.
- ``emit(values, anchors)``: for each anchor that belongs to a tree, a new random edge id
  ``e``; ``anchor.ack_val ^= e`` and ``new.anchors_to_ids[root] ^= e`` for each of the
  anchor's roots. Several anchors (multi-anchoring) put the item into several trees, or
  twice into one (a DAG) — the XOR arithmetic holds either way. No anchors: unanchored,
  not tracked, its failure fails nothing.
- ``ack(item)`` sends ``anchors_to_ids[root] ^ item.ack_val`` to each root's acker.
- ``fail(item, error)`` fails each of the item's roots at once.
- An item is acked or failed once; emitting anchored to a finished item, or finishing it
  twice, raises ``ReliableUsageError`` and changes nothing.

Roots of fetched batches (``RootItem``): a record's root item is created only when a
handler asks for it, and its tree reaches the acker only when it grows (the first anchored
emit: ``acker.start(root_id, owner, item_id)``). A root acked or failed before that never
costs an acker entry: ``ack`` and ``fail`` report its completion or failure directly. The
XOR arithmetic is the same as if the root had been registered at once with its item id.

Items in one tree (``ChildItem``): every emit with one anchor that is itself in exactly one
tree — the common case, and every item ``emit_many`` makes — holds its root id and edge id
as two ints and a reference to the item its sources come from, instead of an
``anchors_to_ids`` dict and a sources tuple (the dict is built only if asked for). Same
arithmetic, a quarter of the allocations; ``emit_many`` from a batch root draws all the ids
in one call, grows the tree inline and builds the children with one ``map``.

``ack_many(items)`` acks a list of items with one bulk acker update (a fan-out's acks);
``ack_many_ids`` is the same for the spout, which needs completed root ids, not events.

A fan-out over many roots of one batch (``emit_each(values, roots)``) makes no item per
child: a ``ChildRun`` holds the root ids, the edge ids and each root's XOR of its edges
(one numpy reduction), applied to the roots at once; ``run[i]`` makes child ``i``'s
``ChildItem`` when read, and ``ack_many(run)`` acks the whole run with one acker update per
root (adjusted by the ``ack_val`` of children that were read and anchored to). Same
arithmetic as ``emit_many`` per root, with other ids.

Ids are drawn from an injected ``id_source`` (default ``random_id``: 64 random bits, zero
redrawn, drawn 1024 at a time from ``os.urandom``). Thread-safety: none; the shell
serialises calls.
"""

from __future__ import annotations

import enum
import operator
import os
import random
from collections.abc import Callable, Iterator, Sequence
from functools import reduce
from itertools import repeat
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from headrace.reliable.acker import AckerEvent, AckerPool, RootCompleted, RootFailed
from headrace.reliable.errors import ReliableUsageError

if TYPE_CHECKING:
    from headrace.reliable.spout import RootBatch

BATCH_INDEX_BITS = 24  # a batch root's id: batch_id << BATCH_INDEX_BITS | index (spout.py)

IdSource = Callable[[], int]


def random_id() -> int:
    """A random non-zero 64-bit id."""
    while True:
        value = random.getrandbits(64)
        if value:
            return value


class _IdPool:
    """Non-zero 64-bit ids from ``os.urandom``, 1024 per system call."""

    def __init__(self) -> None:
        self._ids: list[int] = []

    def __call__(self) -> int:
        ids = self._ids
        while not ids:
            raw = os.urandom(8 * 1024)
            ids.extend(v for v in memoryview(raw).cast("Q") if v)
        return ids.pop()

    def many(self, n: int) -> list[int]:
        """``n`` ids at once (``[self() for _ in range(n)]`` without a call per id)."""
        ids = self._ids
        while len(ids) < n:
            raw = os.urandom(8 * max(1024, n))
            ids.extend(v for v in memoryview(raw).cast("Q") if v)
        out = ids[-n:]
        del ids[-n:]
        return out


fast_random_id: IdSource = _IdPool()
_state_of = operator.attrgetter("state")
_batch_of = operator.attrgetter("batch")
_index_of = operator.attrgetter("index")


class ItemState(enum.Enum):
    PENDING = "pending"
    ACKED = "acked"
    FAILED = "failed"


_PENDING = ItemState.PENDING
_ACKED = ItemState.ACKED


class Item:
    """One tuple in one or more trees. ``sources`` are the consumed records (root payloads)
    it derives from, for building idempotent keys; the acker never sees them."""

    __slots__ = ("ack_val", "anchors_to_ids", "sources", "state", "values")

    def __init__(self, values: tuple[Any, ...], anchors_to_ids: dict[int, int],
                 sources: tuple[Any, ...]) -> None:
        self.values = values
        self.anchors_to_ids = anchors_to_ids
        self.sources = sources
        self.ack_val = 0
        self.state = ItemState.PENDING

    @property
    def root_ids(self) -> tuple[int, ...]:
        return tuple(self.anchors_to_ids)

    @property
    def is_anchored(self) -> bool:
        return bool(self.anchors_to_ids)

    @property
    def source(self) -> Any:
        """The consumed record this item derives from (the first, if several)."""
        return self.sources[0] if self.sources else None

    def __repr__(self) -> str:
        return f"Item({self.values!r}, roots={len(self.anchors_to_ids)}, {self.state.value})"


class RootItem(Item):
    """The root item of record ``index`` of a ``RootBatch``; ``values`` and ``source`` are
    built from the batch's payload on first use. ``item_id`` is 0 until the tree grows."""

    __slots__ = ("batch", "index", "item_id")

    def __init__(self, batch: RootBatch, index: int) -> None:
        self.batch = batch
        self.index = index
        self.item_id = 0
        self.ack_val = 0
        self.state = ItemState.PENDING

    @property
    def values(self) -> tuple[Any, ...]:  # type: ignore[override]
        return self.batch.values_of(self.index)

    @property
    def sources(self) -> tuple[Any, ...]:  # type: ignore[override]
        return (self.batch.source_of(self.index),)

    @property
    def source(self) -> Any:
        return self.batch.source_of(self.index)

    @property
    def root_id(self) -> int:
        return self.batch.root_id(self.index)

    @property
    def anchors_to_ids(self) -> dict[int, int]:  # type: ignore[override]
        if not self.batch.tracked:
            return {}
        return {self.batch.root_id(self.index): self.item_id}


class ChildItem(Item):
    """An item in exactly one tree (every single-anchored emit): its root id and the id of
    the edge that links it in, as two ints — no per-item dict. ``origin`` is the item its
    ``sources`` come from (the root item, or the anchor's own sources)."""

    __slots__ = ("edge", "origin", "root_id")

    def __init__(self, values: tuple[Any, ...], root_id: int, edge: int,
                 origin: Item) -> None:
        self.values = values
        self.root_id = root_id
        self.edge = edge
        self.origin = origin
        self.ack_val = 0
        self.state = _PENDING

    @property
    def anchors_to_ids(self) -> dict[int, int]:  # type: ignore[override]
        return {self.root_id: self.edge}

    @property
    def sources(self) -> tuple[Any, ...]:  # type: ignore[override]
        return self.origin.sources

    @property
    def source(self) -> Any:
        return self.origin.source


class ChildRun(Sequence[Item]):
    """The children ``emit_each`` made for a run of batch roots: ``len(values)`` per root,
    root by root. They are kept as arrays (each root's id, the edge ids, and per root the
    XOR of its edges, already applied to the root's ``ack_val``); reading ``run[i]`` makes
    that child's ``ChildItem`` once, and it is then an item like any other (anchor to it,
    ack it, fail it). ``ack_many(run)`` acks every child of the run with one acker update
    per root: the root's XOR, adjusted by the ``ack_val`` of the children that were made
    and anchored to. It raises, changing nothing, if a child was already acked or failed,
    as ``ack_many`` of the same children in a list does."""

    __slots__ = ("_made", "edges", "k", "origins", "root_ids", "settled", "values", "xors")

    def __init__(self, values: Sequence[tuple[Any, ...]], root_ids: list[int],
                 origins: Sequence[Item], edges: list[int], xors: list[int]) -> None:
        self.values = values
        self.k = len(values)
        self.root_ids = root_ids
        self.origins = origins
        self.edges = edges  # child i's edge id is edges[i]
        self.xors = xors  # per root: the XOR of its children's edge ids
        self.settled = False  # acked as a whole: every child not made is acked
        self._made: dict[int, ChildItem] = {}

    def __len__(self) -> int:
        return len(self.root_ids) * self.k

    @overload
    def __getitem__(self, i: int) -> Item: ...

    @overload
    def __getitem__(self, i: slice) -> list[Item]: ...

    def __getitem__(self, i: int | slice) -> Item | list[Item]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("child run index out of range")
        it = self._made.get(i)
        if it is None:
            r = i // self.k
            it = self._made[i] = ChildItem(self.values[i - r * self.k], self.root_ids[r],
                                           self.edges[i], self.origins[r])
            if self.settled:
                it.state = _ACKED
        return it

    def __iter__(self) -> Iterator[Item]:
        return map(self.__getitem__, range(len(self)))

    def __repr__(self) -> str:
        return (f"ChildRun({len(self.root_ids)} roots x {self.k}, "
                f"{'acked' if self.settled else 'pending'})")


class TupleTracker:
    """Creates items and turns their anchoring, acks and fails into acker updates."""

    def __init__(self, ackers: AckerPool, id_source: IdSource = random_id) -> None:
        self.ackers = ackers
        self._new_id = id_source
        many = getattr(id_source, "many", None)
        self._new_ids: Callable[[int], list[int]] = (
            many if many is not None else lambda n: [id_source() for _ in range(n)])

    def root(self, values: tuple[Any, ...], owner: int, now_ms: int, *, source: Any = None,
             tracked: bool = True) -> tuple[Item, int, list[AckerEvent]]:
        """A root item for a consumed record: ``(item, root_id, events)``."""
        root_id = self._new_id()
        while self.ackers.enabled and root_id in self.ackers.acker_for(root_id):
            root_id = self._new_id()  # a pending root has this id (p ~ n / 2**64): redraw
        if not (tracked and self.ackers.enabled):
            item = Item(values, {}, (source,))
            return item, root_id, self.ackers.init(root_id, owner, 0, now_ms)
        item_id = self._new_id()
        item = Item(values, {root_id: item_id}, (source,))
        return item, root_id, self.ackers.init(root_id, owner, item_id, now_ms)

    def _single_root(self, anchor: Item) -> tuple[int, Item] | None:
        """``(root_id, origin)`` of an anchor in exactly one tree (growing a root item's
        tree), None for one in no tree or several."""
        if type(anchor) is ChildItem:
            return anchor.root_id, anchor.origin
        if type(anchor) is RootItem:
            batch = anchor.batch
            if not batch.tracked:
                return None
            if not anchor.item_id:
                self._grow(anchor)
            return (batch.batch_id << BATCH_INDEX_BITS) | anchor.index, anchor
        roots = anchor.anchors_to_ids
        if len(roots) == 1:
            (root_id,) = roots
            return root_id, anchor
        return None

    def emit(self, values: tuple[Any, ...], anchors: Sequence[Item] = ()) -> Item:
        for anchor in anchors:
            if anchor.state is not _PENDING:
                raise ReliableUsageError(f"emit anchored to an item already {anchor.state.value}")
        if len(anchors) == 1:  # the common case: one parent in one tree
            anchor = anchors[0]
            single = self._single_root(anchor)
            if single is not None:
                edge_id = self._new_id()
                anchor.ack_val ^= edge_id
                return ChildItem(values, single[0], edge_id, single[1])
            if type(anchor) is RootItem:  # an untracked root
                return Item(values, {}, anchor.sources)
        for anchor in anchors:
            if type(anchor) is RootItem:
                self._grow(anchor)
        anchors_to_ids: dict[int, int] = {}
        sources: list[Any] = []
        for anchor in anchors:
            for src in anchor.sources:
                if not any(src is s for s in sources):
                    sources.append(src)
            roots = anchor.anchors_to_ids
            if not roots:
                continue
            edge_id = self._new_id()
            anchor.ack_val ^= edge_id
            for root_id in roots:
                anchors_to_ids[root_id] = anchors_to_ids.get(root_id, 0) ^ edge_id
        return Item(values, anchors_to_ids, tuple(sources))

    def emit_many(self, values: Sequence[tuple[Any, ...]], anchor: Item) -> list[Item]:
        """``emit(v, [anchor])`` for each of ``values`` (the same items, edge ids and acker
        state), in one pass: an anchor in one tree gets one XOR of all the new edges."""
        if anchor.state is not _PENDING:
            raise ReliableUsageError(f"emit anchored to an item already {anchor.state.value}")
        if type(anchor) is RootItem:  # the fan-out of a fetched record: inlined
            root = anchor
            batch = root.batch
            if batch.tracked:
                root_id = (batch.batch_id << BATCH_INDEX_BITS) | root.index
                if root.item_id:
                    edge_ids = self._new_ids(len(values))
                else:  # the tree's first children: the acker starts tracking it
                    edge_ids = self._new_ids(len(values) + 1)
                    root.item_id = item_id = edge_ids.pop()
                    items = batch._items
                    if items is None:
                        items = batch._items = {}
                    items.setdefault(root.index, root)
                    self.ackers.acker_for(root_id).start(root_id, batch.owner, item_id)
                root.ack_val = reduce(operator.xor, edge_ids, root.ack_val)
                return list(map(ChildItem, values, repeat(root_id), edge_ids, repeat(root)))
        single = self._single_root(anchor)
        if single is None:
            return [self.emit(v, (anchor,)) for v in values]
        root_id, origin = single
        edge_ids = self._new_ids(len(values))
        anchor.ack_val = reduce(operator.xor, edge_ids, anchor.ack_val)
        return list(map(ChildItem, values, repeat(root_id), edge_ids, repeat(origin)))

    def emit_each(self, values: Sequence[tuple[Any, ...]],
                  anchors: Sequence[Item]) -> Sequence[Item]:
        """``emit_many(values, a)`` for each of ``anchors``, root by root (``len(anchors) *
        len(values)`` children). Distinct pending roots of one tracked batch (a batch bolt's
        fan-out) give a ``ChildRun``: the ids drawn in one call, each root's edges XORed in
        one numpy reduction, no item made until read, and ``ack_many(run)`` one acker
        update per root. Other anchors give a list of ``emit_many``'s items. Raises,
        changing nothing, if an anchor is already acked or failed."""
        n, k = len(anchors), len(values)
        states = list(map(_state_of, anchors))
        if states.count(_PENDING) != n:
            state = next(s for s in states if s is not _PENDING)
            raise ReliableUsageError(f"emit anchored to an item already {state.value}")
        if not n or not k:
            return []
        first = anchors[0]
        batch = first.batch if type(first) is RootItem else None
        index = None
        if (batch is not None and batch.tracked and set(map(type, anchors)) == {RootItem}
                and len(set(map(_batch_of, anchors))) == 1):
            index = list(map(_index_of, anchors))
            if len(set(index)) != n:
                index = None  # a root twice: the general path XORs it twice
        if batch is None or index is None:  # (batch: for the type checker)
            out: list[Item] = []
            for anchor in anchors:
                out += self.emit_many(values, anchor)
            return out
        m = n * k
        ids = self._new_ids(m + n)  # the edges, then item ids for trees that start here
        xors = np.bitwise_xor.reduce(np.array(ids[:m], dtype=np.uint64).reshape(n, k),
                                     axis=1).tolist()
        base = batch.batch_id << BATCH_INDEX_BITS
        root_ids = [base | i for i in index]
        items = batch._items
        if items is None:
            items = batch._items = {}
        owner = batch.owner
        ackers = self.ackers
        only = ackers.ackers[0] if ackers.num_ackers == 1 else None
        roots: Sequence[RootItem] = anchors  # type: ignore[assignment]  # checked above
        for root, root_id, x, item_id in zip(roots, root_ids, xors, ids[m:], strict=True):
            if not root.item_id:
                root.item_id = item_id
                items.setdefault(root.index, root)
                (only or ackers.acker_for(root_id)).start(root_id, owner, item_id)
            root.ack_val ^= x
        # the anchors copied: the caller's list may change after the call
        return ChildRun(values, root_ids, list(anchors), ids, xors)

    def _grow(self, root: RootItem) -> None:
        """The root's tree gets its first child: the acker starts tracking it."""
        batch = root.batch
        if root.item_id or not batch.tracked:
            return
        root.item_id = item_id = self._new_id()
        items = batch._items
        if items is None:
            items = batch._items = {}
        items.setdefault(root.index, root)  # a grown root is known to its batch
        root_id = (batch.batch_id << BATCH_INDEX_BITS) | root.index
        self.ackers.acker_for(root_id).start(root_id, batch.owner, item_id)

    def ack(self, item: Item) -> list[AckerEvent]:
        self._finish(item, ItemState.ACKED)
        if type(item) is ChildItem:
            event = self.ackers.update(item.root_id, item.edge ^ item.ack_val)
            return [] if event is None else [event]
        if type(item) is RootItem and not item.item_id:
            if not item.batch.tracked:
                return []
            return [RootCompleted(item.root_id, item.batch.owner)]
        events: list[AckerEvent] = []
        for root_id, edge_ids in item.anchors_to_ids.items():
            event = self.ackers.update(root_id, edge_ids ^ item.ack_val)
            if event is not None:
                events.append(event)
        return events

    def ack_many(self, items: Sequence[Item]) -> list[AckerEvent]:
        """``ack`` for each item, with one bulk acker update. Raises, changing nothing, if
        one of them is already finished. The updates of one root are XORed together first
        (one acker update per root, not per item): the result is that of the acks one by
        one unless ids collide (an intermediate value 0 while an item of the tree is still
        unacked, p ~ 2**-64 — the odds Storm's acker accepts for every ack)."""
        updates, events = self._combine(items)
        if updates:
            events.extend(self.ackers.update_many(updates))
        return events

    def ack_many_ids(self, items: Sequence[Item]) -> tuple[list[int], list[AckerEvent]]:
        """``ack_many`` for the spout, which needs no owners: the ids of the roots the
        acker completed, and the other events (roots completed without an acker entry)."""
        updates, events = self._combine(items)
        return (self.ackers.complete_many(updates) if updates else []), events

    def _combine(self, items: Sequence[Item]) -> tuple[list[tuple[int, int]],
                                                        list[AckerEvent]]:
        """Mark ``items`` acked: their acker updates XORed per root, and the completions of
        roots that never reached the acker."""
        if type(items) is ChildRun:
            return self._combine_run(items), []
        if list(map(_state_of, items)).count(_PENDING) != len(items):
            for item in items:
                if item.state is not _PENDING:
                    raise ReliableUsageError(f"item already {item.state.value}")
        events: list[AckerEvent] = []
        combined: dict[int, int] = {}
        get = combined.get
        acked = _ACKED
        for item in items:
            item.state = acked
            kind = type(item)
            if kind is ChildItem:
                root_id = item.root_id  # type: ignore[attr-defined]
                combined[root_id] = get(root_id, 0) ^ item.edge ^ item.ack_val  # type: ignore[attr-defined]
            elif kind is RootItem:
                batch = item.batch  # type: ignore[attr-defined]
                item_id = item.item_id  # type: ignore[attr-defined]
                root_id = (batch.batch_id << BATCH_INDEX_BITS) | item.index  # type: ignore[attr-defined]
                if item_id:
                    combined[root_id] = get(root_id, 0) ^ item_id ^ item.ack_val
                elif batch.tracked:
                    events.append(RootCompleted(root_id, batch.owner))
            else:
                ack_val = item.ack_val
                for root_id, edge_ids in item.anchors_to_ids.items():
                    combined[root_id] = get(root_id, 0) ^ edge_ids ^ ack_val
        return list(combined.items()), events

    @staticmethod
    def _combine_run(run: ChildRun) -> list[tuple[int, int]]:
        """A whole ``ChildRun`` acked: one update per root (its children's edges, and the
        ``ack_val`` of each child that was made and anchored to)."""
        made = run._made
        if run.settled or (made and list(map(_state_of, made.values())).count(_PENDING)
                           != len(made)):
            state = _ACKED if run.settled else next(
                it.state for it in made.values() if it.state is not _PENDING)
            raise ReliableUsageError(f"item already {state.value}")
        xors = run.xors
        if made:
            xors = list(xors)
            k = run.k
            for i, it in made.items():
                it.state = _ACKED
                if it.ack_val:
                    xors[i // k] ^= it.ack_val
        run.settled = True
        return list(zip(run.root_ids, xors, strict=True))

    def fail(self, item: Item, error: str = "failed") -> list[AckerEvent]:
        self._finish(item, ItemState.FAILED)
        if type(item) is RootItem and not item.item_id:
            root = item
            if not root.batch.tracked:
                return []
            return [RootFailed(root.root_id, root.batch.owner, error)]
        events: list[AckerEvent] = []
        for root_id in item.anchors_to_ids:
            event = self.ackers.fail(root_id, error)
            if event is not None:
                events.append(event)
        return events

    def expire(self, now_ms: int) -> list[AckerEvent]:
        return self.ackers.expire(now_ms)

    @staticmethod
    def _finish(item: Item, state: ItemState) -> None:
        if item.state is not _PENDING:
            raise ReliableUsageError(f"item already {item.state.value}")
        item.state = state
