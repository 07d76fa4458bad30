"""Run ``headrace`` in a subprocess and time the command itself, not the interpreter's
start: the seconds from after ``headrace.cli`` is imported to the process's exit.

A test that "fails at once" must not measure Python's start-up, which is 1 s on a quiet
machine and 5-10 s in a loaded CI run (three such bounds failed there although the command
answered at once)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

_WRAPPER = (
    "import atexit, os, sys, time\n"
    "import headrace.cli as cli\n"
    "t = time.monotonic()\n"
    "atexit.register(lambda: open(os.environ['HEADRACE_TEST_TIMING'], 'w')"
    ".write(repr(time.monotonic() - t)))\n"
    "sys.argv = ['headrace', *sys.argv[1:]]\n"
    "cli.main()\n"
)


def run_timed(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 60,
              **kw: object) -> tuple[subprocess.CompletedProcess, float]:  # type: ignore[type-arg]
    """(the completed process, seconds the command took after its imports)."""
    with tempfile.TemporaryDirectory() as d:
        timing = Path(d) / "seconds"
        full_env = {**(env if env is not None else os.environ),
                    "HEADRACE_TEST_TIMING": str(timing)}
        r = subprocess.run([sys.executable, "-c", _WRAPPER, *args], env=full_env,
                           timeout=timeout, capture_output=True, **kw)  # type: ignore[call-overload]
        took = float(timing.read_text())
    return r, took
