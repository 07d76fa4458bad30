"""The share coordinator over the wire (KIP-932): InitializeShareGroupState (83),
ReadShareGroupState (84), WriteShareGroupState (85), DeleteShareGroupState (86),
ReadShareGroupStateSummary (87) and FindCoordinator key type 2, as Kafka's
ShareCoordinatorService answers them; the persister's remote path; state kept in
``__share_group_state`` across a restart."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from headrace.broker.share_coordinator import STATE_TOPIC
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("sharecoord")) as b:
        yield b


def topic(broker: InProcessBroker, name: str) -> uuid.UUID:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # alive until answered
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(10)
    t = broker.call(lambda b: b.metadata.topic(name))
    assert t is not None
    return t.topic_id


def part(resp: Any) -> Any:
    (t,) = resp.results
    (p,) = t.partitions
    return p


def init(wc: WireClient, group: str, tid: uuid.UUID, p: int = 0, state_epoch: int = 0,
         start: int = -1) -> Any:
    return wc.request(83, 0, {"group_id": group, "topics": [{"topic_id": tid, "partitions": [
        {"partition": p, "state_epoch": state_epoch, "start_offset": start}]}]})


def read(wc: WireClient, group: str, tid: uuid.UUID, p: int = 0, leader_epoch: int = 0) -> Any:
    return wc.request(84, 0, {"group_id": group, "topics": [{"topic_id": tid, "partitions": [
        {"partition": p, "leader_epoch": leader_epoch}]}]})


def write(wc: WireClient, group: str, tid: uuid.UUID, *, start: int, batches: list[Any],
          state_epoch: int = 0, leader_epoch: int = 0, p: int = 0) -> Any:
    return wc.request(85, 1, {"group_id": group, "topics": [{"topic_id": tid, "partitions": [
        {"partition": p, "state_epoch": state_epoch, "leader_epoch": leader_epoch,
         "start_offset": start, "delivery_complete_count": 0,
         "state_batches": [{"first_offset": f, "last_offset": la, "delivery_state": s,
                            "delivery_count": c} for f, la, s, c in batches]}]}]})


def test_initialize_write_read_summary_delete(broker: InProcessBroker, topic_name: str) -> None:
    tid = topic(broker, topic_name)
    with WireClient.to(broker.bootstrap) as wc:
        r = read(wc, "g", tid)  # never initialized: Kafka refuses the read
        assert part(r).error_code == ErrorCode.invalid_request
        assert part(init(wc, "g", tid, start=5)).error_code == ErrorCode.none
        assert broker.call(lambda b: b.metadata.topic(STATE_TOPIC)) is not None
        p = part(read(wc, "g", tid))
        assert (p.error_code, p.state_epoch, p.start_offset, p.state_batches) == \
            (ErrorCode.none, 0, 5, ())
        r = write(wc, "g", tid, start=5, batches=[(5, 7, 2, 1), (8, 8, 0, 2)])
        assert part(r).error_code == ErrorCode.none
        p = part(read(wc, "g", tid, leader_epoch=1))
        assert [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                for b in p.state_batches] == [(5, 7, 2, 1), (8, 8, 0, 2)]
        # a writer at an older leader epoch than the last reader's is fenced
        r = write(wc, "g", tid, start=6, batches=[], leader_epoch=0)
        assert part(r).error_code == ErrorCode.fenced_leader_epoch
        s = wc.request(87, 1, {"group_id": "g", "topics": [{"topic_id": tid, "partitions": [
            {"partition": 0, "leader_epoch": 1}]}]})
        assert part(s).error_code == ErrorCode.none and part(s).start_offset == 5
        d = wc.request(86, 0, {"group_id": "g", "topics": [{"topic_id": tid, "partitions": [
            {"partition": 0}]}]})
        assert part(d).error_code == ErrorCode.none
        assert part(read(wc, "g", tid, leader_epoch=1)).error_code == ErrorCode.invalid_request
        # an unknown topic
        assert part(init(wc, "g", uuid.uuid4())).error_code == \
            ErrorCode.unknown_topic_or_partition


def test_state_survives_a_restart(broker: InProcessBroker, topic_name: str) -> None:
    tid = topic(broker, topic_name)
    with WireClient.to(broker.bootstrap) as wc:
        assert part(init(wc, "g2", tid, p=1, start=0)).error_code == ErrorCode.none
        assert part(write(wc, "g2", tid, p=1, start=3, batches=[(3, 4, 4, 5)])).error_code == 0
    broker.restart()
    with WireClient.to(broker.bootstrap) as wc:
        p = part(read(wc, "g2", tid, p=1))
        assert p.start_offset == 3
        assert [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                for b in p.state_batches] == [(3, 4, 4, 5)]


def test_find_coordinator_for_a_share_key(broker: InProcessBroker, topic_name: str) -> None:
    tid = topic(broker, topic_name)
    key = "g:" + base64.urlsafe_b64encode(tid.bytes).decode().rstrip("=") + ":0"
    with WireClient.to(broker.bootstrap) as wc:
        r = wc.request(10, 6, {"key_type": 2, "coordinator_keys": [key, "nonsense"]})
        good, bad = r.coordinators
        assert good.error_code == ErrorCode.none and good.node_id == 0
        assert bad.error_code == ErrorCode.invalid_request


def test_the_persisters_remote_path(broker: InProcessBroker, topic_name: str) -> None:
    """What a persister on another broker sends: the same requests over the inter-broker
    connection (here to this broker's own listener)."""
    tid = topic(broker, topic_name)

    async def remote(b: Any) -> Any:
        body = {"group_id": "g3", "topics": [{"topic_id": tid, "partitions": [
            {"partition": 0, "state_epoch": 2, "start_offset": 9}]}]}
        await b.share_persister._remote(b.node_id, 83, 0, body)
        return await b.share_persister._remote(b.node_id, 84, 0, {
            "group_id": "g3", "topics": [{"topic_id": tid, "partitions": [
                {"partition": 0, "leader_epoch": 0}]}]})
    r = broker.acall(remote)
    assert part(r).error_code == ErrorCode.none
    assert (part(r).state_epoch, part(r).start_offset) == (2, 9)
