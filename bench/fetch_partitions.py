"""What one broker spends per partition on a Produce and a Fetch that name thousands of
partitions (a follower's fetch session after a failover, a consumer of many partitions):
one broker, ``--topics`` x 1,000 partitions RF 1, one socket; each round sends one Produce
with a one-record batch for every partition (acks=1), then one Fetch (v12, no session) of
every partition at the offset of that round's batch, and times both round trips and the
Fetch response's first byte (the broker's work before it writes). Broker CPU over the
rounds from /proc. Each round adds one batch per partition, so later rounds fetch further
from the last offset index entry.

    .venv/bin/python bench/fetch_partitions.py [--topics 5] [--rounds 20]
        [--pythonpath DIR]   # a broker from other sources (a worktree), for a before/after

Not a test: prints one line.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from harness.brokers import start_broker
from request_cost import frame, round_trip

from headrace.protocol.records import build_batch

PARTITIONS = 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, default=5, help="topics of 1,000 partitions")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--pythonpath", help="the broker imports headrace from here first")
    args = ap.parse_args()
    if args.pythonpath:
        os.environ["PYTHONPATH"] = args.pythonpath
    b = start_broker("headrace")
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        topics = [f"fp-{uuid.uuid4().hex[:6]}" for _ in range(args.topics)]
        for fut in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).values():
            fut.result(120)
        host, port = b.bootstrap.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        batch = bytes(build_batch([(None, b"x" * 100)], int(time.time() * 1000)))
        produce = frame(0, 9, {"transactional_id": None, "acks": 1, "timeout": 30000,
                               "topic_data": [{"name": t, "partition_data": [
                                   {"index": i, "records": batch} for i in range(PARTITIONS)]}
                                   for t in topics]})

        def fetch(offset: int) -> bytes:
            return frame(1, 12, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 64 << 20,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": t, "partitions": [
                    {"partition": i, "current_leader_epoch": -1, "fetch_offset": offset,
                     "last_fetched_epoch": -1, "log_start_offset": -1,
                     "partition_max_bytes": 1 << 20} for i in range(PARTITIONS)]}
                    for t in topics],
                "forgotten_topics_data": [], "rack_id": ""})

        round_trip(sock, produce)  # offset 0 everywhere: the logs' first writes, not timed
        produce_s = fetch_s = first_byte_s = 0.0
        cpu0 = b.cpu_seconds() or 0.0
        for k in range(args.rounds):
            t0 = time.perf_counter()
            round_trip(sock, produce)
            produce_s += time.perf_counter() - t0
            request = fetch(k + 1)
            t0 = time.perf_counter()
            sock.sendall(request)
            head = b""
            while len(head) < 4:
                head += sock.recv(4 - len(head))
            first_byte_s += time.perf_counter() - t0
            left = struct.unpack(">i", head)[0]
            while left:
                left -= len(sock.recv(min(1 << 16, left)))
            fetch_s += time.perf_counter() - t0
        cpu = (b.cpu_seconds() or 0.0) - cpu0
        n = args.topics * PARTITIONS
        r = args.rounds
        print(f"{n:,} partitions, {r} rounds: produce {produce_s / r * 1e3:.1f} ms "
              f"({produce_s / r / n * 1e6:.1f} µs per partition), fetch "
              f"{fetch_s / r * 1e3:.1f} ms ({fetch_s / r / n * 1e6:.1f} µs per partition; "
              f"first byte {first_byte_s / r * 1e3:.1f} ms), broker CPU {cpu:.2f} s",
              flush=True)
    finally:
        b.stop()


if __name__ == "__main__":
    main()
