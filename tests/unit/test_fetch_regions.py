"""A Fetch response's records go out with ``sendfile`` (``FileRegion``; issue 24: the
leader's copies of what it sends its followers were a fifth of its CPU at RF 3).

The rules: the bytes a client receives are exactly the response's bytes, in order, whether
the socket took everything directly (writev + sendfile), took part of it (the rest read
with ``pread`` and queued on the transport), or could not be written directly at all
(something already queued; a TLS connection has no fd); a region whose segment was cut
back after it was taken is never sent (the connection is aborted instead); every region's
pin on the file is given back in every case (R-LOG-2, R-PROTO-3)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.batches import make_batch

from headrace.broker.server import Connection
from headrace.log.index import OPEN_FILES
from headrace.log.segment import REGION_MIN_BYTES, FileRegion, LogSegment
from headrace.protocol.codec import RegionChunks
from headrace.protocol.records import read_header


class FakeTransport:
    """What the connection queues once the socket is full (an asyncio transport's part)."""

    def __init__(self, queued: bytes = b"") -> None:
        self.queued = bytearray(queued)
        self.aborted = False

    def write(self, data: Any) -> None:
        self.queued += bytes(data)

    def get_write_buffer_size(self) -> int:
        return len(self.queued)

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def _connection(transport: FakeTransport, sock: socket.socket | None) -> Any:
    """The parts of a Connection that ``_write_regions`` uses (``sock`` None: TLS)."""
    conn = SimpleNamespace(transport=transport, _fd=-1 if sock is None else sock.fileno(),
                           peer="test")
    conn._writev = lambda chunks: Connection._writev(conn, chunks)  # type: ignore[arg-type]
    conn._sendfile = lambda region: Connection._sendfile(conn, region)  # type: ignore[arg-type]
    return conn


def _segment(tmp_path: Path, batches: int, value_size: int) -> LogSegment:
    seg = LogSegment.create(tmp_path, 0, index_interval_bytes=4096,
                            max_index_bytes=1 << 20, now_ms=0)
    for i in range(batches):
        batch = make_batch([(None, os.urandom(value_size), 1_000, [])] * 4,
                           base_offset=seg.next_offset)
        assert read_header(batch).base_offset == 4 * i
        seg.append(batch, read_header(batch))
    return seg


def _socketpair(sndbuf: int | None = None) -> tuple[socket.socket, socket.socket]:
    """A connected pair over loopback TCP (the broker's side first)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        b = socket.create_connection(server.getsockname())
        a, _ = server.accept()
    a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio sets it
    if sndbuf is not None:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    a.setblocking(False)
    return a, b


def _drain(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    out = bytearray()
    while True:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            return bytes(out)
        if not data:
            return bytes(out)
        out += data


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    sock.setblocking(True)
    sock.settimeout(10)
    out = bytearray()
    while len(out) < n:
        data = sock.recv(n - len(out))
        assert data, f"closed after {len(out)} of {n} bytes"
        out += data
    return bytes(out) + _drain(sock)  # and nothing more


def _pins(seg: LogSegment) -> int:
    return seg._file.pins


def test_a_small_read_is_bytes_and_a_large_one_a_region_of_the_same_bytes(
        tmp_path: Path) -> None:
    seg = _segment(tmp_path, 8, 3000)
    small = seg.read_region(0, REGION_MIN_BYTES - 1)
    assert isinstance(small, bytes) and small == seg.read(0, REGION_MIN_BYTES - 1)
    region = seg.read_region(0, seg.size + 100)  # clamped to the file, as pread is
    assert isinstance(region, FileRegion)
    assert len(region) == seg.size and region.read() == seg.read(0, seg.size)
    assert region.read(1000) == seg.read(1000, seg.size - 1000)
    assert _pins(seg) == 1
    region.release()
    region.release()  # twice is harmless
    assert _pins(seg) == 0
    seg.read_region(0, seg.size)  # dropped without being written: its pin goes back at
    seg.read(0, 10)  # the next use of a file
    assert _pins(seg) == 0


class _TimeoutLock:
    """OPEN_FILES.lock for the test below: a second acquire in the same thread fails after
    a moment (a real one would hang: the lock is not reentrant)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        if not self._lock.acquire(timeout=1):
            raise RuntimeError("OPEN_FILES.lock taken again by the thread holding it")

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_a_region_dropped_under_the_file_table_lock_gives_its_pin_back_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The garbage collector can finalize a region (one in a reference cycle) while this
    thread holds the file table's lock; its finalizer must not take the lock again (a
    deadlock), and its pin must still come back."""
    seg = _segment(tmp_path, 8, 3000)
    monkeypatch.setattr(OPEN_FILES, "lock", _TimeoutLock())
    region = seg.read_region(0, seg.size)
    assert _pins(seg) == 1
    with OPEN_FILES.lock:
        del region  # finalized here, under the lock
    seg.read(0, 10)
    assert _pins(seg) == 0


def test_a_cut_back_segment_invalidates_its_regions(tmp_path: Path) -> None:
    seg = _segment(tmp_path, 8, 3000)
    before = seg.read_region(0, seg.size)
    assert isinstance(before, FileRegion) and before.valid()
    mark = seg.mark()
    batch = make_batch([(None, b"x" * 100, 1_000, [])], base_offset=seg.next_offset)
    seg.append(batch, read_header(batch))
    appended = seg.read_region(0, seg.size)
    assert isinstance(appended, FileRegion)
    seg.undo_to(mark)  # a failed request's appends put back
    assert not appended.valid() and not before.valid()
    region = seg.read_region(0, seg.size)
    assert isinstance(region, FileRegion) and region.valid()
    seg.truncate_to(16)  # a follower truncating
    assert not region.valid()


def test_everything_goes_straight_to_the_socket_when_it_takes_it(tmp_path: Path) -> None:
    seg = _segment(tmp_path, 8, 3000)
    region = seg.read_region(0, seg.size)
    assert isinstance(region, FileRegion)
    a, b = _socketpair()
    try:
        transport = FakeTransport()
        conn = _connection(transport, a)
        Connection._write_regions(conn, RegionChunks([b"head", region, b"tail"]))
        expected = b"head" + seg.read(0, seg.size) + b"tail"
        assert _recv_exactly(b, len(expected)) == expected
        assert transport.queued == b"" and not transport.aborted
        assert _pins(seg) == 0
    finally:
        a.close()
        b.close()


def test_what_a_full_socket_does_not_take_is_read_and_queued_in_order(
        tmp_path: Path) -> None:
    seg = _segment(tmp_path, 64, 30_000)  # ~7.7 MB: more than the socket buffers hold
    regions = [seg.read_region(0, seg.size // 2), seg.read_region(seg.size // 2,
                                                                  seg.size - seg.size // 2)]
    assert all(isinstance(r, FileRegion) for r in regions)
    a, b = _socketpair(sndbuf=64 * 1024)
    try:
        transport = FakeTransport()
        conn = _connection(transport, a)
        Connection._write_regions(conn, RegionChunks([b"h1", regions[0], b"h2", regions[1],
                                                      b"end"]))
        expected = b"h1" + seg.read(0, seg.size // 2) + b"h2" + seg.read(
            seg.size // 2, seg.size) + b"end"
        assert transport.queued, "the socket should have filled and the rest been queued"
        direct = _recv_exactly(b, len(expected) - len(transport.queued))
        assert direct + bytes(transport.queued) == expected
        assert not transport.aborted and _pins(seg) == 0
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("why", ["queued", "tls"])
def test_nothing_goes_direct_behind_queued_bytes_or_without_an_fd(
        tmp_path: Path, why: str) -> None:
    seg = _segment(tmp_path, 8, 3000)
    region = seg.read_region(0, seg.size)
    a, b = _socketpair()
    try:
        transport = FakeTransport(b"earlier" if why == "queued" else b"")
        conn = _connection(transport, a if why == "queued" else None)
        Connection._write_regions(conn, RegionChunks([b"head", region, b"tail"]))
        assert _drain(b) == b""
        prefix = b"earlier" if why == "queued" else b""
        assert bytes(transport.queued) == prefix + b"head" + seg.read(0, seg.size) + b"tail"
        assert _pins(seg) == 0
    finally:
        a.close()
        b.close()


def test_a_region_cut_before_it_went_out_aborts_the_connection(tmp_path: Path) -> None:
    seg = _segment(tmp_path, 8, 3000)
    region = seg.read_region(0, seg.size)
    later = seg.read_region(0, seg.size)
    seg.truncate_to(4)
    a, b = _socketpair()
    try:
        transport = FakeTransport()
        conn = _connection(transport, a)
        Connection._write_regions(conn, RegionChunks([b"head", region, b"mid", later]))
        assert transport.aborted
        sent = _drain(b) + bytes(transport.queued)
        assert sent == b"", "nothing of a response whose records changed may go out"
        assert _pins(seg) == 0
    finally:
        a.close()
        b.close()


def test_whole_batches_within_agrees_with_reading_the_bytes(tmp_path: Path) -> None:
    """A fetch cut by its byte limit sends the whole batches that fit as a region: their
    length is found from the headers, and must be what a read of the bytes finds."""
    from headrace.protocol.records import whole_batches_length

    seg = _segment(tmp_path, 40, 2500)
    headers = list(seg.headers(0))
    for start in (0, headers[3].position, headers[17].position):
        for max_bytes in range(1, seg.size - start + 50, 997):
            got = seg.whole_batches_within(start, max_bytes, max_offset=1 << 62)
            assert got == whole_batches_length(seg.read(start, max_bytes)), (start, max_bytes)
    # and batches at or past max_offset are left out
    assert seg.whole_batches_within(0, seg.size, max_offset=headers[5].base_offset) == \
        headers[5].position
    assert seg.whole_batches_within(0, seg.size, max_offset=1 << 62, max_headers=10) == 0
