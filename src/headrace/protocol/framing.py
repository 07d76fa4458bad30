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
    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data``; return every frame now complete. Raises ``FrameTooLargeError``."""
        buf = self._buf
        if not buf:
            frames = self._split(data)
            return frames
        buf += data
        frames = self._split(buf)
        return frames

    def _split(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        frames: list[bytes] = []
        pos = 0
        end = len(data)
        mv = memoryview(data)
        try:
            while end - pos >= SIZE_BYTES:
                (size,) = SIZE.unpack_from(mv, pos)
                if size < 0 or size > self.max_frame_bytes:
                    raise FrameTooLargeError(size, self.max_frame_bytes)
                if end - pos - SIZE_BYTES < size:
                    break
                start = pos + SIZE_BYTES
                frames.append(bytes(mv[start : start + size]))
                pos = start + size
            rest = bytes(mv[pos:])
        finally:
            mv.release()
        self._buf = bytearray(rest)
        return frames


def frame(payload: bytes | bytearray) -> bytes:
    """``payload`` with its size prefix."""
    return SIZE.pack(len(payload)) + bytes(payload)
