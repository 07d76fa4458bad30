"""Dynamic broker configs and group configs (issue 27 items 4 and 6), with real clients.

AlterConfigs / IncrementalAlterConfigs on a BROKER resource (this broker's id, or "" for the
cluster-wide default) change the broker at runtime, as Kafka's DynamicBrokerConfig does:
a produce above a lowered ``message.max.bytes`` is refused, a new topic takes the new
``log.segment.bytes``, ``max.connections`` refuses connections past it. Read-only configs
are refused with Kafka's code and text; DescribeConfigs reports DYNAMIC_BROKER_CONFIG /
DYNAMIC_DEFAULT_BROKER_CONFIG / STATIC_BROKER_CONFIG / DEFAULT_CONFIG with synonyms; all of it
survives a restart (the local metadata store). Group configs (resource type 32) are set and
described with confluent-kafka's AdminClient and validated against the broker's bounds.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from tests.brokerproc import wait_until
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path / "data", {"log.retention.hours": "100",
                                             "group.initial.rebalance.delay.ms": "0"}) as b:
        yield b


def admin(b: InProcessBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def alter(b: InProcessBroker, resource: ConfigResource) -> None:
    client = admin(b)  # kept alive until the result is in
    client.incremental_alter_configs([resource])[resource].result(timeout=15)


def set_broker(b: InProcessBroker, name: str, **configs: str | None) -> None:
    """IncrementalAlterConfigs on a broker: confluent-kafka for a broker id; the raw
    request for the cluster-wide default, which confluent-kafka cannot name ("")."""
    if name:
        entries = [ConfigEntry(k.replace("_", "."), v, incremental_operation=(
            AlterConfigOpType.DELETE if v is None else AlterConfigOpType.SET))
            for k, v in configs.items()]
        alter(b, ConfigResource(ConfigResource.Type.BROKER, name,
                                incremental_configs=entries))
        return
    with WireClient("127.0.0.1", b.port) as c:
        resp = c.request(44, 1, {"resources": [{
            "resource_type": 4, "resource_name": "", "configs": [
                {"name": k.replace("_", "."), "config_operation": 1 if v is None else 0,
                 "value": v} for k, v in configs.items()]}], "validate_only": False})
    assert [(r.error_code, r.error_message) for r in resp.responses] == [(0, None)]


def describe(b: InProcessBroker, rtype: Any, name: str) -> dict[str, Any]:
    res = ConfigResource(rtype, name)
    client = admin(b)
    got: dict[str, Any] = client.describe_configs([res])[res].result(timeout=15)
    return got


def produce(b: InProcessBroker, topic: str, size: int) -> KafkaError | None:
    """One record of ``size`` bytes; the delivery error, if any."""
    errors: list[KafkaError | None] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "message.max.bytes": 10_000_000,
                  "retries": 0, "compression.type": "none"})
    p.produce(topic, b"x" * size, on_delivery=lambda err, _msg: errors.append(err))
    p.flush(15)
    assert len(errors) == 1
    return errors[0]


def create_topic(b: InProcessBroker, topic: str) -> None:
    client = admin(b)
    futures = client.create_topics([NewTopic(topic, 1, 1)])
    futures[topic].result(timeout=15)


def test_message_max_bytes_changes_at_runtime_and_survives_a_restart(
        broker: InProcessBroker) -> None:
    """R-NF-1: a produce above the new default message.max.bytes is refused at once, for
    an existing topic without an override; the cluster-wide default applies too, this
    broker's own value wins over it, and both survive a restart."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic)
    assert produce(broker, topic, 20_000) is None
    set_broker(broker, "0", message_max_bytes="10000")
    err = produce(broker, topic, 20_000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    # the default is below this broker's own: this broker's wins
    set_broker(broker, "", message_max_bytes="5000")
    assert produce(broker, topic, 8_000) is None
    set_broker(broker, "0", message_max_bytes=None)  # back to the default: 5000
    err = produce(broker, topic, 8_000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    broker.restart()
    err = produce(broker, topic, 8_000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    entry = describe(broker, ConfigResource.Type.BROKER, "0")["message.max.bytes"]
    assert (entry.value, entry.source) == ("5000",
                                           ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    set_broker(broker, "", message_max_bytes=None)
    assert produce(broker, topic, 20_000) is None


def test_new_topics_take_the_new_log_defaults(broker: InProcessBroker) -> None:
    """A topic created after a change of log.segment.bytes and log.retention.ms has them as
    its defaults (DescribeConfigs of the topic: the broker synonym is dynamic)."""
    set_broker(broker, "0", log_segment_bytes="1048576", log_retention_ms="3600000")
    topic = f"t-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic)
    configs = describe(broker, ConfigResource.Type.TOPIC, topic)
    assert configs["segment.bytes"].value == "1048576"
    assert configs["retention.ms"].value == "3600000"
    hosted = broker.call(lambda br: br.replicas.partitions)
    log_config = next(p.log.config for tp, p in hosted.items() if tp.topic == topic)
    assert (log_config.segment_bytes, log_config.retention_ms) == (1_048_576, 3_600_000)


def test_describe_reports_sources_synonyms_and_read_only(broker: InProcessBroker) -> None:
    """librdkafka 0081's view: the source of each layer, the synonyms in Kafka's order
    (dynamic broker, dynamic default, static, default), read-only only for static-only
    configs; the "" resource lists just the dynamic defaults."""
    set_broker(broker, "", log_retention_ms="7200000", max_connections="500")
    set_broker(broker, "0", log_retention_ms="3600000")
    configs = describe(broker, ConfigResource.Type.BROKER, "0")
    ret = configs["log.retention.ms"]
    assert ret.value == "3600000" and not ret.is_read_only
    assert ret.source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    with WireClient("127.0.0.1", broker.port) as c:  # confluent-kafka keys them by name
        resp = c.request(32, 4, {"resources": [{
            "resource_type": 4, "resource_name": "0",
            "configuration_keys": ["log.retention.ms"]}],
            "include_synonyms": True, "include_documentation": False})
    (entry,) = resp.results[0].configs
    assert [(s.name, s.value, s.source) for s in entry.synonyms] == [
        ("log.retention.ms", "3600000", ConfigSource.DYNAMIC_BROKER_CONFIG.value),
        ("log.retention.ms", "7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value),
        ("log.retention.hours", "100", ConfigSource.STATIC_BROKER_CONFIG.value),
        ("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG.value)]
    assert configs["max.connections"].source == (
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    assert configs["log.dirs"].is_read_only
    assert configs["log.dirs"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["num.partitions"].source == ConfigSource.DEFAULT_CONFIG.value
    with WireClient("127.0.0.1", broker.port) as c:
        resp = c.request(32, 4, {"resources": [{
            "resource_type": 4, "resource_name": "", "configuration_keys": None}],
            "include_synonyms": True, "include_documentation": False})
    assert {e.name: (e.value, e.config_source, e.read_only)
            for e in resp.results[0].configs} == {
        "log.retention.ms": ("7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value,
                             False),
        "max.connections": ("500", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value, False)}


def test_read_only_configs_are_refused_as_kafka_refuses_them(broker: InProcessBroker) -> None:
    """Kafka's ZkAdminManager: INVALID_CONFIG "Invalid config value for resource
    ConfigResource(type=BROKER, name='0'): Cannot update these configs dynamically:
    Set(log.dirs)"; nothing of the resource is stored. Another broker's id and a name that
    is not a number are INVALID_REQUEST."""
    with pytest.raises(KafkaException) as e:
        set_broker(broker, "0", log_dirs="/elsewhere", message_max_bytes="1000")
    err = e.value.args[0]
    assert err.code() == KafkaError.INVALID_CONFIG
    assert err.str() == ("Invalid config value for resource ConfigResource(type=BROKER, "
                         "name='0'): Cannot update these configs dynamically: Set(log.dirs)")
    assert "message.max.bytes" not in broker.call(lambda br: br.config.dynamic_broker)
    with pytest.raises(KafkaException) as e:
        set_broker(broker, "0", message_max_bytes="-5")
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG
    # confluent-kafka sends a broker resource to that broker: talk to this one directly
    with WireClient("127.0.0.1", broker.port) as c:
        resp = c.request(44, 1, {"resources": [
            {"resource_type": 4, "resource_name": "7", "configs": [
                {"name": "message.max.bytes", "config_operation": 0, "value": "1000"}]},
            {"resource_type": 4, "resource_name": "x", "configs": []}],
            "validate_only": False})
    assert [(r.error_code, r.error_message) for r in resp.responses] == [
        (42, "Unexpected broker id, expected 0, but received 7"),
        (42, "Broker id must be an integer, but it is: x")]


def test_max_connections_applies_at_runtime(broker: InProcessBroker) -> None:
    """max.connections lowered below the open connections: the next one is refused."""
    set_broker(broker, "", max_connections="3")
    socks = []
    try:
        for _ in range(3):
            socks.append(socket.create_connection(("127.0.0.1", broker.port)))
        wait_until(lambda: broker.call(lambda br: br.quotas.total) >= 3)
        extra = socket.create_connection(("127.0.0.1", broker.port))
        extra.settimeout(10)
        assert extra.recv(1) == b""  # closed by the broker
        extra.close()
    finally:
        for s in socks:
            s.close()
        wait_until(lambda: broker.call(lambda br: br.quotas.total) == 0)
        set_broker(broker, "", max_connections=None)


def group_resource(group: str, **configs: str | None) -> ConfigResource:
    entries = [ConfigEntry(k.replace("_", "."), v, incremental_operation=(
        AlterConfigOpType.DELETE if v is None else AlterConfigOpType.SET))
        for k, v in configs.items()]
    return ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)


def test_group_configs_with_confluent_kafka(broker: InProcessBroker) -> None:
    """Kafka 4.2's group configs: set, described as GROUP_CONFIG (the rest DEFAULT_CONFIG
    with the broker's value), validated against group.*.min/max (INVALID_CONFIG with
    Kafka's text), deleted, and kept over a restart."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    res = group_resource(group, consumer_session_timeout_ms="50000",
                         share_isolation_level="read_committed",
                         share_auto_offset_reset="earliest")
    alter(broker, res)
    configs = describe(broker, ResourceType.GROUP, group)
    assert (configs["consumer.session.timeout.ms"].value,
            configs["consumer.session.timeout.ms"].source) == (
        "50000", ConfigSource.GROUP_CONFIG.value)
    assert configs["share.isolation.level"].value == "read_committed"
    assert (configs["consumer.heartbeat.interval.ms"].value,
            configs["consumer.heartbeat.interval.ms"].source) == (
        "5000", ConfigSource.DEFAULT_CONFIG.value)
    assert not configs["share.record.lock.duration.ms"].is_read_only
    for bad, text in [
            ({"consumer_session_timeout_ms": "1000"}, "consumer.session.timeout.ms must be "
             "greater than or equal to group.consumer.min.session.timeout.ms"),
            ({"no_such_config": "1"}, "Unknown group config name: no.such.config"),
            ({"share_isolation_level": "sometimes"}, "Invalid value sometimes for "
             "configuration share.isolation.level: String must be one of: read_committed, "
             "read_uncommitted")]:
        res = group_resource(group, **bad)
        with pytest.raises(KafkaException) as e:
            alter(broker, res)
        assert e.value.args[0].code() == KafkaError.INVALID_CONFIG
        assert e.value.args[0].str() == text
    broker.restart()
    configs = describe(broker, ResourceType.GROUP, group)
    assert configs["consumer.session.timeout.ms"].value == "50000"
    res = group_resource(group, consumer_session_timeout_ms=None)
    alter(broker, res)
    configs = describe(broker, ResourceType.GROUP, group)
    assert (configs["consumer.session.timeout.ms"].value,
            configs["consumer.session.timeout.ms"].source) == (
        "45000", ConfigSource.DEFAULT_CONFIG.value)


def test_a_consumer_group_takes_its_group_configs(broker: InProcessBroker) -> None:
    """KIP-848: a new group is made with its consumer.session.timeout.ms and
    consumer.heartbeat.interval.ms; a change reaches a group that exists at once."""
    from confluent_kafka import Consumer

    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic)
    alter(broker, group_resource(group, consumer_session_timeout_ms="55000",
                                 consumer_heartbeat_interval_ms="6000"))
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                  "group.protocol": "consumer", "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])

        def timeouts() -> tuple[int, int] | None:
            def read(br: Any) -> tuple[int, int] | None:
                g = br.groups.coordinator.groups.get(group)
                return None if g is None or not getattr(g, "members", None) else (
                    g.session_timeout_ms, g.heartbeat_interval_ms)
            c.poll(0.1)
            got: tuple[int, int] | None = broker.call(read)
            return got

        wait_until(lambda: timeouts() is not None, timeout_s=20)
        assert timeouts() == (55_000, 6000)
        alter(broker, group_resource(group, consumer_heartbeat_interval_ms="7000"))
        assert timeouts() == (55_000, 7000)
    finally:
        c.close()


def test_hostile_alter_requests_get_answers_and_no_traceback(broker: InProcessBroker) -> None:
    """Unknown operations, null values, duplicate names, odd names and values on BROKER and
    GROUP resources: each resource answered with an error, nothing stored, nothing but
    one-line logs."""
    cases: list[tuple[int, str, list[dict[str, Any]]]] = [
        (4, "0", [{"name": "message.max.bytes", "config_operation": 9, "value": "1"}]),
        (4, "0", [{"name": "message.max.bytes", "config_operation": 0, "value": None}]),
        (4, "", [{"name": "max.connections.per.ip.overrides", "config_operation": 0,
                  "value": "host:notanumber"}]),
        (4, "", [{"name": "log.cleanup.policy", "config_operation": 2, "value": "bogus"}]),
        (4, "0", [{"name": "x" * 5000, "config_operation": 0, "value": "\x00"}]),
        (4, "-1", []),
        (32, "", [{"name": "consumer.session.timeout.ms", "config_operation": 0,
                   "value": "50000"}]),
        (32, "g", [{"name": "share.auto.offset.reset", "config_operation": 2, "value": "x"}]),
        (32, "g\x00/..", [{"name": "consumer.session.timeout.ms", "config_operation": 0,
                           "value": "9" * 40}]),
        (32, "g", [{"name": "consumer.session.timeout.ms", "config_operation": 0,
                    "value": "50000"}] * 2),
    ]
    with WireClient("127.0.0.1", broker.port) as c:
        for rtype, name, configs in cases:
            resp = c.request(44, 1, {"resources": [{
                "resource_type": rtype, "resource_name": name, "configs": configs}],
                "validate_only": False})
            (r,) = resp.responses
            assert r.error_code in (40, 42), (rtype, name, configs, r)
    assert broker.call(lambda br: (br.config.dynamic_broker, br.config.dynamic_default)) == (
        {}, {})
    assert not [line for line in broker.stderr_lines
                if "Traceback" in line or "level=ERROR" in line]
