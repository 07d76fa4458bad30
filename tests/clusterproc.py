"""A local headrace cluster for tests: brokers as separate processes on one ZooKeeper.

Each broker is started exactly as users (and outside checks) start one::

    headrace broker --data-dir DIR --port PORT --broker-id N \\
        --zookeeper 127.0.0.1:ZKPORT/chroot -o zookeeper.session.timeout.ms=3000 \\
        -o replica.lag.time.max.ms=3000 ...

and can be killed (SIGKILL), paused (SIGSTOP / SIGCONT) and restarted on the same data dir
and port. Every wait is a poll with a deadline (``wait_until``).

The timeouts (``FAULT_TIMEOUTS``) are the smallest that still make sense on a loaded
2-core machine, because the fault tests wait them out: a killed or paused broker is
declared dead after the ZooKeeper session timeout (3 s: kazoo pings every 1 s and gives
a silent server 2 s, so a starved process keeps its session), a paused follower leaves
the ISR after ``replica.lag.time.max.ms`` (3 s, six times the follower's 500 ms long
poll), and a follower whose fetch failed (its leader died) retries after 250 ms. Kafka's
defaults are 18 s, 30 s and 1 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headrace.cluster.zk_layout import LayoutError
from tests.brokerproc import _LISTENING, wait_until
from tests.ports import reserve_port

SESSION_TIMEOUT_MS = 3000
LAG_TIME_MS = 3000
FAULT_TIMEOUTS = {
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "replica.lag.time.max.ms": str(LAG_TIME_MS),
    "replica.fetch.backoff.ms": "250",
}


def free_port() -> int:
    """A port a broker can be restarted on (outside the ephemeral range: tests/ports.py)."""
    return reserve_port()


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
                "--log-level", os.environ.get("HEADRACE_TEST_LOG_LEVEL", "INFO")]
        for k, v in {**FAULT_TIMEOUTS, **self.overrides}.items():
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


class ClusterUnhealthy(AssertionError):
    """The cluster did not reach its healthy state in time (the message says what is off)."""


class Cluster:
    """``n`` brokers (ids 1..n) on one ZooKeeper chroot, data dirs under ``root``.

    **Healthy** (``problems()`` is empty) means: every broker registered in ZooKeeper, a
    live controller, no reassignment or topic deletion pending, every partition led by a
    live broker with its whole assignment in the ISR; and (``wire_health``, plaintext
    listeners only) every broker's Metadata answer names all brokers, the same controller
    and the same leader and ISR as ZooKeeper for every partition (its cache caught up).
    ``restore()`` brings a cluster back towards that state (paused brokers resumed, dead
    ones restarted); ``wait_healthy`` polls ``problems()`` with a deadline.
    """

    def __init__(self, root: Path, zk_connect: str, n: int = 3,
                 overrides: dict[str, str] | None = None, metrics: bool = False) -> None:
        self.root = root
        self.zk_connect = zk_connect
        self.brokers = {i: ClusterBroker(i, root / f"broker-{i}", zk_connect, overrides)
                        for i in range(1, n + 1)}
        if metrics:  # each broker serves /metrics, /ready, /health on a port of its own
            for b in self.brokers.values():
                b.overrides["metrics.port"] = str(free_port())
        self.wire_health = True
        self._zk: Any = None
        self._log_checked = {i: 0 for i in self.brokers}

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

    def stop(self, kill: bool = False) -> None:
        """Every broker stopped: SIGTERM (a controlled shutdown each), or SIGKILL."""
        for b in self.brokers.values():
            if kill:
                b.kill()
                continue
            try:
                b.stop(timeout_s=20)
            except RuntimeError:
                b.kill()
        self.close_zk()

    # ------------------------------------------------------------------ logs
    def write_logs(self) -> None:
        """Every broker's whole log kept beside its data (read it after a failure)."""
        for b in self.brokers.values():
            (self.root / f"broker-{b.broker_id}.log").write_text("".join(b.log))

    def new_tracebacks(self) -> str | None:
        """The first traceback a broker logged since the last call (a bug, whatever the
        faults were), with the lines around it; None if there is none."""
        found = None
        for b in self.brokers.values():
            lines = list(b.log)
            start, self._log_checked[b.broker_id] = self._log_checked[b.broker_id], len(lines)
            bad = [i for i in range(start, len(lines)) if "Traceback" in lines[i]]
            if bad and found is None:
                found = f"broker {b.broker_id} logged a traceback:\n" + "".join(
                    lines[max(bad[0] - 10, 0):bad[0] + 50])
        return found

    # ------------------------------------------------------------------ health
    def zk(self) -> Any:
        """A kazoo client on the cluster's chroot (one, kept until ``close_zk``)."""
        if self._zk is None:
            from kazoo.client import KazooClient

            zk = KazooClient(hosts=self.zk_connect, timeout=10)
            zk.start(timeout=30)
            self._zk = zk
        return self._zk

    def close_zk(self) -> None:
        zk, self._zk = self._zk, None
        if zk is not None:
            with contextlib.suppress(Exception):
                zk.stop()
                zk.close()

    def zk_partitions(self) -> tuple[set[int], int, dict[tuple[str, int], _PartitionView],
                                     list[str]]:
        """(registered broker ids, controller id, partition -> (replicas, leader, ISR), the
        reassignments and deletions pending) as ZooKeeper has them."""
        from kazoo.exceptions import NoNodeError

        from headrace.cluster import zk_layout as L

        zk = self.zk()

        def children(path: str) -> list[str]:
            try:
                return list(zk.get_children(path))
            except NoNodeError:
                return []

        ids = {int(x) for x in children(L.BROKER_IDS)}
        try:
            controller = L.decode_controller(zk.get(L.CONTROLLER)[0])
        except NoNodeError:
            controller = -1
        pending = []
        if zk.exists(L.REASSIGN_PARTITIONS):
            pending.append("a partition reassignment is in progress")
        if deleting := children(L.DELETE_TOPICS):
            pending.append(f"topic deletion pending: {sorted(deleting)}")
        reads = {t: zk.get_async(L.topic_path(t)) for t in children(L.TOPICS)}
        assignments = {}
        for t, r in reads.items():
            try:
                assignments[t] = L.decode_topic(t, r.get(timeout=10)[0])
            except NoNodeError:
                continue
            if assignments[t].adding or assignments[t].removing:
                pending.append(f"topic {t} is being reassigned")
        states = {(t, p): zk.get_async(L.state_path(t, p))
                  for t, a in assignments.items() for p in a.partitions}
        parts: dict[tuple[str, int], _PartitionView] = {}
        for (t, p), r in states.items():
            replicas = assignments[t].partitions[p]
            try:
                leader, _, isr, _ = L.decode_state(f"{t}-{p}", r.get(timeout=10)[0])
            except NoNodeError:
                leader, isr = -1, []
            parts[(t, p)] = (sorted(replicas), leader, sorted(isr))
        return ids, controller, parts, pending

    def problems(self) -> list[str]:
        """What keeps the cluster from being healthy (see the class); [] when it is."""
        ids, controller, parts, out = self.zk_partitions()
        if missing := sorted(set(self.brokers) - ids):
            out.append(f"broker(s) {missing} not registered in ZooKeeper")
        if controller not in ids:
            out.append(f"no live controller (ZooKeeper names {controller})")
        offline = [f"{t}-{p}" for (t, p), (_, leader, _) in sorted(parts.items())
                   if leader not in ids]
        under = [f"{t}-{p} (ISR {isr} of {replicas})"
                 for (t, p), (replicas, leader, isr) in sorted(parts.items())
                 if leader in ids and isr != replicas]
        if offline:
            out.append(f"{len(offline)} offline partition(s): {', '.join(offline[:5])}")
        if under:
            out.append(f"{len(under)} under-replicated partition(s): {', '.join(under[:5])}")
        if out or not self.wire_health:
            return out
        for b in self.brokers.values():
            try:
                seen = _metadata(b.address)
            except (OSError, ConnectionError) as e:
                out.append(f"broker {b.broker_id} does not answer Metadata ({e})")
                continue
            nodes, said_controller, view = seen
            if nodes != set(self.brokers):
                out.append(f"broker {b.broker_id}'s Metadata lists brokers {sorted(nodes)}")
            if said_controller != controller:
                out.append(f"broker {b.broker_id}'s Metadata names controller "
                           f"{said_controller}, ZooKeeper {controller}")
            stale = sorted(f"{t}-{p}" for t, p in set(parts) | set(view)
                           if view.get((t, p)) != parts.get((t, p)))
            if stale:
                out.append(f"broker {b.broker_id}'s Metadata differs from ZooKeeper for "
                           f"{len(stale)} partition(s): {', '.join(stale[:5])}")
        return out

    def restore(self) -> list[str]:
        """Paused brokers resumed, dead ones restarted (side by side). Returns what was
        found that a test does not do: a broker that exited by itself (a crash)."""
        crashed = []
        for b in self.brokers.values():
            if b.proc is not None and b.proc.poll() is not None:
                crashed.append(f"broker {b.broker_id} exited by itself (code "
                               f"{b.proc.returncode}); its log ends:\n" + "".join(b.log[-30:]))
                b.proc, b.paused = None, False
            if b.paused:
                b.resume()
        dead = [b for b in self.brokers.values() if not b.alive]
        errors: list[str] = []

        def start(b: ClusterBroker) -> None:
            try:
                b.start()
            except Exception as e:
                errors.append(f"broker {b.broker_id} did not restart: {e}")

        threads = [threading.Thread(target=start, args=(b,)) for b in dead]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        if errors:
            raise ClusterUnhealthy("; ".join(errors))
        return crashed

    def wait_healthy(self, timeout_s: float = 90.0) -> None:
        """Poll ``problems()`` until there are none; ClusterUnhealthy with the last ones
        after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        last: list[str] = []
        while True:
            try:
                last = self.problems()
            except LayoutError as e:  # permanent: no use waiting
                raise ClusterUnhealthy(f"a znode is not in Kafka's layout: {e}") from None
            except Exception as e:  # ZooKeeper or a broker busy: ask again
                last = [f"health check failed: {type(e).__name__}: {e}"]
            if not last:
                return
            if time.monotonic() > deadline:
                raise ClusterUnhealthy(f"not healthy after {timeout_s:.0f} s: "
                                       + "; ".join(last))
            time.sleep(0.1)

    # ------------------------------------------------------------------ faults
    def kill_all(self) -> None:
        for b in self.brokers.values():
            b.kill()

    # ------------------------------------------------------------------ clients
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


_PartitionView = tuple[list[int], int, list[int]]  # (replicas, leader, ISR), sorted


def _metadata(address: str) -> tuple[set[int], int, dict[tuple[str, int], _PartitionView]]:
    """(broker ids, controller id, partition -> (replicas, leader, ISR)) in one broker's
    Metadata v12 answer for every topic."""
    from tests.kafka_wire import WireClient

    with WireClient.to(address, timeout_s=5) as wc:
        md = wc.request(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False})
    view = {(str(t.name), int(p.partition_index)):
            (sorted(int(r) for r in p.replica_nodes), int(p.leader_id),
             sorted(int(r) for r in p.isr_nodes))
            for t in md.topics for p in t.partitions}
    return {int(b.node_id) for b in md.brokers}, int(md.controller_id), view
