"""The suite's own rules (tests/conftest.py): under CI an unexpected skip fails the run, also
with pytest-xdist workers (their reports reach the controlling process's hooks), and the tier
rule puts a new test under tests/unit in the fast tier."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import slow_reason

ROOT = Path(__file__).resolve().parents[2]

SKIPPING = """
import pytest

def test_skips():
    pytest.skip("deliberate")

def test_passes():
    assert 1 + 1 == 2
"""

MODULE_SKIP = """
import pytest
pytest.importorskip("no_such_module_for_the_skip_policy")

def test_never_runs():
    assert False
"""


def run_pytest(where: Path, ci: bool, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src")])
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", *args, str(where)],
                          cwd=where, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A test tree governed by a copy of tests/conftest.py."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    return tmp_path


@pytest.mark.parametrize("workers", [["-n", "2", "--dist", "loadfile"], ["-p", "no:xdist"]],
                         ids=["xdist", "one-process"])
def test_an_unexpected_skip_fails_the_run_under_ci(project: Path, workers: list[str]) -> None:
    r = run_pytest(project, True, *workers)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "unexpected skips: 2 (FAILS the run (CI))" in out, out
    assert "test_skipping.py::test_skips: Skipped: deliberate" in out, out
    assert "test_module_skip.py: Skipped: could not import" in out, out
    assert "1 passed, 2 skipped" in out, out


def test_outside_ci_a_skip_is_listed_and_allowed(project: Path) -> None:
    r = run_pytest(project, False, "-p", "no:xdist")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "unexpected skips: 2 (allowed outside CI)" in out, out


def test_the_tier_rule_keeps_unit_tests_fast_and_marks_heavy_ones_slow(
        request: pytest.FixtureRequest) -> None:
    """A test under tests/unit that starts nothing heavy (this one) is in the fast tier;
    cluster and fault tests and heavy fixtures are not."""
    assert request.node.get_closest_marker("slow") is None
    assert slow_reason(request.node) is None

    class Fake:
        def __init__(self, nodeid: str, fixturenames: tuple[str, ...] = ()) -> None:
            self.nodeid = nodeid
            self.fixturenames = fixturenames

    # (a duck-typed item: slow_reason reads nodeid and fixturenames)
    assert slow_reason(Fake("tests/cluster/test_failover.py::test_x"))
    assert slow_reason(Fake("tests/fault/test_disk_full.py::test_x"))
    assert slow_reason(Fake("tests/unit/replication/test_sim.py::test_x")) is None
    assert slow_reason(Fake("tests/unit/test_x.py::test_y", ("zookeeper",)))
    assert slow_reason(Fake("tests/unit/test_x.py::test_y", ("spark_session",)))
    assert slow_reason(Fake("tests/integration/test_spark.py::test_demo"))


WHERE_AM_I = """
import os
from pathlib import Path

def test_where():
    out = Path(os.environ["WHERE_OUT"]) / (__name__.rsplit(".", 1)[-1] + ".worker")
    out.write_text(os.environ.get("PYTEST_XDIST_WORKER", "none"))
"""


def test_a_groups_modules_share_one_xdist_worker(
        project: Path, tmp_path: Path) -> None:
    """XDIST_GROUPS: the modules of one group (here two under tests/cluster/, the group
    that shares the session's ZooKeeper) run on one worker, whatever else is queued."""
    out = tmp_path / "out"
    out.mkdir()
    (project / "test_skipping.py").unlink()
    (project / "test_module_skip.py").unlink()
    cluster = project / "tests" / "cluster"
    cluster.mkdir(parents=True)
    for name in ("test_zk_one.py", "test_zk_two.py", "test_zk_three.py"):
        (cluster / name).write_text(WHERE_AM_I)
    for i in range(6):
        (project / f"test_other_{i}.py").write_text(WHERE_AM_I)
    env_out = {"WHERE_OUT": str(out)}
    os.environ.update(env_out)
    try:
        r = run_pytest(project, False, "-n", "2", "--dist", "loadfile")
    finally:
        os.environ.pop("WHERE_OUT")
    assert r.returncode == 0, r.stdout + r.stderr
    workers = {p.stem: p.read_text() for p in out.glob("*.worker")}
    assert len(workers) == 9, workers
    assert {workers["test_zk_one"], workers["test_zk_two"], workers["test_zk_three"]} \
        in ({"gw0"}, {"gw1"}), workers


def test_longest_units_go_first_and_a_groups_modules_stay_together() -> None:
    from tests import conftest

    class Fake:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    ids = ["tests/unit/test_a.py::t1", "tests/cluster/test_x.py::t1",
           "tests/integration/test_spark.py::t1", "tests/unit/test_a.py::t2",
           "tests/cluster/test_y.py::t1", "tests/integration/test_cli.py::t1"]
    items = [Fake(i) for i in ids]
    seconds = {"tests/integration/test_spark.py": 500.0, "zookeeper": 400.0,
               "tests/integration/test_cli.py": 30.0}
    saved = dict(conftest.XDIST_UNIT_SECONDS)
    conftest.XDIST_UNIT_SECONDS.clear()
    conftest.XDIST_UNIT_SECONDS.update(seconds)
    try:
        conftest._longest_units_first(items)  # type: ignore[arg-type]
    finally:
        conftest.XDIST_UNIT_SECONDS.clear()
        conftest.XDIST_UNIT_SECONDS.update(saved)
    assert [i.nodeid for i in items] == [
        "tests/integration/test_spark.py::t1", "tests/cluster/test_x.py::t1",
        "tests/cluster/test_y.py::t1", "tests/integration/test_cli.py::t1",
        "tests/unit/test_a.py::t1", "tests/unit/test_a.py::t2"]
    assert conftest.xdist_unit("tests/cluster/test_failover.py::test_x") == "zookeeper"
    assert conftest.xdist_unit("tests/integration/test_burrow.py::test_x") == "zookeeper"
    assert conftest.xdist_unit("tests/unit/test_a.py::t1") == "tests/unit/test_a.py"
