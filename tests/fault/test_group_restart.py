"""A classic consumer group across a broker restart (R-GRP-1, R-GRP-6, R-GRP-7, R-LOG-4).

The README: "offsets and group state in ``__consumer_offsets``, so groups and their members
survive a broker restart". A classic-protocol group with one confluent-kafka and one
kafka-python member (auto-commit every 200 ms) consumes a topic; the broker is restarted,
gracefully or with kill -9, while both stay subscribed. What can be asserted exactly:

- the committed offsets read right after the restart are those committed before it (every
  record consumed before the restart had been committed, so each partition's is its end),
  and so are those of a second group with no live member (nobody can commit them again
  after the restart, so only the reloaded ``__consumer_offsets`` can answer them);
- the members rejoin: the group is Stable again with both members sharing all partitions;
- records produced after the restart are all consumed, by the member owning the partition;
- no record is lost, and none is consumed twice: every record before the restart was
  covered by a commit (so none may come again after it), and after the restart the group
  stays stable (no revoke), so at-least-once allows no duplicate there either.

kill -9 keeps the page cache: this tests recovery of group state, not fsync.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.brokerproc import BrokerProcess, wait_until
from tests.clients import create_topic
from tests.group_clients import GroupMember, stop_all, wait_settled

PARTITIONS, PER_PARTITION = 4, 40
pytestmark = pytest.mark.timeout(120)


def produce(bootstrap: str, topic: str, first: int) -> set[tuple[int, int]]:
    """PER_PARTITION records per partition, acks=all; returns their (partition, offset)."""
    from confluent_kafka import Producer

    acked: set[tuple[int, int]] = set()

    def done(err: object, msg: object) -> None:
        assert err is None, err
        acked.add((msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for part in range(PARTITIONS):
        for i in range(first, first + PER_PARTITION):
            p.produce(topic, f"{part}-{i}".encode(), partition=part, on_delivery=done)
    assert p.flush(30) == 0
    assert len(acked) == PARTITIONS * PER_PARTITION
    return acked


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets, read without joining it."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def commit_offsets(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` for ``group`` without joining it (an admin-style commit)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                 asynchronous=False)
    finally:
        c.close()


def described(bootstrap: str, group: str) -> tuple[str, int, str]:
    """(state, number of members, protocol type) from DescribeGroups."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    d = admin.describe_consumer_groups([group])[group].result(10)
    return str(d.state).rsplit(".", 1)[-1], len(d.members), str(d.type).rsplit(".", 1)[-1]


def consumed(members: list[GroupMember]) -> list[tuple[int, int]]:
    return [(p, o) for m in members for p, o, _ in list(m.records)]


@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "kill-9"])
def test_classic_group_survives_a_broker_restart(tmp_path: Path, graceful: bool) -> None:
    """R-GRP-6/7: committed offsets kept, both members back in a Stable group, every record
    consumed once (before: all committed; after: no rebalance)."""
    topic, group = "events", "classic-restart"
    with BrokerProcess(tmp_path / "data", {"group.initial.rebalance.delay.ms": "0"}) as b:
        create_topic("confluent", b.bootstrap, topic, PARTITIONS)
        before = produce(b.bootstrap, topic, 0)
        ends = {p: PER_PARTITION for p in range(PARTITIONS)}
        members = [
            GroupMember("confluent", b.bootstrap, [topic], group, auto_commit=True,
                        extra={"auto.commit.interval.ms": 200,
                               "reconnect.backoff.max.ms": 500}),
            GroupMember("kafka-python", b.bootstrap, [topic], group, auto_commit=True,
                        extra={"auto_commit_interval_ms": 200,
                               "reconnect_backoff_max_ms": 500}),
        ]
        # The confluent member joins first and leads the group. When the kafka-python member
        # joined at the same moment and became leader, it sometimes assigned nothing ("No
        # partition metadata for topic") and stayed "rebalancing" for good: seen against the
        # broker before issue 8 too, left for its own investigation; not what this test is
        # about (a group across a restart).
        members[0].start()
        try:
            wait_until(lambda: members[0].check() or members[0].assignment == set(
                range(PARTITIONS)), 30, what="the first member owning every partition")
            members[1].start()
            wait_settled(members, PARTITIONS, timeout_s=30, stable_for_s=0.5)
            wait_until(lambda: set(consumed(members)) >= before, 30,
                       what="the records produced before the restart")
            wait_until(lambda: committed(b.bootstrap, group, topic) == ends, 20,
                       what="commits at the end of every partition")
            n_before = len(consumed(members))
            witness = {p: 3 + 7 * p for p in range(PARTITIONS)}
            commit_offsets(b.bootstrap, "witness", topic, witness)
            assert committed(b.bootstrap, "witness", topic) == witness

            b.restart(graceful=graceful)
            # read straight from the reloaded __consumer_offsets
            assert committed(b.bootstrap, "witness", topic) == witness
            assert committed(b.bootstrap, group, topic) == ends

            wait_settled(members, PARTITIONS, timeout_s=40, stable_for_s=1.0)
            wait_until(lambda: described(b.bootstrap, group) == ("STABLE", 2, "CLASSIC"), 30,
                       what="a Stable classic group of both members")
            owner = {p: m.client for m in members for p in m.assignment}
            revokes = [m.revokes for m in members]
            assignments = [m.assignment for m in members]

            after = produce(b.bootstrap, topic, PER_PARTITION)
            wait_until(lambda: set(consumed(members)) >= before | after, 30,
                       what="the records produced after the restart")
            wait_until(lambda: committed(b.bootstrap, group, topic)
                       == {p: 2 * PER_PARTITION for p in range(PARTITIONS)}, 20,
                       what="commits at the new end of every partition")
            # no rebalance while the records after the restart were consumed
            assert [m.assignment for m in members] == assignments
            assert [m.revokes for m in members] == revokes
        finally:
            stop_all(members)

        counts = Counter(consumed(members))
        assert set(counts) == before | after, "a record was lost"
        twice = sorted(po for po, n in counts.items() if n > 1)
        assert not twice, f"consumed more than once: {twice[:10]}"
        assert len(consumed(members)) - n_before == len(after)
        # each record after the restart went to the member owning its partition
        for m in members:
            mine = {(p, o) for p, o, _ in m.records if o >= PER_PARTITION}
            assert {p for p, _ in mine} <= {p for p, c in owner.items() if c == m.client}
        assert not [line for line in b.stderr_lines if "Traceback" in line], \
            "".join(b.stderr_lines)
