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
  (started broker, new leadership); while it loads its keys answer
  COORDINATOR_LOAD_IN_PROGRESS, and a partition not led here NOT_COORDINATOR;
- **requests** (InitializeShareGroupState 83 ... ReadShareGroupStateSummary 87): the
  request's keys are grouped by coordinator partition; each group is one call of the shard,
  whose records are appended as one batch and committed (the high watermark past them)
  before the shard replays them and the answer goes out, as Kafka writes before it
  responds. A failed append answers COORDINATOR_NOT_AVAILABLE (NOT_COORDINATOR when
  leadership went) for those keys.

``CoordinatorPersister`` is Kafka's ``DefaultStatePersister``: ``broker.share_persister``.
It groups keys by coordinator, calls this broker's service in process for the keys it
coordinates and sends the same requests to the other coordinators over the inter-broker
connection (``cluster.client``), retrying COORDINATOR_LOAD_IN_PROGRESS,
COORDINATOR_NOT_AVAILABLE and NOT_COORDINATOR (after a fresh look at the metadata) with
backoff for up to ``RETRY_S`` (Kafka's ``PersisterStateManager``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
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
LOAD_READ_BYTES = 8 * 1024 * 1024
INITIALIZE, READ, WRITE, DELETE, SUMMARY = 83, 84, 85, 86, 87
# the versions the persister sends (Kafka 4.2's)
VERSIONS = {INITIALIZE: 0, READ: 0, WRITE: 1, DELETE: 0, SUMMARY: 1}
RETRIABLE = {ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
             ErrorCode.not_coordinator}
RETRY_S = 10.0
BACKOFF_S = (0.05, 1.0)


def _config(broker: Broker) -> ShareCoordinatorConfig:
    props: dict[str, str] = {}
    for name in ("share.coordinator.state.topic.num.partitions",
                 "share.coordinator.state.topic.replication.factor",
                 "share.coordinator.state.topic.min.isr",
                 "share.coordinator.state.topic.segment.bytes",
                 "share.coordinator.snapshot.update.records.per.snapshot"):
        try:
            props[name] = str(broker.config[name])
        except (KeyError, TypeError):
            continue
    return ShareCoordinatorConfig.from_properties(props)


class ShareCoordinatorService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config = _config(broker)
        self.shards: dict[int, ShareCoordinatorShard] = {}
        self.loading: set[int] = set()
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
            if state.leader == self.broker.node_id and i not in self.shards:
                self.load_partition(i)

    def partition_led(self, tp: TopicPartition) -> None:
        if tp.topic == STATE_TOPIC and not self._closed:
            self.shards.pop(tp.partition, None)
            self.load_partition(tp.partition)

    def partition_unloaded(self, tp: TopicPartition) -> None:
        if tp.topic == STATE_TOPIC and self.shards.pop(tp.partition, None) is not None:
            log.info("no longer coordinating the share-group state of %s", tp)

    def load_partition(self, index: int) -> None:
        partition = self.broker.replicas.get(TopicPartition(STATE_TOPIC, index))
        if partition is None:
            return
        self.loading.add(index)
        shard = ShareCoordinatorShard(self.config)
        bad = 0
        try:
            plog = partition.log
            offset = plog.log_start_offset
            end = plog.log_end_offset if self.broker.cluster is not None else plog.high_watermark
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
                            shard.replay(decode_record(rec.key, rec.value))
                        except (ShareStateRecordError, ValueError):
                            bad += 1
        except (LogError, InvalidRecordError) as e:
            log.error("loading %s-%d failed: %s", STATE_TOPIC, index, e)
            return
        finally:
            self.loading.discard(index)
        if bad:
            log.warning("%d undecodable record(s) skipped in %s-%d", bad, STATE_TOPIC, index)
        self.shards[index] = shard

    def close(self) -> None:
        self._closed = True

    # -- requests -------------------------------------------------------------------------

    def _topics(self) -> dict[uuid.UUID, int]:
        return {t.topic_id: len(t.partitions) for t in self.broker.metadata.topics().values()}

    async def serve(self, api_key: int, request: Any) -> Any:
        """Answer a state request (kio request object, any served version) as Kafka's
        ``ShareCoordinatorService`` does: per coordinator partition, one shard call and
        one committed batch."""
        group_id = str(request.group_id)
        by_partition: dict[int, list[tuple[Any, list[Any]]]] = {}
        order: list[tuple[uuid.UUID | None, int]] = []
        for t in request.topics:
            for p in t.partitions:
                order.append((t.topic_id, int(p.partition)))
                index = (partition_for(group_id, t.topic_id, int(p.partition),
                                       self.num_partitions())
                         if t.topic_id is not None else 0)
                groups = by_partition.setdefault(index, [])
                for entry in groups:
                    if entry[0].topic_id == t.topic_id:
                        entry[1].append(p)
                        break
                else:
                    groups.append((t, [p]))
        results: dict[tuple[uuid.UUID | None, int], Any] = {}
        response_cls = type(request).__name__.replace("Request", "Response")
        for index, topics in by_partition.items():
            code = self.check(index)
            sub = dataclasses.replace(request, topics=tuple(
                dataclasses.replace(t, partitions=tuple(ps)) for t, ps in topics))
            if code is not ErrorCode.none:
                for t, ps in topics:
                    for p in ps:
                        results[(t.topic_id, int(p.partition))] = code
                continue
            shard = self.shards[index]
            shard.on_metadata_update(self._topics())
            method = _METHODS[api_key]
            result = method(shard, sub, self.now_ms())
            if result.records:
                err = await self._append(index, result.records)
                if err is not ErrorCode.none:
                    for t, ps in topics:
                        for p in ps:
                            results[(t.topic_id, int(p.partition))] = err
                    continue
                if self.shards.get(index) is shard:
                    for record in result.records:
                        shard.replay(record)
            for rt in result.response.results:
                for rp in rt.partitions:
                    results[(rt.topic_id, int(rp.partition))] = rp
        return _assemble(request, response_cls, order, results)

    async def _append(self, index: int, records: Any) -> ErrorCode:
        tp = TopicPartition(STATE_TOPIC, index)
        partition = self.broker.replicas.get(tp)
        if partition is None or not partition.is_leader(self.broker.node_id):
            return ErrorCode.not_coordinator
        batch = build_batch([(r.key_bytes(), r.value_bytes()) for r in records], self.now_ms())
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
        timeout_s = int(self.broker.config["request.timeout.ms"]) / 1000
        done = await partition.wait_for_hw(end, timeout_s)
        if done is None:
            return ErrorCode.coordinator_not_available
        return ErrorCode.none if done else ErrorCode.not_coordinator


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


def _assemble(request: Any, response_cls: str, order: list[tuple[uuid.UUID | None, int]],
              results: dict[tuple[uuid.UUID | None, int], Any]) -> Any:
    """The response of ``request``'s version, partitions in the request's order: a shard's
    partition result as it is, an error code as an error result."""
    import importlib

    module = importlib.import_module(type(request).__module__.replace(".request", ".response"))
    cls = getattr(module, response_cls)
    by_topic: dict[uuid.UUID | None, list[Any]] = {}
    for topic_id, index in order:
        r = results[(topic_id, index)]
        if isinstance(r, ErrorCode):
            r = _error_partition(cls, index, r)
        by_topic.setdefault(topic_id, []).append(r)
    return build(cls, {"results": [{"topic_id": t, "partitions": ps}
                                   for t, ps in by_topic.items()]})


def _error_partition(cls: Any, index: int, code: ErrorCode) -> dict[str, Any]:
    return {"partition": index, "error_code": code, "error_message": code.name.upper(),
            "state_epoch": 0, "start_offset": 0, "leader_epoch": -1,
            "delivery_complete_count": -1, "state_batches": []}


async def state_request(broker: Broker, ctx: Any, req: Any, api_key: int) -> Any:
    """A handler of APIs 83-87: CLUSTER_ACTION on the cluster (a broker's request; Kafka's
    ``authorizeClusterOperation``), else CLUSTER_AUTHORIZATION_FAILED for every partition;
    then the service."""
    from headrace.broker.security import CLUSTER_ACTION

    if not broker.security.cluster_allowed(ctx, CLUSTER_ACTION):
        order = [(t.topic_id, int(p.partition)) for t in req.topics for p in t.partitions]
        name = type(req).__name__.replace("Request", "Response")
        return _assemble(req, name, order, dict.fromkeys(
            order, ErrorCode.cluster_authorization_failed))
    service = broker.share_coordinator
    return await service.serve(api_key, req)


# -- the persister ------------------------------------------------------------------------


class CoordinatorPersister:
    """Kafka's ``DefaultStatePersister`` over this broker's ``ShareCoordinatorService``
    and the other brokers' (see the module docstring)."""

    def __init__(self, broker: Broker, service: ShareCoordinatorService) -> None:
        self.broker = broker
        self.service = service
        self._conns: dict[int, BrokerConnection] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    async def _call(self, api_key: int, group_id: str,
                    keys: list[tuple[StateKey, dict[str, Any]]]) -> dict[StateKey, Any]:
        """Send ``keys`` (each with its partition fields) to their coordinators; each key's
        partition result (a kio object) or its ErrorCode after the retries."""
        pending = dict(keys)
        out: dict[StateKey, Any] = {}
        deadline = time.monotonic() + RETRY_S
        backoff = BACKOFF_S[0]
        while pending:
            by_node: dict[int, list[StateKey]] = {}
            for key in pending:
                index = self.service.partition_of(key)
                node = self.service.coordinator_node(index)
                by_node.setdefault(-1 if node is None else node, []).append(key)
            retry: dict[StateKey, dict[str, Any]] = {}
            for node, node_keys in by_node.items():
                if node < 0:
                    codes: dict[StateKey, Any] = dict.fromkeys(
                        node_keys, ErrorCode.coordinator_not_available)
                else:
                    body = _body(group_id, [(k, pending[k]) for k in node_keys])
                    codes = await self._send(node, api_key, body, node_keys)
                for key, r in codes.items():
                    code = r if isinstance(r, ErrorCode) else ErrorCode(int(r.error_code))
                    if code in RETRIABLE and time.monotonic() < deadline:
                        retry[key] = pending[key]
                    else:
                        out[key] = r
            pending = retry
            if pending:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_S[1])
        return out

    async def _send(self, node: int, api_key: int, body: dict[str, Any],
                    keys: list[StateKey]) -> dict[StateKey, Any]:
        version = VERSIONS[api_key]
        if node == self.broker.node_id:
            from kio.index import load_request_schema

            request = build(load_request_schema(api_key, version), body)
            response = await self.service.serve(api_key, request)
        else:
            try:
                response = await self._remote(node, api_key, version, body)
            except (BrokerConnectionError, OSError, TimeoutError) as e:
                log.debug("share state request to broker %d failed: %s", node, e)
                return dict.fromkeys(keys, ErrorCode.coordinator_not_available)
        found: dict[StateKey, Any] = {}
        group_id = str(body["group_id"])
        for rt in response.results:
            for rp in rt.partitions:
                if rt.topic_id is not None:
                    found[StateKey(group_id, rt.topic_id, int(rp.partition))] = rp
        return {k: found.get(k, ErrorCode.unknown_server_error) for k in keys}

    async def _remote(self, node: int, api_key: int, version: int,
                      body: dict[str, Any]) -> Any:
        lock = self._locks.setdefault(node, asyncio.Lock())
        async with lock:  # one request at a time per connection
            conn = self._conns.get(node)
            if conn is None or not conn.connected:
                info = next((b for b in self.broker.metadata.live_brokers()
                             if b.node_id == node), None)
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
                    out[k] = ReadStateResult(ErrorCode(int(r.error_code)),
                                             error_message=r.error_message)
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
                    out[k] = StateSummary(ErrorCode(int(r.error_code)),
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
        code = r if isinstance(r, ErrorCode) else ErrorCode(int(r.error_code))
        if code is not ErrorCode.none:
            out[k] = code
    return out


def _body(group_id: str, keys: list[tuple[StateKey, dict[str, Any]]]) -> dict[str, Any]:
    by_topic: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for key, fields in keys:
        by_topic.setdefault(key.topic_id, []).append(fields)
    return {"group_id": group_id, "topics": [{"topic_id": t, "partitions": ps}
                                             for t, ps in by_topic.items()]}
