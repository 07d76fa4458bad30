"""Process lanes (issue 14): does a CPU-bound handler gain throughput from 2 process lanes?

A pure-Python handler that holds the GIL (``burn``, ~0.3 ms per record) on 1 and 2 process
lanes and on 2 thread lanes, next to the same handler in 1 and 2 bare worker processes (no
consumer): the bare workers say what the machine can give two CPU-bound processes right now,
so the comparison means something only when they gain (a busy machine has no second core to
give). Rounds are interleaved and the best of each kind is kept.

    .venv/bin/python bench/process_lanes.py                 # starts a broker (tests/brokerproc)
    .venv/bin/python bench/process_lanes.py --bootstrap HOST:PORT --records 6000 --rounds 3

Moved here from tests/integration/test_process_lanes.py, which skipped on a busy machine (a
throughput comparison cannot be a deterministic test); that test now checks, on any machine,
that the work really runs in two worker processes and that every record is handled once.
Prints the records/s of each kind and the verdict (2 process lanes >= 1.3x 1 process lane
and >= 1.3x 2 thread lanes, when 2 bare workers gain >= 1.4x).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.brokerproc import BrokerProcess
from tests.integration.test_reliable import create_and_fill

from headrace.reliable import ReliableConsumer, Topology
from headrace.reliable.processes import ProcessWorker
from headrace.reliable.topology import Record


def burn(record: Record) -> None:
    """About 0.3 ms of pure-Python CPU per record (holds the GIL throughout)."""
    x = 0
    for i in range(6_000):
        x += i * i
    assert x > 0


def consume_all(rc: ReliableConsumer, n: int, timeout_s: float = 300.0) -> float:
    """Poll until ``n`` roots were dispatched and none is pending; records/s from the first
    dispatched record."""
    dispatched = 0
    t0 = None
    deadline = time.monotonic() + timeout_s
    while dispatched < n or rc.spout.num_pending_roots:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{dispatched} of {n} dispatched, "
                               f"{rc.spout.num_pending_roots} pending")
        got = rc.poll_once()
        if got and t0 is None:
            t0 = time.perf_counter()
        dispatched += got
    assert t0 is not None
    return n / (time.perf_counter() - t0)


def raw_workers(k: int, n: int) -> float:
    """records/s of ``burn`` in ``k`` bare worker processes (no consumer)."""
    workers = [ProcessWorker(burn, f"raw-{i}") for i in range(k)]
    for w in workers:
        w.start()
    records = [("t", 0, o, None, b"v", (), None) for o in range(100)]
    threads = [threading.Thread(target=lambda w=w: [w.call(records)
                                                    for _ in range(n // 100 // k)])
               for w in workers]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = n / (time.perf_counter() - t0)
    for w in workers:
        w.stop()
    return rate


def run(bootstrap: str, n: int, rounds: int) -> dict[str, int]:
    topic = f"cpu-{uuid.uuid4().hex[:6]}"
    create_and_fill(bootstrap, topic, 4, [f"v{i}" for i in range(n)])
    labels = ["raw-1", "raw-2", "process-1", "process-2", "thread-2"]
    rates: dict[str, list[float]] = {label: [] for label in labels}
    for _ in range(rounds):  # interleaved: the machine's state cancels out
        for label in labels:
            kind, lanes = label.split("-")
            if kind == "raw":
                rates[label].append(raw_workers(int(lanes), n))
                continue
            topology = (Topology().process_bolt("burn", burn, int(lanes)) if kind == "process"
                        else Topology().basic_bolt("burn", lambda item, _o: burn(item.source),
                                                   int(lanes)))
            conf: dict[str, Any] = {"bootstrap.servers": bootstrap,
                                    "group.id": f"g-{uuid.uuid4().hex[:8]}",
                                    "auto.offset.reset": "earliest"}
            rc = ReliableConsumer(conf, [topic], topology, poll_batch=100,
                                  offset_commit_period_ms=200)
            try:
                rates[label].append(consume_all(rc, n))
            finally:
                rc.close()
    return {label: round(max(r)) for label, r in rates.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", help="an existing broker (default: start one)")
    ap.add_argument("--records", type=int, default=3_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.bootstrap:
        best = run(args.bootstrap, args.records, args.rounds)
    else:
        with tempfile.TemporaryDirectory() as d, \
                BrokerProcess(Path(d), {"group.initial.rebalance.delay.ms": "0"}) as b:
            best = run(b.bootstrap, args.records, args.rounds)
    print(f"load {os.getloadavg()[0]:.1f}: best records/s of {args.records} records "
          f"over {args.rounds} rounds")
    for label, rate in best.items():
        print(f"  {label:10s} {rate:8d}")
    raw_gain = best["raw-2"] / best["raw-1"]
    if raw_gain < 1.4:
        print(f"no second core free (2 bare workers gain {raw_gain:.2f}x over 1): "
              "no verdict")
        return
    ok = (best["process-2"] >= 1.3 * best["process-1"]
          and best["process-2"] >= 1.3 * best["thread-2"])
    print(f"2 process lanes: {best['process-2'] / best['process-1']:.2f}x 1 process lane, "
          f"{best['process-2'] / best['thread-2']:.2f}x 2 thread lanes: "
          f"{'gain (>= 1.3x both)' if ok else 'NO GAIN (< 1.3x)'}")


if __name__ == "__main__":
    main()
