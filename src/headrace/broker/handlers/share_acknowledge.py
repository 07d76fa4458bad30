"""ShareAcknowledge (79): a share consumer's acknowledgements outside a fetch (KIP-932), as
Kafka 4.2's ``KafkaApis.handleShareAcknowledgeRequest``; the checks and their order are
ShareFetch's (``share_fetch.py``), except that it never opens a share session (epoch 0 is
INVALID_SHARE_SESSION_EPOCH) and an empty batch list for a partition answers NONE."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.share_fetch import (
    Part,
    _acknowledge,
    _leader,
    _manager,
    _top_error,
    check_member,
)
from headrace.broker.share_partitions import group_settings
from headrace.share.partition import AcknowledgementBatch
from headrace.share.session import FINAL_EPOCH, ShareSessionError

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(79, "ShareAcknowledge", 1, 2)
async def handle_share_acknowledge(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    group_id = req.group_id or ""
    try:
        member_id = check_member(broker, ctx, group_id, req.member_id)
    except ShareSessionError as e:
        return _top_error(ctx, e.code, str(e) or None)
    manager = _manager(broker)
    epoch = int(req.share_session_epoch)
    try:
        manager.sessions.acknowledge_update(group_id, member_id, epoch)
    except ShareSessionError as e:
        return _top_error(ctx, e.code, str(e))
    acks: dict[Part, list[AcknowledgementBatch]] = {}
    codes: dict[Part, ErrorCode] = {}
    for t in req.topics or ():
        for p in t.partitions or ():
            if t.topic_id is None:
                continue
            acks[(t.topic_id, int(p.partition_index))] = [
                AcknowledgementBatch(int(b.first_offset), int(b.last_offset),
                                     tuple(int(x) for x in b.acknowledge_types))
                for b in p.acknowledgement_batches or ()]
    empty = [part for part, batches in acks.items() if not batches]
    for part in empty:
        del acks[part]
        codes[part] = ErrorCode.none
    codes.update(await _acknowledge(broker, ctx, group_id, member_id, acks,
                                    bool(getattr(req, "is_renew_ack", False))))
    if epoch == FINAL_EPOCH:
        manager.close_session(group_id, member_id)
    responses: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for part, code in codes.items():
        responses.setdefault(part[0], []).append({
            "partition_index": part[1], "error_code": code, "error_message": None,
            "current_leader": (_leader(broker, *part) if code in (
                ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)
                else {"leader_id": -1, "leader_epoch": -1})})
    return ctx.response({
        "throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
        "acquisition_lock_timeout": group_settings(broker, group_id).record_lock_duration_ms,
        "responses": [{"topic_id": topic_id, "partitions": parts}
                      for topic_id, parts in responses.items()],
        "node_endpoints": [],
    })
