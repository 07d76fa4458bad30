"""Every invariant that a slow test guards also has a fast test (issue 22, item 1).

tests/twins.py maps each slow test (the slow tier of tests/conftest.py) to its fast twins.
This test collects the whole suite once in a subprocess (``pytest --collect-only`` with the
plugin tests/twins_collect.py, which records which tests tests/conftest.py marked slow) and
checks the table against it:

(a) every slow test is covered by ``TWINS`` or ``NO_TWIN``;
(b) every twin named exists and is in the fast tier;
(c) no entry is stale: each key still names a slow test, and no test is in both tables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.twins import NO_TWIN, TWINS, covers
from tests.twins_collect import DUMP_VARIABLE

ROOT = Path(__file__).resolve().parents[2]

WHAT_TO_DO = (
    "Each slow test needs fast twins (a pure-core test under tests/unit/, the simulation, "
    "or an in-process broker test via tests/inproc.py) that fail when the rule it guards is "
    "broken: add its node id (or its module's path) to TWINS in tests/twins.py with the "
    "twins' node ids and a one-line comment naming the invariant; only a test whose point "
    "is the real process goes in NO_TWIN, with the reason."
)


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bool]:
    """Every test of the suite: node id -> slow."""
    dump = tmp_path_factory.mktemp("twins") / "collected.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "CI")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env[DUMP_VARIABLE] = str(dump)
    r = subprocess.run(
        # --assert=plain: collecting needs no assertion rewriting, which is most of its time
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--assert=plain",
         "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "tests.twins_collect", "tests"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and dump.exists(), (
        f"collecting the suite failed (exit {r.returncode}):\n"
        f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    tests: dict[str, bool] = json.loads(dump.read_text())
    assert sum(tests.values()) > 100, "the slow tier looks empty: is tests/conftest.py's rule gone?"
    return tests


def test_every_slow_test_has_fast_twins_or_a_reason(collected: dict[str, bool]) -> None:
    keys = [*TWINS, *NO_TWIN]
    uncovered = sorted(n for n, slow in collected.items()
                       if slow and not any(covers(k, n) for k in keys))
    assert not uncovered, (
        f"{len(uncovered)} slow test(s) without fast twins:\n  " + "\n  ".join(uncovered)
        + "\n" + WHAT_TO_DO)


def test_every_twin_exists_and_is_fast(collected: dict[str, bool]) -> None:
    problems = []
    for slow_test, twins in TWINS.items():
        assert twins, f"TWINS[{slow_test!r}] names no twin"
        for twin in twins:
            matched = [n for n in collected if covers(twin, n)]
            if not matched:
                problems.append(f"{slow_test}: twin {twin} is not a test of the suite")
            elif any(collected[n] for n in matched):
                problems.append(f"{slow_test}: twin {twin} is in the slow tier")
    assert not problems, "\n".join(problems) + "\n" + WHAT_TO_DO


def test_no_stale_or_doubled_entries(collected: dict[str, bool]) -> None:
    slow = [n for n, s in collected.items() if s]
    stale = [k for k in [*TWINS, *NO_TWIN] if not any(covers(k, n) for n in slow)]
    assert not stale, ("entries of tests/twins.py that name no slow test (renamed, removed "
                       "or now fast: update or drop them):\n  " + "\n  ".join(stale))
    both = sorted(set(TWINS) & set(NO_TWIN))
    assert not both, f"in both TWINS and NO_TWIN: {both}"


@pytest.mark.parametrize(("key", "node", "expected"), [
    ("tests/fault/test_x.py", "tests/fault/test_x.py::test_a", True),
    ("tests/fault/test_x.py::test_a", "tests/fault/test_x.py::test_a[1]", True),
    ("tests/fault/test_x.py::test_a", "tests/fault/test_x.py::test_ab", False),
    ("tests/fault/test_x.py", "tests/fault/test_x.py.orig::test_a", False),
    ("tests/fault/test_x.py::C", "tests/fault/test_x.py::C::test_a", True),
])
def test_covers_matches_a_module_a_test_or_its_parameters(key: str, node: str,
                                                           expected: bool) -> None:
    assert covers(key, node) is expected
