"""ShareFetch (78) and ShareAcknowledge (79): share consumers' reads and acknowledgements
(KIP-932), as Kafka 4.2's ``KafkaApis.handleShareFetchRequest`` /
``handleShareAcknowledgeRequest`` answer them.

Order of checks (Kafka's): READ on the group (else GROUP_AUTHORIZATION_FAILED, the whole
request); the member id must be a Kafka UUID (INVALID_REQUEST); the share session rules
(``headrace.share.session``: SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH,
SHARE_SESSION_LIMIT_REACHED, INVALID_REQUEST for acknowledgements in an opening request)
answer the whole request; then per partition: a topic id not known is UNKNOWN_TOPIC_ID, a
topic without READ TOPIC_AUTHORIZATION_FAILED, a partition not led here
NOT_LEADER_OR_FOLLOWER with the current leader. Acknowledgement batches are checked first
(``validate_batches``: first > last, out of order, no types, a per-offset list of the wrong
length, an unknown type: INVALID_REQUEST for that partition) and applied before the fetch;
their outcome is the partition's ``acknowledge_error_code``. An epoch -1 request fetches
nothing and closes the session after its acknowledgements, releasing the member's acquired
records. ``acquisition_lock_timeout`` is the group's record lock duration.

v2 (Kafka 4.2) adds ``is_renew_ack`` (the request only renews locks: RENEW(4) is a valid
type and nothing is fetched) and ``share_acquire_mode`` (0 batch_optimized: whole log
batches, ``max_records`` a soft limit; 1 record_limit: exactly ``max_records`` at most, a
batch split where the limit falls; any other value INVALID_REQUEST).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler, ms
from headrace.broker.security import GROUP, READ, TOPIC
from headrace.broker.share_partitions import PartitionFetch, SharePartitionManager, group_settings
from headrace.share.partition import AcknowledgementBatch
from headrace.share.session import (
    ShareSessionError,
    parse_member_id,
)

if TYPE_CHECKING:
    from headrace.broker.server import Broker

Part = tuple[uuid.UUID, int]
RENEW = 4


def validate_batches(batches: list[AcknowledgementBatch], renew: bool = False) -> bool:
    """Kafka's ``validateAcknowledgementBatches`` for one partition."""
    previous_last = -1
    highest = RENEW if renew else 3
    for b in batches:
        if b.first_offset > b.last_offset or b.first_offset < previous_last:
            return False
        if not b.acknowledge_types:
            return False
        if (len(b.acknowledge_types) > 1
                and b.last_offset - b.first_offset != len(b.acknowledge_types) - 1):
            return False
        if any(t < 0 or t > highest for t in b.acknowledge_types):
            return False
        previous_last = b.last_offset
    return True


def check_member(broker: Broker, ctx: RequestContext, group_id: str,
                 member_id: str | None) -> str:
    """READ on the group (GROUP_AUTHORIZATION_FAILED), then a Kafka UUID member id."""
    if not broker.security.allowed(ctx, READ, GROUP, group_id):
        raise ShareSessionError(ErrorCode.group_authorization_failed, "")
    return parse_member_id(member_id)


def _manager(broker: Broker) -> SharePartitionManager:
    manager: SharePartitionManager | None = getattr(broker, "share_partitions", None)
    assert manager is not None
    return manager


def _top_error(ctx: RequestContext, code: ErrorCode, message: str | None = None) -> Any:
    return ctx.response({"throttle_time": 0, "error_code": code, "error_message": message,
                         "acquisition_lock_timeout": 0, "responses": [],
                         "node_endpoints": []})


def _leader(broker: Broker, topic_id: uuid.UUID, index: int) -> dict[str, int]:
    topic = broker.metadata.topic_by_id(topic_id)
    if topic is None or not 0 <= index < len(topic.partitions):
        return {"leader_id": -1, "leader_epoch": -1}
    state = topic.partitions[index]
    return {"leader_id": state.leader, "leader_epoch": state.leader_epoch}


def _acks_of(topics: Any) -> tuple[dict[Part, list[AcknowledgementBatch]], bool]:
    acks: dict[Part, list[AcknowledgementBatch]] = {}
    present = False
    for t in topics or ():
        for p in t.partitions or ():
            batches = [AcknowledgementBatch(int(b.first_offset), int(b.last_offset),
                                            tuple(int(x) for x in b.acknowledge_types))
                       for b in p.acknowledgement_batches or ()]
            if batches:
                present = True
                if t.topic_id is not None:
                    acks[(t.topic_id, int(p.partition_index))] = batches
    return acks, present


async def _acknowledge(broker: Broker, ctx: RequestContext, group_id: str, member_id: str,
                       acks: dict[Part, list[AcknowledgementBatch]],
                       renew: bool) -> dict[Part, ErrorCode]:
    out: dict[Part, ErrorCode] = {}
    valid: dict[Part, list[AcknowledgementBatch]] = {}
    names: dict[Part, str] = {}
    for part, batches in acks.items():
        topic = broker.metadata.topic_by_id(part[0])
        if topic is None:
            out[part] = ErrorCode.unknown_topic_id
        elif not validate_batches(batches, renew):
            out[part] = ErrorCode.invalid_request
        else:
            names[part] = topic.name
            valid[part] = batches
    allowed = broker.security.allowed_names(ctx, READ, TOPIC, set(names.values()))
    for part in list(valid):
        topic = broker.metadata.topic_by_id(part[0])
        assert topic is not None
        if names[part] not in allowed:
            out[part] = ErrorCode.topic_authorization_failed
            del valid[part]
        elif not 0 <= part[1] < len(topic.partitions):
            out[part] = ErrorCode.unknown_topic_or_partition
            del valid[part]
    if valid:
        out.update(await _manager(broker).acknowledge(group_id, member_id, valid))
    return out


@handler(78, "ShareFetch", 1, 2)
async def handle_share_fetch(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    group_id = req.group_id or ""
    try:
        member_id = check_member(broker, ctx, group_id, req.member_id)
    except ShareSessionError as e:
        return _top_error(ctx, e.code, str(e) or None)
    manager = _manager(broker)
    epoch = int(req.share_session_epoch)
    renew = bool(getattr(req, "is_renew_ack", False))
    mode = int(getattr(req, "share_acquire_mode", 0))
    if mode not in (0, 1):
        return _top_error(ctx, ErrorCode.invalid_request, f"Unknown share acquire mode {mode}")
    fetch_parts: list[Part] = []
    unknown: list[Part] = []
    for t in req.topics or ():
        for p in t.partitions or ():
            part = (t.topic_id, int(p.partition_index))
            if t.topic_id is None or broker.metadata.topic_by_id(t.topic_id) is None:
                unknown.append(part)
            else:
                fetch_parts.append(part)
    forget = [(t.topic_id, int(i)) for t in req.forgotten_topics_data or ()
              if t.topic_id is not None for i in t.partitions or ()]
    acks, acknowledging = _acks_of(req.topics)
    try:
        context = manager.sessions.new_context(group_id, member_id, epoch, fetch_parts,
                                               forget, acknowledging, ctx.peer)
    except ShareSessionError as e:
        return _top_error(ctx, e.code, str(e))
    ack_codes: dict[Part, ErrorCode] = {}
    if acknowledging:
        ack_codes = await _acknowledge(broker, ctx, group_id, member_id, acks, renew)
    results: dict[Part, PartitionFetch] = {part: PartitionFetch(ErrorCode.unknown_topic_id)
                                           for part in unknown}
    if not context.final and not renew:
        parts = [p for p in context.partitions if p not in results]
        names = {}
        for part in parts:
            topic = broker.metadata.topic_by_id(part[0])
            if topic is None:
                results[part] = PartitionFetch(ErrorCode.unknown_topic_id)
            else:
                names[part] = topic.name
        allowed = broker.security.allowed_names(ctx, READ, TOPIC, set(names.values()))
        wanted = []
        for part, name in names.items():
            if name not in allowed:
                results[part] = PartitionFetch(ErrorCode.topic_authorization_failed)
            else:
                wanted.append(part)
        fetched = await manager.fetch(
            group_id, member_id, wanted, max_records=int(req.max_records),
            max_bytes=min(int(req.max_bytes), int(broker.config["fetch.max.bytes"])),
            min_bytes=int(req.min_bytes), max_wait_ms=ms(req.max_wait),
            rotate=max(0, epoch), strict=mode == 1)
        results.update(fetched)
    if context.final:
        manager.close_session(group_id, member_id)
    responses: dict[uuid.UUID | None, list[dict[str, Any]]] = {}
    session = context.session
    for part, r in results.items():
        error = r.error is not ErrorCode.none
        if context.subsequent and not session.must_respond(part, bool(r.acquired), error) \
                and part not in ack_codes:
            continue
        responses.setdefault(part[0], []).append({
            "partition_index": part[1],
            "error_code": r.error,
            "error_message": r.error_message,
            "acknowledge_error_code": ack_codes.pop(part, ErrorCode.none),
            "acknowledge_error_message": None,
            "current_leader": (_leader(broker, *part) if r.error in (
                ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)
                else {"leader_id": -1, "leader_epoch": -1}),
            "records": r.records,
            "acquired_records": [{"first_offset": a.first_offset, "last_offset": a.last_offset,
                                  "delivery_count": a.delivery_count} for a in r.acquired],
        })
    for part, code in ack_codes.items():  # acknowledged partitions not fetched
        responses.setdefault(part[0], []).append({
            "partition_index": part[1], "error_code": ErrorCode.none,
            "acknowledge_error_code": code, "records": b"", "acquired_records": [],
            "current_leader": {"leader_id": -1, "leader_epoch": -1}})
    lock_ms = group_settings(broker, group_id).record_lock_duration_ms
    return ctx.response({
        "throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
        "acquisition_lock_timeout": lock_ms,
        "responses": [{"topic_id": topic_id, "partitions": parts}
                      for topic_id, parts in responses.items()],
        "node_endpoints": [],
    })
