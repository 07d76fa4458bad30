"""ShareGroupHeartbeat (76): share group membership (KIP-932), as Kafka 4.2's
``KafkaApis.handleShareGroupHeartbeat`` and ``GroupMetadataManager.shareGroupHeartbeat``.

The pure ``ShareGroup`` (``headrace.share.group``) decides everything; this handler finds or
makes the group in ``broker.groups.coordinator.groups`` and passes it the request, the
topics and the time:

- READ on the group, else GROUP_AUTHORIZATION_FAILED; subscribed topics that may not be
  DESCRIBEd: TOPIC_AUTHORIZATION_FAILED; then the request's own validation, before the
  group is looked up (``share.group.invalid_heartbeat``: an empty member id, group id or
  rack id, a join without topics, an epoch below -1: INVALID_REQUEST); then the
  coordinator check (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ...);
- a group id of another type (classic or consumer, empty or not) is GROUP_ID_NOT_FOUND
  ("Group X is not a share group."): Kafka 4.2's ``getOrMaybeCreateShareGroup`` converts
  no group to a share group, an empty one included;
- no group: a join (epoch 0) makes one; any other epoch UNKNOWN_MEMBER_ID.

The group's records (types 10-15 in ``__consumer_offsets``) are committed before the
answer. A heartbeat that leaves share-partitions without state asks the share coordinator
to initialize them (InitializeShareGroupState through ``broker.share_persister``, start
offset -1: the partition leader applies ``share.auto.offset.reset``), after the answer, as
Kafka's ``GroupCoordinatorService`` does; the group records the outcome. A member that
leaves keeps its share sessions: it closes them itself (its last ShareAcknowledge, epoch
-1, carries its final acknowledgements), or its connections close; a member fenced for its
session timeout gets its records back to the others as their locks expire (Kafka: the group
coordinator does not tell the partition leaders).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.consumer_group_heartbeat import topic_infos
from headrace.broker.security import DESCRIBE, GROUP, READ, TOPIC
from headrace.broker.share_persister import InitializeEntry, StateKey
from headrace.share.group import (
    HeartbeatResult,
    InitializeShareGroupState,
    ShareGroup,
    invalid_heartbeat,
)

if TYPE_CHECKING:
    from headrace.broker.server import Broker

log = logging.getLogger("headrace.share")
_TASKS: set[asyncio.Task[Any]] = set()


def _response(ctx: RequestContext, r: HeartbeatResult) -> Any:
    assignment = None
    if r.assignment is not None:
        assignment = {"topic_partitions": [{"topic_id": t, "partitions": list(ps)}
                                           for t, ps in r.assignment]}
    return ctx.response({
        "throttle_time": 0, "error_code": r.error_code, "error_message": r.error_message,
        "member_id": r.member_id, "member_epoch": r.member_epoch,
        "heartbeat_interval": r.heartbeat_interval_ms, "assignment": assignment,
    })


def _error(ctx: RequestContext, code: ErrorCode, message: str | None = None) -> Any:
    return _response(ctx, HeartbeatResult(code, message))


async def initialize(broker: Broker, group: ShareGroup, ask: InitializeShareGroupState) -> None:
    """Initialize the share-partitions' state, then record the outcome in the group."""
    persister = broker.share_persister
    parts = {t: list(ps) for t, ps in ask.topics}
    ok: dict[uuid.UUID, list[int]] = {}
    failed: dict[uuid.UUID, list[int]] = {}
    if persister is None:
        failed = parts
    else:
        entries = [InitializeEntry(StateKey(group.group_id, t, p), ask.group_epoch)
                   for t, ps in parts.items() for p in ps]
        result = await persister.initialize_state(entries)
        for e in entries:
            target = failed if e.key in result.errors else ok
            target.setdefault(e.key.topic_id, []).append(e.key.partition)
        if result.errors:
            log.warning("share group %s: initializing %d share-partition(s) failed: %s",
                        group.group_id, len(result.errors),
                        sorted({c.name for c in result.errors.values()}))
    coordinator = broker.groups.coordinator
    if coordinator.groups.get(group.group_id) is not group:
        return  # deleted or moved meanwhile
    now = broker.groups.now_ms()
    if ok:
        coordinator.queue_records(group.group_id, group.state_initialized(ok, now))
    if failed:
        coordinator.queue_records(group.group_id, group.state_initialize_failed(failed))
    await broker.groups.flush_and_wait(group.group_id)


@handler(76, "ShareGroupHeartbeat", 1, 1)
async def handle_share_group_heartbeat(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    group_id = req.group_id
    security = broker.security
    if not security.allowed(ctx, READ, GROUP, group_id or ""):
        return _error(ctx, ErrorCode.group_authorization_failed)
    if req.subscribed_topic_names:
        subscribed = set(req.subscribed_topic_names)
        if len(security.allowed_names(ctx, DESCRIBE, TOPIC, subscribed)) < len(subscribed):
            return _error(ctx, ErrorCode.topic_authorization_failed)
    names = None if req.subscribed_topic_names is None else list(req.subscribed_topic_names)
    invalid = invalid_heartbeat(group_id or "", req.member_id or "", int(req.member_epoch),
                                req.rack_id, names)
    if invalid is not None:
        return _response(ctx, invalid)
    err = broker.groups.check_coordinator(group_id)
    if err is not ErrorCode.none:
        return _error(ctx, err)
    coordinator = broker.groups.coordinator
    existing = coordinator.groups.get(group_id)
    group: ShareGroup
    if isinstance(existing, ShareGroup) and existing.state_name != "Dead":
        group = existing
    elif existing is not None and not isinstance(existing, ShareGroup) \
            and existing.state_name != "Dead":
        return _error(ctx, ErrorCode.group_id_not_found,
                      f"Group {group_id} is not a share group.")
    elif req.member_epoch != 0:
        return _error(ctx, ErrorCode.unknown_member_id,
                      f"Share group {group_id} has no member {req.member_id}.")
    else:
        group = broker.groups.new_share_group(group_id)
    result = group.heartbeat(
        member_id=req.member_id, member_epoch=req.member_epoch, topics=topic_infos(broker),
        now_ms=broker.groups.now_ms(), rack_id=req.rack_id, subscribed_topic_names=names,
        client_id=ctx.header.client_id or "", client_host="/" + ctx.host)
    if result.error_code is not ErrorCode.none:
        return _response(ctx, result)
    if coordinator.groups.get(group_id) is not group:
        coordinator.add_share_group(group)
    coordinator.queue_records(group_id, result.records)
    err = await broker.groups.flush_and_wait(group_id)
    if err is not ErrorCode.none:
        if err is not ErrorCode.not_coordinator:
            err = ErrorCode.coordinator_not_available
        return _error(ctx, err)
    if result.initialize is not None:
        task = asyncio.ensure_future(initialize(broker, group, result.initialize))
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)
    return _response(ctx, result)
