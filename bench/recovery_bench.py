"""How long a partition takes to open with and without producer-state snapshots (issue 10,
item 2): a log of many small idempotent and transactional batches over many segments is
written once, then opened (as after a clean shutdown, after a kill -9, and with every
``.snapshot`` removed, which is how headrace opened every log before snapshots: one
61-byte header read per batch of every segment).

    .venv/bin/python bench/recovery_bench.py [--batches 400000] [--segment-bytes 1048576]

Prints, per case, the open time (median of 3) and how many batch headers the state load
read. Pure storage: no broker, no client (the log is ``headrace.log.partition_log``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.batches import simple_batch

from headrace.clock import SystemClock
from headrace.config import LogConfig
from headrace.log.partition_log import PartitionLog
from headrace.log.state_files import snapshot_offsets, snapshot_path


def build(directory: Path, batches: int, segment_bytes: int) -> None:
    log = PartitionLog.open(directory, LogConfig(segment_bytes=segment_bytes),
                            SystemClock())
    seqs = [0] * 8
    for i in range(batches):
        pid = i % 8
        txn = pid < 2
        b = simple_batch(2, ts=1_700_000_000_000, producer_id=pid + 1, producer_epoch=0,
                         base_sequence=seqs[pid], transactional=txn)
        log.append_as_leader(b, 0)
        seqs[pid] += 2
        if txn and i % 64 < 8:
            log.append_marker(pid + 1, 0, i % 128 >= 8, 0, 0)
    log.high_watermark = log.log_end_offset
    log.close()


def timed_open(directory: Path) -> tuple[float, int, int]:
    times = []
    scanned = segments = 0
    for _ in range(3):
        t = time.perf_counter()
        log = PartitionLog.open(directory, LogConfig(), SystemClock())
        times.append(time.perf_counter() - t)
        scanned, segments = log.scanned_batches, len(log.segments)
        for seg in log.segments:  # close without a new snapshot: the next open is the same
            seg.close()
    return statistics.median(times), scanned, segments


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=400_000)
    ap.add_argument("--segment-bytes", type=int, default=1 << 20)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headrace-recovery-"))
    try:
        d = work / "t-0"
        t = time.perf_counter()
        build(d, args.batches, args.segment_bytes)
        print(f"wrote {args.batches} batches in {time.perf_counter() - t:.1f} s")
        rows = [("after a clean shutdown (snapshot at the end)", *timed_open(d))]
        offsets = snapshot_offsets(d)
        snapshot_path(d, offsets[-1]).unlink()  # what a kill -9 leaves: the roll's snapshot
        rows.append(("after kill -9 (the last roll's snapshot)", *timed_open(d)))
        for off in snapshot_offsets(d):
            snapshot_path(d, off).unlink()
        rows.append(("no snapshot (every batch header read)", *timed_open(d)))
        print(f"{'case':48} {'open s':>8} {'headers read':>13} {'segments':>9}")
        for name, secs, scanned, segs in rows:
            print(f"{name:48} {secs:8.3f} {scanned:13d} {segs:9d}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
