"""The broker process's allocator: a freed request buffer stays for the next request.

glibc's malloc gives memory back to the kernel eagerly. A block of at least its mmap
threshold (128 KiB at start, raised as mapped blocks are freed) is a mapping of its own,
unmapped when freed, and free memory past the trim threshold at the top of the heap is
returned. A broker allocates and frees buffers of the same few sizes for every request: a
1 MB Produce is received into a 1 MB buffer, the protocol decoder copies its records into
another, the socket is read in 256 KiB chunks. Each new buffer's pages were then faulted in
again, one page at a time: zeroed by the kernel, charged to the memory cgroup, mapped. In a
`perf` profile of a broker taking 100-byte records (one partition, acks=1) the page faults
were about a fifth of its CPU, and its CPU per record went from 0.21-0.23 µs to 0.11-0.16
with this policy (issue 24).

The policy: blocks below ``MMAP_THRESHOLD`` (4 MiB, ``framing.MMAP_MIN_BYTES``: the frame
decoder receives bigger frames into a mapping of its own, which goes back to the kernel when
the frame is dropped) come from the heap, and up to ``TRIM_THRESHOLD`` (64 MiB) of free
memory at its top is kept for reuse. So a broker keeps what its busiest moments needed,
up to that much more than it holds, instead of returning and re-faulting it between
requests; Kafka's brokers keep far more (their heap and the socket buffers pooled).

Only for a process that is a broker (``headrace broker``), as ``gc_policy``: a broker
embedded in a user's process leaves that process's allocator alone. Only on glibc (elsewhere
nothing changes). ``HEADRACE_MALLOC_POLICY=0`` in the environment turns it off (to compare).
"""

from __future__ import annotations

import ctypes
import os
import platform

ENV = "HEADRACE_MALLOC_POLICY"
MMAP_THRESHOLD = 4 << 20  # framing.MMAP_MIN_BYTES (a test checks they agree)
TRIM_THRESHOLD = 64 << 20
# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def install() -> bool:
    """Apply the policy to this process; True if it was applied."""
    if os.environ.get(ENV) == "0" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt answers 1 on success; either setting alone turns glibc's own adjustment off
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
