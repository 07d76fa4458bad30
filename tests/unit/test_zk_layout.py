"""Kafka's ZooKeeper JSON (R-REP-9), as Kafka 3.x wrote it."""

from __future__ import annotations

import json
import uuid

import pytest

from headrace.cluster import zk_layout as L
from headrace.metadata.store import BrokerInfo, Endpoint, PartitionState


def test_state_znode_is_kafkas() -> None:
    data = L.encode_state(PartitionState([1, 2, 3], 2, 5, [2, 3]), 7)
    assert json.loads(data) == {"controller_epoch": 7, "leader": 2, "version": 1,
                                "leader_epoch": 5, "isr": [2, 3]}
    assert L.decode_state("s", data) == (2, 5, [2, 3], 7)


def test_topic_znode_round_trip_and_topic_id() -> None:
    tid = uuid.UUID("1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9")
    data = L.encode_topic(tid, {0: [1, 2], 1: [2, 1]})
    d = json.loads(data)
    assert d["version"] == 3 and d["partitions"] == {"0": [1, 2], "1": [2, 1]}
    assert "=" not in d["topic_id"] and len(d["topic_id"]) == 22
    a = L.decode_topic("t", data)
    assert a.topic_id == tid and a.partitions == {0: [1, 2], 1: [2, 1]}


def test_broker_znode_endpoint_and_rack() -> None:
    data = L.encode_broker(BrokerInfo(3, "10.0.0.3", 9093, "r1"), 1)
    d = json.loads(data)
    assert d["endpoints"] == ["PLAINTEXT://10.0.0.3:9093"] and d["version"] == 5
    assert L.decode_broker(3, data) == BrokerInfo(
        3, "10.0.0.3", 9093, "r1", (Endpoint("PLAINTEXT", "PLAINTEXT", "10.0.0.3", 9093),))


def test_broker_znode_with_several_listeners() -> None:
    """Kafka's BrokerIdZNode v5 with listeners: every endpoint and its protocol; host and
    port are the PLAINTEXT listener's (null and -1 without one); a reader takes its own
    inter-broker listener's endpoint as the broker's address."""
    eps = (Endpoint("INTERNAL", "SASL_SSL", "b3.internal", 9094),
           Endpoint("EXTERNAL", "SSL", "b3.example.com", 9093))
    data = L.encode_broker(BrokerInfo(3, "b3.internal", 9094, None, eps), 1)
    d = json.loads(data)
    assert d["endpoints"] == ["INTERNAL://b3.internal:9094", "EXTERNAL://b3.example.com:9093"]
    assert d["listener_security_protocol_map"] == {"INTERNAL": "SASL_SSL", "EXTERNAL": "SSL"}
    assert (d["host"], d["port"]) == (None, -1)
    b = L.decode_broker(3, data, "INTERNAL")
    assert (b.host, b.port, b.endpoints) == ("b3.internal", 9094, eps)
    seen = b.on_listener("EXTERNAL")
    assert seen is not None and (seen.host, seen.port) == ("b3.example.com", 9093)
    assert b.on_listener("OTHER") is None


def test_other_nodes() -> None:
    assert L.decode_controller(L.encode_controller(4, 1)) == 4
    assert L.decode_controller(None) == -1
    assert L.decode_cluster_id(L.encode_cluster_id("abc")) == "abc"
    assert L.decode_producer_id_block(L.encode_producer_id_block(1, 1000, 1999)) == 1999
    assert L.decode_config("t", L.encode_config({"retention.ms": "5"})) == {"retention.ms": "5"}
    assert L.decode_reassignment(L.encode_partition_list(
        "partitions", [{"topic": "t", "partition": 0, "replicas": [1, 2]}])) == [("t", 0, [1, 2])]


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b'{"partitions": {"1": [1]}}',
                                  b'{"partitions": {"0": ["x"]}}', b"\xff"])
def test_malformed_topic_is_a_clear_error(data: bytes) -> None:
    with pytest.raises(L.LayoutError):
        L.decode_topic("t", data)


@pytest.mark.parametrize("data", [b"{}", b'{"leader": 1}', b"null", b"7"])
def test_malformed_state_is_a_clear_error(data: bytes) -> None:
    with pytest.raises(L.LayoutError):
        L.decode_state("s", data)
