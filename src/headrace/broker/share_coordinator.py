"""The share coordinator's shell and the persister that reaches it (KIP-932).

``ShareCoordinatorService`` is Kafka's ``ShareCoordinatorService`` around the pure
``ShareCoordinatorShard`` (``headrace.share.state``), as ``txn_service`` is for
transactions:

- **placement**: a share-partition's state (key ``groupId:topicId:partition``) belongs to
  partition ``partition_for(key)`` of ``__share_group_state``; that partition's leader is its
  share coordinator (FindCoordinator key type 2). The topic is created on first use with
  ``share.coordinator.state.topic.num.partitions`` (50) partitions, replication factor
  ``share.coordinator.state.topic.replication.factor`` (3) capped by the live brokers,
  ``min.insync.replicas`` ``share.coordinator.state.topic.min.isr`` (2) capped by it, and
  Kafka's topic configs (``state_topic_configs``);
- **loading**: each led partition gets its own shard, rebuilt by replaying the partition
  (started broker, new leadership; Kafka's ``onElection``), the first read at once and the
  rest in a task; while it loads its keys answer COORDINATOR_LOAD_IN_PROGRESS, and a
  partition not led here NOT_COORDINATOR; leadership lost drops the shard or abandons its
  load (``onResignation``);
- **requests** (InitializeShareGroupState 83 ... ReadShareGroupStateSummary 87): an empty
  group id, no topics or (but Initialize) a topic without partitions is an empty answer;
  the request's keys are grouped by coordinator partition; each group is one call of the
  shard, one at a time per partition, whose records are appended as one batch and
  committed (the high watermark past them) before the shard replays them and the answer
  goes out, as Kafka writes before it responds. A failed append answers
  COORDINATOR_NOT_AVAILABLE (NOT_COORDINATOR when leadership went) for those keys, as
  Kafka's ``handleOperationException`` maps NOT_ENOUGH_REPLICAS / REQUEST_TIMED_OUT /
  NOT_LEADER_OR_FOLLOWER, and rebuilds the shard from the log if the batch got there.
  A zero topic id (kio's None) is Kafka's ``Uuid.ZERO_UUID``: a topic no metadata knows.
  A write whose state batches are not ranges ``0 <= first <= last`` is INVALID_REQUEST,
  a check of headrace's own (Kafka has none; the batch merge never ends on such input).

``CoordinatorPersister`` is Kafka's ``DefaultStatePersister``: ``broker.share_persister``.
It groups keys by coordinator (one request per coordinator and call), calls this broker's
service in process for the keys it coordinates and sends the same requests to the other
coordinators over one inter-broker connection per peer (``cluster.client``), retrying
COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR and
UNKNOWN_TOPIC_OR_PARTITION (after a fresh look at the metadata) with Kafka's exponential
backoff, up to 5 answers in all; a failed connection is NETWORK_EXCEPTION, not retried
(Kafka's ``PersisterStateManager``). It sends WriteShareGroupState and
ReadShareGroupStateSummary at v1 (KIP-1226's delivery-complete count).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.memory_pool import LogPacer
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.share_persister import (
    InitializeEntry,
    ReadStateResult,
    Results,
    StateKey,
    StateSummary,
    WriteEntry,
)
from headrace.broker.topics import TopicError
from headrace.cluster.client import BrokerConnection, BrokerConnectionError
from headrace.log.errors import LogError
from headrace.protocol.entities import build
from headrace.protocol.records import InvalidRecordError, build_batch, decode_records, iter_batches
from headrace.share.partition import PersisterStateBatch
from headrace.share.state import (
    ShareCoordinatorConfig,
    ShareCoordinatorShard,
    ShareStateRecordError,
    decode_record,
    partition_for,
    state_topic_configs,
)

if TYPE_CHECKING:
    from headrace.broker.server import Broker

log = logging.getLogger("headrace.share")

STATE_TOPIC = "__share_group_state"
ZERO_UUID = uuid.UUID(int=0)
LOAD_READ_BYTES = 8 * 1024 * 1024
INITIALIZE, READ, WRITE, DELETE, SUMMARY = 83, 84, 85, 86, 87
# the versions the persister sends (Kafka 4.2's)
VERSIONS = {INITIALIZE: 0, READ: 0, WRITE: 1, DELETE: 0, SUMMARY: 1}
# PersisterStateManager: the errors retried, REQUEST_BACKOFF_MS, REQUEST_BACKOFF_MAX_MS,
# MAX_FIND_COORD_ATTEMPTS (answers in all, the first included) and the client's jitter
RETRIABLE = {ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
             ErrorCode.not_coordinator, ErrorCode.unknown_topic_or_partition}
REQUEST_BACKOFF_S = 1.0
REQUEST_BACKOFF_MAX_S = 30.0
MAX_ATTEMPTS = 5
JITTER = 0.2


def _config(broker: Broker) -> ShareCoordinatorConfig:
    """The broker's ``share.coordinator.*`` configs (validated by ``headrace.config``)."""
    return ShareCoordinatorConfig(
        state_topic_num_partitions=int(
            broker.config["share.coordinator.state.topic.num.partitions"]),
        state_topic_replication_factor=int(
            broker.config["share.coordinator.state.topic.replication.factor"]),
        state_topic_min_isr=int(broker.config["share.coordinator.state.topic.min.isr"]),
        state_topic_segment_bytes=int(
            broker.config["share.coordinator.state.topic.segment.bytes"]),
        snapshot_update_records_per_snapshot=int(
            broker.config["share.coordinator.snapshot.update.records.per.snapshot"]))


class ShareCoordinatorService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config = _config(broker)
        self.shards: dict[int, ShareCoordinatorShard] = {}
        self.loading: set[int] = set()
        # bytes read per step of a load; a partition that does not fit in one step goes on
        # loading in a task, answering COORDINATOR_LOAD_IN_PROGRESS meanwhile
        self.load_read_bytes = LOAD_READ_BYTES
        self._load_gen: dict[int, int] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._create_failed_log = LogPacer(10.0)

    # -- placement ------------------------------------------------------------------------

    def now_ms(self) -> int:
        return self.broker.clock.wall_ms()

    def num_partitions(self) -> int:
        topic = self.broker.metadata.topic(STATE_TOPIC)
        return len(topic.partitions) if topic is not None else \
            self.config.state_topic_num_partitions

    def partition_of(self, key: StateKey) -> int:
        return partition_for(key.group_id, key.topic_id, key.partition, self.num_partitions())

    def coordinator_node(self, partition: int, create: bool = True) -> int | None:
        if create and not self.ensure_topic():
            return None
        topic = self.broker.metadata.topic(STATE_TOPIC)
        if topic is None or partition >= len(topic.partitions):
            return None
        return topic.partitions[partition].leader

    def check(self, partition: int) -> ErrorCode:
        """NONE if this broker coordinates ``partition``'s keys now."""
        if self._closed:
            return ErrorCode.coordinator_not_available
        node = self.coordinator_node(partition)
        if node is None or node < 0:
            return ErrorCode.coordinator_not_available
        if node != self.broker.node_id:
            return ErrorCode.not_coordinator
        if partition in self.loading:
            return ErrorCode.coordinator_load_in_progress
        hosted = self.broker.replicas.get(TopicPartition(STATE_TOPIC, partition))
        if partition not in self.shards or hosted is None or not hosted.is_leader(
                self.broker.node_id):
            return ErrorCode.not_coordinator
        return ErrorCode.none

    def replication_factor(self) -> int:
        if self.broker.cluster is None:
            return 1
        live = len(self.broker.metadata.live_brokers())
        return max(1, min(self.config.state_topic_replication_factor, live))

    def ensure_topic(self) -> bool:
        if self.broker.metadata.topic(STATE_TOPIC) is not None:
            return True
        rf = self.replication_factor()
        configs = state_topic_configs(self.config)
        configs["min.insync.replicas"] = str(max(1, min(self.config.state_topic_min_isr, rf)))
        try:
            self.broker.topics.create(STATE_TOPIC, self.config.state_topic_num_partitions, rf,
                                      configs)
        except TopicError as e:
            if e.error_code == ErrorCode.topic_already_exists:
                return True
            if e.error_code == ErrorCode.leader_not_available:
                return False  # a cluster creates it in the background
            held = self._create_failed_log.ready(time.monotonic())
            if held is not None:
                log.error("cannot create %s: %s%s", STATE_TOPIC, e.message,
                          f" ({held} more attempts failed since the last line)" if held else "")
            return False
        self.load_all()
        return True

    # -- loading --------------------------------------------------------------------------

    def start(self) -> None:
        if self.broker.cluster is None and self.broker.metadata.topic(STATE_TOPIC) is not None:
            self.load_all()

    def load_all(self) -> None:
        topic = self.broker.metadata.topic(STATE_TOPIC)
        if topic is None:
            return
        for i, state in enumerate(topic.partitions):
            if (state.leader == self.broker.node_id and i not in self.shards
                    and i not in self.loading):
                self.load_partition(i)

    def partition_led(self, tp: TopicPartition) -> None:
        """Kafka's ``onElection``: a new shard, loaded from the partition."""
        if tp.topic == STATE_TOPIC and not self._closed:
            self.load_partition(tp.partition)

    def partition_unloaded(self, tp: TopicPartition) -> None:
        """Kafka's ``onResignation``: the shard (loaded or loading) is dropped."""
        if tp.topic != STATE_TOPIC:
            return
        self._load_gen[tp.partition] = self._load_gen.get(tp.partition, 0) + 1
        self.loading.discard(tp.partition)
        if self.shards.pop(tp.partition, None) is not None:
            log.info("no longer coordinating the share-group state of %s", tp)

    def load_partition(self, index: int) -> None:
        """Replay partition ``index`` into a new shard (Kafka's ``scheduleLoadOperation``):
        the first ``load_read_bytes`` now, the rest, if any, in a task that yields to the
        loop between reads; the partition answers COORDINATOR_LOAD_IN_PROGRESS until the
        shard is complete, and a newer load or the loss of leadership abandons it."""
        partition = self.broker.replicas.get(TopicPartition(STATE_TOPIC, index))
        self.shards.pop(index, None)
        if partition is None:
            return
        gen = self._load_gen.get(index, 0) + 1
        self._load_gen[index] = gen
        self.loading.add(index)
        steps = self._replay(index, partition)
        if self._step(index, gen, steps):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (not served yet): finish here
            while not self._step(index, gen, steps):
                pass
            return
        task = loop.create_task(self._load_rest(index, gen, steps))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load_rest(self, index: int, gen: int, steps: Any) -> None:
        while True:
            await asyncio.sleep(0)
            if self._step(index, gen, steps):
                return

    def _step(self, index: int, gen: int, steps: Any) -> bool:
        """One read of the load; True when the load is over (done, failed or abandoned)."""
        if self._load_gen.get(index) != gen or self._closed:
            steps.close()
            return True
        try:
            next(steps)
            return False
        except StopIteration as stop:
            shard = stop.value
        except (LogError, InvalidRecordError) as e:
            log.error("loading %s-%d failed: %s", STATE_TOPIC, index, e)
            shard = None
        self.loading.discard(index)
        if shard is not None:
            self.shards[index] = shard
        return True

    def _replay(self, index: int, partition: Any) -> Any:
        """A generator: replays the partition into a new shard, one read per step; its
        value is the shard."""
        shard = ShareCoordinatorShard(self.config)
        bad = 0
        plog = partition.log
        offset = plog.log_start_offset
        end = plog.log_end_offset if self.broker.cluster is not None else plog.high_watermark
        while offset < end:
            data = plog.read(offset, self.load_read_bytes, max_offset=end, min_one_batch=True)
            if not data:
                break
            for header in iter_batches(data):
                if header.next_offset <= offset:
                    continue
                offset = header.next_offset
                if header.is_control:
                    continue
                for rec in decode_records(data[header.position:header.position + header.size]):
                    if rec.key is None:
                        continue
                    try:
                        shard.replay(decode_record(rec.key, rec.value))
                    except (ShareStateRecordError, ValueError):
                        bad += 1
            if offset < end:
                yield
        if bad:
            log.warning("%d undecodable record(s) skipped in %s-%d", bad, STATE_TOPIC, index)
        return shard

    def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()

    # -- requests -------------------------------------------------------------------------

    def _topics(self) -> dict[uuid.UUID, int]:
        return {t.topic_id: len(t.partitions) for t in self.broker.metadata.topics().values()}

    async def serve(self, api_key: int, request: Any) -> Any:
        """Answer a state request (kio request object, any served version) as Kafka's
        ``ShareCoordinatorService`` does: an empty answer to an empty group id, no topics
        or (but Initialize) a topic without partitions; COORDINATOR_NOT_AVAILABLE for every
        partition once closed; else, per coordinator partition, one shard call and one
        committed batch, the partitions of different coordinator partitions concurrently."""
        response_cls = type(request).__name__.replace("Request", "Response")
        group_id = str(request.group_id)
        empty = (not group_id or not request.topics
                 or (api_key != INITIALIZE and any(not t.partitions for t in request.topics)))
        not_active = self._closed and (api_key in (INITIALIZE, DELETE, SUMMARY) or not empty)
        if not_active:  # Kafka: generateError...Response, every topic as the request has it
            return _global_error(request, response_cls, ErrorCode.coordinator_not_available,
                                 "Share coordinator is not available.")
        if empty:
            log.debug("share state request %d with an empty group id or no partitions",
                      api_key)
            return _assemble(request, response_cls, [], {})
        # dicts throughout: a request may name very many partitions (linear, not more)
        by_partition: dict[int, dict[uuid.UUID, list[Any]]] = {}
        order: dict[tuple[uuid.UUID, int], None] = {}
        results: dict[tuple[uuid.UUID, int], Any] = {}
        templates: dict[uuid.UUID, Any] = {}
        for t in request.topics:
            # Kafka's topic id is never null: a zero id is a topic no metadata knows
            topic_id = t.topic_id if t.topic_id is not None else ZERO_UUID
            templates.setdefault(topic_id, t)
            for p in t.partitions:
                order[(topic_id, int(p.partition))] = None
                bad = _bad_batches(p) if api_key == WRITE else None
                if bad is not None:
                    results[(topic_id, int(p.partition))] = (ErrorCode.invalid_request, bad)
                    continue
                results.pop((topic_id, int(p.partition)), None)
                index = partition_for(group_id, topic_id, int(p.partition),
                                      self.num_partitions())
                by_partition.setdefault(index, {}).setdefault(topic_id, []).append(p)
        sub_requests = [
            (index, topics, dataclasses.replace(request, topics=tuple(
                dataclasses.replace(templates[tid], topic_id=tid, partitions=tuple(ps))
                for tid, ps in topics.items())))
            for index, topics in by_partition.items()]
        answers = await asyncio.gather(*(self._serve_partition(api_key, index, sub)
                                         for index, _, sub in sub_requests))
        op = _OPERATION[api_key]
        for (_, topics, _), answer in zip(sub_requests, answers, strict=True):
            if isinstance(answer, ErrorCode):
                for tid, ps in topics.items():
                    for p in ps:
                        results[(tid, int(p.partition))] = (
                            answer, f"Unable to {op}: "
                                    f"{_KAFKA_MESSAGES.get(answer, answer.name.upper())}")
                continue
            for rt in answer.results:
                for rp in rt.partitions:
                    results[(rt.topic_id if rt.topic_id is not None else ZERO_UUID,
                             int(rp.partition))] = rp
        return _assemble(request, response_cls, list(order), results)

    async def _serve_partition(self, api_key: int, index: int, sub: Any) -> Any:
        """One coordinator partition's share of a request: the shard's response, or the
        ErrorCode for all of its partitions. One at a time per partition, so that each
        request sees every earlier one's records (Kafka's runtime orders its writes)."""
        lock = self._locks.setdefault(index, asyncio.Lock())
        async with lock:
            code = self.check(index)
            if code is not ErrorCode.none:
                return code
            shard = self.shards[index]
            shard.on_metadata_update(self._topics())
            result = _METHODS[api_key](shard, sub, self.now_ms())
            if result.records:
                err, appended = await self._append(index, result.records)
                if err is not ErrorCode.none:
                    if appended and self.shards.get(index) is shard:
                        # the records may still commit: the shard is rebuilt from the log
                        # (Kafka's runtime reverts to its last committed state)
                        self.load_partition(index)
                    return err
                if self.shards.get(index) is shard:
                    for record in result.records:
                        shard.replay(record)
            return result.response

    async def _append(self, index: int, records: Any) -> tuple[ErrorCode, bool]:
        """Append ``records`` as one batch and wait for it to commit: the error (Kafka's
        ``handleOperationException`` mapping) and whether the batch reached the log."""
        tp = TopicPartition(STATE_TOPIC, index)
        partition = self.broker.replicas.get(tp)
        if partition is None or not partition.is_leader(self.broker.node_id):
            return ErrorCode.not_coordinator, False
        if len(partition.state.isr) < int(partition.log.config.min_insync_replicas):
            return ErrorCode.coordinator_not_available, False  # NOT_ENOUGH_REPLICAS
        batch = build_batch([(r.key_bytes(), r.value_bytes()) for r in records], self.now_ms())
        try:
            res = partition.append_own_batch(batch)
        except (InvalidRecordError, LogError) as e:
            code = operation_error(e.error_code)
            if code is ErrorCode.unknown_server_error:  # the request's records too large
                log.warning("append to %s refused: %s", tp, e)
            else:
                log.error("append to %s failed: %s", tp, e)
            return code, False
        self.broker.replicas.wake(tp)
        end = res.last_offset + 1
        if partition.log.high_watermark >= end:
            return ErrorCode.none, True
        timeout_s = int(self.broker.config["request.timeout.ms"]) / 1000
        done = await partition.wait_for_hw(end, timeout_s)
        if done is None:  # REQUEST_TIMED_OUT
            return ErrorCode.coordinator_not_available, True
        return (ErrorCode.none if done else ErrorCode.not_coordinator), True


def _bad_batches(p: Any) -> str | None:
    """headrace's own check of a write's state batches (Kafka has none): a batch must be
    a range of offsets, ``0 <= first <= last``. The batch merge (R11) never ends on an
    inverted range, so such a write would hang the shard; it is INVALID_REQUEST."""
    for b in p.state_batches:
        if not 0 <= b.first_offset <= b.last_offset:
            return (f"Invalid state batch [{b.first_offset}, {b.last_offset}]: "
                    "offsets must be 0 <= first <= last.")
    return None


def operation_error(code: ErrorCode) -> ErrorCode:
    """PURE: Kafka's ``CoordinatorOperationExceptionHelper.handleOperationException``:
    the error a failed write of the coordinator answers with."""
    if code in (ErrorCode.unknown_topic_or_partition, ErrorCode.not_enough_replicas,
                ErrorCode.request_timed_out):
        return ErrorCode.coordinator_not_available
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if code in (ErrorCode.message_too_large, ErrorCode.record_list_too_large,
                ErrorCode.invalid_fetch_size):
        return ErrorCode.unknown_server_error
    if code is ErrorCode.network_exception:
        return ErrorCode.coordinator_load_in_progress
    return code


def _init(shard: ShareCoordinatorShard, req: Any, now: int) -> Any:
    return shard.initialize_state(req, now)


def _read(shard: ShareCoordinatorShard, req: Any, now: int) -> Any:
    return shard.read_state_and_maybe_update_leader_epoch(req, now)


def _write(shard: ShareCoordinatorShard, req: Any, now: int) -> Any:
    return shard.write_state(req, now)


def _delete(shard: ShareCoordinatorShard, req: Any, _now: int) -> Any:
    return shard.delete_state(req)


def _summary(shard: ShareCoordinatorShard, req: Any, _now: int) -> Any:
    return shard.read_state_summary(req)


_METHODS: dict[int, Callable[[ShareCoordinatorShard, Any, int], Any]] = {
    INITIALIZE: _init, READ: _read, WRITE: _write, DELETE: _delete, SUMMARY: _summary}
# ShareCoordinatorService's "Unable to <operation>: " + the exception's message
_OPERATION = {INITIALIZE: "initialize share group state", READ: "read share group state",
              WRITE: "write share group state", DELETE: "delete share group state",
              SUMMARY: "read share group state summary"}
# Kafka's Errors messages, the exceptions' messages in those answers
_KAFKA_MESSAGES = {
    ErrorCode.unknown_server_error:
        "The server experienced an unexpected error when processing the request.",
    ErrorCode.not_coordinator: "This is not the correct coordinator.",
    ErrorCode.coordinator_load_in_progress:
        "The coordinator is loading and hence can't process requests.",
    ErrorCode.coordinator_not_available: "The coordinator is not available.",
    ErrorCode.cluster_authorization_failed: "Cluster authorization failed.",
}


def _response_class(request: Any, response_cls: str) -> Any:
    import importlib

    module = importlib.import_module(type(request).__module__.replace(".request", ".response"))
    return getattr(module, response_cls)


def _assemble(request: Any, response_cls: str, order: list[tuple[uuid.UUID, int]],
              results: dict[tuple[uuid.UUID, int], Any]) -> Any:
    """The response of ``request``'s version, one result per topic id and per partition
    (Kafka's maps), in the request's order: a shard's partition result as it is, an
    (error code, message) as an error result."""
    cls = _response_class(request, response_cls)
    by_topic: dict[uuid.UUID, list[Any]] = {}
    for topic_id, index in order:
        r = results[(topic_id, index)]
        if isinstance(r, tuple):
            r = _error_partition(index, *r)
        by_topic.setdefault(topic_id, []).append(r)
    return build(cls, {"results": [{"topic_id": t, "partitions": ps}
                                   for t, ps in by_topic.items()]})


def _global_error(request: Any, response_cls: str, code: ErrorCode, message: str) -> Any:
    """Kafka's ``toGlobalErrorResponse`` / ``generateError...Response``: every topic and
    partition of the request, as they are in it, with ``code``."""
    cls = _response_class(request, response_cls)
    return build(cls, {"results": [
        {"topic_id": t.topic_id, "partitions": [
            _error_partition(int(p.partition), code, message) for p in t.partitions]}
        for t in request.topics]})


def _error_partition(index: int, code: ErrorCode, message: str | None) -> dict[str, Any]:
    """An error result with the schemas' defaults elsewhere (0; v1's delivery-complete
    count -1), as Kafka's ``toErrorResponsePartitionResult``."""
    return {"partition": index, "error_code": code, "error_message": message,
            "state_epoch": 0, "start_offset": 0, "leader_epoch": 0,
            "delivery_complete_count": -1, "state_batches": []}


async def state_request(broker: Broker, ctx: Any, req: Any, api_key: int) -> Any:
    """A handler of APIs 83-87: CLUSTER_ACTION on the cluster (a broker's request; Kafka's
    ``authorizeClusterOperation``), else CLUSTER_AUTHORIZATION_FAILED for every partition;
    then the service."""
    from headrace.broker.security import CLUSTER_ACTION

    if not broker.security.cluster_allowed(ctx, CLUSTER_ACTION):
        name = type(req).__name__.replace("Request", "Response")
        code = ErrorCode.cluster_authorization_failed
        return _global_error(req, name, code, _KAFKA_MESSAGES[code])
    service = broker.share_coordinator
    return await service.serve(api_key, req)


# -- the persister ------------------------------------------------------------------------


def backoff_s(attempts: int, rand: float, initial_s: float = REQUEST_BACKOFF_S,
              max_s: float = REQUEST_BACKOFF_MAX_S) -> float:
    """PURE: Kafka's ``ExponentialBackoff.backoff(attempts)`` as ``PersisterStateManager``
    configures it (base 2, jitter 0.2): ``initial * 2**min(attempts, log2(max/initial))``
    times a factor in [0.8, 1.2) (``rand`` in [0, 1) picks it), capped at ``max``."""
    exp_max = math.log(max_s / initial_s, 2) if max_s > initial_s else 0.0
    if exp_max == 0.0:
        return initial_s
    term = initial_s * 2 ** min(attempts, exp_max)
    return min(max_s, (1 - JITTER + 2 * JITTER * rand) * term)


class CoordinatorPersister:
    """Kafka's ``DefaultStatePersister`` over this broker's ``ShareCoordinatorService``
    and the other brokers' (see the module docstring). ``in_process=False`` sends even
    the keys this broker coordinates over a connection to its own listener (the remote
    path, for tests)."""

    def __init__(self, broker: Broker, service: ShareCoordinatorService,
                 in_process: bool = True) -> None:
        self.broker = broker
        self.service = service
        self.in_process = in_process
        self.max_attempts = MAX_ATTEMPTS
        self.backoff = backoff_s
        self._conns: dict[int, BrokerConnection] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    async def _call(self, api_key: int, group_id: str,
                    keys: list[tuple[StateKey, dict[str, Any]]]) -> dict[StateKey, Any]:
        """Send ``keys`` (each with its partition fields) to their coordinators, one
        request per coordinator; each key's partition result (a kio object) or its
        ErrorCode. A retriable error (``RETRIABLE``) is retried, with a fresh look at the
        coordinator, up to ``max_attempts`` answers in all with Kafka's backoff between
        them; a failed connection is NETWORK_EXCEPTION at once (Kafka's
        ``checkNetworkError``)."""
        pending = dict(keys)
        out: dict[StateKey, Any] = {}
        attempts = 0
        while pending:
            attempts += 1
            by_node: dict[int, list[StateKey]] = {}
            for key in pending:
                node = self.service.coordinator_node(self.service.partition_of(key))
                by_node.setdefault(-1 if node is None else node, []).append(key)
            retry: dict[StateKey, dict[str, Any]] = {}
            answers = await asyncio.gather(*(
                self._send(node, api_key, group_id, [(k, pending[k]) for k in node_keys])
                for node, node_keys in by_node.items()))
            for codes in answers:
                for key, r in codes.items():
                    code = r if isinstance(r, ErrorCode) else _error_code(r.error_code)
                    if code in RETRIABLE and attempts < self.max_attempts:
                        retry[key] = pending[key]
                    else:
                        out[key] = r
            pending = retry
            if pending:
                log.debug("share state request %d: %d key(s) retried (attempt %d)", api_key,
                          len(pending), attempts)
                await asyncio.sleep(self.backoff(attempts, random.random()))
        return out

    async def _send(self, node: int, api_key: int, group_id: str,
                    keys: list[tuple[StateKey, dict[str, Any]]]) -> dict[StateKey, Any]:
        if node < 0:  # no coordinator known: Kafka's lookup answers this, and retries
            return dict.fromkeys((k for k, _ in keys), ErrorCode.coordinator_not_available)
        version = VERSIONS[api_key]
        body = _body(group_id, keys)
        if node == self.broker.node_id and self.in_process:
            from kio.index import load_request_schema

            request = build(load_request_schema(api_key, version), body)
            response = await self.service.serve(api_key, request)
        else:
            try:
                response = await self._remote(node, api_key, version, body)
            except (BrokerConnectionError, OSError, TimeoutError) as e:
                log.debug("share state request to broker %d failed: %s", node, e)
                return dict.fromkeys((k for k, _ in keys), ErrorCode.network_exception)
        found: dict[StateKey, Any] = {}
        for rt in response.results:
            for rp in rt.partitions:
                if rt.topic_id is not None:
                    found[StateKey(group_id, rt.topic_id, int(rp.partition))] = rp
        # a key the answer leaves out: Kafka's "Failed to ... for share partition"
        return {k: found.get(k, ErrorCode.unknown_server_error) for k, _ in keys}

    async def _remote(self, node: int, api_key: int, version: int,
                      body: dict[str, Any]) -> Any:
        lock = self._locks.setdefault(node, asyncio.Lock())
        async with lock:  # one connection per peer, one request at a time on it
            conn = self._conns.get(node)
            if conn is None or not conn.connected:
                info = next((b for b in self.broker.advertised_brokers()
                             if b.node_id == node), None)  # its inter-broker endpoint
                if info is None:
                    raise BrokerConnectionError(f"broker {node} is not registered")
                conn = BrokerConnection(info.host, info.port,
                                        f"headrace-share-persister-{self.broker.node_id}",
                                        64 << 20, self.broker.inter_broker)
                await conn.connect(5.0)
                self._conns[node] = conn
            timeout_s = int(self.broker.config["request.timeout.ms"]) / 1000
            try:
                return await conn.request(api_key, version, body, timeout_s)
            except (BrokerConnectionError, OSError, TimeoutError):
                conn.close()
                self._conns.pop(node, None)
                raise

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    # -- SharePersister --------------------------------------------------------------------

    async def initialize_state(self, entries: list[InitializeEntry]) -> Results:
        errors: dict[StateKey, ErrorCode] = {}
        for group_id, group in _by_group([(e.key, e) for e in entries]).items():
            got = await self._call(INITIALIZE, group_id, [
                (e.key, {"partition": e.key.partition, "state_epoch": e.state_epoch,
                         "start_offset": e.start_offset}) for e in group])
            errors.update(_errors(got))
        return Results(errors)

    async def read_state(self, keys: list[StateKey], leader_epoch: int
                         ) -> dict[StateKey, ReadStateResult]:
        out: dict[StateKey, ReadStateResult] = {}
        for group_id, group in _by_group([(k, k) for k in keys]).items():
            got = await self._call(READ, group_id, [
                (k, {"partition": k.partition, "leader_epoch": leader_epoch}) for k in group])
            for k, r in got.items():
                if isinstance(r, ErrorCode):
                    out[k] = ReadStateResult(r)
                elif r.error_code != 0:
                    out[k] = ReadStateResult(_error_code(r.error_code),
                                             error_message=r.error_message)
                elif (bad := _bad_batches(r)) is not None:  # a peer's answer, checked
                    out[k] = ReadStateResult(ErrorCode.unknown_server_error,
                                             error_message=bad)
                else:
                    out[k] = ReadStateResult(ErrorCode.none, int(r.state_epoch),
                                             int(r.start_offset), tuple(
                        PersisterStateBatch(int(b.first_offset), int(b.last_offset),
                                            int(b.delivery_state), int(b.delivery_count))
                        for b in r.state_batches))
        return out

    async def write_state(self, entries: list[WriteEntry]) -> Results:
        errors: dict[StateKey, ErrorCode] = {}
        for group_id, group in _by_group([(e.key, e) for e in entries]).items():
            got = await self._call(WRITE, group_id, [
                (e.key, {"partition": e.key.partition, "state_epoch": e.write.state_epoch,
                         "leader_epoch": e.leader_epoch, "start_offset": e.write.start_offset,
                         "delivery_complete_count": e.write.delivery_complete_count,
                         "state_batches": [
                             {"first_offset": b.first_offset, "last_offset": b.last_offset,
                              "delivery_state": b.delivery_state,
                              "delivery_count": b.delivery_count}
                             for b in e.write.state_batches]}) for e in group])
            errors.update(_errors(got))
        return Results(errors)

    async def delete_state(self, keys: list[StateKey]) -> Results:
        errors: dict[StateKey, ErrorCode] = {}
        for group_id, group in _by_group([(k, k) for k in keys]).items():
            got = await self._call(DELETE, group_id, [
                (k, {"partition": k.partition}) for k in group])
            errors.update(_errors(got))
        return Results(errors)

    async def read_state_summary(self, keys: list[StateKey], leader_epoch: int = -1
                                 ) -> dict[StateKey, StateSummary]:
        out: dict[StateKey, StateSummary] = {}
        for group_id, group in _by_group([(k, k) for k in keys]).items():
            got = await self._call(SUMMARY, group_id, [
                (k, {"partition": k.partition, "leader_epoch": leader_epoch}) for k in group])
            for k, r in got.items():
                if isinstance(r, ErrorCode):
                    out[k] = StateSummary(r)
                elif r.error_code != 0:
                    out[k] = StateSummary(_error_code(r.error_code),
                                          error_message=r.error_message)
                else:
                    out[k] = StateSummary(ErrorCode.none, int(r.state_epoch),
                                          int(getattr(r, "leader_epoch", -1)),
                                          int(r.start_offset),
                                          int(getattr(r, "delivery_complete_count", -1)))
        return out


def _by_group(items: list[tuple[StateKey, Any]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for key, item in items:
        out.setdefault(key.group_id, []).append(item)
    return out


def _errors(got: dict[StateKey, Any]) -> dict[StateKey, ErrorCode]:
    out: dict[StateKey, ErrorCode] = {}
    for k, r in got.items():
        code = r if isinstance(r, ErrorCode) else _error_code(r.error_code)
        if code is not ErrorCode.none:
            out[k] = code
    return out


def _error_code(raw: int) -> ErrorCode:
    """A peer's error code; one Kafka does not define is UNKNOWN_SERVER_ERROR."""
    try:
        return ErrorCode(int(raw))
    except ValueError:
        return ErrorCode.unknown_server_error


def _body(group_id: str, keys: list[tuple[StateKey, dict[str, Any]]]) -> dict[str, Any]:
    by_topic: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for key, fields in keys:
        by_topic.setdefault(key.topic_id, []).append(fields)
    return {"group_id": group_id, "topics": [{"topic_id": t, "partitions": ps}
                                             for t, ps in by_topic.items()]}
