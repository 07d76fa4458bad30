"""A real ZooKeeper for tests (Debian's package; ``scripts/test.sh`` installs it)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from headrace.cluster.zookeeper_server import ZK_SERVER, ZooKeeperServer
from tests.conftest import in_ci


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One ZooKeeper server for the module."""
    if not ZK_SERVER.exists():
        message = "ZooKeeper is not installed (bash scripts/test.sh installs it with apt)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")) as zk:
        yield zk


def chroot(zk: ZooKeeperServer) -> str:
    """A connect string with a chroot of its own."""
    return f"{zk.connect_string}/t-{uuid.uuid4().hex[:10]}"
