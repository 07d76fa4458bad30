"""PURE: the broker's resource accounting — request memory, connection quotas, log pacing.

``MemoryPool`` is Kafka's ``queued.max.request.bytes`` (``SimpleMemoryPool``): one budget
shared by every connection. A connection reserves a frame's full size as soon as the frame's
size prefix has arrived, before any byte of the body is buffered, and gives it back once the
request has been handled (or dropped with its connection). A frame that does not fit waits:
its connection stops being read ("muted") until memory is released. Two rules keep one
kind of client from starving another:

- large frames wait in arrival order (FIFO), so a stream of smaller ones cannot starve them;
- ``headroom`` bytes (an eighth of the pool) are usable only by small frames
  (``small_frame_bytes``), so connections parked mid-way through large frames (a slow or
  hostile client) never stall other clients' small requests (metadata, heartbeats, commits,
  ordinary produce batches).

A frame larger than ``max_single`` (what a large frame can ever get) can never fit: the
caller closes the connection, as Kafka does for a frame over ``socket.request.max.bytes``.

``ConnectionQuotas`` is ``max.connections`` / ``max.connections.per.ip``, and ``LogPacer``
turns a burst of one kind of event into at most one log line per interval. Nothing here does
I/O or reads a clock: times are passed in.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import TypeVar

UNLIMITED = -1
K = TypeVar("K", bound=Hashable)


class MemoryPool:
    """A byte budget with FIFO waiters. ``capacity`` -1 means no limit."""

    def __init__(self, capacity: int, small_frame_bytes: int | None = None,
                 headroom: int | None = None) -> None:
        self.capacity = capacity
        self.unlimited = capacity < 0
        if self.unlimited:
            self.headroom = 0
            self.small_frame_bytes = 0
        else:
            self.headroom = capacity // 8 if headroom is None else headroom
            self.small_frame_bytes = (max(self.headroom // 16, 64 * 1024)
                                      if small_frame_bytes is None else small_frame_bytes)
            self.small_frame_bytes = min(self.small_frame_bytes, self.headroom)
        self.used = 0
        self.peak = 0  # highest ``used`` since the caller last reset it
        self._waiters: collections.OrderedDict[Hashable, int] = collections.OrderedDict()
        self._granted: dict[Hashable, int] = {}

    @property
    def available(self) -> int:
        return (2**63 - 1) if self.unlimited else self.capacity - self.used

    @property
    def max_single(self) -> int:
        """The largest reservation that can ever succeed."""
        if self.unlimited:
            return 2**63 - 1
        return max(self.capacity - self.headroom, self.small_frame_bytes)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _fits(self, n: int) -> bool:
        if self.unlimited:
            return True
        if n <= self.small_frame_bytes:
            return n <= self.capacity - self.used
        return n <= self.capacity - self.headroom - self.used

    def try_reserve(self, n: int, owner: Hashable) -> bool:
        """Reserve ``n`` bytes for ``owner``; False queues ``owner`` as a waiter (once).

        A waiter is handed its bytes by ``release`` (which reports it); its next
        ``try_reserve`` of the same size then succeeds at once."""
        if n < 0:
            raise ValueError("negative reservation")
        if n > self.max_single:
            raise ValueError(f"{n} bytes can never fit in a pool of {self.capacity}")
        granted = self._granted.pop(owner, None)
        if granted is not None:
            if granted == n:
                return True
            self._release(granted)  # a different size: give it back and start over
        queued = owner in self._waiters
        small = n <= self.small_frame_bytes
        if (small or not self._waiters or (queued and next(iter(self._waiters)) == owner)) \
                and self._fits(n):
            self._waiters.pop(owner, None)
            self.used += n
            self.peak = max(self.peak, self.used)
            return True
        if not queued:
            self._waiters[owner] = n
        return False

    def release(self, n: int) -> list[Hashable]:
        """Give back ``n`` bytes. Returns the waiters now granted their reservation (the
        caller wakes them, and each one's next ``try_reserve`` succeeds)."""
        self._release(n)
        return self._grant()

    def _release(self, n: int) -> None:
        self.used -= n
        if self.used < 0:
            raise AssertionError("memory pool released more than was reserved")

    def _grant(self) -> list[Hashable]:
        woken: list[Hashable] = []
        large_blocked = False  # small waiters may pass a large one; large ones go in order
        for owner, n in list(self._waiters.items()):
            is_small = n <= self.small_frame_bytes
            if (is_small or not large_blocked) and self._fits(n):
                del self._waiters[owner]
                self.used += n
                self.peak = max(self.peak, self.used)
                self._granted[owner] = n
                woken.append(owner)
            elif not is_small:
                large_blocked = True
        return woken

    def cancel(self, owner: Hashable) -> list[Hashable]:
        """``owner`` is gone: forget its wait, give back anything granted to it."""
        self._waiters.pop(owner, None)
        granted = self._granted.pop(owner, None)
        if granted is not None:
            self._release(granted)
        return self._grant()


class ConnectionQuotas:
    """``max.connections`` and ``max.connections.per.ip``: ``admit`` or refuse."""

    def __init__(self, max_connections: int, max_per_ip: int) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.total = 0
        self.per_ip: dict[str, int] = {}

    def admit(self, ip: str) -> str | None:
        """Count a new connection from ``ip``; returns None, or why it is refused."""
        if self.total >= self.max_connections:
            return f"max.connections={self.max_connections} reached"
        n = self.per_ip.get(ip, 0)
        if n >= self.max_per_ip:
            return f"max.connections.per.ip={self.max_per_ip} reached for {ip}"
        self.total += 1
        self.per_ip[ip] = n + 1
        return None

    def release(self, ip: str) -> None:
        n = self.per_ip.get(ip, 0)
        if n <= 0:
            return
        self.total -= 1
        if n == 1:
            del self.per_ip[ip]
        else:
            self.per_ip[ip] = n - 1


class LogPacer:
    """At most one line per ``interval_s`` for one kind of event; counts what it held back."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: float | None = None
        self.suppressed = 0

    def ready(self, now: float) -> int | None:
        """None: stay quiet (the event is counted). Otherwise log now; the value is how
        many events were held back since the last line."""
        if self._last is not None and now - self._last < self.interval_s:
            self.suppressed += 1
            return None
        self._last = now
        held, self.suppressed = self.suppressed, 0
        return held


def idle_connections(now: float, last_activity: dict[K, float], idle_s: float) -> list[K]:
    """The connections with no activity for at least ``idle_s`` (``connections.max.idle.ms``)."""
    return [c for c, t in last_activity.items() if now - t >= idle_s]
