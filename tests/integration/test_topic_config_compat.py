"""Topic configs as Kafka answers them (issue 27 items 2 and 5; R-PROTO-5), against an
in-process broker over the wire and with confluent-kafka's admin client:

- a refused topic config is INVALID_CONFIG with Kafka's text (clients match on it: Quix
  Streams' ``test_create_topics_invalid_config``): "Unknown topic config name: X"; a bad
  value "Invalid value V for configuration X: <ConfigDef's reason>", which AlterConfigs and
  IncrementalAlterConfigs prefix with the resource as ZooKeeper-mode Kafka 3.9 does;
- Kafka 3.9's deprecated topic configs are accepted: ``message.format.version`` (librdkafka
  0092 sets it) is stored and ignored with Kafka's warning, once per topic and value;
  ``message.timestamp.difference.max.ms`` limits record timestamps where the topic sets
  neither ``message.timestamp.before.max.ms`` nor ``.after.max.ms``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from tests.batches import make_batch
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.timeout(120)

TOPIC_RESOURCE, SET = 2, 0
WARNING = "Topic configuration message.format.version with value `{v}` is ignored for `{t}`"


@pytest.fixture(scope="module")
def b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("topic-configs"),
                         {"num.partitions": "1"}) as broker:
        yield broker
        text = "".join(broker.stderr_lines)
        assert "Traceback" not in text, text[-3000:]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _create(wc: WireClient, name: str, configs: dict[str, str | None],
            version: int = 7) -> Any:
    resp = wc.request(19, version, {"topics": [{
        "name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [],
        "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
        "timeout": 10_000, "validate_only": False})
    (res,) = resp.topics
    return res


def _alter(wc: WireClient, topic: str, configs: dict[str, str]) -> Any:
    resp = wc.request(33, 2, {"resources": [{
        "resource_type": TOPIC_RESOURCE, "resource_name": topic,
        "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
        "validate_only": False})
    (res,) = resp.responses
    return res


def _incremental(wc: WireClient, topic: str, configs: dict[str, str]) -> Any:
    resp = wc.request(44, 1, {"resources": [{
        "resource_type": TOPIC_RESOURCE, "resource_name": topic,
        "configs": [{"name": k, "config_operation": SET, "value": v}
                    for k, v in configs.items()]}], "validate_only": False})
    (res,) = resp.responses
    return res


def _describe(wc: WireClient, topic: str) -> dict[str, tuple[str | None, int]]:
    resp = wc.request(32, 4, {"resources": [{"resource_type": TOPIC_RESOURCE,
                                             "resource_name": topic,
                                             "configuration_keys": None}],
                              "include_synonyms": False, "include_documentation": False})
    (r,) = resp.results
    assert r.error_code == ErrorCode.none
    return {c.name: (c.value, int(c.config_source)) for c in r.configs}


# Kafka 3.9's texts (LogConfig.validateNames; ConfigException(name, value, reason))
BAD_VALUES = [
    ("retention.ms", "abc",
     "Invalid value abc for configuration retention.ms: Not a number of type LONG"),
    ("segment.bytes", "1",
     "Invalid value 1 for configuration segment.bytes: Value must be at least 14"),
    ("max.message.bytes", "99999999999",
     "Invalid value 99999999999 for configuration max.message.bytes: "
     "Not a number of type INT"),
    ("cleanup.policy", "delete,shred",
     "Invalid value shred for configuration cleanup.policy: "
     "String must be one of: compact, delete"),
    ("message.timestamp.type", "Whenever",
     "Invalid value Whenever for configuration message.timestamp.type: "
     "String must be one of: CreateTime, LogAppendTime"),
    ("unclean.leader.election.enable", "yes",
     "Invalid value yes for configuration unclean.leader.election.enable: "
     "Expected value to be either true or false"),
    ("message.format.version", "0.7",
     "Invalid value 0.7 for configuration message.format.version: "
     "Version 0.7 is not a valid version"),
]


def test_create_topics_refusals_in_kafkas_words(b: InProcessBroker) -> None:
    """CreateTopics: an unknown name, a null value and each kind of bad value answer
    INVALID_CONFIG with Kafka's message (ZkAdminManager.createTopics)."""
    with WireClient.to(b.bootstrap) as wc:
        res = _create(wc, _name("unknown"), {"blabla": "1"})
        assert (res.error_code, res.error_message) == (
            ErrorCode.invalid_config, "Unknown topic config name: blabla")
        res = _create(wc, _name("null"), {"retention.ms": None})
        assert (res.error_code, res.error_message) == (
            ErrorCode.invalid_config, "Null value not supported for topic configs: retention.ms")
        for name, value, message in BAD_VALUES:
            res = _create(wc, _name("bad"), {name: value})
            assert (res.error_code, res.error_message) == (ErrorCode.invalid_config,
                                                           message), name


def test_confluent_admin_sees_unknown_topic_config_name(b: InProcessBroker) -> None:
    """Quix Streams' ``test_create_topics_invalid_config``: the admin client's exception
    carries Kafka's text."""
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    fut = admin.create_topics([NewTopic(_name("quix"), 1, 1, config={"blabla": "1"})])
    (f,) = fut.values()
    with pytest.raises(KafkaException) as e:
        f.result(30)
    err = e.value.args[0]
    assert err.code() == 40 and "Unknown topic config name: blabla" in err.str(), err


def test_alter_configs_refusals_in_kafkas_words(b: InProcessBroker) -> None:
    """AlterConfigs and IncrementalAlterConfigs: an unknown name is "Unknown topic config
    name: X"; a bad value carries ZooKeeper-mode Kafka's prefix naming the resource."""
    topic = _name("alter")
    with WireClient.to(b.bootstrap) as wc:
        assert _create(wc, topic, {}).error_code == ErrorCode.none
        for alter in (_alter, _incremental):
            res = alter(wc, topic, {"blabla": "1"})
            assert (res.error_code, res.error_message) == (
                ErrorCode.invalid_config, "Unknown topic config name: blabla"), alter
            for name, value, message in BAD_VALUES:
                res = alter(wc, topic, {name: value})
                assert (res.error_code, res.error_message) == (
                    ErrorCode.invalid_config,
                    f"Invalid config value for resource ConfigResource(type=TOPIC, "
                    f"name='{topic}'): {message}"), (alter, name)


def _warnings(b: InProcessBroker, value: str, topic: str) -> int:
    return sum(WARNING.format(v=value, t=topic) in line for line in b.stderr_lines)


def test_message_format_version_is_accepted_stored_and_ignored(b: InProcessBroker) -> None:
    """librdkafka 0092: CreateTopics with ``message.format.version`` succeeds; the value is
    stored (DescribeConfigs: DYNAMIC_TOPIC_CONFIG) and ignored (records stay batches v2),
    with Kafka's warning once; AlterConfigs and IncrementalAlterConfigs accept it too."""
    topic = _name("mfv")
    with WireClient.to(b.bootstrap) as wc:
        assert _create(wc, topic, {"message.format.version": "0.10.0"}).error_code == 0
        assert _describe(wc, topic)["message.format.version"] == ("0.10.0", 1)
        resp = wc.request(0, 9, {"transactional_id": None, "acks": -1, "timeout": 10_000,
                                 "topic_data": [{"name": topic, "partition_data": [
                                     {"index": 0, "records": make_batch(
                                         [(None, b"v", int(time.time() * 1000), [])])}]}]})
        assert resp.responses[0].partition_responses[0].error_code == ErrorCode.none
        assert _warnings(b, "0.10.0", topic) == 1
        # the same value again (an unrelated change) does not warn again
        assert _incremental(wc, topic, {"retention.ms": "86400000"}).error_code == 0
        assert _warnings(b, "0.10.0", topic) == 1
        assert _alter(wc, topic, {"message.format.version": "2.8-IV1"}).error_code == 0
        assert _describe(wc, topic)["message.format.version"] == ("2.8-IV1", 1)
        assert _incremental(wc, topic, {"message.format.version": "3.0"}).error_code == 0
        assert _describe(wc, topic)["message.format.version"] == ("3.0", 1)
        assert _warnings(b, "3.0", topic) == 1
        # another topic: default reported, nothing stored
        other = _name("plain")
        assert _create(wc, other, {}).error_code == 0
        assert _describe(wc, other)["message.format.version"] == ("3.0-IV1", 5)


def test_message_timestamp_difference_max_ms_limits_both_sides(b: InProcessBroker) -> None:
    """Kafka 3.9's ``message.timestamp.difference.max.ms``: where the topic sets neither
    before nor after limit, a record older or newer than it is INVALID_TIMESTAMP; an
    explicit ``message.timestamp.before.max.ms`` wins."""
    topic, explicit = _name("tsdiff"), _name("tsdiff-before")
    now = int(time.time() * 1000)

    def produce(wc: WireClient, name: str, ts: int) -> ErrorCode:
        resp = wc.request(0, 9, {"transactional_id": None, "acks": -1, "timeout": 10_000,
                                 "topic_data": [{"name": name, "partition_data": [
                                     {"index": 0, "records": make_batch(
                                         [(None, b"v", ts, [])])}]}]})
        return ErrorCode(resp.responses[0].partition_responses[0].error_code)

    with WireClient.to(b.bootstrap) as wc:
        assert _create(wc, topic, {"message.timestamp.difference.max.ms": "600000"}
                       ).error_code == 0
        assert _create(wc, explicit, {"message.timestamp.difference.max.ms": "600000",
                                      "message.timestamp.before.max.ms": "86400000"}
                       ).error_code == 0
        assert produce(wc, topic, now) == ErrorCode.none
        assert produce(wc, topic, now - 3_600_000) == ErrorCode.invalid_timestamp
        assert produce(wc, topic, now + 1_200_000) == ErrorCode.invalid_timestamp
        assert produce(wc, explicit, now - 3_600_000) == ErrorCode.none
        assert produce(wc, explicit, now + 1_200_000) == ErrorCode.invalid_timestamp
        assert _describe(wc, topic)["message.timestamp.difference.max.ms"] == ("600000", 1)
