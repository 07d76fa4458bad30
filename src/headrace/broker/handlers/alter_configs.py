"""AlterConfigs (33): replace a topic's whole set of config overrides (the legacy API:
kafkajs's and aiokafka's only way to change configs, confluent-kafka's ``alter_configs``).

Kafka's rules (``ConfigAdminManager.preprocess``, ``ZkAdminManager.alterConfigs``): a
resource named twice is INVALID_REQUEST for both; a config named twice in a resource is
INVALID_REQUEST ("Error due to duplicate config keys"); a null value is INVALID_REQUEST
("Null value not supported for : <names>"); an unknown topic config name or a bad value is
INVALID_CONFIG. Otherwise the given configs become the topic's overrides and every
override not given is removed (back to its default): that is the difference from
IncrementalAlterConfigs, whose resource checks and storing this module shares. The whole
resource is validated before anything is stored; ``validate_only`` stores nothing. BROKER
and GROUP resources (dynamic broker configs, group configs) are ``dynamic_resources``'.
Overrides leaving an internal topic's
``cleanup.policy`` other than ``compact`` are INVALID_CONFIG (``check_internal_configs``;
Kafka accepts them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers import dynamic_resources
from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.incremental_alter_configs import (
    check_known,
    duplicate_resources,
    resource_error,
    store_topic_configs,
)
from headrace.broker.topics import TopicError, check_internal_configs, validate_configs
from headrace.metadata.store import TopicState

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def preprocess(configs: Any) -> None:
    """Kafka's checks before it looks at the resource: TopicError(INVALID_REQUEST)."""
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise TopicError(ErrorCode.invalid_request, "Error due to duplicate config keys")
    nulls = [c.name for c in configs if c.value is None]
    if nulls:
        raise TopicError(ErrorCode.invalid_request,
                         "Null value not supported for : " + ", ".join(nulls))


def new_overrides(configs: Any, topic: str) -> dict[str, str]:
    """The overrides an AlterConfigs resource asks for, validated; TopicError if not."""
    check_known(c.name for c in configs)
    return validate_configs({c.name: c.value for c in configs}, topic)


@handler(33, "AlterConfigs", 0, 2)
async def handle_alter_configs(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    responses = []
    duplicates = duplicate_resources(req.resources)
    for r in req.resources:
        entry: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None,
                                 "resource_type": r.resource_type,
                                 "resource_name": r.resource_name}
        responses.append(entry)
        if (int(r.resource_type), r.resource_name) not in duplicates:
            try:
                preprocess(r.configs)
            except TopicError as e:
                entry["error_code"], entry["error_message"] = e.error_code, e.message
                continue
            if dynamic_resources.handles(r.resource_type):
                entry["error_code"], entry["error_message"] = await dynamic_resources.alter(
                    broker, ctx, r, bool(req.validate_only), incremental=False)
                continue
        topic = resource_error(broker, r, duplicates, ctx)
        if not isinstance(topic, TopicState):
            entry["error_code"], entry["error_message"] = topic
            continue
        try:
            new = new_overrides(r.configs, str(r.resource_name))
            check_internal_configs(r.resource_name, new, broker.config)
        except TopicError as e:
            entry["error_code"], entry["error_message"] = e.error_code, e.message
            continue
        if not req.validate_only:
            await store_topic_configs(broker, r.resource_name, new)
    return ctx.response({"throttle_time": 0, "responses": responses})
