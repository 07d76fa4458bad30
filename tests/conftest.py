"""Shared fixtures (a broker process per test module, fresh topics per test), the suite's two
tiers and its skip policy.

Tiers. ``bash scripts/test.sh`` runs every test; ``bash scripts/test.sh --fast`` only the
fast tier, for use while developing (under 5 minutes on 2 cores). A test is in the fast tier
unless it is marked ``slow``, which this file does by rule (``pytest_collection_modifyitems``)
when the test

1. lives under ``tests/cluster/`` or ``tests/fault/`` (ZooKeeper and three-broker clusters;
   brokers and clients killed with SIGKILL and restarted): ``SLOW_DIRS``;
2. uses a fixture that starts something heavy, anywhere in the tree: ZooKeeper, Spark's
   JVM, Chromium, a ``headrace demo`` run (``SLOW_FIXTURES``, and any fixture whose name
   contains one of ``SLOW_FIXTURE_WORDS``);
3. is in a module of ``SLOW_MODULES`` (each says why: the demo, README walk-throughs,
   external tools, the command-line modules, which start an interpreter per command);
4. or carries ``@pytest.mark.slow`` itself (a test that restarts a broker process or waits
   out a real timeout; its logic has a fast twin).

Everything else is fast: the pure cores under ``tests/unit`` (a new test there is fast by
default, as long as it starts none of the above), the fuzzers, wire and protocol tests
against an in-process broker (``tests/inproc.py``) or a module's broker process.

Serial. Modules whose tests measure rates or throughput (quotas, process lanes) are listed
in ``SERIAL_MODULES`` (by module: a serial pass collects only those), and their tests marked
``serial``: ``scripts/test.sh`` runs them in a pass of their own with nothing beside them,
after the parallel pass. The parallel pass runs on pytest-xdist (``-n 2 --dist loadfile``)
with this file's scheduler: a unit is a module (its fixtures stay in one worker) or a group
of modules that share a session's server (``XDIST_GROUPS``), longest units first
(``XDIST_UNIT_SECONDS``). ``--tier`` selects a pass: ``fast`` (not slow), ``parallel`` (not
slow, not serial), ``fast-serial`` (not slow, serial), ``unserial`` (not serial: the whole
suite's parallel pass), ``serial``, ``rest`` (slow or serial); ``pytest -m "not slow"`` is
the fast tier too.

Skip policy: a skipped test proves nothing, so under CI (``CI`` set to a true value, as
``.ci/run`` does) the session fails when any test was skipped unless its node id is in
``ALLOWED_SKIPS`` with the reason it may skip. Every skip is listed in the summary (``-rs``)
either way. Outside CI, skips are reported and allowed (a developer without Java, say). With
pytest-xdist the workers' reports reach these hooks in the controlling process, which sets
the exit status.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.brokerproc import BrokerProcess

# Property tests assert properties, not speed: under CI's load (a busy loop beside two
# workers) one example of a controller or log property took past Hypothesis' 200 ms
# deadline and failed a run. No deadline and no too-slow health check, everywhere.
settings.register_profile("headrace", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("headrace")


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


# ------------------------------------------------------------------ tiers (see the docstring)

SLOW_DIRS = ("tests/cluster/", "tests/fault/")
SLOW_FIXTURES = {
    "zookeeper": "a ZooKeeper JVM",
    "spark": "Spark's JVM",
    "page": "Chromium (Playwright)",
    "console": "the web console's process and its scene of clients",
}
SLOW_FIXTURE_WORDS = ("zookeeper", "spark", "demo", "chromium", "browser", "cluster")
SLOW_MODULES = {
    # demo-owned: each runs ``headrace demo`` (Spark) or a README shell walk-through
    "tests/integration/test_spark.py": "Spark",
    "tests/integration/test_spark_driver_kill.py": "Spark jobs killed with -9, restarted",
    "tests/integration/test_spark_demo_kill.py": "the demo killed with -9 and rerun",
    "tests/integration/test_spark_demo.py": "demo runs of their own",
    "tests/integration/test_spark_executor_kill.py": "Spark; kills an executor",
    "tests/integration/test_examples.py": "the examples, each a process with Spark",
    "tests/integration/test_audit_exit.py": "headrace demo runs",
    "tests/integration/test_readme_quickstart.py": "the README's shell session, Spark",
    "tests/integration/test_readme_setup.py": "scripts/setup.sh in a fresh venv",
    "tests/integration/test_burrow.py": "Burrow, an external lag monitor polled for minutes",
    "tests/integration/test_web_console.py": "Chromium and the console process",
    "tests/integration/test_zk_store.py": "ZooKeeper",
    "tests/integration/test_zk_acl_store.py": "ZooKeeper",
    "tests/integration/test_server_properties.py": "ZooKeeper and broker processes",
    "tests/integration/test_security_quickstart.py": "the README's security walk-through",
    "tests/integration/test_quota_produce_rate.py": "a 1 MB/s quota measured for 30 s",
    # the command line as users run it: an interpreter start (and imports) per command
    "tests/integration/test_console.py": "the produce/consume commands, one process each",
    "tests/integration/test_cli.py": "the headrace command, one process per call",
    "tests/integration/test_cli_ux.py": "the headrace command, one process per call",
    "tests/integration/test_groups_cli.py": "the groups commands, one process per call",
}
SERIAL_MODULES = {
    "tests/integration/test_quota_produce_rate.py": "measures a produce rate",
    "tests/integration/test_client_quotas.py": "measures throttled rates and delays",
    "tests/integration/test_process_lanes.py": "CPU-bound worker processes",
    "tests/integration/test_topic_scale.py": "bounds the latency of clients served during "
                                             "a 10,000-partition create, and creation times",
    "tests/integration/test_noisy_neighbour.py": "compares good clients' throughput beside "
                                                 "each attack with a quiet run's",
}
TIERS = ("all", "fast", "parallel", "fast-serial", "rest", "unserial", "serial")

# Scheduling on pytest-xdist workers (``pytest_xdist_make_scheduler`` below): a work unit is
# a module, except that the modules of one group go to one worker together. Group
# "zookeeper": they share the session's ZooKeeper server and its pool of clusters
# (tests/zk.py, tests/cluster/conftest.py), which a second worker would start again.
XDIST_GROUPS: dict[str, tuple[str, ...]] = {
    "zookeeper": ("tests/cluster/", "tests/integration/test_zk_store.py",
                  "tests/integration/test_zk_acl_store.py",
                  "tests/integration/test_zk_reconnect.py",
                  "tests/integration/test_server_properties.py",
                  "tests/integration/test_burrow.py"),
}
# Seconds a unit took in a full run (worker-seconds, summed from ``--durations=0`` of
# ``CI=true bash .ci/run`` on 2 cores at dcf6e5d, a busy loop beside it; they only order
# the units): the longest go first, so that no long unit starts last while the other
# worker idles (longest processing time first). A unit not listed (under 15 s) counts as 0
# and keeps its place.
XDIST_UNIT_SECONDS: dict[str, float] = {
    "zookeeper": 790,
    "tests/integration/test_demo.py": 296,
    "tests/integration/test_spark_demo_kill.py": 288,
    "tests/integration/test_spark_demo.py": 264,
    "tests/integration/test_spark.py": 256,
    "tests/integration/test_spark_driver_kill.py": 195,
    "tests/integration/test_simulate_command.py": 179,
    "tests/integration/test_audit_exit.py": 145,
    "tests/integration/test_spark_executor_kill.py": 119,
    "tests/integration/test_console.py": 118,
    "tests/integration/test_security.py": 107,
    "tests/fuzz/test_request_fuzz.py": 89,
    "tests/integration/test_reliable.py": 84,
    "tests/integration/test_cli_ux.py": 73,
    "tests/integration/test_readme_quickstart.py": 66,
    "tests/fuzz/test_batch_fuzz.py": 50,
    "tests/fuzz/test_api_fuzz.py": 50,
    "tests/integration/test_web_console.py": 41,
    "tests/integration/test_groups.py": 37,
    "tests/fault/test_compaction_crash.py": 37,
    "tests/fault/test_delete_crash.py": 31,
    "tests/integration/test_offsets.py": 29,
    "tests/integration/test_transactions.py": 29,
    "tests/fault/test_consumer_kill.py": 28,
    "tests/fault/test_restart_and_corruption.py": 26,
    "tests/integration/test_clients.py": 23,
    "tests/integration/test_hostile_clients.py": 25,
    "tests/integration/test_resource_limits.py": 22,
    "tests/unit/simulation/test_simulation.py": 22,
    "tests/integration/test_readme_fast_tier.py": 22,
    "tests/integration/test_admin_apis.py": 21,
    "tests/integration/test_kip848.py": 21,
    "tests/integration/test_groups_cli.py": 20,
    "tests/unit/test_fast_twins.py": 20,
    "tests/unit/test_assignors.py": 18,
}


def _rel(path: Path, config: pytest.Config) -> str:
    try:
        return path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return path.as_posix()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Modules a pass of ``--tier`` cannot select are not even imported (every xdist worker
    collects again): slow directories and modules for the fast passes, all but the serial
    modules for ``fast-serial`` and ``serial``."""
    tier = config.getoption("--tier", "all")
    if tier in ("all", "rest"):
        return None
    rel = _rel(collection_path, config)
    if tier in ("fast", "parallel") and (
            (rel + "/").startswith(SLOW_DIRS) or rel in SLOW_MODULES):
        return True
    if (tier in ("fast-serial", "serial") and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and rel not in SERIAL_MODULES):
        return True
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--tier", choices=TIERS, default="all",
                     help="fast: not slow; parallel: not slow and not serial; fast-serial: "
                          "not slow and serial; rest: slow or serial (tests/conftest.py)")


def _module_path(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def xdist_unit(nodeid: str) -> str:
    """The work unit of a test on pytest-xdist workers: its module or its module's group."""
    path = nodeid.split("::", 1)[0]
    for group, members in XDIST_GROUPS.items():
        if path.startswith(members):
            return group
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (as scripts/test.sh runs it), with the groups of ``xdist_unit``
    as units, handed out longest first (the order of the collection, see
    ``_longest_units_first``)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    config.option.loadscopereorder = False  # keep the collection's order: longest first
    return GroupScheduling(config, log)


def _longest_units_first(items: list[pytest.Item]) -> None:
    """Stable sort: units by their measured seconds, longest first; a group's modules
    together, each module's tests in their order."""
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(xdist_unit(item.nodeid), i)

    def key(item: pytest.Item) -> tuple[float, int]:
        unit = xdist_unit(item.nodeid)
        return (-XDIST_UNIT_SECONDS.get(unit, 0.0), first_seen[unit])

    items.sort(key=key)


def slow_reason(item: pytest.Item) -> str | None:
    """Why ``item`` is not in the fast tier, or None."""
    path = _module_path(item)
    if path.startswith(SLOW_DIRS):
        return f"under {path.split('/')[1]}/"
    if path in SLOW_MODULES:
        return SLOW_MODULES[path]
    for name in getattr(item, "fixturenames", ()):
        if name in SLOW_FIXTURES:
            return SLOW_FIXTURES[name]
        if any(w in name for w in SLOW_FIXTURE_WORDS):
            return f"fixture {name}"
    return None


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") is None and slow_reason(item) is not None:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("serial") is None and _module_path(item) in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
    _longest_units_first(items)
    tier = config.getoption("--tier", "all")
    if tier == "all":
        return

    def keep(item: pytest.Item) -> bool:
        slow = item.get_closest_marker("slow") is not None
        serial = item.get_closest_marker("serial") is not None
        return {"fast": not slow, "parallel": not slow and not serial,
                "fast-serial": not slow and serial, "rest": slow or serial,
                "unserial": not serial, "serial": serial}[tier]

    kept = [i for i in items if keep(i)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if not keep(i)])
        items[:] = kept


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


# ------------------------------------------------------------------ hang backstop

# pytest-timeout (``timeout`` in pyproject.toml, or a test's ``timeout`` marker) ends a test
# that runs too long by raising in the main thread from a SIGALRM handler: graceful, the
# fixtures torn down. A handler runs only when the main thread gets back to Python, though, and
# a thread stuck in C (a client library's blocking call that retries EINTR, a lock held in
# native code) never does: the test, its xdist worker and the whole run then hang until CI's
# limit, with no word of where (one CI run did, 4 tests short of the end of its parallel pass).
# This backstop is faulthandler's watchdog, a C thread that needs no GIL: BACKSTOP_SECONDS
# after a test's own timeout, with the test still running (its teardown included), it writes
# every thread's Python stack to the session's stderr and ends the process; pytest-xdist
# then reports the test as crashed, by name, and goes on with a new worker.
BACKSTOP_SECONDS = float(os.environ.get("HEADRACE_TEST_BACKSTOP_SECONDS", "180"))


def item_timeout(item: pytest.Item) -> float:
    """The test's pytest-timeout limit in seconds (its marker, else the ini's), 0 for none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value is not None:
            return float(value)
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    import faulthandler

    from _pytest.faulthandler import fault_handler_stderr_fd_key

    timeout = item_timeout(item)
    fd = item.config.stash.get(fault_handler_stderr_fd_key, None)
    if timeout <= 0 or fd is None:
        return (yield)
    os.write(fd, b"")  # the fd is open: faulthandler would fail later, silently
    after = timeout + BACKSTOP_SECONDS
    faulthandler.dump_traceback_later(after, exit=True, file=fd)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()
