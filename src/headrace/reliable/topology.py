"""What the user writes: stages ("bolts") and the collectors handed to them.

A ``Topology`` is a chain of stages. The first stage receives one root item per consumed
record (``item.values == (key, value)``, ``item.source`` is the ``Record``); whatever a stage
emits goes to the next stage. Each stage runs on ``parallelism`` lanes (one thread each):
items go to lanes round-robin, or by ``fields(item)`` (Storm's fields grouping: the same key
always reaches the same lane, so per-key state needs no lock).

Two styles, as in Storm:

- ``basic_bolt(name, fn)``: ``fn(item, out)``; ``out.emit(values)`` anchors to the input
  item automatically, and the input is acked when ``fn`` returns (failed if it raises).
- ``bolt(name, fn)``: ``fn(item, collector)``; the handler anchors explicitly with
  ``collector.emit(values, anchors=[...])`` (several anchors for joins and aggregations;
  none for an unanchored, untracked item) and must ``collector.ack(item)`` or
  ``collector.fail(item)`` every item it receives, possibly later (an aggregation acks its
  inputs once the aggregate is emitted). An exception fails the item if still pending.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from headrace.reliable.tuples import Item


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


class OutputCollector(Protocol):
    def emit(self, values: tuple[Any, ...], anchors: Sequence[Item] = ()) -> Item: ...

    def ack(self, item: Item) -> None: ...

    def fail(self, item: Item, error: str = "failed") -> None: ...


class BasicOutputCollector(Protocol):
    def emit(self, values: tuple[Any, ...]) -> Item: ...


BasicHandler = Callable[[Item, BasicOutputCollector], None]
Handler = Callable[[Item, OutputCollector], None]
FieldsGrouping = Callable[[Item], Hashable]


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    handler: BasicHandler | Handler
    basic: bool
    parallelism: int
    fields: FieldsGrouping | None


class Topology:
    def __init__(self) -> None:
        self.stages: list[Stage] = []

    def basic_bolt(self, name: str, fn: BasicHandler, parallelism: int = 1,
                   fields: FieldsGrouping | None = None) -> Topology:
        return self._add(Stage(name, fn, True, parallelism, fields))

    def bolt(self, name: str, fn: Handler, parallelism: int = 1,
             fields: FieldsGrouping | None = None) -> Topology:
        return self._add(Stage(name, fn, False, parallelism, fields))

    def _add(self, stage: Stage) -> Topology:
        if stage.parallelism < 1:
            raise ValueError(f"stage {stage.name}: parallelism must be >= 1")
        if any(s.name == stage.name for s in self.stages):
            raise ValueError(f"stage {stage.name} defined twice")
        self.stages.append(stage)
        return self
