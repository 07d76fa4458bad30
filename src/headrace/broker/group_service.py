"""The asyncio shell around the pure ``GroupCoordinator`` (``broker.groups``).

What it does, and nothing more:

- places groups: a group belongs to partition ``offsets_partition_for(group_id, n)`` of
  ``__consumer_offsets`` (R-GRP-2); this broker coordinates the groups of the partitions it
  leads. The topic is created on first use (``offsets.topic.num.partitions`` partitions,
  ``cleanup.policy=compact``, 100 MiB segments);
- loads: when the broker starts (if the topic exists) or creates the topic, each led
  partition is read from its log start to its high watermark and replayed into the
  coordinator. Loading is synchronous, before the listener accepts, so
  COORDINATOR_LOAD_IN_PROGRESS is answered only while ``loading`` is non-empty (a later
  cluster issue loads on leadership change);
- loads KIP-848 consumer groups too (R-GRP-6/7): the coordinator rebuilds them from their
  ConsumerGroup* records with groups made by ``new_consumer_group`` (the broker's
  ``group.consumer.*`` configs), members' sessions restarting at the load time;
- writes: ``append_group_records`` appends one uncompressed batch to the group's partition
  and waits for the high watermark (acks=all); group records queued by the coordinator
  are appended right after each operation (``flush``, one batch per group), and a failed
  append is reported back (``records_failed``) so a consumer group rewrites itself whole.
  ConsumerGroupHeartbeat uses ``flush_and_wait(group_id)``: its records are appended and
  committed before the response, as Kafka writes before it responds;
- parks: JoinGroup/SyncGroup answers the coordinator defers are futures keyed by
  ``(group_id, ticket)``, completed from ``take_completions()`` after every operation and
  every tick;
- ticks: a supervised loop calls ``coordinator.tick(now)`` every ``TICK_S``; it ends when the
  broker stops, and ``close`` wakes every parked request (JoinGroup gets
  COORDINATOR_NOT_AVAILABLE, SyncGroup REBALANCE_IN_PROGRESS).

Thread-safety: everything runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from headrace.broker.memory_pool import LogPacer
from headrace.broker.replica_manager import Partition, TopicPartition
from headrace.broker.topics import TopicError
from headrace.config import BrokerConfig
from headrace.group.assignors import DEFAULT_ASSIGNORS, Assignor, assignors_from_config
from headrace.group.classic import Completion, GroupTimeouts, JoinResult, SyncResult
from headrace.group.consumer_group import (
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_SESSION_TIMEOUT_MS,
    ConsumerGroup,
)
from headrace.group.coordinator import GroupCoordinator, OffsetWrite, TxnMarkerEvent
from headrace.group.hashing import offsets_partition_for
from headrace.log.errors import LogError
from headrace.log.transactions import COMMIT, marker_type
from headrace.protocol.records import (
    TRANSACTIONAL_BIT,
    InvalidRecordError,
    build_batch,
    decode_records,
    iter_batches,
)
from headrace.share.group import ShareGroup

if TYPE_CHECKING:
    from headrace.broker.server import Broker

log = logging.getLogger("headrace.groups")

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_SEGMENT_BYTES = 100 * 1024 * 1024
TICK_S = 0.1
LOAD_READ_BYTES = 8 * 1024 * 1024
PLACEMENT_CACHE_MAX = 100_000
ASSIGNORS_CONFIG = "group.consumer.assignors"
SESSION_TIMEOUT_CONFIG = "group.consumer.session.timeout.ms"
HEARTBEAT_INTERVAL_CONFIG = "group.consumer.heartbeat.interval.ms"


class GroupService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config: BrokerConfig = broker.config
        self.coordinator = GroupCoordinator(GroupTimeouts(
            initial_rebalance_delay_ms=int(self.config["group.initial.rebalance.delay.ms"]),
            min_session_timeout_ms=int(self.config["group.min.session.timeout.ms"]),
            max_session_timeout_ms=int(self.config["group.max.session.timeout.ms"]),
            max_size=int(self.config["group.max.size"]),
        ))
        self.coordinator.consumer_group_factory = self.new_consumer_group
        self.coordinator.share_group_factory = self.new_share_group
        self.loading: set[int] = set()
        self._create_failed_log = LogPacer(10.0)  # clients retry FindCoordinator often
        self._waiters: dict[tuple[str, int], asyncio.Future[Completion]] = {}
        self._sync_tickets: set[tuple[str, int]] = set()
        self._closed = False
        # group id -> its __consumer_offsets partition, for the partition count it was
        # computed with (every commit needs it several times; the hash is per character)
        self._placement: dict[str, int] = {}
        self._placement_n = 0

    # ------------------------------------------------------------------ consumer groups
    def configured_assignors(self) -> tuple[Assignor, ...]:
        raw = self.config.values.get(ASSIGNORS_CONFIG, DEFAULT_ASSIGNORS)
        try:
            return assignors_from_config(str(raw))
        except ValueError as e:
            log.error("%s; using %s", e, DEFAULT_ASSIGNORS)
            return assignors_from_config(DEFAULT_ASSIGNORS)

    def new_consumer_group(self, group_id: str) -> ConsumerGroup:
        """An empty KIP-848 group with the broker's ``group.consumer.*`` configs (read with
        fallbacks to Kafka's defaults)."""
        values = self.config.values
        session_ms = int(values.get(SESSION_TIMEOUT_CONFIG, DEFAULT_SESSION_TIMEOUT_MS))
        heartbeat_ms = int(values.get(HEARTBEAT_INTERVAL_CONFIG, DEFAULT_HEARTBEAT_INTERVAL_MS))
        dynamic = getattr(self.broker, "dynamic", None)
        if dynamic is not None:  # the group's own configs (issue 27), over the broker's
            group_values = dynamic.group_values(group_id)
            session_ms = int(group_values["consumer.session.timeout.ms"])
            heartbeat_ms = int(group_values["consumer.heartbeat.interval.ms"])
        return ConsumerGroup(
            group_id,
            assignors=self.configured_assignors(),
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=heartbeat_ms,
        )

    def new_share_group(self, group_id: str) -> ShareGroup:
        """An empty share group (KIP-932) with its ``share.*`` group configs over the
        broker's ``group.share.*`` (``share_config.share_group_config``)."""
        from headrace.broker.share_config import share_group_config

        values = share_group_config(self.broker, group_id)
        return ShareGroup(group_id,
                          session_timeout_ms=int(values["share.session.timeout.ms"]),
                          heartbeat_interval_ms=int(values["share.heartbeat.interval.ms"]),
                          max_size=int(self.config["group.share.max.size"]),
                          initialize_retry_interval_ms=int(
                              self.config["group.share.initialize.retry.interval.ms"]))

    # ------------------------------------------------------------------ placement
    def now_ms(self) -> int:
        return self.broker.clock.wall_ms()

    def num_partitions(self) -> int:
        topic = self.broker.metadata.topic(OFFSETS_TOPIC)
        if topic is not None:
            return len(topic.partitions)
        return int(self.config["offsets.topic.num.partitions"])

    def partition_for(self, group_id: str) -> int:
        n = self.num_partitions()
        if n != self._placement_n:
            self._placement.clear()
            self._placement_n = n
        p = self._placement.get(group_id)
        if p is None:
            if len(self._placement) >= PLACEMENT_CACHE_MAX:
                self._placement.clear()
            p = self._placement[group_id] = offsets_partition_for(group_id, n)
        return p

    def coordinator_node(self, group_id: str) -> int | None:
        """The node leading the group's partition (creating the topic); None if none."""
        if not self.ensure_topic():
            return None
        topic = self.broker.metadata.topic(OFFSETS_TOPIC)
        assert topic is not None
        return topic.partitions[self.partition_for(group_id)].leader

    def check_coordinator(self, group_id: str) -> ErrorCode:
        if self._closed:
            return ErrorCode.coordinator_not_available
        node = self.coordinator_node(group_id)
        if node is None:
            return ErrorCode.coordinator_not_available
        if node != self.broker.node_id:
            return ErrorCode.not_coordinator
        p = self.partition_for(group_id)
        if p in self.loading:
            return ErrorCode.coordinator_load_in_progress
        hosted = self.broker.replicas.get(TopicPartition(OFFSETS_TOPIC, p))
        if hosted is None or not hosted.is_leader(self.broker.node_id):
            return ErrorCode.not_coordinator
        return ErrorCode.none

    def replication_factor(self) -> int:
        """A cluster's ``offsets.topic.replication.factor``, capped by the live brokers
        when the topic is created; a single node's ``default.replication.factor``."""
        if self.broker.cluster is None:
            return int(self.config["default.replication.factor"])
        live = len(self.broker.metadata.live_brokers())
        return max(1, min(int(self.config["offsets.topic.replication.factor"]), live))

    def ensure_topic(self) -> bool:
        if self.broker.metadata.topic(OFFSETS_TOPIC) is not None:
            return True
        try:
            self.broker.topics.create(
                OFFSETS_TOPIC, int(self.config["offsets.topic.num.partitions"]),
                self.replication_factor(),
                {"cleanup.policy": "compact", "segment.bytes": str(OFFSETS_SEGMENT_BYTES)},
            )
        except TopicError as e:
            if e.error_code == ErrorCode.topic_already_exists:
                return True
            if e.error_code == ErrorCode.leader_not_available:
                return False  # a cluster creates it in the background
            held = self._create_failed_log.ready(time.monotonic())
            if held is not None:
                log.error("cannot create %s: %s%s", OFFSETS_TOPIC, e.message,
                          f" ({held} more attempts failed since the last line)" if held else "")
            return False
        self.load_all()
        return True

    # ------------------------------------------------------------------ loading
    def load_all(self) -> None:
        """Replay every ``__consumer_offsets`` partition this broker leads."""
        topic = self.broker.metadata.topic(OFFSETS_TOPIC)
        if topic is None:
            return
        for i, state in enumerate(topic.partitions):
            if state.leader == self.broker.node_id:
                self.load_partition(i)

    # ------------------------------------------------------------------ a cluster's leadership
    def partition_led(self, tp: TopicPartition) -> None:
        """This broker now leads ``tp``: if it is a ``__consumer_offsets`` partition, load its
        groups (R-GRP-2 on a cluster: the coordinator moves with the leadership)."""
        if tp.topic == OFFSETS_TOPIC and not self._closed:
            self.unload_partition(tp.partition)  # whatever an earlier term left
            self.load_partition(tp.partition)
            log.info("coordinating the groups of %s", tp)

    def partition_unloaded(self, tp: TopicPartition) -> None:
        """This broker no longer leads ``tp``: forget its groups; their members get
        NOT_COORDINATOR and find the new coordinator."""
        if tp.topic == OFFSETS_TOPIC:
            n = self.unload_partition(tp.partition)
            if n:
                log.info("no longer coordinating the %d group(s) of %s", n, tp)

    def txn_marker(self, tp: TopicPartition, producer_id: int, commit: bool) -> None:
        """A transaction marker was appended to ``tp`` (a ``__consumer_offsets`` partition
        this broker leads): the producer's pending offsets there are decided."""
        if tp.topic == OFFSETS_TOPIC:
            self.coordinator.complete_txn(producer_id, commit)

    def unload_partition(self, index: int) -> int:
        c = self.coordinator
        gone = {g for g in list(c.groups) + list(c.offsets) if self.partition_for(g) == index}
        gone |= {g for byg in c.pending_txn.values() for g in byg
                 if self.partition_for(g) == index}
        c.forget_partition_txns(gone)
        for g in gone:
            c.groups.pop(g, None)
            c.offsets.pop(g, None)
        for (group_id, ticket), fut in list(self._waiters.items()):
            if group_id in gone:
                del self._waiters[(group_id, ticket)]
                if not fut.done():
                    if (group_id, ticket) in self._sync_tickets:
                        fut.set_result(SyncResult(ticket, ErrorCode.not_coordinator))
                    else:
                        fut.set_result(JoinResult(ticket, ErrorCode.not_coordinator, ""))
                self._sync_tickets.discard((group_id, ticket))
        return len(gone)

    def load_partition(self, index: int) -> None:
        partition = self.broker.replicas.get(TopicPartition(OFFSETS_TOPIC, index))
        if partition is None:
            return
        self.loading.add(index)
        try:
            plog = partition.log
            offset = plog.log_start_offset
            # Kafka's GroupMetadataManager loads up to the log end offset: a new leader's
            # high watermark may still be below records its followers already have
            hw = plog.log_end_offset if self.broker.cluster is not None else plog.high_watermark
            records: list[tuple[bytes | None, bytes | None]
                          | tuple[bytes | None, bytes | None, int] | TxnMarkerEvent] = []
            while offset < hw:
                data = plog.read(offset, LOAD_READ_BYTES, max_offset=hw, min_one_batch=True)
                if not data:
                    break
                for header in iter_batches(data):
                    if header.next_offset <= offset:
                        continue
                    offset = header.next_offset
                    batch = data[header.position:header.position + header.size]
                    if header.is_control:  # a transaction's marker: its offsets decided
                        try:
                            kind = marker_type(batch)
                        except InvalidRecordError:
                            continue
                        records.append(TxnMarkerEvent(header.producer_id, kind == COMMIT))
                        continue
                    txn = header.is_transactional and header.producer_id >= 0
                    for rec in decode_records(batch):
                        records.append((rec.key, rec.value, header.producer_id) if txn
                                       else (rec.key, rec.value))
            self.coordinator.load(records, self.now_ms())
            if self.coordinator.corrupt_records:
                log.warning("%d undecodable record(s) skipped in %s-%d",
                            self.coordinator.corrupt_records, OFFSETS_TOPIC, index)
                self.coordinator.corrupt_records = 0
        except (LogError, InvalidRecordError) as e:
            log.error("loading %s-%d failed: %s", OFFSETS_TOPIC, index, e)
        finally:
            self.loading.discard(index)

    # ------------------------------------------------------------------ writes
    def _append_now(
        self, group_id: str, records: Sequence[tuple[bytes, bytes | None]],
        producer_id: int = -1, producer_epoch: int = -1,
    ) -> tuple[ErrorCode, int, Partition | None]:
        """Append one batch as leader (a transactional one for ``producer_id``); (error,
        offset the high watermark must reach, the partition appended to)."""
        tp = TopicPartition(OFFSETS_TOPIC, self.partition_for(group_id))
        partition = self.broker.replicas.get(tp)
        if partition is None or not partition.is_leader(self.broker.node_id):
            return ErrorCode.not_coordinator, 0, None
        batch = build_batch([(k, v) for k, v in records], self.now_ms(),
                            producer_id=producer_id, producer_epoch=producer_epoch,
                            attributes=TRANSACTIONAL_BIT if producer_id >= 0 else 0)
        try:
            res = partition.append_own_batch(batch)
        except InvalidRecordError as e:
            if e.error_code == ErrorCode.invalid_producer_epoch:
                # Kafka passes the log's error on (TxnOffsetCommit of a fenced producer is
                # INVALID_PRODUCER_EPOCH at every version: librdkafka takes it as fatal,
                # PRODUCER_FENCED there only as abortable)
                return ErrorCode.invalid_producer_epoch, 0, None
            log.error("append to %s failed: %s", tp, e)
            return ErrorCode.coordinator_not_available, 0, None
        except LogError as e:
            log.error("append to %s failed: %s", tp, e)
            return ErrorCode.coordinator_not_available, 0, None
        self.broker.replicas.wake(tp)
        return ErrorCode.none, res.last_offset + 1, partition

    async def _committed(self, err: ErrorCode, end: int, partition: Partition | None
                         ) -> ErrorCode:
        """Wait until an append (``_append_now``'s result) is committed (acks=all)."""
        if err is not ErrorCode.none:
            return err
        assert partition is not None
        if partition.log.high_watermark >= end:  # single node: committed by the append
            return ErrorCode.none
        timeout_s = int(self.config["request.timeout.ms"]) / 1000
        if not await partition.wait_for_hw(end, timeout_s):
            return ErrorCode.request_timed_out
        return ErrorCode.none

    async def append_group_records(
        self, group_id: str, records: Sequence[tuple[bytes, bytes | None]]
    ) -> ErrorCode:
        """Append to the group's partition and wait for the high watermark (acks=all)."""
        if not records:
            return ErrorCode.none
        return await self._committed(*self._append_now(group_id, records))

    async def write(self, w: OffsetWrite) -> ErrorCode:
        """Append an ``OffsetWrite`` and, once it is committed, apply it (a transactional
        one's offsets wait for the transaction's marker: ``txn_marker``)."""
        if w.producer_id >= 0:
            err = await self._committed(*self._append_now(
                w.group_id, w.records, w.producer_id, w.producer_epoch))
        else:
            err = await self.append_group_records(w.group_id, w.records)
        if err is ErrorCode.none:
            self.coordinator.apply(w)
            self.flush()
        return err

    def _append_queued(self) -> dict[str, tuple[ErrorCode, int, Partition | None]]:
        """Append the coordinator's queued group records, one batch per group."""
        by_group: dict[str, list[tuple[bytes, bytes | None]]] = {}
        for group_id, kv in self.coordinator.take_group_records():
            by_group.setdefault(group_id, []).append(kv)
        results = {}
        for group_id, records in by_group.items():
            results[group_id] = result = self._append_now(group_id, records)
            if result[0] is not ErrorCode.none:
                self.coordinator.records_failed(group_id)
        return results

    async def flush_and_wait(self, group_id: str) -> ErrorCode:
        """``flush``, then wait until ``group_id``'s records are committed (acks=all)."""
        result = self._append_queued()
        self._complete_parked()
        appended = result.get(group_id)
        if appended is None:
            return ErrorCode.none
        err = await self._committed(*appended)
        if err is not ErrorCode.none:
            self.coordinator.records_failed(group_id)
        return err

    def flush(self) -> None:
        """Append queued group records; complete parked requests."""
        self._append_queued()
        self._complete_parked()

    def _complete_parked(self) -> None:
        for group_id, completion in self.coordinator.take_completions():
            fut = self._waiters.pop((group_id, completion.ticket), None)
            self._sync_tickets.discard((group_id, completion.ticket))
            if fut is not None and not fut.done():
                fut.set_result(completion)

    # ------------------------------------------------------------------ parking
    def park(self, group_id: str, ticket: int, sync: bool = False) -> asyncio.Future[Completion]:
        """Register a future for a parked answer; call before ``flush``."""
        fut: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._waiters[(group_id, ticket)] = fut
        if sync:
            self._sync_tickets.add((group_id, ticket))
        return fut

    async def wait(self, group_id: str, fut: asyncio.Future[Completion], ticket: int,
                   timeout_ms: int) -> Completion | None:
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_ms / 1000)
        except TimeoutError:
            return None
        finally:
            self._waiters.pop((group_id, ticket), None)
            self._sync_tickets.discard((group_id, ticket))

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self.broker.cluster is None and self.broker.metadata.topic(OFFSETS_TOPIC) is not None:
            self.load_all()  # a cluster loads partitions as it comes to lead them

    async def run(self, stopped: asyncio.Event) -> None:
        """The tick loop: expire sessions and rebalance timeouts, answer parked requests."""
        try:
            while not stopped.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopped.wait(), TICK_S)
                if stopped.is_set():
                    break
                self.coordinator.tick(self.now_ms())
                self.flush()
        finally:
            self.close()

    def close(self) -> None:
        """Wake every parked request with an error; later requests get
        COORDINATOR_NOT_AVAILABLE."""
        self._closed = True
        for (group_id, ticket), fut in list(self._waiters.items()):
            if not fut.done():
                if (group_id, ticket) in self._sync_tickets:
                    fut.set_result(SyncResult(ticket, ErrorCode.rebalance_in_progress))
                else:
                    fut.set_result(JoinResult(ticket, ErrorCode.coordinator_not_available, ""))
        self._waiters.clear()
        self._sync_tickets.clear()
