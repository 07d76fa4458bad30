"""Cluster benchmarks (issue 9): a local 3-broker cluster (``headrace.cluster.local``) on
one machine, with confluent-kafka clients.

1. Produce throughput, RF 1 vs RF 3 (acks=all, min.insync.replicas=2 for RF 3), 1 KiB
   records into 8 partitions, side by side in one run, with each broker's CPU
   (user+sys seconds from /proc over the phase) beside the figures.
2. End-to-end acks=all latency (p50/p99/p99.9 of the delivery reports) at a fixed rate,
   RF 1 vs RF 3, from the C load generator (``loadgen -r``) when it is built.
3. Failover: kill -9 the leader of a 1-partition RF 3 topic during a steady acks=all
   stream; the time from the kill to the first acknowledgement of a record sent after it.
   Then the same for a broker leading ``--big`` partitions (default 1,000: a 3,000-partition
   RF 3 topic): the time until every partition it led has acknowledged a record sent after
   the kill. And the controller: kill -9 it, time until Metadata names another.
4. Start-up with the big topic: a broker's restart time (process start to listening) and
   its resident memory.
5. Scale (``--scale 3000,10000,30000``, issue 21 item 5): for each N a fresh 3-broker
   cluster on a fresh ZooKeeper; N partitions RF 3 are created as a user would (topics of
   ``--topic-partitions`` partitions, several topics per CreateTopics request through the
   admin client); the time until Metadata shows every partition with a leader and a full
   ISR; then kill -9 the broker leading the most partitions and time until Metadata names
   a live leader for every partition it led and until each of them (or a ``--probe``
   sample) acknowledged an acks=all record sent after the kill; then restart it and time
   until every ISR is full again. Beside each phase: ZooKeeper's watch count (``wchs``)
   and znode count (``mntr``), each broker's resident memory, open file descriptors and
   CPU seconds. A run stops if brokers and ZooKeeper together pass ``--max-rss-mb``.

``zookeeper.session.timeout.ms`` is stated in the output (default 6000 here): a dead
broker is noticed when its session expires, so failover >= that. Three brokers share the
machine's cores: the RF 3 / RF 1 ratio says where the CPU goes, not what three machines do.

    .venv/bin/python bench/cluster_bench.py [--quick] [--big 1000] [--session-ms 6000]
    .venv/bin/python bench/cluster_bench.py --scale 3000,10000,30000 [--probe 0]
        [--probe-producers 1] [--probe-client confluent|aiokafka] [--keep]
        [--profile-dir D --profile-seconds 30]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from headrace.cluster.local import LocalCluster
from headrace.cluster.zookeeper_server import four_letter_word

CLK = os.sysconf("SC_CLK_TCK")


LOADGEN = Path(__file__).resolve().parent / "build" / "loadgen"


def _cpu_by_second(marks: list[dict[str, float]], t0: float) -> dict[str, dict[str, float]]:
    """CPU seconds per process (``bench``: this process; ``busy_cores``: the machine) in
    each interval between ``marks`` (``cpu_now()`` results), keyed by the interval's start
    in whole seconds after ``t0``."""
    out: dict[str, dict[str, float]] = {}
    for a, b in itertools.pairwise(marks):
        wall = max(b["_wall"] - a["_wall"], 1e-9)
        row = {k.lstrip("_") if k != "_machine" else "busy_cores":
               round((b[k] - a[k]) / (wall if k == "_machine" else 1.0), 2)
               for k in b if k in a and k != "_wall" and b[k] >= a[k]}  # not the killed
        out[str(int(a["_wall"] - t0 + 0.5))] = row
    return out


def _histogram(seconds: list[float]) -> dict[int, int]:
    """How many partitions first acknowledged a write in each whole second after the kill."""
    out: dict[int, int] = {}
    for s in seconds:
        out[int(s)] = out.get(int(s), 0) + 1
    return dict(sorted(out.items()))


def cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every core; not idle, not iowait)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return (sum(fields[:8]) - fields[3] - fields[4]) / CLK
    except (OSError, ValueError, IndexError):
        return 0.0


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Bench:
    def __init__(self, cluster: LocalCluster, bootstrap: str,
                 profile_dir: str | None = None) -> None:
        self.cluster = cluster
        self.profile_dir = profile_dir
        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap})

    def pids(self) -> dict[int, int]:
        return {i: b.proc.pid for i, b in self.cluster.brokers.items() if b.proc is not None}

    def create(self, name: str, partitions: int, rf: int, timeout_s: float = 120) -> float:
        configs = {"min.insync.replicas": "2"} if rf >= 3 else {}
        t0 = time.monotonic()
        self.admin.create_topics([NewTopic(name, partitions, rf, config=configs)],
                                 request_timeout=timeout_s)[name].result(timeout_s + 10)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            md = self.admin.list_topics(topic=name, timeout=10).topics[name]
            if len(md.partitions) == partitions and all(
                    p.leader >= 0 and len(p.isrs) == rf for p in md.partitions.values()):
                return time.monotonic() - t0
            time.sleep(0.2)
        raise TimeoutError(f"{name}: not every partition has a leader and a full ISR")

    def throughput(self, name: str, records: int, size: int, partitions: int) -> dict[str, Any]:
        conf = {"acks": "all", "enable.idempotence": True, "linger.ms": 5,
                "batch.size": 262144, "batch.num.messages": 10000,
                "queue.buffering.max.messages": 500000, "queue.buffering.max.kbytes": 1048576}
        # the last phase's gigabytes of page cache written back first: a run that starts
        # while the kernel writes them back made about half the rate (RF 1 and RF 3 alike)
        os.sync()
        if LOADGEN.is_file():  # the C load generator (bash bench/setup.sh builds it)
            pids = self.pids()
            cpu0 = {i: cpu_s(pid) for i, pid in pids.items()}
            t0 = time.monotonic()
            x = [a for k, v in conf.items()
                 for a in ("-X", f"{k}={str(v).lower() if isinstance(v, bool) else v}")]
            out = subprocess.run([str(LOADGEN), "-P", "-b", self.bootstrap, "-t", name,
                                  "-p", str(partitions), "-s", str(size), "-n", str(records),
                                  "-T", "300", *x], capture_output=True, text=True, timeout=400)
            wall = time.monotonic() - t0
            r = json.loads(out.stdout.strip().splitlines()[-1])
            return {"records_per_s": round(r["records_per_s"]), "mb_per_s": r["mb_per_s"],
                    "failed": r["failed"] + r["undelivered"], "client": "C loadgen",
                    "client_cpu": r["client_cpu"],
                    "broker_cpu": {i: round((cpu_s(pid) - cpu0[i]) / wall, 2)
                                   for i, pid in pids.items()}}
        p = Producer({"bootstrap.servers": self.bootstrap, **conf})
        value = os.urandom(size)
        failed = [0]
        for part in range(partitions):  # warm up: metadata and connections before timing
            p.produce(name, value, partition=part)
        p.flush(30)

        def dr(err: Any, _m: Any) -> None:
            if err is not None:
                failed[0] += 1

        pids = self.pids()
        cpu0 = {i: cpu_s(pid) for i, pid in pids.items()}
        t0 = time.monotonic()
        for i in range(records):
            while True:
                try:
                    p.produce(name, value, partition=i % partitions, on_delivery=dr)
                    break
                except BufferError:
                    p.poll(0.01)
        p.flush(300)
        wall = time.monotonic() - t0
        cpu = {i: round((cpu_s(pid) - cpu0[i]) / wall, 2) for i, pid in pids.items()}
        return {"records_per_s": round(records / wall), "mb_per_s": round(
            records * size / wall / 1e6, 1), "failed": failed[0], "broker_cpu": cpu}

    def latency(self, name: str, rate: int, seconds: float, size: int = 1024) -> dict[str, Any]:
        """acks=all delivery latency at ``rate`` records/s: with the C load generator when
        it is built (``-r``: a fixed schedule; a Python loop polling every millisecond took
        most of a core of this 2-core machine, beside the three brokers it measures), else
        with a confluent-kafka producer in this process. The brokers' CPU beside it."""
        n = int(rate * seconds)
        pids = self.pids()
        cpu0 = {i: cpu_s(pid) for i, pid in pids.items()}
        t0 = time.monotonic()
        if LOADGEN.is_file():
            out = subprocess.run([str(LOADGEN), "-P", "-b", self.bootstrap, "-t", name,
                                  "-s", str(size), "-n", str(n), "-r", str(rate),
                                  "-T", str(seconds * 3 + 30), "-X", "acks=all",
                                  "-X", "enable.idempotence=true", "-X", "linger.ms=0"],
                                 capture_output=True, text=True, timeout=seconds * 3 + 60)
            wall = time.monotonic() - t0
            r = json.loads(out.stdout.strip().splitlines()[-1])
            return {"p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"], "p999_ms": r["p999_ms"],
                    "acked": r["delivered"], "sent": r["records"], "client": "C loadgen",
                    "client_cpu": r["client_cpu"],
                    "broker_cpu": {i: round((cpu_s(pid) - cpu0[i]) / wall, 2)
                                   for i, pid in pids.items()}}
        p = Producer({"bootstrap.servers": self.bootstrap, "acks": "all",
                      "enable.idempotence": True, "linger.ms": 0})
        lat: list[float] = []

        def dr(err: Any, m: Any) -> None:
            if err is None:
                lat.append(time.monotonic() - float(m.key()))

        value = os.urandom(size)
        p.produce(name, value, key=repr(time.monotonic()).encode())
        p.flush(30)
        lat.clear()  # the warm-up record (metadata, connection) is not measured
        t0 = time.monotonic()
        for i in range(n):
            due = t0 + i / rate
            while (now := time.monotonic()) < due:
                p.poll(min(due - now, 0.001))
            p.produce(name, value, key=repr(time.monotonic()).encode(), on_delivery=dr)
        p.flush(60)
        lat.sort()

        def pct(q: float) -> float:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 2) if lat else -1

        wall = time.monotonic() - t0
        return {"p50_ms": pct(0.5), "p99_ms": pct(0.99), "p999_ms": pct(0.999),
                "acked": len(lat), "sent": n, "client": "confluent-kafka (Python)",
                "broker_cpu": {i: round((cpu_s(pid) - cpu0[i]) / wall, 2)
                               for i, pid in pids.items()}}

    def leaders(self, name: str) -> dict[int, int]:
        md = self.admin.list_topics(topic=name, timeout=10).topics[name]
        return {pid: p.leader for pid, p in md.partitions.items()}

    def failover(self, name: str, victim_partitions: set[int] | None = None,
                 timeout_s: float = 120, kill_controller: bool = False) -> dict[str, Any]:
        """kill -9 the leader of partition 0 (or of the topic's most partitions, or the
        controller); the time until every partition it led acked a record sent after the
        kill."""
        leaders = self.leaders(name)
        counts: dict[int, int] = {}
        for b in leaders.values():
            counts[b] = counts.get(b, 0) + 1
        victim = leaders[0] if victim_partitions is None else max(counts, key=counts.get)  # type: ignore[arg-type]
        if kill_controller:
            victim = self.admin.list_topics(timeout=10).controller_id
        led = sorted(p for p, b in leaders.items() if b == victim)
        p = Producer({"bootstrap.servers": self.bootstrap, "acks": "all",
                      "enable.idempotence": True, "linger.ms": 2,
                      "topic.metadata.refresh.interval.ms": 500, "retry.backoff.ms": 50,
                      "message.timeout.ms": int(timeout_s * 1000)})
        killed_at = [0.0]
        first_ack: dict[int, float] = {}
        inflight: set[int] = set()

        errors: dict[str, int] = {}

        def dr(err: Any, m: Any) -> None:
            inflight.discard(m.partition())
            if err is not None:
                errors[err.name()] = errors.get(err.name(), 0) + 1
            # an ack a second or more after the kill can only come from the new leader
            # (whether the record was sent before the kill and retried, or after it)
            now = time.monotonic()
            if err is None and killed_at[0] and now > killed_at[0] + 1.0:
                first_ack.setdefault(m.partition(), now)

        stop = threading.Event()

        def stream() -> None:
            # one probe in flight per partition: the measuring producer's queue never
            # fills while the dead leader's partitions wait, so it is not the bottleneck
            while not stop.is_set():
                for part in led:
                    if part in inflight or part in first_ack:
                        continue
                    try:
                        p.produce(name, b"x", key=repr(time.monotonic()).encode(),
                                  partition=part, on_delivery=dr)
                        inflight.add(part)
                    except BufferError:
                        break
                p.poll(0.02)
            p.flush(30)

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        time.sleep(2)
        killed_at[0] = time.monotonic()
        self.cluster.brokers[victim].kill()
        spy = self.profile_dir  # py-spy profiles of the survivors through the failover
        if spy:
            import subprocess
            for i, pid in self.pids().items():
                if i != victim:
                    subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record",
                                      "-p", str(pid), "-d", "40", "-f", "raw", "-o",
                                      f"{spy}/broker-{i}.txt"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        live = ",".join(f"127.0.0.1:{b.port}" for i, b in self.cluster.brokers.items()
                        if i != victim)
        md_admin = AdminClient({"bootstrap.servers": live})
        moved_s: float | None = None
        while len(first_ack) < len(led) and time.monotonic() < deadline:
            if moved_s is None:  # when metadata first shows every partition moved
                with contextlib.suppress(Exception):
                    parts = md_admin.list_topics(topic=name, timeout=5).topics[name].partitions
                    if all(parts[q].leader not in (victim, -1) for q in led):
                        moved_s = time.monotonic() - killed_at[0]
            time.sleep(0.05 if moved_s is not None else 0.2)
        stop.set()
        t.join(60)
        done = [first_ack[q] - killed_at[0] for q in led if q in first_ack]
        result = {"broker_killed": victim, "was_controller": kill_controller,
                  "partitions_it_led": len(led),
                  "partitions_acked_after_kill": len(done), "waited_s": timeout_s,
                  "all_writable_s": round(max(done), 2) if len(done) == len(led) else None,
                  "median_s": round(statistics.median(done), 2) if done else None,
                  "metadata_moved_s": round(moved_s, 2) if moved_s is not None else None,
                  "delivery_errors": errors,
                  "acked_by_second": _histogram(done)}
        self.cluster.restart(victim)
        return result

    def controller_failover(self, timeout_s: float = 60) -> dict[str, Any]:
        old = self.admin.list_topics(timeout=10).controller_id
        t0 = time.monotonic()
        self.cluster.brokers[old].kill()
        live = ",".join(f"127.0.0.1:{b.port}" for i, b in self.cluster.brokers.items()
                        if i != old)
        admin = AdminClient({"bootstrap.servers": live})
        new = -1
        while time.monotonic() - t0 < timeout_s:
            new = admin.list_topics(timeout=5).controller_id
            if new not in (-1, old):
                break
            time.sleep(0.05)
        took = time.monotonic() - t0
        self.cluster.restart(old)
        return {"old": old, "new": new, "seconds": round(took, 2)}

    def restart_time(self, broker_id: int) -> dict[str, Any]:
        b = self.cluster.brokers[broker_id]
        b.stop()
        t0 = time.monotonic()
        self.cluster.restart(broker_id)
        took = time.monotonic() - t0
        time.sleep(2)
        assert b.proc is not None
        return {"restart_to_listening_s": round(took, 2), "rss_mb": round(rss_mb(b.proc.pid))}


class _AioProbeProducer:
    """aiokafka's producer behind the part of confluent-kafka's Producer that the scale
    failover uses (produce with a delivery callback, poll, flush, list_topics), on its own
    event loop in a thread. aiokafka, like Kafka's Java producer, sends one Produce request
    per broker with every partition that has a batch ready, one request in flight per
    broker."""

    class _Msg:
        def __init__(self, topic: str, partition: int) -> None:
            self._tp = (topic, partition)

        def topic(self) -> str:
            return self._tp[0]

        def partition(self) -> int:
            return self._tp[1]

    class _Err:
        def __init__(self, e: BaseException) -> None:
            self._name = type(e).__name__

        def name(self) -> str:
            return self._name

    def __init__(self, bootstrap: str, topics: list[str], timeout_s: float) -> None:
        import asyncio

        from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

        self.topics = topics
        self._sends: set[Any] = set()  # the tasks sending, held until done
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="aiokafka-probes")
        self._thread.start()

        async def make() -> Any:
            p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                                 metadata_max_age_ms=1000, retry_backoff_ms=100,
                                 request_timeout_ms=int(timeout_s * 1000))
            await p.start()
            return p

        self.producer = self._run(make(), 60)

    def _run(self, coro: Any, timeout_s: float) -> Any:
        import asyncio
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def list_topics(self, timeout: float) -> None:
        async def known() -> None:
            for t in self.topics:
                await self.producer.partitions_for(t)
        self._run(known(), timeout)

    def produce(self, topic: str, value: bytes, partition: int, on_delivery: Any) -> None:
        async def send() -> None:
            msg = self._Msg(topic, partition)
            try:
                fut = await self.producer.send(topic, value, partition=partition)
                await fut
            except Exception as e:  # a failed delivery: the caller sends it again
                on_delivery(self._Err(e), msg)
            else:
                on_delivery(None, msg)
        def start() -> None:
            task = self.loop.create_task(send())
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)
        self.loop.call_soon_threadsafe(start)

    def poll(self, timeout: float) -> int:
        time.sleep(timeout)  # delivery callbacks run on the producer's own loop
        return 0

    def flush(self, timeout: float) -> None:
        with contextlib.suppress(Exception):
            self._run(self.producer.flush(), timeout)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._run(self.producer.stop(), 30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class ScaleRun:
    """The scale scenario for one partition count (see the module docstring, item 5)."""

    def __init__(self, cluster: LocalCluster, bootstrap: str, partitions: int,
                 per_topic: int, topics_per_request: int, max_rss_mb: float,
                 profile_dir: str | None = None, profile_s: int = 30,
                 probe_producers: int = 1, probe_client: str = "confluent") -> None:
        self.cluster = cluster
        self.probe_producers = probe_producers
        self.probe_client = probe_client
        self.profile_dir = profile_dir
        self.profile_s = profile_s
        self.partitions = partitions
        # socket.timeout.ms: librdkafka's default 60 s also bounds an admin request that
        # waits on the broker (operation_timeout), and creating 10,000 partitions can take
        # longer on this machine
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 300_000})
        sizes = [per_topic] * (partitions // per_topic)
        if partitions % per_topic:
            sizes.append(partitions % per_topic)
        tag = uuid.uuid4().hex[:4]
        self.topics = {f"scale-{tag}-{i:03d}": n for i, n in enumerate(sizes)}
        self.topics_per_request = topics_per_request
        self.max_rss_mb = max_rss_mb
        self.peak_rss_mb = 0.0
        self.over_memory = threading.Event()
        self._stop_guard = threading.Event()

    # -- observation ------------------------------------------------------------------

    def processes(self) -> dict[str, int]:
        out = {f"broker-{i}": b.proc.pid for i, b in self.cluster.brokers.items()
               if b.proc is not None and b.proc.poll() is None}
        zk = self.cluster.zk.proc
        if zk is not None:  # zkServer.sh start-foreground execs java: the pid is the JVM's
            out["zookeeper"] = zk.pid
        return out

    def guard(self) -> None:
        """Stop the run (kill every process) once brokers + ZooKeeper pass max_rss_mb."""
        while not self._stop_guard.wait(1.0):
            total = sum(rss_mb(pid) for pid in self.processes().values())
            self.peak_rss_mb = max(self.peak_rss_mb, total)
            if total > self.max_rss_mb:
                say(f"!! brokers + ZooKeeper use {total:.0f} MB > {self.max_rss_mb:.0f} MB: "
                    "stopping this run")
                self.over_memory.set()
                for b in self.cluster.brokers.values():
                    b.kill()
                self.cluster.zk.stop()
                return

    def zk_counts(self) -> dict[str, Any]:
        port = self.cluster.zk.port
        out: dict[str, Any] = {}
        with contextlib.suppress(OSError):
            # "3 connections watching 30012 paths\nTotal watches:90036"
            w = four_letter_word(port, "wchs")
            m = re.search(r"(\d+) connections watching (\d+) paths.*?Total watches:\s*(\d+)",
                          w, re.S)
            if m:
                out["watches"] = int(m.group(3))
                out["watched_paths"] = int(m.group(2))
                out["watching_connections"] = int(m.group(1))
        with contextlib.suppress(OSError):
            mntr = dict(line.split("\t", 1) for line in four_letter_word(port, "mntr")
                        .splitlines() if "\t" in line)
            for k in ("zk_znode_count", "zk_approximate_data_size"):
                if k in mntr:
                    out[k[3:]] = int(mntr[k])
        return out

    def snapshot(self, cpu0: dict[str, float] | None = None) -> dict[str, Any]:
        """ZooKeeper's counts, and per process RSS (MB), open fds and CPU seconds (since
        ``cpu0`` when given)."""
        procs: dict[str, Any] = {}
        for name, pid in self.processes().items():
            cpu = cpu_s(pid)
            procs[name] = {"rss_mb": round(rss_mb(pid)), "fds": open_fds(pid),
                           "cpu_s": round(cpu - (cpu0 or {}).get(name, 0.0), 1)}
        out: dict[str, Any] = {"zookeeper": self.zk_counts(), "processes": procs}
        if cpu0 is not None and "_wall" in cpu0:
            # is the machine itself the limit? Its busy cores over the phase (of
            # os.cpu_count()), and this process's own share (the probing clients)
            wall = max(time.monotonic() - cpu0["_wall"], 1e-9)
            out["machine"] = {
                "cores": os.cpu_count(),
                "busy_cores": round((machine_busy_s() - cpu0["_machine"]) / wall, 2),
                "bench_cpu_s": round(cpu_s(os.getpid()) - cpu0["_bench"], 1)}
        return out

    def cpu_now(self) -> dict[str, float]:
        out = {name: cpu_s(pid) for name, pid in self.processes().items()}
        out.update(_wall=time.monotonic(), _machine=machine_busy_s(), _bench=cpu_s(os.getpid()))
        return out

    # -- phases -----------------------------------------------------------------------

    def metadata(self, admin: AdminClient) -> dict[str, dict[int, Any]]:
        md = admin.list_topics(timeout=30)
        return {t: md.topics[t].partitions for t in self.topics if t in md.topics}

    def wait_healthy(self, admin: AdminClient, timeout_s: float,
                     live: set[int] | None = None) -> float | None:
        """Seconds until Metadata shows every partition with a leader and a full ISR (RF 3;
        or, with ``live``, a leader among ``live`` and an ISR of at least the live count)."""
        t0 = time.monotonic()
        want_isr = 3 if live is None else len(live)
        while time.monotonic() - t0 < timeout_s and not self.over_memory.is_set():
            with contextlib.suppress(Exception):
                md = self.metadata(admin)
                if len(md) == len(self.topics) and all(
                        len(md[t]) == n for t, n in self.topics.items()) and all(
                        p.leader >= 0 and (live is None or p.leader in live)
                        and len(p.isrs) >= want_isr
                        for parts in md.values() for p in parts.values()):
                    return time.monotonic() - t0
            time.sleep(0.5)
        return None

    def create(self, timeout_s: float) -> dict[str, Any]:
        cpu0 = self.cpu_now()
        t0 = time.monotonic()
        names = list(self.topics)
        for i in range(0, len(names), self.topics_per_request):
            batch = [NewTopic(t, self.topics[t], 3, config={"min.insync.replicas": "2"})
                     for t in names[i:i + self.topics_per_request]]
            # operation_timeout: the broker answers once every partition has a leader
            for fut in self.admin.create_topics(batch, request_timeout=timeout_s,
                                                operation_timeout=timeout_s).values():
                fut.result(timeout_s + 10)
        requests_s = time.monotonic() - t0
        healthy = self.wait_healthy(self.admin, timeout_s)
        return {"topics": len(self.topics), "create_requests_s": round(requests_s, 1),
                "all_leaders_full_isr_s": None if healthy is None
                else round(time.monotonic() - t0, 1),
                **self.snapshot(cpu0)}

    def probe_all(self, timeout_s: float) -> dict[str, Any]:
        """After creation: one acks=all record into every partition (min.insync.replicas=2,
        so a follower must have opened its log and fetched); seconds until all are acked."""
        producer = Producer({"bootstrap.servers": ",".join(
            f"127.0.0.1:{b.port}" for b in self.cluster.brokers.values()),
            "acks": "all", "linger.ms": 5, "retry.backoff.ms": 100,
            "message.timeout.ms": int(timeout_s * 1000), "queue.buffering.max.messages": 1_000_000})
        acked: set[tuple[str, int]] = set()
        retry: list[tuple[str, int]] = []
        errors: dict[str, int] = {}

        def dr(err: Any, m: Any) -> None:
            if err is None:
                acked.add((m.topic(), m.partition()))
            else:
                errors[err.name()] = errors.get(err.name(), 0) + 1
                retry.append((m.topic(), m.partition()))

        cpu0 = self.cpu_now()
        t0 = time.monotonic()
        for t, n in self.topics.items():
            for q in range(n):
                producer.produce(t, b"x", partition=q, on_delivery=dr)
        while len(acked) < self.partitions and time.monotonic() - t0 < timeout_s \
                and not self.over_memory.is_set():
            producer.poll(0.05)
            while retry:
                t, q = retry.pop()
                producer.produce(t, b"x", partition=q, on_delivery=dr)
        took = time.monotonic() - t0
        producer.flush(5)
        return {"acked": len(acked), "all_acked_s": round(took, 1)
                if len(acked) == self.partitions else None, "delivery_errors": errors,
                # one record per partition was sent: more means the client sent some again
                # (its own retries of a request it gave up on, not idempotent here)
                "records_written": self.records_written(), **self.snapshot(cpu0)}

    def records_written(self) -> int | None:
        """The sum of every partition's log end offset (ListOffsets latest)."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        try:
            req = {TopicPartition(t, q): OffsetSpec.latest()
                   for t, n in self.topics.items() for q in range(n)}
            futs = self.admin.list_offsets(req, request_timeout=60)
            return sum(f.result().offset for f in futs.values())
        except Exception as e:  # a measurement, not the phase: say it and go on
            say(f"records_written: {type(e).__name__}: {e}")
            return None

    def failover(self, probe: int, timeout_s: float) -> dict[str, Any]:
        md = self.metadata(self.admin)
        counts: dict[int, int] = {}
        for parts in md.values():
            for p in parts.values():
                counts[p.leader] = counts.get(p.leader, 0) + 1
        victim = max(counts, key=counts.get)  # type: ignore[arg-type]
        led = [(t, q) for t, parts in md.items() for q, p in parts.items() if p.leader == victim]
        sample = led if probe <= 0 or probe >= len(led) else random.sample(led, probe)
        live_ids = {i for i in self.cluster.brokers if i != victim}
        live = ",".join(f"127.0.0.1:{self.cluster.brokers[i].port}" for i in live_ids)
        md_admin = AdminClient({"bootstrap.servers": live})
        # librdkafka sends one partition per Produce request (this producer is not
        # idempotent; counted on the brokers: one Produce per partition probed);
        # aiokafka, as Kafka's Java producer, one request per broker with every partition
        # ready for it
        # ``probe_producers`` producers share the probes (partition i -> producer i % n), so
        # that one client's throughput is not what is measured (the load generator must
        # not be the limit)
        producers: list[Any]
        if self.probe_client == "aiokafka":
            # as Kafka's Java producer: one Produce request per broker carries every
            # partition ready for it (librdkafka sends one partition per request)
            producers = [_AioProbeProducer(live, sorted({t for t, _ in sample}), timeout_s)
                         for _ in range(max(1, self.probe_producers))]
        else:
            producers = [Producer({"bootstrap.servers": live, "acks": "all",
                                   "linger.ms": 5,
                                   "topic.metadata.refresh.interval.ms": 1000,
                                   "retry.backoff.ms": 100,
                                   "message.timeout.ms": int(timeout_s * 1000),
                                   "queue.buffering.max.messages": 1_000_000})
                         for _ in range(max(1, self.probe_producers))]
        for producer in producers:  # connections and metadata before the kill
            producer.list_topics(timeout=30)
        owner = {tp: producers[i % len(producers)] for i, tp in enumerate(sample)}
        acked: dict[tuple[str, int], float] = {}
        errors: dict[str, int] = {}
        retry: list[tuple[str, int]] = []

        def dr(err: Any, m: Any) -> None:
            if err is None:
                acked.setdefault((m.topic(), m.partition()), time.monotonic())
            else:
                errors[err.name()] = errors.get(err.name(), 0) + 1
                retry.append((m.topic(), m.partition()))

        # this process's garbage collector stays out of the measurement: with the Metadata
        # of 30,000 partitions alive (and polled again every 0.5 s below), each full
        # collection walked all of it; a perf profile of this process during the
        # failover had 60% of its samples in the collector, and this process then took a
        # core of the two the brokers fail over on. Everything alive now is frozen
        # (never walked again) and collection waits until the phase ends (the objects
        # made meanwhile are freed by reference counting; none is cyclic)
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            result = self._failover(victim, led, sample, live_ids, producers, owner, acked,
                                    errors, retry, dr, md_admin, timeout_s)
            return {"probe_client": self.probe_client, **result}
        finally:
            gc.enable()
            gc.unfreeze()
            for producer in producers:
                if isinstance(producer, _AioProbeProducer):
                    producer.close()

    def _failover(self, victim: int, led: list[tuple[str, int]],
                  sample: list[tuple[str, int]], live_ids: set[int], producers: list[Any],
                  owner: dict[tuple[str, int], Any], acked: dict[tuple[str, int], float],
                  errors: dict[str, int], retry: list[tuple[str, int]], dr: Any,
                  md_admin: AdminClient, timeout_s: float) -> dict[str, Any]:
        cpu0 = self.cpu_now()
        killed_at, killed_wall = time.monotonic(), time.time()
        self.cluster.brokers[victim].kill()
        spy = self.profile_dir  # py-spy profiles of the survivors through the failover
        if spy:
            for i, b in self.cluster.brokers.items():
                if i == victim or b.proc is None:
                    continue
                pid = b.proc.pid
                subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record",
                                  "--nonblocking", "-p", str(pid), "-d",
                                  str(self.profile_s), "-f", "raw",
                                  "-o", f"{spy}/scale-{self.partitions}-broker-{i}.txt"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # every probe is sent after the kill, so only a new leader can acknowledge it
        for t, q in sample:
            owner[(t, q)].produce(t, b"x", partition=q, on_delivery=dr)
        moved_s: float | None = None
        # when Metadata first named a live leader for each probed partition: with the
        # acknowledgements, where a failover's time goes (leaders late, or writes after)
        led_at: dict[tuple[str, int], float] = {}
        deadline = killed_at + timeout_s
        # a Metadata of every partition every 0.5 s: asked back to back, the survivors
        # spent a fifth of their event loop answering the benchmark's own polling
        next_md = killed_at
        # each process's CPU second by second after the kill (the brokers', ZooKeeper's,
        # this process's, the machine's busy cores): whether a second was spent waiting
        # or the machine was the limit, and who used it
        cpu_marks: list[dict[str, float]] = [cpu0]
        next_mark = killed_at + 1.0
        while time.monotonic() < deadline and not self.over_memory.is_set():
            if time.monotonic() >= next_mark:
                next_mark += 1.0
                cpu_marks.append(self.cpu_now())
            for producer in producers:
                producer.poll(0.05 / len(producers))
            while retry:
                t, q = retry.pop()
                owner[(t, q)].produce(t, b"x", partition=q, on_delivery=dr)
            if moved_s is None and time.monotonic() >= next_md:
                next_md = time.monotonic() + 0.5
                with contextlib.suppress(Exception):
                    now_md = self.metadata(md_admin)
                    seen = time.monotonic() - killed_at
                    for t, q in sample:
                        if (t, q) not in led_at and now_md[t][q].leader in live_ids:
                            led_at[(t, q)] = seen
                    if all(now_md[t][q].leader in live_ids for t, q in led):
                        moved_s = time.monotonic() - killed_at
            if moved_s is not None and len(acked) == len(sample):
                break
        for producer in producers:
            producer.flush(5)
        done = sorted(acked[k] - killed_at for k in sample if k in acked)
        during = self.snapshot(cpu0)
        cpu_marks.append(self.cpu_now())
        result = {"broker_killed": victim, "partitions_it_led": len(led),
                  "probed": len(sample), "acked": len(done),
                  "metadata_moved_s": round(moved_s, 2) if moved_s is not None else None,
                  "all_probes_acked_s": round(done[-1], 2) if len(done) == len(sample)
                  else None,
                  "median_probe_s": round(statistics.median(done), 2) if done else None,
                  "delivery_errors": errors, "acked_by_second": _histogram(done),
                  "led_by_second": _histogram(list(led_at.values())),
                  "cpu_by_second": _cpu_by_second(cpu_marks, killed_at),
                  # the kill's wall-clock time, to read the brokers' logs (--keep) against
                  "killed_at_unix": round(killed_wall, 3), **during}
        return result

    def rebalance(self, timeout_s: float) -> float | None:
        """A preferred leader election of every partition (ElectLeaders), then seconds until
        Metadata shows each partition led by its first replica, as created."""
        from confluent_kafka import ElectionType
        t0 = time.monotonic()
        with contextlib.suppress(Exception):
            self.admin.elect_leaders(ElectionType.PREFERRED, None).result(timeout_s)
        while time.monotonic() - t0 < timeout_s:
            with contextlib.suppress(Exception):
                md = self.metadata(self.admin)
                if all(p.leader == p.replicas[0] and len(p.isrs) == 3
                       for parts in md.values() for p in parts.values()):
                    return round(time.monotonic() - t0, 1)
            time.sleep(0.5)
        return None

    def rejoin(self, victim: int, timeout_s: float) -> dict[str, Any]:
        cpu0 = self.cpu_now()
        t0 = time.monotonic()
        b = self.cluster.brokers[victim]
        b.start()  # not cluster.restart: opening thousands of logs can take over its 60 s
        if not b.wait_listening(timeout_s):
            raise RuntimeError(f"broker {victim} did not restart; see {b.log_path}")
        listening = time.monotonic() - t0
        healthy = self.wait_healthy(self.admin, timeout_s)
        return {"restart_to_listening_s": round(listening, 1),
                "all_isrs_full_s": None if healthy is None else round(time.monotonic() - t0, 1),
                **self.snapshot(cpu0)}


def run_scale(partitions: int, args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"headrace-scale-{partitions}-"))
    cluster = LocalCluster(root, 3, overrides=[
        f"zookeeper.session.timeout.ms={args.session_ms}", "replica.lag.time.max.ms=10000",
        *args.override])
    say(f"[{partitions}] starting ZooKeeper and 3 brokers in {root} ...")
    out: dict[str, Any] = {"partitions": partitions, "session_timeout_ms": args.session_ms}
    run: ScaleRun | None = None
    guard: threading.Thread | None = None
    try:
        bootstrap = cluster.start()
        run = ScaleRun(cluster, bootstrap, partitions, args.topic_partitions,
                       args.topics_per_request, args.max_rss_mb, args.profile_dir,
                       args.profile_seconds, args.probe_producers,
                       args.probe_client.split(",")[0])
        guard = threading.Thread(target=run.guard, daemon=True)
        guard.start()
        out["idle"] = run.snapshot()
        say(f"[{partitions}] creating {len(run.topics)} topics RF 3 ...")
        out["create"] = run.create(args.scale_timeout)
        say(f"[{partitions}] created: {out['create']['all_leaders_full_isr_s']} s")
        if out["create"]["all_leaders_full_isr_s"] is None:
            return out
        say(f"[{partitions}] one acks=all record into every partition ...")
        out["write_every_partition"] = run.probe_all(args.scale_timeout)
        say(f"[{partitions}] every partition acked: "
            f"{out['write_every_partition']['all_acked_s']} s")
        if out["write_every_partition"]["all_acked_s"] is None:
            return out
        cpu0 = run.cpu_now()  # followers' first fetch sessions, checkpoints: a steady state,
        time.sleep(args.settle)  # and what N idle partitions cost in CPU over it
        out["steady"] = {"seconds": args.settle, **run.snapshot(cpu0)}
        say(f"[{partitions}] kill -9 the broker leading the most partitions ...")
        out["failover"] = run.failover(args.probe, args.scale_timeout)
        say(f"[{partitions}] failover: {out['failover']['metadata_moved_s']} s (Metadata), "
            f"{out['failover']['all_probes_acked_s']} s (every probe acked)")
        say(f"[{partitions}] restarting it ...")
        out["rejoin"] = run.rejoin(out["failover"]["broker_killed"], args.scale_timeout)
        say(f"[{partitions}] every ISR full again: {out['rejoin']['all_isrs_full_s']} s")
        clients = args.probe_client.split(",")
        for k in range(1, args.failovers):
            # the same failover again on the same cluster: leadership back to the preferred
            # replicas first (a third each, as created), so each round kills a broker
            # leading about a third of the partitions, as the first did
            run.probe_client = clients[k % len(clients)]
            say(f"[{partitions}] round {k + 1}: preferred leaders back, then kill -9 "
                f"({run.probe_client} probes) ...")
            balanced = run.rebalance(args.scale_timeout)
            time.sleep(args.settle)
            again = run.failover(args.probe, args.scale_timeout)
            again["rebalanced_s"] = balanced
            say(f"[{partitions}] round {k + 1}: {again['metadata_moved_s']} s (Metadata), "
                f"{again['all_probes_acked_s']} s (every probe acked)")
            again["rejoin"] = run.rejoin(again["broker_killed"], args.scale_timeout)
            out.setdefault("more_failovers", []).append(again)
    except Exception as e:  # a failed phase is a result too: say which, keep the rest
        out["error"] = f"{type(e).__name__}: {e}"
        say(f"[{partitions}] {out['error']}")
    finally:
        if run is not None:
            out["peak_rss_mb_brokers_and_zookeeper"] = round(run.peak_rss_mb)
            out["stopped_over_memory"] = run.over_memory.is_set()
            run._stop_guard.set()
        for b in cluster.brokers.values():  # kill -9: a clean stop of 30k partitions is
            b.kill()                           # not what is measured, and may be slow
        cluster.zk.stop()
        if guard is not None:
            guard.join(5)
        print(json.dumps(out), flush=True)  # before the removal, which takes a while
        if not args.keep:
            import shutil
            shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--big", type=int, default=1000, help="partitions led by one broker")
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker config for every broker (repeatable)")
    ap.add_argument("--profile-dir", help="py-spy raw profiles of the surviving brokers "
                    "during the many-partition (or scale) failover go here")
    ap.add_argument("--probe-producers", type=int, default=1,
                    help="producers sharing the scale failover's probes")
    ap.add_argument("--probe-client", default="confluent",
                    help="the scale failover's probing producer: confluent-kafka (librdkafka:"
                    " one partition per Produce request) or aiokafka (one request per broker"
                    " for every ready partition, as Kafka's Java producer)")
    ap.add_argument("--profile-seconds", type=int, default=30,
                    help="how long the scale failover's profiles record")
    ap.add_argument("--only-big", action="store_true",
                    help="only the many-partition create, failover and restart")
    ap.add_argument("--kill-controller", action="store_true",
                    help="in the many-partition failover, kill the controller (it leads a "
                    "third of the partitions) instead of the broker leading the most")
    ap.add_argument("--scale", help="comma-separated partition counts (e.g. 3000,10000,30000):"
                    " run only the scale scenario, a fresh cluster for each")
    ap.add_argument("--topic-partitions", type=int, default=1000,
                    help="partitions per topic in the scale scenario")
    ap.add_argument("--topics-per-request", type=int, default=10,
                    help="topics per CreateTopics request in the scale scenario")
    ap.add_argument("--failovers", type=int, default=1,
                    help="scale scenario: after the restart, elect the preferred leaders "
                    "and fail over again, this many rounds in all (--probe-client may list "
                    "clients, comma-separated, taken in turn)")
    ap.add_argument("--probe", type=int, default=0, help="partitions of the killed broker "
                    "that get an acks=all probe after the kill (0: all of them)")
    ap.add_argument("--scale-timeout", type=float, default=600)
    ap.add_argument("--settle", type=float, default=10,
                    help="seconds between a healthy cluster and the kill")
    ap.add_argument("--max-rss-mb", type=float, default=8000,
                    help="stop a scale run when brokers and ZooKeeper use more")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs and logs")
    args = ap.parse_args()
    if args.scale:
        results = []
        for n in (int(x) for x in args.scale.split(",")):
            r = run_scale(n, args)  # prints its JSON line
            results.append(r)
            if r.get("error") or r.get("stopped_over_memory"):
                break
        return 0 if all(not r.get("error") and not r.get("stopped_over_memory")
                        for r in results) else 1
    records = 20_000 if args.quick else 100_000
    if LOADGEN.is_file():  # the C client needs more records for a phase of some seconds
        records *= 10
    root = Path(tempfile.mkdtemp(prefix="headrace-cluster-bench-"))
    cluster = LocalCluster(root, 3, overrides=[
        f"zookeeper.session.timeout.ms={args.session_ms}", "replica.lag.time.max.ms=10000",
        *args.override])
    say(f"starting ZooKeeper and 3 brokers in {root} ...")
    bootstrap = cluster.start()
    out: dict[str, Any] = {"session_timeout_ms": args.session_ms}
    try:
        b = Bench(cluster, bootstrap, args.profile_dir)
        for rf in (() if args.only_big else (1, 3)):
            name = f"tput-rf{rf}-{uuid.uuid4().hex[:4]}"
            b.create(name, 8, rf)
            say(f"produce RF {rf}: {records} x 1 KiB, 8 partitions, acks=all ...")
            out[f"produce_rf{rf}"] = b.throughput(name, records, 1024, 8)
            lat = f"lat-rf{rf}-{uuid.uuid4().hex[:4]}"
            b.create(lat, 1, rf)
            say(f"latency RF {rf}: 1,000/s for {5 if args.quick else 10} s ...")
            out[f"latency_rf{rf}"] = b.latency(lat, 1000, 5 if args.quick else 10)
        if not args.only_big:
            one = f"fail1-{uuid.uuid4().hex[:4]}"
            b.create(one, 1, 3)
            say("failover of a 1-partition leader ...")
            out["failover_1_partition"] = b.failover(one)
            say("controller failover ...")
            out["controller_failover"] = b.controller_failover()
        big = f"big-{uuid.uuid4().hex[:4]}"
        say(f"creating {3 * args.big} partitions (RF 3) ...")
        out["create_big_s"] = round(b.create(big, 3 * args.big, 3, timeout_s=600), 1)
        out["zk_watches"] = zk_watches(cluster.zk.port)
        say(f"failover of a broker leading ~{args.big} partitions ...")
        out["failover_big"] = b.failover(big, victim_partitions=set(), timeout_s=90,
                                         kill_controller=args.kill_controller)
        say("restart with the big topic ...")
        time.sleep(5)
        out["restart_big"] = b.restart_time(1)
    finally:
        cluster.stop()
        if not args.keep:  # gigabytes of logs: a few runs filled this machine's /tmp
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    if args.only_big:
        print(f"- failover, broker leading many: {out['failover_big']}")
        print(f"- creating {3 * args.big} partitions RF 3: {out['create_big_s']} s")
        print(f"- ZooKeeper watches with them (wchs): {out['zk_watches']}")
        print(f"- restart with them: {out['restart_big']}")
        return 0
    rf1, rf3 = out["produce_rf1"], out["produce_rf3"]
    print("| measure | RF 1 | RF 3 |")
    print("| --- | --- | --- |")
    print(f"| produce 1 KiB, 8 partitions, acks=all: records/s | {rf1['records_per_s']:,} | "
          f"{rf3['records_per_s']:,} ({rf3['records_per_s'] / rf1['records_per_s']:.0%}) |")
    print(f"| broker CPU (cores) during it | {rf1['broker_cpu']} | {rf3['broker_cpu']} |")
    for k in ("p50_ms", "p99_ms", "p999_ms"):
        print(f"| acks=all latency at 1,000/s {k[:-3]} (ms) | {out['latency_rf1'][k]} | "
              f"{out['latency_rf3'][k]} |")
    print()
    print(f"zookeeper.session.timeout.ms={args.session_ms}")
    print(f"- failover, 1 partition: {out['failover_1_partition']}")
    print(f"- failover, broker leading many: {out['failover_big']}")
    print(f"- controller failover: {out['controller_failover']}")
    print(f"- creating {3 * args.big} partitions RF 3: {out['create_big_s']} s")
    print(f"- ZooKeeper watches with them (wchs): {out['zk_watches']}")
    print(f"- restart with them: {out['restart_big']}")
    return 0


def zk_watches(port: int) -> str:
    """ZooKeeper's ``wchs``: connections, watched paths and total watches, one line."""
    from headrace.cluster.zookeeper_server import four_letter_word

    try:
        return " ".join(four_letter_word(port, "wchs").split())
    except OSError as e:
        return f"unavailable ({e})"


if __name__ == "__main__":
    sys.exit(main())
