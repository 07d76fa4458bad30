"""The README's fast-tier command (issue 22): it selects the pure cores, the replication
rules and the simulation, and none of the slow tier (clusters, faults, Spark)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.readme import ROOT, commands

pytestmark = pytest.mark.slow  # it runs the set-up script (a pip check) and collects twice


# the modules that start Spark jobs or `headrace demo` (the fast tier has in-process and
# pure Spark tests: test_spark_source_inproc, test_spark_batch_decode, test_spark_home)
SPARK_PROCESS_MODULES = {f"tests/integration/{m}.py" for m in (
    "test_spark", "test_spark_driver_kill", "test_spark_demo", "test_spark_demo_kill",
    "test_spark_executor_kill")}


def test_fast_tier_command_selects_the_fast_tests() -> None:
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("needs the clone's .venv (bash scripts/test.sh makes it)")
    (line,) = commands("fast-tier")
    env = {**os.environ, "HEADRACE_TEST_WORKERS": "0"}
    r = subprocess.run(["bash", "-c", f"{line} --collect-only"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ids = [ln for ln in r.stdout.splitlines() if "::" in ln]
    assert any(i.startswith("tests/unit/replication/") for i in ids), r.stdout[-2000:]
    assert any(i.startswith("tests/unit/") for i in ids)
    slow = [i for i in ids if i.startswith(("tests/cluster/", "tests/fault/"))
            or i.split("::")[0] in SPARK_PROCESS_MODULES or "test_demo.py" in i]
    assert not slow, slow[:10]
