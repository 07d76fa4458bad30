"""Burrow (Debian's ``burrow`` 1.2.1, on sarama 1.22) reads a lagging group's lag from
headrace exactly as ``headrace groups lag`` reports it (issue 11 item 2; R-PROTO-1,
R-PROTO-5).

Burrow asks every partition's newest offset with ListOffsets v0 (whatever Kafka version it
is configured for), reads ``__consumer_offsets`` with Fetch v4 and the topics with Metadata
v5; it coordinates through a ZooKeeper of its own (Debian's, ``tests/zk.py``). Before
ListOffsets v0 was served it saw no topics, no groups and no lag. ``scripts/test.sh``
installs the ``burrow`` package; without it this test is skipped (with the reason).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.brokerproc import BrokerProcess, wait_until
from tests.clients import create_topic
from tests.ports import reserve_port
from tests.zk import zookeeper  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(240)

BURROW = shutil.which("Burrow")
CLUSTER = "hr"
PARTITIONS = 3
PRODUCED = {0: 12, 1: 7, 2: 5}
COMMITTED = {0: 4, 1: 7, 2: 1}  # lag 8, 0, 4


@pytest.fixture(scope="module")
def lag_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path_factory.mktemp("burrow-broker"),
                       {"num.partitions": "1"}) as b:
        yield b
        text = "".join(b.stderr_lines)
        assert "Traceback" not in text, text[-3000:]


def _free_port() -> int:
    return reserve_port()  # outside the ephemeral range (tests/ports.py)


def _write_config(d: Path, zk: str, bootstrap: str, http_port: int) -> None:
    (d / "burrow.toml").write_text(f"""
[general]
pidfile="{d}/burrow.pid"
stdout-logfile="{d}/burrow.out"

[logging]
filename="{d}/burrow.log"
level="info"

[zookeeper]
servers=["{zk}"]
timeout=6
root-path="/burrow-{uuid.uuid4().hex[:8]}"

[client-profile.hr]
client-id="burrow-test"
kafka-version="2.0.0"

[cluster.{CLUSTER}]
class-name="kafka"
servers=["{bootstrap}"]
client-profile="hr"
topic-refresh=2
offset-refresh=2

[consumer.{CLUSTER}]
class-name="kafka"
cluster="{CLUSTER}"
servers=["{bootstrap}"]
client-profile="hr"
offsets-topic="__consumer_offsets"
start-latest=false
group-blacklist="^(console-consumer-|python-kafka-consumer-|quick-).*$"
group-whitelist=""

[httpserver.default]
address="127.0.0.1:{http_port}"

[storage.default]
class-name="inmemory"
workers=4
intervals=10
min-distance=1
expire-group=604800
""")


def _get(port: int, path: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _commit(bootstrap: str, group: str, topic: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in COMMITTED.items()],
                 asynchronous=False)
    finally:
        c.close()


def _headrace_lag(bootstrap: str, group: str, topic: str) -> tuple[dict[int, int], int]:
    r = subprocess.run([sys.executable, "-m", "headrace.cli", "groups", "lag", group,
                        "--bootstrap-server", bootstrap],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    lags = {}
    total = None
    for line in r.stdout.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[1] == topic:
            lags[int(cols[2])] = int(cols[5])
        elif cols[:1] == ["TOTAL-LAG"]:
            total = int(cols[1])
    assert total is not None, r.stdout
    return lags, total


def test_burrow_lag_equals_headrace_groups_lag(lag_broker: BrokerProcess,
                                                zookeeper: Any,  # noqa: F811
                                                tmp_path: Path) -> None:
    if BURROW is None:
        pytest.skip("burrow is not installed (bash scripts/test.sh installs it with apt)")
    from confluent_kafka import Producer

    bootstrap = lag_broker.bootstrap
    topic = f"burrow-{uuid.uuid4().hex[:8]}"
    group = f"lagging-{uuid.uuid4().hex[:8]}"
    create_topic("confluent", bootstrap, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap})
    for p, n in PRODUCED.items():
        for i in range(n):
            producer.produce(topic, value=b"v%d" % i, partition=p)
    assert producer.flush(30) == 0
    _commit(bootstrap, group, topic)

    lags, total = _headrace_lag(bootstrap, group, topic)
    assert lags == {p: PRODUCED[p] - COMMITTED[p] for p in PRODUCED}
    assert total == sum(PRODUCED.values()) - sum(COMMITTED.values())

    http = _free_port()
    _write_config(tmp_path, zookeeper.connect_string, bootstrap, http)
    proc = subprocess.Popen([BURROW, "--config-dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        def sees_topic() -> bool:
            body = _get(http, f"/v3/kafka/{CLUSTER}/topic/{topic}")
            return bool(body and not body.get("error")
                        and body.get("offsets") == [PRODUCED[p] for p in range(PARTITIONS)])

        wait_until(sees_topic, timeout_s=60, interval_s=0.5,
                   what="Burrow to list the topic's newest offsets (ListOffsets v0)")
        # commits Burrow read before it knew the topic's offsets were dropped ("no topic"):
        # commit again now that it does
        _commit(bootstrap, group, topic)
        status: dict[str, Any] = {}

        def has_lag() -> bool:
            body = _get(http, f"/v3/kafka/{CLUSTER}/consumer/{group}/lag")
            if not body or body.get("error"):
                return False
            status.update(body["status"])
            parts = status.get("partitions") or []
            return len(parts) == PARTITIONS and all(
                p.get("end") and p["end"]["offset"] == COMMITTED[p["partition"]]
                for p in parts)

        wait_until(has_lag, timeout_s=60, interval_s=0.5,
                   what="Burrow to evaluate the group's lag")
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    log = (tmp_path / "burrow.log").read_text(errors="replace")
    burrow_lags = {p["partition"]: p["current_lag"] for p in status["partitions"]
                   if p["topic"] == topic}
    assert burrow_lags == lags, (status, log[-3000:])
    assert status["totallag"] == total
    assert "sarama_error" not in log and '"level":"error"' not in log, log[-3000:]
