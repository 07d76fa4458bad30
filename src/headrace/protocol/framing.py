"""PURE: Kafka's size-prefixed frames.

Wire format (R-PROTO-1): every request and response is ``int32 size`` (big endian) followed
by ``size`` bytes. ``FrameDecoder`` is fed whatever the socket delivered and returns the
complete frames (without their prefix) in order; a partial frame waits for more bytes.

The limit (``socket.request.max.bytes``) is enforced on the prefix, before any byte of the
body is buffered, so a peer claiming 2 GB costs nothing: ``FrameTooLargeError`` and the
connection is closed, as Kafka's ``NetworkReceive`` does (``InvalidReceiveException``).
"""

from __future__ import annotations

import struct

from headrace.protocol.errors import FrameTooLargeError

SIZE = struct.Struct(">i")
SIZE_BYTES = SIZE.size


class FrameDecoder:
    """Splits a byte stream into frames without copying what it need not copy.

    A frame wholly inside one ``feed`` is returned as a read-only view of the data fed (so
    ``data`` must not be mutated afterwards: asyncio hands over fresh ``bytes``). The pieces
    of a frame spanning several feeds are kept as they arrive (memory grows only with what
    the peer really sent) and joined once when the last one comes: each byte is copied once.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._head = bytearray()  # the first bytes of a size prefix split across feeds
        self._parts: list[memoryview] = []  # pieces of a frame being gathered (no prefix)
        self._missing = 0  # bytes that frame still lacks

    @property
    def buffered(self) -> int:
        return len(self._head) + sum(map(len, self._parts)) + (SIZE_BYTES if self._parts else 0)

    def _size(self, size: int) -> int:
        if size < 0 or size > self.max_frame_bytes:
            raise FrameTooLargeError(size, self.max_frame_bytes)
        return size

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes | memoryview]:
        """Add ``data``; return every frame now complete. Raises ``FrameTooLargeError``."""
        frames: list[bytes | memoryview] = []
        mv = memoryview(data).toreadonly()
        end = len(mv)
        pos = 0
        if self._head:
            take = min(SIZE_BYTES - len(self._head), end)
            self._head += mv[:take]
            pos = take
            if len(self._head) < SIZE_BYTES:
                return frames
            (size,) = SIZE.unpack(self._head)
            self._head.clear()
            if self._size(size) == 0:
                frames.append(b"")
            else:
                self._parts.append(mv[pos:pos])
                self._missing = size
        if self._parts:
            take = min(self._missing, end - pos)
            self._parts.append(mv[pos : pos + take])
            self._missing -= take
            pos += take
            if self._missing:
                return frames
            frames.append(b"".join(self._parts))
            self._parts = []
        while end - pos >= SIZE_BYTES:
            size = self._size(SIZE.unpack_from(mv, pos)[0])
            start = pos + SIZE_BYTES
            if end - start < size:
                self._parts = [mv[start:end]]
                self._missing = size - (end - start)
                return frames
            frames.append(mv[start : start + size])
            pos = start + size
        if pos < end:
            self._head += mv[pos:end]
        return frames


def frame(payload: bytes | bytearray) -> bytes:
    """``payload`` with its size prefix."""
    return SIZE.pack(len(payload)) + bytes(payload)
