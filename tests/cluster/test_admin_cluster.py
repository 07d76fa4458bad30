"""Admin APIs on a 3-broker cluster (issue 11 item 3): DeleteRecords answered by the
partition's leader (NOT_LEADER_OR_FOLLOWER elsewhere), and OffsetForLeaderEpoch as
kafka-python's consumer uses it after a leader change (KIP-320: it validates a position
whose leader epoch is older than the current leader's)."""

from __future__ import annotations

import time
import uuid

import pytest
from kio.schema.errors import ErrorCode

from tests.brokerproc import wait_until
from tests.cluster.test_failover import produce_acked
from tests.clusterproc import Cluster
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _wire(cluster: Cluster, broker_id: int) -> WireClient:
    return WireClient.to(cluster.brokers[broker_id].address)


def _leader_epoch(cluster: Cluster, broker_id: int, topic: str) -> tuple[int, int]:
    """(leader, leader epoch) of partition 0 as broker ``broker_id``'s Metadata says."""
    with _wire(cluster, broker_id) as wc:
        md = wc.request(3, 12, {"topics": [{"name": topic, "topic_id": None}],
                                "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False})
    (p,) = md.topics[0].partitions
    return int(p.leader_id), int(p.leader_epoch)


def _earliest(cluster: Cluster, broker_id: int, topic: str) -> tuple[int, int]:
    with _wire(cluster, broker_id) as wc:
        resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                            "timestamp": -2}]}]})
    (p,) = resp.topics[0].partitions
    return int(p.error_code), int(p.offset)


def _delete_on(cluster: Cluster, broker_id: int, topic: str, offset: int) -> tuple[int, int]:
    with _wire(cluster, broker_id) as wc:
        resp = wc.request(21, 2, {"timeout": 5000, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "offset": offset}]}]})
    (p,) = resp.topics[0].partitions
    return int(p.error_code), int(p.low_watermark)


def test_delete_records_on_the_leader_only(healthy: Cluster) -> None:
    """confluent-kafka's delete_records reaches the leader, whose log start moves; a
    follower asked directly answers NOT_LEADER_OR_FOLLOWER and moves nothing."""
    from confluent_kafka import TopicPartition as CTP

    cluster = healthy
    topic = _topic("delrec")
    cluster.create_topic(topic, 1, 3)
    leader = cluster.wait_leader(topic, 0)
    produce_acked(cluster, topic, [b"v%d" % i for i in range(12)])
    follower = next(b for b in cluster.brokers if b != leader)
    assert _delete_on(cluster, follower, topic, 3) == (ErrorCode.not_leader_or_follower, -1)
    assert _earliest(cluster, leader, topic) == (ErrorCode.none, 0)
    admin = cluster.admin()  # referenced until the result is in
    futs = admin.delete_records([CTP(topic, 0, 5)], request_timeout=20)
    (fut,) = futs.values()
    assert fut.result(30).low_watermark == 5
    assert _earliest(cluster, leader, topic) == (ErrorCode.none, 5)
    assert _delete_on(cluster, leader, topic, -1) == (ErrorCode.none, 12)
    assert _earliest(cluster, leader, topic) == (ErrorCode.none, 12)


def test_kafka_python_detects_truncation_after_an_unclean_election(healthy: Cluster) -> None:
    """kafka-python's consumer read records that only the old leader had (its followers
    paused, out of the ISR); the old leader dies and a follower wins an unclean election
    with a new leader epoch. The consumer then asks the new leader where its position's
    epoch ended (OffsetForLeaderEpoch, KIP-320) and goes back to that offset: it reads
    the new leader's records from there. (Without the answer it would get
    OFFSET_OUT_OF_RANGE and reset to the earliest offset.) kafka-python only validates
    positions whose epoch is older than the leader's, so this takes a leader change."""
    from kafka import KafkaConsumer, TopicPartition

    cluster = healthy
    topic = _topic("ofle")
    cluster.create_topic(topic, 1, 3, {"unclean.leader.election.enable": "true",
                                        "min.insync.replicas": "1"})
    leader = cluster.wait_leader(topic, 0)
    produce_acked(cluster, topic, [b"old-%d" % i for i in range(10)])
    _, epoch = _leader_epoch(cluster, leader, topic)
    others = [b for b in cluster.brokers if b != leader]
    tp = TopicPartition(topic, 0)
    # metadata refreshed on errors only: a periodic refresh while the followers are paused
    # past their sessions would list the leader alone, and kafka-python (no re-bootstrap)
    # then knows no broker once the leader is killed (seen: stuck for 60 s)
    c = KafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False,
                      auto_offset_reset="earliest", request_timeout_ms=10_000,
                      metadata_max_age_ms=300_000, reconnect_backoff_max_ms=1000)
    try:
        c.assign([tp])

        def consume(n: int) -> list[tuple[int, bytes]]:
            got: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + 60
            while len(got) < n and time.monotonic() < deadline:
                for records in c.poll(500).values():
                    got += [(r.offset, r.value) for r in records]
            return got

        assert [o for o, _ in consume(10)] == list(range(10))
        for b in others:
            cluster.brokers[b].pause()
        cluster.wait_isr(topic, 0, lambda isr: isr == {leader}, 60)
        produce_acked(cluster, topic, [b"lost-%d" % i for i in range(5)])  # only on the leader
        assert consume(5) == [(10 + i, b"lost-%d" % i) for i in range(5)]

        cluster.brokers[leader].kill()
        for b in others:
            cluster.brokers[b].resume()
        new_leader = cluster.wait_leader(topic, 0, lambda b: b != leader, 60)

        def own_view() -> int | None:
            """The new leader's epoch as its own Metadata says, once it names itself:
            ``wait_leader`` may have read another broker's (the controller's broker takes
            its elections at once), while this one, just resumed, may still be
            re-establishing its expired ZooKeeper session (loaded run 182 read epoch 0)."""
            try:
                named, new_epoch = _leader_epoch(cluster, new_leader, topic)
            except Exception:
                return None
            return new_epoch if named == new_leader else None

        assert wait_until(own_view, 60, 0.1, "the new leader's own Metadata") > epoch
        produce_acked(cluster, topic, [b"new-%d" % i for i in range(3)])
        assert consume(3) == [(10, b"new-0"), (11, b"new-1"), (12, b"new-2")]
    finally:
        c.close()


def test_a_follower_checks_the_leader_epoch_before_leadership(healthy: Cluster) -> None:
    """Kafka's order (Partition.getLocalLog): a replica that is not the leader answers a
    Fetch or OffsetForLeaderEpoch naming a newer leader epoch than it knows with
    UNKNOWN_LEADER_EPOCH (retry at once: it is the new leader that has not heard yet), an
    older one with FENCED_LEADER_EPOCH, and only the current one with
    NOT_LEADER_OR_FOLLOWER (a follower fetching from its new leader used to pause a whole
    second on that race)."""
    cluster = healthy
    topic = _topic("epochorder")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    produce_acked(cluster, topic, [b"x"])
    leader = cluster.wait_leader(topic, 0)
    follower = next(b for b in cluster.brokers if b != leader)
    _, epoch = _leader_epoch(cluster, follower, topic)

    def fetch_code(current: int) -> int:
        with _wire(cluster, follower) as wc:
            resp = wc.request(1, 12, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                "forgotten_topics_data": [], "rack_id": "",
                "topics": [{"topic": topic, "partitions": [{
                    "partition": 0, "current_leader_epoch": current, "fetch_offset": 0,
                    "last_fetched_epoch": -1, "log_start_offset": -1,
                    "partition_max_bytes": 1 << 20}]}]})
        return int(resp.responses[0].partitions[0].error_code)

    def ofle_code(current: int) -> int:
        with _wire(cluster, follower) as wc:
            resp = wc.request(23, 4, {"replica_id": -1, "topics": [{"topic": topic,
                              "partitions": [{"partition": 0, "current_leader_epoch": current,
                                              "leader_epoch": 0}]}]})
        return int(resp.topics[0].partitions[0].error_code)

    for code in (fetch_code, ofle_code):
        assert code(epoch + 1) == ErrorCode.unknown_leader_epoch
        assert code(epoch) == ErrorCode.not_leader_or_follower
        if epoch > 0:
            assert code(epoch - 1) == ErrorCode.fenced_leader_epoch


def test_one_create_topics_request_of_several_topics(healthy: Cluster) -> None:
    """One CreateTopics request of several topics (librdkafka sends the batch as one): the
    topics are created together and each gets its own result, an existing name its
    TOPIC_ALREADY_EXISTS without holding the others back; when the answer comes, every
    partition of the new topics has a leader in the answering broker's Metadata."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    cluster = healthy
    existing = _topic("multi-old")
    cluster.create_topic(existing, 1, 3)
    new = {_topic("multi-a"): 6, _topic("multi-b"): 3}
    admin = cluster.admin()
    futs = admin.create_topics([NewTopic(t, n, 3) for t, n in new.items()]
                               + [NewTopic(existing, 2, 3)], request_timeout=60)
    for t in new:
        assert futs[t].result(70) is None
    with pytest.raises(KafkaException) as exc:
        futs[existing].result(70)
    assert exc.value.args[0].name() == "TOPIC_ALREADY_EXISTS"
    controller = admin.list_topics(timeout=10).controller_id
    with _wire(cluster, controller) as wc:
        md = wc.request(3, 12, {"topics": [{"name": t, "topic_id": None} for t in new],
                                "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False})
    leaders = {str(t.name): sorted(int(p.leader_id) for p in t.partitions) for t in md.topics}
    assert {t: len(ls) for t, ls in leaders.items()} == new
    assert all(ld in cluster.brokers for ls in leaders.values() for ld in ls)


def test_a_deleted_topic_leaves_every_broker_and_its_name_can_be_used_again(
        healthy: Cluster) -> None:
    """DeleteTopics on a cluster (the pure controller's DeletionRequested, issue 21): every
    broker's Metadata stops naming the topic and every replica's directory is removed;
    created again under the same name it starts empty on every broker, none of the old
    records back (R-LOG: no record of a deleted topic)."""
    cluster = healthy
    topic = _topic("delete")
    cluster.create_topic(topic, 3, 3)
    produce_acked(cluster, topic, [b"old"] * 5)
    admin = cluster.admin()
    admin.delete_topics([topic], operation_timeout=30)[topic].result(40)

    def gone() -> bool:
        for b in cluster.brokers.values():
            with _wire(cluster, b.broker_id) as wc:
                md = wc.request(3, 12, {"topics": [{"name": topic, "topic_id": None}],
                                        "allow_auto_topic_creation": False,
                                        "include_topic_authorized_operations": False})
            if int(md.topics[0].error_code) != ErrorCode.unknown_topic_or_partition:
                return False
            if list(b.data_dir.glob(f"{topic}-*")):
                return False
        return True

    wait_until(gone, 60, 0.2, f"topic {topic} gone from every broker and disk")
    cluster.create_topic(topic, 1, 3)
    produce_acked(cluster, topic, [b"new"] * 2)
    leader = cluster.wait_leader(topic, 0)
    assert _earliest(cluster, leader, topic) == (0, 0)
    with _wire(cluster, leader) as wc:
        resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                            "timestamp": -1}]}]})
    (p,) = resp.topics[0].partitions
    assert (int(p.error_code), int(p.offset)) == (0, 2)


def test_internal_topics_refuse_damaging_changes_on_a_cluster(healthy: Cluster) -> None:
    """Issue 23 item 5 on a cluster (the single node's test: tests/integration/
    test_internal_topics.py): on every broker, IncrementalAlterConfigs setting
    ``cleanup.policy=delete`` + ``retention.ms=1`` on ``__consumer_offsets`` is refused with
    INVALID_CONFIG and CreatePartitions with INVALID_REQUEST; the partition count and the
    topic's configs (DescribeConfigs) stay."""
    from confluent_kafka import Consumer, KafkaError, KafkaException
    from confluent_kafka import TopicPartition as CkTopicPartition
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewPartitions,
        ResourceType,
    )

    cluster = healthy
    topic = _topic("internal")
    cluster.create_topic(topic, 1, 3)
    c = Consumer({"bootstrap.servers": cluster.live_bootstrap(), "group.id": topic})
    try:  # __consumer_offsets exists once a group committed
        c.commit(offsets=[CkTopicPartition(topic, 0, 42)], asynchronous=False)
    finally:
        c.close()
    name = "__consumer_offsets"
    resource = ConfigResource(ResourceType.TOPIC, name)
    partitions = len(cluster.describe(name))
    assert partitions > 0
    for b in cluster.brokers.values():
        admin = AdminClient({"bootstrap.servers": b.address})
        (fut,) = admin.incremental_alter_configs([ConfigResource(
            ResourceType.TOPIC, name, incremental_configs=[
                ConfigEntry("cleanup.policy", "delete",
                            incremental_operation=AlterConfigOpType.SET),
                ConfigEntry("retention.ms", "1",
                            incremental_operation=AlterConfigOpType.SET)])]).values()
        with pytest.raises(KafkaException) as e:
            fut.result(30)
        assert e.value.args[0].code() == KafkaError.INVALID_CONFIG
        with pytest.raises(KafkaException) as e:
            admin.create_partitions([NewPartitions(name, partitions + 5)])[name].result(30)
        assert e.value.args[0].code() == KafkaError.INVALID_REQUEST
        configs = admin.describe_configs([resource])[resource].result(30)
        assert configs["cleanup.policy"].value == "compact"
        assert configs["retention.ms"].value != "1"
    assert len(cluster.describe(name)) == partitions
    c = Consumer({"bootstrap.servers": cluster.live_bootstrap(), "group.id": topic})
    try:
        (tp,) = c.committed([CkTopicPartition(topic, 0)], timeout=15)
        assert tp.offset == 42
    finally:
        c.close()


def _broker_configs(cluster: Cluster, broker_id: int, name: str, keys: list[str]
                    ) -> dict[str, tuple[str | None, int]]:
    """DescribeConfigs of a BROKER resource asked of ``broker_id``: name -> (value, source)."""
    with _wire(cluster, broker_id) as wc:
        resp = wc.request(32, 4, {"resources": [{
            "resource_type": 4, "resource_name": name, "configuration_keys": keys}],
            "include_synonyms": False, "include_documentation": False})
    return {e.name: (e.value, int(e.config_source)) for e in resp.results[0].configs}


def _alter(cluster: Cluster, broker_id: int, rtype: int, name: str,
           configs: dict[str, str | None]) -> tuple[int, str | None]:
    with _wire(cluster, broker_id) as wc:
        resp = wc.request(44, 1, {"resources": [{
            "resource_type": rtype, "resource_name": name, "configs": [
                {"name": k, "config_operation": 1 if v is None else 0, "value": v}
                for k, v in configs.items()]}], "validate_only": False})
    (r,) = resp.responses
    return int(r.error_code), r.error_message


def test_dynamic_default_broker_configs_reach_every_broker(healthy: Cluster) -> None:
    """Issue 27 item 4 on a cluster: the cluster-wide default set through one broker is in
    ZooKeeper at /config/brokers/<default> in Kafka's JSON, announced on /config/changes,
    and every broker applies it (DYNAMIC_DEFAULT_BROKER_CONFIG); a broker's own
    (/config/brokers/1) only on that broker; group configs (/config/groups/<group>) are
    seen by every broker (brokers 1-3)."""
    import json

    group = _topic("grp")
    try:
        assert _alter(healthy, 3, 4, "", {"message.max.bytes": "123456"}) == (0, None)
        assert _alter(healthy, 1, 4, "1", {"log.retention.ms": "3600000"}) == (0, None)
        assert _alter(healthy, 2, 32, group, {"consumer.session.timeout.ms": "50000"}) == (
            0, None)
        zk = healthy.zk()
        data, _ = zk.get("/config/brokers/<default>")
        assert json.loads(data) == {"version": 1, "config": {"message.max.bytes": "123456"}}
        data, _ = zk.get(f"/config/groups/{group}")
        assert json.loads(data)["config"] == {"consumer.session.timeout.ms": "50000"}
        for b in (1, 2, 3):
            wait_until(lambda b=b: _broker_configs(healthy, b, str(b), ["message.max.bytes"])
                       == {"message.max.bytes": ("123456", 3)}, timeout_s=20)
            retention = _broker_configs(healthy, b, str(b), ["log.retention.ms"])
            assert retention["log.retention.ms"][1] == (2 if b == 1 else 5), (b, retention)
            wait_until(lambda b=b: _group_value(healthy, b, group) == "50000", timeout_s=20)
    finally:
        _alter(healthy, 3, 4, "", {"message.max.bytes": None})
        _alter(healthy, 1, 4, "1", {"log.retention.ms": None})
        _alter(healthy, 2, 32, group, {"consumer.session.timeout.ms": None})
    for b in (1, 2, 3):
        wait_until(lambda b=b: _broker_configs(healthy, b, str(b), ["message.max.bytes"])[
            "message.max.bytes"][1] in (4, 5), timeout_s=20)


def _group_value(cluster: Cluster, broker_id: int, group: str) -> str | None:
    with _wire(cluster, broker_id) as wc:
        resp = wc.request(32, 4, {"resources": [{
            "resource_type": 32, "resource_name": group,
            "configuration_keys": ["consumer.session.timeout.ms"]}],
            "include_synonyms": False, "include_documentation": False})
    (e,) = resp.results[0].configs
    return e.value
