"""Fetch read path: ``os.pread`` into memory + ``transport.write`` vs ``loop.sendfile`` vs
``os.sendfile`` straight to the socket (what the broker does: ``Connection._write_regions``).

R-LOG-3 / issue 2 ask that a fetch be served from file bytes, zero-copy where the OS allows,
measured against reading into memory, keeping the faster. This measures the two ways an
asyncio server can put segment bytes on a socket, on loopback, for the fetch sizes that
matter (a consumer's partition slice: 64 KiB .. 1 MiB), each preceded by a small
kio-encoded response head as a real Fetch response would be:

    .venv/bin/python bench/zero_copy.py [--total-mb 512]

Prints MB/s, µs per response and CPU seconds per GB (this process: the sender and the
reading thread, whose share is the same for every method) for each size and method.
``os.sendfile`` writes the head through the transport and, when the transport has nothing
queued, the file bytes with ``os.sendfile`` on the non-blocking socket until it is full;
the rest is read and queued (``loop.sendfile`` waits for the transport to drain before
each response instead).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import tempfile
import time

HEAD = b"\x00" * 96  # stands for the encoded response fields around the records


async def _serve(path: str, size: int, count: int, method: str) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    fd = os.open(path, os.O_RDONLY)
    file = os.fdopen(os.dup(fd), "rb")
    file_size = os.fstat(fd).st_size
    done = asyncio.Event()
    received = 0
    expected = count * (len(HEAD) + size)

    def reader_thread_target(sock: socket.socket) -> None:
        nonlocal received
        buf = bytearray(1 << 20)
        while received < expected:
            n = sock.recv_into(buf)
            if n == 0:
                break
            received += n
        loop.call_soon_threadsafe(done.set)

    server_ready: asyncio.Future[tuple[asyncio.StreamWriter, asyncio.Transport]] = (
        loop.create_future()
    )

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server_ready.set_result((writer, writer.transport))  # type: ignore[arg-type]

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    import threading

    t = threading.Thread(target=reader_thread_target, args=(client,), daemon=True)
    t.start()
    writer, transport = await server_ready
    sock_fd = transport.get_extra_info("socket").fileno()
    start = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    pos = 0
    for _ in range(count):
        if pos + size > file_size:
            pos = 0
        writer.write(HEAD)
        if method == "pread":
            writer.write(os.pread(fd, size, pos))
            await writer.drain()
        elif method == "os.sendfile":
            done_bytes = 0
            if not transport.get_write_buffer_size():
                while done_bytes < size:
                    try:
                        done_bytes += os.sendfile(sock_fd, fd, pos + done_bytes,
                                                  size - done_bytes)
                    except BlockingIOError:
                        break
            if done_bytes < size:
                writer.write(os.pread(fd, size - done_bytes, pos + done_bytes))
            await writer.drain()
        else:
            await writer.drain()
            await loop.sendfile(transport, file, pos, size)
        pos += size
    await writer.drain()
    await asyncio.wait_for(done.wait(), 60)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    writer.close()
    client.close()
    server.close()
    os.close(fd)
    file.close()
    return elapsed, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--total-mb", type=int, default=512)
    args = ap.parse_args()
    with tempfile.NamedTemporaryFile(dir=".", delete=True) as f:
        chunk = os.urandom(1 << 20)
        for _ in range(64):
            f.write(chunk)
        f.flush()
        print("| fetch size | method | MB/s | µs per response | CPU s per GB |")
        print("| --- | --- | --- | --- | --- |")
        for size in (64 << 10, 256 << 10, 1 << 20):
            count = max(1, (args.total_mb << 20) // size)
            for method in ("pread", "loop.sendfile", "os.sendfile"):
                elapsed, cpu = asyncio.run(_serve(f.name, size, count, method))
                mbs = count * size / elapsed / 1e6
                print(f"| {size >> 10} KiB | {method} | {mbs:,.0f} | "
                      f"{elapsed / count * 1e6:,.0f} | {cpu / (count * size / 1e9):.2f} |")


if __name__ == "__main__":
    main()
