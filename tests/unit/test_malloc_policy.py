"""The broker process's allocator policy (``headrace/malloc_policy.py``, issue 24): freed
request-sized buffers are reused without new page faults, where glibc alone gives them back
to the kernel and faults them in again for the next request."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from headrace import malloc_policy

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                reason="the policy is glibc's mallopt")

# What a broker does per Produce of 1 MB: the frame (1 MB), the decoder's copy of its
# records (1 MB), a socket read (256 KiB), all freed when the request is done. Run in a
# fresh interpreter: the policy cannot be taken back.
_CHURN = """
import resource, sys
from headrace import malloc_policy
applied = malloc_policy.install() if sys.argv[1] == "1" else False
def churn():
    for _ in range(100):
        frame = bytearray(1 << 20); records = bytes(frame); read = bytearray(256 << 10)
        del frame, records, read
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(policy: bool, env: dict[str, str] | None = None) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", _CHURN, "1" if policy else "0"],
                         capture_output=True, text=True, check=True, timeout=60,
                         env=env).stdout.split()
    return out[0] == "True", int(out[1])


def test_request_buffers_are_reused_without_page_faults() -> None:
    applied, with_policy = _faults(True)
    _, without = _faults(False)
    assert applied
    # 100 rounds of 2.25 MB: without the policy every round faults its pages in again
    # (~54,000 faults here); with it the second churn reuses the first one's memory
    assert without > 10_000, without
    assert with_policy < without / 20, (with_policy, without)


def test_the_environment_turns_it_off() -> None:
    import os

    applied, faults = _faults(True, {**os.environ, malloc_policy.ENV: "0"})
    assert not applied
    assert faults > 10_000


def test_large_frames_still_get_their_own_mapping() -> None:
    """The frame decoder maps frames of MMAP_MIN_BYTES and more itself, so that their memory
    goes back when they are dropped: glibc's threshold is the same size."""
    from headrace.protocol.framing import MMAP_MIN_BYTES

    assert malloc_policy.MMAP_THRESHOLD == MMAP_MIN_BYTES
