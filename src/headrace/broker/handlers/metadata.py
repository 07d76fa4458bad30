"""Metadata (3): brokers, controller, topics with partitions, leaders, replicas, ISR.

``topics=None`` asks for every topic, ``topics=[]`` for brokers only. A topic that does not
exist is created when both the broker (``auto.create.topics.enable``) and the request
(``allow_auto_topic_creation``, v4+) allow it, with ``num.partitions`` partitions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.security import CLUSTER, CLUSTER_NAME, CREATE, DESCRIBE, TOPIC
from headrace.broker.topics import INTERNAL_TOPICS, TopicError, validate_topic_name
from headrace.metadata.store import TopicState

if TYPE_CHECKING:
    from headrace.broker.server import Broker

UNKNOWN_AUTHORIZED_OPERATIONS = -2147483648


def topic_entry(broker: Broker, topic: TopicState) -> dict[str, Any]:
    live = {b.node_id for b in broker.metadata.live_brokers()}
    partitions = []
    for i, p in enumerate(topic.partitions):
        offline = {r for r in p.replicas if r not in live}
        hosted = broker.replicas.get(TopicPartition(topic.name, i))
        if hosted is not None and hosted.log.offline is not None:
            offline.add(broker.node_id)  # its log hit an I/O error (Kafka: offline log dir)
        leader = p.leader if p.leader not in offline and p.leader in live else -1
        partitions.append(
            {
                "error_code": 0 if leader >= 0 else ErrorCode.leader_not_available,
                "partition_index": i,
                "leader_id": leader,
                "leader_epoch": p.leader_epoch,
                "replica_nodes": tuple(p.replicas),
                # the ISR as the controller and leader wrote it (Kafka's metadata cache): a
                # dead broker stays in it until they remove it; a log offline here does not
                "isr_nodes": tuple(r for r in p.isr
                                   if not (r == broker.node_id and r in offline)),
                "offline_replicas": tuple(r for r in p.replicas if r in offline),
            }
        )
    return {
        "error_code": 0,
        "name": topic.name,
        "topic_id": topic.topic_id,
        "is_internal": topic.name in INTERNAL_TOPICS,
        "partitions": partitions,
        "topic_authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS,
    }


def error_entry(name: str | None, code: ErrorCode) -> dict[str, Any]:
    import uuid

    return {
        "error_code": code,
        "name": name,
        "topic_id": uuid.UUID(int=0),
        "is_internal": False,
        "partitions": (),
        "topic_authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS,
    }


@handler(3, "Metadata", 0, 12)
async def handle_metadata(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    store = broker.metadata
    security = broker.security
    topics: list[dict[str, Any]] = []
    if req.topics is None:
        # Kafka: the topics the principal may DESCRIBE (the others left out)
        names = security.allowed_names(ctx, DESCRIBE, TOPIC, store.topics())
        topics = [topic_entry(broker, t) for t in list(store.topics().values())
                  if t.name in names]
    elif ctx.api_version < 12 and any(
            t.name is None or getattr(t, "topic_id", None) is not None for t in req.topics):
        return _invalid_before_v12(ctx, req)
    else:
        allow_auto = getattr(req, "allow_auto_topic_creation", True)
        for t in req.topics:
            name = t.name
            if name is None:
                topic_id = getattr(t, "topic_id", None)
                found = store.topic_by_id(topic_id) if topic_id is not None else None
                if found is None or not security.allowed(ctx, DESCRIBE, TOPIC, found.name):
                    topics.append(error_entry(None, ErrorCode.unknown_topic_id))
                else:
                    topics.append(topic_entry(broker, found))
                continue
            if not security.allowed(ctx, DESCRIBE, TOPIC, name):  # Kafka: DESCRIBE on it
                topics.append(error_entry(name, ErrorCode.topic_authorization_failed))
                continue
            topic = store.topic(name)
            if topic is None:
                try:
                    validate_topic_name(name)
                except TopicError as e:
                    topics.append(error_entry(name, e.error_code))
                    continue
                if allow_auto and broker.config["auto.create.topics.enable"]:
                    if not (security.cluster_allowed(ctx, CREATE)
                            or security.allowed(ctx, CREATE, TOPIC, name)):
                        topics.append(error_entry(name, ErrorCode.topic_authorization_failed))
                        continue
                    try:
                        topic = broker.topics.auto_create(name)
                    except TopicError as e:
                        topics.append(error_entry(name, e.error_code))
                        continue
                else:
                    topics.append(error_entry(name, ErrorCode.unknown_topic_or_partition))
                    continue
            topics.append(topic_entry(broker, topic))
    if getattr(req, "include_topic_authorized_operations", False):
        for t in topics:
            if t["error_code"] == 0:
                t["topic_authorized_operations"] = security.authorized_operations(
                    ctx, TOPIC, t["name"])
    cluster_operations = UNKNOWN_AUTHORIZED_OPERATIONS
    if getattr(req, "include_cluster_authorized_operations", False):
        cluster_operations = security.authorized_operations(ctx, CLUSTER, CLUSTER_NAME)
    return ctx.response(
        {
            "throttle_time": 0,
            "brokers": [
                {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
                for b in broker.advertised_brokers(ctx.listener)
            ],
            "cluster_id": store.cluster_id,
            "controller_id": store.controller_id(),
            "topics": topics,
            "cluster_authorized_operations": cluster_operations,
        }
    )


def _invalid_before_v12(ctx: RequestContext, req: Any) -> Any:
    """Kafka's answer to a v10/v11 request naming a topic by id or with a null name
    (``KafkaApis.handleTopicMetadataRequest`` throws InvalidRequestException, answered by
    ``MetadataRequest.getErrorResponse``): INVALID_REQUEST for every requested topic, a
    null name as "" (v10/v11 responses have no null names), no brokers."""
    import uuid

    return ctx.response({
        "throttle_time": 0, "brokers": [], "cluster_id": None, "controller_id": -1,
        "cluster_authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS,
        "topics": [{"error_code": ErrorCode.invalid_request, "name": t.name or "",
                    "topic_id": getattr(t, "topic_id", None) or uuid.UUID(int=0),
                    "is_internal": False, "partitions": (),
                    "topic_authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS}
                   for t in req.topics],
    })
