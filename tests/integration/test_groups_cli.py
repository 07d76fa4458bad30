"""``headrace groups list | describe | lag | reset-offsets`` against a group made by a real
consumer (issue 3 §5; kafka-consumer-groups.sh-like tables)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer

from tests.brokerproc import BrokerProcess, wait_until
from tests.clients import create_topic

HEADRACE = [sys.executable, "-m", "headrace.cli"]
PARTITIONS = 2
PER_PARTITION = 10


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HEADRACE, *args], capture_output=True, text=True, timeout=timeout)


def _rows(stdout: str, topic: str) -> dict[int, list[str]]:
    """Table rows of ``topic`` by partition (columns split on whitespace)."""
    out = {}
    for line in stdout.splitlines():
        cols = line.split()
        if len(cols) >= 4 and cols[1] == topic:
            out[int(cols[2])] = cols
    return out


def _make_group(bootstrap: str, topic: str, group: str, consume: int) -> Consumer:
    """A subscribed consumer that consumed and committed ``consume`` records (still open)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": 10000})
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 30
    while got < consume and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got += 1
            consumer.commit(message=msg, asynchronous=False)
    assert got == consume, f"consumed {got} of {consume}"
    return consumer


def _produce(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce(topic, value=b"v%d" % i, partition=p, timestamp=1_000_000 + i)
    assert producer.flush(30) == 0


@pytest.mark.slow
def test_groups_commands(broker: BrokerProcess, topic_name: str) -> None:
    bs = ["--bootstrap-server", broker.bootstrap]
    group = f"cli-group-{uuid.uuid4().hex[:6]}"
    create_topic("confluent", broker.bootstrap, topic_name, PARTITIONS)
    _produce(broker.bootstrap, topic_name)
    consumer = _make_group(broker.bootstrap, topic_name, group, PARTITIONS * PER_PARTITION)

    # while the member is active: describe shows it, reset is refused
    r = _run("groups", "describe", group, *bs)
    assert r.returncode == 0, r.stderr
    rows = _rows(r.stdout, topic_name)
    assert set(rows) == set(range(PARTITIONS))
    assert all(row[3:6] == [str(PER_PARTITION), str(PER_PARTITION), "0"] for row in rows.values())
    assert all(row[6] != "-" for row in rows.values())  # the owning member
    r = _run("groups", "reset-offsets", group, "--topic", topic_name, "--to-earliest",
             "--execute", *bs)
    assert r.returncode != 0 and "inactive" in r.stderr
    consumer.close()

    assert group in _run("groups", "list", *bs).stdout.split()

    def inactive() -> bool:
        out = _run("groups", "describe", group, *bs).stdout
        return "no active members" in out

    wait_until(inactive, timeout_s=20, interval_s=0.2, what="the group to become empty")

    r = _run("groups", "lag", group, *bs)
    assert r.returncode == 0, r.stderr
    assert "TOTAL-LAG 0" in r.stdout

    # dry run: shows the new offsets, commits nothing
    r = _run("groups", "reset-offsets", group, "--topic", topic_name, "--to-earliest", *bs)
    assert r.returncode == 0, r.stderr
    assert all(row[3] == "0" for row in _rows(r.stdout, topic_name).values())
    assert "TOTAL-LAG 0" in _run("groups", "lag", group, *bs).stdout

    def reset(*mode: str) -> dict[int, str]:
        r = _run("groups", "reset-offsets", group, "--topic", topic_name, *mode, "--execute",
                 *bs)
        assert r.returncode == 0, r.stderr
        rows = _rows(_run("groups", "describe", group, *bs).stdout, topic_name)
        return {p: row[3] for p, row in rows.items()}

    assert reset("--to-earliest") == {0: "0", 1: "0"}
    assert f"TOTAL-LAG {PARTITIONS * PER_PARTITION}" in _run("groups", "lag", group, *bs).stdout
    assert reset("--shift-by", "3") == {0: "3", 1: "3"}
    assert reset("--to-offset", "7") == {0: "7", 1: "7"}
    assert reset("--to-offset", "999") == {0: "10", 1: "10"}  # clamped to the log end
    assert reset("--shift-by", "-4") == {0: "6", 1: "6"}
    # timestamps 1_000_000 + i ms: the first record at or after 1_000_005 ms is offset 5
    assert reset("--to-datetime", "1970-01-01T00:16:40.005+00:00") == {0: "5", 1: "5"}
    assert reset("--to-latest") == {0: "10", 1: "10"}


def test_describe_unknown_group_fails(broker: BrokerProcess) -> None:
    """An unknown group is a clear one-line error and exit 1, not a crash."""
    r = _run("groups", "describe", "no-such-group", "--bootstrap-server", broker.bootstrap)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    assert "consumer group 'no-such-group' does not exist" in r.stderr
