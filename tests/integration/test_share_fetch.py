"""ShareFetch (78) and ShareAcknowledge (79) over the wire against an in-process broker
(KIP-932; Kafka's KafkaApis.handleShareFetchRequest / handleShareAcknowledgeRequest,
SharePartitionManager, DelayedShareFetch).

The share-partitions' state goes through ``broker.share_persister`` to the share
coordinator (``__share_group_state``). Here the state is initialized through the persister
directly, as the group coordinator does before it assigns a partition; real
``ShareConsumer``s are in test_share_consumers.py.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from headrace.broker.share_persister import (
    InitializeEntry,
    ReadStateResult,
    Results,
    StateKey,
)
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

ACCEPT, RELEASE, REJECT = 1, 2, 3
LOCK_MS = 1500


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("share"), {
            "group.share.record.lock.duration.ms": str(LOCK_MS),
            "group.share.min.record.lock.duration.ms": "1000"}) as b:
        yield b


def read_state(broker: InProcessBroker, key: StateKey) -> ReadStateResult:
    async def read(b: Any) -> dict[StateKey, ReadStateResult]:
        return await b.share_persister.read_state([key], -1)
    return broker.acall(read)[key]


def member_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def make_topic(broker: InProcessBroker, name: str, records: int) -> uuid.UUID:
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(records):
        p.produce(name, f"v{i}".encode(), partition=0)
        p.flush(10)  # one batch per record: acquisition works on batch boundaries
    topic = broker.call(lambda b: b.metadata.topic(name))
    assert topic is not None
    return topic.topic_id


def initialize(broker: InProcessBroker, group: str, topic_id: uuid.UUID,
               start_offset: int = 0) -> None:
    async def init(b: Any) -> Results:
        return await b.share_persister.initialize_state(
            [InitializeEntry(StateKey(group, topic_id, 0), 0, start_offset)])
    result = broker.acall(init)
    assert not result.errors


def fetch(wc: WireClient, group: str, member: str, epoch: int, topic_id: uuid.UUID | None,
          *, acks: list[tuple[int, int, list[int]]] | None = None, max_wait_ms: int = 0,
          max_records: int = 500, forget: bool = False) -> Any:
    topics = []
    if topic_id is not None and not forget:
        topics = [{"topic_id": topic_id, "partitions": [{
            "partition_index": 0,
            "acknowledgement_batches": [
                {"first_offset": f, "last_offset": la, "acknowledge_types": t}
                for f, la, t in (acks or [])]}]}]
    return wc.request(78, 1, {
        "group_id": group, "member_id": member, "share_session_epoch": epoch,
        "max_wait": max_wait_ms, "min_bytes": 1, "max_bytes": 1 << 20,
        "max_records": max_records, "batch_size": 500, "topics": topics,
        "forgotten_topics_data": ([{"topic_id": topic_id, "partitions": [0]}]
                                  if forget else [])})


def acknowledge(wc: WireClient, group: str, member: str, epoch: int, topic_id: uuid.UUID,
                acks: list[tuple[int, int, list[int]]]) -> Any:
    return wc.request(79, 1, {
        "group_id": group, "member_id": member, "share_session_epoch": epoch,
        "topics": [{"topic_id": topic_id, "partitions": [{
            "partition_index": 0, "acknowledgement_batches": [
                {"first_offset": f, "last_offset": la, "acknowledge_types": t}
                for f, la, t in acks]}]}]})


def acquired(resp: Any) -> list[tuple[int, int, int]]:
    assert resp.error_code == ErrorCode.none, resp
    return [(a.first_offset, a.last_offset, a.delivery_count)
            for t in resp.responses for p in t.partitions for a in p.acquired_records]


def partition(resp: Any) -> Any:
    (t,) = resp.responses
    (p,) = t.partitions
    return p


def test_two_members_share_a_partition_and_acknowledgements_move_it_on(
        broker: InProcessBroker, topic_name: str) -> None:
    """KIP-932: records go to one member at a time; RELEASE hands them to another with a
    higher delivery count; ACCEPT is final."""
    tid = make_topic(broker, topic_name, 6)
    initialize(broker, "g1", tid)
    a, b = member_id(), member_id()
    with WireClient.to(broker.bootstrap) as wa, WireClient.to(broker.bootstrap) as wb:
        r = fetch(wa, "g1", a, 0, tid)
        assert acquired(r) == [(0, 5, 1)]
        assert r.acquisition_lock_timeout.total_seconds() * 1000 == LOCK_MS
        assert partition(r).records  # the batches come with the acquired ranges
        assert acquired(fetch(wb, "g1", b, 0, tid)) == []  # all held by a
        r = acknowledge(wa, "g1", a, 1, tid, [(0, 2, [ACCEPT]), (3, 5, [RELEASE])])
        assert r.error_code == 0 and partition(r).error_code == ErrorCode.none
        assert acquired(fetch(wb, "g1", b, 1, tid)) == [(3, 5, 2)]
        r = fetch(wb, "g1", b, 2, tid, acks=[(3, 5, [ACCEPT])])
        assert partition(r).acknowledge_error_code == ErrorCode.none
    snap = broker.call(lambda b: b.metrics.snapshot())  # Kafka's share metrics
    assert snap.share_fetches[topic_name] == 4 and snap.share_acks[topic_name] == 2
    assert snap.record_acks["accept"] >= 6 and snap.record_acks["release"] >= 3
    assert snap.bytes_out[topic_name] > 0
    # the share coordinator holds it: everything done, the start offset past the last
    state = read_state(broker, StateKey("g1", tid, 0))
    assert state.error == ErrorCode.none and state.start_offset == 6


def test_per_offset_types_reject_and_records_of_another_member(
        broker: InProcessBroker, topic_name: str) -> None:
    tid = make_topic(broker, topic_name, 3)
    initialize(broker, "g2", tid)
    a, b = member_id(), member_id()
    with WireClient.to(broker.bootstrap) as wa, WireClient.to(broker.bootstrap) as wb:
        assert acquired(fetch(wa, "g2", a, 0, tid)) == [(0, 2, 1)]
        fetch(wb, "g2", b, 0, tid)
        # b acknowledging a's records: INVALID_RECORD_STATE, nothing changes
        r = acknowledge(wb, "g2", b, 1, tid, [(0, 0, [ACCEPT])])
        assert partition(r).error_code == ErrorCode.invalid_record_state
        # a malformed batch (two types for three offsets): INVALID_REQUEST
        r = acknowledge(wa, "g2", a, 1, tid, [(0, 2, [ACCEPT, REJECT])])
        assert partition(r).error_code == ErrorCode.invalid_request
        r = acknowledge(wa, "g2", a, 2, tid, [(0, 2, [ACCEPT, REJECT, RELEASE])])
        assert partition(r).error_code == ErrorCode.none
        # only offset 2 comes back (0 accepted, 1 rejected: archived)
        assert acquired(fetch(wb, "g2", b, 2, tid)) == [(2, 2, 2)]


def test_share_session_rules(broker: InProcessBroker, topic_name: str) -> None:
    tid = make_topic(broker, topic_name, 1)
    initialize(broker, "g3", tid)
    a = member_id()
    with WireClient.to(broker.bootstrap) as wc:
        assert fetch(wc, "g3", a, 3, tid).error_code == ErrorCode.share_session_not_found
        assert fetch(wc, "g3", "not-a-uuid", 0, tid).error_code == ErrorCode.invalid_request
        r = fetch(wc, "g3", a, 0, tid, acks=[(0, 0, [ACCEPT])])
        assert r.error_code == ErrorCode.invalid_request  # acknowledgements when opening
        assert acquired(fetch(wc, "g3", a, 0, tid)) == [(0, 0, 1)]
        assert fetch(wc, "g3", a, 5, tid).error_code == ErrorCode.invalid_share_session_epoch
        r = acknowledge(wc, "g3", a, 0, tid, [(0, 0, [ACCEPT])])
        assert r.error_code == ErrorCode.invalid_share_session_epoch  # never opens one
        # a subsequent fetch with nothing new omits the partition
        r = fetch(wc, "g3", a, 1, None)
        assert r.error_code == ErrorCode.none and r.responses == ()
        # closing the session releases what the member holds
        r = fetch(wc, "g3", a, -1, None)
        assert r.error_code == ErrorCode.none
        assert fetch(wc, "g3", a, 2, tid).error_code == ErrorCode.share_session_not_found
        # released, not delivered: the delivery count stays 1 on the next acquisition
        assert acquired(fetch(wc, "g3", member_id(), 0, tid)) == [(0, 0, 1)]


def test_an_unknown_topic_and_an_unauthorized_group(broker: InProcessBroker) -> None:
    with WireClient.to(broker.bootstrap) as wc:
        r = fetch(wc, "g4", member_id(), 0, uuid.uuid4())
        assert r.error_code == ErrorCode.none
        assert partition(r).error_code == ErrorCode.unknown_topic_id


def test_a_closed_connection_releases_the_members_records(
        broker: InProcessBroker, topic_name: str) -> None:
    """Kafka 4.1's ConnectionDisconnectListener: the session opened on a connection goes
    with it, and the records its member held are available at once (not after the lock)."""
    tid = make_topic(broker, topic_name, 2)
    initialize(broker, "g5", tid)
    with WireClient.to(broker.bootstrap) as wa:
        assert acquired(fetch(wa, "g5", member_id(), 0, tid)) == [(0, 1, 1)]
    with WireClient.to(broker.bootstrap) as wb:
        b = member_id()
        deadline = time.monotonic() + LOCK_MS / 1000 / 2
        got: list[tuple[int, int, int]] = []
        epoch = 0
        while not got and time.monotonic() < deadline:
            got = acquired(fetch(wb, "g5", b, epoch, tid, max_wait_ms=100))
            epoch += 1
        assert got == [(0, 1, 1)]


def test_a_lock_times_out_and_the_records_go_to_another_member(
        broker: InProcessBroker, topic_name: str) -> None:
    tid = make_topic(broker, topic_name, 2)
    initialize(broker, "g6", tid)
    with WireClient.to(broker.bootstrap) as wa, WireClient.to(broker.bootstrap) as wb:
        assert acquired(fetch(wa, "g6", member_id(), 0, tid)) == [(0, 1, 1)]
        start = time.monotonic()
        r = fetch(wb, "g6", member_id(), 0, tid, max_wait_ms=LOCK_MS * 3)
        waited = time.monotonic() - start
        assert acquired(r) == [(0, 1, 2)]  # a timed-out lock counts as a delivery
        assert LOCK_MS / 1000 * 0.8 <= waited < LOCK_MS / 1000 * 3


def test_a_parked_fetch_wakes_when_records_arrive(
        broker: InProcessBroker, topic_name: str) -> None:
    tid = make_topic(broker, topic_name, 1)
    initialize(broker, "g7", tid, start_offset=1)
    with WireClient.to(broker.bootstrap) as wc:
        a = member_id()
        assert acquired(fetch(wc, "g7", a, 0, tid)) == []
        import threading

        def later() -> None:
            p = Producer({"bootstrap.servers": broker.bootstrap})
            p.produce(topic_name, b"late", partition=0)
            p.flush(10)
        t = threading.Timer(0.3, later)
        t.start()
        start = time.monotonic()
        r = fetch(wc, "g7", a, 1, None, max_wait_ms=10_000)
        t.join()
        assert acquired(r) == [(1, 1, 1)]
        assert time.monotonic() - start < 5


def test_state_survives_a_restart(broker: InProcessBroker, topic_name: str) -> None:
    """What was acknowledged is never delivered again after the leader restarts; what was
    acquired and not acknowledged is delivered again."""
    tid = make_topic(broker, topic_name, 4)
    initialize(broker, "g8", tid)
    with WireClient.to(broker.bootstrap) as wc:
        a = member_id()
        assert acquired(fetch(wc, "g8", a, 0, tid)) == [(0, 3, 1)]
        r = acknowledge(wc, "g8", a, 1, tid, [(0, 1, [ACCEPT])])
        assert partition(r).error_code == ErrorCode.none
    broker.restart()
    with WireClient.to(broker.bootstrap) as wc:
        got = acquired(fetch(wc, "g8", member_id(), 0, tid))
        assert [(f, la) for f, la, _ in got] == [(2, 3)]


def test_read_committed_acquires_neither_aborted_records_nor_markers(
        broker: InProcessBroker, topic_name: str) -> None:
    """share.isolation.level=read_committed (a group config): the batches of an aborted
    transaction are archived when fetched, not acquired; transaction markers never are."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    for f in admin.incremental_alter_configs([ConfigResource(
            ResourceType.GROUP, "g-rc", incremental_configs=[ConfigEntry(
                "share.isolation.level", "read_committed",
                incremental_operation=AlterConfigOpType.SET)])]).values():
        f.result(10)
    tx = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "sf-rc"})
    tx.init_transactions(10)
    tx.begin_transaction()
    for i in range(3):
        tx.produce(topic_name, f"a{i}".encode(), partition=0)
    tx.flush(10)  # written: librdkafka drops what is unsent at an abort
    tx.abort_transaction(10)  # offsets 0-2, the abort marker at 3
    tx.begin_transaction()
    for i in range(3):
        tx.produce(topic_name, f"c{i}".encode(), partition=0)
    tx.commit_transaction(10)  # offsets 4-6, the commit marker at 7
    tid = broker.call(lambda b: b.metadata.topic(topic_name)).topic_id
    initialize(broker, "g-rc", tid)
    with WireClient.to(broker.bootstrap) as wc:
        assert acquired(fetch(wc, "g-rc", member_id(), 0, tid)) == [(4, 6, 1)]


def test_v2_record_limit_mode_and_an_unknown_mode(broker: InProcessBroker,
                                                  topic_name: str) -> None:
    """ShareFetch v2 (Kafka 4.2, KIP-1206): share_acquire_mode 1 (record_limit) acquires
    exactly max_records, inside a log batch; 0 takes the whole batch; others are refused."""
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(5):
        p.produce(topic_name, f"v{i}".encode(), partition=0)
    p.flush(10)  # one log batch of 5
    topic = broker.call(lambda b: b.metadata.topic(topic_name))
    tid = topic.topic_id
    initialize(broker, "g-v2", tid)

    def v2(wc: WireClient, member: str, mode: int) -> Any:
        return wc.request(78, 2, {
            "group_id": "g-v2", "member_id": member, "share_session_epoch": 0,
            "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 2,
            "batch_size": 500, "share_acquire_mode": mode, "is_renew_ack": False,
            "topics": [{"topic_id": tid, "partitions": [
                {"partition_index": 0, "acknowledgement_batches": []}]}],
            "forgotten_topics_data": []})

    with WireClient.to(broker.bootstrap) as wc:
        assert v2(wc, member_id(), 7).error_code == ErrorCode.invalid_request
        assert acquired(v2(wc, member_id(), 1)) == [(0, 1, 1)]
        assert acquired(v2(wc, member_id(), 1)) == [(2, 3, 1)]
        assert acquired(v2(wc, member_id(), 0)) == [(4, 4, 1)]
