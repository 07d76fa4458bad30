"""DescribeConfigs (32): topic configs (overrides and defaults) and broker configs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.config import BROKER_CONFIGS, TOPIC_CONFIGS, ConfigDef

if TYPE_CHECKING:
    from headrace.broker.server import Broker

TOPIC, BROKER = 2, 4
# Kafka's ConfigSource
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
# Kafka's ConfigType
CONFIG_TYPE = {"bool": 1, "string": 2, "int": 3, "long": 5, "list": 7}


def _entry(d: ConfigDef, value: Any, source: int, synonyms: list[dict[str, Any]],
           read_only: bool) -> dict[str, Any]:
    return {"name": d.name, "value": d.to_string(value), "read_only": read_only,
            "config_source": source, "is_sensitive": False, "synonyms": synonyms,
            "config_type": CONFIG_TYPE[d.kind], "documentation": d.doc}


def topic_config_entries(
    broker: Broker, topic: str, keys: tuple[str, ...] | None, synonyms: bool = False
) -> list[dict[str, Any]]:
    state = broker.metadata.topic(topic)
    assert state is not None
    out = []
    for name, d in TOPIC_CONFIGS.items():
        if keys is not None and name not in keys:
            continue
        syn: list[dict[str, Any]] = []
        default = broker.config.topic_default(name)
        broker_source = (STATIC_BROKER_CONFIG if d.broker_name
                         and BROKER_CONFIGS[d.broker_name].default != default else DEFAULT_CONFIG)
        if name in state.configs:
            value, source = d.parse(state.configs[name]), DYNAMIC_TOPIC_CONFIG
            if synonyms:
                syn.append({"name": name, "value": state.configs[name],
                            "source": DYNAMIC_TOPIC_CONFIG})
        else:
            value, source = default, broker_source
        if synonyms and d.broker_name:
            syn.append({"name": d.broker_name, "value": d.to_string(default),
                        "source": broker_source})
        out.append(_entry(d, value, source, syn, read_only=False))
    return out


def broker_config_entries(broker: Broker, keys: tuple[str, ...] | None) -> list[dict[str, Any]]:
    out = []
    for name, d in BROKER_CONFIGS.items():
        if keys is not None and name not in keys:
            continue
        value = broker.config[name]
        source = DEFAULT_CONFIG if value == d.default else STATIC_BROKER_CONFIG
        out.append(_entry(d, value, source, [], read_only=True))
    return out


@handler(32, "DescribeConfigs", 1, 4)
async def handle_describe_configs(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    results = []
    synonyms = bool(getattr(req, "include_synonyms", False))
    for r in req.resources:
        entry: dict[str, Any] = {"error_code": 0, "error_message": None,
                                 "resource_type": r.resource_type,
                                 "resource_name": r.resource_name, "configs": []}
        results.append(entry)
        keys = tuple(r.configuration_keys) if r.configuration_keys is not None else None
        if r.resource_type == TOPIC:
            if broker.metadata.topic(r.resource_name) is None:
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
                entry["error_message"] = f"Topic {r.resource_name!r} does not exist"
                continue
            entry["configs"] = topic_config_entries(broker, r.resource_name, keys, synonyms)
        elif r.resource_type == BROKER:
            if r.resource_name not in ("", str(broker.node_id)):
                entry["error_code"] = ErrorCode.invalid_request
                entry["error_message"] = f"Unexpected broker id {r.resource_name!r}"
                continue
            entry["configs"] = broker_config_entries(broker, keys)
        else:
            entry["error_code"] = ErrorCode.invalid_request
            entry["error_message"] = f"Unsupported resource type {r.resource_type}"
    return ctx.response({"throttle_time": 0, "results": results})
