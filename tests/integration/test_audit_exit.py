"""``headrace audit`` decides, by its exit code, whether the pipeline lost or duplicated
anything (R-SPARK-4, seed 003; README: "exits 1 on any loss or duplicate").

The inputs the audit reads are built directly, as the demo's producers write them: records
tagged with the headers ``producer.host``, ``produce.time`` and ``event.id`` in a topic, and
the acknowledged counts per (topic, host, minute) as JSON in ``__audit``. The command is run
as users run it (``python -m headrace.cli audit --bootstrap ... --topics ... --json``, one
Spark session per run) against a broker process of its own per test, so no other test's
``__audit`` records are seen:

1. a clean run (every announced record present once) exits 0 and reports 0 lost, 0
   duplicated;
2. with one record produced twice (a duplicate) and a window's announced count raised past
   what was delivered (a loss), it exits 1 and reports exactly 1 lost and 1 duplicated, in
   the windows where they were injected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.brokerproc import BrokerProcess
from tests.clients import create_topic

pytest.importorskip("pyspark", reason="the spark extra is not installed")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)  # a Spark job: 79-115 s under CI's load

# names of the audit's wire format (the contract between the demo's producers and the audit)
AUDIT_TOPIC = "__audit"
HOST, TIME, EVENT = "producer.host", "produce.time", "event.id"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker per test: the audit reads every window in ``__audit``."""
    with BrokerProcess(tmp_path / "data", {"num.partitions": "1"}) as b:
        yield b


def send(bootstrap: str, records: list[tuple[str, bytes, list[tuple[str, bytes]]]]) -> None:
    """Produce (topic, value, headers) records with acks=all; fail unless all are acked."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    errors: list[Any] = []
    for topic, value, headers in records:
        p.produce(topic, value, headers=headers,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
    assert p.flush(30) == 0 and not errors, errors


def event(topic: str, host: str, produce_ms: int, event_id: str) -> tuple[str, bytes, list[
        tuple[str, bytes]]]:
    return (topic, f"event {event_id}".encode(),
            [(HOST, host.encode()), (TIME, str(produce_ms).encode()),
             (EVENT, event_id.encode())])


def announce(topic: str, host: str, minute: int, count: int) -> tuple[str, bytes, list[
        tuple[str, bytes]]]:
    return (AUDIT_TOPIC, json.dumps({"topic": topic, "host": host, "minute": minute,
                                     "count": count}).encode(), [])


def run_audit(bootstrap: str, topic: str) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    r = subprocess.run([sys.executable, "-m", "headrace.cli", "audit", "--bootstrap",
                        bootstrap, "--topics", topic, "--json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
                       check=False)
    lines = r.stdout.strip().splitlines()
    assert lines, f"no output (exit {r.returncode}):\n{r.stderr}"
    return r.returncode, json.loads(lines[-1]), r.stderr


WINDOWS = {("web-1", 0): 30, ("web-2", 0): 20, ("web-1", 1): 25}
"""(host, minute offset) -> records produced and announced."""


def fill(bootstrap: str) -> tuple[str, int]:
    """Topic and announcements as the demo's producers leave them, every record there once;
    returns the topic and the first window's minute."""
    topic = f"activity-{uuid.uuid4().hex[:6]}"
    create_topic("confluent", bootstrap, topic, 2)
    create_topic("confluent", bootstrap, AUDIT_TOPIC, 1)
    minute = int(time.time() // 60) - 5  # two whole minutes, five minutes ago
    records = []
    for (host, dm), n in WINDOWS.items():
        m = minute + dm
        records += [event(topic, host, m * 60_000 + 1_000 * i, f"{host}-{m}-{i}")
                    for i in range(n)]
    send(bootstrap, records)
    # cumulative counts, as producers publish them: the largest is the window's total
    send(bootstrap, [announce(topic, host, minute + dm, c) for (host, dm), n in WINDOWS.items()
                     for c in (n // 2, n)])
    return topic, minute


def test_audit_exits_0_on_a_clean_run(broker: BrokerProcess) -> None:
    """R-SPARK-4: every announced record consumed once: exit 0, lost 0, duplicated 0."""
    topic, _ = fill(broker.bootstrap)
    rc, report, err = run_audit(broker.bootstrap, topic)
    assert (report["produced"], report["consumed"], report["lost"], report["duplicated"]) \
        == (75, 75, 0, 0), err
    assert len(report["windows"]) == len(WINDOWS)
    assert rc == 0, err
    assert "Traceback" not in err, err


def test_audit_exits_1_on_a_loss_and_a_duplicate(broker: BrokerProcess) -> None:
    """R-SPARK-4: one record delivered twice and one window announced with one record more
    than was delivered: exit 1, lost 1 and duplicated 1, each in its own window."""
    topic, minute = fill(broker.bootstrap)
    # the duplicate: web-2's 7th record again, same event id
    send(broker.bootstrap, [event(topic, "web-2", minute * 60_000 + 7_000,
                                  f"web-2-{minute}-7")])
    # the loss: web-1's second window announced one more record than was delivered
    send(broker.bootstrap, [announce(topic, "web-1", minute + 1, 26)])

    rc, report, err = run_audit(broker.bootstrap, topic)
    assert (report["produced"], report["consumed"], report["lost"], report["duplicated"]) \
        == (76, 76, 1, 1), err
    bad = {(w["host"], w["minute"]): (w["lost"], w["duplicated"])
           for w in report["windows"] if w["lost"] or w["duplicated"]}
    assert bad == {("web-2", minute): (0, 1), ("web-1", minute + 1): (1, 0)}
    assert rc == 1, err
    assert "FAILED" in err
    assert "Traceback" not in err, err
