"""Real network partitions on loopback for cluster tests (issue 21).

Every broker process runs with a **group id of its own** (still uid 0, so it reads the
virtualenv and the test's directories as the test does): ``subprocess.Popen(group=gid,
extra_groups=[])``. A partition is a set of iptables rules in a chain of this test process
(``HRCUT-<pid>``), jumped to from ``OUTPUT -o lo``, each dropping what one broker's
sockets send (``-m owner --gid-owner``) to ZooKeeper's port or to another broker's port:

- ``cut_zookeeper(b)``: broker ``b`` cannot reach ZooKeeper (its session expires on the
  server after the session timeout; ``b`` learns it only when the cut heals);
- ``cut_peers(a, b)``: ``a`` and ``b`` cannot reach each other's listener (every
  inter-broker connection is opened by one of them to the other's port);
- ``blip_zookeeper(b)``: ``b``'s packets to ZooKeeper are answered with a TCP reset, so its
  connection drops at once and reconnects fail fast (a blip, healed within the session
  timeout, keeps the session);
- ``heal()``: every rule removed. ``close()`` removes the chain and its jump (the fixture
  calls it however the test ends); ``sweep()`` removes chains left by test processes that
  died without closing.

Packets are dropped (not rejected) for partitions, as a real network does: TCP
retransmits and the peers notice through their own timeouts. Nothing else on the machine
is affected: only packets of sockets owned by the brokers' group ids match.
"""

from __future__ import annotations

import contextlib
import grp
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.brokerproc import _LISTENING, wait_until


class NetCutUnavailable(Exception):
    """iptables is missing or refuses (not root, no CAP_NET_ADMIN, no owner match)."""


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True,
                       timeout=30)
    if check and r.returncode != 0:
        raise NetCutUnavailable(f"iptables {' '.join(args)}: {r.stderr.strip()}")
    return r


def free_gids(n: int) -> list[int]:
    """``n`` group ids no group of this machine has, distinct per test process."""
    base = 61000 + (os.getpid() % 900) * 4
    out = []
    gid = base
    while len(out) < n:
        try:
            grp.getgrgid(gid)
        except KeyError:
            out.append(gid)
        gid += 1
    return out


class NetCut:
    def __init__(self, zk_port: int) -> None:
        if shutil.which("iptables") is None:
            raise NetCutUnavailable("iptables is not installed (apt-get install iptables)")
        self.zk_port = zk_port
        self.chain = f"HRCUT-{os.getpid()}"
        self.gids: dict[int, int] = {}  # broker id -> its group id
        self.ports: dict[int, int] = {}  # broker id -> its listener port
        self.sweep()
        _iptables("-N", self.chain)
        try:
            _iptables("-I", "OUTPUT", "-o", "lo", "-j", self.chain)
            # the owner match must be there: a rule that can never match proves it
            _iptables("-A", self.chain, "-p", "tcp", "--dport", "1", "-m", "owner",
                      "--gid-owner", "65534", "-j", "DROP")
            _iptables("-F", self.chain)
        except NetCutUnavailable:
            self.close()
            raise
        self.rules: list[list[str]] = []

    @staticmethod
    def sweep() -> None:
        """Remove chains of earlier test processes that are gone."""
        r = _iptables("-S", check=False)
        for pid in set(re.findall(r"^-N HRCUT-(\d+)$", r.stdout, re.M)):
            try:
                os.kill(int(pid), 0)
                continue  # alive: not ours to touch
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            NetCut._remove_chain(f"HRCUT-{pid}")

    @staticmethod
    def _remove_chain(chain: str) -> None:
        while _iptables("-D", "OUTPUT", "-o", "lo", "-j", chain, check=False).returncode == 0:
            pass
        _iptables("-F", chain, check=False)
        _iptables("-X", chain, check=False)

    def add_broker(self, broker_id: int, gid: int, port: int) -> None:
        self.gids[broker_id] = gid
        self.ports[broker_id] = port

    def _drop(self, broker_id: int, port: int, reset: bool = False) -> None:
        target = ["REJECT", "--reject-with", "tcp-reset"] if reset else ["DROP"]
        rule = ["-p", "tcp", "--dport", str(port), "-m", "owner", "--gid-owner",
                str(self.gids[broker_id]), "-j", *target]
        _iptables("-A", self.chain, *rule)
        self.rules.append(rule)

    def cut_zookeeper(self, broker_id: int) -> None:
        self._drop(broker_id, self.zk_port)

    def blip_zookeeper(self, broker_id: int) -> None:
        self._drop(broker_id, self.zk_port, reset=True)

    def cut_peers(self, a: int, b: int) -> None:
        self._drop(a, self.ports[b])
        self._drop(b, self.ports[a])

    def heal(self) -> None:
        _iptables("-F", self.chain)
        self.rules.clear()

    def close(self) -> None:
        self._remove_chain(self.chain)


class NetBroker:
    """A broker process (``headrace broker``) with a group id of its own; its stderr
    lines are kept in ``log``. The interface of ``tests.clusterproc.ClusterBroker``."""

    def __init__(self, broker_id: int, data_dir: Path, zk_connect: str, port: int, gid: int,
                 overrides: dict[str, str]) -> None:
        self.broker_id = broker_id
        self.data_dir = data_dir
        self.zk_connect = zk_connect
        self.port = port
        self.gid = gid
        self.overrides = dict(overrides)
        self.proc: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 60.0) -> NetBroker:
        args = [sys.executable, "-m", "headrace.cli", "broker", "--data-dir", str(self.data_dir),
                "--port", str(self.port), "--broker-id", str(self.broker_id),
                "--zookeeper", self.zk_connect,
                "--log-level", os.environ.get("HEADRACE_TEST_LOG_LEVEL", "INFO")]
        for k, v in self.overrides.items():
            args += ["-o", f"{k}={v}"]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                     group=self.gid, extra_groups=[])
        listening = threading.Event()
        ended = threading.Event()
        proc, lines = self.proc, self.log

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)
                if _LISTENING.search(line):
                    listening.set()
            ended.set()

        threading.Thread(target=pump, daemon=True).start()
        wait_until(lambda: listening.is_set() or ended.is_set(), timeout_s,
                   what=f"broker {self.broker_id} to listen")
        if not listening.is_set():
            raise RuntimeError(f"broker {self.broker_id} did not start:\n" + "".join(lines[-40:]))
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(10)
