"""The shell: ``ReliableConsumer`` runs a ``Topology`` over confluent-kafka.

Threads: the caller's thread runs ``run()``: it polls (``Consumer.consume``), feeds records
to the pure ``ReliableSpout``, hands root items to the first stage's lanes and carries out
the spout's effects (seek, pause/resume, commit, dead letters). Each stage lane is one
thread with a queue; lanes ack, fail and emit through the spout under one lock. A process
bolt's lane thread owns one worker process (processes.py): it ships each batch to it and
settles the batch with its results; a dead worker fails the batch (replayed) and is
restarted. Rebalance callbacks run inside ``consume`` on the polling thread. Polling never
stops while partitions are paused, so the group session and ``max.poll.interval.ms`` stay
satisfied. While roots are pending the polling thread waits at most
``busy_poll_timeout_s`` in ``consume``, so it sees the lanes' acks soon after they happen.

Hand-offs to lane threads cost GIL transfers (the lane takes the GIL while ``consume``
runs without it; the polling thread waits for it back), so: the first stage's lane queues
are ``SimpleQueue`` (one wake-up per hand-off), a batch goes to the lane that took the
previous one while it keeps up (``_sticky_lane``: one thread woken, not each lane in turn),
and a lane drops a batch as soon as it is done (its messages then die young instead of
surviving into older GC generations while the next poll's messages are made).

Rebalancing: eager (range, roundrobin), cooperative (``cooperative-sticky``) and KIP-848
(``group.protocol=consumer``) alike go through the same per-partition callbacks: a revoke
commits what is committable for the revoked partitions only and drops their roots and queued
batches; the other partitions keep their state and keep processing through the rebalance
(with cooperative protocols they are not revoked at all). A lost partition (session
expired) is dropped without a commit.

Shutdown (``close``), bounded, in order: pause every partition → keep polling until the
pending roots complete or ``drain_timeout_s`` passes → commit what is committable → stop
the lanes → close the consumer (its revoke callback commits again, if anything is new) →
flush the dead-letter producer.

Crash behaviour: nothing is committed that is not fully processed, so after kill -9 the
group resumes at the last commit and re-processes at most the records after it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from confluent_kafka import (
    AcknowledgeType,
    Consumer,
    IllegalStateException,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    ShareConsumer,
)
from confluent_kafka import TopicPartition as KafkaTopicPartition

from headrace.reliable.errors import ReliableConfigError, ReliableUsageError
from headrace.reliable.exactly_once import SqliteOffsetStore
from headrace.reliable.processes import ProcessWorker, WorkerDied, record_fields
from headrace.reliable.share_spout import (
    Acknowledge,
    AckType,
    ShareEffect,
    ShareSpout,
    ShareSpoutConfig,
)
from headrace.reliable.spout import (
    PENDING,
    Commit,
    DeadLetter,
    Effect,
    Pause,
    ReliableSpout,
    Resume,
    RootBatch,
    Seek,
    SpoutBase,
    SpoutConfig,
    TopicPartition,
)
from headrace.reliable.topology import (
    AsyncHandler,
    BasicHandler,
    BasicOutputCollector,
    Batch,
    BatchHandler,
    Handler,
    OutputCollector,
    ProcessHandler,
    Record,
    Stage,
    Topology,
)
from headrace.reliable.tuples import Item, ItemState, RootItem

log = logging.getLogger("headrace.reliable")

DLQ_HEADER_TOPIC = "headrace.original.topic"
DLQ_HEADER_PARTITION = "headrace.original.partition"
DLQ_HEADER_OFFSET = "headrace.original.offset"
DLQ_HEADER_ERROR = "headrace.error"
DLQ_HEADER_ATTEMPTS = "headrace.attempts"

_STOP = object()

# "Caller runs": the polling thread runs a first-stage batch itself while every lane of the
# first stage is idle and the handler has measured at most CALLER_RUNS_MAX_US of wall time
# per record (a moving average over batches run so, uncontended). A quick handler then
# costs no hand-off: on lane threads the polling thread's consume() (it builds the
# Message objects holding the GIL) and the lanes queued for the GIL behind one another
# (a no-op basic bolt: 45-54% of a plain consumer on lanes, 53% on the polling thread).
# A slower one (waiting on I/O, say) goes to the lanes, where it runs concurrently; one
# batch in CALLER_RUNS_PROBE_EVERY that finds the lanes idle is still run here, to notice a
# handler that became quick. Never more handlers at once than lanes: only idle lanes.
CALLER_RUNS_MAX_US = 2.0
CALLER_RUNS_PROBE_EVERY = 64
_CALLER_RUNS_KINDS = frozenset({"basic", "explicit", "batch"})
# Back-pressure: the polling thread stops fetching while the first stage's lanes hold
# LANE_BACKLOG_BATCHES unfinished batches each (on average), and waits for one to finish;
# librdkafka keeps its prefetched records meanwhile. Without it a slow handler's lanes
# queued every fetched record until each partition reached max_uncommitted_offsets and
# was paused, which drops librdkafka's prefetch for it: all partitions paused together, the
# lanes drained, and fetching started again from nothing (1 ms of I/O per 100 records on 4
# lanes: 69k records/s with 30 pauses per 300,000 records, 191k without the limit; with
# back-pressure 120k and 4 pauses at a limit of 10,000, 256k and none at the default
# 50,000). Never longer than BACKPRESSURE_MAX_S at a time without a poll
# (max.poll.interval.ms).
LANE_BACKLOG_BATCHES = 4
BACKPRESSURE_MAX_S = 1.0
COMMIT_ANSWER_WAIT_S = 30.0  # an asynchronous commit unanswered this long no longer blocks


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class _Lane:
    """One thread and its queue, or (``inline``: a first stage with ``parallelism=0``) no
    thread: the polling thread calls ``process`` itself. The first stage's lanes receive
    ``(RootBatch, indices)`` (indices None: the whole batch) and settle each batch with one
    locked call; later stages receive items one by one."""

    def __init__(self, runtime: ReliableConsumer, stage_index: int, lane: int,
                 maxsize: int, inline: bool = False) -> None:
        self.runtime = runtime
        self.stage_index = stage_index
        self.stage = runtime.topology.stages[stage_index]
        self.inline = inline
        # an unbounded queue (the first stage's: bounded by back-pressure, LANE_BACKLOG_
        # BATCHES, and max_uncommitted_offsets) is a
        # SimpleQueue: put and get are one C call each, and a put wakes a waiting lane once;
        # queue.Queue's Condition wakes it, then the lane blocks again on the Condition's lock
        # that put still holds (two context switches and GIL transfers per hand-off)
        self.queue: queue.SimpleQueue[object] | queue.Queue[object] = (
            queue.SimpleQueue() if maxsize == 0 else queue.Queue(maxsize))
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"headrace-reliable-{self.stage.name}-{lane}")
        # the first stage's hand-offs to this lane (written by the polling thread only) and
        # those it finished (written by the lane only): sent - done is its backlog
        self.sent = 0
        self.done = 0
        self.worker: ProcessWorker | None = None
        if self.stage.kind == "process":
            self.worker = ProcessWorker(cast(ProcessHandler, self.stage.handler),
                                        f"headrace-reliable-{self.stage.name}-{lane}")

    def start(self) -> None:
        if self.worker is not None:
            self.worker.start()  # before the thread: the first batch finds it ready
        if self.inline:
            if self.stage.kind == "async":
                self.loop = asyncio.new_event_loop()
        else:
            self.thread.start()

    def stop(self) -> None:
        if self.inline:
            if self.loop is not None:
                self.loop.close()
        else:
            self.queue.put(_STOP)

    def put(self, obj: object) -> None:
        if self.inline:
            self.process(obj)
        else:
            self.queue.put(obj)

    def _run(self) -> None:
        if self.stage.kind == "async":
            self.loop = asyncio.new_event_loop()
        try:
            get, process = self.queue.get, self.process
            first = self.stage_index == 0
            while True:
                obj = get()
                if obj is _STOP:
                    return
                process(obj)
                # drop the batch before waiting for the next: else its records (GC-tracked
                # Message objects) stay alive until the next hand-off, survive the young
                # generation while the polling thread fetches more, and cost collections
                del obj
                if first:
                    self.done += 1
                    self.runtime._lane_finished.set()
        finally:
            if self.loop is not None:
                self.loop.close()
            if self.worker is not None:
                self.worker.stop()

    def process(self, obj: object) -> None:
        runtime = self.runtime
        stage = self.stage
        if type(obj) is tuple:
            batch, indices = cast(tuple[RootBatch, list[int] | None], obj)
            if not self.inline:
                with runtime._lock:
                    live = runtime.spout.is_batch_live(batch)
                if not live:
                    return  # every root settled, or the partition was revoked
            if stage.kind == "batch":
                self._run_batch(stage, batch)
            elif stage.kind == "process":
                self._run_process(batch, indices)
            elif self.loop is not None:
                self.loop.run_until_complete(self._run_async(stage, batch, indices))
            else:
                self._run_roots(stage, batch, indices)
        else:
            self._run_item(stage, cast(Item, obj))

    def _indices(self, batch: RootBatch, indices: list[int] | None) -> Sequence[int]:
        states = batch.states
        every = range(len(states)) if indices is None else indices
        if batch.pending == len(states):
            return every
        return [i for i in every if states[i] == PENDING]  # a root timed out meanwhile

    def _run_roots(self, stage: Stage, batch: RootBatch, indices: list[int] | None) -> None:
        runtime = self.runtime
        failed: dict[int, str] = {}
        if stage.basic:
            handler = cast(BasicHandler, stage.handler)
            out = _BasicCollector(runtime, self.stage_index, None)
            acked = ItemState.ACKED
            for i in self._indices(batch, indices):
                # a root item not registered with the batch unless its tree grows (an emit
                # registers it) or it fails: the batch settles unregistered roots in bulk
                items = batch._items
                item = items.get(i) if items else None
                if item is None:
                    item = RootItem(batch, i)
                out.anchor = item
                try:
                    handler(item, out)
                except Exception as exc:
                    failed[i] = f"{type(exc).__name__}: {exc}"
                    continue
                if not item.item_id:
                    item.state = acked
            with runtime._lock:
                runtime.spout.ack_batch(batch, _now_ms(), failed, indices)
            return
        explicit = cast(Handler, stage.handler)
        for i in self._indices(batch, indices):
            self._call_explicit(stage, explicit, batch.item(i))

    def _run_batch(self, stage: Stage, batch: RootBatch) -> None:
        runtime = self.runtime
        view = Batch(batch, lambda values, anchors: runtime.emit(0, values, anchors))
        try:
            cast(BatchHandler, stage.handler)(view)
            failed = view.failed
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            failed = {i: error for i in range(len(batch))}
        with runtime._lock:
            runtime.spout.ack_batch(batch, _now_ms(), failed)

    def _run_process(self, batch: RootBatch, indices: list[int] | None) -> None:
        """Ship the batch's pending roots to this lane's worker process and settle them with
        its results; if the worker dies, fail them (they are replayed) and restart it."""
        runtime = self.runtime
        worker = self.worker
        assert worker is not None
        chosen = list(self._indices(batch, indices))
        if not chosen:
            return  # every root timed out meanwhile
        fields = [record_fields(batch.source_of(i)) for i in chosen]
        failed: dict[int, str] = {}
        try:
            results = worker.call(fields)
        except WorkerDied as exc:
            log.warning("%s; failing %d records of %s, restarting it", exc, len(chosen),
                        batch.tp)
            with runtime._lock:
                runtime.spout.ack_batch(batch, _now_ms(), dict.fromkeys(chosen, str(exc)),
                                        chosen)
            try:
                worker.restart()
            except WorkerDied:
                log.exception("could not restart %s; retrying at its next batch",
                              worker.name)
            return
        for i, result in zip(chosen, results, strict=True):
            if result is None:
                continue
            if isinstance(result, str):
                failed[i] = result
                continue
            try:
                root = batch.item(i)
                for values in result:
                    runtime.emit(self.stage_index, values, (root,))
            except ReliableUsageError as exc:  # no next stage, or the root timed out
                failed[i] = f"ReliableUsageError: {exc}"
        with runtime._lock:
            runtime.spout.ack_batch(batch, _now_ms(), failed, chosen)

    async def _run_async(self, stage: Stage, batch: RootBatch,
                         indices: list[int] | None) -> None:
        runtime = self.runtime
        handler = cast(AsyncHandler, stage.handler)
        failed: dict[int, str] = {}
        limit = asyncio.Semaphore(stage.concurrency)

        async def one(i: int) -> None:
            async with limit:
                item = batch.item(i)
                try:
                    await handler(item, _BasicCollector(runtime, self.stage_index, item))
                except Exception as exc:
                    failed[i] = f"{type(exc).__name__}: {exc}"

        async with asyncio.TaskGroup() as tg:
            for i in self._indices(batch, indices):
                tg.create_task(one(i))
        with runtime._lock:
            runtime.spout.ack_batch(batch, _now_ms(), failed, indices)

    def _run_item(self, stage: Stage, item: Item) -> None:
        runtime = self.runtime
        with runtime._lock:
            live = runtime.spout.is_live(item)
        if not live:
            return  # its tree failed or its partition was revoked: do not run it
        if stage.basic:
            try:
                cast(BasicHandler, stage.handler)(
                    item, _BasicCollector(runtime, self.stage_index, item))
                runtime.ack(item)
            except Exception as exc:
                if item.state is ItemState.PENDING:
                    runtime.fail(item, f"{type(exc).__name__}: {exc}")
                else:
                    log.exception("stage %s raised after finishing its item", stage.name)
            return
        self._call_explicit(stage, cast(Handler, stage.handler), item)

    def _call_explicit(self, stage: Stage, handler: Handler, item: Item) -> None:
        runtime = self.runtime
        try:
            handler(item, runtime.collectors[self.stage_index])
        except Exception as exc:
            if item.state is ItemState.PENDING:
                runtime.fail(item, f"{type(exc).__name__}: {exc}")
            else:
                log.exception("stage %s raised after finishing its item", stage.name)


class _Collector:
    def __init__(self, runtime: ReliableConsumer, stage_index: int) -> None:
        self.runtime = runtime
        self.stage_index = stage_index

    def emit(self, values: tuple[Any, ...], anchors: Sequence[Item] = ()) -> Item:
        return self.runtime.emit(self.stage_index, values, anchors)

    def ack(self, item: Item) -> None:
        self.runtime.ack(item)

    def fail(self, item: Item, error: str = "failed") -> None:
        self.runtime.fail(item, error)


class _BasicCollector:
    __slots__ = ("anchor", "runtime", "stage_index")

    def __init__(self, runtime: ReliableConsumer, stage_index: int,
                 anchor: Item | None) -> None:
        self.runtime = runtime
        self.stage_index = stage_index
        self.anchor = anchor

    def emit(self, values: tuple[Any, ...]) -> Item:
        assert self.anchor is not None
        return self.runtime.emit(self.stage_index, values, (self.anchor,))


class ReliableConsumer:
    """Storm-grade at-least-once processing of Kafka topics (R-REL-1..6).

    ``config`` is a confluent-kafka consumer config (``bootstrap.servers``, ``group.id``,
    ...); auto-commit and auto offset store are forced off. ``topology`` is a ``Topology``
    or one basic-bolt function run on ``concurrency`` lanes.

    ``share=True``: the transport is a share group (KIP-932; ``group.id`` names it): a
    ``ShareConsumer`` in explicit acknowledgement mode and a ``ShareSpout``. A tree's
    completion acknowledges its record with ACCEPT, a failure with RELEASE (the broker
    redelivers it, to any member, with its delivery count raised), and after
    ``max_retries`` failed deliveries the record goes to ``dead_letter_topic`` and is then
    REJECTed. Any number of members share one partition. The options that only make sense
    for partitions (``max_uncommitted_offsets``, ``offset_commit_period_ms``,
    ``retry_backoff_ms``, ``retry_backoff_max_ms``, ``offset_store``, ``on_commit``) are
    refused with ``ReliableConfigError``. The share consumer polls only when every record
    of its previous poll is acknowledged (confluent-kafka's explicit mode requires it), so
    a poll's records are split over the first stage's lanes (one chunk each) and the next
    poll follows their settlement.
    """

    # one of each pair exists: the partition mode's, or the share mode's
    consumer: Consumer
    _pspout: ReliableSpout
    share_consumer: ShareConsumer
    _sspout: ShareSpout

    def __init__(self, config: dict[str, Any], topics: list[str],
                 topology: Topology | BasicHandler, *, share: bool = False,
                 concurrency: int = 4,
                 max_uncommitted_offsets: int | None = None,
                 offset_commit_period_ms: int | None = None,
                 max_retries: int | None = None, retry_backoff_ms: int | None = None,
                 retry_backoff_max_ms: int | None = None, message_timeout_ms: int = 30_000,
                 num_ackers: int = 1, dead_letter_topic: str | None = None,
                 offset_store: SqliteOffsetStore | None = None,
                 track: Callable[[Record], bool] | None = None,
                 producer_config: dict[str, Any] | None = None,
                 on_commit: Callable[[dict[TopicPartition, int]], None] | None = None,
                 poll_batch: int = 500, poll_timeout_s: float = 0.05,
                 busy_poll_timeout_s: float = 0.001,
                 stage_queue_size: int = 1_000) -> None:
        if isinstance(topology, Topology):
            self.topology = topology
        else:
            self.topology = Topology().basic_bolt("handler", topology, concurrency)
        if not self.topology.stages:
            raise ReliableConfigError("the topology has no stage")
        if max_retries is not None and dead_letter_topic is None:
            raise ReliableConfigError("max_retries needs a dead_letter_topic")
        self.share = share
        if share:
            partition_only = {
                "max_uncommitted_offsets": max_uncommitted_offsets,
                "offset_commit_period_ms": offset_commit_period_ms,
                "retry_backoff_ms": retry_backoff_ms,
                "retry_backoff_max_ms": retry_backoff_max_ms,
                "offset_store": offset_store, "on_commit": on_commit}
            given = sorted(k for k, v in partition_only.items() if v is not None)
            if given:
                raise ReliableConfigError(
                    f"{', '.join(given)}: only for partition mode, not with share=True "
                    "(a share group acknowledges records: no offsets, no seek)")
        self.topics = list(topics)
        # one topic, no pattern: every fetched record is of it (no topic check per poll)
        self._one_topic = len(self.topics) == 1 and not self.topics[0].startswith("^")
        self.spout: SpoutBase
        if share:
            self._sspout = self.spout = ShareSpout(ShareSpoutConfig(
                max_retries=max_retries, message_timeout_ms=message_timeout_ms,
                num_ackers=num_ackers), _now_ms())
        else:
            self._pspout = self.spout = ReliableSpout(SpoutConfig(
                max_uncommitted_offsets=(50_000 if max_uncommitted_offsets is None
                                         else max_uncommitted_offsets),
                offset_commit_period_ms=(5_000 if offset_commit_period_ms is None
                                         else offset_commit_period_ms),
                max_retries=max_retries,
                retry_backoff_ms=100 if retry_backoff_ms is None else retry_backoff_ms,
                retry_backoff_max_ms=(10_000 if retry_backoff_max_ms is None
                                      else retry_backoff_max_ms),
                message_timeout_ms=message_timeout_ms, num_ackers=num_ackers), _now_ms())
        self.dead_letter_topic = dead_letter_topic
        self.offset_store = offset_store
        self.on_commit = on_commit
        self._commit_in_flight = False  # an asynchronous commit not yet answered
        self._lane_finished = threading.Event()  # a first-stage lane finished a batch
        self._backlogged_since: float | None = None
        self._commit_sent_at = 0.0
        self._track = track
        self._poll_batch = poll_batch
        self._poll_timeout_s = poll_timeout_s
        self._busy_poll_timeout_s = min(poll_timeout_s, busy_poll_timeout_s)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        if share:
            # max.poll.records bounds what one member acquires per poll (the rest stays
            # available to the other members); explicit mode: we acknowledge each record
            self.share_consumer = ShareConsumer({"max.poll.records": poll_batch, **config,
                                                 "share.acknowledgement.mode": "explicit"})
            self.share_consumer.set_acknowledgement_commit_callback(self._on_acknowledged)
        else:
            # librdkafka stops fetching for fetch.queue.backoff.ms (1 s by default) whenever
            # its queue holds queued.min.messages: a consumer that drains 100k records in
            # less than a second would then sit idle for the rest of it (seen as a 5x
            # throughput loss)
            # the periodic (and early) commits are asynchronous, as Kafka's commitAsync:
            # librdkafka reports each on the polling thread during consume(), and the spout
            # counts the offsets committed only then (a synchronous one held the polling
            # thread for a round trip each time: 7% of a no-op handler's run)
            self._config_on_commit = config.get("on_commit")
            self.consumer = Consumer({"fetch.queue.backoff.ms": 10, **config,
                                      "enable.auto.commit": False,
                                      "enable.auto.offset.store": False,
                                      "on_commit": self._committed_async})
        self.producer: Producer | None = None
        if dead_letter_topic is not None:
            pconf = {"bootstrap.servers": config["bootstrap.servers"],
                     **(producer_config or {})}
            self.producer = Producer(pconf)
        self.collectors = [_Collector(self, i) for i in range(len(self.topology.stages))]
        self._lanes: list[list[_Lane]] = [
            [_Lane(self, i, 0, 0, inline=True)]
            if stage.parallelism == 0 else
            [_Lane(self, i, n, 0 if i == 0 else stage_queue_size)
             for n in range(stage.parallelism)]
            for i, stage in enumerate(self.topology.stages)]
        self._round_robin = [0] * len(self._lanes)
        first = self.topology.stages[0]
        self._caller_runs = (first.kind in _CALLER_RUNS_KINDS and first.fields is None
                             and not self._lanes[0][0].inline)
        # µs per record of the batches run on the polling thread (None: none run yet)
        self._handler_us: float | None = None
        self._probe_in = 0
        self._clock = time.perf_counter
        for lanes in self._lanes:
            for lane in lanes:
                lane.start()
        if share:
            self.share_consumer.subscribe(self.topics)
        else:
            self.consumer.subscribe(self.topics, on_assign=self._on_assign,
                                    on_revoke=self._on_revoke, on_lost=self._on_lost)

    def _dead_letter_spout(self) -> ReliableSpout | ShareSpout:
        return self._sspout if self.share else self._pspout

    def worker_pids(self) -> list[int]:
        """The pids of the process lanes' worker processes (process bolts)."""
        return [lane.worker.pid for lanes in self._lanes for lane in lanes
                if lane.worker is not None and lane.worker.pid is not None]

    # ------------------------------------------------------------------ handlers' calls

    def emit(self, stage_index: int, values: tuple[Any, ...], anchors: Sequence[Item]) -> Item:
        nxt = stage_index + 1
        if nxt >= len(self._lanes):
            raise ReliableUsageError(
                f"stage {self.topology.stages[stage_index].name} has no downstream stage")
        with self._lock:
            item = self.spout.emit(values, anchors)
        self._dispatch(nxt, item)
        return item

    def ack(self, item: Item) -> None:
        with self._lock:
            self.spout.ack(item, _now_ms())

    def fail(self, item: Item, error: str = "failed") -> None:
        with self._lock:
            self.spout.fail(item, _now_ms(), error)

    def _dispatch(self, stage_index: int, item: Item) -> None:
        lanes = self._lanes[stage_index]
        stage: Stage = self.topology.stages[stage_index]
        if len(lanes) == 1:
            lane = lanes[0]
        elif stage.fields is not None:
            lane = lanes[hash(stage.fields(item)) % len(lanes)]
        else:
            self._round_robin[stage_index] = (self._round_robin[stage_index] + 1) % len(lanes)
            lane = lanes[self._round_robin[stage_index]]
        lane.put(item)

    # ------------------------------------------------------------------ the poll loop

    def stop(self) -> None:
        """Ask ``run`` to return (thread-safe; from a signal handler too)."""
        self._stop.set()

    def run(self, max_duration_s: float | None = None) -> None:
        deadline = None if max_duration_s is None else time.monotonic() + max_duration_s
        while not self._stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return
            self.poll_once()

    def poll_once(self) -> int:
        """One poll: process the fetched records and carry out due effects. Returns the
        number of root items dispatched."""
        if self.share:
            return self._share_poll_once()
        if self._held_back():
            with self._lock:
                effects = self._pspout.tick(_now_ms())
            self._apply(effects)
            return 0
        messages = self.consumer.consume(self._poll_batch, self._consume_timeout_s())
        now = _now_ms()
        batches: list[RootBatch] = []
        if messages:
            runs = _partition_runs(messages, self._one_topic)
            track = self._track
            on_batch = self._pspout.on_batch
            with self._lock:
                for tp, run, offsets in runs:
                    if track is not None:
                        for m, o in zip(run, offsets, strict=True):
                            b = on_batch(tp, (o,), now, payloads=(m,),
                                         tracked=track(_record(m)), to_source=_record,
                                         to_values=_key_value)
                            if b is not None:
                                batches.append(b)
                        continue
                    b = on_batch(tp, offsets, now, payloads=run, to_source=_record,
                                 to_values=_key_value)
                    if b is not None:
                        batches.append(b)
                effects = self._pspout.tick(now)
        else:
            with self._lock:
                effects = self._pspout.tick(now)
        for b in batches:
            self._dispatch_batch(b)
        self._apply(effects)
        if self.producer is not None:
            self.producer.poll(0)
        return sum(len(b) for b in batches)

    def _held_back(self) -> bool:
        """Back-pressure (``LANE_BACKLOG_BATCHES``): True, after waiting up to a poll
        timeout for a lane to finish a batch, while the first stage's lanes are that far
        behind, for at most ``BACKPRESSURE_MAX_S`` in a row."""
        lanes = self._lanes[0]
        if lanes[0].inline:  # parallelism=0: the polling thread runs the stage itself
            return False
        self._lane_finished.clear()
        backlog = sum(lane.sent - lane.done for lane in lanes)  # racy reads: off by one
        if backlog < LANE_BACKLOG_BATCHES * len(lanes):
            self._backlogged_since = None
            return False
        now = time.monotonic()
        if self._backlogged_since is None:
            self._backlogged_since = now
        elif now - self._backlogged_since >= BACKPRESSURE_MAX_S:
            self._backlogged_since = None
            return False  # poll once: the group must see this consumer alive
        self._lane_finished.wait(self._poll_timeout_s)
        return True

    def _consume_timeout_s(self) -> float:
        """How long ``consume`` may wait for records: ``poll_timeout_s``, or, while roots
        are pending (queued on or run by lanes, or held by a bolt), ``busy_poll_timeout_s``:
        the polling thread then sees the lanes' acks soon after they happen instead of
        sitting out a whole poll timeout on an empty fetch queue (the tick after them
        commits and resumes paused partitions; ``close`` returns once its drain is done).
        1 ms by default: an empty poll costs ~30 µs of CPU (measured), so up to ~3% of a core
        while roots are pending and nothing arrives. An int read without the lock: a stale
        value picks the other timeout for one poll."""
        if self.spout.num_pending_roots:
            return self._busy_poll_timeout_s
        return self._poll_timeout_s

    def _dispatch_batch(self, batch: RootBatch) -> None:
        lanes = self._lanes[0]
        stage = self.topology.stages[0]
        if self._caller_runs and self._run_here(lanes, batch):
            return
        if len(lanes) == 1:
            if not lanes[0].inline:  # an inline stage has no backlog: it runs in put
                lanes[0].sent += 1
            lanes[0].put((batch, None))
        elif stage.fields is not None:
            fields = stage.fields
            split: dict[int, list[int]] = {}
            for i in range(len(batch)):
                split.setdefault(hash(fields(batch.item(i))) % len(lanes), []).append(i)
            for lane_no, indices in split.items():
                lanes[lane_no].put((batch, indices))
        else:
            lane = self._first_stage_lane(lanes)
            lane.sent += 1
            lane.put((batch, None))

    def _run_here(self, lanes: list[_Lane], batch: RootBatch) -> bool:
        """Run ``batch`` on the polling thread (see ``CALLER_RUNS_MAX_US``) if every lane
        is idle and the handler is quick, or a probe is due; True when it was run."""
        for lane in lanes:
            if lane.sent != lane.done:  # read without a lock: only the lane raises done
                return False
        if self._handler_us is not None and self._handler_us > CALLER_RUNS_MAX_US:
            self._probe_in -= 1
            if self._probe_in > 0:
                return False
        self._probe_in = CALLER_RUNS_PROBE_EVERY
        n = len(batch)
        t0 = self._clock()
        lanes[0].process((batch, None))
        us = (self._clock() - t0) * 1e6 / max(n, 1)
        self._handler_us = us if self._handler_us is None else 0.8 * self._handler_us + 0.2 * us
        return True

    def _first_stage_lane(self, lanes: list[_Lane]) -> _Lane:
        """The lane for the first stage's next batch (no fields grouping): see
        ``_sticky_lane``. The backlogs are read without a lock: a stale one moves one batch
        to another lane."""
        current = _sticky_lane([lane.sent - lane.done for lane in lanes], self._round_robin[0])
        self._round_robin[0] = current
        return lanes[current]

    def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Commit):
                self._commit_async(effect.offsets)
            elif isinstance(effect, Seek):
                tp = effect.tp
                try:
                    self.consumer.seek(KafkaTopicPartition(tp.topic, tp.partition,
                                                           effect.offset))
                except KafkaException as exc:
                    log.warning("seek %s to %d failed (%s); will retry", tp, effect.offset, exc)
                    with self._lock:
                        self._pspout.seek_failed(tp)
            elif isinstance(effect, Pause):
                self.consumer.pause([KafkaTopicPartition(effect.tp.topic, effect.tp.partition)])
            elif isinstance(effect, Resume):
                self.consumer.resume([KafkaTopicPartition(effect.tp.topic,
                                                          effect.tp.partition)])
            elif isinstance(effect, DeadLetter):
                self._dead_letter(effect)

    def _commit_async(self, offsets: dict[TopicPartition, int]) -> None:
        """Send a commit and go on; ``_committed_async`` takes its answer. One at a time:
        while one is unanswered the spout's later Commit effects are dropped (it asks
        again on a later tick, with offsets at least as far). An answer that never comes
        (librdkafka always answers, if only with an error) stops holding commits back after
        COMMIT_ANSWER_WAIT_S."""
        if not offsets:
            return
        now = time.monotonic()
        if self._commit_in_flight and now - self._commit_sent_at < COMMIT_ANSWER_WAIT_S:
            return
        try:
            self.consumer.commit(offsets=[KafkaTopicPartition(tp.topic, tp.partition, o)
                                          for tp, o in offsets.items()], asynchronous=True)
        except KafkaException as exc:
            log.warning("commit %s failed: %s", offsets, exc)
            return
        self._commit_in_flight = True
        self._commit_sent_at = now

    def _committed_async(self, err: KafkaError | None,
                         partitions: list[KafkaTopicPartition]) -> None:
        """librdkafka's answer to an asynchronous commit (on the polling thread, in
        consume()): the offsets it committed count as committed now."""
        self._commit_in_flight = False
        if self._config_on_commit is not None:
            self._config_on_commit(err, partitions)
        if err is not None:
            log.warning("commit failed: %s", err)
            return
        done = {TopicPartition(kp.topic, kp.partition): kp.offset for kp in partitions
                if kp.error is None and kp.offset >= 0}
        if not done:
            return
        with self._lock:
            self._pspout.committed(done)
        if self.on_commit is not None:
            self.on_commit(done)

    def _commit(self, offsets: dict[TopicPartition, int]) -> bool:
        if not offsets:
            return True
        try:
            self.consumer.commit(offsets=[KafkaTopicPartition(tp.topic, tp.partition, o)
                                          for tp, o in offsets.items()], asynchronous=False)
        except KafkaException as exc:
            log.warning("commit %s failed: %s", offsets, exc)
            return False
        with self._lock:
            self._pspout.committed(offsets)
        if self.on_commit is not None:
            self.on_commit(offsets)
        return True

    def _dead_letter(self, effect: DeadLetter) -> None:
        assert self.producer is not None and self.dead_letter_topic is not None
        rec = cast(Record, effect.payload)
        headers: list[tuple[str, str | bytes | None]] = [*rec.headers,
                   (DLQ_HEADER_TOPIC, rec.topic.encode()),
                   (DLQ_HEADER_PARTITION, str(rec.partition).encode()),
                   (DLQ_HEADER_OFFSET, str(rec.offset).encode()),
                   (DLQ_HEADER_ERROR, effect.error.encode()),
                   (DLQ_HEADER_ATTEMPTS, str(effect.attempts).encode())]
        tp = effect.tp

        def delivered(err: Any, _msg: Any) -> None:
            with self._lock:
                spout = self._dead_letter_spout()
                if err is None:
                    spout.dead_lettered(tp, effect.offset)
                else:
                    log.warning("dead letter of %s@%d failed: %s", tp, effect.offset, err)
                    spout.dead_letter_failed(tp, effect.offset, _now_ms())

        self.producer.produce(self.dead_letter_topic, rec.value, rec.key, headers=headers,
                              on_delivery=delivered)

    # ------------------------------------------------------------------ share mode

    def _share_poll_once(self) -> int:
        """Share mode's poll: only once every record of the previous poll is acknowledged
        (else wait up to ``busy_poll_timeout_s`` for the lanes); the records are split over
        the first stage's lanes; the acknowledgements due are applied and committed."""
        spout = self._sspout
        with self._lock:
            settled = spout.is_settled()
        batches: list[RootBatch] = []
        if settled:
            try:
                messages = list(self.share_consumer.poll(self._poll_timeout_s))
            except (KafkaException, IllegalStateException) as exc:
                log.warning("share poll failed: %s", exc)
                self._stop.wait(self._poll_timeout_s)
                messages = []
            now = _now_ms()
            if messages:
                runs = _share_runs(messages)
                track = self._track
                parts = self._share_chunks()
                with self._lock:
                    for tp, run, offsets, counts in runs:
                        if track is not None:
                            for m, o, d in zip(run, offsets, counts, strict=True):
                                b = spout.on_batch(tp, (o,), (d,), now, payloads=(m,),
                                                   tracked=track(_share_record(m)),
                                                   to_source=_share_record,
                                                   to_values=_key_value)
                                if b is not None:
                                    batches.append(b)
                            continue
                        step = -(-len(run) // parts)
                        for k in range(0, len(run), step):
                            b = spout.on_batch(tp, offsets[k:k + step], counts[k:k + step],
                                               now, payloads=run[k:k + step],
                                               to_source=_share_record,
                                               to_values=_key_value)
                            if b is not None:
                                batches.append(b)
                    effects = spout.tick(now)
            else:
                with self._lock:
                    effects = spout.tick(now)
        else:
            self._stop.wait(self._busy_poll_timeout_s)  # the lanes settle meanwhile
            with self._lock:
                effects = spout.tick(_now_ms())
        for i, batch in enumerate(batches):
            self._dispatch_share_batch(batch, i)
        self._apply_share(effects)
        if self.producer is not None:
            self.producer.poll(0)
        return sum(map(len, batches))

    def _share_chunks(self) -> int:
        """Into how many batches a poll's run of one partition is cut: one per lane of the
        first stage (its lanes then work on one poll together), 1 with fields grouping
        (split per key by ``_dispatch_batch``) or an inline stage."""
        stage = self.topology.stages[0]
        if stage.fields is not None:
            return 1
        return max(1, len(self._lanes[0]))

    def _dispatch_share_batch(self, batch: RootBatch, index: int) -> None:
        lanes = self._lanes[0]
        if len(lanes) == 1 or self.topology.stages[0].fields is not None:
            self._dispatch_batch(batch)
            return
        lane = lanes[index % len(lanes)]
        lane.sent += 1
        lane.put((batch, None))

    def _apply_share(self, effects: list[ShareEffect]) -> None:
        """Acknowledge (``commit_async`` once for all of them) and dead-letter."""
        consumer = self.share_consumer
        acknowledged = False
        for effect in effects:
            if isinstance(effect, Acknowledge):
                tp, kind = effect.tp, _ACK_TYPES[effect.ack_type]
                for offset in effect.offsets:
                    try:
                        consumer.acknowledge_offset(tp.topic, tp.partition, offset, kind)
                    except (KafkaException, IllegalStateException) as exc:
                        # no longer in flight (e.g. its lock expired): the broker redelivers
                        log.warning("acknowledge %s@%d %s failed: %s", tp, offset,
                                    effect.ack_type.name, exc)
                    else:
                        acknowledged = True
            else:
                self._dead_letter(effect)
        if acknowledged:
            try:
                consumer.commit_async()
            except KafkaException as exc:
                log.warning("commit of acknowledgements failed: %s", exc)

    def _on_acknowledged(self, offsets: dict[KafkaTopicPartition, set[int]],
                         error: KafkaException | None) -> None:
        """The broker's answer to a commit of acknowledgements (on the polling thread)."""
        if error is not None:
            log.warning("acknowledgements %s failed: %s (their records are redelivered)",
                        {(tp.topic, tp.partition): sorted(o) for tp, o in offsets.items()},
                        error)

    def _close_share(self, drain_timeout_s: float) -> None:
        """Share mode's close: drain (no poll), flush dead letters, release what is still
        pending, commit the acknowledgements synchronously."""
        spout = self._sspout
        deadline = time.monotonic() + drain_timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                effects = spout.tick(_now_ms())
                done = spout.num_pending_roots == 0
            self._apply_share(effects)
            if self.producer is not None:
                self.producer.poll(0)
            with self._lock:
                if done and spout.is_settled():
                    break
            self._stop.wait(self._busy_poll_timeout_s)
        if self.producer is not None:
            self.producer.flush(max(0.0, deadline - time.monotonic()))
        with self._lock:
            spout.release_all()
            effects = spout.tick(_now_ms())
        self._apply_share(effects)
        try:
            self.share_consumer.commit_sync(10)
        except (KafkaException, IllegalStateException) as exc:
            log.warning("final commit of acknowledgements failed: %s", exc)

    # ------------------------------------------------------------------ rebalance

    def _on_assign(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        committed = consumer.committed(partitions, timeout=10)
        starts: dict[TopicPartition, int | None] = {}
        for kp in committed:
            tp = TopicPartition(kp.topic, kp.partition)
            starts[tp] = kp.offset if kp.offset >= 0 else None
        if self.offset_store is not None:
            for kp in partitions:
                tp = TopicPartition(kp.topic, kp.partition)
                base = starts[tp]
                if base is None:
                    watermarks = consumer.get_watermark_offsets(kp, timeout=10)
                    base = 0 if watermarks is None else int(watermarks[0])
                start = self.offset_store.start_offset(tp.topic, tp.partition, base)
                kp.offset = start
                starts[tp] = start
            protocol = getattr(consumer, "rebalance_protocol", lambda: "EAGER")()
            if protocol == "COOPERATIVE":  # not in confluent-kafka's type stubs
                consumer.incremental_assign(partitions)  # seek-on-assign, these only
            else:
                consumer.assign(partitions)  # seek-on-assign
        with self._lock:
            for tp, first in starts.items():
                self._pspout.assigned(tp, first)
        consumer.resume(partitions)
        log.info("assigned %s", starts)

    def _on_revoke(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        final: dict[TopicPartition, int] = {}
        with self._lock:
            for kp in partitions:
                tp = TopicPartition(kp.topic, kp.partition)
                offset = self._pspout.revoked(tp)
                if offset is not None:
                    final[tp] = offset
        if final:
            try:
                consumer.commit(offsets=[KafkaTopicPartition(tp.topic, tp.partition, o)
                                         for tp, o in final.items()], asynchronous=False)
                if self.on_commit is not None:
                    self.on_commit(final)
            except KafkaException as exc:
                log.warning("commit on revoke %s failed: %s", final, exc)
        log.info("revoked %s (final commit %s)", [(p.topic, p.partition) for p in partitions],
                 final)

    def _on_lost(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        """The group already gave these partitions to others (session lost): drop their
        state without committing — a commit now could fence or overwrite the new owner's."""
        with self._lock:
            for kp in partitions:
                self._pspout.revoked(TopicPartition(kp.topic, kp.partition))
        log.warning("lost %s", [(p.topic, p.partition) for p in partitions])

    # ------------------------------------------------------------------ shutdown

    def close(self, drain_timeout_s: float = 10.0) -> None:
        if self._closed:
            return
        self._closed = True
        if self.share:
            try:
                self._close_share(drain_timeout_s)
            finally:
                self._stop_lanes()
                self.share_consumer.close()
                if self.producer is not None:
                    self.producer.flush(10)
            return
        try:
            assignment = self.consumer.assignment()
            if assignment:
                self.consumer.pause(assignment)
            deadline = time.monotonic() + drain_timeout_s
            while time.monotonic() < deadline:
                with self._lock:
                    if self.spout.num_pending_roots == 0:
                        break
                self.consumer.consume(self._poll_batch, self._consume_timeout_s())  # callbacks
                if self.producer is not None:
                    self.producer.poll(0)
            with self._lock:
                commit = self._pspout.committable()
            self._commit(commit)
        finally:
            self._stop_lanes()
            self.consumer.close()
            if self.producer is not None:
                self.producer.flush(10)

    def _stop_lanes(self) -> None:
        for lanes in self._lanes:
            for lane in lanes:
                lane.stop()
        for lanes in self._lanes:
            for lane in lanes:
                if not lane.inline:
                    lane.thread.join(5)

    def __enter__(self) -> ReliableConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sticky_lane(backlogs: Sequence[int], current: int, sticky_below: int = 2) -> int:
    """Which lane takes the first stage's next batch, given each lane's backlog (batches
    handed to it and not yet finished) and ``current``, the lane that took the previous
    one: ``current`` while its backlog is below ``sticky_below``, else the lane with the
    smallest backlog (the first after ``current`` in round-robin order among equals).

    A lane that keeps up takes every batch, so a quick handler wakes one thread per batch
    instead of a different one each time: with strict round-robin the woken lanes queued
    for the GIL behind one another (a no-op batch bolt on 2 and 4 lanes measured 51% and
    50% of a plain consumer's records/s, 63% on 1 lane, in the same runs). Lanes that fall
    behind (handlers waiting on I/O, process lanes) hand the next batches to the others,
    the least busy first."""
    if backlogs[current] < sticky_below:
        return current
    best, fewest = current, backlogs[current]
    k = len(backlogs)
    for step in range(1, k):
        i = (current + step) % k
        if backlogs[i] < fewest:
            best, fewest = i, backlogs[i]
    return best


def _key_value(m: Message) -> tuple[Any, ...]:
    return (m.key(), m.value())


def _partition_runs(messages: list[Message], one_topic: bool = False,
                    ) -> list[tuple[TopicPartition, list[Message], list[int]]]:
    """The fetched messages grouped by partition, in fetch order, with their offsets;
    errors logged and dropped (partition EOF silently). The common case — one partition,
    no error — costs one C accessor call per message and field (``map`` over the unbound
    methods, no Python frame per message); ``one_topic`` (the subscription is one topic
    name, no pattern) skips the topics' check."""
    if list(map(Message.error, messages)).count(None) != len(messages):
        good = []
        for m in messages:
            err = m.error()
            if err is None:
                good.append(m)
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("consume error: %s", err)
        messages = good
        if not messages:
            return []
    first = messages[0]
    topic, partition = cast(str, first.topic()), cast(int, first.partition())
    parts = list(map(Message.partition, messages))
    offsets = cast(list[int], list(map(Message.offset, messages)))
    n = len(messages)
    if parts.count(partition) == n and (
            one_topic or list(map(Message.topic, messages)).count(topic) == n):
        return [(TopicPartition(topic, partition), messages, offsets)]
    # several partitions: librdkafka hands out each fetched batch whole, so the messages
    # come in runs of one partition; ``groupby`` finds the runs in C and each is sliced,
    # not appended message by message (239 -> ~20 ns per message, 500 from 4 partitions)
    keys: Iterable[Any] = (parts if one_topic
                           else zip(map(Message.topic, messages), parts, strict=True))
    runs: dict[Any, tuple[list[Message], list[int]]] = {}
    pos = 0
    for key, group in itertools.groupby(keys):
        end = pos + len(list(group))
        run = runs.get(key)
        if run is None:
            runs[key] = (messages[pos:end], offsets[pos:end])
        else:
            run[0].extend(messages[pos:end])
            run[1].extend(offsets[pos:end])
        pos = end
    if one_topic:
        return [(TopicPartition(topic, p), ms, os) for p, (ms, os) in runs.items()]
    return [(TopicPartition(t, p), ms, os) for (t, p), (ms, os) in runs.items()]


def _share_runs(messages: list[Message],
                ) -> list[tuple[TopicPartition, list[Message], list[int], list[int]]]:
    """A share poll's messages grouped by partition, with offsets and delivery counts;
    errors logged and dropped. A delivery count the broker sent that is not a positive
    int is taken as 1 (the record is then processed, never dropped; a peer's bad field
    must not stop the consumer)."""
    runs: dict[tuple[str, int], tuple[list[Message], list[int], list[int]]] = {}
    for m in messages:
        err = m.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("share consume error: %s", err)
            continue
        topic, partition, offset = m.topic(), m.partition(), m.offset()
        if topic is None or partition is None or offset is None or offset < 0:
            log.warning("share record without topic, partition or offset dropped")
            continue
        count = m.delivery_count()
        if not isinstance(count, int) or count < 1:
            count = 1
        run = runs.get((topic, partition))
        if run is None:
            run = runs[(topic, partition)] = ([], [], [])
        run[0].append(m)
        run[1].append(offset)
        run[2].append(count)
    return [(TopicPartition(t, p), ms, os, ds) for (t, p), (ms, os, ds) in runs.items()]


def _share_record(m: Message) -> Record:
    """``_record`` with the record's delivery count (share mode)."""
    rec = _record(m)
    count = m.delivery_count()
    return dataclasses.replace(rec, delivery_count=count if isinstance(count, int) else None)


_ACK_TYPES = {AckType.ACCEPT: AcknowledgeType.ACCEPT, AckType.RELEASE: AcknowledgeType.RELEASE,
              AckType.REJECT: AcknowledgeType.REJECT}


def _record(m: Message) -> Record:
    topic = m.topic()
    partition = m.partition()
    offset = m.offset()
    assert topic is not None and partition is not None and offset is not None
    ts_type, ts = m.timestamp()
    raw = m.headers() or []
    pairs: list[tuple[str, Any]] = list(raw.items()) if isinstance(raw, dict) else list(raw)
    headers = tuple((k, v if isinstance(v, bytes) else b"" if v is None else str(v).encode())
                    for k, v in pairs)
    key = m.key()
    value = m.value()
    return Record(topic, partition, offset,
                  key if isinstance(key, bytes) or key is None else bytes(key),
                  value if isinstance(value, bytes) or value is None else bytes(value),
                  headers, ts if ts_type != 0 else None)


__all__ = ["BasicOutputCollector", "OutputCollector", "ReliableConsumer"]
