"""ReliableConsumer in share mode (``share=True``) against an in-process broker, the
consumers in real processes (issue 25 item 5).

- 2 and 4 consumers on a 1-partition topic process every record, each of them some, and
  the group has nothing left to deliver afterwards (every record was ACCEPTed);
- a failing bolt gets its record redelivered with a higher delivery count; after
  ``max_retries`` it lands in the dead-letter topic (headers: origin, error, attempts)
  and is never delivered again (REJECTed);
- a consumer lost while holding records: another consumer processes them — at once after
  kill -9 (the broker releases a closed connection's records, as Kafka does), after their
  acquisition lock (``group.share.record.lock.duration.ms``) expires when it is SIGSTOPped
  (its connection still open), as their second delivery.

Each consumer process is this module run as a script (``worker``): it appends one line per
processing start (``time pid offset delivery_count value``) with O_APPEND writes that
survive kill -9. Waits are bounded polls of those files, never sleeps.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.inproc import InProcessBroker
from tests.workerproc import WorkerProcess

LOCK_MS = 1500
BROKER_CONFIG = {
    "group.share.record.lock.duration.ms": str(LOCK_MS),
    "group.share.min.record.lock.duration.ms": "1000",
    "group.share.heartbeat.interval.ms": "500",
    "group.share.min.heartbeat.interval.ms": "500",
    "group.initial.rebalance.delay.ms": "0",  # the dead-letter topic's plain readers
}


# ---------------------------------------------------------------------------- the worker


def worker_main(argv: list[str]) -> None:
    from headrace.reliable import Item, ReliableConsumer

    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--poison", default=None)
    ap.add_argument("--max-retries", type=int, default=None)
    ap.add_argument("--dlq", default=None)
    ap.add_argument("--poll-batch", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=1)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(created).6f %(name)s %(message)s")
    out = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()

    def handle(item: Item, _out: Any) -> None:
        rec = item.source
        value = rec.value.decode()
        os.write(out, f"{time.time():.6f} {pid} {rec.offset} {rec.delivery_count} "
                      f"{value}\n".encode())
        if args.delay_ms:
            time.sleep(args.delay_ms / 1000)  # the work itself, not a synchronisation
        if value == args.poison:
            raise ValueError(f"poison record {value}")

    rc = ReliableConsumer(
        {"bootstrap.servers": args.bootstrap, "group.id": args.group}, [args.topic],
        handle, share=True, concurrency=args.concurrency, poll_batch=args.poll_batch,
        max_retries=args.max_retries, dead_letter_topic=args.dlq)
    signal.signal(signal.SIGTERM, lambda *_: rc.stop())
    try:
        rc.run()
    finally:
        rc.close(drain_timeout_s=5)


# ---------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("reliable-share"), BROKER_CONFIG) as b:
        yield b


class Worker(WorkerProcess):
    def __init__(self, broker: InProcessBroker, topic: str, group: str, tmp: Path,
                 name: str, *extra: str) -> None:
        self.out = tmp / f"{name}.out"
        super().__init__(
            [sys.executable, "-m", "tests.integration.test_reliable_share", "worker",
             "--bootstrap", broker.bootstrap, "--topic", topic, "--group", group,
             "--out", str(self.out), *extra],
            tmp / f"{name}.log")

    def processed(self) -> list[tuple[float, int, int, int, str]]:
        """(time, pid, offset, delivery_count, value) per processing started."""
        if not self.out.exists():
            return []
        rows = []
        for line in self.out.read_text().splitlines():
            parts = line.split(" ", 4)
            if len(parts) == 5:
                rows.append((float(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]),
                             parts[4]))
        return rows


def wait_for(what: str, check: Callable[[], bool], timeout_s: float,
             workers: list[Worker]) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        for w in workers:
            if w.proc is not None and w.proc.returncode is None:
                w.alive()
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {w.log}\n{w.log_text()[-3000:]}" for w in workers)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.05)  # a poll interval between checks of the files, not a sync


def setup_share_topic(broker: InProcessBroker, values: list[str]) -> tuple[str, str]:
    """A 1-partition topic holding ``values`` (one batch each, so that members acquire
    records, not whole batches) and a share group reading it from the start."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    topic, group = f"rs-{uuid.uuid4().hex[:8]}", f"rsg-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for v in values:
        p.produce(topic, v.encode(), partition=0)
        p.poll(0)
        p.flush(10)
    return topic, group


def share_records_left(broker: InProcessBroker, group: str, topic: str,
                       within_s: float) -> list[tuple[int, int]]:
    """(offset, delivery_count) of what a plain share consumer of ``group`` receives
    within ``within_s`` (accepting it all)."""
    from confluent_kafka import ShareConsumer

    c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    got: list[tuple[int, int]] = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            for m in c.poll(0.2):
                if m.error() is None:
                    got.append((m.offset(), m.delivery_count()))
    finally:
        c.close()
    return got


def read_topic(broker: InProcessBroker, topic: str, n: int, timeout_s: float) -> list[Any]:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": uuid.uuid4().hex,
                  "auto.offset.reset": "earliest"})
    out: list[Any] = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                out.append(m)
    finally:
        c.close()
    return out


# ---------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("members", [2, 4])
def test_share_consumers_on_one_partition_process_every_record_spread_over_all(
        broker: InProcessBroker, tmp_path: Path, members: int) -> None:
    values = [f"v{i}" for i in range(30 * members)]
    topic, group = setup_share_topic(broker, values)
    workers = [Worker(broker, topic, group, tmp_path, f"w{k}", "--delay-ms", "30",
                      "--poll-batch", "3").start() for k in range(members)]
    try:
        def seen() -> Counter[str]:
            return Counter(row[4] for w in workers for row in w.processed())

        wait_for("every record processed", lambda: set(seen()) == set(values), 90, workers)
        per_worker = [len(w.processed()) for w in workers]
        assert all(n > 0 for n in per_worker), per_worker  # one partition, all members work
        pids = {row[1] for w in workers for row in w.processed()}
        assert len(pids) == members
    finally:
        for w in workers:
            w.stop()
    # every record was ACCEPTed: the group has nothing left to deliver
    assert share_records_left(broker, group, topic, LOCK_MS / 1000 + 2) == []
    twice = {v: n for v, n in seen().items() if n > 1}
    for w in workers:
        assert "Traceback" not in w.log_text(), w.log_text()
    # a record runs twice only if it was redelivered (a higher delivery count)
    redelivered = {row[4] for w in workers for row in w.processed() if row[3] > 1}
    assert set(twice) <= redelivered


def test_a_failing_record_is_redelivered_then_dead_lettered_and_never_delivered_again(
        broker: InProcessBroker, tmp_path: Path) -> None:
    values = [f"v{i}" for i in range(10)]
    topic, group = setup_share_topic(broker, values)
    dlq = f"{topic}-dlq"
    workers = [Worker(broker, topic, group, tmp_path, f"w{k}", "--poison", "v3",
                      "--max-retries", "2", "--dlq", dlq).start() for k in range(2)]
    try:
        def rows() -> list[tuple[float, int, int, int, str]]:
            return sorted((r for w in workers for r in w.processed()), key=lambda r: r[0])

        wait_for("every record processed", lambda: {r[4] for r in rows()} == set(values),
                 60, workers)
        dead = read_topic(broker, dlq, 1, 30)
        assert len(dead) == 1
        headers = dict(dead[0].headers())
        assert dead[0].value() == b"v3"
        assert headers["headrace.original.offset"] == b"3"
        assert headers["headrace.attempts"] == b"3"
        assert headers["headrace.error"].startswith(b"ValueError: poison record v3")
    finally:
        for w in workers:
            w.stop()
    poison = [r for r in rows() if r[4] == "v3"]
    assert [r[3] for r in poison] == [1, 2, 3]  # delivery counts: 1 + max_retries runs
    assert all(n == 1 for v, n in Counter(r[4] for r in rows()).items() if v != "v3")
    # REJECTed (and the rest ACCEPTed): nothing is delivered again
    assert share_records_left(broker, group, topic, LOCK_MS / 1000 + 2) == []
    assert len(read_topic(broker, dlq, 2, 5)) == 1


@pytest.mark.parametrize("how", ["kill9", "sigstop"])
def test_a_member_lost_holding_records_hands_them_to_another(
        broker: InProcessBroker, tmp_path: Path, how: str) -> None:
    """kill -9: the broker sees the connection close and releases the member's records at
    once, with their delivery count put back (Kafka 4.1's ConnectionDisconnectListener
    closing the share session; SharePartition.releaseAcquiredRecords). SIGSTOP (alive,
    connection open, silent, as behind a network partition): they go to another member
    once their acquisition lock expires, as their second delivery
    (releaseAcquisitionLockOnTimeout)."""
    values = [f"v{i}" for i in range(12)]
    topic, group = setup_share_topic(broker, values)
    # the victim acquires up to 4 records and starts them all (4 lanes), each taking 60 s
    victim = Worker(broker, topic, group, tmp_path, "victim", "--delay-ms", "60000",
                    "--poll-batch", "4", "--concurrency", "4").start()
    workers = [victim]
    try:
        wait_for("the victim holding records", lambda: len(victim.processed()) >= 1, 60,
                 workers)
        if how == "kill9":
            victim.kill9()
        else:
            victim.pause()
        workers = []
        held = {r[4] for r in victim.processed()}  # what it started, and holds
        acquired_at = min(r[0] for r in victim.processed())
        heir = Worker(broker, topic, group, tmp_path, "heir").start()
        workers = [heir]
        wait_for("every record processed by the heir",
                 lambda: {r[4] for r in heir.processed()} == set(values), 60, workers)
    finally:
        for w in workers:
            w.stop()
        if how == "sigstop":
            victim.kill9()
    assert held and held <= set(values)
    first = {r[4]: r for r in reversed(heir.processed())}  # each value's first run
    for v in held:
        t, _pid, _offset, count, _ = first[v]
        if how == "kill9":
            assert count == 1, (v, count)  # released as never delivered
        else:
            assert count == 2, (v, count)  # redelivered after the lock
            assert t >= acquired_at + LOCK_MS / 1000 - 0.1, (v, t - acquired_at)
    for v in set(values) - held:
        assert first[v][3] == 1
    assert share_records_left(broker, group, topic, LOCK_MS / 1000 + 2) == []


def test_the_readme_share_example_prints_every_record_once(broker: InProcessBroker) -> None:
    """The README's share-mode block, pasted into python against this broker: it sets its
    group to read from the start and prints every record of ``greetings`` once, as its
    first delivery; afterwards the group has nothing left to deliver."""
    import subprocess

    from tests.readme import readme_block

    values = [f"hello {i}" for i in range(8)]
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("greetings", 1, 1)])["greetings"].result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for v in values:
        p.produce("greetings", v.encode())
        p.flush(10)
    block = readme_block("reliable-share-example").replace("127.0.0.1:9092",
                                                            broker.bootstrap)
    r = subprocess.run([sys.executable, "-"], input=block, capture_output=True, text=True,
                       timeout=90, check=False, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert lines == sorted(f"0 {i} 1 {v.encode()!r}" for i, v in enumerate(values)), r.stdout
    assert share_records_left(broker, "reliable-sharers", "greetings", LOCK_MS / 1000 + 1) == []


def test_partition_only_options_are_refused_in_share_mode() -> None:
    from headrace.reliable import ReliableConfigError, ReliableConsumer

    for option in ({"max_uncommitted_offsets": 10}, {"offset_commit_period_ms": 10},
                   {"retry_backoff_ms": 5}, {"retry_backoff_max_ms": 5},
                   {"on_commit": print}):
        with pytest.raises(ReliableConfigError, match=next(iter(option))):
            ReliableConsumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, ["t"],
                             lambda _i, _o: None, share=True, **option)  # type: ignore[arg-type]


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    worker_main(sys.argv[2:])
