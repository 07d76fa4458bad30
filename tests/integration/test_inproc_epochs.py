"""Leader-epoch fencing of client requests (KIP-320), fast twin of
tests/cluster/test_admin_cluster.py's epoch checks (issue 22 item 1): a request naming a
newer leader epoch than the replica knows gets UNKNOWN_LEADER_EPOCH (retry at once: the
replica has not heard of it yet), an older one FENCED_LEADER_EPOCH (the client's metadata is
stale), the current one or none (-1) is served. Fetch, ListOffsets and OffsetForLeaderEpoch
check it alike; on an in-process broker, with the rule's table on its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from headrace.broker.handlers.fetch import _epoch_error
from tests.clients import Rec, create_topic, produce
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient


@pytest.mark.parametrize(("requested", "current", "expected"), [
    (-1, 3, None), (3, 3, None), (4, 3, ErrorCode.unknown_leader_epoch),
    (9, 3, ErrorCode.unknown_leader_epoch), (2, 3, ErrorCode.fenced_leader_epoch),
    (0, 3, ErrorCode.fenced_leader_epoch),
])
def test_the_epoch_rule(requested: int, current: int, expected: ErrorCode | None) -> None:
    assert _epoch_error(requested, current) == expected


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("epochs")) as b:
        create_topic("confluent", b.bootstrap, "t", 1)
        produce("confluent", b.bootstrap, "t", [Rec(0, None, b"v%d" % i) for i in range(5)])
        yield b


def _leader_epoch(wc: WireClient) -> int:
    (p,) = wc.request(3, 12, {"topics": [{"name": "t", "topic_id": None}],
                              "allow_auto_topic_creation": False,
                              "include_topic_authorized_operations": False}
                      ).topics[0].partitions
    return int(p.leader_epoch)


def _fetch(wc: WireClient, epoch: int) -> Any:
    return _fetch_topic(wc, "t", epoch)


def _fetch_topic(wc: WireClient, topic: str, epoch: int) -> Any:
    resp = wc.request(1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
        "isolation_level": 0, "forgotten_topics_data": [],
        "topics": [{"topic": topic, "partitions": [{
            "partition": 0, "current_leader_epoch": epoch, "fetch_offset": 0,
            "last_fetched_epoch": -1, "log_start_offset": -1,
            "partition_max_bytes": 1 << 20}]}]})
    (p,) = resp.responses[0].partitions
    return p


def _list_latest(wc: WireClient, epoch: int) -> Any:
    resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": "t", "partitions": [
            {"partition_index": 0, "current_leader_epoch": epoch, "timestamp": -1}]}]})
    (p,) = resp.topics[0].partitions
    return p


def _list_earliest(wc: WireClient, topic: str) -> Any:
    resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [
            {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -2}]}]})
    (p,) = resp.topics[0].partitions
    return p


def _epoch_end(wc: WireClient, current: int, asked: int) -> Any:
    resp = wc.request(23, 4, {"replica_id": -1, "topics": [{"topic": "t", "partitions": [
        {"partition": 0, "current_leader_epoch": current, "leader_epoch": asked}]}]})
    (p,) = resp.topics[0].partitions
    return p


def test_requests_naming_a_newer_epoch_are_unknown_and_current_ones_served(
        broker: InProcessBroker) -> None:
    with WireClient.to(broker.bootstrap) as wc:
        epoch = _leader_epoch(wc)
        assert epoch >= 0
        for served in (-1, epoch):
            f = _fetch(wc, served)
            assert f.error_code == ErrorCode.none and f.high_watermark == 5
            assert _list_latest(wc, served).offset == 5
            end = _epoch_end(wc, served, epoch)
            assert end.error_code == ErrorCode.none and end.end_offset == 5
        newer = epoch + 1
        assert _fetch(wc, newer).error_code == ErrorCode.unknown_leader_epoch
        assert _list_latest(wc, newer).error_code == ErrorCode.unknown_leader_epoch
        assert _epoch_end(wc, newer, epoch).error_code == ErrorCode.unknown_leader_epoch


def _delete_records(wc: WireClient, topic: str, offset: int) -> Any:
    resp = wc.request(21, 2, {"timeout_ms": 10_000, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "offset": offset}]}]})
    (p,) = resp.topics[0].partitions
    return p


def test_a_replica_that_does_not_lead_checks_the_epoch_first_and_deletes_nothing(
        broker: InProcessBroker) -> None:
    """As a follower (the partition's ``leading`` flag cleared on the broker's loop, what a
    LeaderAndIsr making it a follower does): a newer epoch is UNKNOWN_LEADER_EPOCH before
    leadership is looked at (Kafka's Partition.getLocalLog order: the client retries at
    once), the current one NOT_LEADER_OR_FOLLOWER; DeleteRecords is the leader's only
    (twin of tests/cluster/test_admin_cluster.py's follower tests)."""
    from headrace.broker.replica_manager import TopicPartition
    from headrace.broker.server import Broker

    create_topic("confluent", broker.bootstrap, "f", 1)
    produce("confluent", broker.bootstrap, "f", [Rec(0, None, b"v%d" % i) for i in range(5)])
    tp = TopicPartition("f", 0)

    def set_leading(on: bool) -> Any:
        def flip(b: Broker) -> None:
            b.replicas.partitions[tp].leading = on
        return flip

    with WireClient.to(broker.bootstrap) as wc:
        epoch = _leader_epoch(wc)
        broker.call(set_leading(False))
        try:
            assert _fetch_topic(wc, "f", epoch + 1).error_code == ErrorCode.unknown_leader_epoch
            assert _fetch_topic(wc, "f", epoch).error_code == ErrorCode.not_leader_or_follower
            assert _delete_records(wc, "f", 3).error_code == ErrorCode.not_leader_or_follower
        finally:
            broker.call(set_leading(True))
        assert _fetch_topic(wc, "f", epoch).error_code == ErrorCode.none
        assert _list_earliest(wc, "f").offset == 0  # the follower moved nothing
        assert _delete_records(wc, "f", 3).error_code == ErrorCode.none  # the leader does
        assert _list_earliest(wc, "f").offset == 3


def _consumer_fetch(wc: WireClient, topic: str, offset: int, last_fetched_epoch: int) -> Any:
    resp = wc.request(1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
        "isolation_level": 0, "forgotten_topics_data": [],
        "topics": [{"topic": topic, "partitions": [{
            "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
            "last_fetched_epoch": last_fetched_epoch, "log_start_offset": -1,
            "partition_max_bytes": 1 << 20}]}]})
    (p,) = resp.responses[0].partitions
    return p


def test_a_consumer_whose_last_epoch_ended_before_its_position_gets_the_diverging_epoch(
        broker: InProcessBroker) -> None:
    """R-REP-7 / KIP-320 (Kafka's Partition.readRecords, for every fetch): a consumer read
    records of epoch E that this leader does not have (an unclean election cut them off;
    here E ends at 5 and E+1 starts there). Fetching at 7 with last fetched epoch E, it gets
    the diverging epoch (E, 5) and no records, so it truncates to 5 instead of seeing
    OFFSET_OUT_OF_RANGE and resetting (kafka-python then re-read from the earliest offset:
    the CI failure of test_kafka_python_detects_truncation_after_an_unclean_election). A
    consistent position, or one at the latest epoch, or none (-1), is read as before."""
    import dataclasses

    from headrace.broker.replica_manager import TopicPartition
    from headrace.broker.server import Broker

    create_topic("confluent", broker.bootstrap, "div", 1)
    produce("confluent", broker.bootstrap, "div", [Rec(0, None, b"e-%d" % i) for i in range(5)])
    tp = TopicPartition("div", 0)
    with WireClient.to(broker.bootstrap) as wc:
        epoch = _leader_epoch(wc)

        def bump(b: Broker) -> None:  # a new leader epoch, as an election makes
            part = b.replicas.partitions[tp]
            part.state = dataclasses.replace(part.state, leader_epoch=epoch + 1)
        broker.call(bump)
        produce("confluent", broker.bootstrap, "div",
                [Rec(0, None, b"n-%d" % i) for i in range(3)])
        diverged = _consumer_fetch(wc, "div", 7, epoch)
        assert diverged.error_code == ErrorCode.none
        assert (diverged.diverging_epoch.epoch, diverged.diverging_epoch.end_offset) == (epoch, 5)
        assert not diverged.records
        for offset, last in ((5, epoch), (7, epoch + 1), (7, -1), (3, epoch)):
            p = _consumer_fetch(wc, "div", offset, last)
            assert p.error_code == ErrorCode.none and p.records, (offset, last)
            assert p.diverging_epoch.epoch == -1
