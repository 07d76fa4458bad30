"""KIP-848 reconciliation under fast subscription churn, with real librdkafka consumers and
rebalance callbacks (issue 11 item 5).

A member asked to revoke partitions keeps current ∩ target until it acknowledges the
revocation; only then does it get the partitions newly assigned to it (Kafka's
``CurrentAssignmentBuilder``). What a client application sees of that: partitions move
between consumers only through ``on_revoke`` on the old owner before ``on_assign`` on the
new one (never held twice at once), and a consumer that unsubscribes — even in the middle
of a revocation — ends up holding nothing.

Every consumer is polled from this thread; every wait is ``wait_until`` with a deadline.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kio.schema.errors import ErrorCode

from tests.brokerproc import BrokerProcess, wait_until
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

FAST = {"group.consumer.heartbeat.interval.ms": "200",
        "group.consumer.session.timeout.ms": "6000",
        "group.initial.rebalance.delay.ms": "0"}
SETTLE_S = 30.0

Held = set[tuple[str, int]]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data: Path = tmp_path_factory.mktemp("kip848churn")
    with InProcessBroker(data, {"num.partitions": "1", **FAST}) as b:
        yield b
        failures = [line for line in b.stderr_lines if "Traceback" in line]
        assert not failures, "".join(b.stderr_lines)


def create_topics(bootstrap: str, partitions: int, count: int) -> list[str]:
    names = [f"churn-{uuid.uuid4().hex[:8]}" for _ in range(count)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(n, partitions, 1) for n in names]).values():
        f.result(15)
    return names


class Member:
    """A consumer whose held partitions are what its rebalance callbacks say. Every assign
    is checked against what the other members hold at that moment (``overlaps``)."""

    def __init__(self, bootstrap: str, group: str, everyone: list[Member],
                 overlaps: list[str]) -> None:
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
        })
        self.held: Held = set()
        self.subscribed: list[str] = []
        self.everyone = everyone
        self.overlaps = overlaps
        self.log: list[str] = []

    def _assign(self, c: Consumer, tps: list[TopicPartition]) -> None:
        got = {(tp.topic, tp.partition) for tp in tps}
        self.log.append(f"assign {sorted(got)}")
        for other in self.everyone:
            if other is not self and other.held & got:
                self.overlaps.append(f"{sorted(other.held & got)} assigned to "
                                     f"{c.memberid()} while held by "
                                     f"{other.consumer.memberid()}")
        self.held |= got

    def _revoke(self, c: Consumer, tps: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in tps}
        self.log.append(f"revoke {sorted(gone)}")
        self.held -= gone

    def subscribe(self, topics: list[str]) -> None:
        self.subscribed = list(topics)
        self.consumer.subscribe(topics, on_assign=self._assign, on_revoke=self._revoke,
                                on_lost=self._revoke)

    def unsubscribe(self) -> None:
        self.subscribed = []
        self.consumer.unsubscribe()

    def poll(self) -> None:
        msg = self.consumer.poll(0.02)
        while msg is not None:
            msg = self.consumer.poll(0)

    def assignment(self) -> Held:
        return {(tp.topic, tp.partition) for tp in self.consumer.assignment()}


def poll_all(members: list[Member]) -> None:
    for m in members:
        m.poll()


def described(bootstrap: str, group: str) -> dict[str, Held] | None:
    """ConsumerGroupDescribe: member id → assigned partitions (None unless Stable)."""
    with WireClient.to(bootstrap) as wc:
        (g,) = wc.request(69, 1, {"group_ids": [group],
                                  "include_authorized_operations": False}).groups
    if g.error_code != ErrorCode.none or g.group_state != "Stable":
        return None
    return {m.member_id: {(tp.topic_name, p) for tp in m.assignment.topic_partitions
                          for p in tp.partitions} for m in g.members}


def test_subscription_switch_then_unsubscribe_holds_nothing(broker: BrokerProcess) -> None:
    """One consumer owns t1's four partitions, switches to t2 (t1's partitions to revoke,
    t2's four free: the coordinator must not hand them out before the revocation is
    acknowledged) and unsubscribes after 0, 1 or 2 polls: after the leave it holds
    nothing, and nothing is handed to it later."""
    t1, t2 = create_topics(broker.bootstrap, 4, 2)
    for polls in range(3):  # 0, 1, 2 polls between the switch and unsubscribe()
        _switch_then_unsubscribe(broker.bootstrap, t1, t2, polls)


def _switch_then_unsubscribe(bootstrap: str, t1: str, t2: str, polls: int) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    m = Member(bootstrap, group, [], [])
    try:
        m.subscribe([t1])
        wait_until(lambda: (m.poll(), len(m.held) == 4)[1], SETTLE_S,
                   what="t1's four partitions")
        m.subscribe([t2])
        for _ in range(polls):
            m.poll()
        m.unsubscribe()
        wait_until(lambda: (m.poll(), not m.held and not m.assignment())[1], SETTLE_S,
                   what="the unsubscribed consumer to hold nothing")
        # the member left the group (its leave heartbeat was answered)...
        wait_until(lambda: _group_is_empty(bootstrap, group), SETTLE_S,
                   what="the group to be empty")
        # ...and nothing was handed to it after: still nothing held
        for _ in range(10):
            m.poll()
        assert not m.held and not m.assignment(), m.log
    finally:
        m.consumer.close()


def _group_is_empty(bootstrap: str, group: str) -> bool:
    with WireClient.to(bootstrap) as wc:
        (g,) = wc.request(69, 1, {"group_ids": [group],
                                  "include_authorized_operations": False}).groups
    return g.error_code == ErrorCode.none and g.group_state == "Empty"


# Seeds whose churn ended with an unsubscribed consumer holding a partition (and holding it
# together with another consumer) before the fix: a member revoking was also handed newly
# free partitions, which librdkafka assigns after its revoke, even after unsubscribe().
@pytest.mark.parametrize("seed", [3, 5])
def test_fast_subscribe_unsubscribe_churn_never_double_assigns(broker: BrokerProcess,
                                                                seed: int) -> None:
    """Four consumers with rebalance callbacks switch between two 6-partition topics and
    unsubscribe/resubscribe (a fresh consumer: librdkafka's rejoin after a leave on the
    same handle sends a null owned list, which Kafka refuses too) quickly, without waiting
    for the group to settle. Whatever the timing: a partition is never assigned to one
    consumer while another one still holds it, an unsubscribed consumer ends up holding
    nothing, and once the churn stops the group is Stable with each partition once."""
    t1, t2 = create_topics(broker.bootstrap, 6, 2)
    group = f"g-{uuid.uuid4().hex[:6]}"
    rng = random.Random(seed)
    everyone: list[Member] = []
    overlaps: list[str] = []
    choices = [[t1], [t2], [t1, t2]]
    for _ in range(4):
        m = Member(broker.bootstrap, group, everyone, overlaps)
        everyone.append(m)
        m.subscribe(rng.choice(choices))
    gone: list[Member] = []
    try:
        for _ in range(24):
            i = rng.randrange(len(everyone))
            m = everyone[i]
            if rng.random() < 0.35:
                m.unsubscribe()
                wait_until(lambda: (poll_all(everyone),
                                    not m.held and not m.assignment())[1],  # noqa: B023
                           SETTLE_S, what="an unsubscribed consumer to hold nothing")
                everyone.remove(m)
                gone.append(m)
                fresh = Member(broker.bootstrap, group, everyone, overlaps)
                everyone.append(fresh)
                fresh.subscribe(rng.choice(choices))
            else:
                m.subscribe(rng.choice([c for c in choices if c != m.subscribed]))
            for _ in range(rng.randrange(4)):
                poll_all(everyone)
        # the churn stops: the group settles with every subscribed partition held once
        wanted = {(t, p) for t in (t1, t2) for p in range(6)
                  if any(t in m.subscribed for m in everyone)}

        def settled() -> bool:
            poll_all(everyone)
            desc = described(broker.bootstrap, group)
            if desc is None or len(desc) != len(everyone):
                return False
            held = [m.held for m in everyone]
            union: Held = set().union(*held)
            return sum(map(len, held)) == len(union) and union == wanted and all(
                desc.get(m.consumer.memberid()) == m.held for m in everyone)

        wait_until(settled, SETTLE_S, what="a stable group with each partition held once")
        for m in everyone:
            m.unsubscribe()
        wait_until(lambda: (poll_all(everyone),
                            all(not m.held and not m.assignment() for m in everyone))[1],
                   SETTLE_S, what="every unsubscribed consumer to hold nothing")
        wait_until(lambda: _group_is_empty(broker.bootstrap, group), SETTLE_S,
                   what="the group to be empty")
        poll_all(everyone)
        assert all(not m.held and not m.assignment() for m in everyone)
        assert not overlaps, overlaps
    finally:
        for m in everyone + gone:
            m.consumer.close()
