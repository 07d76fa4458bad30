"""Fixtures of the integration tests: the one ``headrace demo`` run of the test run."""

from __future__ import annotations

import pytest

from tests.demo_run import DemoRun, run_shared_demo


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's mark, registered here too so that it is known without xdist
    config.addinivalue_line(
        "markers", "xdist_group(name): run these tests on one xdist worker (--dist loadgroup)")


@pytest.fixture(scope="session")
def shared_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The README's main job, run once for every test that only reads what it left (see
    ``tests/demo_run.py``). Under pytest-xdist a session fixture runs once per worker: its
    readers are one module, ``test_demo.py``, marked ``xdist_group("demo")``, so that
    ``--dist loadgroup`` (or loadfile, loadscope) gives them one worker and one run."""
    return run_shared_demo(tmp_path_factory.mktemp("shared-demo"))
