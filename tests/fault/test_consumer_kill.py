"""Exactly-once results across a kill -9 of the consumer (R-REL-6, R-REL-4), on a real
broker.

``ReliableConsumer`` is at-least-once: after kill -9 its group resumes at the last commit
and re-processes what came after it. The exactly-once helpers must absorb those replays:

- ``IdempotentSqliteSink``: every result row is keyed by its record (topic, partition,
  offset); the worker is killed with records processed past its last commit, so the
  restarted worker processes them again (checked: there ARE replays), and the table still
  holds exactly one row per record with the right value.
- ``SqliteOffsetStore``: a non-idempotent result (a running count and sum, plus one
  ``applied`` row per application) written in the store's transaction with the record's
  processed-mark; group commits are rare (60 s), so the restarted worker starts from the
  store (seek on assign), never below the processed prefix it left; every record is applied
  exactly once and the totals are exact.

Each worker is this module run as a script (``worker``), killed with SIGKILL mid-stream and
started again on the same SQLite file. Waits are bounded polls of files and of the
database, never sleeps. kill -9 keeps the page cache (it tests SQLite's transactions and the
consumer's replay, not fsync).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sqlite3
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.brokerproc import BrokerProcess, wait_until
from tests.workerproc import WorkerProcess

PARTITIONS, PER_PARTITION = 2, 300
pytestmark = pytest.mark.timeout(90)


# ---------------------------------------------------------------------------- the worker


def worker_main(argv: list[str]) -> None:
    from headrace.reliable import (
        IdempotentSqliteSink,
        Item,
        ReliableConsumer,
        SqliteOffsetStore,
        idempotent_key,
    )

    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["sink", "store"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--commits", required=True)
    ap.add_argument("--commit-period-ms", type=int, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(created).6f %(name)s %(message)s")
    out = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    commits = os.open(args.commits, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    store: SqliteOffsetStore | None = None

    if args.mode == "sink":
        sink = IdempotentSqliteSink(sqlite3.connect(args.db, check_same_thread=False),
                                    "results")

        def handle(item: Item, _out: Any) -> None:
            rec = item.source
            os.write(out, f"{rec.partition} {rec.offset}\n".encode())
            time.sleep(0.01)  # the work itself, not a synchronisation
            sink.write(idempotent_key(rec.topic, rec.partition, rec.offset), rec.value)
    else:
        store = SqliteOffsetStore(args.db, args.group)
        with store.conn as setup:
            setup.execute("CREATE TABLE IF NOT EXISTS applied (part INTEGER, off INTEGER)")
            setup.execute("CREATE TABLE IF NOT EXISTS totals (id INTEGER PRIMARY KEY, "
                          "n INTEGER, total INTEGER)")
            setup.execute("INSERT OR IGNORE INTO totals VALUES (0, 0, 0)")
        offset_store = store

        def handle(item: Item, _out: Any) -> None:
            rec = item.source
            os.write(out, f"{rec.partition} {rec.offset}\n".encode())
            time.sleep(0.003)
            with offset_store.transaction(rec.topic, rec.partition, rec.offset) as conn:
                if conn is None:
                    return  # processed before the crash: nothing to do
                conn.execute("INSERT INTO applied VALUES (?, ?)", (rec.partition, rec.offset))
                conn.execute("UPDATE totals SET n = n + 1, total = total + ? WHERE id = 0",
                             (int(rec.value.decode()[1:]),))

    def on_commit(offsets: dict[Any, int]) -> None:
        for tp, offset in offsets.items():
            os.write(commits, f"{tp.partition} {offset}\n".encode())

    rc = ReliableConsumer(
        {"bootstrap.servers": args.bootstrap, "group.id": args.group,
         "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
         "heartbeat.interval.ms": 500},
        [args.topic], handle, concurrency=4, offset_store=store,
        offset_commit_period_ms=args.commit_period_ms, on_commit=on_commit)
    signal.signal(signal.SIGTERM, lambda *_: rc.stop())
    try:
        rc.run()
    finally:
        rc.close(drain_timeout_s=5)


# ---------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("consumer-kill")
    with BrokerProcess(data, {"group.initial.rebalance.delay.ms": "0"}) as b:
        yield b


class Worker(WorkerProcess):
    def __init__(self, mode: str, broker: BrokerProcess, topic: str, group: str, tmp: Path,
                 name: str, commit_period_ms: int) -> None:
        self.out = tmp / f"{name}.out"
        self.commits = tmp / f"{name}.commits"
        super().__init__(
            [sys.executable, "-m", "tests.fault.test_consumer_kill", "worker", mode,
             "--bootstrap", broker.bootstrap, "--topic", topic, "--group", group,
             "--db", str(tmp / "results.sqlite"), "--out", str(self.out),
             "--commits", str(self.commits), "--commit-period-ms", str(commit_period_ms)],
            tmp / f"{name}.log")

    def processed(self) -> list[tuple[int, int]]:
        if not self.out.exists():
            return []
        return [(int(p), int(o)) for p, o in
                (line.split() for line in self.out.read_text().splitlines() if line)]

    def last_commits(self) -> dict[int, int]:
        if not self.commits.exists():
            return {}
        return {int(p): int(o) for p, o in
                (line.split() for line in self.commits.read_text().splitlines() if line)}


def create_and_fill(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    """PER_PARTITION records per partition; value ``v<i>``. Returns (partition, offset) ->
    value as the broker acknowledged them."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(15)
    acked: dict[tuple[int, int], bytes] = {}

    def done(err: Any, msg: Any) -> None:
        assert err is None, err
        acked[(msg.partition(), msg.offset())] = msg.value()

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for i in range(PARTITIONS * PER_PARTITION):
        p.produce(topic, f"v{i}".encode(), partition=i % PARTITIONS, on_delivery=done)
    assert p.flush(30) == 0
    assert len(acked) == PARTITIONS * PER_PARTITION
    return acked


def db_rows(db: Path, query: str) -> list[tuple[Any, ...]]:
    if not db.exists():
        return []
    with sqlite3.connect(db, timeout=5) as conn:
        try:
            return conn.execute(query).fetchall()
        except sqlite3.OperationalError:  # the table is not created yet
            return []


# ---------------------------------------------------------------------------- the tests


def test_idempotent_sink_absorbs_the_replay_after_kill_9(broker: BrokerProcess,
                                                         tmp_path: Path) -> None:
    """R-REL-6 (IdempotentSqliteSink): killed with records processed past its last commit,
    the worker re-processes them after the restart, yet the table holds exactly one row per
    record, with that record's value."""
    topic, group = f"eo-sink-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    acked = create_and_fill(broker.bootstrap, topic)
    first = Worker("sink", broker, topic, group, tmp_path, "first", 300).start()

    def past_last_commit() -> bool:
        # the restart resumes at each partition's last commit (earliest without one): what
        # was processed at or past it is what the restart will process again
        first.alive()
        commits = first.last_commits()
        done = first.processed()
        beyond = [(p, o) for p, o in done if o >= commits.get(p, 0)]
        return bool(commits) and len(beyond) >= 20 and len(done) < len(acked)

    try:
        wait_until(past_last_commit, 30, 0.01,
                   "a commit, and 20 records processed past the commits")
    finally:
        first.kill9()
    committed_at_kill = first.last_commits()
    second = Worker("sink", broker, topic, group, tmp_path, "second", 300).start()
    db = tmp_path / "results.sqlite"
    try:
        wait_until(lambda: second.alive() and db_rows(db, "SELECT count(*) FROM results")
                   [0:1] >= [(len(acked),)], 40, 0.1, "a result row for every record")
    finally:
        second.stop()

    runs = first.processed() + second.processed()
    replays = [po for po, n in Counter(runs).items() if n > 1]
    assert replays, "no record was processed twice: the sink's idempotence went untested"
    # the restart resumed at the last commit: only records at or after it came again
    assert all(o >= committed_at_kill.get(p, 0) for p, o in second.processed())
    want = {f"{topic}/{p}/{o}": v for (p, o), v in acked.items()}
    rows = db_rows(db, "SELECT key, value FROM results")
    assert len(rows) == len(want)
    assert dict(rows) == want


def test_offset_store_applies_each_record_once_across_kill_9(broker: BrokerProcess,
                                                             tmp_path: Path) -> None:
    """R-REL-6 (SqliteOffsetStore): a non-idempotent result (count and sum) committed with
    each record's processed-mark in one transaction is exact after a kill -9 and restart;
    the restarted worker seeks to the store's processed prefix on assign (the group has no
    commit yet), so it never runs a record below that prefix again."""
    topic, group = f"eo-store-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    acked = create_and_fill(broker.bootstrap, topic)
    db = tmp_path / "results.sqlite"
    first = Worker("store", broker, topic, group, tmp_path, "first", 60_000).start()
    try:
        wait_until(lambda: first.alive()
                   and db_rows(db, "SELECT count(*) FROM applied")[0:1] >= [(150,)],
                   30, 0.01, "150 records applied")
    finally:
        first.kill9()
    applied_at_kill = db_rows(db, "SELECT count(*) FROM applied")[0][0]
    assert applied_at_kill < len(acked), "killed too late to be mid-stream"
    assert not first.last_commits(), "the group committed: the seek-on-assign went untested"
    # the processed prefix each partition's restart must start from, read from the marks
    # the transactions left (not computed by the code under test)
    marks = db_rows(db, "SELECT part, off FROM headrace_processed")
    assert sorted(marks) == sorted(db_rows(db, "SELECT part, off FROM applied")), \
        "results and processed-marks disagree: not one transaction"
    prefix = {}
    for p in range(PARTITIONS):
        done = {o for mp, o in marks if mp == p}
        prefix[p] = next(o for o in range(PER_PARTITION + 1) if o not in done)
    assert sum(prefix.values()) > 0

    second = Worker("store", broker, topic, group, tmp_path, "second", 60_000).start()
    try:
        wait_until(lambda: second.alive() and db_rows(db, "SELECT count(*) FROM applied")
                   == [(len(acked),)], 40, 0.1, "every record applied")
    finally:
        second.stop()

    again = second.processed()
    assert again, "the second worker processed nothing"
    for p, o in again:
        assert o >= prefix[p], f"{p}:{o} below the stored prefix {prefix[p]} was run again"
    applied = db_rows(db, "SELECT part, off FROM applied")
    assert sorted(applied) == sorted(acked), "a record applied twice, or never"
    want_sum = sum(int(v.decode()[1:]) for v in acked.values())
    assert db_rows(db, "SELECT n, total FROM totals") == [(len(acked), want_sum)]


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_main(sys.argv[2:])
