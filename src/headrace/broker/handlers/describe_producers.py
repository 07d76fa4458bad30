"""DescribeProducers (61): the active idempotent producers of partitions (KIP-664).

Kafka's answer (``KafkaApis.handleDescribeProducersRequest``, ``Partition.activeProducerState``):
per topic, an illegal name is INVALID_TOPIC_EXCEPTION and an unknown one
UNKNOWN_TOPIC_OR_PARTITION, for each requested partition with the error's message (Kafka's
default message for the latter); a
partition hosted here (leader or follower: any replica with the log answers) lists every
producer id its log keeps state for (``ProducerStateManager``: rebuilt from the batch
headers at open, so it survives a restart) with its epoch, the last sequence and the max
timestamp of its last batch (-1 when none is left), the coordinator epoch of its newest
transaction marker (-1: none yet) and the first offset of its transaction open in the
partition (-1: none), as Kafka's ``ProducerStateEntry`` (``coordinatorEpoch``,
``currentTxnFirstOffset``), which ``kafka-transactions.sh find-hanging`` and ``abort`` read
(issue 23); a partition of a known topic not hosted
here is NOT_LEADER_OR_FOLLOWER, one out of range UNKNOWN_TOPIC_OR_PARTITION; an offline
log KAFKA_STORAGE_ERROR.

Authorization (Kafka's order): a valid name the principal may not READ is
TOPIC_AUTHORIZATION_FAILED for each requested partition, before the topic's existence is
looked at.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.security import READ, TOPIC
from headrace.broker.topics import TopicError, validate_topic_name
from headrace.log.producer_state import ProducerStateManager

if TYPE_CHECKING:
    from headrace.broker.server import Broker

# Kafka's ApiError(UNKNOWN_TOPIC_OR_PARTITION): the error's default message
UNKNOWN_TOPIC_MESSAGE = "This server does not host this topic-partition."
# ApiError(TOPIC_AUTHORIZATION_FAILED): the error's default message
TOPIC_AUTHORIZATION_MESSAGE = "Topic authorization failed."
NO_TXN_START_OFFSET = -1


def active_producers(state: ProducerStateManager,
                     ongoing: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """``ongoing``: producer id -> first offset of its open transaction
    (``TxnTracker.ongoing``)."""
    ongoing = ongoing or {}
    out = []
    for pid, entry in sorted(state.producers.items()):
        last = entry.batches[-1] if entry.batches else None
        out.append({
            "producer_id": pid,
            "producer_epoch": entry.epoch,
            "last_sequence": last.last_seq if last is not None else -1,
            "last_timestamp": last.timestamp if last is not None else -1,
            "coordinator_epoch": entry.coordinator_epoch,
            "current_txn_start_offset": ongoing.get(pid, NO_TXN_START_OFFSET),
        })
    return out


def _partition(broker: Broker, topic: str, index: int, n_partitions: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"partition_index": index, "error_code": ErrorCode.none,
                             "error_message": None, "active_producers": []}
    p = broker.replicas.get(TopicPartition(topic, index))
    if p is None:
        entry["error_code"] = (ErrorCode.not_leader_or_follower if 0 <= index < n_partitions
                               else ErrorCode.unknown_topic_or_partition)
    elif p.log.offline is not None:
        entry["error_code"] = ErrorCode.kafka_storage_error
    else:
        entry["active_producers"] = active_producers(p.log.producer_state, p.log.txns.ongoing)
    return entry


@handler(61, "DescribeProducers", 0, 0)
async def handle_describe_producers(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    topics = []
    for t in req.topics:
        error: tuple[ErrorCode, str | None] | None = None
        try:
            validate_topic_name(t.name)
        except TopicError as e:
            error = (e.error_code, e.message)
        if error is None and not broker.security.allowed(ctx, READ, TOPIC, t.name):
            error = (ErrorCode.topic_authorization_failed, TOPIC_AUTHORIZATION_MESSAGE)
        state = broker.metadata.topic(t.name) if error is None else None
        if error is None and state is None:
            error = (ErrorCode.unknown_topic_or_partition, UNKNOWN_TOPIC_MESSAGE)
        partitions: list[dict[str, Any]] = []
        for i in t.partition_indexes:
            if error is not None or state is None:
                code, message = error or (ErrorCode.unknown_topic_or_partition,
                                          UNKNOWN_TOPIC_MESSAGE)
                partitions.append({"partition_index": int(i), "error_code": code,
                                   "error_message": message, "active_producers": []})
            else:
                partitions.append(_partition(broker, t.name, int(i), len(state.partitions)))
        topics.append({"name": t.name, "partitions": partitions})
    return ctx.response({"throttle_time": 0, "topics": topics})
