"""IncrementalAlterConfigs (44): SET / DELETE / APPEND / SUBTRACT topic config overrides.

The whole resource is validated before anything is stored; ``validate_only`` stores nothing.
BROKER and GROUP resources (dynamic broker configs, group configs: issue 27) are
``dynamic_resources``'.
A resource named twice in one request is INVALID_REQUEST for both (Kafka's
``ConfigAdminManager.preprocess``). A change leaving an internal topic's ``cleanup.policy``
other than ``compact`` is INVALID_CONFIG (``check_internal_configs``; Kafka accepts it).
AlterConfigs (33, ``alter_configs``) shares the resource checks (``resource_error``) and
the storing (``store_topic_configs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers import dynamic_resources
from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.describe_configs import BROKER, TOPIC
from headrace.broker.security import ALTER_CONFIGS
from headrace.broker.security import TOPIC as ACL_TOPIC
from headrace.broker.topics import TopicError, check_internal_configs, validate_configs
from headrace.config import ACCEPTED_TOPIC_CONFIGS
from headrace.metadata.store import TopicState

if TYPE_CHECKING:
    from headrace.broker.server import Broker

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def duplicate_resources(resources: Any) -> set[tuple[int, str]]:
    """(type, name) of the resources a request names more than once."""
    seen: set[tuple[int, str]] = set()
    dups: set[tuple[int, str]] = set()
    for r in resources:
        key = (int(r.resource_type), r.resource_name)
        (dups if key in seen else seen).add(key)
    return dups


def resource_error(broker: Broker, r: Any, duplicates: set[tuple[int, str]],
                   ctx: RequestContext | None = None) -> tuple[ErrorCode, str] | TopicState:
    """The topic an alter request may change, or the error its resource gets."""
    if (int(r.resource_type), r.resource_name) in duplicates:
        return ErrorCode.invalid_request, "Each resource must appear at most once."
    # Kafka: ALTER_CONFIGS on the topic, or on the cluster for a broker resource
    security = broker.security
    if ctx is not None and r.resource_type == BROKER and not security.cluster_allowed(
            ctx, ALTER_CONFIGS):
        return ErrorCode.cluster_authorization_failed, ""
    if ctx is not None and r.resource_type == TOPIC and not security.allowed(
            ctx, ALTER_CONFIGS, ACL_TOPIC, str(r.resource_name)):
        return ErrorCode.topic_authorization_failed, ""
    if r.resource_type == BROKER:
        return ErrorCode.invalid_request, "Broker configs are static: set them in the config file"
    if r.resource_type != TOPIC:
        return ErrorCode.invalid_request, f"Unsupported resource type {r.resource_type}"
    if not r.resource_name:
        return ErrorCode.invalid_request, "Default topic resources are not allowed."
    topic = broker.metadata.topic(r.resource_name)
    if topic is None:
        return ErrorCode.unknown_topic_or_partition, f"Topic {r.resource_name!r} does not exist"
    return topic


def check_known(names: Any) -> None:
    """TopicError(INVALID_CONFIG) for a name that is not a topic config."""
    for name in names:
        if name not in ACCEPTED_TOPIC_CONFIGS:
            raise TopicError(ErrorCode.invalid_config, f"Unknown topic config name: {name}")


async def store_topic_configs(broker: Broker, name: str, overrides: dict[str, str]) -> None:
    """Replace the topic's config overrides (validated) and apply them to its logs."""
    await broker.topics.set_configs_async(name, overrides)


def _apply(current: dict[str, str], ops: Any, topic: str) -> dict[str, str]:
    new = dict(current)
    names = [c.name for c in ops]
    if len(set(names)) != len(names):
        raise TopicError(ErrorCode.invalid_request, "A config name appears twice")
    for c in ops:
        d = ACCEPTED_TOPIC_CONFIGS.get(c.name)
        if d is None:
            raise TopicError(ErrorCode.invalid_config, f"Unknown topic config name: {c.name}")
        op = int(c.config_operation)
        if op == SET:
            if c.value is None:
                raise TopicError(ErrorCode.invalid_config, f"{c.name}: a value is required")
            new[c.name] = c.value
        elif op == DELETE:
            new.pop(c.name, None)
        elif op in (APPEND, SUBTRACT):
            if d.kind != "list":
                raise TopicError(ErrorCode.invalid_config,
                                 f"Config {c.name} is not a list; APPEND/SUBTRACT not allowed")
            items = [x for x in new.get(c.name, "").split(",") if x] or [
                x for x in str(d.default).split(",") if x]
            given = [x.strip() for x in (c.value or "").split(",") if x.strip()]
            if op == APPEND:
                items += [x for x in given if x not in items]
            else:
                items = [x for x in items if x not in given]
            new[c.name] = ",".join(items)
        else:
            raise TopicError(ErrorCode.invalid_request, f"Unknown config operation {op}")
    return validate_configs(new, topic)


@handler(44, "IncrementalAlterConfigs", 0, 1)
async def handle_incremental_alter_configs(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    responses = []
    duplicates = duplicate_resources(req.resources)
    for r in req.resources:
        entry: dict[str, Any] = {"error_code": 0, "error_message": None,
                                 "resource_type": r.resource_type,
                                 "resource_name": r.resource_name}
        responses.append(entry)
        if dynamic_resources.handles(r.resource_type) and (
                int(r.resource_type), r.resource_name) not in duplicates:
            entry["error_code"], entry["error_message"] = await dynamic_resources.alter(
                broker, ctx, r, bool(req.validate_only), incremental=True)
            continue
        topic = resource_error(broker, r, duplicates, ctx)
        if not isinstance(topic, TopicState):
            entry["error_code"], entry["error_message"] = topic
            continue
        try:
            new = _apply(topic.configs, r.configs, str(r.resource_name))
            check_internal_configs(r.resource_name, new, broker.config)
        except TopicError as e:
            entry["error_code"] = e.error_code
            entry["error_message"] = e.message
            continue
        if not req.validate_only:
            await store_topic_configs(broker, r.resource_name, new)
    return ctx.response({"throttle_time": 0, "responses": responses})
