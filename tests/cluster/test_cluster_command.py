"""``headrace cluster``: ZooKeeper and three brokers on loopback, stopped by Ctrl-C."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from headrace.cluster.zookeeper_server import ZooKeeperServer
from tests.brokerproc import wait_until
from tests.readme import ROOT, commands
from tests.zk import ZK_SERVER

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]


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
    """The README's local cluster block as written (issue 13, item 4): `bash scripts/run.sh
    cluster` (its ports and data dir from HEADRACE_PORT, HEADRACE_ZOOKEEPER_PORT and
    HEADRACE_DATA_DIR, so they are free here), then its two admin commands."""
    if not ZK_SERVER.exists():
        pytest.fail("ZooKeeper is not installed (bash scripts/test.sh installs it)")
    start, create, describe = commands("cluster-local")
    assert start == "bash scripts/run.sh cluster"
    base, zk_port = _free_block(3), _free_block(1)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HEADRACE_PORT": str(base),
           "HEADRACE_ZOOKEEPER_PORT": str(zk_port), "HEADRACE_DATA_DIR": str(tmp_path / "c")}
    venv = Path(sys.executable).parent.parent
    if venv.resolve() == (ROOT / ".venv").resolve():
        argv = ["bash", "-c", start]  # as written, from the clone
    else:  # a worktree without its own .venv: what run.sh execs, with this venv
        argv = [sys.executable, "-m", "headrace.cli", "cluster"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        wait_until(lambda: any("bootstrap servers:" in x for x in lines), 150, 0.1,
                   "the bootstrap line")
        bootstrap = next(x for x in lines if "bootstrap servers:" in x).split(": ", 1)[1].strip()
        assert bootstrap == ",".join(f"127.0.0.1:{base + i}" for i in range(3))
        for line in (create, describe):
            argv = shlex.split(line.replace("127.0.0.1:9092", f"127.0.0.1:{base}"))
            assert argv[0] == ".venv/bin/headrace"
            r = subprocess.run([str(venv / "bin" / "headrace"), *argv[1:]], capture_output=True,
                               text=True, timeout=60, check=False)
            assert r.returncode == 0, (line, r.stderr)
        events = AdminClient({"bootstrap.servers": bootstrap}).list_topics(
            "events", timeout=10).topics["events"].partitions
        assert len(events) == 6 and all(len(p.replicas) == 3 for p in events.values())
        described = re.findall(r"Partition: (\d+)\tLeader: \d+\tReplicas: ([\d,]+)\t",
                               r.stdout)
        assert sorted(int(p) for p, _ in described) == list(range(6)), r.stdout
        assert all(len(replicas.split(",")) == 3 for _, replicas in described)
        assert "min.insync.replicas=2" in r.stdout
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
        _stop_and_restart_one_broker(env, bootstrap, base)
    finally:
        proc.send_signal(signal.SIGINT)
        stopping = time.monotonic()
        rc = proc.wait(90)
        took = time.monotonic() - stopping
    assert rc == 0
    # issue 26 defect 5: Ctrl-C stops everything promptly, the restarted broker included,
    # with no controlled-shutdown retries among brokers that all stop (nor an empty reason)
    print(f"Ctrl-C to exit: {took:.1f} s", file=sys.stderr)
    assert took < 20, took
    logs = "".join((tmp_path / "c" / f"broker-{i}.log").read_text() for i in (1, 2, 3))
    assert not re.search(r"request failed: *$", logs, re.M), logs[-3000:]
    assert "still led; retrying" not in logs, logs[-3000:]
    # nothing left behind: no broker or ZooKeeper process of this cluster
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "c") not in out


def _stop_and_restart_one_broker(env: dict[str, str], bootstrap: str, base: int) -> None:
    """``headrace cluster stop-broker N [--kill]`` and ``restart-broker N`` against the
    running cluster (issue 26 defect 5): the broker goes, comes back on its port, and the
    cluster knows it again; a broker it does not have is one line, exit 1."""
    ctl = [sys.executable, "-m", "headrace.cli", "cluster"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*ctl, *args], capture_output=True, text=True, env=env,
                              timeout=120, check=False)

    r = run("stop-broker", "2", "--kill")
    assert r.returncode == 0 and "broker 2 killed" in r.stdout, r
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", base + 1)) != 0  # nothing listens there now
    r = run("restart-broker", "2")
    assert r.returncode == 0, r
    assert f"broker 2 listening on 127.0.0.1:{base + 1}" in r.stdout, r.stdout
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wait_until(lambda: set(admin.list_topics(timeout=10).brokers) == {1, 2, 3}, 60, 0.5,
               "broker 2 back in the cluster")
    r = run("stop-broker", "2")  # a clean stop, then back again for the Ctrl-C below
    assert r.returncode == 0 and "broker 2 stopped in" in r.stdout, r
    assert run("restart-broker", "2").returncode == 0
    r = run("stop-broker", "9")
    assert r.returncode == 1 and r.stderr.strip() == (
        f"headrace: the cluster on {env['HEADRACE_DATA_DIR']} has no broker 9 "
        "(its brokers: 1, 2, 3)"), r.stderr


def test_readme_broker_on_three_machines_registers_as_written(
        zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    """The README's one-broker-per-machine command (issue 13, item 4), on this machine: the
    data dir, port and ZooKeeper ensemble made local and free; the advertised host stays
    ``kafka1.example.com`` (registration does not resolve it). The broker registers in
    ZooKeeper, under the command's chroot, with Kafka's JSON: that host, its rack, its id."""
    (line,) = commands("cluster-machines")
    port = _free_block(1)
    chroot = f"/headrace-{uuid.uuid4().hex[:8]}"
    argv = shlex.split(line.replace("/var/lib/headrace", str(tmp_path / "data"))
                       .replace("--port 9092", f"--port {port}")
                       .replace("zk1:2181,zk2:2181,zk3:2181/headrace",
                                zookeeper.connect_string + chroot))
    assert argv[:2] == ["headrace", "broker"]
    proc = subprocess.Popen([sys.executable, "-m", "headrace.cli", *argv[1:]],
                            stderr=subprocess.PIPE, text=True)
    zk = KazooClient(hosts=zookeeper.connect_string)
    zk.start(timeout=30)
    try:
        def registered() -> bytes | None:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return zk.exists(f"{chroot}/brokers/ids/1") and zk.get(f"{chroot}/brokers/ids/1")[0]

        info = json.loads(wait_until(registered, 60, 0.1, "the broker's registration"))
        assert info["host"] == "kafka1.example.com" and info["port"] == port
        assert info["rack"] == "rack-a"
        assert f"PLAINTEXT://kafka1.example.com:{port}" in info["endpoints"]
    finally:
        zk.stop()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
