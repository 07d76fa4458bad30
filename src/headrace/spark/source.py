"""The ``headrace`` PySpark data source: Kafka-protocol topics as Spark tables and streams.

    spark.readStream.format("headrace")
        .option("kafka.bootstrap.servers", "127.0.0.1:9092")
        .option("subscribe", "events")
        .load()

Schema, options and semantics follow Spark's own Kafka connector (``spark-sql-kafka-0-10``),
see ``offsets.py`` for the planning rules. Additions: after each completed micro-batch the
offsets are committed to a consumer group (``kafka.group.id``, or ``groupIdPrefix`` plus a run
id kept in the checkpoint) so ordinary lag tools see the pipeline's progress; the checkpoint
stays the source of truth. Option ``reader``: ``wire`` (default; Fetch requests decoded in bulk,
``wire_read.py``) or ``confluent`` (confluent-kafka's consumer).

Where things run: the DataSource and its stream reader's ``initialOffset``/``latestOffset``/
``partitions``/``commit`` run in a long-lived Python process beside the driver; ``read`` and the
writers' ``write`` run in executor workers and get everything they need from their pickled
``InputPartition`` or writer. Clients are never attributes (they cannot be pickled).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from headrace.spark import kafka_io
from headrace.spark.offsets import (
    OffsetRange,
    OffsetSpec,
    OptionError,
    PartitionOffsets,
    Subscription,
    TopicPartition,
    from_json,
    parse_bool,
    parse_offset_spec,
    parse_positive_int,
    parse_subscription,
    plan_end,
    plan_ranges,
    resolve,
    to_json,
)

log = logging.getLogger("headrace.spark")

RUN_KEY = "$run"
"""Reserved key in the source's offset JSON (``$`` cannot appear in a topic name): the run id
that names the default consumer group, kept in the checkpoint so a restart keeps its group."""


@dataclass(frozen=True)
class SourceOptions:
    """The options of a read, validated once on the driver."""

    kafka: dict[str, str]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool
    group_id: str | None
    group_id_prefix: str
    commit_to_group: bool
    poll_timeout_ms: int
    timeout_s: float
    reader: str = "wire"

    @classmethod
    def parse(cls, options: Mapping[str, str], default_starting: str) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        kafka = {k[len("kafka."):]: v for k, v in opts.items() if k.startswith("kafka.")}
        if not kafka.get("bootstrap.servers"):
            raise OptionError("option 'kafka.bootstrap.servers' is required")
        group_id = kafka.pop("group.id", None)
        for unsupported in ("enable.auto.commit", "auto.offset.reset"):
            if unsupported in kafka:
                raise OptionError(f"option 'kafka.{unsupported}' is not supported: offsets are "
                                  "managed by Spark's checkpoint (use startingOffsets)")
        if "startingtimestamp" in opts:
            try:
                starting = OffsetSpec("timestamp", timestamp_ms=int(opts["startingtimestamp"]))
            except ValueError:
                raise OptionError("option 'startingTimestamp' must be milliseconds since the "
                                  f"epoch, got {opts['startingtimestamp']!r}") from None
        else:
            starting = parse_offset_spec(opts.get("startingoffsets"), "startingOffsets",
                                         default_starting)
        reader = opts.get("reader", "wire").strip().lower()
        if reader not in kafka_io.READERS:
            raise OptionError(f"option 'reader' must be one of {', '.join(kafka_io.READERS)}, "
                              f"got {opts['reader']!r}")
        return cls(
            reader=reader,
            kafka=kafka,
            subscription=parse_subscription(opts),
            starting=starting,
            ending=parse_offset_spec(opts.get("endingoffsets"), "endingOffsets", "latest"),
            max_offsets_per_trigger=parse_positive_int(opts, "maxOffsetsPerTrigger"),
            min_partitions=parse_positive_int(opts, "minPartitions"),
            fail_on_data_loss=parse_bool(opts, "failOnDataLoss", True),
            include_headers=parse_bool(opts, "includeHeaders", False),
            group_id=group_id,
            group_id_prefix=opts.get("groupidprefix", "spark-kafka-source"),
            commit_to_group=parse_bool(opts, "commitOffsetsToGroup", True),
            poll_timeout_ms=parse_positive_int(opts, "kafkaConsumer.pollTimeoutMs") or 120_000,
            timeout_s=(parse_positive_int(opts, "fetchOffset.timeoutMs") or 30_000) / 1000,
        )

    def read_settings(self) -> kafka_io.ReadSettings:
        return kafka_io.ReadSettings(
            config=tuple(sorted(self.kafka.items())),
            include_headers=self.include_headers,
            fail_on_data_loss=self.fail_on_data_loss,
            poll_timeout_ms=self.poll_timeout_ms,
            reader=self.reader,
        )


class HeadracePartition(InputPartition):
    """One Spark task: an offset range and how to read it (pickled to an executor)."""

    def __init__(self, r: OffsetRange, settings: kafka_io.ReadSettings) -> None:
        super().__init__((r.topic, r.partition, r.from_offset, r.until_offset))
        self.range = r
        self.settings = settings


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, HeadracePartition)
    yield from kafka_io.read_range(partition.range, partition.settings)


class _Planner:
    """Driver-side queries shared by the batch and the stream reader."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def selected(self) -> tuple[set[TopicPartition], dict[str, int]]:
        md = kafka_io.topic_partitions(self.options.kafka, self.options.timeout_s)
        return self.options.subscription.select(md), md

    def offsets(self, which: str, partitions: set[TopicPartition],
                require_all: bool = True) -> PartitionOffsets:
        return kafka_io.list_offsets(self.options.kafka, partitions, which,
                                     self.options.timeout_s, require_all=require_all)

    def resolve(self, spec: OffsetSpec, partitions: set[TopicPartition]) -> PartitionOffsets:
        earliest = self.offsets("earliest", partitions)
        latest = self.offsets("latest", partitions)
        by_ts = None
        if spec.kind == "timestamp":
            by_ts = kafka_io.list_offsets(self.options.kafka, partitions, "timestamp",
                                          self.options.timeout_s, spec.timestamp_ms)
        return resolve(spec, partitions, earliest, latest, by_ts)


class HeadraceBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        planner = _Planner(self.options)
        selected, _ = planner.selected()
        if self.options.ending.kind == "earliest":
            raise OptionError("endingOffsets=earliest is not allowed for a batch read")
        start = planner.resolve(self.options.starting, selected)
        end = planner.resolve(self.options.ending, selected)
        settings = self.options.read_settings()
        ranges = plan_ranges(start, end, self.options.min_partitions)
        return [HeadracePartition(r, settings) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)


class HeadraceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: PartitionOffsets | None = None
        self._last_committed: PartitionOffsets | None = None

    # -- offsets --
    def initialOffset(self) -> dict[str, Any]:
        planner = _Planner(self.options)
        selected, _ = planner.selected()
        offsets: dict[str, Any] = to_json(planner.resolve(self.options.starting, selected))
        offsets[RUN_KEY] = uuid.uuid4().hex[:12]
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        planner = _Planner(self.options)
        selected, _ = planner.selected()
        self._target = planner.offsets("latest", selected)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = _offsets(start)
        # ``start`` is the end of the last batch, which has completed: report it to the group
        # now (``commit()`` comes one batch late and not at all while the stream is idle).
        self._commit_to_group(start)
        planner = _Planner(self.options)
        selected, _ = planner.selected()
        known = set(begin) & selected
        new = selected - set(begin)
        # a partition without a leader this time (one moving) is left out: ``plan_end``
        # keeps its offset, or leaves a new one for the next batch
        latest = planner.offsets("latest", known | new, require_all=False)
        earliest = planner.offsets("earliest", new, require_all=False) if new else {}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        plan = plan_end(begin, selected, earliest, latest, max_rows, self._target)
        for loss in plan.data_loss:
            if self.options.fail_on_data_loss:
                raise kafka_io.DataLossError(
                    f"{loss.message}; set failOnDataLoss=false to continue without it"
                )
            log.warning("%s (failOnDataLoss=false: continuing)", loss.message)
        end: dict[str, Any] = to_json(plan.end)
        if RUN_KEY in start:
            end[RUN_KEY] = start[RUN_KEY]
        return end

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        settings = self.options.read_settings()
        ranges = plan_ranges(_offsets(start), _offsets(end), self.options.min_partitions)
        return [HeadracePartition(r, settings) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._commit_to_group(end)

    def stop(self) -> None:
        kafka_io.close_all()

    # -- consumer-group commits --
    def group_id(self, offsets: Mapping[str, Any]) -> str | None:
        if not self.options.commit_to_group:
            return None
        if self.options.group_id:
            return self.options.group_id
        run = offsets.get(RUN_KEY)
        return f"{self.options.group_id_prefix}-{run}" if run else None

    def _commit_to_group(self, offsets: Mapping[str, Any]) -> None:
        group = self.group_id(offsets)
        if group is None:
            return
        parsed = _offsets(offsets)
        if parsed == self._last_committed:
            kafka_io.commit_group(self.options.kafka, group, {})  # serve callbacks only
            return
        kafka_io.commit_group(self.options.kafka, group, parsed)
        self._last_committed = parsed


def _offsets(data: Mapping[str, Any]) -> PartitionOffsets:
    return from_json({k: v for k, v in data.items() if k != RUN_KEY})


# --- the sink ------------------------------------------------------------------------------

COMMITS_TOPIC = "headrace-sink-commits"
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # Spark's MicroBatchExecution.BATCH_ID_KEY
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's StreamExecution.QUERY_ID_KEY
SINK_FAILPOINT_ENV = "HEADRACE_SINK_FAILPOINT_BATCH"
SINK_FAILPOINT_PGID_ENV = "HEADRACE_SINK_FAILPOINT_PGID"
SINK_TASK_FAILPOINT_ENV = "HEADRACE_SINK_TASK_FAILPOINT"
"""Crash tests: ``<transactionalIdPrefix>:<open|committed>:<batch id>[,...]``; the first
attempt of task partition 0 of that micro-batch of a query with that prefix kills its
executor mid-transaction or after its commit (``kafka_io.produce_batches_transactional``)."""


def _task_failpoint(prefix: str, batch_id: int | None, part: int, attempt: int) -> str | None:
    spec = os.environ.get(SINK_TASK_FAILPOINT_ENV)
    if not spec or batch_id is None or part != 0 or attempt != 0:
        return None
    for entry in spec.split(","):
        name, when, batch = entry.rsplit(":", 2)
        if name == prefix and int(batch) == batch_id:
            return when
    return None


@dataclass
class HeadraceCommitMessage(WriterCommitMessage):
    records: int


class _WriterBase:
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        self.kafka = {k[len("kafka."):]: v for k, v in opts.items() if k.startswith("kafka.")}
        if not self.kafka.get("bootstrap.servers"):
            raise OptionError("option 'kafka.bootstrap.servers' is required")
        self.topic = opts.get("topic") or None
        names = {f.name.lower(): f for f in schema.fields}
        if "value" not in names:
            raise OptionError("the rows to write need a 'value' column (string or binary)")
        for col in ("value", "key"):
            if col in names and not isinstance(names[col].dataType, StringType | BinaryType):
                raise OptionError(f"column {col!r} must be string or binary, "
                                  f"not {names[col].dataType.simpleString()}")
        if self.topic is None and "topic" not in names:
            raise OptionError("no topic: give a 'topic' column or the 'topic' option")
        # transactional mode (exactly once to a topic): each task's rows in one Kafka
        # transaction whose id is <prefix>-<task partition>; see kafka_io
        self.txn_prefix = opts.get("transactionalidprefix") or None
        # inside foreachBatch: the micro-batch id, given explicitly (batch writes)
        raw = opts.get("transactionbatchid")
        self.txn_batch_id = int(raw) if raw not in (None, "") else None
        self.commits_topic = opts.get("transactioncommitstopic") or COMMITS_TOPIC
        if "transactional.id" in self.kafka:
            raise OptionError("option 'kafka.transactional.id' is set per task: give "
                              "'transactionalIdPrefix' instead")
        if self.txn_prefix:
            kafka_io.ensure_compacted_topic(self.kafka, self.commits_topic)

    def _write(self, batches: Iterator[pa.RecordBatch]) -> HeadraceCommitMessage:
        if not self.txn_prefix:
            return HeadraceCommitMessage(kafka_io.produce_batches(self.kafka, batches,
                                                                  self.topic))
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else 0
        # a streaming query's micro-batch (also inside foreachBatch, whose jobs inherit the
        # query's local properties); its id survives restarts from the same checkpoint, so
        # progress recorded by an earlier query on other checkpoints never matches
        raw_batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None
        batch_id = (self.txn_batch_id if self.txn_batch_id is not None
                    else int(raw_batch) if raw_batch is not None else None)
        tid = f"{self.txn_prefix}-{query}-{part}" if query else f"{self.txn_prefix}-{part}"
        die_at = _task_failpoint(self.txn_prefix, batch_id, part,
                                 ctx.attemptNumber() if ctx is not None else 0)
        return HeadraceCommitMessage(kafka_io.produce_batches_transactional(
            self.kafka, batches, self.topic, tid, batch_id, self.commits_topic,
            die_at=die_at))


class HeadraceBatchWriter(_WriterBase, DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> HeadraceCommitMessage:
        return self._write(iterator)


class HeadraceStreamWriter(_WriterBase, DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> HeadraceCommitMessage:
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        n = sum(m.records for m in messages if isinstance(m, HeadraceCommitMessage))
        log.debug("batch %d: %d records produced", batchId, n)
        failpoint_batch = os.environ.get(SINK_FAILPOINT_ENV)
        if failpoint_batch is not None and batchId >= int(failpoint_batch):
            # crash tests: the whole job (the process group the test names: this runs in
            # a Python worker of its own) dies after the batch's tasks committed and before
            # Spark records it in its checkpoint (the replay the sink must make a no-op)
            os.killpg(int(os.environ.get(SINK_FAILPOINT_PGID_ENV, os.getpgid(0))),
                      signal.SIGKILL)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.txn_prefix:
            log.warning("batch %d aborted; tasks that committed their transaction stay "
                        "committed, and the replay writes only the others", batchId)
        else:
            log.warning("batch %d aborted; records already produced stay (at-least-once)",
                        batchId)


# --- the data source -----------------------------------------------------------------------


class HeadraceDataSource(DataSource):
    """``format("headrace")``: read and write Kafka-protocol topics (Spark's Kafka options)."""

    @classmethod
    def name(cls) -> str:
        return "headrace"

    def schema(self) -> str:
        opts = {k.lower(): v for k, v in self.options.items()}
        if parse_bool(opts, "includeHeaders", False):
            return kafka_io.SPARK_SCHEMA_WITH_HEADERS
        return kafka_io.SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return HeadraceBatchReader(SourceOptions.parse(self.options, "earliest"))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = SourceOptions.parse(self.options, "latest")
        if options.ending.kind != "latest" or "endingoffsets" in {k.lower() for k in self.options}:
            raise OptionError("option 'endingOffsets' is for batch reads only")
        return HeadraceStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> HeadraceBatchWriter:
        return HeadraceBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> HeadraceStreamWriter:
        return HeadraceStreamWriter(self.options, schema)


def wait_for(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    """Poll ``predicate`` until truthy; raise ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)
