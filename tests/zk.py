"""A real ZooKeeper for tests (Debian's package; ``scripts/test.sh`` installs it).

One ZooKeeper JVM per test process (per pytest-xdist worker), started by the first fixture
that asks for it and stopped when pytest ends (``config.add_cleanup``). Every user takes a
chroot of its own (``chroot``), so modules and clusters never see each other's znodes:

- ``zookeeper_session`` (session scope): for ``tests/cluster`` (its conftest re-exports it
  as ``zookeeper``) and for any conftest that registers this module as a plugin
  (``pytest_plugins = ["tests.zk"]``);
- ``zookeeper`` (module scope, imported by modules that predate the shared server): the
  same server; a module no longer starts its own JVM.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from headrace.cluster.zookeeper_server import ZK_SERVER, ZooKeeperServer
from tests.conftest import in_ci

_SERVER = pytest.StashKey[ZooKeeperServer]()


def shared_zookeeper(config: pytest.Config,
                     tmp_path_factory: pytest.TempPathFactory) -> ZooKeeperServer:
    """The test process's ZooKeeper server, started on first use (again if it died)."""
    if not ZK_SERVER.exists():
        message = "ZooKeeper is not installed (bash scripts/test.sh installs it with apt)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    server = config.stash.get(_SERVER, None)
    if server is None or server.proc is None or server.proc.poll() is not None:
        server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")).start()
        config.stash[_SERVER] = server
        config.add_cleanup(server.stop)
    return server


@pytest.fixture(scope="session")
def zookeeper_session(request: pytest.FixtureRequest,
                      tmp_path_factory: pytest.TempPathFactory) -> ZooKeeperServer:
    """The shared ZooKeeper server (use a chroot of your own)."""
    return shared_zookeeper(request.config, tmp_path_factory)


@pytest.fixture(scope="module")
def zookeeper(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """The shared ZooKeeper server, for a module that imports this fixture (use a chroot)."""
    yield shared_zookeeper(request.config, tmp_path_factory)


def chroot(zk: ZooKeeperServer) -> str:
    """A connect string with a chroot of its own."""
    return f"{zk.connect_string}/t-{uuid.uuid4().hex[:10]}"


class Recorder:
    """A metadata store listener that records what it was told, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def topic_changed(self, name: str) -> None:
        self.events.append(("topic_changed", name))

    def topic_deleted(self, name: str) -> None:
        self.events.append(("topic_deleted", name))

    def brokers_changed(self) -> None:
        self.events.append(("brokers_changed", None))

    def controller_changed(self, controller_id: int) -> None:
        self.events.append(("controller_changed", controller_id))

    def admin_changed(self, kind: str) -> None:
        self.events.append(("admin_changed", kind))

    def session_lost(self) -> None:
        self.events.append(("session_lost", None))

    def session_restored(self) -> None:
        self.events.append(("session_restored", None))
