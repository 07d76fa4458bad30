"""The suite's hang backstop (tests/conftest.py): a test stuck where pytest-timeout's SIGALRM
cannot reach it still ends, with every thread's stack on stderr, instead of hanging the run
until CI's limit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STUCK = """
import signal, time

def test_stuck_where_no_signal_reaches():
    # SIGALRM blocked stands for a main thread stuck in native code: pytest-timeout's
    # handler never runs
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(120)
"""


def test_a_test_that_timeout_cannot_end_is_ended_with_its_stack(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_runtest_protocol  # noqa: F401\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 1\n")
    (tmp_path / "test_stuck.py").write_text(STUCK)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HEADRACE_TEST_BACKSTOP_SECONDS": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_stuck.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    took = time.monotonic() - started
    assert done.returncode != 0
    assert took < 60, took  # ended by the backstop, not by the test's 120 s sleep
    assert "Timeout (0:00:02)!" in done.stderr, done.stderr[-2000:]
    assert "test_stuck_where_no_signal_reaches" in done.stderr, done.stderr[-2000:]
