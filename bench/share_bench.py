"""ReliableConsumer on a share group vs on partitions (issue 25 item 5): the same records
on a 1-partition topic, read by 4 consumer processes in partition mode (a consumer group:
one process gets the partition, the others idle) and in share mode (``share=True``: a share
group, every process acquires records of the one partition).

Each process runs a basic bolt that spends ``--work-ms`` per record (a sleep: the handler's
I/O, e.g. a database call) on ``--lanes`` lanes. Throughput is the records over the time
from the first record any process started to the moment every record was processed (the
processes' start-up is not timed); also printed: the records each process handled, and how
many were processed more than once.

    .venv/bin/python bench/share_bench.py                 # starts a broker (tests/brokerproc)
    .venv/bin/python bench/share_bench.py --bootstrap HOST:PORT --records 5000 --work-ms 2

Not a test: prints one line per mode.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

SHARE_BROKER_CONFIG = {
    "group.initial.rebalance.delay.ms": "0",
    "group.share.heartbeat.interval.ms": "500",
    "group.share.min.heartbeat.interval.ms": "500",
}


def worker_main(argv: list[str]) -> None:
    from headrace.reliable import Item, ReliableConsumer

    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=("partition", "share"), required=True)
    ap.add_argument("--work-ms", type=float, required=True)
    ap.add_argument("--lanes", type=int, required=True)
    ap.add_argument("--poll-batch", type=int, required=True)
    args = ap.parse_args(argv)
    out = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    work_s = args.work_ms / 1000

    def handle(item: Item, _out: Any) -> None:
        os.write(out, f"{time.time():.6f} {item.source.offset}\n".encode())
        if work_s:
            time.sleep(work_s)  # the handler's I/O, not a synchronisation

    share = args.mode == "share"
    config: dict[str, Any] = {"bootstrap.servers": args.bootstrap, "group.id": args.group}
    if not share:
        config["auto.offset.reset"] = "earliest"
    rc = ReliableConsumer(config, [args.topic], handle, share=share, concurrency=args.lanes,
                          poll_batch=args.poll_batch)
    signal.signal(signal.SIGTERM, lambda *_: rc.stop())
    try:
        rc.run()
    finally:
        rc.close(drain_timeout_s=5)


PRODUCE_BATCH = 100


def fill(bootstrap: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        while True:
            try:
                p.produce(topic, f"r{i}".encode(), partition=0)
                break
            except BufferError:
                p.poll(0.05)
        if (i + 1) % PRODUCE_BATCH == 0:
            # log batches of PRODUCE_BATCH records, as a steady producer writes them: a
            # share group hands out whole batches (Kafka's acquire too), so one batch of
            # every record would go to a single consumer
            assert p.flush(60) == 0
    assert p.flush(60) == 0


def share_group_from_earliest(bootstrap: str, group: str) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(15)


def run_mode(bootstrap: str, topic: str, n: int, mode: str, args: argparse.Namespace,
             tmp: Path) -> None:
    group = f"bench-{mode}-{uuid.uuid4().hex[:6]}"
    if mode == "share":
        share_group_from_earliest(bootstrap, group)
    outs = [tmp / f"{group}-{k}.out" for k in range(args.processes)]
    procs = [subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "worker", "--bootstrap", bootstrap,
         "--topic", topic, "--group", group, "--out", str(out), "--mode", mode,
         "--work-ms", str(args.work_ms), "--lanes", str(args.lanes),
         "--poll-batch", str(args.poll_batch)], cwd=ROOT, stdout=subprocess.DEVNULL)
        for out in outs]
    rows: list[list[tuple[float, int]]] = [[] for _ in outs]
    deadline = time.monotonic() + args.timeout_s
    try:
        while True:
            rows = [[(float(t), int(o)) for t, o in
                     (line.split() for line in out.read_text().splitlines() if line)]
                    if out.exists() else [] for out in outs]
            if len({o for r in rows for _, o in r}) >= n:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{mode}: not every record processed in {args.timeout_s} s")
            time.sleep(0.1)  # between reads of the progress files
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    every = [row for r in rows for row in r]
    first_run: dict[int, float] = {}
    for t, o in sorted(every):
        first_run.setdefault(o, t)
    start, end = min(t for t, _ in every), max(first_run.values())
    again = sum(1 for c in Counter(o for _, o in every).values() if c > 1)
    per = ", ".join(str(len(r)) for r in rows)
    label = (f"{mode} mode, 1 partition, {args.processes} processes x {args.lanes} lane(s)")
    print(f"{label:52} {n / (end - start):9,.0f} records/s   per process: {per}   "
          f"processed twice: {again}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--records", type=int, default=4_000)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--lanes", type=int, default=1)
    ap.add_argument("--work-ms", type=float, default=1.0)
    ap.add_argument("--poll-batch", type=int, default=100,
                    help="consume batch (partition) / max.poll.records (share)")
    ap.add_argument("--modes", default="partition,share")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}; {args.records} records, "
          f"{args.work_ms} ms of handler I/O each")
    broker = None
    bootstrap = args.bootstrap
    tmp = Path(tempfile.mkdtemp())
    if bootstrap is None:
        from tests.brokerproc import BrokerProcess

        broker = BrokerProcess(tmp / "broker", SHARE_BROKER_CONFIG).start()
        bootstrap = broker.bootstrap
    try:
        topic = f"bench-share-{uuid.uuid4().hex[:6]}"
        fill(bootstrap, topic, args.records)  # the same records for every mode
        for mode in args.modes.split(","):
            run_mode(bootstrap, topic, args.records, mode, args, tmp)
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_main(sys.argv[2:])
    else:
        main()
