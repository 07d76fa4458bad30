"""AddPartitionsToTxn (24) v0-5: partitions join a producer's transaction (issue 10), or
a partition leader verifies that they did (v4+, KIP-890; issue 23).

The client form (v0-3): as Kafka, a partition of an unknown topic is
UNKNOWN_TOPIC_OR_PARTITION and then every other partition OPERATION_NOT_ATTEMPTED;
otherwise the coordinator's answer (NOT_COORDINATOR, CONCURRENT_TRANSACTIONS,
PRODUCER_FENCED, ...) goes to every partition; v0-v1 hear INVALID_PRODUCER_EPOCH for
PRODUCER_FENCED, which they do not know (KIP-588, Kafka's
``handleAddPartitionToTxnRequest``). The new state is written to ``__transaction_state``
before the answer.

The broker form (v4+, Kafka's ``handleAddPartitionsToTxnRequest``): a batch of
transactions, from another broker only (CLUSTER_ACTION on the cluster, else the top-level
CLUSTER_AUTHORIZATION_FAILED); each with ``verify_only`` is checked against the
coordinator's state and changes nothing (``TxnCoordinator.verify_partitions``: NONE or
INVALID_TXN_STATE per partition, or the id's error for all); without it, its partitions
are added as in the client form. A null transactional id is INVALID_REQUEST.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import CLUSTER_ACTION, TOPIC, TRANSACTIONAL_ID, WRITE

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def _answer(req_topics: Any, codes: dict[tuple[str, int], ErrorCode]) -> list[dict[str, Any]]:
    return [{"name": t.name, "results_by_partition": [
        {"partition_index": p, "partition_error_code": codes[(str(t.name), int(p))]}
        for p in t.partitions]} for t in req_topics]


@handler(24, "AddPartitionsToTxn", 0, 5)
async def handle_add_partitions_to_txn(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    if ctx.api_version >= 4:
        return await _handle_batched(broker, ctx, req)
    tid = str(req.v3_and_below_transactional_id)
    pid = int(req.v3_and_below_producer_id)
    epoch = int(req.v3_and_below_producer_epoch)
    wanted = [(str(t.name), int(p)) for t in req.v3_and_below_topics for p in t.partitions]
    # Kafka: WRITE on the transactional id (every partition refused), then on each topic
    # (TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED)
    security = broker.security
    if security.enabled:
        if not security.allowed(ctx, WRITE, TRANSACTIONAL_ID, tid):
            codes = dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
            return ctx.response({"throttle_time": 0, "results_by_topic_v3_and_below":
                                 _answer(req.v3_and_below_topics, codes)})
        writable = security.allowed_names(ctx, WRITE, TOPIC, (t for t, _ in wanted))
        if any(t not in writable for t, _ in wanted):
            codes = {tp: (ErrorCode.topic_authorization_failed if tp[0] not in writable
                          else ErrorCode.operation_not_attempted) for tp in wanted}
            return ctx.response({"throttle_time": 0, "results_by_topic_v3_and_below":
                                 _answer(req.v3_and_below_topics, codes)})
    codes = await _add(broker, tid, pid, epoch, wanted)
    if ctx.api_version < 2:  # Kafka (KIP-588): v0-v1 clients know INVALID_PRODUCER_EPOCH
        codes = {tp: (ErrorCode.invalid_producer_epoch if code is ErrorCode.producer_fenced
                      else code) for tp, code in codes.items()}
    return ctx.response({"throttle_time": 0,
                         "results_by_topic_v3_and_below": _answer(req.v3_and_below_topics,
                                                                  codes)})


def _unknown(broker: Broker, wanted: list[tuple[str, int]]
             ) -> dict[tuple[str, int], ErrorCode] | None:
    unknown = set()
    for topic, p in wanted:
        state = broker.metadata.topic(topic)
        if state is None or not 0 <= p < len(state.partitions):
            unknown.add((topic, p))
    if not unknown:
        return None
    return {tp: (ErrorCode.unknown_topic_or_partition if tp in unknown
                 else ErrorCode.operation_not_attempted) for tp in wanted}


async def _add(broker: Broker, tid: str, pid: int, epoch: int,
               wanted: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
    unknown = _unknown(broker, wanted)
    if unknown is not None:
        return unknown
    err, coordinator = broker.txns.coordinator_for(tid)
    if coordinator is not None:
        out = coordinator.add_partitions(tid, pid, epoch, wanted, broker.txns.now_ms())
        err = out.error
        if out.write is not None:
            written = await broker.txns.write(coordinator, out.write)
            if err is ErrorCode.none:
                err = written
    return dict.fromkeys(wanted, err)


def _verify(broker: Broker, tid: str, pid: int, epoch: int,
            wanted: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
    unknown = _unknown(broker, wanted)
    if unknown is not None:
        return unknown
    err, coordinator = broker.txns.coordinator_for(tid, create=False)
    if coordinator is None:
        return dict.fromkeys(wanted, err)
    return coordinator.verify_partitions(tid, pid, epoch, wanted)


def _result(tid: Any, codes: dict[tuple[str, int], ErrorCode]) -> dict[str, Any]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, p), code in codes.items():
        by_topic.setdefault(topic, []).append({"partition_index": p,
                                               "partition_error_code": code})
    return {"transactional_id": tid, "topic_results": [
        {"name": t, "results_by_partition": ps} for t, ps in by_topic.items()]}


async def _handle_batched(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    if not broker.security.cluster_allowed(ctx, CLUSTER_ACTION):  # Kafka: brokers only
        return ctx.response({"throttle_time": 0,
                             "error_code": ErrorCode.cluster_authorization_failed,
                             "results_by_transaction": []})
    results = []
    for txn in req.transactions:
        wanted = list(dict.fromkeys((str(t.name), int(p)) for t in txn.topics
                                    for p in t.partitions))
        if txn.transactional_id is None:
            codes = dict.fromkeys(wanted, ErrorCode.invalid_request)
        elif txn.verify_only:
            codes = _verify(broker, str(txn.transactional_id), int(txn.producer_id),
                            int(txn.producer_epoch), wanted)
        else:
            codes = await _add(broker, str(txn.transactional_id), int(txn.producer_id),
                               int(txn.producer_epoch), wanted)
        results.append(_result(txn.transactional_id, codes))
    return ctx.response({"throttle_time": 0, "error_code": ErrorCode.none,
                         "results_by_transaction": results})
