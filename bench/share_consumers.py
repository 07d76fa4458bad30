"""Share-consumer throughput (KIP-932, issue 25): 1, 2 and 4 confluent-kafka
``ShareConsumer`` processes on a 1-partition topic, beside a plain consumer group of 4
processes on a 4-partition topic, the same records, one headrace broker, in one run.

    .venv/bin/python bench/share_consumers.py [--records 200000] [--size 100]

Both topics are filled first by one producer with librdkafka's defaults (as the README's
examples produce); every consumer runs with the defaults a user gets (a ShareConsumer in
implicit acknowledgement mode; a classic-protocol Consumer, auto commit), each in its own
process. A run ends when the processes together have received every record; the rate is
records over the time from the first record received to the last. Each process reports
how many it got, so the spread over the share consumers shows. Broker CPU seconds come
from /proc. Progress to stderr, a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def member(kind: str, bootstrap: str, topic: str, group: str, total: int, got: Any,
           first: Any, last: Any, mine: Any, index: int) -> None:
    from confluent_kafka import Consumer, ShareConsumer

    if kind == "share":
        c: Any = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    else:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                      "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    n = 0
    try:
        while got.value < total:
            msgs = c.poll(0.2) if kind == "share" else c.consume(500, 0.2)
            msgs = [m for m in msgs or [] if not m.error()]
            if not msgs:
                continue
            now = time.monotonic()
            with got.get_lock():
                if got.value == 0:
                    first.value = now
                got.value += len(msgs)
                if got.value >= total:
                    last.value = now
            n += len(msgs)
        mine[index] = n
    finally:
        if kind == "share":
            c.commit_sync()
        c.close()


def run_group(kind: str, n: int, bootstrap: str, topic: str, total: int,
              broker_pid: int) -> dict[str, Any]:
    group = f"{kind}-{n}-{time.monotonic_ns()}"
    if kind == "share":
        from confluent_kafka.admin import (
            AdminClient,
            AlterConfigOpType,
            ConfigEntry,
            ConfigResource,
            ResourceType,
        )

        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.incremental_alter_configs([ConfigResource(
                ResourceType.GROUP, group, incremental_configs=[ConfigEntry(
                    "share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET)])]).values():
            f.result(15)
    ctx = mp.get_context("spawn")
    got, first, last = ctx.Value("q", 0), ctx.Value("d", 0.0), ctx.Value("d", 0.0)
    mine = ctx.Array("q", n)
    cpu0 = cpu_s(broker_pid)
    procs = [ctx.Process(target=member, args=(kind, bootstrap, topic, group, total, got,
                                              first, last, mine, i)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    took = max(last.value - first.value, 1e-9)
    return {"kind": kind, "processes": n, "records": got.value, "rate": got.value / took,
            "per_process": list(mine), "broker_cpu_s": cpu_s(broker_pid) - cpu0}


def fill(bootstrap: str, topic: str, partitions: int, records: int, size: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until it answers
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    p = Producer({"bootstrap.servers": bootstrap})
    value = b"x" * size
    for i in range(records):
        while True:
            try:
                p.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    args = ap.parse_args()
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as data:
        broker = subprocess.Popen(
            [sys.executable, "-m", "headrace.cli", "broker", "--data-dir", data,
             "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            say(f"filling: {args.records} records of {args.size} B, twice")
            fill(bootstrap, "one", 1, args.records, args.size)
            fill(bootstrap, "four", 4, args.records, args.size)
            rows = []
            for kind, n, topic in (("share", 1, "one"), ("share", 2, "one"),
                                   ("share", 4, "one"), ("plain", 4, "four")):
                say(f"{kind} x{n} on {topic} ...")
                rows.append(run_group(kind, n, bootstrap, topic, args.records, broker.pid))
        finally:
            broker.terminate()
            broker.wait(30)
    print(f"{args.records:,} records of {args.size} B; one headrace broker; "
          "confluent-kafka defaults")
    print()
    print("| consumers | topic | records/s | per process | broker CPU s |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        topic = "1 partition" if r["kind"] == "share" else "4 partitions"
        name = ("ShareConsumer" if r["kind"] == "share" else "Consumer (group)")
        print(f"| {r['processes']} x {name} | {topic} | {r['rate']:,.0f} | "
              f"{', '.join(f'{v:,}' for v in r['per_process'])} | {r['broker_cpu_s']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
