"""The machine's own limits, measured in the same run as the brokers.

- ``disk_write``: sequential 1 MiB writes of random bytes to a file in the directory the
  brokers' data dirs live in, one ``fsync`` at the end, timed including the fsync.
- ``loopback_tcp``: one process sends 1 MiB buffers to another over a 127.0.0.1 TCP
  connection; the receiver times from accept to the last byte.

Both stop early at a deadline and report what they managed.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20
MB = 1_000_000


@dataclass
class LimitResult:
    name: str
    bytes: int
    seconds: float
    detail: str
    error: str | None = None

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / MB if self.seconds > 0 else 0.0


def disk_write(directory: Path | None, total_bytes: int, max_seconds: float) -> LimitResult:
    chunk = os.urandom(CHUNK)
    written = 0
    fd, path = tempfile.mkstemp(prefix="bench-disk-", dir=directory)
    try:
        start = time.perf_counter()
        stop_at = start + max_seconds
        while written < total_bytes and time.perf_counter() < stop_at:
            written += os.write(fd, chunk)
        os.fsync(fd)
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)
    detail = f"{written // CHUNK} MiB in 1 MiB writes, fsync at end"
    return LimitResult("disk sequential write", written, seconds, detail)


def _send(port: int, total_bytes: int, max_seconds: float) -> None:
    buf = os.urandom(CHUNK)
    sent = 0
    stop_at = time.perf_counter() + max_seconds
    with socket.create_connection(("127.0.0.1", port)) as s:
        while sent < total_bytes and time.perf_counter() < stop_at:
            s.sendall(buf)
            sent += len(buf)


def loopback_tcp(total_bytes: int, max_seconds: float) -> LimitResult:
    # spawn, not fork: the parent may already hold librdkafka threads.
    ctx = multiprocessing.get_context("spawn")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sender = ctx.Process(target=_send, args=(port, total_bytes, max_seconds), daemon=True)
        sender.start()
        server.settimeout(30.0)
        conn, _ = server.accept()
        received = 0
        buf = bytearray(CHUNK)
        with conn:
            start = time.perf_counter()
            while True:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                received += n
            seconds = time.perf_counter() - start
        sender.join(10.0)
    detail = f"{received // CHUNK} MiB, sender and receiver in two processes"
    return LimitResult("loopback TCP", received, seconds, detail)
