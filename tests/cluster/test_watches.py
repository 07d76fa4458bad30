"""Issue 21, defect 5: ZooKeeper watches grow with brokers and topics, not with brokers x
partitions. Brokers learn partition states from the state change notifications
(``/headrace/state_changes``, one child watch per broker), not from a watch on every state
znode; measured with ZooKeeper's ``wchp`` four-letter word on the cluster's chroot."""

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


def test_watches_grow_with_brokers_and_topics_not_partitions(healthy: Cluster) -> None:
    cluster = healthy
    hosts, chroot = split_connect(cluster.zk_connect)
    port = int(hosts.split(",")[0].rsplit(":", 1)[1])

    def watches() -> dict[str, int]:
        return watches_by_path(port, chroot + "/")

    before = sum(watches().values())
    topic = f"watched-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, PARTITIONS, 3)
    brokers = len(cluster.brokers)
    # every broker follows the new topic (its znode watched) and every partition's state
    topic_path = f"{chroot}/brokers/topics/{topic}"
    wait_until(lambda: watches().get(topic_path, 0) == brokers, 60, 0.2,
               f"every broker watching {topic_path}")
    cluster.wait_healthy(60)
    after = watches()
    per_partition = sorted(p for p in after if "/partitions/" in p)
    assert per_partition == [], (f"{len(per_partition)} partition paths watched, e.g. "
                                 f"{per_partition[:3]}")
    grown = sum(after.values()) - before
    mntr = four_letter_word(port, "mntr")
    total = next((line.split()[-1] for line in mntr.splitlines()
                  if line.startswith("zk_watch_count")), "?")
    print(f"watches under {chroot}: {before} before, {sum(after.values())} after a "
          f"{PARTITIONS}-partition topic on {brokers} brokers; server-wide zk_watch_count "
          f"{total}")
    assert grown <= brokers * PER_BROKER_PER_TOPIC, (
        f"a {PARTITIONS}-partition topic added {grown} watches on {brokers} brokers")
