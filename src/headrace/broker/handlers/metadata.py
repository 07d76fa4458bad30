"""Metadata (3): brokers, controller, topics with partitions, leaders, replicas, ISR.

``topics=None`` asks for every topic, ``topics=[]`` for brokers only. A topic that does not
exist is created when both the broker (``auto.create.topics.enable``) and the request
(``allow_auto_topic_creation``, v4+) allow it, with ``num.partitions`` partitions.
"""

from __future__ import annotations

import operator
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import CLUSTER, CLUSTER_NAME, CREATE, DESCRIBE, TOPIC
from headrace.broker.topics import KAFKA_INTERNAL_TOPICS, TopicError, validate_topic_name
from headrace.log.partition_log import OFFLINE_EVENTS
from headrace.metadata.store import TopicState
from headrace.protocol.codec import (
    MetadataPartition,
    MetadataTopic,
    encode_metadata_body,
    encode_metadata_partition,
    encode_metadata_topic,
    metadata_topic_ends,
)

if TYPE_CHECKING:
    from headrace.broker.server import Broker

UNKNOWN_AUTHORIZED_OPERATIONS = -2147483648


# Each broker's last entry per topic, with what it was computed from: the topic's state
# object, its partitions' state objects (the stores replace a partition's state object on
# every change, never edit it), the live brokers and the count of logs gone offline in this
# process; then the entry's encodings by API version, and those of the entry before it. A
# Metadata of 30,000 partitions took ~0.3 s of the event loop per request, and clients
# ask again on every NOT_LEADER during a failover (bench/cluster_bench.py --scale): a
# topic whose states did not change is neither rebuilt nor encoded again, and one that
# changed rebuilds and encodes only its changed partitions.
# An encoding: the partition entries it encoded, each one's bytes, and the whole topic's.
_Encoding = tuple[Sequence[MetadataPartition], list[bytes], bytes]
_CacheEntry = tuple[TopicState, tuple[object, ...], frozenset[int], int, MetadataTopic,
                    dict[int, _Encoding], dict[int, _Encoding]]
_CACHES: weakref.WeakKeyDictionary[Any, dict[str, _CacheEntry]] = weakref.WeakKeyDictionary()


def topic_entry(broker: Broker, topic: TopicState, live: set[int] | None = None
                ) -> MetadataTopic:
    """A topic's entry; ``live``: the live broker ids (computed once per request)."""
    if live is None:
        live = {b.node_id for b in broker.metadata.live_brokers()}
    cache = _CACHES.get(broker)
    if cache is None:
        cache = _CACHES[broker] = {}
    hit = cache.get(topic.name)
    offline_events = OFFLINE_EVENTS[0]
    states = topic.partitions
    before: dict[int, _Encoding] = {}
    if hit is not None and hit[3] == offline_events and hit[2] == live:
        if (hit[0] is topic and len(hit[1]) == len(states)
                and all(map(operator.is_, hit[1], states))):
            return hit[4]
        entry = _topic_entry(broker, topic, live, hit[1], hit[4].partitions)
        before = {**hit[6], **hit[5]}  # any earlier encoding: reused where it matches
    else:
        entry = _topic_entry(broker, topic, live)
    cache[topic.name] = (topic, tuple(states), frozenset(live), offline_events, entry, {},
                         before)
    return entry


def topic_bytes_of(broker: Broker, api_version: int) -> Callable[[MetadataTopic], bytes]:
    """A topic entry's encoding at ``api_version`` (``encode_metadata_body``'s
    ``topic_bytes``), kept with the entry while it stays current; a partition entry taken
    over from the entry before keeps its bytes too."""
    cache = _CACHES.get(broker) or {}
    arrays: dict[tuple[int, ...], bytes] = {}
    v = api_version

    def topic_bytes(t: MetadataTopic) -> bytes:
        hit = cache.get(t.name) if t.name is not None else None
        if hit is None or hit[4] is not t:
            return encode_metadata_topic(v, t, arrays)
        done = hit[5].get(v)
        if done is not None:
            return done[2]
        old = hit[6].get(v)
        parts = t.partitions
        if old is None:
            chunks = [encode_metadata_partition(v, p, arrays) for p in parts]
        else:
            old_parts, old_chunks, _ = old
            n = min(len(old_parts), len(parts))
            chunks = [old_chunks[i] if i < n and old_parts[i] is p
                      else encode_metadata_partition(v, p, arrays)
                      for i, p in enumerate(parts)]
        head, tail = metadata_topic_ends(v, t)
        whole = b"".join([head, *chunks, tail])
        hit[5][v] = (parts, chunks, whole)
        return whole

    return topic_bytes


def _topic_entry(broker: Broker, topic: TopicState, live: set[int],
                 before: tuple[object, ...] = (),
                 before_entries: Sequence[MetadataPartition] = ()) -> MetadataTopic:
    """``before``/``before_entries``: the partition states and entries of the topic's last
    entry, computed with the same live brokers and offline logs: an entry whose state
    object is the same is taken as it is."""
    partitions = []
    hosted_partitions = broker.replicas.partitions
    name = topic.name
    node_id = broker.node_id
    n_before = min(len(before), len(before_entries))
    for i, p in enumerate(topic.partitions):
        if i < n_before and before[i] is p:
            partitions.append(before_entries[i])
            continue
        replicas = p.replicas
        offline = [r for r in replicas if r not in live]
        hosted = hosted_partitions.get((name, i))  # type: ignore[call-overload]
        if hosted is not None and hosted.log.offline is not None:
            offline.append(node_id)  # its log hit an I/O error (Kafka: offline log dir)
        leader = p.leader if p.leader in live and p.leader not in offline else -1
        partitions.append(MetadataPartition(
            0 if leader >= 0 else ErrorCode.leader_not_available, i, leader, p.leader_epoch,
            tuple(replicas),
            # the ISR as the controller and leader wrote it (Kafka's metadata cache): a
            # dead broker stays in it until they remove it; a log offline here does not
            tuple(r for r in p.isr if not (r == node_id and r in offline)) if offline
            else tuple(p.isr),
            tuple(r for r in replicas if r in offline) if offline else ()))
    return MetadataTopic(0, name, topic.topic_id, name in KAFKA_INTERNAL_TOPICS, partitions,
                         UNKNOWN_AUTHORIZED_OPERATIONS)


def error_entry(name: str | None, code: ErrorCode) -> MetadataTopic:
    return MetadataTopic(code, name, uuid.UUID(int=0), False, (),
                         UNKNOWN_AUTHORIZED_OPERATIONS)


@handler(3, "Metadata", 0, 12)
async def handle_metadata(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    # first: the states read below are then at least as new as the controller id
    controller_id = await broker.known_controller()
    store = broker.metadata
    security = broker.security
    topics: list[MetadataTopic] = []
    live = {b.node_id for b in store.live_brokers()}
    if req.topics is None:
        # Kafka: the topics the principal may DESCRIBE (the others left out)
        names = security.allowed_names(ctx, DESCRIBE, TOPIC, store.topics())
        topics = [topic_entry(broker, t, live) for t in list(store.topics().values())
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
                    topics.append(topic_entry(broker, found, live))
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
            topics.append(topic_entry(broker, topic, live))
    if getattr(req, "include_topic_authorized_operations", False):
        topics = [t._replace(topic_authorized_operations=security.authorized_operations(
            ctx, TOPIC, t.name or "")) if t.error_code == 0 else t for t in topics]
    cluster_operations = UNKNOWN_AUTHORIZED_OPERATIONS
    if getattr(req, "include_cluster_authorized_operations", False):
        cluster_operations = security.authorized_operations(ctx, CLUSTER, CLUSTER_NAME)
    # encoded by hand (kio's writer took ~0.1 ms per partition: a second of event loop
    # for a Metadata of 10,000 partitions); tests/unit/test_metadata_encoding.py
    return encode_metadata_body(
        ctx.api_version, 0,
        [(b.node_id, b.host, b.port, b.rack) for b in broker.advertised_brokers(ctx.listener)],
        store.cluster_id, controller_id, topics, cluster_operations,
        topic_bytes_of(broker, ctx.api_version))


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
