"""Consumer groups with real clients (R-GRP-1..5): sharing, assignors, rebalance stories."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from tests.brokerproc import wait_until
from tests.clients import CLIENTS, Rec, create_topic, produce
from tests.group_clients import GroupMember, settled, stop_all, wait_settled
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """In process: nothing here is killed (a static member's restart is the client's)."""
    data = tmp_path_factory.mktemp("groups")
    with InProcessBroker(data, {"num.partitions": "1",
                                "group.initial.rebalance.delay.ms": "500"}) as b:
        yield b


def group_name() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("client", CLIENTS)
def test_three_members_share_six_partitions(broker: InProcessBroker, topic_name: str,
                                             client: str) -> None:
    """R-GRP-1: disjoint partitions covering all; each record consumed exactly once while
    membership is stable."""
    create_topic("confluent", broker.bootstrap, topic_name, 6)
    members = [GroupMember(client, broker.bootstrap, [topic_name], group_name()).start()
               for _ in range(1)]
    group = members[0].group
    members += [GroupMember(client, broker.bootstrap, [topic_name], group).start()
                for _ in range(2)]
    try:
        wait_settled(members, 6, stable_for_s=1.0)
        records = [Rec(i % 6, None, f"v{i}".encode()) for i in range(300)]
        produce("confluent", broker.bootstrap, topic_name, records)
        wait_until(lambda: sum(len(m.records) for m in members) >= 300, 20,
                   what="all records consumed")
        assert settled(members, 6)
        values = [v for m in members for _, _, v in m.records]
        assert sorted(values) == sorted(r.value for r in records)  # no loss, no duplicate
        for m in members:
            assert {p for p, _, _ in m.records} <= m.assignment
    finally:
        stop_all(members)


def _by_member_id(members: list[GroupMember]) -> list[list[int]]:
    return [sorted(m.assignment) for m in sorted(members, key=lambda m: m.member_id)]


def test_range_assignor_seed_example(broker: InProcessBroker, topic_name: str) -> None:
    """R-GRP-5: range, 7 partitions over 5 consumers → p0-p1, p2-p3, p4, p5, p6."""
    create_topic("confluent", broker.bootstrap, topic_name, 7)
    group = group_name()
    members = [GroupMember("confluent", broker.bootstrap, [topic_name], group,
                           assignor="range").start() for _ in range(5)]
    try:
        wait_settled(members, 7, stable_for_s=1.0)
        assert _by_member_id(members) == [[0, 1], [2, 3], [4], [5], [6]]
    finally:
        stop_all(members)


def test_roundrobin_assignor_seed_example(broker: InProcessBroker, topic_name: str) -> None:
    """R-GRP-5: roundrobin, 7 partitions over 3 consumers → c0: p0,p3,p6; c1: p1,p4;
    c2: p2,p5."""
    create_topic("confluent", broker.bootstrap, topic_name, 7)
    group = group_name()
    members = [GroupMember("confluent", broker.bootstrap, [topic_name], group,
                           assignor="roundrobin").start() for _ in range(3)]
    try:
        wait_settled(members, 7, stable_for_s=1.0)
        assert _by_member_id(members) == [[0, 3, 6], [1, 4], [2, 5]]
    finally:
        stop_all(members)


def test_cooperative_sticky_rebalances_incrementally(broker: InProcessBroker,
                                                     topic_name: str) -> None:
    """R-GRP-5: cooperative-sticky is carried opaquely: a joiner takes partitions while
    the others keep most of theirs."""
    create_topic("confluent", broker.bootstrap, topic_name, 6)
    group = group_name()
    members = [GroupMember("confluent", broker.bootstrap, [topic_name], group,
                           assignor="cooperative-sticky").start() for _ in range(2)]
    try:
        wait_settled(members, 6, stable_for_s=1.0)
        before = [m.assignment for m in members]
        members.append(GroupMember("confluent", broker.bootstrap, [topic_name], group,
                                   assignor="cooperative-sticky").start())
        wait_settled(members, 6, stable_for_s=1.0)
        for old, m in zip(before, members, strict=False):
            assert m.assignment <= old  # sticky: nobody got someone else's partition
    finally:
        stop_all(members)


@pytest.mark.parametrize("client", CLIENTS)
def test_member_close_moves_partitions_quickly(broker: InProcessBroker, topic_name: str,
                                               client: str) -> None:
    """R-GRP-3: LeaveGroup on close → the others take over within about two seconds."""
    create_topic("confluent", broker.bootstrap, topic_name, 6)
    group = group_name()
    members = [GroupMember(client, broker.bootstrap, [topic_name], group).start()
               for _ in range(3)]
    try:
        wait_settled(members, 6, stable_for_s=0.5)
        members.pop().stop()
        wait_settled(members, 6, timeout_s=4.0)
    finally:
        stop_all(members)


def test_new_member_triggers_rebalance(broker: InProcessBroker, topic_name: str) -> None:
    """R-GRP-3: a join rebalances the group."""
    create_topic("confluent", broker.bootstrap, topic_name, 6)
    group = group_name()
    members = [GroupMember("kafka-python", broker.bootstrap, [topic_name], group).start()
               for _ in range(2)]
    try:
        wait_settled(members, 6, stable_for_s=0.5)
        members.append(GroupMember("kafka-python", broker.bootstrap, [topic_name],
                                   group).start())
        wait_settled(members, 6, timeout_s=10)
        assert all(len(m.assignment) == 2 for m in members)
    finally:
        stop_all(members)


CHILD = textwrap.dedent("""
    import sys
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                  "auto.offset.reset": "earliest"})
    c.subscribe([sys.argv[3]])
    last = None
    while True:
        c.poll(0.1)
        now = sorted(tp.partition for tp in c.assignment())
        if now != last:
            print("assigned", now, flush=True)
            last = now
""")


@pytest.mark.slow
def test_killed_member_partitions_move_after_session_timeout(
        broker: InProcessBroker, topic_name: str, tmp_path: Path) -> None:
    """R-GRP-3: a member kill -9'd stops heartbeating; after session.timeout.ms it is
    removed and its partitions move."""
    create_topic("confluent", broker.bootstrap, topic_name, 6)
    group = group_name()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen([sys.executable, str(script), broker.bootstrap, group,
                              topic_name], stdout=subprocess.PIPE, text=True)
    members = [GroupMember("confluent", broker.bootstrap, [topic_name], group).start()]
    try:
        wait_until(lambda: members[0].assignment and len(members[0].assignment) < 6, 20,
                   what="the child to share the partitions")
        child.kill()
        child.wait(5)
        wait_settled(members, 6, timeout_s=12)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
        stop_all(members)


def _join(w: WireClient, group: str, member_id: str = "", protocol: str = "range",
          protocol_type: str = "consumer", metadata: bytes = b"\x00\x01",
          instance: str | None = None, version: int = 5, session_ms: int = 6000) -> object:
    return w.request(11, version, {
        "group_id": group, "session_timeout": session_ms, "rebalance_timeout": 10000,
        "member_id": member_id, "group_instance_id": instance,
        "protocol_type": protocol_type,
        "protocols": [{"name": protocol, "metadata": metadata}],
    })


def join_member(w: WireClient, group: str, **kw: object) -> object:
    """The KIP-394 round trip: MEMBER_ID_REQUIRED, then the join with the given id."""
    first = _join(w, group, **kw)  # type: ignore[arg-type]
    assert first.error_code == ErrorCode.member_id_required  # type: ignore[attr-defined]
    return _join(w, group, member_id=first.member_id, **kw)  # type: ignore[attr-defined,arg-type]


def test_stale_generation_commit_is_rejected(broker: InProcessBroker, topic_name: str) -> None:
    """R-GRP-4: after a rebalance, a commit or heartbeat with the old generation gets
    ILLEGAL_GENERATION, so a stale member cannot commit."""
    create_topic("confluent", broker.bootstrap, topic_name, 1)
    group = group_name()
    with WireClient.to(broker.bootstrap) as a, WireClient.to(broker.bootstrap) as b:
        ja = join_member(a, group)
        gen1 = ja.generation_id  # type: ignore[attr-defined]
        sa = a.request(14, 3, {"group_id": group, "generation_id": gen1,
                               "member_id": ja.member_id,  # type: ignore[attr-defined]
                               "assignments": [{"member_id": ja.member_id,  # type: ignore[attr-defined]
                                                "assignment": b"x"}]})
        assert sa.error_code == ErrorCode.none and sa.assignment == b"x"
        first = _join(b, group)
        b.send_raw(b.encode(11, 5, {
            "group_id": group, "session_timeout": 6000, "rebalance_timeout": 10000,
            "member_id": first.member_id, "protocol_type": "consumer",  # type: ignore[attr-defined]
            "protocols": [{"name": "range", "metadata": b"\x00\x01"}]}))
        hb = a.request(12, 3, {"group_id": group, "generation_id": gen1,
                               "member_id": ja.member_id})  # type: ignore[attr-defined]
        assert hb.error_code == ErrorCode.rebalance_in_progress
        ja2 = _join(a, group, member_id=ja.member_id)  # type: ignore[attr-defined]
        jb2 = b.read_response(11, 5)
        assert ja2.generation_id == jb2.generation_id == gen1 + 1  # type: ignore[attr-defined]
        commit = a.request(8, 8, {
            "group_id": group, "generation_id_or_member_epoch": gen1,
            "member_id": ja.member_id,  # type: ignore[attr-defined]
            "topics": [{"name": topic_name, "partitions": [
                {"partition_index": 0, "committed_offset": 1,
                 "committed_leader_epoch": -1, "committed_metadata": None}]}]})
        assert commit.topics[0].partitions[0].error_code == ErrorCode.illegal_generation
        hb = a.request(12, 3, {"group_id": group, "generation_id": gen1,
                               "member_id": ja.member_id})  # type: ignore[attr-defined]
        assert hb.error_code == ErrorCode.illegal_generation


def test_static_member_restart_keeps_partitions_without_rebalance(
        broker: InProcessBroker, topic_name: str) -> None:
    """KIP-345 (R-GRP-3): a static member back within its session timeout replaces itself
    and gets its partitions back; the other member sees no rebalance."""
    create_topic("confluent", broker.bootstrap, topic_name, 6)
    group = group_name()

    def member(i: int) -> GroupMember:
        return GroupMember("confluent", broker.bootstrap, [topic_name], group,
                           session_timeout_ms=20000, instance_id=f"static-{i}").start()

    a, b = member(0), member(1)
    try:
        wait_settled([a, b], 6, stable_for_s=0.5)
        mine, revokes = a.assignment, b.revokes
        a.stop()
        a = member(0)
        wait_until(lambda: a.assignment == mine, 15, what="the static member's partitions")
        assert b.revokes == revokes
    finally:
        stop_all([a, b])


@pytest.mark.parametrize("client", CLIENTS)
def test_an_error_in_a_member_thread_fails_the_test(broker: InProcessBroker, topic_name: str,
                                                    client: str) -> None:
    """The harness itself: a member whose client raises in its thread (here: a config the
    client refuses) fails the waiting test at once with that error, and ``stop`` re-raises
    it, instead of the test timing out or passing with the member silently gone."""
    bad = {"confluent": {"no.such.property": "1"},
           "kafka-python": {"no_such_option": 1},
           "aiokafka": {"no_such_option": 1}}[client]
    member = GroupMember(client, broker.bootstrap, [topic_name], group_name(),
                         extra=bad).start()
    with pytest.raises(AssertionError, match="failed"):
        wait_settled([member], 1, timeout_s=20)
    with pytest.raises(AssertionError, match=f"{client} member"):
        member.stop()
