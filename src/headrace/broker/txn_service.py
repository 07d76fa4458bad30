"""The asyncio shell around the pure transaction coordinator (``headrace.txn``; issue 10).

- **Placement**: a transactional id belongs to partition ``abs(hashCode(id)) % n`` of
  ``__transaction_state`` (Kafka's hash, as groups); the leader of that partition is its
  coordinator (FindCoordinator key type 1). The topic is created on first use
  (``transaction.state.log.num.partitions`` partitions, compacted, replication factor
  ``transaction.state.log.replication.factor`` capped by the live brokers,
  ``min.insync.replicas`` = ``transaction.state.log.min.isr`` capped by it).
- **Loading**: each led partition gets its own ``TxnCoordinator``, rebuilt by replaying
  the partition (last value per id wins, tombstones forget); transactions left in a
  Prepare state get their markers sent again. Leadership lost: the coordinator is dropped
  (its ids answer NOT_COORDINATOR).
- **Writes**: a coordinator's ``TxnWrite`` is appended to the id's partition as one batch
  and waited for (acks=all) before ``written``; append errors become
  COORDINATOR_NOT_AVAILABLE / NOT_COORDINATOR, which clients retry.
- **Markers**: a written PrepareCommit/PrepareAbort sends a marker to every partition of
  the transaction: appended here for the partitions this broker leads, through
  WriteTxnMarkers to the leader of the others; retried (with backoff) until every
  partition has it, then the Complete state is written. The coordinator epoch in a marker
  is the leader epoch of the ``__transaction_state`` partition.
- **Verification** (KIP-890, ``transaction.partition.verification.enable``): a partition
  leader asks before appending a transaction's first batch (``txn_verification``).
- **Timers**: every ``transaction.abort.timed.out.transaction.cleanup.interval.ms``,
  transactions past their timeout are aborted (their producer fenced); every
  ``transaction.remove.expired.transaction.cleanup.interval.ms``, ids idle for
  ``transactional.id.expiration.ms`` are tombstoned.

Thread-safety: everything runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.memory_pool import LogPacer
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.topics import TopicError
from headrace.broker.txn_verification import TxnVerifier
from headrace.cluster.client import BrokerConnection, BrokerConnectionError
from headrace.group.hashing import offsets_partition_for
from headrace.log.errors import LogError
from headrace.protocol.records import InvalidRecordError, build_batch, decode_records, iter_batches
from headrace.txn.coordinator import Markers, TxnCoordinator, TxnWrite
from headrace.txn.records import TxnRecordError, decode_key, decode_value, encode_key, encode_value

if TYPE_CHECKING:
    from headrace.broker.server import Broker

log = logging.getLogger("headrace.transactions")

TXN_TOPIC = "__transaction_state"
LOAD_READ_BYTES = 8 * 1024 * 1024
WRITE_TXN_MARKERS = 27
MARKER_RETRY_S = (0.05, 1.0)  # first and largest backoff between marker rounds
TICK_S = 0.5


class TxnService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config = broker.config
        self.coordinators: dict[int, TxnCoordinator] = {}
        self.loading: set[int] = set()
        self.max_timeout_ms = int(self.config["transaction.max.timeout.ms"])
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._conns: dict[int, BrokerConnection] = {}
        self._create_failed_log = LogPacer(10.0)
        self.verifier = TxnVerifier(self)

    @property
    def verification_enabled(self) -> bool:
        """``transaction.partition.verification.enable`` (a dynamic broker config)."""
        return bool(self.config["transaction.partition.verification.enable"])

    # ------------------------------------------------------------------ placement
    def now_ms(self) -> int:
        return self.broker.clock.wall_ms()

    def num_partitions(self) -> int:
        topic = self.broker.metadata.topic(TXN_TOPIC)
        if topic is not None:
            return len(topic.partitions)
        return int(self.config["transaction.state.log.num.partitions"])

    def partition_for(self, transactional_id: str) -> int:
        return offsets_partition_for(transactional_id, self.num_partitions())

    def coordinator_node(self, transactional_id: str, create: bool = True) -> int | None:
        """The broker leading ``transactional_id``'s partition (None: no topic yet;
        ``create``: create it first, as a client's request does; a verification never)."""
        if create and not self.ensure_topic():
            return None
        topic = self.broker.metadata.topic(TXN_TOPIC)
        if topic is None:
            return None
        return topic.partitions[self.partition_for(transactional_id)].leader

    def coordinator_for(self, transactional_id: str, create: bool = True
                        ) -> tuple[ErrorCode, TxnCoordinator | None]:
        """The coordinator of ``transactional_id`` if this broker is it, else the error
        Kafka answers (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ..._NOT_AVAILABLE)."""
        if self._closed:
            return ErrorCode.coordinator_not_available, None
        node = self.coordinator_node(transactional_id, create)
        if node is None or node < 0:
            return ErrorCode.coordinator_not_available, None
        if node != self.broker.node_id:
            return ErrorCode.not_coordinator, None
        p = self.partition_for(transactional_id)
        if p in self.loading:
            return ErrorCode.coordinator_load_in_progress, None
        c = self.coordinators.get(p)
        hosted = self.broker.replicas.get(TopicPartition(TXN_TOPIC, p))
        if c is None or hosted is None or not hosted.is_leader(self.broker.node_id):
            return ErrorCode.not_coordinator, None
        return ErrorCode.none, c

    def replication_factor(self) -> int:
        if self.broker.cluster is None:
            return int(self.config["default.replication.factor"])
        live = len(self.broker.metadata.live_brokers())
        return max(1, min(int(self.config["transaction.state.log.replication.factor"]), live))

    def ensure_topic(self) -> bool:
        if self.broker.metadata.topic(TXN_TOPIC) is not None:
            return True
        rf = self.replication_factor()
        min_isr = max(1, min(int(self.config["transaction.state.log.min.isr"]), rf))
        try:
            self.broker.topics.create(
                TXN_TOPIC, int(self.config["transaction.state.log.num.partitions"]), rf,
                {"cleanup.policy": "compact", "min.insync.replicas": str(min_isr),
                 "segment.bytes": str(int(self.config["transaction.state.log.segment.bytes"]))},
            )
        except TopicError as e:
            if e.error_code == ErrorCode.topic_already_exists:
                return True
            if e.error_code == ErrorCode.leader_not_available:
                return False  # a cluster creates it in the background
            held = self._create_failed_log.ready(time.monotonic())
            if held is not None:
                log.error("cannot create %s: %s%s", TXN_TOPIC, e.message,
                          f" ({held} more attempts failed since the last line)" if held else "")
            return False
        self.load_all()
        return True

    # ------------------------------------------------------------------ loading
    def start(self) -> None:
        if self.broker.cluster is None and self.broker.metadata.topic(TXN_TOPIC) is not None:
            self.load_all()

    def load_all(self) -> None:
        topic = self.broker.metadata.topic(TXN_TOPIC)
        if topic is None:
            return
        for i, state in enumerate(topic.partitions):
            if state.leader == self.broker.node_id and i not in self.coordinators:
                self.load_partition(i)

    def partition_led(self, tp: TopicPartition) -> None:
        if tp.topic == TXN_TOPIC and not self._closed:
            self.coordinators.pop(tp.partition, None)
            self.load_partition(tp.partition)

    def partition_unloaded(self, tp: TopicPartition) -> None:
        if tp.topic == TXN_TOPIC and self.coordinators.pop(tp.partition, None) is not None:
            log.info("no longer coordinating the transactions of %s", tp)

    def load_partition(self, index: int) -> None:
        partition = self.broker.replicas.get(TopicPartition(TXN_TOPIC, index))
        if partition is None:
            return
        self.loading.add(index)
        coordinator = TxnCoordinator(self._no_allocation, self.max_timeout_ms)
        try:
            plog = partition.log
            offset = plog.log_start_offset
            end = plog.log_end_offset if self.broker.cluster is not None else plog.high_watermark
            bad = 0
            while offset < end:
                data = plog.read(offset, LOAD_READ_BYTES, max_offset=end, min_one_batch=True)
                if not data:
                    break
                for header in iter_batches(data):
                    if header.next_offset <= offset:
                        continue
                    offset = header.next_offset
                    if header.is_control:
                        continue
                    for rec in decode_records(data[header.position:header.position
                                                   + header.size]):
                        if rec.key is None:
                            continue
                        try:
                            coordinator.replay(decode_key(rec.key), decode_value(rec.value))
                        except TxnRecordError:
                            bad += 1
            if bad:
                log.warning("%d undecodable record(s) skipped in %s-%d", bad, TXN_TOPIC, index)
        except (LogError, InvalidRecordError) as e:
            log.error("loading %s-%d failed: %s", TXN_TOPIC, index, e)
            return
        finally:
            self.loading.discard(index)
        self.coordinators[index] = coordinator
        if coordinator.txns:
            log.info("coordinating %d transactional id(s) of %s-%d", len(coordinator.txns),
                     TXN_TOPIC, index)
        for markers in coordinator.unfinished():
            self._spawn(self._send_markers(index, coordinator, markers))

    @staticmethod
    def _no_allocation() -> int:
        raise RuntimeError("a producer id must be reserved before the coordinator is called")

    # ------------------------------------------------------------------ writes
    async def write(self, coordinator: TxnCoordinator, w: TxnWrite) -> ErrorCode:
        """Append ``w`` to its id's partition and wait until it is committed; then the
        coordinator applies it (or forgets it, on failure). Markers follow a Prepare."""
        index = self.partition_for(w.transactional_id)
        err = await self._append(index, w)
        markers = coordinator.written(w.transactional_id, err is ErrorCode.none, self.now_ms())
        if markers is not None:
            self._spawn(self._send_markers(index, coordinator, markers))
        return err

    async def _append(self, index: int, w: TxnWrite) -> ErrorCode:
        tp = TopicPartition(TXN_TOPIC, index)
        partition = self.broker.replicas.get(tp)
        if partition is None or not partition.is_leader(self.broker.node_id):
            return ErrorCode.not_coordinator
        batch = build_batch([(encode_key(w.transactional_id), encode_value(w.value))],
                            self.now_ms())
        try:
            res = partition.append_own_batch(batch)
        except (InvalidRecordError, LogError) as e:
            log.error("append to %s failed: %s", tp, e)
            return ErrorCode.coordinator_not_available
        self.broker.replicas.wake(tp)
        end = res.last_offset + 1
        if partition.log.high_watermark >= end:
            return ErrorCode.none
        if len(partition.state.isr) < int(partition.log.config.min_insync_replicas):
            return ErrorCode.coordinator_not_available
        timeout_s = int(self.config["request.timeout.ms"]) / 1000
        done = await partition.wait_for_hw(end, timeout_s)
        if done is None:
            return ErrorCode.coordinator_not_available
        return ErrorCode.none if done else ErrorCode.not_coordinator

    # ------------------------------------------------------------------ markers
    async def _send_markers(self, index: int, coordinator: TxnCoordinator,
                            markers: Markers) -> None:
        tp_txn = TopicPartition(TXN_TOPIC, index)
        remaining = set(markers.partitions)
        backoff = MARKER_RETRY_S[0]
        while remaining and not self._closed:
            if self.coordinators.get(index) is not coordinator:
                return  # leadership moved: the new coordinator sends them again
            txn_partition = self.broker.replicas.get(tp_txn)
            epoch = txn_partition.leader_epoch if txn_partition is not None else -1
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for topic, p in sorted(remaining):
                state = self.broker.metadata.topic(topic)
                if state is None or p >= len(state.partitions):
                    remaining.discard((topic, p))  # deleted: nothing to mark (Kafka too)
                    continue
                by_leader.setdefault(state.partitions[p].leader, []).append((topic, p))
            for leader, tps in by_leader.items():
                if leader == self.broker.node_id:
                    results = await asyncio.gather(*(
                        self.write_marker(TopicPartition(t, p), markers.producer_id,
                                          markers.producer_epoch, markers.commit, epoch)
                        for t, p in tps))
                    codes = dict(zip(tps, results, strict=True))
                elif leader >= 0:
                    codes = await self._remote_markers(leader, markers, tps, epoch)
                else:
                    codes = {}
                for tp, code in codes.items():
                    if code in (ErrorCode.none, ErrorCode.invalid_producer_epoch,
                                ErrorCode.transaction_coordinator_fenced,
                                ErrorCode.unknown_topic_or_partition):
                        # written, or a newer producer or coordinator epoch already ended
                        # it (Kafka stops sending this transaction's markers then)
                        remaining.discard(tp)
            if remaining:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MARKER_RETRY_S[1])
        if self._closed or self.coordinators.get(index) is not coordinator:
            return
        done = coordinator.markers_done(markers.transactional_id, self.now_ms())
        if done is not None:
            err = await self.write(coordinator, done)
            if err is not ErrorCode.none:
                log.warning("completing transaction %r failed (%s); retrying on load",
                            markers.transactional_id, err.name)

    async def write_marker(self, tp: TopicPartition, producer_id: int, producer_epoch: int,
                           commit: bool, coordinator_epoch: int) -> ErrorCode:
        """Append one marker as the partition's leader and wait for it to be committed
        (WriteTxnMarkers appends with acks=all)."""
        partition = self.broker.replicas.get(tp)
        if partition is None:
            state = self.broker.metadata.topic(tp.topic)
            return (ErrorCode.unknown_topic_or_partition
                    if state is None or tp.partition >= len(state.partitions)
                    else ErrorCode.not_leader_or_follower)
        if not partition.is_leader(self.broker.node_id):
            return ErrorCode.not_leader_or_follower
        try:
            res = partition.append_marker(producer_id, producer_epoch, commit,
                                          coordinator_epoch)
        except InvalidRecordError as e:
            return ErrorCode(e.error_code)
        except LogError as e:
            return ErrorCode(e.error_code)
        self.broker.replicas.wake(tp)
        self.broker.groups.txn_marker(tp, producer_id, commit)
        end = res.last_offset + 1
        if partition.log.high_watermark >= end:
            return ErrorCode.none
        timeout_s = int(self.config["request.timeout.ms"]) / 1000
        done = await partition.wait_for_hw(end, timeout_s)
        return ErrorCode.none if done else (ErrorCode.request_timed_out if done is None
                                            else ErrorCode.not_leader_or_follower)

    async def _remote_markers(self, leader: int, markers: Markers,
                              tps: list[tuple[str, int]], epoch: int
                              ) -> dict[tuple[str, int], ErrorCode]:
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        body = {"markers": [{
            "producer_id": markers.producer_id, "producer_epoch": markers.producer_epoch,
            "transaction_result": markers.commit, "coordinator_epoch": epoch,
            "topics": [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()],
        }]}
        try:
            conn = await self._connection(leader)
            resp = await conn.request(WRITE_TXN_MARKERS, 1, body,
                                      int(self.config["request.timeout.ms"]) / 1000 + 5)
        except (BrokerConnectionError, OSError, TimeoutError) as e:
            log.debug("WriteTxnMarkers to broker %d failed: %s", leader, e)
            self._drop_connection(leader)
            return {}
        out: dict[tuple[str, int], ErrorCode] = {}
        for m in resp.markers:
            for t in m.topics:
                for p in t.partitions:
                    out[(str(t.name), int(p.partition_index))] = ErrorCode(p.error_code)
        return out

    async def _connection(self, broker_id: int) -> BrokerConnection:
        conn = self._conns.get(broker_id)
        if conn is not None and conn.connected:
            return conn
        info = next((b for b in self.broker.metadata.live_brokers()
                     if b.node_id == broker_id), None)
        if info is None:
            raise BrokerConnectionError(f"broker {broker_id} is not registered")
        conn = BrokerConnection(info.host, info.port,
                                f"headrace-txn-markers-{self.broker.node_id}", 1 << 20,
                                self.broker.inter_broker)
        await conn.connect(5.0)
        self._conns[broker_id] = conn
        return conn

    def _drop_connection(self, broker_id: int) -> None:
        conn = self._conns.pop(broker_id, None)
        if conn is not None:
            conn.close()

    # ------------------------------------------------------------------ timers
    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.broker.track(task)

    async def run(self, stopped: asyncio.Event) -> None:
        abort_every = int(self.config[
            "transaction.abort.timed.out.transaction.cleanup.interval.ms"]) / 1000
        expire_every = int(self.config[
            "transaction.remove.expired.transaction.cleanup.interval.ms"]) / 1000
        expiration_ms = int(self.config["transactional.id.expiration.ms"])
        loop = asyncio.get_running_loop()
        next_abort = loop.time() + abort_every
        next_expire = loop.time() + expire_every
        try:
            while not stopped.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopped.wait(), min(TICK_S, abort_every))
                if stopped.is_set():
                    break
                now = loop.time()
                if now >= next_abort:
                    next_abort = now + abort_every
                    for c in list(self.coordinators.values()):
                        for w in c.timed_out(self.now_ms()):
                            log.info("aborting transaction %r: past its timeout",
                                     w.transactional_id)
                            self._spawn(self.write(c, w))
                if now >= next_expire:
                    next_expire = now + expire_every
                    for c in list(self.coordinators.values()):
                        for w in c.expired(self.now_ms(), expiration_ms):
                            self._spawn(self.write(c, w))
        finally:
            self.close()

    def close(self) -> None:
        self._closed = True
        self.verifier.close()
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
