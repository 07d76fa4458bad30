"""Broker CPU per request, headrace and Tansu side by side: one client sends the same
pre-encoded request over one socket, one at a time (each waits for its answer), so the
rate is one round trip's and the broker's CPU per request is read from /proc. What a
small record costs a broker before any batching: a one-record Produce (1 KiB, acks=1 and
acks=all), a ten-record one (100 B each), a one-topic Metadata, and an assign()-mode
OffsetCommit of one partition.

    .venv/bin/python bench/request_cost.py [--requests 10000] [--broker headrace|tansu|both]

Not a test: prints one line per request kind and broker.
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from harness.brokers import BrokerProcess, start_broker
from kio.index import load_request_schema
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from headrace.protocol.entities import build
from headrace.protocol.records import build_batch


def frame(api_key: int, version: int, body: dict[str, Any]) -> bytes:
    cls = load_request_schema(api_key, version)
    hdr = cls.__header_schema__
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    entity_writer(hdr)(buf, hdr(request_api_key=i16(api_key), request_api_version=i16(version),
                                correlation_id=i32(7), client_id="request-cost"))
    entity_writer(cls)(buf, build(cls, body))
    out = bytearray(buf.getvalue())
    struct.pack_into(">i", out, 0, len(out) - 4)
    return bytes(out)


def requests(topic: str, group: str) -> dict[str, bytes]:
    def produce(records: list[tuple[bytes | None, bytes]], acks: int) -> bytes:
        batch = build_batch(records, int(time.time() * 1000))
        return frame(0, 9, {"transactional_id": None, "acks": acks, "timeout": 30000,
                            "topic_data": [{"name": topic, "partition_data": [
                                {"index": 0, "records": bytes(batch)}]}]})
    return {
        "produce 1 x 1 KiB, acks=1": produce([(None, os.urandom(1024))], 1),
        "produce 1 x 1 KiB, acks=all": produce([(None, os.urandom(1024))], -1),
        "produce 10 x 100 B, acks=1": produce([(None, os.urandom(100))] * 10, 1),
        "metadata v12, one topic": frame(3, 12, {
            "topics": [{"name": topic, "topic_id": uuid.UUID(int=0)}],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False}),
        "offset commit v8, one partition": frame(8, 8, {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "group_instance_id": None, "topics": [{"name": topic, "partitions": [
                {"partition_index": 0, "committed_offset": 5, "committed_leader_epoch": -1,
                 "committed_metadata": ""}]}]}),
    }


def round_trip(sock: socket.socket, request: bytes) -> None:
    sock.sendall(request)
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        head += chunk
    left = struct.unpack(">i", head)[0]
    while left:
        chunk = sock.recv(min(1 << 16, left))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        left -= len(chunk)


def measure(broker: BrokerProcess, count: int) -> None:
    topic = f"request-cost-{uuid.uuid4().hex[:6]}"
    group = f"g-{topic}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)  # coordinator
    consumer.close()
    host, port = broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for name, request in requests(topic, group).items():
            try:
                for _ in range(200):  # warm up
                    round_trip(sock, request)
                cpu0, t0 = broker.cpu_seconds() or 0.0, time.perf_counter()
                for _ in range(count):
                    round_trip(sock, request)
                wall = time.perf_counter() - t0
                cpu = (broker.cpu_seconds() or 0.0) - cpu0
            except (OSError, ConnectionError) as e:
                print(f"{broker.name:9} {name:34} failed: {e}", flush=True)
                return
            print(f"{broker.name:9} {name:34} {count / wall:8,.0f} requests/s  "
                  f"{cpu / count * 1e6:6.1f} µs of broker CPU per request", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000, help="per request kind")
    ap.add_argument("--broker", choices=("headrace", "tansu", "both"), default="both")
    args = ap.parse_args()
    for name in ("headrace", "tansu") if args.broker == "both" else (args.broker,):
        broker = start_broker(name)
        try:
            measure(broker, args.requests)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
