"""A local headrace cluster for tests: brokers as separate processes on one ZooKeeper.

Each broker is started exactly as users (and outside checks) start one::

    headrace broker --data-dir DIR --port PORT --broker-id N \\
        --zookeeper 127.0.0.1:ZKPORT/chroot -o zookeeper.session.timeout.ms=4000 \\
        -o replica.lag.time.max.ms=5000

and can be killed (SIGKILL), paused (SIGSTOP / SIGCONT) and restarted on the same data dir
and port. Every wait is a poll with a deadline (``wait_until``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.brokerproc import _LISTENING, wait_until

SESSION_TIMEOUT_MS = 4000
LAG_TIME_MS = 5000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ClusterBroker:
    def __init__(self, broker_id: int, data_dir: Path, zk_connect: str,
                 overrides: dict[str, str] | None = None) -> None:
        self.broker_id = broker_id
        self.data_dir = data_dir
        self.zk_connect = zk_connect
        self.port = free_port()
        self.overrides = dict(overrides or {})
        self.proc: subprocess.Popen[str] | None = None
        self.log: list[str] = []
        self.paused = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 40.0) -> ClusterBroker:
        args = [sys.executable, "-m", "headrace.cli", "broker", "--data-dir", str(self.data_dir),
                "--port", str(self.port), "--broker-id", str(self.broker_id),
                "--zookeeper", self.zk_connect,
                "-o", f"zookeeper.session.timeout.ms={SESSION_TIMEOUT_MS}",
                "-o", f"replica.lag.time.max.ms={LAG_TIME_MS}",
                "--log-level", os.environ.get("HEADRACE_TEST_LOG_LEVEL", "INFO")]
        for k, v in self.overrides.items():
            args += ["-o", f"{k}={v}"]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.paused = False
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

    def kill(self) -> None:
        if self.proc is not None:
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None
            self.paused = False

    def stop(self, timeout_s: float = 90.0) -> int:
        """SIGTERM: a controlled shutdown (bounded by its retries), then a clean stop."""
        if self.proc is None:
            return 0
        if self.paused:
            self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # the broker dumps every thread's stack
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(1.0)
            self.kill()
            raise RuntimeError(f"broker {self.broker_id} did not stop in {timeout_s}s; its log "
                               "ends:\n" + "".join(self.log[-60:])) from None
        self.proc = None
        return rc

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False


class Cluster:
    """``n`` brokers (ids 1..n) on one ZooKeeper chroot, data dirs under ``root``."""

    def __init__(self, root: Path, zk_connect: str, n: int = 3,
                 overrides: dict[str, str] | None = None) -> None:
        self.brokers = {i: ClusterBroker(i, root / f"broker-{i}", zk_connect, overrides)
                        for i in range(1, n + 1)}

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers.values())

    def live_bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers.values() if b.alive and not b.paused)

    def start(self) -> Cluster:
        threads = [threading.Thread(target=b.start) for b in self.brokers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for b in self.brokers.values():
            if not b.alive:
                b.start()
        return self

    def stop(self) -> None:
        for b in self.brokers.values():
            try:
                b.stop(timeout_s=20)
            except RuntimeError:
                b.kill()

    def keep_logs(self, root: Path) -> None:
        """Every broker's whole log kept beside its data (read it after a failure); then a
        traceback in a broker's log fails the test (a bug, whatever the faults were)."""
        for b in self.brokers.values():
            (root / f"broker-{b.broker_id}.log").write_text("".join(b.log))
        for b in self.brokers.values():
            bad = [i for i, line in enumerate(b.log) if "Traceback" in line]
            assert not bad, f"broker {b.broker_id} logged a traceback:\n" + "".join(
                b.log[max(bad[0] - 10, 0):bad[0] + 50])

    def kill_all(self) -> None:
        for b in self.brokers.values():
            b.kill()

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.live_bootstrap(),
                            "socket.connection.setup.timeout.ms": 3000})

    def describe(self, topic: str, timeout_s: float = 5.0) -> dict[int, Any]:
        """partition -> confluent PartitionMetadata (leader, replicas, isrs) from any live
        broker."""
        admin = self.admin()
        md = admin.list_topics(topic=topic, timeout=timeout_s)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return {}
        return dict(t.partitions)

    def leader(self, topic: str, partition: int) -> int:
        parts = self.describe(topic)
        p = parts.get(partition)
        return -1 if p is None else int(p.leader)

    def wait_leader(self, topic: str, partition: int, ok: Callable[[int], bool] = lambda x: x > 0,
                    timeout_s: float = 30.0) -> int:
        def found() -> int | None:
            try:
                leader = self.leader(topic, partition)
            except Exception:
                return None
            return leader if leader > 0 and ok(leader) else None

        return int(wait_until(found, timeout_s, interval_s=0.1,
                              what=f"a leader of {topic}-{partition}"))

    def wait_isr(self, topic: str, partition: int, ok: Callable[[set[int]], bool],
                 timeout_s: float = 30.0) -> set[int]:
        def found() -> set[int] | None:
            try:
                p = self.describe(topic).get(partition)
            except Exception:
                return None
            if p is None:
                return None
            isr = {int(r) for r in p.isrs}
            return isr if ok(isr) else None

        return set(wait_until(found, timeout_s, interval_s=0.1,
                              what=f"the ISR of {topic}-{partition}"))

    def create_topic(self, name: str, partitions: int = 1, rf: int = 3,
                     configs: dict[str, str] | None = None) -> None:
        from confluent_kafka.admin import NewTopic

        admin = self.admin()  # referenced until the result is in
        futs = admin.create_topics(
            [NewTopic(name, partitions, rf, config=configs or {})], request_timeout=30)
        futs[name].result(40)
        for p in range(partitions):
            self.wait_leader(name, p)


@contextmanager
def running_cluster(root: Path, zk_connect: str, n: int = 3,
                    overrides: dict[str, str] | None = None) -> Iterator[Cluster]:
    cluster = Cluster(root, zk_connect, n, overrides).start()
    try:
        yield cluster
    finally:
        cluster.stop()
