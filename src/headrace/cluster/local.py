"""``headrace cluster``: a ZooKeeper and N brokers on loopback, for development.

Each broker is its own ``headrace broker`` process (ids 1..N, ports PORT..PORT+N-1, data
dirs ``DIR/broker-<id>``), on a ZooKeeper from Debian's package (``DIR/zookeeper``) with a
chroot of its own. It prints the bootstrap list, restarts nothing by itself, and on Ctrl-C
(or SIGTERM) stops the brokers with SIGTERM (each moves its leadership away first) and then
ZooKeeper. Started again on the same directory, it is the same cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import click

STOP_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0
CHROOT = "/headrace"
_LISTENING = re.compile(r"listening on [^ ]+:(\d+)")


class LocalBroker:
    def __init__(self, broker_id: int, port: int, data_dir: Path, zk: str,
                 overrides: list[str], log_level: str) -> None:
        self.broker_id = broker_id
        self.port = port
        self.data_dir = data_dir
        self.zk = zk
        self.overrides = overrides
        self.log_level = log_level
        self.proc: subprocess.Popen[str] | None = None
        self.listening = threading.Event()
        self.log_path = data_dir.parent / f"broker-{broker_id}.log"

    def start(self) -> None:
        self.listening.clear()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "headrace.cli", "broker", "--data-dir", str(self.data_dir),
                "--port", str(self.port), "--broker-id", str(self.broker_id),
                "--zookeeper", self.zk, "--log-level", self.log_level]
        for o in self.overrides:
            args += ["-o", o]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                     start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with open(self.log_path, "a") as out:
            for line in self.proc.stderr:
                out.write(line)
                out.flush()
                if "listening on" in line:
                    m = _LISTENING.search(line)
                    if m:
                        self.port = int(m.group(1))
                    self.listening.set()
                elif " ERROR " in line or "cannot start" in line:
                    click.echo(f"broker {self.broker_id}: {line.rstrip()}", err=True)

    def kill(self) -> None:
        """kill -9 (fault injection)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        self.listening.clear()

    def wait_listening(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.listening.wait(0.2):
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                return False
        return True

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            click.echo(f"broker {self.broker_id} did not stop in {STOP_TIMEOUT_S:.0f} s; "
                       "killing it", err=True)
            self.proc.kill()
            self.proc.wait(5)


class LocalCluster:
    """A ZooKeeper and ``brokers`` broker processes under ``data_dir`` (the demo's
    ``--cluster``); ``port`` 0 lets every broker pick a free port (kept on restarts)."""

    def __init__(self, data_dir: Path, brokers: int = 3, port: int = 0, zk_port: int = 0,
                 overrides: list[str] | None = None, log_level: str = "INFO") -> None:
        from headrace.cluster.zookeeper_server import ZooKeeperServer

        self.data_dir = data_dir
        self.zk = ZooKeeperServer(data_dir / "zookeeper", port=zk_port)
        self.connect = self.zk.connect_string + CHROOT
        self.brokers = {i: LocalBroker(i, port + i - 1 if port else 0, data_dir / f"broker-{i}",
                                       self.connect, list(overrides or []), log_level)
                        for i in range(1, brokers + 1)}

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers.values())

    def start(self) -> str:
        self.zk.start(timeout_s=START_TIMEOUT_S)
        for b in self.brokers.values():
            b.start()
        for b in self.brokers.values():
            if not b.wait_listening(START_TIMEOUT_S):
                self.stop()
                raise RuntimeError(f"broker {b.broker_id} did not start; see {b.log_path}")
        return self.bootstrap

    def restart(self, broker_id: int) -> None:
        b = self.brokers[broker_id]
        b.start()
        if not b.wait_listening(START_TIMEOUT_S):
            raise RuntimeError(f"broker {broker_id} did not restart; see {b.log_path}")

    def stop(self) -> None:
        threads = [threading.Thread(target=b.stop) for b in self.brokers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(STOP_TIMEOUT_S + 10)
        with contextlib.suppress(Exception):
            self.zk.stop()


def run_local_cluster(brokers: int, data_dir: Path, port: int, zk_port: int,
                      overrides: list[str], log_level: str) -> int:
    from headrace.cluster.zookeeper_server import ZooKeeperServer, ZooKeeperUnavailable

    data_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    zk = ZooKeeperServer(data_dir / "zookeeper", port=zk_port)
    click.echo(f"starting ZooKeeper in {data_dir / 'zookeeper'} ...", err=True)
    try:
        zk.start(timeout_s=START_TIMEOUT_S)
    except ZooKeeperUnavailable as e:
        click.echo(f"headrace: {e}", err=True)
        return 1
    connect = zk.connect_string + CHROOT
    nodes = [LocalBroker(i, port + i - 1, data_dir / f"broker-{i}", connect, overrides,
                         log_level) for i in range(1, brokers + 1)]
    try:
        for b in nodes:
            b.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        for b in nodes:
            while not b.listening.wait(0.2):
                if stop.is_set():
                    return 130
                if b.proc is not None and b.proc.poll() is not None:
                    click.echo(f"headrace: broker {b.broker_id} exited; see {b.log_path}",
                               err=True)
                    return 1
                if time.monotonic() > deadline:
                    click.echo(f"headrace: broker {b.broker_id} did not start in "
                               f"{START_TIMEOUT_S:.0f} s; see {b.log_path}", err=True)
                    return 1
        bootstrap = ",".join(f"127.0.0.1:{b.port}" for b in nodes)
        click.echo(f"headrace cluster: {brokers} brokers, ZooKeeper {connect}")
        click.echo(f"bootstrap servers: {bootstrap}")
        click.echo(f"logs: {data_dir}/broker-N.log; Ctrl-C stops everything", err=True)
        while not stop.wait(0.5):
            for b in nodes:
                if b.proc is not None and b.proc.poll() is not None:
                    click.echo(f"broker {b.broker_id} exited (code {b.proc.returncode}); see "
                               f"{b.log_path}", err=True)
                    b.proc = None
        return 0
    finally:
        click.echo("stopping the brokers ...", err=True)
        threads = [threading.Thread(target=b.stop) for b in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(STOP_TIMEOUT_S + 10)
        with contextlib.suppress(Exception):
            zk.stop()
        click.echo("stopped", err=True)
