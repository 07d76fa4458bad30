"""Overhead of headrace.reliable: acker and offset manager per record, memory per pending
root, and ReliableConsumer throughput next to a plain confluent-kafka consumer.

    .venv/bin/python bench/reliable_bench.py                 # starts a broker (tests/brokerproc)
    .venv/bin/python bench/reliable_bench.py --bootstrap HOST:PORT --records 200000

Not a test: prints one line per measurement.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.reliable import (
    AckerPool,
    Item,
    OffsetManager,
    ReliableConsumer,
    ReliableSpout,
    SpoutConfig,
    TopicPartition,
    TupleTracker,
)


def per_record_us(label: str, n: int, fn: Any) -> float:
    t0 = time.perf_counter()
    fn(n)
    us = (time.perf_counter() - t0) / n * 1e6
    print(f"{label:58} {us:8.2f} µs/record")
    return us


def bench_pure(n: int) -> None:
    rng = random.Random(1)

    def ids() -> int:
        return rng.getrandbits(64) or 1

    def acker_only(n: int) -> None:
        pool = AckerPool(1)
        for i in range(n):
            pool.init(i + 1, 0, 12345, 0)
            pool.update(i + 1, 12345)

    def tracker_root_ack(n: int) -> None:
        t = TupleTracker(AckerPool(1), ids)
        for _ in range(n):
            item, _, _ = t.root((None, b"v"), 0, 0)
            t.ack(item)

    def tracker_fanout5(n: int) -> None:
        t = TupleTracker(AckerPool(2), ids)
        for _ in range(n):
            item, _, _ = t.root((None, b"v"), 0, 0)
            kids = [t.emit(("w",), [item]) for _ in range(5)]
            t.ack(item)
            for k in kids:
                t.ack(k)

    def offset_manager(n: int) -> None:
        om = OffsetManager(0)
        for o in range(n):
            om.emitted(o)
            om.acked(o)
            if o % 500 == 499:
                nxt = om.next_commit_offset()
                assert nxt is not None
                om.committed(nxt)

    def spout_full(n: int) -> None:
        tp = TopicPartition("t", 0)
        spout = ReliableSpout(SpoutConfig(offset_commit_period_ms=100), 0, id_source=ids)
        spout.assigned(tp, 0)
        for o in range(n):
            item = spout.on_record(tp, o, o // 1000, values=(None, b"v"))
            assert item is not None
            spout.ack(item, o // 1000)
            if o % 500 == 499:
                for e in spout.tick(o // 1000):
                    if hasattr(e, "offsets"):
                        spout.committed(e.offsets)

    per_record_us("acker: init + ack (root of 1 item)", n, acker_only)
    per_record_us("tuple tracker: root + ack (random ids)", n, tracker_root_ack)
    per_record_us("tuple tracker: root + 5 anchored children + 6 acks", n // 5,
                  tracker_fanout5)
    per_record_us("offset manager: emitted + acked (+ commit / 500)", n, offset_manager)
    per_record_us("spout core: on_record + ack + tick (all of the above)", n, spout_full)

    for tree in (1, 100):
        t = TupleTracker(AckerPool(1), ids)
        roots = 20_000 if tree == 1 else 2_000
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(roots):
            item, _, _ = t.root(("r",), 0, 0)
            for _ in range(tree):
                t.emit(("c",), [item])
            t.ack(item)
        per_root = (tracemalloc.get_traced_memory()[0] - before) / roots
        tracemalloc.stop()
        print(f"{'acker memory per pending root, tree of ' + str(tree) + ' item(s)':58} "
              f"{per_root:8.1f} bytes")


def fill(bootstrap: str, topic: str, n: int, partitions: int, size: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    payload = b"x" * size
    for i in range(n):
        while True:
            try:
                p.produce(topic, payload, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def plain_consumer(bootstrap: str, topic: str, n: int) -> float:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"plain-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": True})
    c.subscribe([topic])
    got = 0
    t0 = None
    while got < n:
        msgs = c.consume(500, 1.0)
        if msgs and t0 is None:
            t0 = time.perf_counter()
        got += sum(1 for m in msgs if m.error() is None)
    assert t0 is not None
    elapsed = time.perf_counter() - t0
    c.close()
    return n / elapsed


def reliable_consumer(bootstrap: str, topic: str, n: int, concurrency: int) -> float:
    count = [0]
    lock = threading.Lock()
    done = threading.Event()
    first: list[float] = []

    def handle(item: Item, _out: Any) -> None:
        with lock:
            if not first:
                first.append(time.perf_counter())
            count[0] += 1
            if count[0] >= n:
                done.set()

    committed: dict[TopicPartition, int] = {}
    rc = ReliableConsumer({"bootstrap.servers": bootstrap,
                           "group.id": f"reliable-{uuid.uuid4().hex[:6]}",
                           "auto.offset.reset": "earliest"}, [topic], handle,
                          concurrency=concurrency, offset_commit_period_ms=200,
                          on_commit=committed.update)
    try:
        while not done.is_set():
            rc.poll_once()
        with rc._lock:  # everything handled; wait for the acks to be committed
            target = rc.spout.committable()
        rc._commit(target)
        elapsed = time.perf_counter() - first[0]
    finally:
        rc.close()
    return n / elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--pure-records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}")
    bench_pure(args.pure_records)

    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from tests.brokerproc import BrokerProcess

        broker = BrokerProcess(Path(tempfile.mkdtemp()),
                               {"group.initial.rebalance.delay.ms": "0"}).start()
        bootstrap = broker.bootstrap
    try:
        topic = f"bench-reliable-{uuid.uuid4().hex[:6]}"
        fill(bootstrap, topic, args.records, args.partitions, args.size)
        plain = plain_consumer(bootstrap, topic, args.records)
        print(f"{'plain confluent-kafka consumer (consume(500))':58} {plain:10,.0f} records/s")
        for conc in (1, 4):
            rel = reliable_consumer(bootstrap, topic, args.records, conc)
            print(f"{f'ReliableConsumer, no-op basic bolt, {conc} lane(s)':58} "
                  f"{rel:10,.0f} records/s ({rel / plain:.0%} of plain)")
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
