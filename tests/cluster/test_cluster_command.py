"""``headrace cluster``: ZooKeeper and three brokers on loopback, stopped by Ctrl-C."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import wait_until
from tests.zk import ZK_SERVER

pytestmark = pytest.mark.timeout(180)


def _free_block(n: int) -> int:
    for _ in range(50):
        base = random.randrange(20000, 60000)
        try:
            socks = []
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")


def test_cluster_command_runs_three_brokers_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    if not ZK_SERVER.exists():
        pytest.fail("ZooKeeper is not installed (bash scripts/test.sh installs it)")
    base, zk_port = _free_block(3), _free_block(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "headrace.cli", "cluster", "--brokers", "3", "--data-dir",
         str(tmp_path / "c"), "--port", str(base), "--zookeeper-port", str(zk_port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        wait_until(lambda: any("bootstrap servers:" in x for x in lines), 90, 0.1,
                   "the bootstrap line")
        bootstrap = next(x for x in lines if "bootstrap servers:" in x).split(": ", 1)[1].strip()
        assert bootstrap == ",".join(f"127.0.0.1:{base + i}" for i in range(3))
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("cmd", 2, 3)])["cmd"].result(40)
        assert {b for b in admin.list_topics(timeout=10).brokers} == {1, 2, 3}
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(100):
            p.produce("cmd", f"x{i}".encode(), partition=i % 2)
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "cmd"})
        c.assign([TopicPartition("cmd", q, 0) for q in range(2)])
        got: list[bytes] = []
        wait_until(lambda: got.extend(m.value() for m in c.consume(100, 0.5)
                                      if m.error() is None) or len(got) >= 100, 30, 0)
        c.close()
        assert sorted(got) == sorted(f"x{i}".encode() for i in range(100))
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(90)
    assert rc == 0
    # nothing left behind: no broker or ZooKeeper process of this cluster
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "c") not in out
