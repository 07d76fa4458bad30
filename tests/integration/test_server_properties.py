"""Kafka's own ``server.properties`` starts a broker (issue 11 item 6).

The files are Kafka 3.9's, unchanged (``tests/data/kafka-3.9-*.properties``, from
apache/kafka's 3.9 branch: ``config/server.properties``, ZooKeeper mode, and
``config/kraft/server.properties``). ``headrace broker --config FILE`` starts from them,
says once which settings have no effect here, serves real clients, and DescribeConfigs
reports Kafka's keys with Kafka's sources and synonyms. A listener with another security
protocol is refused with one line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient  # type: ignore[import-untyped]
from kafka.admin import ConfigResource, ConfigResourceType  # type: ignore[import-untyped]

from headrace.cluster.zookeeper_server import ZooKeeperServer
from tests.kafka_wire import WireClient
from tests.ports import reserve_port
from tests.zk import chroot, zookeeper  # noqa: F401  (the module's ZooKeeper server)

DATA = Path(__file__).parents[1] / "data"
ZK_FILE = DATA / "kafka-3.9-server.properties"
KRAFT_FILE = DATA / "kafka-3.9-kraft-server.properties"
_LISTENING = re.compile(r"listening on ([\d.]+):(\d+)")
STATIC, DEFAULT = 4, 5  # Kafka's ConfigSource


class Headrace:
    """``headrace broker ARGS...`` in a child process; ready at its ``listening on`` line
    (a deadline, never a sleep)."""

    def __init__(self, *args: str) -> None:
        self.args = [sys.executable, "-m", "headrace.cli", "broker", *args]
        self.lines: list[str] = []
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Headrace:
        self.proc = subprocess.Popen(self.args, stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        ready = threading.Event()
        proc = self.proc

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                self.lines.append(line)
                m = _LISTENING.search(line)
                if m:
                    self.port = int(m.group(2))
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(60) or not self.port:
            self.__exit__()
            raise AssertionError("broker did not start:\n" + "".join(self.lines))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def warnings(self) -> list[str]:
        return [line for line in self.lines if "WARNING" in line or "WARN" in line]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headrace.cli", "broker", *args],
                          capture_output=True, text=True, timeout=60)


def free_port() -> int:
    return reserve_port()  # outside the ephemeral range (tests/ports.py)


def serves_clients(bootstrap: str) -> None:
    """confluent-kafka produces (creating the topic: num.partitions=1 from the file) and
    kafka-python reads the records back."""
    from confluent_kafka import Producer
    from kafka import KafkaConsumer, TopicPartition  # type: ignore[import-untyped]

    topic = f"props-{uuid.uuid4().hex[:8]}"
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        p.produce(topic, f"v{i}".encode())
    assert p.flush(30) == 0
    c = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=10_000,
                      auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        assert c.partitions_for_topic(topic) == {0}
        c.assign([TopicPartition(topic, 0)])
        got = [m.value for m in c]
    finally:
        c.close()
    assert got == [f"v{i}".encode() for i in range(10)]


def broker_configs(bootstrap: str, broker_id: str = "0") -> dict[str, Any]:
    """DescribeConfigs v4 on the wire, with synonyms: name → entry."""
    with WireClient.to(bootstrap) as wc:
        (r,) = wc.request(32, 4, {"resources": [{"resource_type": 4,
                                                 "resource_name": broker_id,
                                                 "configuration_keys": None}],
                                  "include_synonyms": True,
                                  "include_documentation": True}).results
    assert r.error_code == 0, r.error_message
    return {c.name: c for c in r.configs}


def syn(entry: Any) -> list[tuple[str, str | None, int]]:
    return [(s.name, s.value, s.source) for s in entry.synonyms]


@pytest.fixture
def zk(zookeeper: ZooKeeperServer) -> Iterator[str]:  # noqa: F811
    yield chroot(zookeeper)


def test_kafka_39_zookeeper_server_properties_starts_a_broker(tmp_path: Path, zk: str) -> None:
    """The ZooKeeper-mode file as shipped; the flags a user adds to run it elsewhere (a
    data dir, a free port, this test's ZooKeeper) override the file's values."""
    with Headrace("--config", str(ZK_FILE), "--data-dir", str(tmp_path / "logs"),
                  "--port", "0", "--zookeeper", zk) as b:
        # one warning line names the settings that have no effect here
        (warning,) = [line for line in b.warnings() if "no effect" in line]
        for key in ("num.network.threads", "num.io.threads", "socket.send.buffer.bytes",
                    "socket.receive.buffer.bytes", "num.recovery.threads.per.data.dir"):
            assert key in warning
        # the transaction log's settings apply now (issue 10)
        assert "transaction.state.log.replication.factor" not in warning
        assert "log.retention.hours" not in warning and "broker.id" not in warning
        serves_clients(b.bootstrap)
        cfg = broker_configs(b.bootstrap)
        # Kafka 3.9 reports these exactly so for this file
        hours = cfg["log.retention.hours"]
        assert (hours.value, hours.config_source) == ("168", STATIC)
        assert syn(hours) == [("log.retention.hours", "168", STATIC),
                              ("log.retention.hours", "168", DEFAULT)]
        ms = cfg["log.retention.ms"]
        assert (ms.value, ms.config_source, syn(ms)) == (None, DEFAULT, [])
        assert cfg["log.retention.minutes"].value is None
        assert (cfg["broker.id"].value, cfg["broker.id"].config_source) == ("0", STATIC)
        assert (cfg["num.partitions"].value, syn(cfg["num.partitions"])) == (
            "1", [("num.partitions", "1", STATIC), ("num.partitions", "1", DEFAULT)])
        assert cfg["group.initial.rebalance.delay.ms"].config_source == STATIC
        # log.dirs: the data dir actually used (--data-dir over the file's /tmp/kafka-logs)
        assert (cfg["log.dirs"].value, cfg["log.dirs"].config_source) == (
            str(tmp_path / "logs"), STATIC)
        assert cfg["log.dir"].value == "/tmp/kafka-logs"
        assert cfg["log.dir"].config_source == DEFAULT
        # no listeners in the file: the listener served, by default
        assert cfg["listeners"].value == f"PLAINTEXT://127.0.0.1:{b.port}"
        assert cfg["advertised.listeners"].value is None
        assert cfg["zookeeper.connect"].value == zk
        # a key given that has no effect is listed as given
        assert cfg["num.network.threads"].value == "3"
        assert cfg["num.network.threads"].config_source == STATIC
        # kafka-python's admin client sees the same
        admin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
        try:
            got = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")],
                                         include_synonyms=True, config_filter="all")
        finally:
            admin.close()
        (by_name,) = [v for v in got.values()]
        entries = by_name["0"]
        assert entries["log.retention.hours"]["value"] == "168"
        assert {"listeners", "advertised.listeners", "log.dirs"} <= set(entries)
        # the cluster-wide default resource: no dynamic defaults, an empty list as Kafka
        with WireClient.to(b.bootstrap) as wc:
            (r,) = wc.request(32, 4, {"resources": [{"resource_type": 4, "resource_name": "",
                                                     "configuration_keys": None}],
                                      "include_synonyms": True}).results
        assert (r.error_code, list(r.configs)) == (0, [])
    assert not [line for line in b.lines if "Traceback" in line], "".join(b.lines)


def test_kafka_39_kraft_server_properties_starts_a_broker(tmp_path: Path) -> None:
    """The KRaft combined-mode file with its port and log dir changed (what a user edits to
    run it next to a Kafka): its PLAINTEXT listener is served, the CONTROLLER listener and
    the quorum settings are accepted with one warning, advertised.listeners is what
    clients are sent."""
    port = free_port()
    text = KRAFT_FILE.read_text()
    assert "listeners=PLAINTEXT://:9092,CONTROLLER://:9093" in text
    text = text.replace("PLAINTEXT://:9092", f"PLAINTEXT://:{port}")
    text = text.replace("PLAINTEXT://localhost:9092", f"PLAINTEXT://127.0.0.1:{port}")
    text = text.replace("log.dirs=/tmp/kraft-combined-logs", f"log.dirs={tmp_path / 'a'},"
                                                             f"{tmp_path / 'b'}")
    props = tmp_path / "server.properties"
    props.write_text(text)
    with Headrace("--config", str(props)) as b:
        assert b.port == port
        (warning,) = [line for line in b.warnings() if "no effect" in line]
        for key in ("process.roles", "controller.quorum.voters", "num.io.threads",
                    "listener CONTROLLER"):
            assert key in warning
        (dirs,) = [line for line in b.warnings() if "log.dirs" in line]
        assert f"{tmp_path / 'a'} holds the broker's state and new partitions" in dirs
        assert (tmp_path / "a").is_dir() and (tmp_path / "b").is_dir()  # as Kafka
        serves_clients(b.bootstrap)
        with WireClient.to(b.bootstrap) as wc:
            md = wc.request(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                    "include_topic_authorized_operations": False})
        assert [(x.node_id, x.host, x.port) for x in md.brokers] == [(1, "127.0.0.1", port)]
        cfg = broker_configs(b.bootstrap, "1")
        assert cfg["listeners"].value == f"PLAINTEXT://:{port},CONTROLLER://:9093"
        assert cfg["listeners"].config_source == STATIC
        assert cfg["advertised.listeners"].value == (f"PLAINTEXT://127.0.0.1:{port},"
                                                     "CONTROLLER://localhost:9093")
        assert syn(cfg["listener.security.protocol.map"])[0][2] == STATIC
        assert cfg["log.dirs"].value == str(tmp_path / "a")
        assert (cfg["log.segment.bytes"].value, cfg["log.segment.bytes"].config_source) == (
            "1073741824", STATIC)
        assert cfg["node.id"].value == "1" and cfg["node.id"].config_source == STATIC
    assert not [line for line in b.lines if "Traceback" in line], "".join(b.lines)


@pytest.mark.parametrize(("lines", "message"), [
    # a TLS listener needs its key and certificate; a SASL inter-broker listener needs the
    # credentials brokers use with each other; two listeners on one port
    (["listeners=SSL://:9093"], "listener SSL uses TLS: give ssl.keystore.location"),
    (["listeners=INTERNAL://:9093",
      "listener.security.protocol.map=INTERNAL:SASL_PLAINTEXT"],
     "the inter-broker listener needs username= and password="),
    (["listeners=PLAINTEXT://:9092,OTHER://:9092",
      "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,OTHER:PLAINTEXT",
      "inter.broker.listener.name=OTHER"],
     "port 9092 is used by two listeners"),
    (["listeners=PLAINTEXT://:9092x"], "is not NAME://HOST:PORT"),
    (["num.partiton=4"], "num.partiton: unknown configuration"),
])
def test_what_is_refused_is_refused_with_one_line(tmp_path: Path, lines: list[str],
                                                  message: str) -> None:
    props = tmp_path / "server.properties"
    props.write_text("\n".join(["broker.id=0", f"log.dirs={tmp_path / 'd'}", *lines]) + "\n")
    r = run_cli("--config", str(props))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        line for line in r.stderr.strip().splitlines() if line.startswith("headrace:")]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("headrace: invalid configuration: ") and message in line
    assert not (tmp_path / "d").exists()
