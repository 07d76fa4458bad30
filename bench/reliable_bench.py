"""Overhead of headrace.reliable: acker and offset manager per record, memory per pending
root, and ReliableConsumer throughput next to a plain confluent-kafka consumer (measured in
the same run, on the same topic): a no-op batch bolt, a no-op per-record basic bolt, and a
basic bolt whose handler waits 1 ms per 100 records (I/O-bound), each with 1, 2 and 4
lanes; a CPU-bound handler on 1 and 2 process lanes (``process_bolt``) and thread lanes;
pure-core fan-out (a root with 5 anchored children) per batch of fetched roots.

    .venv/bin/python bench/reliable_bench.py                 # starts a broker (tests/brokerproc)
    .venv/bin/python bench/reliable_bench.py --bootstrap HOST:PORT --records 200000

Not a test: prints one line per measurement.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Sequence
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
    Topology,
    TupleTracker,
)
from headrace.reliable.topology import Batch


def spread(values: list[float]) -> str:
    """``median (min-max)`` of records/s figures."""
    return (f"{statistics.median(values):10,.0f} records/s "
            f"({min(values):,.0f}-{max(values):,.0f})")


def per_record_us(label: str, n: int, fn: Any) -> float:
    t0 = time.perf_counter()
    fn(n)
    us = (time.perf_counter() - t0) / n * 1e6
    print(f"{label:58} {us:8.2f} µs/record")
    return us


def best_per_record_us(label: str, n: int, fn: Any, runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    print(f"{label:58} {best:8.2f} µs/record")
    return best


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

    def spout_batches(n: int) -> None:
        tp = TopicPartition("t", 0)
        spout = ReliableSpout(SpoutConfig(offset_commit_period_ms=100), 0)
        spout.assigned(tp, 0)
        for start in range(0, n, 500):
            now = start // 1000
            batch = spout.on_batch(tp, range(start, start + 500), now)
            assert batch is not None
            spout.ack_batch(batch, now)
            for e in spout.tick(now):
                if hasattr(e, "offsets"):
                    spout.committed(e.offsets)

    def spout_fanout5(n: int, each: bool = False) -> None:
        """Batches of 500 roots, 5 children each: ``emit_many`` per root, or (``each``) one
        ``emit_each`` per batch (a ``ChildRun``, acked whole)."""
        tp = TopicPartition("t", 0)
        spout = ReliableSpout(SpoutConfig(offset_commit_period_ms=100,
                                          max_uncommitted_offsets=1 << 30), 0)
        spout.assigned(tp, 0)
        vals = [("w",)] * 5
        for start in range(0, n, 500):
            batch = spout.on_batch(tp, range(start, start + 500), 0)
            assert batch is not None
            kids: Sequence[Item] = []
            if each:
                kids = spout.tracker.emit_each(vals, batch.items())
            else:
                kids = [k for root in batch.items() for k in spout.tracker.emit_many(vals, root)]
            spout.ack_batch(batch, 0)  # the 500 roots
            spout.ack_many(kids, 0)  # their 2,500 children
        assert spout.num_pending_roots == 0

    per_record_us("acker: init + ack (root of 1 item)", n, acker_only)
    per_record_us("tuple tracker: root + ack (random ids)", n, tracker_root_ack)
    per_record_us("tuple tracker: root + 5 anchored children + 6 acks", n // 5,
                  tracker_fanout5)
    per_record_us("offset manager: emitted + acked (+ commit / 500)", n, offset_manager)
    per_record_us("spout core: on_record + ack + tick (all of the above)", n, spout_full)
    per_record_us("spout core, batches of 500: on_batch + ack_batch + tick", n,
                  spout_batches)
    us = per_record_us("spout core, batches of 500: root + 5 anchored children, acked",
                       n // 5, spout_fanout5)
    print(f"{'  = roots/s, emit_many per root':58} {1e6 / us:10,.0f} roots/s")
    us = best_per_record_us("the same, one emit_each per batch (ChildRun), best of 5",
                            n // 5, lambda k: spout_fanout5(k, each=True))
    print(f"{'  = roots/s, emit_each per batch':58} {1e6 / us:10,.0f} roots/s")

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

    # a pending root of a fetched batch whose tree has not grown: the spout's and offset
    # manager's share (the offsets list and payloads are the fetch's own)
    tp = TopicPartition("t", 0)
    spout = ReliableSpout(SpoutConfig(max_uncommitted_offsets=1 << 30), 0)
    spout.assigned(tp, 0)
    offsets = [list(range(s, s + 500)) for s in range(0, 100_000, 500)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    keep = [spout.on_batch(tp, offs, 0, payloads=offs) for offs in offsets]
    per_root = (tracemalloc.get_traced_memory()[0] - before) / 100_000
    tracemalloc.stop()
    assert spout.num_pending_roots == 100_000 and len(keep) == 200
    print(f"{'spout memory per pending root of a batch (no tree yet)':58} "
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
                  "auto.offset.reset": "earliest", "enable.auto.commit": True,
                  "fetch.queue.backoff.ms": 10})  # as ReliableConsumer sets it
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


def reliable_consumer(bootstrap: str, topic: str, n: int, lanes: int, kind: str) -> float:
    count = [0]
    hits: list[None] = []  # per-record handlers append (atomic, no lock): the no-op's work
    lock = threading.Lock()
    first: list[float] = []

    def seen(k: int) -> None:
        with lock:
            if not first:
                first.append(time.perf_counter())
            count[0] += k

    def noop_batch(batch: Batch) -> None:
        seen(len(batch))

    def noop_basic(_item: Item, _out: Any) -> None:
        if not first:
            seen(0)
        hits.append(None)

    def io_basic(item: Item, _out: Any) -> None:
        if not first:
            seen(0)
        if item.source.offset % 100 == 0:
            time.sleep(0.001)  # the handler's I/O (e.g. a database call), not a wait
        hits.append(None)

    def done() -> bool:
        return count[0] + len(hits) >= n

    topology = (Topology().batch_bolt("noop", noop_batch, lanes) if kind == "batch" else
                Topology().basic_bolt("noop", noop_basic if kind == "basic" else io_basic,
                                      lanes))
    rc = ReliableConsumer({"bootstrap.servers": bootstrap,
                           "group.id": f"reliable-{uuid.uuid4().hex[:6]}",
                           "auto.offset.reset": "earliest"}, [topic], topology)
    # the defaults, as the README's example (issue 24: the benchmark once set
    # offset_commit_period_ms=200 and max_uncommitted_offsets=50,000 and reported 46-98%
    # while a user's pasted example got 1%)
    try:
        while not done():
            rc.poll_once()
        deadline = time.monotonic() + 30  # everything handled: wait for the last settle
        while rc.spout.num_pending_roots and time.monotonic() < deadline:
            rc.poll_once()
        with rc._lock:
            target = rc.spout.committable()
        assert rc._commit(target)
        elapsed = time.perf_counter() - first[0]
        assert rc.spout.num_pending_roots == 0
    finally:
        rc.close()
    return n / elapsed


def burn(_record: Any) -> None:
    """A CPU-bound handler: ~0.2-0.3 ms of pure-Python work per record, GIL held."""
    x = 0
    for i in range(6_000):
        x += i * i


def cpu_consumer(bootstrap: str, topic: str, n: int, lanes: int, processes: bool) -> float:
    """``burn`` per record on ``lanes`` process lanes (``process_bolt``) or thread lanes."""
    topology = (Topology().process_bolt("burn", burn, lanes) if processes else
                Topology().basic_bolt("burn", lambda item, _out: burn(item.source), lanes))
    rc = ReliableConsumer({"bootstrap.servers": bootstrap,
                           "group.id": f"cpu-{uuid.uuid4().hex[:6]}",
                           "auto.offset.reset": "earliest"}, [topic], topology,
                          offset_commit_period_ms=200, poll_batch=100)
    try:  # the workers are started (and waited for) in the constructor: not timed
        dispatched, t0 = 0, 0.0
        while dispatched < n or rc.spout.num_pending_roots:
            got = rc.poll_once()
            if got and not dispatched:
                t0 = time.perf_counter()
            dispatched += got
        return n / (time.perf_counter() - t0)
    finally:
        rc.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--pure-records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--lanes", default="0,1,2,4",
                    help="0: the stage runs on the polling thread (parallelism=0)")
    ap.add_argument("--kinds", default="batch,basic,io,cpu",
                    help="cpu: a CPU-bound handler on 1 and 2 process lanes vs thread lanes")
    ap.add_argument("--cpu-records", type=int, default=3_000)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per measurement: the median is printed, then min-max")
    ap.add_argument("--no-pure", action="store_true")
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}")
    if not args.no_pure:
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
        plain_consumer(bootstrap, topic, args.records)  # warm-up (the broker's first reads)
        plains = [plain_consumer(bootstrap, topic, args.records) for _ in range(args.repeat)]
        print(f"{'plain confluent-kafka consumer (consume(500))':58} {spread(plains)}")
        labels = {"batch": "no-op batch bolt", "basic": "no-op basic bolt",
                  "io": "basic bolt, 1 ms I/O per 100 records"}
        results: list[tuple[str, float]] = []
        kinds = args.kinds.split(",")
        if "cpu" in kinds:
            kinds.remove("cpu")
            cpu_topic = f"bench-cpu-{uuid.uuid4().hex[:6]}"
            fill(bootstrap, cpu_topic, args.cpu_records, args.partitions, args.size)
            for processes, lanes in ((True, 1), (True, 2), (False, 1), (False, 2)):
                rates = [cpu_consumer(bootstrap, cpu_topic, args.cpu_records, lanes, processes)
                         for _ in range(args.repeat)]
                label = (f"CPU-bound handler (~0.25 ms/record), {lanes} "
                         f"{'process' if processes else 'thread'} lane(s)")
                print(f"{label:58} {spread(rates)}")
        for kind in kinds:
            for lanes in (int(x) for x in args.lanes.split(",")):
                rels = [reliable_consumer(bootstrap, topic, args.records, lanes, kind)
                        for _ in range(args.repeat)]
                label = f"ReliableConsumer, {labels[kind]}, {lanes} lane(s)"
                print(f"{label:58} {spread(rels)}")
                results.append((label, statistics.median(rels)))
        again = [plain_consumer(bootstrap, topic, args.records) for _ in range(args.repeat)]
        print(f"{'plain confluent-kafka consumer again':58} {spread(again)}")
        plain = statistics.median(plains + again)
        print(f"median of the reliable runs / median of all {len(plains + again)} plain runs "
              f"({plain:,.0f} records/s):")
        for label, rel in results:
            print(f"  {label:56} {rel / plain:6.0%}")
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
