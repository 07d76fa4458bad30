"""Cluster benchmarks (issue 9): a local 3-broker cluster (``headrace.cluster.local``) on
one machine, with confluent-kafka clients.

1. Produce throughput, RF 1 vs RF 3 (acks=all, min.insync.replicas=2 for RF 3), 1 KiB
   records into 8 partitions, side by side in one run, with each broker's CPU
   (user+sys seconds from /proc over the phase) beside the figures.
2. End-to-end acks=all latency (p50/p99/p99.9 of the delivery reports) at a fixed rate,
   RF 1 vs RF 3.
3. Failover: kill -9 the leader of a 1-partition RF 3 topic during a steady acks=all
   stream; the time from the kill to the first acknowledgement of a record sent after it.
   Then the same for a broker leading ``--big`` partitions (default 1,000: a 3,000-partition
   RF 3 topic): the time until every partition it led has acknowledged a record sent after
   the kill. And the controller: kill -9 it, time until Metadata names another.
4. Start-up with the big topic: a broker's restart time (process start to listening) and
   its resident memory.

``zookeeper.session.timeout.ms`` is stated in the output (default 6000 here): a dead
broker is noticed when its session expires, so failover >= that. Three brokers share the
machine's cores: the RF 3 / RF 1 ratio says where the CPU goes, not what three machines do.

    .venv/bin/python bench/cluster_bench.py [--quick] [--big 1000] [--session-ms 6000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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

CLK = os.sysconf("SC_CLK_TCK")


LOADGEN = Path(__file__).resolve().parent / "build" / "loadgen"


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


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


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
        n = int(rate * seconds)
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

        return {"p50_ms": pct(0.5), "p99_ms": pct(0.99), "p999_ms": pct(0.999),
                "acked": len(lat), "sent": n}

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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--big", type=int, default=1000, help="partitions led by one broker")
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker config for every broker (repeatable)")
    ap.add_argument("--profile-dir", help="py-spy raw profiles of the surviving brokers "
                    "during the many-partition failover go here")
    ap.add_argument("--only-big", action="store_true",
                    help="only the many-partition create, failover and restart")
    ap.add_argument("--kill-controller", action="store_true",
                    help="in the many-partition failover, kill the controller (it leads a "
                    "third of the partitions) instead of the broker leading the most")
    args = ap.parse_args()
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
