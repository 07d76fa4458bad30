"""Kafka's server.properties forms (issue 11 item 6): listeners, time units, log dirs,
keys with no effect here — translated into headrace's keys, or refused with the reason."""

from __future__ import annotations

import pytest

from headrace.config import BrokerConfig, ConfigError


def test_time_units_follow_kafkas_precedence() -> None:
    assert BrokerConfig.from_mapping({"log.retention.hours": "2"})["log.retention.ms"] \
        == 7_200_000
    assert BrokerConfig.from_mapping({"log.retention.hours": "2",
                                      "log.retention.minutes": "3"})["log.retention.ms"] \
        == 180_000
    assert BrokerConfig.from_mapping({"log.retention.hours": "2", "log.retention.minutes": "3",
                                      "log.retention.ms": "5"})["log.retention.ms"] == 5
    assert BrokerConfig.from_mapping({"log.retention.hours": "-1"})["log.retention.ms"] == -1
    assert BrokerConfig.from_mapping({"log.roll.hours": "1"})["log.roll.ms"] == 3_600_000
    with pytest.raises(ConfigError, match=r"log\.retention\.hours: expected an integer"):
        BrokerConfig.from_mapping({"log.retention.hours": "a week"})


def test_listeners_set_host_and_port_unless_given() -> None:
    cfg = BrokerConfig.from_mapping({"listeners": "PLAINTEXT://10.0.0.1:9093",
                                     "advertised.listeners": "PLAINTEXT://kafka.example:19093"})
    assert (cfg["host"], cfg["port"]) == ("10.0.0.1", 9093)
    assert (cfg["advertised.host"], cfg["advertised.port"]) == ("kafka.example", 19093)
    cfg = BrokerConfig.from_mapping({"listeners": "plaintext://[::1]:9093", "port": "0"})
    assert (cfg["host"], cfg["port"]) == ("::1", 0)  # --port wins over the file
    assert cfg.with_overrides({"num.partitions": "3"})["port"] == 0
    # a KRaft controller listener is not served, and said so
    cfg = BrokerConfig.from_mapping({
        "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://:9093",
        "controller.listener.names": "CONTROLLER", "process.roles": "broker,controller"})
    assert cfg["port"] == 9092
    assert cfg.notes == ("accepted with no effect here: process.roles, "
                         "listener CONTROLLER (controller.listener.names)",)


@pytest.mark.parametrize(("raw", "fragment"), [
    # a TLS listener needs its key and certificate (checked when the listeners are built)
    ({"listeners": "SSL://:9093"}, "listener SSL uses TLS: give ssl.keystore.location"),
    ({"listeners": "X://:1", "listener.security.protocol.map": "X:SASL_SSL"},
     "listener X uses TLS"),
    ({"listeners": "SASL_PLAINTEXT://:1", "sasl.enabled.mechanisms": "GSSAPI"},
     "GSSAPI not supported"),
    ({"listeners": "A://:1,B://:2", "listener.security.protocol.map": "A:PLAINTEXT,B:SSL",
      "inter.broker.listener.name": "C"}, "C is not among the listeners"),
    ({"listeners": "X://:1"}, "no security protocol for listener X"),
    ({"listeners": "PLAINTEXT://:99999"}, "is not NAME://HOST:PORT"),
    ({"listeners": "PLAINTEXT://:1,plaintext://:2"}, "appears twice"),
    ({"listeners": "PLAINTEXT://:1", "listener.security.protocol.map": "PLAINTEXT:TLS"},
     "is not LISTENER:PROTOCOL"),
    ({"log.dirs": " , "}, "must name a directory"),
    ({"num.network.thread": "3"}, "unknown configuration"),
])
def test_refused_with_the_reason(raw: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        BrokerConfig.from_mapping(raw).listeners()


def test_log_dirs_first_holds_the_state_and_the_rest_are_named() -> None:
    cfg = BrokerConfig.from_mapping({"log.dirs": "/a,/b, /c,/b"})
    assert str(cfg.data_dir) == "/a"
    assert [str(d) for d in cfg.log_dirs] == ["/a", "/b", "/c"]
    assert cfg.notes == ("log.dirs lists 4 directories: /a holds the broker's state and new "
                         "partitions; /b, /c, /b hold the replicas moved there "
                         "(AlterReplicaLogDirs)",)
    assert str(BrokerConfig.from_mapping({"log.dir": "/x"}).data_dir) == "/x"
    assert str(BrokerConfig.from_mapping({"log.dir": "/x", "log.dirs": "/y"}).data_dir) == "/y"


def test_no_effect_keys_are_named_once_and_broker_id_is_node_id() -> None:
    cfg = BrokerConfig.from_mapping({"broker.id": "4", "num.io.threads": "8",
                                     "ssl.keystore.location": "/k", "num.partitions": "2"})
    assert cfg.node_id == 4 and cfg["num.partitions"] == 2
    assert cfg.notes == ("accepted with no effect here: num.io.threads, "
                         "ssl.keystore.location",)
    assert cfg.given["broker.id"] == "4"


def test_kafka_39_deprecated_broker_configs_are_accepted_with_kafkas_warning() -> None:
    """Issue 27 item 5: ``log.message.format.version`` is validated and ignored with Kafka
    3.9's warning (one line); ``log.message.timestamp.difference.max.ms`` is the before and
    after limits the file does not set, as Kafka 3.9 reads it."""
    cfg = BrokerConfig.from_mapping({"log.message.format.version": "2.8",
                                     "log.message.timestamp.difference.max.ms": "60000",
                                     "log.message.timestamp.after.max.ms": "5000"})
    assert cfg.notes == (
        "Broker configuration log.message.format.version with value 2.8 is ignored because "
        "the inter-broker protocol version `3.9-IV0` is greater or equal than 3.0. This "
        "configuration is deprecated and it will be removed in Apache Kafka 4.0.",)
    assert cfg["log.message.timestamp.before.max.ms"] == 60000
    assert cfg["log.message.timestamp.after.max.ms"] == 5000
    with pytest.raises(ConfigError, match=r"Version 0\.7 is not a valid version"):
        BrokerConfig.from_mapping({"log.message.format.version": "0.7"})
    with pytest.raises(ConfigError, match="must be at least 0"):
        BrokerConfig.from_mapping({"log.message.timestamp.difference.max.ms": "-1"})
