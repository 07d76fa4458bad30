"""Client quota measurement (issue 12): a producer limited to 1 MB/s (producer_byte_rate)
sending as fast as it can beside an unlimited client's small acks=1 produces, against a
headrace broker process. Prints the limited client's rate over the window (from
acknowledged bytes, after a warm-up), its bytes per second, and the other client's p50/p99
produce latency.

    PYTHONPATH=src:. python bench/quota_bench.py [--quota 1048576] [--window 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.brokerproc import BrokerProcess
from tests.quota_load import measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quota", type=int, default=1_048_576, help="producer_byte_rate")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=20.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, BrokerProcess(Path(d) / "data") as broker:
        r = measure(broker.bootstrap, args.quota, args.warmup, args.window)
    print(f"limited client: {r['measured_bytes_per_s'] / 1_048_576:.3f} MB/s over "
          f"{args.window:.0f} s = {r['ratio']:.3f} of the quota "
          f"({args.quota / 1_048_576:.3f} MB/s); per second {r['per_second_mb']}")
    print(f"other client: {r['other_produces']} produces, p50 {r['other_p50_ms']:.2f} ms, "
          f"p99 {r['other_p99_ms']:.2f} ms")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
