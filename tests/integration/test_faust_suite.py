"""Faust's own live-broker tests against headrace (issue 27).

faust-streaming 0.15.3's test suite, from its source distribution (fetched and checked
against a pinned SHA-256 by ``bash scripts/suites.sh faust``, unpacked in
.venv-faust/src), run unchanged in a virtualenv of its own (faust needs click < 8.4, which
.venv pins at 8.5) with its Kafka fixture (``FAUST_TEST_BROKER``) pointed at an in-process
headrace broker. The files chosen, and every test of them that does not pass, are listed
in the README's compatibility section ("Stream processing").

Faust's suite runs its agents and tables on an in-memory transport; its tests that talk to
a broker are ``tests/integration/broker`` (a produce/consume round trip through each
client it ships a driver for: aiokafka and confluent-kafka), so those are the chosen ones.
"""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inproc import InProcessBroker
from tests.readme import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

VENV = ROOT / ".venv-faust"
SOURCE = VENV / "src" / "faust_streaming-0.15.3"
CHOSEN = ("tests/integration/broker/test_smoke.py",)
# node id -> (kind, reason): kind "rig" (the test cannot pass here, whatever the broker) or
# "not served" (an API headrace does not serve); each is in the README too
KNOWN_FAILURES: dict[str, tuple[str, str]] = {}


@pytest.fixture(scope="module")
def headrace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    b = InProcessBroker(tmp_path_factory.mktemp("faust-broker"), {"num.partitions": "1"})
    b.start()
    try:
        yield b
    finally:
        b.stop()


def run_suite(source: Path, python: Path, bootstrap: str, files: tuple[str, ...],
              junit: Path, extra_env: dict[str, str]) -> dict[str, str]:
    """Run ``files`` of a third-party suite at ``source`` with ``python`` (its own venv and
    its own pytest configuration, less its coverage options) and give each test's outcome:
    node id -> passed, failed, error, skipped, xfailed."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "CI") and not k.startswith("PYTEST_XDIST")}
    env.update(extra_env)
    r = subprocess.run(
        [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=",
         "-q", f"--junitxml={junit}", *files],
        cwd=source, env=env, capture_output=True, text=True, timeout=540)
    assert junit.exists(), f"the suite did not run (exit {r.returncode}):\n{r.stdout[-4000:]}" \
                           f"\n{r.stderr[-4000:]}"
    outcomes: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        node = f"{path}.py::{case.get('name')}"
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        outcome = kinds[0] if kinds else "passed"
        if outcome == "skipped" and "xfail" in (case.find("skipped").get("type") or ""):  # type: ignore[union-attr]
            outcome = "xfailed"
        outcomes[node] = {"failure": "failed"}.get(outcome, outcome)
    assert outcomes, f"no test ran:\n{r.stdout[-4000:]}"
    return outcomes


def test_faust_live_broker_tests_pass(headrace: InProcessBroker, tmp_path: Path) -> None:
    """Faust's round trips through aiokafka and confluent-kafka (its ``broker_url`` fixture
    skips when no broker answers: a skip here is a failure)."""
    subprocess.run(["bash", "scripts/suites.sh", "faust"], cwd=ROOT, check=True, timeout=900)
    outcomes = run_suite(SOURCE, VENV / "bin" / "python", headrace.bootstrap, CHOSEN,
                         tmp_path / "junit.xml",
                         {"FAUST_TEST_BROKER": f"kafka://{headrace.bootstrap}"})
    assert len(outcomes) >= 2, outcomes
    bad = {n: o for n, o in outcomes.items() if o != "passed" and n not in KNOWN_FAILURES}
    assert not bad, bad
