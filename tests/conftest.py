"""Shared fixtures (a broker process per test module, fresh topics per test) and the
suite's skip policy.

Skip policy: a skipped test proves nothing, so under CI (``CI`` set to a true value, as
``.ci/run`` does) the session fails when any test was skipped unless its node id is in
``ALLOWED_SKIPS`` with the reason it may skip. Every skip is listed in the summary (``-rs``)
either way. Outside CI, skips are reported and allowed (a developer without Java, say).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokerproc import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module: 127.0.0.1, a free port, a fresh data dir."""
    data = tmp_path_factory.mktemp("broker")
    with BrokerProcess(data, {"num.partitions": "1"}) as b:
        yield b


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    base = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:80]
    base = "".join(c if c.isalnum() or c in "._-" else "-" for c in base)
    return f"{base}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


# ------------------------------------------------------------------ skip policy

ALLOWED_SKIPS: dict[str, str] = {
    # node id (or a prefix of it, ending at "::" or "[") -> why it may be skipped under CI.
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def require_tool(name: str) -> str:
    """The path of a command-line tool a test needs. Missing: the test fails under CI (the
    README's test command installs it) and is skipped, visibly, elsewhere."""
    path = shutil.which(name)
    if path is None:
        message = (f"{name} is not installed (bash scripts/test.sh installs it with apt)")
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


def _allowed(nodeid: str) -> bool:
    return any(nodeid == k or nodeid.startswith((k + "::", k + "["))
               for k in ALLOWED_SKIPS)


_unexpected_skips: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and not _allowed(report.nodeid):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _unexpected_skips.append((report.nodeid, reason))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    # a module-level skip (pytest.importorskip, pytest.skip(allow_module_level=True))
    if report.skipped and not _allowed(report.nodeid):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _unexpected_skips.append((report.nodeid, reason))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if in_ci() and _unexpected_skips and exitstatus in (0, 5):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _unexpected_skips:
        return
    verdict = "FAILS the run (CI)" if in_ci() else "allowed outside CI"
    terminalreporter.section(f"unexpected skips: {len(_unexpected_skips)} ({verdict})",
                             red=in_ci(), yellow=not in_ci())
    for nodeid, reason in _unexpected_skips:
        terminalreporter.line(f"{nodeid}: {reason}")
    if in_ci():
        terminalreporter.line("a test CI must run was skipped; fix its cause, or list it in "
                              "tests/conftest.py ALLOWED_SKIPS with the reason")
