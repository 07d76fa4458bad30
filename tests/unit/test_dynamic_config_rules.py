"""The pure rules of dynamic broker configs and group configs (issue 27 items 4 and 6):
the layering (this broker's over the cluster-wide default over the file over Kafka's
default), what may change dynamically (Kafka's DynamicBrokerConfig set as far as headrace
has it), group config validation (Kafka 4.2's GroupConfig: names, values, the broker's
bounds, sessions longer than heartbeats), and their storage in the local metadata store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headrace.cluster import zk_layout as L
from headrace.config import (
    BROKER_CONFIGS,
    DYNAMIC_BROKER_CONFIGS,
    DYNAMIC_LOG_CONFIGS,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigError,
    GroupConfigError,
    check_dynamic_names,
    effective_group_config,
    log_config,
    validate_group_configs,
)
from headrace.metadata.store import BrokerInfo, LocalMetadataStore


def config(**given: str) -> BrokerConfig:
    return BrokerConfig.from_mapping({"log.dirs": "/tmp/x", **given})


def test_layers_take_precedence_in_kafkas_order() -> None:
    """DYNAMIC_BROKER_CONFIG > DYNAMIC_DEFAULT_BROKER_CONFIG > STATIC > DEFAULT; a dynamic
    log.retention.ms wins over a static log.retention.hours (the finest unit given)."""
    c = config(**{"log.retention.hours": "2", "message.max.bytes": "2000"})
    assert c["log.retention.ms"] == 7_200_000
    changed = c.reconfigure({"log.retention.ms": "60000", "message.max.bytes": "3000"},
                            {"message.max.bytes": "4000"})
    assert changed == {"log.retention.ms", "message.max.bytes"}
    assert (c["log.retention.ms"], c["message.max.bytes"]) == (60_000, 4000)
    assert c.reconfigure({"log.retention.ms": "60000"}, {}) == {"message.max.bytes"}
    assert c["message.max.bytes"] == 2000  # back to the file's value
    c.reconfigure({}, {})
    assert c["log.retention.ms"] == 7_200_000
    # topic defaults follow: a topic without an override, one with
    assert log_config(c, {}).retention_ms == 7_200_000
    c.reconfigure({}, {"log.segment.bytes": "1048576"})
    assert log_config(c, {}).segment_bytes == 1_048_576
    assert log_config(c, {"segment.bytes": 2048}).segment_bytes == 2048


def test_an_invalid_layer_changes_nothing() -> None:
    c = config()
    with pytest.raises(ConfigError):
        c.reconfigure({}, {"message.max.bytes": "lots"})
    assert c["message.max.bytes"] == BROKER_CONFIGS["message.max.bytes"].default
    assert c.dynamic_broker == {}


def test_only_dynamic_names_may_change_with_kafkas_text() -> None:
    """Every log default a topic config takes is dynamic (DynamicLogConfig), as are the
    connection limits; node.id, log.dirs, listeners are not, nor is an unknown name."""
    assert {d.broker_name for d in TOPIC_CONFIGS.values()} <= DYNAMIC_LOG_CONFIGS
    assert {"message.max.bytes", "max.connections", "max.connections.per.ip",
            "max.connections.per.ip.overrides", "num.replica.fetchers",
            "log.cleaner.threads"} <= DYNAMIC_BROKER_CONFIGS
    check_dynamic_names(["log.retention.ms", "log.cleaner.threads"])
    for names, text in [(["log.dirs"], "Set(log.dirs)"),
                        (["message.max.bytes", "node.id", "listeners"],
                         "Set(node.id, listeners)"),
                        (["log.retention.hours"], "Set(log.retention.hours)"),
                        (["no.such.thing"], "Set(no.such.thing)")]:
        with pytest.raises(ConfigError, match="Cannot update these configs dynamically: "
                                              + text.replace("(", r"\(").replace(")", r"\)")):
            check_dynamic_names(names)


def test_a_stored_layer_ignores_names_that_are_not_dynamic() -> None:
    """Another tool may have written anything under /config/brokers: only dynamic names
    take effect."""
    c = config()
    c.reconfigure({"node.id": "7"}, {"log.dirs": "/elsewhere"})
    assert (c.node_id, str(c.data_dir)) == (0, "/tmp/x")


@pytest.mark.parametrize("overrides, error", [
    ({"consumer.session.timeout.ms": "44999"},
     "consumer.session.timeout.ms must be greater than or equal to "
     "group.consumer.min.session.timeout.ms"),
    ({"consumer.session.timeout.ms": "60001"},
     "consumer.session.timeout.ms must be less than or equal to "
     "group.consumer.max.session.timeout.ms"),
    ({"consumer.heartbeat.interval.ms": "4000"},
     "consumer.heartbeat.interval.ms must be greater than or equal to "
     "group.consumer.min.heartbeat.interval.ms"),
    ({"share.record.lock.duration.ms": "70000"},
     "share.record.lock.duration.ms must be less than or equal to "
     "group.share.max.record.lock.duration.ms"),
    ({"streams.num.standby.replicas": "3"},
     "streams.num.standby.replicas must be less than or equal to "
     "group.streams.max.standby.replicas"),
    ({"share.auto.offset.reset": "middle"},
     "Invalid value middle for configuration share.auto.offset.reset: Invalid value for "
     "share.auto.offset.reset"),
    ({"share.record.lock.duration.ms": "999"},
     "Invalid value 999 for configuration share.record.lock.duration.ms: Value must be at "
     "least 1000"),
    ({"consumer.group.id": "x"}, "Unknown group config name: consumer.group.id"),
])
def test_group_configs_refused_with_kafkas_text(overrides: dict[str, str], error: str) -> None:
    with pytest.raises(GroupConfigError) as e:
        validate_group_configs(config(), overrides)
    assert str(e.value) == error


def test_group_configs_within_the_brokers_bounds() -> None:
    """Sessions must exceed heartbeats after merging over the broker defaults; bounds come
    from the broker config (a broker with lower minimums allows shorter sessions)."""
    c = config()
    assert validate_group_configs(c, {"share.auto.offset.reset": "by_duration:PT1H30M",
                                      "share.isolation.level": "read_committed",
                                      "consumer.session.timeout.ms": "60000"}) == {
        "share.auto.offset.reset": "by_duration:PT1H30M",
        "share.isolation.level": "read_committed", "consumer.session.timeout.ms": "60000"}
    low = config(**{"group.consumer.min.session.timeout.ms": "1000",
                    "group.consumer.min.heartbeat.interval.ms": "100"})
    validate_group_configs(low, {"consumer.session.timeout.ms": "2000",
                                 "consumer.heartbeat.interval.ms": "500"})
    with pytest.raises(GroupConfigError, match=re.escape(
            "consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms")):
        validate_group_configs(low, {"consumer.session.timeout.ms": "2000",
                                     "consumer.heartbeat.interval.ms": "2000"})
    values = effective_group_config(config(**{"group.consumer.session.timeout.ms": "50000"}),
                                    {"consumer.heartbeat.interval.ms": "6000"})
    assert (values["consumer.session.timeout.ms"], values["consumer.heartbeat.interval.ms"],
            values["share.isolation.level"]) == (50_000, 6000, "read_uncommitted")


def test_entity_paths_are_kafkas() -> None:
    assert L.broker_entity(None) == "brokers/<default>"
    assert L.broker_entity(3) == "brokers/3"
    assert L.group_entity("a/b c") == "groups/a%2Fb%20c"
    assert L.quota_path(L.broker_entity(None)) == "/config/brokers/<default>"
    assert L.is_entity_config("brokers/<default>") and L.is_entity_config("groups/g")
    assert not L.is_entity_config("users/alice") and not L.is_entity_config("groups/")
    assert L.decode_config("x", L.encode_config({"message.max.bytes": "5"})) == {
        "message.max.bytes": "5"}
    assert L.encode_config({"a": "1"}) == b'{"version":1,"config":{"a":"1"}}'


def test_local_store_keeps_entity_configs_over_a_reopen(tmp_path: Path) -> None:
    me = BrokerInfo(0, "127.0.0.1", 9092)
    store = LocalMetadataStore(tmp_path, me)
    store.change_entity_configs("brokers/<default>", {"message.max.bytes": "5000"})
    store.change_entity_configs("brokers/0", {"log.retention.ms": "1"})
    store.change_entity_configs("groups/g", {"consumer.session.timeout.ms": "50000"})
    store.change_entity_configs("brokers/0", {})
    store.close()
    store = LocalMetadataStore(tmp_path, me)
    assert store.entity_configs("brokers/<default>") == {"message.max.bytes": "5000"}
    assert store.entity_configs("brokers/0") == {}
    assert store.entity_config_paths("groups") == ["groups/g"]
    store.close()
