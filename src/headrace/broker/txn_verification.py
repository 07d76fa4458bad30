"""Transaction verification (KIP-890 part 1; issue 23): before a partition leader appends
the first batch of a producer's transaction, it asks the transaction coordinator whether
the partition is in that producer's ongoing transaction (Kafka's
``AddPartitionsToTxnManager``). Without it, a transactional batch for a producer id the
coordinator never gave out, or for a partition never added with AddPartitionsToTxn, would
open a transaction nobody ever ends: the partition's last stable offset would stay there
and every read_committed consumer would stall on it.

- The coordinator of ``transactional_id`` is the leader of its ``__transaction_state``
  partition, read from the metadata (the topic is never created here: no topic, no
  transaction, COORDINATOR_NOT_AVAILABLE).
- **This broker is the coordinator**: the coordinator's pure check
  (``TxnCoordinator.verify_partitions``) is called directly.
- **Another broker is**: AddPartitionsToTxn v4 with ``verify_only`` (the inter-broker,
  batched form). One request in flight per coordinator broker; what arrives meanwhile
  waits in that broker's queue and goes in the next request (one entry per transactional
  id: a request of the same producer and epoch joins it; a newer epoch fences the queued
  one and an older one is fenced, INVALID_PRODUCER_EPOCH, as Kafka's ``addTxnData``).
  The connection is this module's own (``BrokerConnection`` serves one request at a time).
- Answers as Kafka's manager hands them to ``ReplicaManager``: PRODUCER_FENCED becomes
  INVALID_PRODUCER_EPOCH; a top-level CLUSTER_AUTHORIZATION_FAILED becomes
  INVALID_TXN_STATE; a failed connection or timeout is NETWORK_EXCEPTION for every waiter.
  The produce handler turns the retriable ones into NOT_ENOUGH_REPLICAS
  (``produce.verification_error``).

Nothing blocks the event loop: a waiter awaits a future resolved by the queue's task,
which is tracked by the broker and always resolves every future it took (on failure with
NETWORK_EXCEPTION), so no produce request waits past ``request.timeout.ms`` plus the
connection timeout.

Thread-safety: everything runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.memory_pool import LogPacer
from headrace.cluster.client import BrokerConnection, BrokerConnectionError

if TYPE_CHECKING:
    from headrace.broker.txn_service import TxnService

log = logging.getLogger("headrace.transactions")

ADD_PARTITIONS_TO_TXN = 24
VERIFY_VERSION = 4  # the first inter-broker (batched, verify_only) version
CONNECT_TIMEOUT_S = 5.0

TopicPartition = tuple[str, int]
Errors = dict[TopicPartition, ErrorCode]


@dataclass(slots=True)
class _Waiter:
    partitions: list[TopicPartition]
    future: asyncio.Future[Errors]


@dataclass(slots=True)
class _Queued:
    """One transactional id's verification waiting for the next request to its
    coordinator."""

    producer_id: int
    producer_epoch: int
    waiters: list[_Waiter] = field(default_factory=list)

    def partitions(self) -> list[TopicPartition]:
        return sorted({tp for w in self.waiters for tp in w.partitions})


def _resolve(waiter: _Waiter, errors: Errors) -> None:
    if not waiter.future.done():
        waiter.future.set_result({tp: errors[tp] for tp in waiter.partitions
                                  if tp in errors and errors[tp] is not ErrorCode.none})


def _fail(queued: _Queued, error: ErrorCode) -> None:
    for w in queued.waiters:
        _resolve(w, dict.fromkeys(w.partitions, error))


def broker_facing(error: ErrorCode) -> ErrorCode:
    """A coordinator's per-partition answer as Kafka's manager passes it on."""
    return ErrorCode.invalid_producer_epoch if error is ErrorCode.producer_fenced else error


class TxnVerifier:
    def __init__(self, txns: TxnService) -> None:
        self.txns = txns
        self.broker = txns.broker
        self._queues: dict[int, dict[str, _Queued]] = {}
        self._sending: set[int] = set()
        self._conns: dict[int, BrokerConnection] = {}
        self._closed = False
        self._failure_log = LogPacer(10.0)
        self.asked = 0  # partitions verified with a coordinator (here or remote), any answer

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                     partitions: list[TopicPartition]) -> Errors:
        """The partitions that are *not* verified, with why (empty: every one is in the
        producer's ongoing transaction)."""
        self.asked += len(partitions)
        node = self.txns.coordinator_node(transactional_id, create=False)
        if self._closed or node is None or node < 0:
            return dict.fromkeys(partitions, ErrorCode.coordinator_not_available)
        if node == self.broker.node_id:
            error, coordinator = self.txns.coordinator_for(transactional_id, create=False)
            if coordinator is None:
                return dict.fromkeys(partitions, error)
            answer = coordinator.verify_partitions(transactional_id, producer_id,
                                                   producer_epoch, partitions)
            return {tp: broker_facing(code) for tp, code in answer.items()
                    if code is not ErrorCode.none}
        return await self._remote(node, transactional_id, producer_id, producer_epoch,
                                  partitions)

    # ------------------------------------------------------------------ remote coordinators
    async def _remote(self, node: int, tid: str, producer_id: int, epoch: int,
                      partitions: list[TopicPartition]) -> Errors:
        queue = self._queues.setdefault(node, {})
        queued = queue.get(tid)
        if queued is not None and (queued.producer_id, queued.producer_epoch) != (
                producer_id, epoch):
            if queued.producer_epoch > epoch:
                return dict.fromkeys(partitions, ErrorCode.invalid_producer_epoch)
            # Kafka: a newer epoch fences the queued one; another producer id (a new
            # producer id after an exhausted epoch) replaces it alike
            _fail(queued, ErrorCode.invalid_producer_epoch)
            queued = None
        if queued is None:
            queued = queue[tid] = _Queued(producer_id, epoch)
        waiter = _Waiter(list(partitions), asyncio.get_running_loop().create_future())
        queued.waiters.append(waiter)
        if node not in self._sending:
            self._sending.add(node)
            task = asyncio.get_running_loop().create_task(self._send_loop(node))
            self.broker.track(task)
        return await waiter.future

    async def _send_loop(self, node: int) -> None:
        """Send the node's queue, one request at a time, until it is empty."""
        try:
            while not self._closed:
                batch = self._queues.pop(node, None)
                if not batch:
                    break
                try:
                    answers = await self._send(node, batch)
                except Exception as e:  # every waiter must hear something
                    self._note_failure(node, e)
                    self._drop_connection(node)
                    answers = {}
                for tid, queued in batch.items():
                    errors = answers.get(tid)
                    if errors is None:
                        _fail(queued, ErrorCode.network_exception)
                    else:
                        for w in queued.waiters:
                            _resolve(w, errors)
        finally:
            self._sending.discard(node)
            if self._closed:
                for queued in self._queues.pop(node, {}).values():
                    _fail(queued, ErrorCode.network_exception)

    async def _send(self, node: int, batch: dict[str, _Queued]) -> dict[str, Errors]:
        transactions = []
        for tid, queued in batch.items():
            by_topic: dict[str, list[int]] = {}
            for t, p in queued.partitions():
                by_topic.setdefault(t, []).append(p)
            transactions.append({
                "transactional_id": tid, "producer_id": queued.producer_id,
                "producer_epoch": queued.producer_epoch, "verify_only": True,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]})
        conn = await self._connection(node)
        timeout_s = int(self.broker.config["request.timeout.ms"]) / 1000
        resp = await conn.request(ADD_PARTITIONS_TO_TXN, VERIFY_VERSION,
                                  {"transactions": transactions}, timeout_s)
        return self._read_answer(resp, batch)

    @staticmethod
    def _read_answer(resp: Any, batch: dict[str, _Queued]) -> dict[str, Errors]:
        top = ErrorCode(resp.error_code)
        if top is not ErrorCode.none:
            # Kafka: the client must not see CLUSTER_AUTHORIZATION_FAILED: not verified
            error = (ErrorCode.invalid_txn_state
                     if top is ErrorCode.cluster_authorization_failed else top)
            return {tid: dict.fromkeys(q.partitions(), error) for tid, q in batch.items()}
        out: dict[str, Errors] = {}
        for result in resp.results_by_transaction:
            tid = str(result.transactional_id)
            queued = batch.get(tid)
            if queued is None:
                continue
            answered: Errors = {}
            for t in result.topic_results:
                for p in t.results_by_partition:
                    answered[(str(t.name), int(p.partition_index))] = broker_facing(
                        ErrorCode(p.partition_error_code))
            # a partition the coordinator did not answer for is not verified
            out[tid] = {tp: answered.get(tp, ErrorCode.invalid_txn_state)
                        for tp in queued.partitions()}
        return out

    def _note_failure(self, node: int, e: BaseException) -> None:
        held = self._failure_log.ready(time.monotonic())
        if held is not None:
            log.warning("transaction verification with broker %d failed: %s%s", node,
                        e if isinstance(e, (BrokerConnectionError, OSError, TimeoutError))
                        else f"{type(e).__name__}: {e}",
                        f" ({held} more since the last line)" if held else "")

    async def _connection(self, node: int) -> BrokerConnection:
        conn = self._conns.get(node)
        if conn is not None and conn.connected:
            return conn
        info = next((b for b in self.broker.metadata.live_brokers() if b.node_id == node),
                    None)
        if info is None:
            raise BrokerConnectionError(f"broker {node} is not registered")
        conn = BrokerConnection(info.host, info.port,
                                f"headrace-txn-verification-{self.broker.node_id}", 1 << 20,
                                self.broker.inter_broker)
        await conn.connect(CONNECT_TIMEOUT_S)
        self._conns[node] = conn
        return conn

    def _drop_connection(self, node: int) -> None:
        conn = self._conns.pop(node, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._closed = True
        for queue in self._queues.values():
            for queued in queue.values():
                _fail(queued, ErrorCode.network_exception)
        self._queues.clear()
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
