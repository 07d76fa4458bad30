"""Issue 21, defect 5: ZooKeeper watches grow with brokers and topics, not with brokers x
partitions. Brokers learn partition states from the state change notifications
(``/headrace/state_changes``, one child watch per broker), not from a watch on every state
znode. Measured with ZooKeeper's four-letter words: ``wchp`` (data watches by path, on the
cluster's chroot) and ``mntr``'s ``zk_watch_count`` (data and child watches, the server's;
the other clusters of this test process are idle meanwhile)."""

from __future__ import annotations

import uuid

import pytest

from headrace.cluster.zk_store import split_connect
from headrace.cluster.zookeeper_server import four_letter_word, watches_by_path
from tests.brokerproc import wait_until
from tests.clusterproc import Cluster

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]

PARTITIONS = 300
# per broker, for one more topic: its znode and its config znode (data watches)
PER_BROKER_PER_TOPIC = 2


def watch_count(port: int) -> int:
    """``zk_watch_count`` of ``mntr``: every data and child watch the server holds."""
    for line in four_letter_word(port, "mntr").splitlines():
        if line.startswith("zk_watch_count"):
            return int(line.split()[-1])
    raise AssertionError("mntr has no zk_watch_count")


def test_watches_grow_with_brokers_and_topics_not_partitions(healthy: Cluster) -> None:
    cluster = healthy
    hosts, chroot = split_connect(cluster.zk_connect)
    port = int(hosts.split(",")[0].rsplit(":", 1)[1])
    brokers = len(cluster.brokers)
    topic_path = f"{chroot}/brokers/topics/"

    def topics_watched() -> int:
        return sum(1 for p, n in watches_by_path(port, topic_path).items()
                   if "/" not in p[len(topic_path):] and n == brokers)

    def topics() -> int:
        return len(cluster.zk().get_children("/brokers/topics"))

    # every broker watching every topic znode: the watches are settled
    wait_until(lambda: topics_watched() == topics(), 30, 0.2, "every topic watched")
    base = topics()
    before = watch_count(port)
    topic = f"watched-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, PARTITIONS, 3)
    cluster.wait_healthy(60)
    wait_until(lambda: topics_watched() == base + 1, 60, 0.2,
               f"every broker watching {topic_path}{topic}")
    after = watch_count(port)
    by_path = watches_by_path(port, chroot + "/")
    per_partition = sorted(p for p in by_path if "/partitions/" in p)
    print(f"ZooKeeper watches (zk_watch_count): {before} before, {after} after a "
          f"{PARTITIONS}-partition RF 3 topic on {brokers} brokers; partition paths "
          f"watched: {len(per_partition)}")
    assert per_partition == [], (f"{len(per_partition)} partition paths watched, e.g. "
                                 f"{per_partition[:3]}")
    assert after - before <= brokers * PER_BROKER_PER_TOPIC, (
        f"a {PARTITIONS}-partition topic added {after - before} watches on {brokers} "
        "brokers")
