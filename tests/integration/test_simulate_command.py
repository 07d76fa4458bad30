"""Issue 21: the README's `headrace simulate --seeds 1000` is clean, run as written (a
process, the console entry point)."""

from __future__ import annotations

import subprocess

import pytest

from tests.readme import ROOT, commands

# about a minute of CPU; past 300 s of wall time in a loaded CI run (a busy loop and two
# long simulations beside it), so the subprocess's own 900 s bound is the test's
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_thousand_seeds_are_clean() -> None:
    (line,) = commands("simulate")
    assert "--seeds 1000" in line
    r = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True,
                       timeout=900, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "1000 seed(s) from 0 clean" in r.stdout, r.stdout[-2000:]
