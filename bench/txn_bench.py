"""Transactions (issue 10): produce throughput plain / idempotent / transactional (100 and
1,000 records per transaction), read_committed vs read_uncommitted consume, and the
end-to-end latency of a transactional consume-transform-produce loop; headrace and Tansu
side by side in one run, with each broker's CPU beside its figures.

    .venv/bin/python bench/txn_bench.py [--broker headrace|tansu|both] [--records 200000]

confluent-kafka on both sides; 100-byte values into one 4-partition topic per phase. A
phase that fails on a broker (e.g. no transaction support) is reported as such, not
hidden.

The transactional topic is also read by the C load generator (``bench/build/loadgen -C``,
built by ``bench/setup.sh``), read_uncommitted and read_committed, three times each: the
Python consume loop tops out near the broker's rate (about 1M records/s), and with
librdkafka's defaults it also idles: a partition holding ``queued.min.messages`` (100,000)
undelivered records makes the client wait ``fetch.queue.backoff.ms`` (1 s since 2.4)
before fetching it again, which a broker faster than the application's loop triggers and
a slower one may not. The C reader is not that far behind, so its rows compare the
brokers; each shows broker CPU-seconds per million records beside the rate.

Transactional produce is also measured with the C load generator (``loadgen -P -x N``:
begin, N records round-robin over the partitions, commit, the next transaction once the
commit returned), three runs each at 100 and 1,000 records per transaction: the Python
produce loop costs about 10 µs per record, a millisecond of a 100-record transaction's
three.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from harness.brokers import BrokerProcess, start_broker

PARTS = 4
VALUE = b"x" * 100


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def create(b: BrokerProcess, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # alive until the future ends
    admin.create_topics([NewTopic(name, PARTS, 1)])[name].result(30)
    return name


def cpu(b: BrokerProcess) -> float:
    return b.cpu_seconds() or 0.0


def produce(b: BrokerProcess, records: int, mode: str, per_txn: int = 0) -> dict[str, Any]:
    topic = create(b, f"p-{mode}")
    conf: dict[str, Any] = {"bootstrap.servers": b.bootstrap, "linger.ms": 5,
                            "batch.num.messages": 10_000, "acks": "all"}
    if mode == "idempotent":
        conf["enable.idempotence"] = True
    if mode == "transactional":
        conf["transactional.id"] = f"bench-{uuid.uuid4().hex[:6]}"
    p = Producer(conf)
    if mode == "transactional":
        p.init_transactions(30)
    c0, t0 = cpu(b), time.perf_counter()
    sent = 0
    while sent < records:
        n = per_txn or records
        if mode == "transactional":
            p.begin_transaction()
        for i in range(min(n, records - sent)):
            while True:
                try:
                    p.produce(topic, VALUE, partition=(sent + i) % PARTS)
                    break
                except BufferError:
                    p.poll(0.01)
        sent += min(n, records - sent)
        if mode == "transactional":
            p.commit_transaction(60)
    p.flush(120)
    dt = time.perf_counter() - t0
    return {"topic": topic, "records_per_s": round(records / dt),
            "broker_cpu_s": round(cpu(b) - c0, 2)}


def consume(b: BrokerProcess, topic: str, records: int, isolation: str) -> dict[str, Any]:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"b-{uuid.uuid4().hex[:6]}",
                  "isolation.level": isolation, "enable.auto.commit": False,
                  "fetch.max.bytes": 50 << 20, "queued.max.messages.kbytes": 1 << 20})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTS)])
    got = 0
    c0, t0 = cpu(b), time.perf_counter()
    deadline = time.monotonic() + 300
    while got < records and time.monotonic() < deadline:
        for m in c.consume(10_000, 0.5):
            if m.error() is None:
                got += 1
    dt = time.perf_counter() - t0
    c.close()
    return {"records": got, "records_per_s": round(got / dt),
            "broker_cpu_s": round(cpu(b) - c0, 2)}


LOADGEN = Path(__file__).resolve().parent / "build" / "loadgen"


def _loadgen_runs(b: BrokerProcess, argv: Any, records: int, count_key: str,
                  runs: int) -> tuple[list[dict[str, Any]], list[float], str | None]:
    """``loadgen`` ``runs`` times (``argv()`` gives each run's arguments): each run's JSON
    line and the broker's CPU-seconds per million records, or why a run fell short."""
    results: list[dict[str, Any]] = []
    per_m: list[float] = []
    for _ in range(runs):
        args = argv()
        c0 = cpu(b)
        out = subprocess.run([str(LOADGEN), "-b", b.bootstrap, "-p", str(PARTS),
                              "-n", str(records), *args],
                             capture_output=True, text=True, timeout=600)
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
        r = json.loads(line)
        if int(r.get(count_key, 0)) < records:
            return results, per_m, (f"loadgen {count_key} {r.get(count_key, 0)} of {records}: "
                                    f"{out.stderr.strip()[-100:]}")
        results.append(r)
        per_m.append((cpu(b) - c0) / records * 1e6)
    return results, per_m, None


def _spread(results: list[dict[str, Any]], per_m: list[float]) -> dict[str, Any]:
    rates = [float(r["records_per_s"]) for r in results]
    return {"records_per_s": round(statistics.median(rates)),
            "spread": [round(min(rates)), round(max(rates))],
            "broker_cpu_s_per_m": round(statistics.median(per_m), 2)}


def consume_c(b: BrokerProcess, topic: str, records: int, isolation: str,
              runs: int = 3) -> dict[str, Any]:
    """``loadgen -C`` over the topic ``runs`` times: the median rate, its spread, and the
    broker's CPU per million records (median)."""
    results, per_m, error = _loadgen_runs(
        b, lambda: ["-C", "-t", topic, "-X", f"isolation.level={isolation}"], records,
        "records", runs)
    if error is not None:
        return {"error": error}
    out = _spread(results, per_m)
    out["broker_cpu_s"] = round(statistics.median(per_m) * records / 1e6, 2)
    return out


def produce_txn_c(b: BrokerProcess, records: int, per_txn: int,
                  runs: int = 3) -> dict[str, Any]:
    """``loadgen -P -x per_txn`` into a fresh topic ``runs`` times: the median rate, its
    spread, the median transaction latency and the broker's CPU per million records."""
    results, per_m, error = _loadgen_runs(
        b, lambda: ["-P", "-x", str(per_txn), "-t", create(b, f"c-txn-{per_txn}")], records,
        "delivered", runs)
    if error is not None:
        return {"error": error}
    out = _spread(results, per_m)
    out["txn_p50_ms"] = round(statistics.median(float(r["txn_p50_ms"]) for r in results), 2)
    return out


def ctp_latency(b: BrokerProcess, seconds: float, rate: int) -> dict[str, Any]:
    """Input records stamped with their send time; a transactional loop copies each batch
    it consumes to the output in one transaction with its offsets; a read_committed
    consumer of the output measures send-to-visible latency."""
    source, sink = create(b, "ctp-in"), create(b, "ctp-out")
    group = f"ctp-{uuid.uuid4().hex[:6]}"
    stop = threading.Event()
    errors: list[str] = []

    def loop() -> None:
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group,
                      "enable.auto.commit": False, "isolation.level": "read_committed",
                      "auto.offset.reset": "earliest"})
        c.assign([TopicPartition(source, p, 0) for p in range(PARTS)])
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 1,
                      "transactional.id": f"ctp-{uuid.uuid4().hex[:6]}"})
        p.init_transactions(30)
        while not stop.is_set():
            msgs = [m for m in c.consume(500, 0.05) if m.error() is None]
            if not msgs:
                continue
            try:
                p.begin_transaction()
                for m in msgs:
                    p.produce(sink, m.value(), partition=m.partition())
                p.send_offsets_to_transaction(c.position(c.assignment()),
                                              c.consumer_group_metadata(), 30)
                p.commit_transaction(30)
            except Exception as e:  # reported below
                errors.append(str(e))
                return
        c.close()

    lat: list[float] = []

    def reader() -> None:
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"r-{group}",
                      "isolation.level": "read_committed", "fetch.wait.max.ms": 5,
                      "auto.offset.reset": "earliest"})
        c.assign([TopicPartition(sink, p, 0) for p in range(PARTS)])
        while not stop.is_set():
            for m in c.consume(1000, 0.05):
                if m.error() is None:
                    lat.append(time.time() - float(m.value()))
        c.close()

    threads = [threading.Thread(target=loop), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    time.sleep(2)
    prod = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        prod.produce(source, repr(time.time()).encode(), partition=i % PARTS)
        prod.poll(0)
        i += 1
        time.sleep(1 / rate)
    prod.flush(30)
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join(30)
    if errors or not lat:
        return {"error": errors[0] if errors else "nothing arrived"}
    q = statistics.quantiles(lat, n=1000)
    return {"records": len(lat), "sent": i, "p50_ms": round(q[499] * 1000, 1),
            "p99_ms": round(q[989] * 1000, 1), "p999_ms": round(q[998] * 1000, 1)}


def run(name: str, records: int) -> dict[str, Any]:
    b = start_broker(name)
    out: dict[str, Any] = {}
    try:
        for label, mode, per_txn in (("plain", "plain", 0), ("idempotent", "idempotent", 0),
                                     ("txn x100", "transactional", 100),
                                     ("txn x1000", "transactional", 1000)):
            say(f"{name}: produce {records} x 100 B, {label} ...")
            try:
                out[label] = produce(b, records, mode, per_txn)
            except Exception as e:
                out[label] = {"error": str(e)[:120]}
        topic = out.get("txn x1000", {}).get("topic")
        for iso in ("read_uncommitted", "read_committed"):
            say(f"{name}: consume the transactional topic, {iso} ...")
            try:
                out[iso] = (consume(b, topic, records, iso) if topic
                            else {"error": "no transactional topic"})
            except Exception as e:
                out[iso] = {"error": str(e)[:120]}
        for iso in ("read_uncommitted", "read_committed"):
            if not LOADGEN.is_file():
                out[f"c {iso}"] = {"error": "no bench/build/loadgen (bash bench/setup.sh)"}
                continue
            say(f"{name}: C reader of the transactional topic, {iso}, 3 runs ...")
            try:
                out[f"c {iso}"] = (consume_c(b, topic, records, iso) if topic
                                   else {"error": "no transactional topic"})
            except Exception as e:
                out[f"c {iso}"] = {"error": str(e)[:120]}
        for per_txn in (100, 1000):
            key = f"c txn x{per_txn}"
            if not LOADGEN.is_file():
                out[key] = {"error": "no bench/build/loadgen (bash bench/setup.sh)"}
                continue
            say(f"{name}: C transactional producer, {per_txn} per transaction, 3 runs ...")
            try:
                out[key] = produce_txn_c(b, records, per_txn)
            except Exception as e:
                out[key] = {"error": str(e)[:120]}
        say(f"{name}: consume-transform-produce latency at 500 records/s for 10 s ...")
        try:
            out["ctp"] = ctp_latency(b, 10, 500)
        except Exception as e:
            out["ctp"] = {"error": str(e)[:120]}
    finally:
        b.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", choices=("headrace", "tansu", "both"), default="both")
    ap.add_argument("--records", type=int, default=200_000)
    args = ap.parse_args()
    names = ["headrace", "tansu"] if args.broker == "both" else [args.broker]
    results = {n: run(n, args.records) for n in names}

    def cell(r: dict[str, Any], key: str = "records_per_s") -> str:
        if "error" in r:
            return f"failed: {r['error']}"
        return f"{r[key]:,} ({r['broker_cpu_s']} CPU-s)"

    print("| measure | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for label in ("plain", "idempotent", "txn x100", "txn x1000"):
        print(f"| produce 100 B, {label}: records/s (broker CPU) | "
              + " | ".join(cell(results[n][label]) for n in names) + " |")
    for per_txn in (100, 1000):
        row = []
        for n in names:
            r = results[n][f"c txn x{per_txn}"]
            row.append(f"failed: {r['error']}" if "error" in r else
                       f"{r['records_per_s']:,} ({r['spread'][0]:,}-{r['spread'][1]:,}; "
                       f"transaction p50 {r['txn_p50_ms']} ms; "
                       f"{r['broker_cpu_s_per_m']} CPU-s per M)")
        print(f"| C producer (loadgen -x {per_txn}), txn x{per_txn}: records/s, median of 3 | "
              + " | ".join(row) + " |")
    for iso in ("read_uncommitted", "read_committed"):
        print(f"| consume the txn x1000 topic, {iso}: records/s | "
              + " | ".join(cell(results[n][iso]) for n in names) + " |")
    for iso in ("read_uncommitted", "read_committed"):
        row = []
        for n in names:
            r = results[n][f"c {iso}"]
            row.append(f"failed: {r['error']}" if "error" in r else
                       f"{r['records_per_s']:,} ({r['spread'][0]:,}-{r['spread'][1]:,}; "
                       f"{r['broker_cpu_s_per_m']} CPU-s per M)")
        print(f"| C reader (loadgen), txn x1000 topic, {iso}: records/s, median of 3 | "
              + " | ".join(row) + " |")
    for k in ("p50_ms", "p99_ms", "p999_ms"):
        print(f"| consume-transform-produce latency {k[:-3]} (ms) | "
              + " | ".join(str(results[n]["ctp"].get(k, results[n]["ctp"].get("error")))
                           for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
