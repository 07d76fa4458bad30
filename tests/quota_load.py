"""The issue's quota measurement (issue 12), shared by
``tests/integration/test_quota_produce_rate.py`` and ``bench/quota_bench.py``.

One confluent-kafka producer with ``client.id`` limited by ``producer_byte_rate`` sends as
fast as librdkafka lets it (10 kB records, acks=1); its rate is computed from acknowledged
bytes over the measured window, after a warm-up. Meanwhile another client (its own
client.id, no quota) sends one small acks=1 record at a time and its produce latencies (send
to delivery report) over the same window give p50 and p99.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from confluent_kafka import Producer

from tests.kafka_wire import WireClient

LIMITED_CLIENT = "quota-limited"
OTHER_CLIENT = "quota-other"
RECORD_BYTES = 10_000


def set_producer_quota(bootstrap: str, client_id: str, byte_rate: int) -> None:
    with WireClient.to(bootstrap) as w:
        resp = w.request(49, 1, {"validate_only": False, "entries": [{
            "entity": [{"entity_type": "client-id", "entity_name": client_id}],
            "ops": [{"key": "producer_byte_rate", "value": float(byte_rate),
                     "remove": False}]}]})
        assert int(resp.entries[0].error_code) == 0, resp


def measure(bootstrap: str, quota: int = 1_048_576, warmup_s: float = 5.0,
            window_s: float = 20.0) -> dict[str, Any]:
    set_producer_quota(bootstrap, LIMITED_CLIENT, quota)
    acked: list[tuple[float, int]] = []  # (monotonic ack time, bytes) of the limited client
    latencies: list[tuple[float, float]] = []  # (send time, seconds) of the other client
    stop = threading.Event()
    errors: list[str] = []

    def limited() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "client.id": LIMITED_CLIENT,
                      "acks": 1, "linger.ms": 5, "queue.buffering.max.kbytes": 4096,
                      "max.in.flight.requests.per.connection": 5,
                      "message.timeout.ms": 120_000})
        value = b"q" * RECORD_BYTES

        def done(err: Any, msg: Any) -> None:
            if err is None:
                acked.append((time.monotonic(), len(msg.value())))
            else:
                errors.append(str(err))

        while not stop.is_set():
            try:
                p.produce("quota-limited", value, on_delivery=done)
            except BufferError:
                p.poll(0.01)
                continue
            p.poll(0)
        p.flush(30)

    def other() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "client.id": OTHER_CLIENT,
                      "acks": 1, "linger.ms": 0})
        while not stop.is_set():
            box: list[float] = []
            sent = time.monotonic()
            p.produce("quota-other", b"s" * 100,
                      on_delivery=lambda err, msg, box=box: box.append(time.monotonic()))
            deadline = sent + 10
            while not box and time.monotonic() < deadline:
                p.poll(0.001)
            if box:
                latencies.append((sent, box[0] - sent))
            else:
                errors.append("a small produce of the other client took over 10 s")
            stop.wait(0.01)
        p.flush(10)

    threads = [threading.Thread(target=limited), threading.Thread(target=other)]
    started = time.monotonic()
    for t in threads:
        t.start()
    # the measured window itself (the 20 s) is the only timed wait
    stop.wait(warmup_s + window_s)
    stop.set()
    for t in threads:
        t.join(60)
    t0, t1 = started + warmup_s, started + warmup_s + window_s
    window_bytes = sum(n for at, n in acked if t0 <= at < t1)
    lat = sorted(s for at, s in latencies if t0 <= at < t1)
    per_second = [sum(n for at, n in acked if t0 + i <= at < t0 + i + 1)
                  for i in range(int(window_s))]
    return {
        "quota_bytes_per_s": quota,
        "measured_bytes_per_s": window_bytes / window_s,
        "ratio": window_bytes / window_s / quota,
        "total_acked_bytes": sum(n for _, n in acked),
        "per_second_mb": [round(b / 1_048_576, 2) for b in per_second],
        "other_produces": len(lat),
        "other_p50_ms": statistics.median(lat) * 1000 if lat else float("nan"),
        "other_p99_ms": lat[int(len(lat) * 0.99) - 1] * 1000 if lat else float("nan"),
        "errors": errors[:5],
    }
