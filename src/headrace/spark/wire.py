"""A small Kafka-protocol fetch client for the Spark source: Metadata v12 and Fetch v12 over a
blocking socket, requests and responses encoded by kio.

It does one thing: fetch one partition from its leader at an offset and hand back the raw
records blob (whole record batches, maybe a torn last one) with the partition's error code,
high watermark and log start offset. Decoding is :mod:`headrace.spark.batch_decode`'s.

Connections are cached per process (Spark reuses Python workers between tasks) by broker
address. Thread-safety: one Spark task per worker process at a time; nothing is locked.
Failure: any socket or framing error closes the connection; the caller retries.
"""

from __future__ import annotations

import contextlib
import io
import socket
import struct
from dataclasses import dataclass
from typing import Any

from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from headrace.protocol.codec import request_class, response_class
from headrace.protocol.entities import build

FETCH, METADATA = 1, 3
FETCH_VERSION, METADATA_VERSION = 12, 12
_SIZE = struct.Struct(">i")


class Connection:
    """One socket to one broker; requests are sent and answered one at a time."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.address = (host, port)
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation_id = 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        frame, n = self.request_raw(api_key, version, body)
        rcls = response_class(api_key, version)
        body_obj, _ = entity_reader(rcls)(frame, n)
        return body_obj

    def request_raw(self, api_key: int, version: int, body: dict[str, Any]
                    ) -> tuple[memoryview, int]:
        """Send a request; the response frame and where its body starts (for a caller
        that reads what kio cannot: DescribeTransactions' -1 start time)."""
        cls = request_class(api_key, version)
        hdr = cls.__header_schema__
        self.correlation_id += 1
        buf = io.BytesIO()
        buf.write(b"\0\0\0\0")
        entity_writer(hdr)(buf, hdr(request_api_key=i16(api_key),
                                    request_api_version=i16(version),
                                    correlation_id=i32(self.correlation_id),
                                    client_id="headrace-spark"))
        entity_writer(cls)(buf, build(cls, body))
        payload = buf.getbuffer()
        _SIZE.pack_into(payload, 0, len(payload) - 4)
        self.sock.sendall(payload)
        del payload
        frame = self._recv_frame()
        rcls = response_class(api_key, version)
        header, n = entity_reader(rcls.__header_schema__)(frame, 0)
        if header.correlation_id != self.correlation_id:
            raise ConnectionError(f"response to request {header.correlation_id}, "
                                  f"expected {self.correlation_id}")
        return frame, n

    MAX_RESPONSE_BYTES = 1 << 30  # a size past this is not a Kafka response

    def _recv_frame(self) -> memoryview:
        (size,) = _SIZE.unpack(self._recv_exactly(4))
        if not 0 <= size <= self.MAX_RESPONSE_BYTES:
            raise ConnectionError(f"not a Kafka response (a frame of {size} bytes)")
        return memoryview(self._recv_exactly(size)).toreadonly()

    def _recv_exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if not k:
                raise ConnectionError("connection closed by the broker")
            got += k
        return buf


@dataclass(frozen=True)
class FetchResult:
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: bytes | memoryview


_connections: dict[tuple[str, int], Connection] = {}
_leaders: dict[tuple[str, str, int], tuple[str, int]] = {}


def _parse_servers(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for s in bootstrap.split(","):
        s = s.strip()
        if s:
            host, port = s.rsplit(":", 1)
            out.append((host.strip("[]"), int(port)))
    return out


def _connection(address: tuple[str, int], timeout_s: float) -> Connection:
    conn = _connections.get(address)
    if conn is None:
        conn = _connections[address] = Connection(address[0], address[1], timeout_s)
    return conn


def drop(address: tuple[str, int] | None = None) -> None:
    """Close and forget one cached connection (all if None) and the leaders learnt."""
    for a in [address] if address is not None else list(_connections):
        conn = _connections.pop(a, None) if a is not None else None
        if conn is not None:
            conn.close()
    if address is None:
        _leaders.clear()


class PartitionFetcher:
    """Fetches one topic partition from its leader (found with Metadata)."""

    def __init__(self, bootstrap: str, topic: str, partition: int, timeout_s: float) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partition = partition
        self.timeout_s = timeout_s

    def leader(self) -> tuple[str, int]:
        key = (self.bootstrap, self.topic, self.partition)
        found = _leaders.get(key)
        if found is not None:
            return found
        last: Exception | None = None
        for address in _parse_servers(self.bootstrap):
            try:
                md = _connection(address, self.timeout_s).request(METADATA, METADATA_VERSION, {
                    "topics": [{"name": self.topic, "topic_id": None}],
                    "allow_auto_topic_creation": False,
                    "include_topic_authorized_operations": False,
                })
            except (OSError, ConnectionError, ValueError) as e:
                drop(address)
                last = e
                continue
            brokers = {int(b.node_id): (str(b.host), int(b.port)) for b in md.brokers}
            for t in md.topics:
                if t.name != self.topic:
                    continue
                for p in t.partitions:
                    if int(p.partition_index) == self.partition and int(p.leader_id) in brokers:
                        _leaders[key] = brokers[int(p.leader_id)]
                        return _leaders[key]
            raise LookupError(f"no leader for {self.topic}-{self.partition} in the metadata")
        raise ConnectionError(f"no broker of {self.bootstrap} answered: {last}")

    def forget_leader(self) -> None:
        address = _leaders.pop((self.bootstrap, self.topic, self.partition), None)
        if address is not None:
            drop(address)

    def fetch(self, offset: int, max_wait_ms: int, max_bytes: int) -> FetchResult:
        address = self.leader()
        try:
            resp = _connection(address, self.timeout_s).request(FETCH, FETCH_VERSION, {
                "replica_id": -1, "max_wait": max_wait_ms, "min_bytes": 1,
                "max_bytes": max_bytes, "isolation_level": 0, "session_id": 0,
                "session_epoch": -1,
                "topics": [{"topic": self.topic, "partitions": [{
                    "partition": self.partition, "fetch_offset": offset,
                    "partition_max_bytes": max_bytes}]}],
                "forgotten_topics_data": [], "rack_id": "",
            })
        except (OSError, ConnectionError, ValueError):
            self.forget_leader()
            raise
        for t in resp.responses:
            for p in t.partitions:
                if int(p.partition_index) == self.partition:
                    return FetchResult(int(p.error_code), int(p.high_watermark),
                                       int(p.log_start_offset), p.records or b"")
        if int(resp.error_code):
            return FetchResult(int(resp.error_code), -1, -1, b"")
        raise ConnectionError(f"fetch response without {self.topic}-{self.partition}")
