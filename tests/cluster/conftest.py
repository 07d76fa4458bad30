"""One ZooKeeper for the session, and 3-broker clusters shared between the modules that ask
for equal settings, each restored to health between tests.

- ``zookeeper`` (session): the test process's ZooKeeper server (``tests/zk.py``); every
  cluster has a chroot of its own.
- ``cluster_overrides`` (module): the broker configs a module needs on top of
  ``BASE_OVERRIDES`` (a module overrides this fixture). Modules with equal settings share
  one cluster (``ClusterPool``), started on first use and killed when the session ends.
- ``healthy`` (each test): the module's cluster, healthy (``Cluster.problems``: every
  broker registered, a controller, no offline partition, full ISRs, every broker's
  metadata caught up). After the test, paused brokers are resumed, dead ones restarted,
  and health is waited for with a deadline. Topics stay (each test makes its own, with a
  unique name): a test must not assume it has the cluster to itself. A
  test that leaves the cluster unhealthy (or a broker that crashed or logged a traceback)
  fails in its own teardown, saying what is off; the next test then gets a fresh cluster
  instead of the broken one.

Every cluster module is marked ``xdist_group("cluster")`` so that under pytest-xdist
(``--dist loadgroup``) they run in one worker and share its ZooKeeper and clusters. (With
pytest 9.2 and pytest-xdist 3.8.0 the mark has no effect: xdist tags the group onto
``item._nodeid``, which pytest 9 no longer reads, so loadgroup distributes like load;
each worker then starts its own ZooKeeper and clusters, which is correct but costs more.)
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterator

import pytest

from headrace.cluster.zookeeper_server import ZooKeeperServer
from tests.clusterproc import Cluster, ClusterUnhealthy
from tests.zk import shared_zookeeper

HEALTH_DEADLINE_S = 90.0
# a failed test's report carries what each broker logged during it (its last lines): a
# flake seen once in a loaded CI run can be read afterwards, not only re-run
FAILURE_LOG_LINES = 300
_LOG_MARKS = pytest.StashKey[tuple[Cluster, dict[int, int]]]()

# Every cluster's settings. No automatic preferred-leader rebalance: every election in a
# cluster test is one the test causes (Kafka's default moves a leader back to its
# preferred replica every 300 s; seen moving a fenced leader's partition back to it in the
# middle of a failover scenario). Internal topics of 10 partitions, not 50 (as Kafka's own
# integration tests do): each failover moves a third of them, each restart catches up all.
BASE_OVERRIDES = {
    "auto.leader.rebalance.enable": "false",
    "offsets.topic.num.partitions": "10",
    "transaction.state.log.num.partitions": "10",
}


@pytest.fixture(scope="session")
def zookeeper(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> ZooKeeperServer:
    """The session's ZooKeeper server (use a chroot of your own)."""
    return shared_zookeeper(request.config, tmp_path_factory)


class ClusterPool:
    """Clusters by settings: one per distinct set of broker configs."""

    def __init__(self, zookeeper: ZooKeeperServer, tmp: pytest.TempPathFactory) -> None:
        self.zookeeper = zookeeper
        self.tmp = tmp
        self.clusters: dict[tuple[tuple[str, str], ...], Cluster] = {}

    @staticmethod
    def key(overrides: dict[str, str]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({**BASE_OVERRIDES, **overrides}.items()))

    def get(self, overrides: dict[str, str]) -> Cluster:
        key = self.key(overrides)
        c = self.clusters.get(key)
        if c is None:
            chroot = f"/headrace-{uuid.uuid4().hex[:8]}"
            c = Cluster(self.tmp.mktemp("cluster"), self.zookeeper.connect_string + chroot, 3,
                        dict(key), metrics=True)
            self.clusters[key] = c
            c.start()
        return c

    def discard(self, c: Cluster) -> None:
        """A cluster that could not be brought back: killed (its logs kept) and forgotten."""
        self.clusters = {k: v for k, v in self.clusters.items() if v is not c}
        c.stop(kill=True)
        c.write_logs()

    def close(self) -> None:
        for c in self.clusters.values():
            c.stop(kill=True)  # the data is thrown away: no controlled shutdowns to wait for
            c.write_logs()
        self.clusters.clear()


@pytest.fixture(scope="session")
def cluster_pool(zookeeper: ZooKeeperServer,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterPool]:
    pool = ClusterPool(zookeeper, tmp_path_factory)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def cluster_overrides() -> dict[str, str]:
    """Broker configs of the module's cluster on top of BASE_OVERRIDES (a module overrides
    this fixture)."""
    return {}


@pytest.fixture
def healthy(cluster_pool: ClusterPool, cluster_overrides: dict[str, str],
            request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The module's cluster, healthy before the test and restored to health after it."""
    c = cluster_pool.get(cluster_overrides)
    try:
        c.restore()
        c.wait_healthy(HEALTH_DEADLINE_S)
    except ClusterUnhealthy:  # left so by an earlier test (which failed for it): a new one
        cluster_pool.discard(c)
        c = cluster_pool.get(cluster_overrides)
        c.wait_healthy(HEALTH_DEADLINE_S)
    c.new_tracebacks()  # reported by the teardown that found them
    request.node.stash[_LOG_MARKS] = (c, {i: len(b.log) for i, b in c.brokers.items()})
    yield c
    failures = []
    try:
        failures += c.restore()
        c.wait_healthy(HEALTH_DEADLINE_S)
    except Exception as e:
        failures.append(f"{type(e).__name__}: {e}")
        cluster_pool.discard(c)
    if tb := c.new_tracebacks():
        failures.append(tb)
    if failures:
        pytest.fail("the test left its cluster unhealthy (brokers resumed and restarted, "
                    "then health waited for): " + "\n".join(failures), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report gets a section per broker: the lines it logged since the
    test began (the last FAILURE_LOG_LINES)."""
    report = yield
    marks = item.stash.get(_LOG_MARKS, None)
    if marks is not None and report.failed and call.when in ("call", "teardown"):
        cluster, start = marks
        for i, b in cluster.brokers.items():
            lines = list(b.log)[start.get(i, 0):]
            if lines:
                report.sections.append((f"broker {i} log during the test",
                                        "".join(lines[-FAILURE_LOG_LINES:])))
    return report
