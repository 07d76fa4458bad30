"""One ZooKeeper and one 3-broker cluster per cluster test module (module-scoped)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clusterproc import Cluster
from tests.zk import zookeeper  # noqa: F401  (the module's ZooKeeper server)


@pytest.fixture(scope="module")
def cluster_overrides() -> dict[str, str]:
    """Broker configs of the module's cluster (a module overrides this fixture)."""
    return {}


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory: pytest.TempPathFactory,  # noqa: F811
            cluster_overrides: dict[str, str]) -> Iterator[Cluster]:
    root: Path = tmp_path_factory.mktemp("cluster")
    chroot = f"/headrace-{uuid.uuid4().hex[:8]}"
    c = Cluster(root, zookeeper.connect_string + chroot, 3, cluster_overrides).start()
    try:
        yield c
    finally:
        c.stop()
    c.keep_logs(root)


@pytest.fixture
def healthy(cluster: Cluster) -> Iterator[Cluster]:
    """Every broker running (and not paused) before and after the test."""
    for b in cluster.brokers.values():
        if b.paused:
            b.resume()
        if not b.alive:
            b.start()
    yield cluster
    for b in cluster.brokers.values():
        if b.paused:
            b.resume()
        if not b.alive:
            b.start()
