"""OffsetFetch (9) v1-9: committed offsets of a group (R-GRP-6); v8+ several groups.

A partition with no committed offset gets -1 (the consumer then applies
``auto.offset.reset``); ``topics`` null (v2+) means every partition the group committed.
``require_stable`` (v7+, KIP-447): a partition with a pending transactional offset of the
group (a TxnOffsetCommit whose transaction has not reached its commit or abort marker) is
answered UNSTABLE_OFFSET_COMMIT with no offset, per partition in every version (v8+: per
partition within each group, the group's own error staying for coordinator errors), as
Kafka's ``OffsetMetadataManager.fetchOffsets``; the consumer retries until the transaction
completes. Asking for every partition lists only those with a committed offset, as Kafka.
A share group's id answers as a group with no offsets (Kafka: ``ShareGroup.
validateOffsetFetch`` throws GROUP_ID_NOT_FOUND, which ``fetchOffsets`` swallows).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DESCRIBE, GROUP, TOPIC
from headrace.share.group import ShareGroup

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def _group_answer(broker: Broker, ctx: RequestContext, group_id: str, topics: Any,
                  member_id: str | None, member_epoch: int, per_partition_errors: bool,
                  require_stable: bool) -> dict[str, Any]:
    groups = broker.groups
    security = broker.security
    err = (groups.check_coordinator(group_id)
           if security.allowed(ctx, DESCRIBE, GROUP, group_id)
           else ErrorCode.group_authorization_failed)
    if err is ErrorCode.none:
        g = groups.coordinator.groups.get(group_id)
        if isinstance(g, ShareGroup):
            # Kafka's fetchOffsets: the group is not a consumer group (GroupIdNotFound
            # swallowed): every asked partition -1, no error; "all topics" none
            return {"group_id": group_id, "error_code": ErrorCode.none, "topics": _topics(
                {tp: (-1, -1, "", ErrorCode.none) for tp in [
                    (str(t.name), int(i)) for t in topics or () for i in t.partition_indexes]})}
        if g is not None:
            err = g.validate_offset_fetch(member_id, member_epoch)
    requested = None if topics is None else [
        (str(t.name), int(i)) for t in topics for i in t.partition_indexes
    ]
    if err is not ErrorCode.none:
        if per_partition_errors and requested is not None:
            return {"group_id": group_id, "error_code": err, "topics": _topics(
                {tp: (-1, -1, "", err) for tp in requested})}
        return {"group_id": group_id, "error_code": err, "topics": []}
    fetched = groups.coordinator.fetch_offsets(group_id, requested, require_stable)
    answer = {tp: (f.offset, f.leader_epoch, f.metadata, f.error)
              for tp, f in fetched.items()}
    if security.enabled:
        # Kafka: DESCRIBE on each topic; a named one not allowed answers
        # TOPIC_AUTHORIZATION_FAILED, one not allowed among "all topics" is left out
        allowed = security.allowed_names(ctx, DESCRIBE, TOPIC, {t for t, _ in answer})
        answer = {tp: (v if tp[0] in allowed else
                       (-1, -1, "", ErrorCode.topic_authorization_failed))
                  for tp, v in answer.items() if requested is not None or tp[0] in allowed}
    return {"group_id": group_id, "error_code": ErrorCode.none, "topics": _topics(answer)}


def _topics(by_tp: dict[tuple[str, int], tuple[int, int, str, ErrorCode]]) -> list[Any]:
    out: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), (offset, epoch, metadata, err) in by_tp.items():
        out.setdefault(topic, []).append({
            "partition_index": partition, "committed_offset": offset,
            "committed_leader_epoch": epoch, "metadata": metadata, "error_code": err,
        })
    return [{"name": t, "partitions": ps} for t, ps in out.items()]


@handler(9, "OffsetFetch", 1, 9)
async def handle_offset_fetch(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    if ctx.api_version >= 8:
        return ctx.response({"throttle_time": 0, "groups": [
            _group_answer(broker, ctx, str(g.group_id), g.topics, getattr(g, "member_id", None),
                          int(getattr(g, "member_epoch", -1)), False, bool(req.require_stable))
            for g in req.groups
        ]})
    answer = _group_answer(broker, ctx, str(req.group_id), req.topics, None, -1,
                           ctx.api_version < 2, bool(getattr(req, "require_stable", False)))
    return ctx.response({"throttle_time": 0, "topics": answer["topics"],
                         "error_code": answer["error_code"]})
