"""What the user writes: stages ("bolts") and the collectors handed to them.

A ``Topology`` is a chain of stages. The first stage receives one root item per consumed
record (``item.values == (key, value)``, ``item.source`` is the ``Record``); whatever a stage
emits goes to the next stage. Each stage runs on ``parallelism`` lanes (one thread each):
items go to lanes round-robin, or by ``fields(item)`` (Storm's fields grouping: the same key
always reaches the same lane, so per-key state needs no lock). The first stage's batches
(without fields grouping) go to the lane that took the previous batch while it keeps up
(less than 2 batches unfinished), else to the least busy lane: a quick handler then wakes
one thread, not each lane in turn; slow ones (I/O, process lanes) spread over all lanes.

Five styles; the first two are Storm's:

- ``basic_bolt(name, fn)``: ``fn(item, out)``; ``out.emit(values)`` anchors to the input
  item automatically, and the input is acked when ``fn`` returns (failed if it raises).
- ``bolt(name, fn)``: ``fn(item, collector)``; the handler anchors explicitly with
  ``collector.emit(values, anchors=[...])`` (several anchors for joins and aggregations;
  none for an unanchored, untracked item) and must ``collector.ack(item)`` or
  ``collector.fail(item)`` every item it receives, possibly later (an aggregation acks its
  inputs once the aggregate is emitted). An exception fails the item if still pending.
- ``batch_bolt(name, fn)`` (first stage only): ``fn(batch)`` receives a ``Batch``: one
  partition's records of one poll, as a sequence of ``Record`` (built on first access;
  ``batch.messages`` are the raw confluent-kafka messages, ``batch.offsets`` their offsets).
  When ``fn`` returns, every record not failed with ``batch.fail(i, error)`` is acked; if it
  raises, every record still pending fails. ``batch.emit(values, anchors=[i, ...])`` emits
  anchored to records of the batch; ``batch.item(i)`` is record i's root item. The basic
  bolt runs on the same batches: a loop over them on the lane.
- ``async_bolt(name, fn, concurrency=n)`` (first stage only): ``async def fn(item, out)``,
  the basic bolt's contract, run on an asyncio event loop per lane with up to
  ``concurrency`` calls in flight (for handlers that wait on I/O).

- ``process_bolt(name, fn, parallelism=n)`` (first stage only): ``fn(record)`` runs in
  ``n`` worker processes, fed whole batches; it returns None or value tuples to emit
  anchored to the record (to the next stage, in the consumer process); an exception fails
  the record. A worker that dies fails its in-flight batch (replayed) and is restarted.

Lanes are threads: they add throughput when handlers wait (I/O, or C code that releases the
GIL); for pure-Python CPU-bound handlers they do not (use ``process_bolt`` for those).
``parallelism=0`` (first stage only) runs the stage on the polling thread itself: no
hand-off between threads, which on a small machine is the cheapest way to run fast handlers
(bench/reliable_bench.py on 2 cores: a no-op batch bolt at 67-82% of a plain consumer's
records/s against 49-68% on 1, 2 or 4 lane threads), but polling waits while the
handler runs (as in a plain consumer loop; keep each batch well under
``max.poll.interval.ms``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from headrace.reliable.tuples import Item

if TYPE_CHECKING:
    from headrace.reliable.spout import RootBatch, TopicPartition


@dataclass(frozen=True, slots=True)
class Record:
    """A consumed Kafka record (the payload of a root item)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None
    delivery_count: int | None = None  # share mode: this delivery's count (1 = first)


class OutputCollector(Protocol):
    def emit(self, values: tuple[Any, ...], anchors: Sequence[Item] = ()) -> Item: ...

    def ack(self, item: Item) -> None: ...

    def fail(self, item: Item, error: str = "failed") -> None: ...


class BasicOutputCollector(Protocol):
    def emit(self, values: tuple[Any, ...]) -> Item: ...


class Batch:
    """What a batch bolt receives: one partition's records of one poll (see the module
    docstring). A sequence of ``Record``; ``fail``/``emit`` are thread-safe."""

    __slots__ = ("_emit", "_records", "failed", "root_batch")

    def __init__(self, root_batch: RootBatch,
                 emit: Callable[[tuple[Any, ...], Sequence[Item]], Item]) -> None:
        self.root_batch = root_batch
        self.failed: dict[int, str] = {}
        self._emit = emit
        self._records: list[Record] | None = None

    @property
    def tp(self) -> TopicPartition:
        return self.root_batch.tp

    @property
    def offsets(self) -> Sequence[int]:
        """The records' offsets: a ``range`` when they are contiguous (the usual fetch),
        else a list."""
        return self.root_batch.offsets

    @property
    def messages(self) -> Sequence[Any]:
        return self.root_batch.payloads

    def __len__(self) -> int:
        return len(self.root_batch.offsets)

    def __getitem__(self, index: int) -> Record:
        return self.root_batch.source_of(index)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[Record]:
        return (self.root_batch.source_of(i) for i in range(len(self)))

    def values(self) -> list[bytes | None]:
        """The records' values (no ``Record`` objects made)."""
        return [m.value() for m in self.root_batch.payloads]

    def item(self, index: int) -> Item:
        return self.root_batch.item(index)

    def fail(self, index: int, error: str = "failed") -> None:
        """Record ``index`` failed: it is retried (or dead-lettered), the rest are acked."""
        self.failed[index] = error

    def emit(self, values: tuple[Any, ...], anchors: Sequence[int] = ()) -> Item:
        """Emit to the next stage anchored to the root items of records ``anchors``."""
        return self._emit(values, [self.root_batch.item(i) for i in anchors])


BasicHandler = Callable[[Item, BasicOutputCollector], None]
Handler = Callable[[Item, OutputCollector], None]
BatchHandler = Callable[[Batch], None]
AsyncHandler = Callable[[Item, BasicOutputCollector], Awaitable[None]]
FieldsGrouping = Callable[[Item], Hashable]
ProcessHandler = Callable[[Record], Iterable[tuple[Any, ...]] | None]


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    handler: BasicHandler | Handler | BatchHandler | AsyncHandler | ProcessHandler
    basic: bool
    parallelism: int
    fields: FieldsGrouping | None
    kind: str = "basic"  # "basic", "explicit", "batch", "async" or "process"
    concurrency: int = 1


class Topology:
    def __init__(self) -> None:
        self.stages: list[Stage] = []

    def basic_bolt(self, name: str, fn: BasicHandler, parallelism: int = 1,
                   fields: FieldsGrouping | None = None) -> Topology:
        return self._add(Stage(name, fn, True, parallelism, fields, "basic"))

    def bolt(self, name: str, fn: Handler, parallelism: int = 1,
             fields: FieldsGrouping | None = None) -> Topology:
        return self._add(Stage(name, fn, False, parallelism, fields, "explicit"))

    def batch_bolt(self, name: str, fn: BatchHandler, parallelism: int = 1) -> Topology:
        if self.stages:
            raise ValueError(f"stage {name}: a batch bolt must be the first stage")
        return self._add(Stage(name, fn, False, parallelism, None, "batch"))

    def async_bolt(self, name: str, fn: AsyncHandler, parallelism: int = 1,
                   concurrency: int = 100) -> Topology:
        if self.stages:
            raise ValueError(f"stage {name}: an async bolt must be the first stage")
        if concurrency < 1:
            raise ValueError(f"stage {name}: concurrency must be >= 1")
        return self._add(Stage(name, fn, True, parallelism, None, "async", concurrency))

    def process_bolt(self, name: str, fn: ProcessHandler, parallelism: int = 1) -> Topology:
        """``fn(record)`` in ``parallelism`` worker processes (CPU-bound handlers); returns
        None or value tuples to emit anchored to the record (see processes.py)."""
        if self.stages:
            raise ValueError(f"stage {name}: a process bolt must be the first stage")
        if parallelism < 1:
            raise ValueError(f"stage {name}: a process bolt needs parallelism >= 1")
        return self._add(Stage(name, fn, False, parallelism, None, "process"))

    def _add(self, stage: Stage) -> Topology:
        if stage.parallelism < 0 or (stage.parallelism == 0 and self.stages):
            raise ValueError(f"stage {stage.name}: parallelism must be >= 1 "
                             "(0, on the polling thread, only for the first stage)")
        if any(s.name == stage.name for s in self.stages):
            raise ValueError(f"stage {stage.name} defined twice")
        self.stages.append(stage)
        return self
