"""The share coordinator over the wire (KIP-932): InitializeShareGroupState (83),
ReadShareGroupState (84), WriteShareGroupState (85), DeleteShareGroupState (86),
ReadShareGroupStateSummary (87) and FindCoordinator key type 2, as Kafka's
``ShareCoordinatorService`` / ``ShareCoordinatorShard`` / ``KafkaApis`` answer them (errors
included); loading (COORDINATOR_LOAD_IN_PROGRESS) and resignation (NOT_COORDINATOR); the
persister's local path, its remote path (over a connection to the broker's own listener)
and its retries (``PersisterStateManager``); state kept in ``__share_group_state`` across a
restart; CLUSTER_ACTION on all of it."""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic, ResourceType
from kio.schema.errors import ErrorCode

from headrace.broker.replica_manager import TopicPartition
from headrace.broker.share_coordinator import STATE_TOPIC, CoordinatorPersister
from headrace.broker.share_persister import InitializeEntry, StateKey, WriteEntry
from headrace.share.partition import PersisterStateBatch, ShareStateWrite
from headrace.share.state import (
    NEGATIVE_PARTITION_ID,
    READ_UNINITIALIZED_SHARE_PARTITION,
    WRITE_UNINITIALIZED_SHARE_PARTITION,
    coordinator_key,
    partition_for,
)
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient
from tests.security_helpers import ACL_AUTHORIZER, acl, listener_ports, plain_jaas, sasl_conf

pytestmark = pytest.mark.timeout(120)

NOT_COORDINATOR_MSG = "This is not the correct coordinator."
LOADING_MSG = "The coordinator is loading and hence can't process requests."


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("sharecoord")) as b:
        yield b
        # hostile and failing requests above: answered or refused, never a traceback
        assert not [line for line in b.stderr_lines if "Traceback" in line]


def topic(broker: InProcessBroker, name: str, partitions: int = 2) -> uuid.UUID:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # alive until answered
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)
    t = broker.call(lambda b: b.metadata.topic(name))
    assert t is not None
    return t.topic_id


def part(resp: Any) -> Any:
    (t,) = resp.results
    (p,) = t.partitions
    return p


def one(group: str, tid: uuid.UUID | None, **fields: Any) -> dict[str, Any]:
    return {"group_id": group, "topics": [{"topic_id": tid, "partitions": [fields]}]}


def init(wc: WireClient, group: str, tid: uuid.UUID | None, p: int = 0, state_epoch: int = 0,
         start: int = -1) -> Any:
    return wc.request(83, 0, one(group, tid, partition=p, state_epoch=state_epoch,
                                 start_offset=start))


def read(wc: WireClient, group: str, tid: uuid.UUID | None, p: int = 0,
         leader_epoch: int = 0) -> Any:
    return wc.request(84, 0, one(group, tid, partition=p, leader_epoch=leader_epoch))


def write(wc: WireClient, group: str, tid: uuid.UUID, *, start: int, batches: list[Any],
          state_epoch: int = 0, leader_epoch: int = 0, p: int = 0, version: int = 1,
          dcc: int = 0) -> Any:
    fields: dict[str, Any] = {
        "partition": p, "state_epoch": state_epoch, "leader_epoch": leader_epoch,
        "start_offset": start,
        "state_batches": [{"first_offset": f, "last_offset": la, "delivery_state": s,
                           "delivery_count": c} for f, la, s, c in batches]}
    if version >= 1:
        fields["delivery_complete_count"] = dcc
    return wc.request(85, version, one(group, tid, **fields))


def summary(wc: WireClient, group: str, tid: uuid.UUID, p: int = 0, version: int = 1,
            leader_epoch: int = 0) -> Any:
    return wc.request(87, version, one(group, tid, partition=p, leader_epoch=leader_epoch))


def delete(wc: WireClient, group: str, tid: uuid.UUID, p: int = 0) -> Any:
    return wc.request(86, 0, one(group, tid, partition=p))


def batches_of(p: Any) -> list[tuple[int, int, int, int]]:
    return [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
            for b in p.state_batches]


def index_of(group: str, tid: uuid.UUID, p: int) -> int:
    return partition_for(group, tid, p, 50)


# -- the APIs -----------------------------------------------------------------------------


def test_initialize_write_read_summary_delete(broker: InProcessBroker, topic_name: str) -> None:
    tid = topic(broker, topic_name)
    with WireClient.to(broker.bootstrap) as wc:
        r = part(read(wc, "g", tid))  # never initialized: Kafka refuses the read
        assert (r.error_code, r.error_message) == (ErrorCode.invalid_request,
                                                   READ_UNINITIALIZED_SHARE_PARTITION)
        r = part(write(wc, "g", tid, start=0, batches=[]))
        assert (r.error_code, r.error_message) == (ErrorCode.invalid_request,
                                                   WRITE_UNINITIALIZED_SHARE_PARTITION)
        assert part(init(wc, "g", tid, start=5)).error_code == ErrorCode.none
        assert broker.call(lambda b: b.metadata.topic(STATE_TOPIC)) is not None
        p = part(read(wc, "g", tid))
        assert (p.error_code, p.state_epoch, p.start_offset, p.state_batches) == \
            (ErrorCode.none, 0, 5, ())
        r = write(wc, "g", tid, start=5, batches=[(5, 7, 2, 1), (8, 8, 0, 2)], dcc=3)
        assert part(r).error_code == ErrorCode.none
        # v0 too (no delivery-complete count): merged over the earlier batches
        r = write(wc, "g", tid, start=6, batches=[(8, 8, 2, 2)], version=0)
        assert part(r).error_code == ErrorCode.none
        p = part(read(wc, "g", tid, leader_epoch=1))
        assert batches_of(p) == [(6, 7, 2, 1), (8, 8, 2, 2)] and p.start_offset == 6
        # a writer at an older leader epoch than the last reader's is fenced
        r = write(wc, "g", tid, start=6, batches=[], leader_epoch=0)
        assert part(r).error_code == ErrorCode.fenced_leader_epoch
        s = part(summary(wc, "g", tid, leader_epoch=1))
        assert (s.error_code, s.start_offset, s.state_epoch, s.leader_epoch,
                s.delivery_complete_count) == (ErrorCode.none, 6, 0, 1, 3)
        s0 = part(summary(wc, "g", tid, version=0))
        assert (s0.error_code, s0.start_offset, s0.leader_epoch) == (ErrorCode.none, 6, 1)
        assert part(delete(wc, "g", tid)).error_code == ErrorCode.none
        assert part(read(wc, "g", tid, leader_epoch=1)).error_code == ErrorCode.invalid_request
        # deleting what is not there succeeds, as Kafka's deleteState
        assert part(delete(wc, "g", tid)).error_code == ErrorCode.none
        # and the key starts again from a fresh initialize
        assert part(init(wc, "g", tid, start=40)).error_code == ErrorCode.none
        assert part(read(wc, "g", tid, leader_epoch=2)).start_offset == 40


def test_errors_as_kafka_answers_them(broker: InProcessBroker, topic_name: str) -> None:
    tid = topic(broker, topic_name)
    with WireClient.to(broker.bootstrap) as wc:
        # a topic the metadata does not know, a partition beyond its count
        assert part(init(wc, "g", uuid.uuid4())).error_code == \
            ErrorCode.unknown_topic_or_partition
        assert part(init(wc, "g", tid, p=2)).error_code == ErrorCode.unknown_topic_or_partition
        # a negative partition: the shard's message
        r = part(init(wc, "g", tid, p=-1))
        assert (r.error_code, r.error_message) == (ErrorCode.invalid_request,
                                                   NEGATIVE_PARTITION_ID)
        # a zero topic id is Kafka's Uuid.ZERO_UUID, a topic nobody knows, and is echoed
        resp = init(wc, "g", None)
        assert resp.results[0].topic_id is None
        assert part(resp).error_code == ErrorCode.unknown_topic_or_partition
        # state epochs: an initialize or a write below the recorded one is fenced
        assert part(init(wc, "ge", tid, state_epoch=3, start=0)).error_code == ErrorCode.none
        assert part(init(wc, "ge", tid, state_epoch=2, start=0)).error_code == \
            ErrorCode.fenced_state_epoch
        r = write(wc, "ge", tid, start=1, batches=[], state_epoch=2)
        assert part(r).error_code == ErrorCode.fenced_state_epoch
        assert part(write(wc, "ge", tid, start=1, batches=[], state_epoch=-1)).error_code == 0
        # leader epochs: a read records its epoch; an older reader is fenced
        assert part(read(wc, "ge", tid, leader_epoch=7)).error_code == ErrorCode.none
        assert part(read(wc, "ge", tid, leader_epoch=6)).error_code == \
            ErrorCode.fenced_leader_epoch
        assert part(read(wc, "ge", tid, leader_epoch=-1)).error_code == ErrorCode.none
        # a fenced write changed nothing
        assert part(read(wc, "ge", tid, leader_epoch=7)).start_offset == 1


def test_a_write_of_inverted_batches_is_refused(broker: InProcessBroker,
                                                topic_name: str) -> None:
    """headrace's own rule (Kafka checks nothing here): a state batch must be a range
    0 <= first <= last; these once sent the batch merge round a cycle for ever."""
    tid = topic(broker, topic_name)
    with WireClient.to(broker.bootstrap) as wc:
        assert part(init(wc, "inv", tid, start=0)).error_code == ErrorCode.none
        assert part(write(wc, "inv", tid, start=-1, batches=[(-5, -1, 2, 1)])).error_code \
            == ErrorCode.invalid_request
        r = part(write(wc, "inv", tid, start=-1, batches=[(10, 5, 2, 1)]))
        assert (r.error_code, r.error_message) == (
            ErrorCode.invalid_request,
            "Invalid state batch [10, 5]: offsets must be 0 <= first <= last.")
        # the cycle: a batch over everything, then an inverted one inside it
        assert part(write(wc, "inv", tid, start=-1, batches=[
            (0, 2**63 - 1, 0, 0), (10, 5, 2, 1)])).error_code == ErrorCode.invalid_request
        # the refused writes changed nothing; a valid one still goes through
        r = part(write(wc, "inv", tid, start=0, batches=[(0, 2**63 - 1, 0, 0), (5, 9, 2, 1)]))
        assert r.error_code == ErrorCode.none
        assert batches_of(part(read(wc, "inv", tid))) == [
            (0, 4, 0, 0), (5, 9, 2, 1), (10, 2**63 - 1, 0, 0)]


def test_a_write_too_large_for_the_log_is_refused(broker: InProcessBroker,
                                                  topic_name: str) -> None:
    """A write whose record exceeds the state topic's max.message.bytes: Kafka's
    handleOperationException makes MESSAGE_TOO_LARGE an UNKNOWN_SERVER_ERROR; the state is
    unchanged, and the broker logs a warning, not an error."""
    tid = topic(broker, topic_name)
    with WireClient.to(broker.bootstrap) as wc:
        assert part(init(wc, "big", tid, start=0)).error_code == ErrorCode.none
        r = part(write(wc, "big", tid, start=0,
                       batches=[(2 * i, 2 * i, 2, 1) for i in range(60_000)]))
        assert r.error_code == ErrorCode.unknown_server_error
        assert r.error_message.startswith("Unable to write share group state: ")
        p = part(read(wc, "big", tid))
        assert (p.error_code, p.start_offset, p.state_batches) == (ErrorCode.none, 0, ())
    lines = [line for line in broker.stderr_lines
             if STATE_TOPIC in line and "exceeds max.message.bytes" in line]
    assert lines and all("level=WARNING" in line for line in lines)


def test_empty_requests_are_answered_empty(broker: InProcessBroker, topic_name: str) -> None:
    tid = topic(broker, topic_name)
    with WireClient.to(broker.bootstrap) as wc:
        assert part(init(wc, "ok", tid, start=0)).error_code == ErrorCode.none
        # ShareCoordinatorService: no group id, no topics, a topic without partitions
        assert read(wc, "", tid).results == ()
        assert init(wc, "", tid).results == ()
        assert wc.request(84, 0, {"group_id": "ok", "topics": []}).results == ()
        assert wc.request(86, 0, {"group_id": "ok", "topics": []}).results == ()
        for key, version in ((84, 0), (85, 1), (86, 0), (87, 1)):
            resp = wc.request(key, version, {"group_id": "ok", "topics": [
                {"topic_id": tid, "partitions": []}]})
            assert resp.results == (), key
        # Initialize only leaves such a topic out of its answer
        resp = wc.request(83, 0, {"group_id": "ok2", "topics": [
            {"topic_id": uuid.uuid4(), "partitions": []},
            {"topic_id": tid, "partitions": [
                {"partition": 0, "state_epoch": 0, "start_offset": 0}]}]})
        assert [(t.topic_id, [p.error_code for p in t.partitions]) for t in resp.results] == \
            [(tid, [ErrorCode.none])]


def test_many_keys_in_one_request(broker: InProcessBroker, topic_name: str) -> None:
    """Keys of several coordinator partitions, a topic named twice and a partition twice:
    one result per topic and per partition, as Kafka's maps give them."""
    t1 = topic(broker, topic_name + "-1", 4)
    t2 = topic(broker, topic_name + "-2", 4)
    indexes = {index_of("many", t, p) for t in (t1, t2) for p in range(4)}
    assert len(indexes) > 1
    with WireClient.to(broker.bootstrap) as wc:
        resp = wc.request(83, 0, {"group_id": "many", "topics": [
            {"topic_id": t1, "partitions": [{"partition": p, "state_epoch": 1,
                                             "start_offset": 10 + p} for p in range(4)]},
            {"topic_id": t2, "partitions": [{"partition": p, "state_epoch": 1,
                                             "start_offset": 20 + p} for p in range(4)]},
            {"topic_id": t1, "partitions": [{"partition": 0, "state_epoch": 1,
                                             "start_offset": 30}]}]})
        assert [(t.topic_id, sorted(p.partition for p in t.partitions)) for t in resp.results] \
            == [(t1, [0, 1, 2, 3]), (t2, [0, 1, 2, 3])]
        assert all(p.error_code == 0 for t in resp.results for p in t.partitions)
        resp = wc.request(84, 0, {"group_id": "many", "topics": [
            {"topic_id": t, "partitions": [{"partition": p, "leader_epoch": 0}
                                           for p in range(4)]} for t in (t1, t2)]})
        got = {(t.topic_id, p.partition): p.start_offset
               for t in resp.results for p in t.partitions}
        # the later initialize of (t1, 0) in the same request won
        assert got == {**{(t1, p): 10 + p for p in range(4)}, (t1, 0): 30,
                       **{(t2, p): 20 + p for p in range(4)}}


def _with_version(frame: bytes, version: int) -> bytes:
    return frame[:6] + struct.pack(">h", version) + frame[8:]


@pytest.mark.parametrize("api_key,version", [(83, 1), (84, 1), (85, 2), (86, 1), (87, 2)])
def test_an_unserved_version_closes_the_connection(broker: InProcessBroker, api_key: int,
                                                   version: int) -> None:
    """These responses have no top-level error code: Kafka closes the connection."""
    with WireClient.to(broker.bootstrap) as wc:
        frame = wc.encode(api_key, 0, {"group_id": "g", "topics": []})
        wc.send_raw(_with_version(frame, version))
        assert wc.is_closed_by_peer()


def test_a_truncated_request_closes_the_connection(broker: InProcessBroker,
                                                   topic_name: str) -> None:
    tid = topic(broker, topic_name)
    with WireClient.to(broker.bootstrap) as wc:
        frame = wc.encode(85, 1, one("g", tid, partition=0, state_epoch=0, leader_epoch=0,
                                     start_offset=0, delivery_complete_count=0,
                                     state_batches=[]))
        body = frame[4:-6]  # the last fields cut off
        wc.send_raw(struct.pack(">i", len(body)) + body)
        assert wc.is_closed_by_peer()
    with WireClient.to(broker.bootstrap) as wc:  # and the broker serves on
        assert part(init(wc, "after", tid, start=0)).error_code == ErrorCode.none


# -- coordination: resignation, election, loading ---------------------------------------


def test_not_coordinator_once_resigned_and_reloaded_on_election(
        broker: InProcessBroker, topic_name: str) -> None:
    tid = topic(broker, topic_name)
    tp = TopicPartition(STATE_TOPIC, index_of("res", tid, 0))
    with WireClient.to(broker.bootstrap) as wc:
        assert part(init(wc, "res", tid, start=3)).error_code == ErrorCode.none
        assert part(write(wc, "res", tid, start=4, batches=[(4, 6, 0, 1)])).error_code == 0
        broker.call(lambda b: b.share_coordinator.partition_unloaded(tp))
        r = part(read(wc, "res", tid))
        assert (r.error_code, r.error_message) == (
            ErrorCode.not_coordinator,
            f"Unable to read share group state: {NOT_COORDINATOR_MSG}")
        r = part(write(wc, "res", tid, start=5, batches=[]))
        assert r.error_code == ErrorCode.not_coordinator
        broker.call(lambda b: b.share_coordinator.partition_led(tp))
        r = part(read(wc, "res", tid))
        assert (r.error_code, r.start_offset, batches_of(r)) == (0, 4, [(4, 6, 0, 1)])


def test_loading_answers_load_in_progress(broker: InProcessBroker, topic_name: str) -> None:
    tid = topic(broker, topic_name)
    index = index_of("ld", tid, 0)
    with WireClient.to(broker.bootstrap) as wc:
        assert part(init(wc, "ld", tid, start=0)).error_code == ErrorCode.none
        broker.call(lambda b: b.share_coordinator.loading.add(index))
        try:
            for resp in (read(wc, "ld", tid), init(wc, "ld", tid),
                         summary(wc, "ld", tid), delete(wc, "ld", tid),
                         write(wc, "ld", tid, start=0, batches=[])):
                r = part(resp)
                assert r.error_code == ErrorCode.coordinator_load_in_progress
                assert r.error_message.endswith(LOADING_MSG)
        finally:
            broker.call(lambda b: b.share_coordinator.loading.discard(index))
        assert part(read(wc, "ld", tid)).error_code == ErrorCode.none


def test_a_closed_coordinator_is_not_available(broker: InProcessBroker,
                                               topic_name: str) -> None:
    """ShareCoordinatorService once shut down: COORDINATOR_NOT_AVAILABLE for every
    partition, checked before (Initialize, Delete, Summary) or after (Read, Write) the
    empty-request rules."""
    tid = topic(broker, topic_name)
    broker.call(lambda b: setattr(b.share_coordinator, "_closed", True))
    try:
        with WireClient.to(broker.bootstrap) as wc:
            r = part(read(wc, "cl", tid))
            assert (r.error_code, r.error_message) == (
                ErrorCode.coordinator_not_available, "Share coordinator is not available.")
            assert read(wc, "", tid).results == ()  # empty first, for Read
            r = part(init(wc, "", tid))  # not active first, for Initialize
            assert r.error_code == ErrorCode.coordinator_not_available
            s = part(summary(wc, "cl", tid))
            # an error result carries the schema's defaults (Kafka's
            # toErrorResponsePartitionResult): 0, and v1's delivery-complete count -1
            assert (s.error_code, s.state_epoch, s.leader_epoch, s.start_offset,
                    s.delivery_complete_count) == (ErrorCode.coordinator_not_available,
                                                   0, 0, 0, -1)
    finally:
        broker.call(lambda b: setattr(b.share_coordinator, "_closed", False))


def test_requests_to_one_shard_are_ordered(broker: InProcessBroker, topic_name: str) -> None:
    """A request waits for the one before it on the same shard (its records committed and
    replayed) before it is computed, as Kafka's runtime orders writes: an initialize and
    a read sent together, the commit made slow."""
    tid = topic(broker, topic_name)
    key = StateKey("order", tid, 0)

    async def run(b: Any) -> Any:
        service = b.share_coordinator
        original = service._append

        async def slow(index: int, records: Any) -> Any:
            await asyncio.sleep(0.05)  # a commit that takes a while (acks from followers)
            return await original(index, records)

        service._append = slow
        try:
            return await asyncio.gather(
                b.share_persister.initialize_state([InitializeEntry(key, 0, 17)]),
                b.share_persister.read_state([key], 0))
        finally:
            del service._append

    initialized, got = broker.acall(run)
    assert initialized.errors == {}
    assert (got[key].error, got[key].start_offset) == (ErrorCode.none, 17)


def test_a_failed_commit_rebuilds_the_shard_from_the_log(broker: InProcessBroker,
                                                       topic_name: str) -> None:
    """A batch appended whose commit was not seen (a timeout) answers
    COORDINATOR_NOT_AVAILABLE; the shard is rebuilt from the log, so that it holds what
    the log holds."""
    tid = topic(broker, topic_name)
    index = index_of("fail", tid, 0)
    with WireClient.to(broker.bootstrap) as wc:
        assert part(init(wc, "fail", tid, start=0)).error_code == ErrorCode.none

        async def failing(b: Any) -> Any:
            service = b.share_coordinator
            original = service._append

            async def timed_out(i: int, records: Any) -> Any:
                await original(i, records)  # in the log, but as if the commit timed out
                return ErrorCode.coordinator_not_available, True

            service._append = timed_out
            return None

        broker.acall(failing)
        try:
            r = part(write(wc, "fail", tid, start=2, batches=[(2, 3, 2, 1)]))
            assert r.error_code == ErrorCode.coordinator_not_available
        finally:
            broker.call(lambda b: delattr(b.share_coordinator, "_append"))
        deadline = time.monotonic() + 10
        while broker.call(lambda b: index in b.share_coordinator.loading) and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        r = part(read(wc, "fail", tid))
        assert (r.error_code, r.start_offset, batches_of(r)) == (0, 2, [(2, 3, 2, 1)])


def _snapshot(b: Any, index: int) -> Any:
    return b.share_coordinator.shards[index].snapshot()


def test_a_partition_loads_in_steps(broker: InProcessBroker, topic_name: str) -> None:
    """A partition longer than one read loads in a task: LOAD_IN_PROGRESS until the shard
    is whole, then exactly the state it had; a resignation meanwhile abandons the load."""
    tid = topic(broker, topic_name)
    index = index_of("steps", tid, 1)
    with WireClient.to(broker.bootstrap) as wc:
        assert part(init(wc, "steps", tid, p=1, start=0)).error_code == ErrorCode.none
        for i in range(6):
            r = write(wc, "steps", tid, p=1, start=i, batches=[(i, i + 2, 2, i + 1)])
            assert part(r).error_code == ErrorCode.none
    before = broker.call(lambda b: _snapshot(b, index))
    tp = TopicPartition(STATE_TOPIC, index)

    async def reload(b: Any, resign: bool) -> Any:
        service = b.share_coordinator
        service.load_read_bytes = 1  # one batch per step
        try:
            service.load_partition(index)
            assert service.check(index) == ErrorCode.coordinator_load_in_progress
            if resign:
                service.partition_unloaded(tp)
                await asyncio.sleep(0.05)
                return service.check(index), index in service.shards
            deadline = time.monotonic() + 10
            while index in service.loading and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            return service.check(index), _snapshot(b, index)
        finally:
            service.load_read_bytes = 8 << 20

    code, after = broker.acall(lambda b: reload(b, False))
    assert code == ErrorCode.none and after == before
    code, loaded = broker.acall(lambda b: reload(b, True))
    assert (code, loaded) == (ErrorCode.not_coordinator, False)
    broker.call(lambda b: b.share_coordinator.partition_led(tp))
    assert broker.call(lambda b: _snapshot(b, index)) == before


# -- the persister ------------------------------------------------------------------------


def _write(key: StateKey, leader_epoch: int, start: int,
           batches: list[tuple[int, int, int, int]], state_epoch: int = 0) -> WriteEntry:
    return WriteEntry(key, leader_epoch, ShareStateWrite(
        state_epoch=state_epoch, start_offset=start,
        state_batches=tuple(PersisterStateBatch(*b) for b in batches),
        delivery_complete_count=len(batches)))


async def _every_method(persister: Any, tid: uuid.UUID, group: str) -> dict[str, Any]:
    keys = [StateKey(group, tid, 0), StateKey(group, tid, 1)]
    out: dict[str, Any] = {}
    out["read_before"] = await persister.read_state(keys, 0)
    out["init"] = await persister.initialize_state(
        [InitializeEntry(keys[0], 1, 10), InitializeEntry(keys[1], 1)])
    out["write"] = await persister.write_state(
        [_write(keys[0], 2, 11, [(11, 12, 2, 1)], 1), _write(keys[1], 2, 0, [(0, 0, 4, 3)], 1)])
    out["fenced"] = await persister.write_state([_write(keys[0], 1, 12, [])])
    out["read"] = await persister.read_state(keys, 2)
    out["summary"] = await persister.read_state_summary(keys, 2)
    out["delete"] = await persister.delete_state(keys[:1])
    out["read_after"] = await persister.read_state(keys, 2)
    return out


def _check_every_method(out: dict[str, Any], tid: uuid.UUID, group: str) -> None:
    k0, k1 = StateKey(group, tid, 0), StateKey(group, tid, 1)
    assert {k: r.error for k, r in out["read_before"].items()} == {
        k0: ErrorCode.invalid_request, k1: ErrorCode.invalid_request}
    assert out["read_before"][k0].error_message == READ_UNINITIALIZED_SHARE_PARTITION
    assert out["init"].errors == {} and out["write"].errors == {}
    assert out["fenced"].errors == {k0: ErrorCode.fenced_leader_epoch}
    r0, r1 = out["read"][k0], out["read"][k1]
    assert (r0.error, r0.state_epoch, r0.start_offset, r0.state_batches) == (
        ErrorCode.none, 1, 11, (PersisterStateBatch(11, 12, 2, 1),))
    assert (r1.error, r1.start_offset, r1.state_batches) == (
        ErrorCode.none, 0, (PersisterStateBatch(0, 0, 4, 3),))
    s0 = out["summary"][k0]
    assert (s0.error, s0.state_epoch, s0.leader_epoch, s0.start_offset,
            s0.delivery_complete_count) == (ErrorCode.none, 1, 2, 11, 1)
    assert out["delete"].errors == {}
    assert out["read_after"][k0].error == ErrorCode.invalid_request
    assert out["read_after"][k1].error == ErrorCode.none


def test_the_persisters_local_path(broker: InProcessBroker, topic_name: str) -> None:
    tid = topic(broker, topic_name)

    async def run(b: Any) -> Any:
        persister = b.share_persister
        assert isinstance(persister, CoordinatorPersister) and persister.in_process
        out = await _every_method(persister, tid, "local")
        return out, dict(persister._conns)

    out, conns = broker.acall(run)
    _check_every_method(out, tid, "local")
    assert conns == {}  # nothing went over a connection


def test_the_persisters_remote_path(broker: InProcessBroker, topic_name: str) -> None:
    """What a persister on another broker does: the same requests over the inter-broker
    connection (here forced to this broker's own listener), one connection reused."""
    tid = topic(broker, topic_name)

    async def run(b: Any) -> Any:
        persister = CoordinatorPersister(b, b.share_coordinator, in_process=False)
        served: list[int] = []
        original = b.share_coordinator.serve

        async def counting(api_key: int, request: Any) -> Any:
            served.append(api_key)
            return await original(api_key, request)

        b.share_coordinator.serve = counting
        try:
            out = await _every_method(persister, tid, "remote")
            conns = dict(persister._conns)
        finally:
            del b.share_coordinator.serve
            persister.close()
        return out, served, conns

    out, served, conns = broker.acall(run)
    _check_every_method(out, tid, "remote")
    assert served == [84, 83, 85, 85, 84, 87, 86, 84]  # one request per call
    assert list(conns) == [0]


def test_the_persister_retries_as_kafka_does(broker: InProcessBroker,
                                             topic_name: str) -> None:
    tid = topic(broker, topic_name)
    key = StateKey("retry", tid, 0)
    index = index_of("retry", tid, 0)

    async def run(b: Any) -> Any:
        service = b.share_coordinator
        persister = CoordinatorPersister(b, service)
        waits: list[int] = []
        release_at: list[int] = [2]

        def backoff(attempts: int, _rand: float) -> float:
            waits.append(attempts)
            if attempts in release_at:  # the load ends during the second wait
                service.loading.discard(index)
            return 0.001

        persister.backoff = backoff
        assert (await persister.initialize_state([InitializeEntry(key, 0, 0)])).errors == {}
        # loading: retried until the load ends
        service.loading.add(index)
        read = await persister.read_state([key], 0)
        retried = list(waits)
        # still loading after the last attempt: the error is the answer
        waits.clear()
        release_at.clear()
        service.loading.add(index)
        try:
            stuck = await persister.read_state([key], 0)
        finally:
            service.loading.discard(index)
        gave_up = list(waits)
        # UNKNOWN_TOPIC_OR_PARTITION is retried too (metadata may lag), then answered
        waits.clear()
        ghost = StateKey("retry", uuid.uuid4(), 0)
        unknown = await persister.initialize_state([InitializeEntry(ghost, 0, 0)])
        unknown_waits = list(waits)
        # a failed connection is NETWORK_EXCEPTION, not retried
        waits.clear()
        remote = CoordinatorPersister(b, service, in_process=False)
        remote.backoff = persister.backoff

        async def refused(*_: Any) -> Any:
            raise ConnectionRefusedError("refused")

        remote._remote = refused  # type: ignore[method-assign]
        network = await remote.write_state([_write(key, 0, 1, [])])
        return read, retried, stuck, gave_up, unknown, unknown_waits, network, list(waits)

    read, retried, stuck, gave_up, unknown, unknown_waits, network, net_waits = \
        broker.acall(run)
    assert read[key].error == ErrorCode.none and retried == [1, 2]
    assert stuck[key].error == ErrorCode.coordinator_load_in_progress
    assert gave_up == [1, 2, 3, 4]  # five answers, four waits with growing attempts
    assert list(unknown.errors.values()) == [ErrorCode.unknown_topic_or_partition]
    assert unknown_waits == [1, 2, 3, 4]
    assert network.errors == {key: ErrorCode.network_exception} and net_waits == []


def test_a_peers_answer_is_checked(broker: InProcessBroker, topic_name: str) -> None:
    """What a coordinator on another broker answers is not trusted: an inverted state
    batch or a key left out is UNKNOWN_SERVER_ERROR for that key, never an exception (an
    error code Kafka does not define makes the response undecodable: the connection's
    BrokerConnectionError, NETWORK_EXCEPTION)."""
    from kio.schema.read_share_group_state.v0.response import ReadShareGroupStateResponse

    from headrace.protocol.entities import build

    tid = topic(broker, topic_name)
    k0, k1, k2 = (StateKey("peer", tid, p) for p in range(3))

    async def run(b: Any) -> Any:
        persister = CoordinatorPersister(b, b.share_coordinator, in_process=False)

        async def peer(*_: Any) -> Any:
            return build(ReadShareGroupStateResponse, {"results": [{"topic_id": tid,
                "partitions": [
                    {"partition": 1, "error_code": 0, "error_message": None,
                     "state_epoch": 0, "start_offset": 0, "state_batches": [
                         {"first_offset": 9, "last_offset": 3, "delivery_state": 0,
                          "delivery_count": 1}]}]}]})

        persister._remote = peer  # type: ignore[method-assign]
        return await persister.read_state([k0, k1, k2], 0)

    got = broker.acall(run)
    assert {k: r.error for k, r in got.items()} == dict.fromkeys(
        (k0, k1, k2), ErrorCode.unknown_server_error)


def test_state_survives_a_restart(broker: InProcessBroker, topic_name: str) -> None:
    tid = topic(broker, topic_name)
    with WireClient.to(broker.bootstrap) as wc:
        assert part(init(wc, "g2", tid, p=1, start=0, state_epoch=4)).error_code == 0
        assert part(write(wc, "g2", tid, p=1, start=3, batches=[(3, 4, 4, 5)], state_epoch=4,
                          leader_epoch=9, dcc=2)).error_code == 0
        assert part(init(wc, "gone", tid, start=0)).error_code == 0
        assert part(delete(wc, "gone", tid)).error_code == 0
    broker.restart()
    with WireClient.to(broker.bootstrap) as wc:
        p = part(read(wc, "g2", tid, p=1, leader_epoch=9))
        assert (p.error_code, p.state_epoch, p.start_offset) == (0, 4, 3)
        assert batches_of(p) == [(3, 4, 4, 5)]
        s = part(summary(wc, "g2", tid, p=1))
        assert (s.leader_epoch, s.delivery_complete_count) == (9, 2)
        # the fences held across the restart, and the deleted key stayed deleted
        assert part(read(wc, "g2", tid, p=1, leader_epoch=8)).error_code == \
            ErrorCode.fenced_leader_epoch
        assert part(init(wc, "g2", tid, p=1, state_epoch=3)).error_code == \
            ErrorCode.fenced_state_epoch
        assert part(read(wc, "gone", tid)).error_code == ErrorCode.invalid_request


# -- FindCoordinator key type 2 ---------------------------------------------------------


def test_find_coordinator_for_a_share_key(broker: InProcessBroker, topic_name: str) -> None:
    tid = topic(broker, topic_name)
    key = coordinator_key("g", tid, 0)
    with WireClient.to(broker.bootstrap) as wc:
        r = wc.request(10, 6, {"key_type": 2, "coordinator_keys": [
            key, "nonsense", coordinator_key("g", tid, -1), f"a:{key}"]})
        good, bad, negative, four = r.coordinators
        assert (good.error_code, good.node_id, good.port) == (ErrorCode.none, 0, broker.port)
        assert (bad.error_code, bad.node_id) == (ErrorCode.invalid_request, -1)
        assert "Invalid key format" in bad.error_message
        assert negative.error_code == ErrorCode.none  # Integer.parseInt takes "-1"
        assert four.error_code == ErrorCode.invalid_request
        # key type 2 before v6 is INVALID_REQUEST (KafkaApis.getCoordinator)
        r = wc.request(10, 5, {"key_type": 2, "coordinator_keys": [key]})
        assert r.coordinators[0].error_code == ErrorCode.invalid_request


# -- CLUSTER_ACTION ---------------------------------------------------------------------

USERS = {"admin": "admin-secret", "ops": "ops-secret"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, int]]]:
    overrides = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain_jaas(USERS),
        **ACL_AUTHORIZER,
        "super.users": "User:admin",
        "share.coordinator.state.topic.num.partitions": "3",
        "share.coordinator.state.topic.segment.bytes": "1048576",
    }
    with InProcessBroker(tmp_path_factory.mktemp("sharecoord-acl"), overrides) as b:
        ports = listener_ports(b)
        admin = AdminClient(sasl_conf(f"127.0.0.1:{ports['SASL_PLAINTEXT']}", "admin",
                                      USERS["admin"]))
        admin.create_topics([NewTopic("acl-t", 1, 1)])["acl-t"].result(15)
        for f in admin.create_acls([acl(ResourceType.BROKER, "kafka-cluster",
                                        AclOperation.CLUSTER_ACTION,
                                        principal="User:ops")]).values():
            f.result(15)
        yield b, ports


def test_cluster_action_is_needed(secured: tuple[Any, dict[str, int]]) -> None:
    b, ports = secured
    tid = b.call(lambda br: br.metadata.topic("acl-t").topic_id)
    with WireClient("127.0.0.1", ports["PLAINTEXT"]) as anon:
        # every partition of the request, its topics as it names them (unmerged)
        resp = anon.request(83, 0, {"group_id": "g", "topics": [
            {"topic_id": tid, "partitions": [{"partition": 0, "state_epoch": 0,
                                              "start_offset": 0}]},
            {"topic_id": tid, "partitions": [{"partition": 0, "state_epoch": 0,
                                              "start_offset": 0}]}]})
        assert [[(p.error_code, p.error_message) for p in t.partitions]
                for t in resp.results] == \
            [[(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")]] * 2
        for r in (read(anon, "g", tid), summary(anon, "g", tid), delete(anon, "g", tid),
                  write(anon, "g", tid, start=0, batches=[])):
            assert part(r).error_code == ErrorCode.cluster_authorization_failed
        r = anon.request(10, 6, {"key_type": 2, "coordinator_keys": [
            coordinator_key("g", tid, 0)]})
        assert r.coordinators[0].error_code == ErrorCode.cluster_authorization_failed
    # nothing was written for the refused requests
    assert b.call(lambda br: br.metadata.topic(STATE_TOPIC)) is None
    with WireClient("127.0.0.1", ports["SASL_PLAINTEXT"]).sasl_plain("ops",
                                                                     USERS["ops"]) as ops:
        assert part(init(ops, "g", tid, start=0)).error_code == ErrorCode.none
        assert part(read(ops, "g", tid)).error_code == ErrorCode.none
        r = ops.request(10, 6, {"key_type": 2, "coordinator_keys": [
            coordinator_key("g", tid, 0)]})
        assert r.coordinators[0].error_code == ErrorCode.none
    # the topic as share.coordinator.* configure it
    state = b.call(lambda br: br.metadata.topic(STATE_TOPIC))
    assert len(state.partitions) == 3
    configs = b.call(lambda br: br.replicas.get(TopicPartition(STATE_TOPIC, 0)).log.config)
    assert (configs.segment_bytes, configs.compact) == (1048576, False)
