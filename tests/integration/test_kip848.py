"""KIP-848 consumer groups with real librdkafka consumers (``group.protocol=consumer``).

Issue 3 item 3, R-GRP-1, R-GRP-5 (seed 004's range example through a real assignment),
R-GRP-6 (commits with member epochs). Consumers are polled round-robin from this thread;
every wait is ``wait_until`` with a deadline.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kio.schema.errors import ErrorCode

from tests.brokerproc import BrokerProcess, wait_until
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

# Fast group timers. Every config below is part of the contract under test (README's broker
# config table): nothing here is gated on the implementation, so a missing handler or config
# fails these tests (the broker refuses an unknown -o key) instead of skipping them.
FAST = {"group.consumer.heartbeat.interval.ms": "500",
        "group.consumer.session.timeout.ms": "6000",
        "group.initial.rebalance.delay.ms": "0"}
REBALANCE_S = 20.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data: Path = tmp_path_factory.mktemp("kip848")
    with InProcessBroker(data, {"num.partitions": "1", **FAST}) as b:
        yield b
        failures = [line for line in b.stderr_lines if "Traceback" in line or "failed" in line]
        assert not failures, "".join(b.stderr_lines)


def create_topic(bootstrap: str, partitions: int) -> str:
    name = f"kip848-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)
    return name


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int,
            first: int = 0) -> set[bytes]:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    values = set()
    for part in range(partitions):
        for i in range(first, first + per_partition):
            v = f"{part}-{i}".encode()
            values.add(v)
            p.produce(topic, v, partition=part)
    assert p.flush(15) == 0
    return values


def consumer(bootstrap: str, group: str, topic: str, assignor: str = "uniform",
             **extra: object) -> Consumer:
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "group.remote.assignor": assignor,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        **extra,
    })
    c.subscribe([topic])
    return c


def partitions_of(c: Consumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def poll_all(consumers: list[Consumer], sink: list[bytes] | None = None) -> None:
    for c in consumers:
        msg = c.poll(0.05)
        while msg is not None:
            value = msg.value()
            if msg.error() is None and sink is not None and value is not None:
                sink.append(value)
            msg = c.poll(0)


def wait_polling(consumers: list[Consumer], done: Callable[[], object], timeout_s: float,
                 what: str, sink: list[bytes] | None = None) -> None:
    """Poll every consumer (delivering records to ``sink``) until ``done()``."""
    def step() -> object:
        poll_all(consumers, sink)
        return done()

    wait_until(step, timeout_s, what=what)


def wait_disjoint_cover(consumers: list[Consumer], partitions: int,
                        timeout_s: float = REBALANCE_S,
                        sink: list[bytes] | None = None) -> list[set[int]]:
    def covered() -> list[set[int]] | None:
        poll_all(consumers, sink)
        owned = [partitions_of(c) for c in consumers]
        union: set[int] = set().union(*owned)
        if sum(map(len, owned)) == partitions and union == set(range(partitions)) \
                and all(owned):
            return owned
        return None

    result: list[set[int]] = wait_until(covered, timeout_s, what="a disjoint covering assignment")
    return result


def close_all(consumers: list[Consumer]) -> None:
    for c in consumers:
        c.close()


def test_three_consumers_share_six_partitions_and_read_each_record_once(
        broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, 6)
    group = f"g-{uuid.uuid4().hex[:6]}"
    consumers = [consumer(broker.bootstrap, group, topic) for _ in range(3)]
    try:
        owned = wait_disjoint_cover(consumers, 6)
        assert sorted(map(len, owned)) == [2, 2, 2]
        produced = produce(broker.bootstrap, topic, 6, 50)
        got: list[bytes] = []
        wait_polling(consumers, lambda: len(got) >= len(produced), 30, "every record", got)
        poll_all(consumers, got)
        assert len(got) == len(set(got)) == len(produced)
        assert set(got) == produced
        # membership never changed while consuming
        assert [partitions_of(c) for c in consumers] == owned
        # ConsumerGroupDescribe (69) through the admin client
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        desc = admin.describe_consumer_groups([group])[group].result(15)
        assert len(desc.members) == 3
        described = sorted(sorted(tp.partition for tp in m.assignment.topic_partitions)
                           for m in desc.members)
        assert described == sorted(sorted(o) for o in owned)
    finally:
        close_all(consumers)


def test_range_assignor_reproduces_seed_004(broker: BrokerProcess) -> None:
    """7 partitions, 5 members sorted by member id → p0-p1, p2-p3, p4, p5, p6."""
    topic = create_topic(broker.bootstrap, 7)
    group = f"g-{uuid.uuid4().hex[:6]}"
    consumers = [consumer(broker.bootstrap, group, topic, "range") for _ in range(5)]
    try:
        wait_disjoint_cover(consumers, 7)
        by_member = sorted((c.memberid(), sorted(partitions_of(c))) for c in consumers)
        assert [ps for _, ps in by_member] == [[0, 1], [2, 3], [4], [5], [6]]
    finally:
        close_all(consumers)


def test_closed_member_partitions_move_to_the_others(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, 6)
    group = f"g-{uuid.uuid4().hex[:6]}"
    consumers = [consumer(broker.bootstrap, group, topic) for _ in range(3)]
    try:
        wait_disjoint_cover(consumers, 6)
        leaving = consumers.pop(1)
        leaving.close()
        owned = wait_disjoint_cover(consumers, 6)
        assert sorted(map(len, owned)) == [3, 3]
    finally:
        close_all(consumers)


def test_committed_offsets_are_resumed_by_the_next_member(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, 2)
    group = f"g-{uuid.uuid4().hex[:6]}"
    produced = produce(broker.bootstrap, topic, 2, 10)
    first = consumer(broker.bootstrap, group, topic)
    got: list[bytes] = []
    try:
        wait_polling([first], lambda: len(got) >= 20, REBALANCE_S, "the first 20 records",
                     got)
        first.commit(asynchronous=False)
        committed = first.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], 15)
        assert sorted(tp.offset for tp in committed) == [10, 10]
    finally:
        first.close()
    assert set(got) == produced
    more = produce(broker.bootstrap, topic, 2, 3, first=10)
    second = consumer(broker.bootstrap, group, topic)
    got2: list[bytes] = []
    try:
        wait_polling([second], lambda: len(got2) >= 6, REBALANCE_S,
                     "the records after the committed offsets", got2)
        poll_all([second], got2)
        assert set(got2) == more and len(got2) == 6
    finally:
        second.close()


def test_unknown_assignor_is_a_fatal_error_for_the_consumer(broker: BrokerProcess) -> None:
    """UNSUPPORTED_ASSIGNOR: librdkafka reports it as a fatal consumer error."""
    topic = create_topic(broker.bootstrap, 1)
    c = consumer(broker.bootstrap, f"g-{uuid.uuid4().hex[:6]}", topic, "nonesuch")

    def fatal() -> str | None:
        try:
            msg = c.poll(0.05)
        except KafkaException as e:
            return str(e)
        err = None if msg is None else msg.error()
        fatal = err is not None and (err.fatal() or err.code() == KafkaError._FATAL)
        return str(err) if fatal else None

    try:
        assert "assignor" in wait_until(fatal, 20, what="a fatal error")
    finally:
        c.close()


# ---------------------------------------------------------------------- on the wire


def heartbeat(wc: WireClient, version: int, **fields: object) -> Any:
    body: dict[str, object] = {"group_id": "g", "member_id": "", "member_epoch": 0,
                               "rebalance_timeout": 30_000, "subscribed_topic_names": [],
                               "topic_partitions": []}
    body.update(fields)
    return wc.request(68, version, body)


def describe(wc: WireClient, group_id: str) -> Any:
    (g,) = wc.request(69, 1, {"group_ids": [group_id],
                              "include_authorized_operations": False}).groups
    return g


def test_heartbeat_errors_on_the_wire(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, 3)
    group = f"g-{uuid.uuid4().hex[:6]}"
    with WireClient.to(broker.bootstrap) as wc:
        assert heartbeat(wc, 1, group_id="", member_id="m").error_code \
            == ErrorCode.invalid_request
        # v1 requires the client's member id
        assert heartbeat(wc, 1, group_id=group).error_code == ErrorCode.invalid_request
        # no such group: not a member (rejoin)
        r = heartbeat(wc, 1, group_id=group, member_id="m", member_epoch=3)
        assert r.error_code == ErrorCode.unknown_member_id
        assert describe(wc, group).error_code == ErrorCode.group_id_not_found
        # v0: the coordinator makes the member id
        r = heartbeat(wc, 0, group_id=group, subscribed_topic_names=[topic])
        assert r.error_code == ErrorCode.none and r.member_id and r.member_epoch == 1
        assert sorted(r.assignment.topic_partitions[0].partitions) == [0, 1, 2]
        d = describe(wc, group)
        assert (d.error_code, d.group_state, d.assignor_name) == (ErrorCode.none, "Stable",
                                                                   "uniform")
        (m,) = d.members
        assert m.member_id == r.member_id and m.client_id == "wire-test"
        assert m.assignment.topic_partitions[0].topic_name == topic
        r = heartbeat(wc, 0, group_id=group, member_id=r.member_id, member_epoch=5)
        assert r.error_code == ErrorCode.fenced_member_epoch
        r = heartbeat(wc, 1, group_id=group, member_id="x", server_assignor="sticky")
        assert r.error_code == ErrorCode.unsupported_assignor and r.error_message


def test_a_classic_group_with_members_is_not_a_consumer_group(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, 1)
    group = f"g-{uuid.uuid4().hex[:6]}"
    classic = consumer(broker.bootstrap, group, topic, **{"group.protocol": "classic"})
    try:
        wait_polling([classic], classic.assignment, REBALANCE_S,
                     "the classic consumer's assignment")
        with WireClient.to(broker.bootstrap) as wc:
            r = heartbeat(wc, 1, group_id=group, member_id="m", subscribed_topic_names=[topic])
            assert r.error_code == ErrorCode.group_id_not_found
            assert describe(wc, group).error_code == ErrorCode.group_id_not_found
    finally:
        classic.close()


KILLED_CONSUMER = """
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "group.protocol": "consumer", "auto.offset.reset": "earliest"})
c.subscribe([sys.argv[3]])
while True:
    c.poll(0.1)
"""


@pytest.mark.slow
def test_killed_member_partitions_move_after_the_session_timeout(
        broker: BrokerProcess) -> None:
    import subprocess
    import sys

    topic = create_topic(broker.bootstrap, 4)
    group = f"g-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CONSUMER, broker.bootstrap, group,
                             topic], stdout=subprocess.DEVNULL)
    survivor = consumer(broker.bootstrap, group, topic)
    try:
        wait_polling([survivor], lambda: len(partitions_of(survivor)) == 2, REBALANCE_S,
                     "two members sharing four partitions")
        proc.kill()
        proc.wait(10)
        # session timeout 6 s: the survivor gets everything
        wait_polling([survivor], lambda: len(partitions_of(survivor)) == 4, 20,
                     "the killed member's partitions")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        survivor.close()


# ---------------------------------------------------------------------- restarts


def described_members(bootstrap: str, group: str) -> dict[str, tuple[int, list[int]]] | None:
    """ConsumerGroupDescribe on the wire: member id → (member epoch, assigned partitions);
    None unless the group is Stable."""
    with WireClient.to(bootstrap) as wc:
        d = describe(wc, group)
    if d.error_code != ErrorCode.none or d.group_state != "Stable":
        return None
    return {m.member_id: (m.member_epoch, sorted(p for tp in m.assignment.topic_partitions
                                                 for p in tp.partitions))
            for m in d.members}


@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "kill-9"])
@pytest.mark.slow
def test_consumer_group_survives_a_broker_restart(tmp_path: Path, graceful: bool) -> None:
    """R-GRP-6/7: the KIP-848 group's state is in __consumer_offsets, so after a restart
    (graceful or kill -9) the same member carries on with its member id, epoch and
    assignment, and every record before and after is consumed exactly once."""
    overrides = {"num.partitions": "1", **FAST,
                 # long enough for the consumer to reconnect after the restart
                 "group.consumer.session.timeout.ms": "30000"}
    with BrokerProcess(tmp_path / "data", overrides) as b:
        topic = create_topic(b.bootstrap, 3)
        group = f"g-{uuid.uuid4().hex[:6]}"
        produced = produce(b.bootstrap, topic, 3, 20)
        c = consumer(b.bootstrap, group, topic, **{"reconnect.backoff.max.ms": 500})
        got: list[bytes] = []
        try:
            wait_polling([c], lambda: len(got) >= len(produced), REBALANCE_S,
                         "the records produced before the restart", got)
            before = wait_until(lambda: described_members(b.bootstrap, group), 10,
                                what="a Stable group")
            (member_id,) = before
            assert c.memberid() == member_id and before[member_id][1] == [0, 1, 2]
            assert partitions_of(c) == {0, 1, 2}

            b.restart(graceful=graceful)
            # loaded from __consumer_offsets: the same member, epoch and assignment
            assert described_members(b.bootstrap, group) == before

            produced |= produce(b.bootstrap, topic, 3, 20, first=20)
            wait_polling([c], lambda: len(got) >= len(produced), 60,
                         "the records produced after the restart", got)
            poll_all([c], got)
            assert len(got) == len(set(got)) and set(got) == produced
            # the consumer heartbeated since: still the same member, no rebalance
            assert described_members(b.bootstrap, group) == before
            assert c.memberid() == member_id and partitions_of(c) == {0, 1, 2}
        finally:
            c.close()
        failures = [line for line in b.stderr_lines if "Traceback" in line]
        assert not failures, "".join(b.stderr_lines)
