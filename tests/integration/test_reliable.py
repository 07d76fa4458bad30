"""ReliableConsumer against a real headrace broker, consumers in real processes (R-REL-4..5).

- kill -9 a consumer mid-stream and start it again: no record is lost;
- a poison record is retried ``max_retries`` times, lands in the dead-letter topic with its
  origin in the headers, and the partition moves on (commits reach the end);
- a second consumer joins mid-flight: no record is lost, and a record is processed twice
  only if no commit covered it before its second processing (it was in flight).

Each consumer process is this module run as a script (``worker``): it appends one line per
processing (``time partition offset value``) and per commit to files, with O_APPEND writes
that survive kill -9. Waits are bounded polls of those files, never sleeps.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.brokerproc import BrokerProcess, wait_until
from tests.inproc import InProcessBroker
from tests.workerproc import WorkerProcess

GROUP_TIMEOUTS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
MAX_UNCOMMITTED = 50
POLL_BATCH = 500


# ---------------------------------------------------------------------------- the worker


def worker_main(argv: list[str]) -> None:
    from headrace.reliable import Item, ReliableConsumer

    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--commits", required=True)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--poison", default=None)
    ap.add_argument("--max-retries", type=int, default=None)
    ap.add_argument("--dlq", default=None)
    ap.add_argument("--max-uncommitted", type=int, default=MAX_UNCOMMITTED)
    ap.add_argument("--poll-batch", type=int, default=POLL_BATCH)
    ap.add_argument("--assignor", default=None)
    ap.add_argument("--group-protocol", default="classic")
    ap.add_argument("--log-when-done", action="store_true",
                    help="write the processing line after the work, just before the ack")
    args = ap.parse_args(argv)
    # time.time() stamps, comparable with the processing and commit logs
    logging.basicConfig(level=logging.INFO, format="%(created).6f %(name)s %(message)s")
    out = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    commits = os.open(args.commits, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def handle(item: Item, _out: Any) -> None:
        rec = item.source
        value = rec.value.decode()
        line = f"{rec.partition} {rec.offset} {value}\n"
        if not args.log_when_done:
            os.write(out, f"{time.time():.6f} {line}".encode())
        if args.delay_ms:
            time.sleep(args.delay_ms / 1000)  # the work itself, not a synchronisation
        if args.log_when_done:
            os.write(out, f"{time.time():.6f} {line}".encode())
        if value == args.poison:
            raise ValueError(f"poison record {value}")

    def on_commit(offsets: dict[Any, int]) -> None:
        for tp, offset in offsets.items():
            os.write(commits, f"{time.time():.6f} {tp.partition} {offset}\n".encode())

    group_conf: dict[str, Any] = (
        {"group.protocol": "consumer"} if args.group_protocol == "consumer" else
        {**GROUP_TIMEOUTS, **({"partition.assignment.strategy": args.assignor}
                              if args.assignor else {})})
    rc = ReliableConsumer(
        {"bootstrap.servers": args.bootstrap, "group.id": args.group,
         "auto.offset.reset": "earliest", **group_conf},
        [args.topic], handle, concurrency=4, max_uncommitted_offsets=args.max_uncommitted,
        poll_batch=args.poll_batch, offset_commit_period_ms=200, max_retries=args.max_retries,
        dead_letter_topic=args.dlq, retry_backoff_ms=20, on_commit=on_commit)
    signal.signal(signal.SIGTERM, lambda *_: rc.stop())
    try:
        rc.run()
    finally:
        rc.close(drain_timeout_s=5)


# ---------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data = tmp_path_factory.mktemp("reliable-broker")
    with InProcessBroker(data, {"group.initial.rebalance.delay.ms": "0"}) as b:
        yield b


class Worker(WorkerProcess):
    def __init__(self, broker: BrokerProcess, topic: str, group: str, tmp: Path, name: str,
                 *extra: str) -> None:
        self.out = tmp / f"{name}.out"
        self.commits = tmp / f"{name}.commits"
        super().__init__(
            [sys.executable, "-m", "tests.integration.test_reliable", "worker",
             "--bootstrap", broker.bootstrap, "--topic", topic, "--group", group,
             "--out", str(self.out), "--commits", str(self.commits), *extra],
            tmp / f"{name}.log")

    def revokes(self) -> list[tuple[float, set[int]]]:
        """(time, partitions) of every revoke this worker logged."""
        out = []
        for line in self.log_text().splitlines():
            m = re.match(r"(\d+\.\d+) headrace\.reliable revoked \[(.*?)\]", line)
            if m:
                out.append((float(m.group(1)),
                            {int(p) for p in re.findall(r", (\d+)\)", m.group(2))}))
        return out

    def processed(self) -> list[tuple[float, int, int, str]]:
        if not self.out.exists():
            return []
        rows = []
        for line in self.out.read_text().splitlines():
            parts = line.split(" ", 3)
            if len(parts) == 4:
                rows.append((float(parts[0]), int(parts[1]), int(parts[2]), parts[3]))
        return rows

    def commit_log(self) -> list[tuple[float, int, int]]:
        if not self.commits.exists():
            return []
        return [(float(t), int(p), int(o)) for t, p, o in
                (line.split() for line in self.commits.read_text().splitlines() if line)]


def create_and_fill(bootstrap: str, topic: str, partitions: int, values: list[str]) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    fill(bootstrap, topic, partitions, values)


def fill(bootstrap: str, topic: str, partitions: int, values: list[str], start: int = 0) -> None:
    """Produce ``values``; value i (counting from ``start``) goes to partition i % partitions."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, v in enumerate(values, start):
        p.produce(topic, v.encode(), partition=i % partitions)
    assert p.flush(30) == 0


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def expected(values: list[str], partitions: int) -> set[tuple[int, int]]:
    per: Counter[int] = Counter()
    out = set()
    for i in range(len(values)):
        p = i % partitions
        out.add((p, per[p]))
        per[p] += 1
    return out


# ---------------------------------------------------------------------------- the tests


@pytest.mark.slow
def test_kill_9_mid_stream_and_restart_loses_nothing(group_broker: BrokerProcess,
                                                     tmp_path: Path) -> None:
    """R-REL-4, R-REL-5: after kill -9 of the consumer process, its successor processes
    every record; it resumes at the last commit (nothing committed comes again) and replays
    per partition at most ``max_uncommitted_offsets + poll_batch - 1`` records, all the
    contract lets be processed and uncommitted."""
    topic, group = f"rel-kill-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    values = [f"v{i}" for i in range(400)]
    create_and_fill(group_broker.bootstrap, topic, 2, values)
    max_uncommitted, poll_batch = 10, 10
    limits = ("--max-uncommitted", str(max_uncommitted), "--poll-batch", str(poll_batch))
    first = Worker(group_broker, topic, group, tmp_path, "first", "--delay-ms", "5",
                   *limits).start()
    try:
        wait_until(lambda: len(first.processed()) >= 120, 30, 0.05, "first worker progress")
        wait_until(lambda: first.commit_log(), 10, 0.05, "a first commit")
    finally:
        first.kill9()
    before = {(p, o) for _, p, o, _ in first.processed()}
    assert len(before) < len(values), "killed too late to be mid-stream"
    second = Worker(group_broker, topic, group, tmp_path, "second", *limits).start()
    try:
        want = expected(values, 2)
        wait_until(lambda: want <= before | {(p, o) for _, p, o, _ in second.processed()},
                   40, 0.1, "every record processed after the restart")
        wait_until(lambda: committed(group_broker.bootstrap, group, topic, 2) == {0: 200, 1: 200},
                   20, 0.2, "commits at the end of both partitions")
    finally:
        second.stop()
    # the restart resumed from the last commit, not from the beginning
    last_commit = {p: o for _, p, o in first.commit_log()}
    again = {(p, o) for _, p, o, _ in second.processed()}
    for p, o in again:
        assert o >= last_commit.get(p, 0), f"{p}:{o} was committed, yet processed again"
    # and re-processed at most what the contract leaves uncommitted per partition:
    # max_uncommitted_offsets + one poll - 1
    replayed = Counter(p for p, o in again & before)
    for p, n in replayed.items():
        assert n <= max_uncommitted + poll_batch - 1, (p, n)


def test_poison_record_goes_to_the_dead_letter_topic(group_broker: BrokerProcess,
                                                     tmp_path: Path) -> None:
    from tests.clients import consume

    topic, group = f"rel-poison-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    dlq = f"{topic}-dlq"
    values = [f"v{i}" for i in range(30)]
    values[7] = "poison"
    create_and_fill(group_broker.bootstrap, topic, 1, values)
    w = Worker(group_broker, topic, group, tmp_path, "w", "--poison", "poison",
               "--max-retries", "2", "--dlq", dlq).start()
    try:
        wait_until(lambda: committed(group_broker.bootstrap, group, topic, 1) == {0: 30},
                   40, 0.2, "the partition committed past the poison record")
        dead = consume("confluent", group_broker.bootstrap, dlq, [0], 1, timeout_s=15)
    finally:
        w.stop()
    assert len(dead) == 1 and dead[0].value == b"poison"
    headers = dict(dead[0].headers)
    assert headers["headrace.original.topic"] == topic.encode()
    assert headers["headrace.original.partition"] == b"0"
    assert headers["headrace.original.offset"] == b"7"
    assert headers["headrace.attempts"] == b"3"
    assert b"ValueError: poison record poison" in headers["headrace.error"]
    attempts = Counter(o for _, _, o, _ in w.processed())
    assert attempts[7] == 3  # the first try and max_retries=2 retries
    assert set(attempts) == set(range(30))
    assert all(n == 1 for o, n in attempts.items() if o != 7)  # 8.. not re-processed


@pytest.mark.slow
def test_rebalance_mid_flight_loses_nothing(group_broker: BrokerProcess,
                                            tmp_path: Path) -> None:
    """R-REL-4, R-REL-5: a second consumer joins mid-flight. No record is lost; a record is
    processed twice only if no commit covered it before its second processing; and the
    duplicates of a partition are bounded by what the contract lets be uncommitted: each
    revoke of the partition can replay at most the previous owner's uncommitted offsets,
    ``max_uncommitted_offsets + poll_batch - 1`` (the pause is soft by one poll, as in
    Storm's KafkaSpout)."""
    max_uncommitted, poll_batch = 10, 10
    bound_per_revoke = max_uncommitted + poll_batch - 1
    topic, group = f"rel-rebal-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    values = [f"v{i}" for i in range(800)]
    create_and_fill(group_broker.bootstrap, topic, 4, values[:400])
    limits = ("--max-uncommitted", str(max_uncommitted), "--poll-batch", str(poll_batch))
    a = Worker(group_broker, topic, group, tmp_path, "a", "--delay-ms", "40", *limits).start()
    b = Worker(group_broker, topic, group, tmp_path, "b", "--delay-ms", "40", *limits)
    try:
        wait_until(lambda: len(a.processed()) >= 40, 30, 0.05, "worker a progress")
        b.start()
        wait_until(lambda: "assigned" in b.log_text(), 30, 0.05, "b joining the group")
        in_flight_at_join = 400 - len(a.processed())
        fill(group_broker.bootstrap, topic, 4, values[400:], start=400)
        want = expected(values, 4)
        wait_until(lambda: want <= {(p, o) for _, p, o, _ in a.processed() + b.processed()},
                   60, 0.1, "every record processed by a or b")
        wait_until(lambda: committed(group_broker.bootstrap, group, topic, 4)
                   == {p: 200 for p in range(4)}, 20, 0.2, "commits at the end")
    finally:
        a.stop()
        b.stop()
    assert in_flight_at_join > 0, "a finished before b joined: nothing was in flight"
    assert b.processed(), "b never got a partition: no rebalance happened"
    assert "revoked" in a.log_text()
    rows = sorted(a.processed() + b.processed())
    assert {(p, o) for _, p, o, _ in rows} == want  # nothing else was processed
    commits = sorted(a.commit_log() + b.commit_log())
    seen: set[tuple[int, int]] = set()
    duplicates: Counter[int] = Counter()
    for t, p, o, _ in rows:
        if (p, o) in seen:
            duplicates[p] += 1
            covered = [c for ct, cp, c in commits if cp == p and ct < t and c > o]
            assert not covered, f"{p}:{o} processed again after a commit {covered[0]} covered it"
        seen.add((p, o))
    revokes = a.revokes() + b.revokes()
    last_processing = {p: max(t for t, rp, _, _ in rows if rp == p) for p in range(4)}
    for p in range(4):
        # only a revoke before the partition's last processing can have caused a replay
        n = sum(1 for t, parts in revokes if p in parts and t < last_processing[p])
        assert duplicates[p] <= n * bound_per_revoke, (
            f"partition {p}: {duplicates[p]} duplicates after {n} revokes, more than "
            f"{bound_per_revoke} per revoke")
    print(f"rebalance: {in_flight_at_join} left for a at b's join, {dict(duplicates)} "
          f"duplicates per partition, {len(revokes)} revokes, a {len(a.processed())} / "
          f"b {len(b.processed())} processings")


@pytest.mark.parametrize("protocol", ["cooperative-sticky", "kip848"])
@pytest.mark.slow
def test_cooperative_rebalance_in_flight_commits_only_acked_and_keeps_the_rest(
        group_broker: BrokerProcess, tmp_path: Path, protocol: str) -> None:
    """Issue 14: a rebalance with cooperative-sticky (and KIP-848's consumer protocol) while
    records are in flight. Only some of a's partitions are revoked; a keeps processing the
    others through the rebalance and never processes one of their records twice; no commit
    ever passes an offset that was not done (the processing line is written when the work
    is done, before the ack); a record is processed again only if no commit covered it."""
    extra = (("--assignor", "cooperative-sticky") if protocol == "cooperative-sticky" else
             ("--group-protocol", "consumer"))
    topic, group = f"rel-coop-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    values = [f"v{i}" for i in range(1200)]
    create_and_fill(group_broker.bootstrap, topic, 4, values)
    opts = ("--delay-ms", "20", "--max-uncommitted", "20", "--poll-batch", "10",
            "--log-when-done", *extra)
    a = Worker(group_broker, topic, group, tmp_path, "a", *opts).start()
    b = Worker(group_broker, topic, group, tmp_path, "b", *opts)
    try:
        wait_until(lambda: len(a.processed()) >= 40, 30, 0.05, "worker a progress")
        b.start()
        wait_until(lambda: "assigned" in b.log_text() and b.processed(), 60, 0.05,
                   "b processing")
        in_flight_at_join = 1200 - len(a.processed())
        want = expected(values, 4)
        wait_until(lambda: want <= {(p, o) for _, p, o, _ in a.processed() + b.processed()},
                   90, 0.1, "every record processed by a or b")
        wait_until(lambda: committed(group_broker.bootstrap, group, topic, 4)
                   == {p: 300 for p in range(4)}, 30, 0.2, "commits at the end")
        end = time.time()  # the revokes of a.stop() come after
    finally:
        a.stop()
        b.stop()
    assert in_flight_at_join > 0, "a finished before b joined: nothing was in flight"
    revoked: set[int] = set()
    for t, parts in a.revokes():
        if t < end:
            revoked |= parts
    assert revoked, "a gave nothing to b: no rebalance happened"
    kept = set(range(4)) - revoked
    assert kept, f"a's partitions were all revoked ({revoked}): not an incremental rebalance"
    b_start = min(t for t, _, _, _ in b.processed())
    a_last = max(t for t, p, _, _ in a.processed() if p in kept)
    assert a_last > b_start, (
        f"a did not keep processing {kept} through the rebalance: last at {a_last}, b's "
        f"first at {b_start}, revokes {a.revokes()}")
    rows = sorted(a.processed() + b.processed())
    done_at: dict[tuple[int, int], float] = {}
    for t, p, o, _ in rows:
        done_at.setdefault((p, o), t)
    commits = sorted(a.commit_log() + b.commit_log())
    for ct, cp, c in commits:  # nothing committed past an offset not done
        late = [o for o in range(c) if done_at.get((cp, o), float("inf")) > ct]
        assert not late, f"commit {c} on {cp} at {ct} passes {late[:5]}, not done by then"
    seen: set[tuple[int, int]] = set()
    for t, p, o, _ in rows:
        if (p, o) in seen:
            assert p not in kept, f"{p}:{o} processed twice on a partition a kept"
            covered = [c for ct, cp, c in commits if cp == p and ct < t and c > o]
            assert not covered, f"{p}:{o} processed again after commit {covered[0]} covered it"
        seen.add((p, o))
    print(f"{protocol}: revoked {revoked}, kept {kept}, "
          f"{len(rows) - len(seen)} re-processed of {len(seen)}")


@pytest.mark.parametrize("kind", ["batch", "async", "batch-inline", "async-inline",
                                  "basic-inline", "basic-emit"])
def test_batch_and_async_bolts_retry_a_failed_record_and_commit_to_the_end(
        group_broker: BrokerProcess, kind: str) -> None:
    """Issue 14: a batch bolt fails one record of its batch (``batch.fail``), an async bolt
    raises for it; a basic bolt emits each record to a second stage that raises for it
    (the root's tree grows from an item the lane made without registering it); that record
    alone is retried, every record is done, commits reach the end. ``-inline``: the first
    stage runs on the polling thread (``parallelism=0``)."""
    import asyncio

    from headrace.reliable import Batch, Item, ReliableConsumer, Topology

    topic, group = f"rel-{kind}-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    values = [f"v{i}" for i in range(300)]
    create_and_fill(group_broker.bootstrap, topic, 2, values)
    seen: Counter[str] = Counter()

    def on_batch(batch: Batch) -> None:
        for i, value in enumerate(batch.values()):
            v = (value or b"").decode()
            seen[v] += 1
            if v == "v7" and seen[v] == 1:
                batch.fail(i, "first attempt fails")

    async def on_item(item: Item, _out: Any) -> None:
        await asyncio.sleep(0)
        v = item.source.value.decode()
        seen[v] += 1
        if v == "v7" and seen[v] == 1:
            raise ValueError("first attempt fails")

    def split(item: Item, out: Any) -> None:
        out.emit((item.source.value.decode(),))

    def sink(item: Item, _out: Any) -> None:
        v = item.values[0]
        seen[v] += 1
        if v == "v7" and seen[v] == 1:
            raise ValueError("first attempt fails")

    lanes = 0 if kind.endswith("-inline") else 2
    if kind.startswith("batch"):
        topology = Topology().batch_bolt("b", on_batch, lanes)
    elif kind.startswith("async"):
        topology = Topology().async_bolt("a", on_item, lanes, concurrency=8)
    else:
        topology = Topology().basic_bolt("split", split, lanes).basic_bolt("sink", sink, 2)
    rc = ReliableConsumer({"bootstrap.servers": group_broker.bootstrap, "group.id": group,
                           "auto.offset.reset": "earliest", **GROUP_TIMEOUTS}, [topic],
                          topology, offset_commit_period_ms=50, retry_backoff_ms=10)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                set(values) <= set(seen) and rc.spout.committable() == {}
                and rc.spout.num_pending_roots == 0 and seen["v7"] == 2):
            rc.poll_once()
    finally:
        rc.close()
    assert set(seen) == set(values)
    assert seen["v7"] == 2 and all(n == 1 for v, n in seen.items() if v != "v7"), seen
    assert committed(group_broker.bootstrap, group, topic, 2) == {0: 150, 1: 150}


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_main(sys.argv[2:])
