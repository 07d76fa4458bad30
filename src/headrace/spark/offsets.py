"""Offset planning for the Spark source: pure functions, no I/O, no pyspark.

The rules, as Spark's own Kafka connector has them (``KafkaMicroBatchStream``,
``KafkaOffsetRangeCalculator``):

- An offset of the source is a map ``TopicPartition -> next offset to read``. In Spark's
  checkpoint it is stored as Spark's Kafka JSON, ``{"topic": {"0": 12, "1": 5}}`` (keys are
  strings because JSON keys are).
- ``startingOffsets`` / ``endingOffsets`` are ``earliest``, ``latest`` or that JSON, where
  ``-2`` means earliest and ``-1`` latest for one partition. A partition the JSON leaves out
  starts at earliest (and, for ``endingOffsets``, ends at latest).
- A micro-batch reads ``[start, end)`` per partition. ``end`` is the latest offset, capped by the
  ``availableNow`` target and by ``maxOffsetsPerTrigger``, shared between partitions in
  proportion to their backlog (Spark's ``rateLimit``).
- A partition that appears (new partition, new topic matching the subscription) enters the
  offset map at its earliest offset with an empty range; the next batch reads it. This keeps
  ``partitions(start, end)`` free of I/O and deterministic on replay.
- Data loss is reported, not decided here: a partition that vanished, or whose latest offset
  went below the offset already reached, yields a :class:`DataLoss`; the caller fails the query
  (``failOnDataLoss=true``) or logs and moves on.
- ``minPartitions`` splits large ranges so that at least that many Spark tasks read a batch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

TopicPartition = tuple[str, int]
PartitionOffsets = dict[TopicPartition, int]

EARLIEST = -2
"""In offset JSON: the earliest offset of the partition (Kafka's ``ListOffsets`` sentinel)."""
LATEST = -1
"""In offset JSON: the latest offset (the high watermark) of the partition."""


class OptionError(ValueError):
    """The user gave the source or sink an invalid option (the caller's fault)."""


# --- options -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Subscription:
    """Which partitions to read: exactly one of ``subscribe``, ``subscribePattern``, ``assign``."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str = ""
    partitions: tuple[TopicPartition, ...] = ()

    def select(self, metadata: Mapping[str, int]) -> set[TopicPartition]:
        """The partitions to read, given ``metadata`` (topic -> partition count)."""
        if self.kind == "assign":
            return {tp for tp in self.partitions if tp[0] in metadata and tp[1] < metadata[tp[0]]}
        if self.kind == "subscribe":
            names = [t for t in self.topics if t in metadata]
        else:
            rx = re.compile(self.pattern)
            names = [t for t in metadata if rx.fullmatch(t) and not t.startswith("__")]
        return {(t, p) for t in names for p in range(metadata[t])}


def parse_subscription(options: Mapping[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if options.get(k)]
    if len(given) != 1:
        raise OptionError(
            "exactly one of the options 'subscribe', 'subscribePattern' or 'assign' must be "
            f"given (got {len(given)})"
        )
    kind = given[0]
    value = options[kind].strip()
    if kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError("option 'subscribe' names no topic")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribepattern":
        try:
            re.compile(value)
        except re.error as e:
            raise OptionError(f"option 'subscribePattern' is not a valid regex: {e}") from None
        return Subscription("subscribePattern", pattern=value)
    try:
        parsed = json.loads(value)
        tps = tuple(sorted((str(t), int(p)) for t, ps in parsed.items() for p in ps))
    except (ValueError, AttributeError, TypeError):
        raise OptionError(
            f"option 'assign' must be JSON like {{\"topicA\":[0,1]}}, got {value!r}"
        ) from None
    if not tps:
        raise OptionError("option 'assign' names no partition")
    return Subscription("assign", partitions=tps)


@dataclass(frozen=True)
class OffsetSpec:
    """A parsed ``startingOffsets`` / ``endingOffsets`` option."""

    kind: Literal["earliest", "latest", "specific", "timestamp"]
    specific: Mapping[TopicPartition, int] = field(default_factory=dict)
    timestamp_ms: int = 0


def parse_offset_spec(text: str | None, option: str, default: str) -> OffsetSpec:
    value = (text if text is not None else default).strip()
    if value.lower() == "earliest":
        return OffsetSpec("earliest")
    if value.lower() == "latest":
        return OffsetSpec("latest")
    try:
        return OffsetSpec("specific", from_json(json.loads(value)))
    except (ValueError, AttributeError, TypeError):
        raise OptionError(
            f"option {option!r} must be 'earliest', 'latest' or JSON like "
            f'{{"topicA":{{"0":23,"1":-2}}}}, got {value!r}'
        ) from None


def parse_positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None or raw == "":
        return None
    try:
        n = int(raw)
    except ValueError:
        raise OptionError(f"option {name!r} must be a positive integer, got {raw!r}") from None
    if n <= 0:
        raise OptionError(f"option {name!r} must be a positive integer, got {n}")
    return n


def parse_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name!r} must be true or false, got {raw!r}")


# --- the offset map and its JSON form -------------------------------------------------------


def to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, Any]:
    """``{("t", 0): 5}`` -> ``{"t": {"0": 5}}`` (Spark's Kafka offset JSON)."""
    out: dict[str, Any] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_json(data: Mapping[str, Any]) -> PartitionOffsets:
    out: PartitionOffsets = {}
    for topic, parts in data.items():
        for partition, offset in parts.items():
            out[(str(topic), int(partition))] = int(offset)
    return out


def resolve(
    spec: OffsetSpec,
    partitions: Iterable[TopicPartition],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    by_timestamp: Mapping[TopicPartition, int] | None = None,
) -> PartitionOffsets:
    """Concrete offsets for ``partitions`` (all present in ``earliest`` and ``latest``).

    A specific offset outside ``[earliest, latest]`` is kept as given: reading it reports data
    loss (below earliest) or waits for the records (above latest), as Spark's connector does.
    """
    out: PartitionOffsets = {}
    for tp in partitions:
        if spec.kind == "earliest":
            out[tp] = earliest[tp]
        elif spec.kind == "latest":
            out[tp] = latest[tp]
        elif spec.kind == "timestamp":
            found = (by_timestamp or {}).get(tp, -1)
            out[tp] = latest[tp] if found < 0 else found
        else:
            want = spec.specific.get(tp, EARLIEST)
            out[tp] = earliest[tp] if want == EARLIEST else latest[tp] if want == LATEST else want
    return out


# --- planning a micro-batch ----------------------------------------------------------------


@dataclass(frozen=True)
class DataLoss:
    """Records the query was due to read are gone (or the partition is)."""

    topic: str
    partition: int
    message: str


@dataclass(frozen=True)
class Plan:
    end: PartitionOffsets
    data_loss: tuple[DataLoss, ...] = ()


def rate_limit(
    start: Mapping[TopicPartition, int],
    until: Mapping[TopicPartition, int],
    max_records: int,
) -> PartitionOffsets:
    """Cap ``until`` so that about ``max_records`` records are read in total, each partition
    getting a share proportional to its backlog (a share below one rounds up, so every
    partition with a backlog advances)."""
    sizes = {tp: end - start[tp] for tp, end in until.items() if tp in start and end > start[tp]}
    total = sum(sizes.values())
    if total <= max_records:
        return dict(until)
    out = dict(until)
    for tp, size in sizes.items():
        share = max_records * (size / total)
        take = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(until[tp], start[tp] + take)
    return out


def plan_end(
    start: Mapping[TopicPartition, int],
    selected: Iterable[TopicPartition],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_records: int | None = None,
    target: Mapping[TopicPartition, int] | None = None,
) -> Plan:
    """The end offset of the next micro-batch.

    ``start`` is where the last batch ended; ``selected`` the partitions the subscription
    matches now; ``earliest``/``latest`` their log start and high watermark (``earliest`` is
    needed only for partitions not in ``start``); ``target`` the ``availableNow`` end, beyond
    which nothing is read; ``max_records`` the ``maxOffsetsPerTrigger`` limit.
    """
    selected = set(selected)
    loss: list[DataLoss] = []
    end: PartitionOffsets = {}
    for tp, offset in start.items():
        if tp not in selected:
            loss.append(DataLoss(tp[0], tp[1], f"partition {tp[0]}-{tp[1]} is gone "
                                 f"(topic deleted?) at offset {offset}"))
            continue
        if tp not in latest:  # no answer for it this time (leader moving): wait
            end[tp] = offset
            continue
        upper = latest[tp]
        if upper < offset:
            loss.append(DataLoss(tp[0], tp[1], f"partition {tp[0]}-{tp[1]}: latest offset "
                                 f"{upper} is below the offset already read, {offset} "
                                 "(topic recreated?)"))
            end[tp] = upper
            continue
        if target is not None:
            upper = min(upper, max(offset, target.get(tp, offset)))
        end[tp] = upper
    if max_records is not None:
        capped = rate_limit({tp: start[tp] for tp in end}, end, max_records)
        end.update(capped)
    for tp in sorted(selected - set(start)):
        if tp in earliest and (target is None or tp in target):
            end[tp] = earliest[tp]
    return Plan(end, tuple(loss))


@dataclass(frozen=True)
class OffsetRange:
    """Records ``[from_offset, until_offset)`` of one partition: one Spark task's work."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


def plan_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    min_partitions: int | None = None,
) -> list[OffsetRange]:
    """The non-empty ranges between ``start`` and ``end``, split so that there are at least
    ``min_partitions`` of them when the data allows (Spark's ``KafkaOffsetRangeCalculator``).

    Partitions missing from ``start`` enter at their ``end`` offset (empty range); a partition
    whose end is below its start (data loss already reported) is skipped.
    """
    ranges = [
        OffsetRange(tp[0], tp[1], start.get(tp, until), until)
        for tp, until in sorted(end.items())
        if until > start.get(tp, until)
    ]
    if min_partitions is None or len(ranges) >= min_partitions or not ranges:
        return ranges
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        parts = max(1, min(r.size, round(r.size / total * min_partitions)))
        step = r.size / parts
        bounds = [r.from_offset + int(i * step) for i in range(parts)] + [r.until_offset]
        out += [OffsetRange(r.topic, r.partition, a, b) for a, b in pairwise(bounds) if b > a]
    return out


def lag(committed: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]) -> int:
    """Records not yet processed: sum over partitions of ``latest - committed``."""
    return sum(max(0, end - committed.get(tp, 0)) for tp, end in latest.items())
