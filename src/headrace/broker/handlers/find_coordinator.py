"""FindCoordinator (10): which broker coordinates a group (R-GRP-2).

A group's coordinator is the leader of partition ``abs(hashCode(group_id)) % n`` of
``__consumer_offsets``, a transactional id's (key type 1) the leader of its partition of
``__transaction_state`` (each topic created here on first use). v0-3 ask for one key,
v4+ for a batch (``coordinator_keys``). Key type 2 (v6+, KIP-932) asks for a share
coordinator: the key is ``groupId:topicId:partition`` (a malformed one is INVALID_REQUEST;
key type 2 below v6 too, as Kafka's ``getCoordinator``),
its coordinator the leader of the key's partition of ``__share_group_state``; brokers ask it,
so it needs CLUSTER_ACTION, as Kafka's. Any other key type is INVALID_REQUEST.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DESCRIBE, GROUP, TRANSACTIONAL_ID

if TYPE_CHECKING:
    from headrace.broker.server import Broker

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
KEY_TYPE_SHARE = 2


def _share_node(broker: Broker, key: str) -> int | None:
    """The share coordinator of ``groupId:topicId:partition`` (ValueError: malformed, as
    Kafka's ``SharePartitionKey.validate`` rules it)."""
    from headrace.share.state import parse_coordinator_key, partition_for

    group_id, topic_id, index = parse_coordinator_key(key)
    service = broker.share_coordinator
    return service.coordinator_node(partition_for(group_id, topic_id, index,
                                                  service.num_partitions()))


def _lookup(broker: Broker, ctx: RequestContext, key: str, key_type: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"key": key, "node_id": -1, "host": "", "port": -1,
                             "error_code": ErrorCode.none, "error_message": None}
    if key_type == KEY_TYPE_SHARE and ctx.api_version >= 6:
        from headrace.broker.security import CLUSTER_ACTION

        if not broker.security.cluster_allowed(ctx, CLUSTER_ACTION):
            entry["error_code"] = ErrorCode.cluster_authorization_failed
            return entry
        try:
            node = _share_node(broker, key)
        except ValueError as e:  # Kafka logs it and answers INVALID_REQUEST
            entry["error_code"] = ErrorCode.invalid_request
            entry["error_message"] = str(e)
            return entry
        return _located(broker, ctx, entry, node)
    if key_type not in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
        entry["error_code"] = ErrorCode.invalid_request
        entry["error_message"] = f"unknown key type {key_type}"
        return entry
    # Kafka: DESCRIBE on the group or transactional id
    if key_type == KEY_TYPE_GROUP and not broker.security.allowed(ctx, DESCRIBE, GROUP, key):
        entry["error_code"] = ErrorCode.group_authorization_failed
        return entry
    if key_type == KEY_TYPE_TRANSACTION and not broker.security.allowed(
            ctx, DESCRIBE, TRANSACTIONAL_ID, key):
        entry["error_code"] = ErrorCode.transactional_id_authorization_failed
        return entry
    if key_type == KEY_TYPE_TRANSACTION:
        if not key:  # Kafka: an empty transactional id is INVALID_REQUEST
            entry["error_code"] = ErrorCode.invalid_request
            entry["error_message"] = "the transactional id is empty"
            return entry
        node = broker.txns.coordinator_node(key)
    else:
        node = broker.groups.coordinator_node(key)
    return _located(broker, ctx, entry, node)


def _located(broker: Broker, ctx: RequestContext, entry: dict[str, Any],
             node: int | None) -> dict[str, Any]:
    for b in broker.advertised_brokers(ctx.listener):
        if b.node_id == node:
            entry.update(node_id=b.node_id, host=b.host, port=b.port)
            return entry
    entry["error_code"] = ErrorCode.coordinator_not_available
    entry["error_message"] = "the coordinator is not available"
    return entry


@handler(10, "FindCoordinator", 0, 6)
async def handle_find_coordinator(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    key_type = int(getattr(req, "key_type", KEY_TYPE_GROUP))
    if ctx.api_version >= 4:
        return ctx.response({
            "throttle_time": 0,
            "coordinators": [_lookup(broker, ctx, str(k), key_type)
                             for k in req.coordinator_keys],
        })
    entry = _lookup(broker, ctx, str(req.key), key_type)
    return ctx.response({"throttle_time": 0, **entry})
