"""ConsumerGroupHeartbeat (68): the KIP-848 consumer group protocol (``group.protocol=consumer``).

The pure ``ConsumerGroup`` decides everything; this handler finds or makes the group in
``broker.groups.coordinator.groups`` and passes it the request, the current topic metadata
and the time. Kafka's rules for the registry:

- an empty group id → INVALID_REQUEST; then the coordinator check (NOT_COORDINATOR, ...);
- a classic group with members under the same id → GROUP_ID_NOT_FOUND; an empty classic
  group (e.g. one that only holds committed offsets) is replaced on a join;
- no group: a join (epoch 0) creates one, kept only if the join succeeds; any other epoch →
  UNKNOWN_MEMBER_ID so the member rejoins (Kafka answers GROUP_ID_NOT_FOUND for a group it
  never had; a member whose group's records did not survive a crash rejoins this way);
- subscribed topics that do not exist are not created (Kafka neither).

Persistence (R-GRP-6/7): the group's state lives in ``__consumer_offsets`` (the
ConsumerGroup* records, see ``headrace.group.consumer_group``) and comes back when the
broker restarts, so a member carries on with its member id, epoch and assignment. The
records a heartbeat produces are appended as one batch and committed before the response
(``flush_and_wait``), as Kafka writes before it responds; if that fails the member gets
NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE (the in-memory change is kept, not rolled back
as Kafka's timeline structures are; the group's next records rewrite it whole, and a
retry with the previous epoch is accepted as a lost response if the member owns nothing
beyond its new assignment, else it is fenced and rejoins).

Configs (read by ``GroupService.new_consumer_group`` with fallbacks until they are in
``headrace.config``): ``group.consumer.assignors`` (``uniform,range``),
``group.consumer.session.timeout.ms`` (45000), ``group.consumer.heartbeat.interval.ms``
(5000). A group takes them when created or loaded.

Authorization (Kafka's ``handleConsumerGroupHeartbeat``): READ on the group, else
GROUP_AUTHORIZATION_FAILED; then, when subscribed topic names are given, every one of them
must be DESCRIBE-able, else TOPIC_AUTHORIZATION_FAILED (a client may not learn of topics
it cannot describe). Both before the coordinator is asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler, ms
from headrace.broker.security import DESCRIBE, GROUP, READ, TOPIC
from headrace.group.assignors import TopicInfo
from headrace.group.consumer_group import ConsumerGroup, GroupState, HeartbeatResult
from headrace.share.group import ShareGroup

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def new_consumer_group(broker: Broker, group_id: str) -> ConsumerGroup:
    return broker.groups.new_consumer_group(group_id)


def topic_infos(broker: Broker) -> dict[str, TopicInfo]:
    return {name: TopicInfo(t.topic_id, len(t.partitions))
            for name, t in broker.metadata.topics().items()}


def _error(ctx: RequestContext, code: ErrorCode, message: str | None = None) -> Any:
    return _response(ctx, HeartbeatResult(code, message))


def _response(ctx: RequestContext, r: HeartbeatResult) -> Any:
    assignment = None
    if r.assignment is not None:
        assignment = {"topic_partitions": [{"topic_id": t, "partitions": ps}
                                           for t, ps in r.assignment]}
    return ctx.response({
        "throttle_time": 0,
        "error_code": r.error_code,
        "error_message": r.error_message,
        "member_id": r.member_id,
        "member_epoch": r.member_epoch,
        "heartbeat_interval": r.heartbeat_interval_ms,
        "assignment": assignment,
    })


@handler(68, "ConsumerGroupHeartbeat", 0, 1)
async def handle_consumer_group_heartbeat(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    group_id = req.group_id
    security = broker.security
    if not security.allowed(ctx, READ, GROUP, group_id or ""):
        return _error(ctx, ErrorCode.group_authorization_failed)
    if req.subscribed_topic_names:
        subscribed = set(req.subscribed_topic_names)
        if len(security.allowed_names(ctx, DESCRIBE, TOPIC, subscribed)) < len(subscribed):
            return _error(ctx, ErrorCode.topic_authorization_failed)
    if not group_id:
        return _error(ctx, ErrorCode.invalid_request, "GroupId can't be empty.")
    err = broker.groups.check_coordinator(group_id)
    if err is not ErrorCode.none:
        return _error(ctx, err)
    groups = broker.groups.coordinator.groups
    existing = groups.get(group_id)
    create = False
    group: ConsumerGroup
    if isinstance(existing, ConsumerGroup) and existing.state is not GroupState.DEAD:
        group = existing
    elif existing is not None and not isinstance(existing, ConsumerGroup) \
            and (not existing.is_empty() or isinstance(existing, ShareGroup)):
        # Kafka's getOrMaybeCreateConsumerGroup: only an empty classic group converts
        return _error(ctx, ErrorCode.group_id_not_found,
                      f"Group {group_id} is not a consumer group.")
    elif req.member_epoch != 0:
        return _error(ctx, ErrorCode.unknown_member_id,
                      f"Consumer group {group_id} has no member {req.member_id}.")
    else:
        group = new_consumer_group(broker, group_id)
        create = True

    owned = None
    if req.topic_partitions is not None:
        owned = [(tp.topic_id, tuple(tp.partitions)) for tp in req.topic_partitions
                 if tp.topic_id is not None]
    names = None if req.subscribed_topic_names is None else list(req.subscribed_topic_names)
    result = group.heartbeat(
        member_id=req.member_id,
        member_epoch=req.member_epoch,
        topics=topic_infos(broker),
        now_ms=broker.groups.now_ms(),
        instance_id=req.instance_id,
        rack_id=req.rack_id,
        rebalance_timeout_ms=ms(req.rebalance_timeout),
        subscribed_topic_names=names,
        subscribed_topic_regex=getattr(req, "subscribed_topic_regex", None),
        server_assignor=req.server_assignor,
        topic_partitions=owned,
        api_version=ctx.api_version,
        client_id=ctx.header.client_id or "",
        client_host="/" + ctx.peer.rsplit(":", 1)[0],
    )
    if result.error_code is not ErrorCode.none:
        return _response(ctx, result)
    if create:
        broker.groups.coordinator.add_consumer_group(group)
    else:
        broker.groups.coordinator.collect_consumer_group(group)
    err = await broker.groups.flush_and_wait(group_id)
    if err is not ErrorCode.none:
        if err is not ErrorCode.not_coordinator:
            err = ErrorCode.coordinator_not_available
        return _error(ctx, err)
    return _response(ctx, result)
