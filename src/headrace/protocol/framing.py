"""PURE: Kafka's size-prefixed frames.

Wire format (R-PROTO-1): every request and response is ``int32 size`` (big endian) followed
by ``size`` bytes. ``FrameDecoder`` is fed whatever the socket delivered and returns the
complete frames (without their prefix) in order; a partial frame waits for more bytes.

The limit (``socket.request.max.bytes``) is enforced on the prefix, before any byte of the
body is buffered, so a peer claiming 2 GB costs nothing: ``FrameTooLargeError`` and the
connection is closed, as Kafka's ``NetworkReceive`` does (``InvalidReceiveException``).

With a ``reserve`` callback (the broker's memory pool, ``queued.max.request.bytes``) the
decoder asks for a frame's full size when its prefix arrives, as Kafka's ``NetworkReceive``
does from its ``MemoryPool``. When the answer is no, the decoder stops where it is and keeps
the rest of what it was fed (``waiting`` is the size it waits for): the caller stops reading
the socket and calls ``retry()`` once the pool can give that memory. While the callback
runs, ``arrived`` is how much of that frame is already in hand (so a caller can tell a
promise from bytes received).

``lazy`` (a connection not yet authenticated, issue 23): a frame's buffer grows with the
bytes that arrive instead of being allocated whole when its prefix arrives, so a prefix
alone costs nothing. ``FrameTooLargeError`` carries the frames completed before the bad
prefix in the same ``feed`` (``frames``): their reservations must still be given back.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable

from headrace.protocol.errors import FrameTooLargeError

SIZE = struct.Struct(">i")
SIZE_BYTES = SIZE.size
# Frames at least this big are received into their own anonymous mapping: it goes back to
# the kernel the moment the frame is dropped (glibc's heap may keep freed memory forever).
MMAP_MIN_BYTES = 4 << 20
Frame = bytes | memoryview


def _always(_size: int) -> bool:
    return True


class FrameDecoder:
    """Splits a byte stream into frames without copying what it need not copy.

    A frame wholly inside one ``feed`` is returned as a read-only view of the data fed (so
    ``data`` must not be mutated afterwards: asyncio hands over fresh ``bytes``), unless it
    is small next to that data (then it is copied, so a tiny frame never keeps a big read
    buffer alive). A frame spanning several feeds is received into one buffer of its exact
    size, allocated when its prefix arrives (after the reservation), and each byte is copied
    once into it; the frame is a read-only view of that buffer.
    """

    def __init__(self, max_frame_bytes: int,
                 reserve: Callable[[int], bool] | None = None) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._reserve = reserve or _always
        self._head = bytearray()  # the first bytes of a size prefix split across feeds
        self._buf: bytearray | mmap.mmap | None = None  # the frame being received
        self._want = 0  # its size
        self._filled = 0
        self.lazy = False  # grow the buffer as bytes arrive (nothing allocated up front)
        self.arrived = 0  # during a ``reserve`` call: bytes of that frame already in hand
        self._pending: list[memoryview] = []  # data fed while waiting for a reservation
        self.waiting = 0  # size of the frame waiting for its reservation (0: none)
        self._waiting_set = False

    @property
    def buffered(self) -> int:
        """Bytes held: a partial prefix, a partial frame and data held while waiting."""
        n = len(self._head) + sum(map(len, self._pending))
        if self._buf is not None:
            n += SIZE_BYTES + self._filled
        if self._waiting_set:
            n += SIZE_BYTES
        return n

    @property
    def waiting_set(self) -> bool:
        """A frame's prefix arrived and its reservation was refused: call ``retry``."""
        return self._waiting_set

    @property
    def reserved_partial(self) -> int:
        """Bytes reserved for the frame being received (to give back if the peer leaves)."""
        return self._want if self._buf is not None else 0

    @property
    def unreceived(self) -> int:
        """Bytes of the frame being received that have not arrived yet."""
        return self._want - self._filled if self._buf is not None else 0

    @property
    def in_progress(self) -> bool:
        """Part of a frame (its prefix, or its body after the reservation) has arrived and
        the rest has not; a prefix waiting for its reservation is not in progress."""
        return bool(self._head) or self._buf is not None

    def _size(self, size: int) -> int:
        if size < 0 or size > self.max_frame_bytes:
            raise FrameTooLargeError(size, self.max_frame_bytes)
        return size

    def retry(self) -> list[Frame]:
        """Go on after a refused reservation (``feed`` of nothing)."""
        return self.feed(b"")

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add ``data``; return every frame now complete. Raises ``FrameTooLargeError``."""
        frames: list[Frame] = []
        if data:
            self._pending.append(memoryview(data).toreadonly())
        try:
            while self._pending:
                mv = self._pending[0]
                pos = self._consume(mv, frames)
                if pos < 0:  # waiting for memory: keep the rest
                    return frames
                self._pending.pop(0)
            if self._waiting_set:  # a prefix was the last thing fed: reserve its frame now
                self._step_waiting(memoryview(b""), 0, frames)
        except FrameTooLargeError as e:
            e.frames = frames
            raise
        return frames

    def _step_waiting(self, mv: memoryview, pos: int, frames: list[Frame]) -> int:
        """Try the reservation of the frame whose prefix arrived. Returns the new position
        or -1 if refused."""
        if not self._waiting_set:
            return pos
        size = self.waiting
        self.arrived = min(len(mv) - pos, size)
        if not self._reserve(size):
            return -1
        self._waiting_set = False
        self.waiting = 0
        if size == 0:
            frames.append(b"")
            return pos
        avail = len(mv) - pos
        if avail >= size:
            if size * 4 < len(mv):
                frames.append(bytes(mv[pos : pos + size]))
            else:
                frames.append(mv[pos : pos + size])
            return pos + size
        if self.lazy:
            self._buf = bytearray()
        else:
            self._buf = mmap.mmap(-1, size) if size >= MMAP_MIN_BYTES else bytearray(size)
        self._want = size
        self._filled = 0
        return pos

    def _consume(self, mv: memoryview, frames: list[Frame]) -> int:
        """Consume ``mv`` (the head of ``_pending``); -1 (and ``mv`` trimmed to what is left)
        if a reservation was refused, else its length."""
        end = len(mv)
        pos = 0
        while True:
            if self._buf is not None:
                take = min(self._want - self._filled, end - pos)
                if take:
                    if len(self._buf) == self._want:
                        # through a memoryview: a bytearray's own slice assignment from a
                        # memoryview copies it into a temporary bytearray first
                        with memoryview(self._buf) as into:
                            into[self._filled : self._filled + take] = mv[pos : pos + take]
                    else:  # lazy: the buffer grows with what arrives
                        assert isinstance(self._buf, bytearray)
                        self._buf += mv[pos : pos + take]
                    self._filled += take
                    pos += take
                if self._filled < self._want:
                    return end
                frames.append(memoryview(self._buf).toreadonly())
                self._buf = None
                self._filled = self._want = 0
                continue
            if self._waiting_set:
                new = self._step_waiting(mv, pos, frames)
                if new < 0:
                    self._pending[0] = mv[pos:]
                    return -1
                pos = new
                continue
            if pos >= end:
                return end
            if self._head or end - pos < SIZE_BYTES:
                take = min(SIZE_BYTES - len(self._head), end - pos)
                self._head += mv[pos : pos + take]
                pos += take
                if len(self._head) < SIZE_BYTES:
                    return end
                (size,) = SIZE.unpack(self._head)
                self._head.clear()
            else:
                (size,) = SIZE.unpack_from(mv, pos)
                pos += SIZE_BYTES
            self.waiting = self._size(size)
            self._waiting_set = True


def frame(payload: bytes | bytearray) -> bytes:
    """``payload`` with its size prefix."""
    return SIZE.pack(len(payload)) + bytes(payload)
