"""Listening ports for the brokers, ZooKeepers and consoles that tests start.

A port the kernel hands out for ``bind(port 0)`` comes from the ephemeral range
(``net.ipv4.ip_local_port_range``, 32768-60999 here), the same range every outgoing
connection of every client on the machine takes its local port from. A broker stopped and
started again on its port (a restart, a kill -9 and recovery: clients must find it at the
same address) can then find the port taken by some other test's client connection in the
meantime ("port ... is already in use": one loaded CI run lost a fault test to it).

So tests listen below the ephemeral range, where the kernel never allocates a port on its
own: each pytest worker (``PYTEST_XDIST_WORKER``) cycles through a slice of its own, and a
port is checked free before it is handed out. Only another program that binds explicit
ports in that range could take one, which nothing in the suite does.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

LOW = 20_000  # the band tests listen in: [LOW, the ephemeral range's start)
SLICES = 8  # the controller process and up to 7 xdist workers, each its own slice


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _slice() -> range:
    high = max(_ephemeral_start(), LOW + SLICES * 64)
    size = (high - LOW) // SLICES
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... or unset
    index = (int(worker[2:]) + 1) % SLICES if worker[2:].isdigit() else 0
    return range(LOW + index * size, LOW + (index + 1) * size)


_lock = threading.Lock()
_band = _slice()
_next = _band.start + os.getpid() % len(_band)  # a new run starts elsewhere in its slice


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserve_port() -> int:
    """A free port on 127.0.0.1 outside the ephemeral range, not handed out before by this
    process (until its slice of ~1,600 ports wraps round)."""
    global _next
    with _lock:
        for _ in range(len(_band)):
            port = _next
            _next = _band.start + (_next + 1 - _band.start) % len(_band)
            if _is_free(port):
                return port
    raise RuntimeError(f"no free port in {_band.start}-{_band.stop - 1}")
