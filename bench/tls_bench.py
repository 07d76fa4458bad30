"""What encryption and authentication cost (issue 12): produce and consume throughput of one
headrace broker over its PLAINTEXT, SSL and SASL_SSL (PLAIN) listeners, side by side in one
run, with the broker's CPU beside each figure. PLAINTEXT fetches use the zero-copy path
(records go from the page cache to the socket without a copy in Python); TLS fetches
cannot (the records are encrypted in user space), which is what this measures.

    .venv/bin/python bench/tls_bench.py [--records 1000000] [--size 100]

The client is bench/build/loadgen (C, librdkafka; ``bash bench/setup.sh`` builds it), so
the client is not the limit; certificates come from ``headrace dev-certs``' code.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from confluent_kafka.admin import AdminClient, NewTopic
from harness.brokers import BrokerProcess, free_port, start_broker

from headrace.security.devcerts import write_dev_certs

LOADGEN = Path(__file__).resolve().parent / "build" / "loadgen"
PARTS = 4
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        'username="bench" password="bench-pw" user_bench="bench-pw";')


def loadgen(mode: str, bootstrap: str, topic: str, n: int, size: int,
            extra: dict[str, str]) -> dict[str, Any]:
    args = [str(LOADGEN), mode, "-b", bootstrap, "-t", topic, "-p", str(PARTS), "-n", str(n),
            "-s", str(size), "-T", "300"]
    for k, v in extra.items():
        args += ["-X", f"{k}={v}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=400, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    args = ap.parse_args()
    if not LOADGEN.exists():
        sys.exit("bench/build/loadgen is missing: run bash bench/setup.sh")
    work = Path(tempfile.mkdtemp(prefix="headrace-tls-bench-"))
    certs = write_dev_certs(work / "certs")
    ports = {"SSL": free_port(), "SASL_SSL": free_port()}
    overrides = {
        "listeners": f"PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:{ports['SSL']},"
                     f"SASL_SSL://127.0.0.1:{ports['SASL_SSL']}",
        "inter.broker.listener.name": "PLAINTEXT",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(certs["broker.pem"]),
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
    }
    b: BrokerProcess = start_broker("headrace", overrides=overrides)
    tls = {"security.protocol": "SSL", "ssl.ca.location": str(certs["ca.pem"])}
    cases = {
        "PLAINTEXT": (b.bootstrap, {}),
        "SSL": (f"127.0.0.1:{ports['SSL']}", tls),
        "SASL_SSL": (f"127.0.0.1:{ports['SASL_SSL']}",
                     {**tls, "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                      "sasl.username": "bench", "sasl.password": "bench-pw"}),
    }
    rows = []
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for name, (bootstrap, extra) in cases.items():
            topic = f"tls-{name.lower()}-{uuid.uuid4().hex[:6]}"
            admin.create_topics([NewTopic(topic, PARTS, 1)])[topic].result(30)
            for mode in ("-P", "-C"):
                c0 = b.cpu_seconds() or 0.0
                r = loadgen(mode, bootstrap, topic, args.records, args.size,
                            {**extra, "acks": "1"} if mode == "-P" else extra)
                cpu = (b.cpu_seconds() or 0.0) - c0
                rows.append((name, "produce" if mode == "-P" else "consume",
                             r.get("records_per_s", 0), r.get("mb_per_s", 0),
                             round(cpu, 2)))
    finally:
        b.stop()
    print(f"{args.records} records of {args.size} B, {PARTS} partitions, loadgen (C)")
    print(f"{'listener':10} {'phase':8} {'records/s':>11} {'MB/s':>8} {'broker CPU s':>13}")
    for name, phase, rps, mbs, cpu in rows:
        print(f"{name:10} {phase:8} {rps:>11} {mbs:>8} {cpu:>13}")


if __name__ == "__main__":
    main()
