"""Share groups with real clients (KIP-932, issue 25): confluent-kafka's ``ShareConsumer``
against an in-process broker (the consumer killed with -9 is a process of its own).

- two, then five consumers on a one-partition topic: every record delivered, each accepted
  exactly once (implicit acknowledgement), the work spread over all of them;
- explicit acknowledgement: RELEASE redelivers with a higher delivery count, REJECT never
  again, and a record released ``group.share.delivery.count.limit`` times is archived;
- a consumer killed with -9 holding acquired records: another gets them, none lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kio.schema.errors import ErrorCode

from headrace.broker.share_persister import ReadStateResult, StateKey
from tests.inproc import InProcessBroker

LOCK_MS = 2000
OVERRIDES = {
    "group.share.record.lock.duration.ms": str(LOCK_MS),
    "group.share.min.record.lock.duration.ms": "1000",
    "group.share.heartbeat.interval.ms": "500",
    "group.share.min.heartbeat.interval.ms": "500",
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("sharec"), OVERRIDES) as b:
        yield b


def setup_topic(broker: InProcessBroker, topic: str, group: str, records: int,
                per_batch: int = 10) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    # the group reads from the start (share.auto.offset.reset, a group config)
    res = admin.incremental_alter_configs([ConfigResource(
        ResourceType.GROUP, group, incremental_configs=[ConfigEntry(
            "share.auto.offset.reset", "earliest",
            incremental_operation=AlterConfigOpType.SET)])])
    for fut in res.values():
        fut.result(10)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(records):
        p.produce(topic, f"{i}".encode(), partition=0)
        if (i + 1) % per_batch == 0:
            p.flush(10)  # batches of per_batch records: acquisition goes by batches
    p.flush(10)
    del p


def consumer(broker: InProcessBroker, group: str, **extra: Any) -> ShareConsumer:
    c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                       "max.poll.records": 10, **{k.replace("_", "."): v
                                                  for k, v in extra.items()}})
    return c


def read_state(broker: InProcessBroker, group: str, topic: str) -> ReadStateResult:
    tid = broker.call(lambda b: b.metadata.topic(topic)).topic_id
    key = StateKey(group, tid, 0)

    async def read(b: Any) -> Any:
        return (await b.share_persister.read_state([key], -1))[key]
    return broker.acall(read)


@pytest.mark.parametrize("n", [2, 5])
def test_consumers_share_one_partition(broker: InProcessBroker, topic_name: str,
                                       n: int) -> None:
    at_least, group = 300, f"sg-{n}"
    setup_topic(broker, topic_name, group, 0)
    got: list[list[int]] = [[] for _ in range(n)]
    produced = [0]  # records written so far (the producer goes on until all have some)
    written = threading.Event()  # the producer is done: produced[0] is final
    done = threading.Event()
    errors: list[str] = []

    def run(i: int) -> None:
        c = consumer(broker, group)
        c.subscribe([topic_name])
        try:
            while not done.is_set():
                for m in c.poll(0.5) or []:
                    if m.error():
                        errors.append(str(m.error()))
                        continue
                    got[i].append(int(m.value()))
                if written.is_set() and sum(len(g) for g in got) >= produced[0]:
                    done.set()
                time.sleep(0.05)  # work: the others fetch meanwhile
            c.commit_sync()  # implicit mode: accepts the last poll's records (close
        finally:              # alone releases them: librdkafka 2.16)
            c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    # every member in, with the partition assigned (the simple assignor shares it) ...
    deadline = time.monotonic() + 30
    while assigned_members(broker, group) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert assigned_members(broker, group) == n
    # ... then the records, in batches of 10 as a steady producer would send them, at
    # least 300 and until every member has had some: no member is left without work while
    # records keep coming. (A fixed 300 left one of five with none on a loaded machine,
    # loaded CI run 123: [100, 90, 10, 0, 100]; librdkafka fetches ahead of max.poll.records,
    # so a member that was between fetches while the others took 100 each can miss a short
    # run altogether.)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    deadline = time.monotonic() + 60
    while ((produced[0] < at_least or not all(got))
           and time.monotonic() < deadline):
        for _ in range(10):
            p.produce(topic_name, f"{produced[0]}".encode(), partition=0)
            produced[0] += 1
        p.flush(10)
        time.sleep(0.02)
    records = produced[0]
    written.set()
    done.wait(60)
    done.set()
    for t in threads:
        t.join(30)
    everything = [v for g in got for v in g]
    assert not errors
    assert sorted(everything) == list(range(records))  # every record, none twice
    assert all(g for g in got), [len(g) for g in got]  # spread over every consumer
    # everything accepted: the share-partition's start offset moved past the last record
    deadline = time.monotonic() + 10
    state = read_state(broker, group, topic_name)
    while state.start_offset < records and time.monotonic() < deadline:
        time.sleep(0.1)
        state = read_state(broker, group, topic_name)
    assert state.error == ErrorCode.none and state.start_offset == records


def assigned_members(broker: InProcessBroker, group: str) -> int:
    def count(b: Any) -> int:
        g = b.groups.coordinator.groups.get(group)
        return 0 if g is None else sum(1 for m in g.members.values() if m.assigned)
    return int(broker.call(count))


def poll_until(c: ShareConsumer, want: int, timeout_s: float = 20) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        out += [m for m in c.poll(0.5) or [] if not m.error()]
    return out


def test_explicit_release_reject_and_the_delivery_limit(broker: InProcessBroker,
                                                         topic_name: str) -> None:
    group = "sg-explicit"
    setup_topic(broker, topic_name, group, 3, per_batch=1)
    c = consumer(broker, group, share_acknowledgement_mode="explicit")
    c.subscribe([topic_name])
    try:
        first = poll_until(c, 3)
        assert sorted(int(m.value()) for m in first) == [0, 1, 2]
        assert {m.delivery_count() for m in first} == {1}
        kinds = {0: AcknowledgeType.RELEASE, 1: AcknowledgeType.REJECT,
                 2: AcknowledgeType.ACCEPT}
        for m in first:
            c.acknowledge(m, kinds[int(m.value())])
        c.commit_sync()
        seen = {1: 1}
        for delivery in range(2, 6):  # record 0 comes back each time it is released
            again = poll_until(c, 1)
            assert [(int(m.value()), m.delivery_count()) for m in again] == [(0, delivery)]
            seen[delivery] = 1
            c.acknowledge(again[0], AcknowledgeType.RELEASE)
            c.commit_sync()
        # released at group.share.delivery.count.limit (5): archived; 1 was rejected
        assert poll_until(c, 1, timeout_s=3) == []
    finally:
        c.close()


CHILD = """
import os, sys, time
from confluent_kafka import ShareConsumer
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                   "share.acknowledgement.mode": "explicit", "max.poll.records": 10})
c.subscribe([sys.argv[3]])
held = []
while not held:
    held = [m for m in c.poll(0.5) or [] if not m.error()]
print(" ".join(m.value().decode() for m in held), flush=True)
time.sleep(600)
"""


def test_a_killed_consumers_records_go_to_another(broker: InProcessBroker,
                                                   topic_name: str) -> None:
    group = "sg-kill"
    setup_topic(broker, topic_name, group, 20)
    child = subprocess.Popen([sys.executable, "-c", CHILD, broker.bootstrap, group,
                              topic_name], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert child.stdout is not None
        held = [int(v) for v in child.stdout.readline().split()]
        assert held, "the child acquired nothing"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    c = consumer(broker, group)
    c.subscribe([topic_name])
    try:
        start = time.monotonic()
        got = [int(m.value()) for m in poll_until(c, 20)]
        assert sorted(got) == list(range(20))  # the held ones included: nothing lost
        # released when its connection closed, or at the latest after the lock
        assert time.monotonic() - start < LOCK_MS / 1000 + 10
    finally:
        c.close()


def test_the_readme_share_consumer_example(broker: InProcessBroker) -> None:
    """The README's ShareConsumer block, as written, against this broker: it reads the
    topic's records from the start."""
    import contextlib
    import io

    from tests.readme import readme_block

    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(3):
        p.produce("greetings", f"hello {i}".encode(), partition=0)
    p.flush(10)
    code = readme_block("share-consumer").replace("127.0.0.1:9092", broker.bootstrap)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    printed = out.getvalue()
    for i in range(3):
        assert f"b'hello {i}'" in printed


def _group_config(broker: InProcessBroker, group: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = admin.incremental_alter_configs([ConfigResource(
        ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs.items()])])
    for fut in res.values():
        fut.result(10)


def test_read_committed_share_groups_skip_aborted_and_open_transactions(
        broker: InProcessBroker, topic_name: str) -> None:
    """share.isolation.level=read_committed: records of an aborted transaction are never
    delivered; an open transaction's records wait for its commit (the last stable offset)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    group = "sg-rc"
    _group_config(broker, group, share_auto_offset_reset="earliest",
                  share_isolation_level="read_committed")
    tx = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "share-rc"})
    tx.init_transactions(10)
    tx.begin_transaction()
    for i in range(3):
        tx.produce(topic_name, f"aborted-{i}".encode(), partition=0)
    tx.flush(10)  # written: librdkafka drops what is unsent at an abort
    tx.abort_transaction(10)
    tx.begin_transaction()
    for i in range(3):
        tx.produce(topic_name, f"committed-{i}".encode(), partition=0)
    tx.commit_transaction(10)
    tx.begin_transaction()
    tx.produce(topic_name, b"open", partition=0)
    tx.flush(10)  # written, not committed
    c = consumer(broker, group)
    c.subscribe([topic_name])
    try:
        got = [m.value().decode() for m in poll_until(c, 3)]
        assert got == [f"committed-{i}" for i in range(3)]
        assert poll_until(c, 1, timeout_s=2) == []  # the open one waits ...
        tx.commit_transaction(10)
        assert [m.value() for m in poll_until(c, 1)] == [b"open"]  # ... for its commit
        c.commit_sync()
    finally:
        c.close()


@pytest.mark.parametrize(("reset", "expected"), [("latest", []),
                                                  ("by_duration:PT1H", ["a", "b"])])
def test_auto_offset_reset_latest_and_by_duration(broker: InProcessBroker, topic_name: str,
                                                  reset: str, expected: list[str]) -> None:
    """share.auto.offset.reset: latest (Kafka's default) starts after what is there;
    by_duration:<ISO-8601> at the first record of the last hour."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    group = f"sg-reset-{reset.split(':')[0]}"
    _group_config(broker, group, share_auto_offset_reset=reset)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for v in (b"a", b"b"):
        p.produce(topic_name, v, partition=0)
    p.flush(10)
    c = consumer(broker, group)
    c.subscribe([topic_name])
    try:
        got = [m.value().decode() for m in poll_until(c, len(expected) or 1,
                                                     timeout_s=5 if not expected else 20)]
        assert got == expected
        p.produce(topic_name, b"c", partition=0)  # a new record comes either way
        p.flush(10)
        assert [m.value() for m in poll_until(c, 1)] == [b"c"]
        c.commit_sync()
    finally:
        c.close()
