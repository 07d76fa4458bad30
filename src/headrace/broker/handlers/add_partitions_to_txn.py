"""AddPartitionsToTxn (24) v0-3: partitions join a producer's transaction (issue 10).

The client form (v0-3; v4+ is Kafka's broker-to-broker verification, KIP-890, not
advertised). As Kafka: a partition of an unknown topic is UNKNOWN_TOPIC_OR_PARTITION and
then every other partition OPERATION_NOT_ATTEMPTED; otherwise the coordinator's answer
(NOT_COORDINATOR, CONCURRENT_TRANSACTIONS, PRODUCER_FENCED, ...) goes to every partition.
The new state is written to ``__transaction_state`` before the answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import TOPIC, TRANSACTIONAL_ID, WRITE

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def _answer(req_topics: Any, codes: dict[tuple[str, int], ErrorCode]) -> list[dict[str, Any]]:
    return [{"name": t.name, "results_by_partition": [
        {"partition_index": p, "partition_error_code": codes[(str(t.name), int(p))]}
        for p in t.partitions]} for t in req_topics]


@handler(24, "AddPartitionsToTxn", 0, 3)
async def handle_add_partitions_to_txn(broker: Broker, ctx: RequestContext, req: Any) -> Any:
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
    unknown = set()
    for topic, p in wanted:
        state = broker.metadata.topic(topic)
        if state is None or not 0 <= p < len(state.partitions):
            unknown.add((topic, p))
    if unknown:
        codes = {tp: (ErrorCode.unknown_topic_or_partition if tp in unknown
                      else ErrorCode.operation_not_attempted) for tp in wanted}
        return ctx.response({"throttle_time": 0,
                             "results_by_topic_v3_and_below": _answer(req.v3_and_below_topics,
                                                                      codes)})
    err, coordinator = broker.txns.coordinator_for(tid)
    if coordinator is not None:
        out = coordinator.add_partitions(tid, pid, epoch, wanted, broker.txns.now_ms())
        err = out.error
        if out.write is not None:
            written = await broker.txns.write(coordinator, out.write)
            if err is ErrorCode.none:
                err = written
    codes = dict.fromkeys(wanted, err)
    return ctx.response({"throttle_time": 0,
                         "results_by_topic_v3_and_below": _answer(req.v3_and_below_topics,
                                                                  codes)})
