"""DescribeConfigs (32): topic configs (overrides and defaults), broker configs (with their
dynamic layers: DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, issue 27) and group
configs (GROUP_CONFIG, Kafka 4.x)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.dynamic_resources import broker_id_error
from headrace.broker.security import DESCRIBE_CONFIGS
from headrace.broker.security import GROUP as ACL_GROUP
from headrace.broker.security import TOPIC as ACL_TOPIC
from headrace.config import (
    BROKER_ALIASES,
    BROKER_CONFIGS,
    DEPRECATED_TOPIC_CONFIGS,
    DYNAMIC_BROKER_CONFIGS,
    DYNAMIC_NO_EFFECT_CONFIGS,
    GROUP_CONFIGS,
    LISTENER_CONFIGS,
    LONG_MAX,
    NO_EFFECT_CONFIGS,
    NO_EFFECT_PREFIXES,
    TIME_UNIT_FORMS,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigDef,
)

if TYPE_CHECKING:
    from headrace.broker.server import Broker

TOPIC, BROKER = 2, 4
GROUP = 32
# Kafka's ConfigSource
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, GROUP_CONFIG = 2, 3, 8
# Kafka's ConfigType
CONFIG_TYPE = {"bool": 1, "string": 2, "int": 3, "long": 5, "list": 7, "version": 2}
UNKNOWN_TYPE, INT_TYPE, STRING_TYPE = 0, 3, 2


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
    for name, d in DEPRECATED_TOPIC_CONFIGS.items():  # Kafka 3.9 lists them too
        if keys is not None and name not in keys:
            continue
        stored = state.configs.get(name)
        syn = ([{"name": name, "value": stored, "source": DYNAMIC_TOPIC_CONFIG}]
               if synonyms and stored is not None else [])
        out.append(_entry(d, d.default if stored is None else d.parse(stored),
                          DEFAULT_CONFIG if stored is None else DYNAMIC_TOPIC_CONFIG, syn,
                          read_only=False))
    return out


# ---- broker configs as Kafka 3.9 reports them (ConfigHelper.createBrokerConfigEntry):
# a config's synonyms are the names that can set it (DynamicBrokerConfig.
# brokerConfigSynonyms: log.retention.ms/minutes/hours, log.roll.ms/hours,
# log.flush.interval.ms and the scheduler interval); each synonym given in the file is
# listed as STATIC_BROKER_CONFIG, then each with a Kafka default as DEFAULT_CONFIG, and the
# list starts at the described name itself (earlier, finer ones are dropped). The source is
# the first synonym's, else DEFAULT_CONFIG. Kafka's own names that headrace folds into its
# keys (broker.id, log.retention.hours, log.roll.hours, log.dir) are listed as well, and
# so is each key given that has no effect here.
_SYNONYM_GROUPS: tuple[tuple[str, ...], ...] = (
    *((ms, *(n for n, _ in forms)) for ms, forms in TIME_UNIT_FORMS.items()),
    ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
)
_SYNONYMS = {name: group for group in _SYNONYM_GROUPS for name in group}
# Kafka's default (as a string; None: no default, reported as a null value) where it is
# not the headrace default, and Kafka names with no ConfigDef here: (default, ConfigType)
_KAFKA_ONLY: dict[str, tuple[str | None, int]] = {
    "broker.id": ("-1", INT_TYPE),
    "log.dir": ("/tmp/kafka-logs", STRING_TYPE),
    "log.retention.minutes": (None, INT_TYPE),
    "log.retention.hours": ("168", INT_TYPE),
    "log.roll.hours": ("168", INT_TYPE),
    "log.flush.scheduler.interval.ms": (str(LONG_MAX), 5),
}
_KAFKA_DEFAULTS: dict[str, str | None] = {
    "log.retention.ms": None, "log.roll.ms": None, "log.flush.interval.ms": None,
    "log.dirs": None, "advertised.listeners": None,
}


def _kafka_default(name: str) -> str | None:
    if name in _KAFKA_ONLY:
        return _KAFKA_ONLY[name][0]
    if name in _KAFKA_DEFAULTS:
        return _KAFKA_DEFAULTS[name]
    d = BROKER_CONFIGS.get(name) or LISTENER_CONFIGS.get(name)
    return None if d is None else d.to_string(d.default)


def _given(config: BrokerConfig) -> dict[str, str]:
    """What the file, flags and overrides set, by the names they used (``broker.id`` set
    also sets ``node.id``, as in Kafka)."""
    out: dict[str, str] = {}
    for k, v in config.given.items():
        out[k] = "" if v is None else str(v)
        if k in BROKER_ALIASES:
            out.setdefault(BROKER_ALIASES[k], out[k])
    return out


def _effective_values(broker: Broker) -> dict[str, str | None]:
    """The value DescribeConfigs reports for each broker config."""
    config = broker.config
    given = _given(config)
    out: dict[str, str | None] = {}
    for name, d in {**BROKER_CONFIGS, **LISTENER_CONFIGS}.items():
        out[name] = d.to_string(config[name])
    dynamic = {**config.dynamic_default, **config.dynamic_broker}
    for name in _KAFKA_DEFAULTS:
        out[name] = dynamic.get(name, given.get(name, _kafka_default(name)))
    out["log.dirs"] = str(config["log.dirs"]) if "log.dirs" in given else None
    for name in _KAFKA_ONLY:
        out[name] = given.get(name, _kafka_default(name))
    out["broker.id"] = str(broker.node_id)
    # what is actually served: the bound port, the host it listens on
    served = f"PLAINTEXT://{_host(broker.host)}:{broker.port}"
    if "listeners" not in given or {"host", "port"} & set(given):
        out["listeners"] = served
    adv_host = str(config["advertised.host"]) or broker.host
    adv_port = int(config["advertised.port"]) or broker.port
    if "advertised.listeners" in given and not {"advertised.host", "advertised.port",
                                                "host", "port"} & set(given):
        out["advertised.listeners"] = given["advertised.listeners"]
    elif {"advertised.host", "advertised.port", "advertised.listeners"} & set(given):
        out["advertised.listeners"] = f"PLAINTEXT://{_host(adv_host)}:{adv_port}"
    for name in given:
        if name not in out and (name in NO_EFFECT_CONFIGS or name.startswith(NO_EFFECT_PREFIXES)):
            out[name] = given[name]
    for name, value in dynamic.items():  # dynamic ones with no effect here
        if name in DYNAMIC_NO_EFFECT_CONFIGS:
            out[name] = value
    return out


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else ("" if host == "0.0.0.0" else host)


def _broker_synonyms(name: str, given: dict[str, str],
                     config: BrokerConfig | None = None) -> list[dict[str, Any]]:
    """Kafka's ``ConfigHelper.configSynonyms``: each synonym name set dynamically for this
    broker, then dynamically as the default, then in the file, then Kafka's default."""
    names = _SYNONYMS.get(name, (name,))
    found: list[dict[str, Any]] = []
    if config is not None:
        found += [{"name": n, "value": config.dynamic_broker[n],
                   "source": DYNAMIC_BROKER_CONFIG}
                  for n in names if n in config.dynamic_broker]
        found += [{"name": n, "value": config.dynamic_default[n],
                   "source": DYNAMIC_DEFAULT_BROKER_CONFIG}
                  for n in names if n in config.dynamic_default]
    found += [{"name": n, "value": given[n], "source": STATIC_BROKER_CONFIG}
              for n in names if n in given]
    found += [{"name": n, "value": default, "source": DEFAULT_CONFIG}
              for n in names if (default := _kafka_default(n)) is not None]
    while found and found[0]["name"] != name:
        found.pop(0)
    return found


def _config_type(name: str) -> tuple[int, str]:
    d = BROKER_CONFIGS.get(name) or LISTENER_CONFIGS.get(name)
    if d is not None:
        return CONFIG_TYPE[d.kind], d.doc
    if name in _KAFKA_ONLY:
        return _KAFKA_ONLY[name][1], "Kafka's name; see its headrace config."
    return UNKNOWN_TYPE, "Accepted from server.properties; no effect here."


def default_broker_config_entries(broker: Broker, keys: tuple[str, ...] | None,
                                  synonyms: bool = False) -> list[dict[str, Any]]:
    """The cluster-wide dynamic defaults (the empty resource name): only those set, each
    DYNAMIC_DEFAULT_BROKER_CONFIG (Kafka's ``perBrokerConfig = false``)."""
    out = []
    for name, value in sorted(broker.config.dynamic_default.items()):
        if keys and name not in keys:
            continue
        config_type, doc = _config_type(name)
        syn = [{"name": name, "value": value, "source": DYNAMIC_DEFAULT_BROKER_CONFIG}]
        out.append({"name": name, "value": value,
                    "read_only": name not in DYNAMIC_BROKER_CONFIGS,
                    "config_source": DYNAMIC_DEFAULT_BROKER_CONFIG, "is_sensitive": False,
                    "synonyms": syn if synonyms else [], "config_type": config_type,
                    "documentation": doc})
    return out


def group_config_entries(broker: Broker, group: str, keys: tuple[str, ...] | None,
                         synonyms: bool = False) -> list[dict[str, Any]]:
    """Kafka's ``ConfigHelper.createGroupConfigEntry``: every group config, GROUP_CONFIG if
    the group sets it, else DEFAULT_CONFIG with the broker's value; never read-only."""
    overrides = broker.dynamic.group_overrides(group)
    values = broker.dynamic.group_values(group)
    out = []
    for name, d in GROUP_CONFIGS.items():
        if keys and name not in keys:
            continue
        source = GROUP_CONFIG if name in overrides else DEFAULT_CONFIG
        value = d.to_string(values[name])
        out.append({"name": name, "value": value, "read_only": False,
                    "config_source": source, "is_sensitive": False,
                    "synonyms": [{"name": name, "value": value, "source": source}]
                    if synonyms else [],
                    "config_type": CONFIG_TYPE[d.kind], "documentation": d.doc})
    return out


def broker_config_entries(broker: Broker, keys: tuple[str, ...] | None,
                          synonyms: bool = False) -> list[dict[str, Any]]:
    given = _given(broker.config)
    out = []
    for name, value in _effective_values(broker).items():
        if keys is not None and name not in keys:
            continue
        syn = _broker_synonyms(name, given, broker.config)
        if name in ("listeners", "advertised.listeners") and given.keys() & {
                "host", "port", "advertised.host", "advertised.port"}:
            source = STATIC_BROKER_CONFIG  # rendered from what was given
        else:
            source = syn[0]["source"] if syn else DEFAULT_CONFIG
        config_type, doc = _config_type(name)
        out.append({"name": name, "value": value,
                    "read_only": name not in DYNAMIC_BROKER_CONFIGS,
                    "config_source": source, "is_sensitive": False,
                    "synonyms": syn if synonyms else [], "config_type": config_type,
                    "documentation": doc})
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
        # Kafka: DESCRIBE_CONFIGS on the topic, or on the cluster for a broker
        if r.resource_type == TOPIC and not broker.security.allowed(
                ctx, DESCRIBE_CONFIGS, ACL_TOPIC, str(r.resource_name)):
            entry["error_code"] = ErrorCode.topic_authorization_failed
            continue
        if r.resource_type == GROUP and not broker.security.allowed(
                ctx, DESCRIBE_CONFIGS, ACL_GROUP, str(r.resource_name)):
            entry["error_code"] = ErrorCode.group_authorization_failed
            continue
        if r.resource_type not in (TOPIC, GROUP) and not broker.security.cluster_allowed(
                ctx, DESCRIBE_CONFIGS):
            entry["error_code"] = ErrorCode.cluster_authorization_failed
            continue
        if r.resource_type == TOPIC:
            if broker.metadata.topic(r.resource_name) is None:
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
                entry["error_message"] = f"Topic {r.resource_name!r} does not exist"
                continue
            entry["configs"] = topic_config_entries(broker, r.resource_name, keys, synonyms)
        elif r.resource_type == BROKER:
            bad = broker_id_error(broker, str(r.resource_name))
            if bad is not None:
                entry["error_code"] = ErrorCode.invalid_request
                entry["error_message"] = (
                    f"Unexpected broker id, expected {broker.node_id} or empty string, but "
                    f"received {r.resource_name}" if bad.startswith("Unexpected") else bad)
                continue
            # "" is the cluster-wide dynamic defaults (only those set); a broker id lists
            # every config of that broker
            if r.resource_name:
                entry["configs"] = broker_config_entries(broker, keys, synonyms)
            else:
                entry["configs"] = default_broker_config_entries(broker, keys, synonyms)
        elif r.resource_type == GROUP:
            if not r.resource_name:
                entry["error_code"] = ErrorCode.invalid_request
                entry["error_message"] = "Group name must not be empty"
                continue
            entry["configs"] = group_config_entries(broker, r.resource_name, keys, synonyms)
        else:
            entry["error_code"] = ErrorCode.invalid_request
            entry["error_message"] = f"Unsupported resource type {r.resource_type}"
    return ctx.response({"throttle_time": 0, "results": results})
