"""DescribeTopicPartitions (75, KIP-966): topics' partitions, paginated by a cursor.

Kafka's answer (``DescribeTopicPartitionsRequestHandler``,
``KRaftMetadataCache.getTopicMetadataForDescribeTopicResponse``):

* ``topics`` empty asks for every topic (then a topic that vanishes is skipped), else the
  named ones (then an unknown name is UNKNOWN_TOPIC_OR_PARTITION, an illegal one
  INVALID_TOPIC_EXCEPTION). Only names at or after the cursor's topic are considered, in
  name order; a named list must contain the cursor's topic and the cursor's partition must
  not be negative, else every requested topic is answered INVALID_REQUEST (Kafka's
  ``getErrorResponse``).
* At most ``max(min(response_partition_limit, 2000), 1)`` partitions are returned (2000:
  Kafka's ``max.request.partition.size.limit`` default), the cursor's topic from the
  cursor's partition, the others from 0. A topic cut short sets ``next_cursor`` to its
  first partition left out; a limit used up exactly at a topic's end sets it to the next
  topic's partition 0; no cursor when everything fitted.
* A partition: leader (-1 when the leader is not a live broker or its log is offline here,
  as Metadata says), leader epoch, replicas, ISR, offline replicas, empty eligible-leader
  lists (no KIP-966 ELR here), error 0. ``topic_authorized_operations`` is the
  principal's topic operations (every one without an authorizer).
* Authorization (``DescribeTopicPartitionsRequestHandler``): topics the principal may not
  DESCRIBE are dropped before the cursor and limit apply; asked for by name, each is
  answered TOPIC_AUTHORIZATION_FAILED (zero topic id, not internal, no partitions,
  operations unset) after the others; when every topic is asked for they are left out.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.security import DESCRIBE
from headrace.broker.security import TOPIC as ACL_TOPIC
from headrace.broker.topics import KAFKA_INTERNAL_TOPICS, TopicError, validate_topic_name
from headrace.metadata.store import TopicState

if TYPE_CHECKING:
    from headrace.broker.server import Broker

MAX_PARTITION_LIMIT = 2000  # Kafka's max.request.partition.size.limit default
# AclEntry.supportedOperations(TOPIC) as a bit field: READ 3, WRITE 4, CREATE 5, DELETE 6,
# ALTER 7, DESCRIBE 8, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11 (Utils.to32BitField)
TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
UNKNOWN_AUTHORIZED_OPERATIONS = -2147483648
ZERO_UUID = uuid.UUID(int=0)


def _partitions(broker: Broker, topic: TopicState, start: int, stop: int,
                live: set[int]) -> list[dict[str, Any]]:
    out = []
    for i in range(start, stop):
        p = topic.partitions[i]
        offline = {r for r in p.replicas if r not in live}
        hosted = broker.replicas.get(TopicPartition(topic.name, i))
        if hosted is not None and hosted.log.offline is not None:
            offline.add(broker.node_id)
        out.append({
            "error_code": ErrorCode.none,
            "partition_index": i,
            "leader_id": p.leader if p.leader in live and p.leader not in offline else -1,
            "leader_epoch": p.leader_epoch,
            "replica_nodes": tuple(p.replicas),
            "isr_nodes": tuple(p.isr),
            "eligible_leader_replicas": (),
            "last_known_elr": (),
            "offline_replicas": tuple(r for r in p.replicas if r in offline),
        })
    return out


def _error_topic(name: str, code: ErrorCode, authorized: int) -> dict[str, Any]:
    return {"error_code": code, "name": name, "topic_id": ZERO_UUID,
            "is_internal": name in KAFKA_INTERNAL_TOPICS, "partitions": [],
            "topic_authorized_operations": authorized}


def _invalid_request(ctx: RequestContext, req: Any) -> Any:
    return ctx.response({"throttle_time": 0, "next_cursor": None, "topics": [
        {"error_code": ErrorCode.invalid_request, "name": t.name, "topic_id": ZERO_UUID,
         "is_internal": False, "partitions": [],
         "topic_authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS}
        for t in req.topics]})


@handler(75, "DescribeTopicPartitions", 0, 0)
async def handle_describe_topic_partitions(broker: Broker, ctx: RequestContext,
                                           req: Any) -> Any:
    store = broker.metadata
    cursor = req.cursor
    cursor_name = cursor.topic_name if cursor is not None else ""
    fetch_all = not req.topics
    if fetch_all:
        names = {n for n in store.topics() if n >= cursor_name}
    else:
        names = {t.name for t in req.topics if t.name >= cursor_name}
        if cursor is not None and cursor.topic_name not in names:
            return _invalid_request(ctx, req)
    if cursor is not None and cursor.partition_index < 0:
        return _invalid_request(ctx, req)
    security = broker.security
    described = security.allowed_names(ctx, DESCRIBE, ACL_TOPIC, names)
    unauthorized = [] if fetch_all else [
        {"error_code": ErrorCode.topic_authorization_failed, "name": name,
         "topic_id": ZERO_UUID, "is_internal": False, "partitions": [],
         "topic_authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS}
        for name in sorted(names - described)]
    names = described
    remaining = max(min(MAX_PARTITION_LIMIT, int(req.response_partition_limit)), 1)
    live = {b.node_id for b in store.live_brokers()}
    topics: list[dict[str, Any]] = []
    next_cursor: dict[str, Any] | None = None
    for name in sorted(names):
        if remaining == 0:
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        topic = store.topic(name)
        if topic is None:
            if not fetch_all:
                try:
                    validate_topic_name(name)
                    code = ErrorCode.unknown_topic_or_partition
                except TopicError as e:
                    code = e.error_code
                topics.append(_error_topic(
                    name, code, security.authorized_operations(ctx, ACL_TOPIC, name)))
            continue
        n = len(topic.partitions)
        start = int(cursor.partition_index) if cursor is not None and name == cursor_name else 0
        stop = min(n, start + remaining)
        partitions = _partitions(broker, topic, start, stop, live) if start < stop else []
        topics.append({"error_code": ErrorCode.none, "name": name, "topic_id": topic.topic_id,
                       "is_internal": name in KAFKA_INTERNAL_TOPICS, "partitions": partitions,
                       "topic_authorized_operations":
                           security.authorized_operations(ctx, ACL_TOPIC, name)})
        if stop < n:
            next_cursor = {"topic_name": name, "partition_index": stop}
            break
        remaining -= len(partitions)
    return ctx.response({"throttle_time": 0, "topics": topics + unauthorized,
                         "next_cursor": next_cursor})
