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

Reserving a frame's size on its prefix alone lets a client hold memory it never sends
(issue 23: 130 prefixes promising 2 MiB each took the whole pool). ``UnreceivedBudget`` caps
what one address may hold reserved for bytes that have not arrived yet
(``queued.max.unreceived.bytes.per.ip``); past it that address's next frames wait for its own
bytes to arrive (or its connections to be closed), not for anyone else's.

``ConnectionQuotas`` is ``max.connections`` / ``max.connections.per.ip`` (with
``max.connections.per.ip.overrides``); the inter-broker listener, when it is not the only
one, is not refused by ``max.connections`` (Kafka's protected listener, KIP-402).
``LogPacer`` turns a burst of one kind of event into at most one log line per interval.
Nothing here does I/O or reads a clock: times are passed in.
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

    def granted_to(self, owner: Hashable) -> bool:
        """A reservation was handed to ``owner`` by ``release`` and not yet taken."""
        return owner in self._granted

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


class UnreceivedBudget:
    """Per address: bytes reserved for frames not yet received, at most ``cap`` (-1: no
    cap). A frame larger than the cap is let through when its address holds nothing else
    (as a frame larger than the pool's share is, so no legal frame waits forever)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.per_ip: dict[str, int] = {}

    def fits(self, ip: str, n: int) -> bool:
        held = self.per_ip.get(ip, 0)
        return self.cap < 0 or n == 0 or held == 0 or held + n <= self.cap

    def change(self, ip: str, delta: int) -> None:
        n = self.per_ip.get(ip, 0) + delta
        if n < 0:
            raise AssertionError("unreceived bytes went below zero")
        if n:
            self.per_ip[ip] = n
        else:
            self.per_ip.pop(ip, None)

    def top(self) -> tuple[str, int] | None:
        """The address holding the most (for the pool-full log line)."""
        if not self.per_ip:
            return None
        ip = max(self.per_ip, key=self.per_ip.__getitem__)
        return ip, self.per_ip[ip]


def parse_per_ip_overrides(raw: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: ``host:count,host:count`` (Kafka's form; the
    last ``:`` splits, so IPv6 addresses work). Raises ValueError."""
    out: dict[str, int] = {}
    for item in (x.strip() for x in raw.split(",")):
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        if not sep or not host.strip() or not count.strip().isdigit():
            raise ValueError(f"{item!r} is not host:count")
        out[host.strip().strip("[]")] = int(count)
    return out


class ConnectionQuotas:
    """``max.connections`` and ``max.connections.per.ip``: ``admit`` or refuse."""

    def __init__(self, max_connections: int, max_per_ip: int,
                 per_ip_overrides: dict[str, int] | None = None) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.overrides = dict(per_ip_overrides or {})
        self.total = 0
        self.per_ip: dict[str, int] = {}

    def limit_for(self, ip: str) -> int:
        return self.overrides.get(ip, self.max_per_ip)

    def admit(self, ip: str, protected: bool = False) -> str | None:
        """Count a new connection from ``ip``; returns None, or why it is refused.
        ``protected``: the inter-broker listener (of several), which ``max.connections``
        does not refuse (KIP-402); ``max.connections.per.ip`` still applies."""
        if self.total >= self.max_connections and not protected:
            return f"max.connections={self.max_connections} reached"
        n = self.per_ip.get(ip, 0)
        limit = self.limit_for(ip)
        if n >= limit:
            return f"max.connections.per.ip={limit} reached for {ip}"
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
