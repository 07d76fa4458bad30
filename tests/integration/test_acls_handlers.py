"""Authorization in the handlers that had none (issue 12, item 3), on the wire, as Kafka's
KafkaApis checks them: DescribeCluster, DescribeTransactions, ListTransactions,
DescribeProducers, ElectLeaders, Alter/ListPartitionReassignments, ConsumerGroupHeartbeat,
ConsumerGroupDescribe, DescribeTopicPartitions, OffsetForLeaderEpoch and ListOffsets v0.

One broker with Kafka's AclAuthorizer and two listeners: PLAINTEXT, where the ordinary
principal User:ANONYMOUS is held to the ACLs below, and SASL_PLAINTEXT (PLAIN), where
User:admin is a super user (it sets everything up) and User:ops holds only CLUSTER_ACTION.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
    AdminClient,
    NewTopic,
    ResourceType,
)
from kio.schema.errors import ErrorCode

from headrace.security.acl import SUPPORTED_OPERATIONS
from headrace.security.acl import AclOperation as Op
from headrace.security.acl import ResourceType as RT
from tests.brokerproc import BrokerProcess
from tests.inproc import InProcessBroker
from tests.integration.test_old_clients import list_offsets_v0
from tests.kafka_wire import WireClient
from tests.security_helpers import (
    ACL_AUTHORIZER,
    acl,
    listener_ports,
    plain_jaas,
    sasl_conf,
)

pytestmark = pytest.mark.timeout(120)

USERS = {"admin": "admin-secret", "ops": "ops-secret"}
JAAS = plain_jaas(USERS)
P = f"ah-{uuid.uuid4().hex[:6]}"
A, B, C = f"{P}-a", f"{P}-b", f"{P}-c"  # A: READ; B: nothing; C: DESCRIBE only
TXN_OK, TXN_NO = f"{P}-txn-ok", f"{P}-txn-no"
CG_HB, CG_A, CG_AB, CG_NO = f"{P}-cg-hb", f"{P}-cg-a", f"{P}-cg-ab", f"{P}-cg-no"

GRANTS = [
    acl(ResourceType.TOPIC, A, AclOperation.READ),
    acl(ResourceType.TOPIC, C, AclOperation.DESCRIBE),
    acl(ResourceType.TRANSACTIONAL_ID, TXN_OK, AclOperation.DESCRIBE),
    acl(ResourceType.GROUP, CG_HB, AclOperation.READ),
    acl(ResourceType.GROUP, CG_A, AclOperation.DESCRIBE),
    acl(ResourceType.GROUP, CG_AB, AclOperation.DESCRIBE),
    acl(ResourceType.BROKER, "kafka-cluster", AclOperation.CLUSTER_ACTION,
        principal="User:ops"),
]


def bits(*ops: Op) -> int:
    return sum(1 << int(o) for o in ops)


@dataclass
class Env:
    broker: BrokerProcess
    ports: dict[str, int]
    producers: list[Producer]

    def anon(self) -> WireClient:
        return WireClient("127.0.0.1", self.ports["PLAINTEXT"])

    def user(self, name: str) -> WireClient:
        return WireClient("127.0.0.1", self.ports["SASL_PLAINTEXT"]).sasl_plain(
            name, USERS[name])

    def admin_conf(self) -> dict[str, Any]:
        return sasl_conf(f"127.0.0.1:{self.ports['SASL_PLAINTEXT']}", "admin", USERS["admin"])


def heartbeat(wc: WireClient, group: str, topics: list[str]) -> Any:
    return wc.request(68, 0, {"group_id": group, "member_id": "", "member_epoch": 0,
                              "rebalance_timeout": 30_000, "subscribed_topic_names": topics,
                              "topic_partitions": []})


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("acl-handlers")
    overrides = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        **ACL_AUTHORIZER,
        "super.users": "User:admin",
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
    }
    with InProcessBroker(base / "data", overrides) as b:
        e = Env(b, listener_ports(b), [])
        a = AdminClient(e.admin_conf())
        for f in a.create_topics([NewTopic(t, 1, 1) for t in (A, B, C)]).values():
            f.result(15)
        for f in a.create_acls(GRANTS).values():
            f.result(15)
        # two open transactions, each with a partition of A and one of B; an idempotent
        # producer's state on A
        for tid in (TXN_OK, TXN_NO):
            p = Producer({**e.admin_conf(), "transactional.id": tid,
                          "transaction.timeout.ms": 600_000})
            p.init_transactions(15)
            p.begin_transaction()
            p.produce(A, b"in-txn")
            p.produce(B, b"in-txn")
            assert p.flush(15) == 0
            e.producers.append(p)
        # KIP-848 groups set up by the super user: one assigned A, one A and B
        with e.user("admin") as wc:
            assert heartbeat(wc, CG_A, [A]).error_code == ErrorCode.none
            assert heartbeat(wc, CG_AB, [A, B]).error_code == ErrorCode.none
        yield e
        for p in e.producers:
            p.abort_transaction(15)


def test_describe_cluster_authorized_operations(env: Env) -> None:
    body = {"include_cluster_authorized_operations": True}
    with env.anon() as wc:  # no DESCRIBE on the cluster: answered, with 0
        r = wc.request(60, 1, body)
        assert r.error_code == 0 and len(r.brokers) == 1
        assert r.cluster_authorized_operations == 0
        r = wc.request(60, 1, {"include_cluster_authorized_operations": False})
        assert r.cluster_authorized_operations == -2147483648
    with env.user("admin") as wc:
        r = wc.request(60, 1, body)
        assert r.cluster_authorized_operations == bits(*SUPPORTED_OPERATIONS[RT.CLUSTER])


def test_describe_and_list_transactions(env: Env) -> None:
    with env.anon() as wc:
        r = wc.request(65, 0, {"transactional_ids": [TXN_OK, TXN_NO]})
        ok, no = r.transaction_states
        assert ok.error_code == ErrorCode.none and ok.transaction_state == "Ongoing"
        assert [t.topic for t in ok.topics] == [A]  # B is not DESCRIBE-able
        assert no.error_code == ErrorCode.transactional_id_authorization_failed
        assert list(no.topics) == []
        listed = {s.transactional_id
                  for s in wc.request(66, 1, {"state_filters": [],
                                              "producer_id_filters": []}).transaction_states}
        assert TXN_OK in listed and TXN_NO not in listed
    with env.user("admin") as wc:
        r = wc.request(65, 0, {"transactional_ids": [TXN_NO]})
        assert sorted(t.topic for t in r.transaction_states[0].topics) == [A, B]
        listed = {s.transactional_id
                  for s in wc.request(66, 1, {"state_filters": [],
                                              "producer_id_filters": []}).transaction_states}
        assert {TXN_OK, TXN_NO} <= listed


def test_describe_producers_needs_read(env: Env) -> None:
    with env.anon() as wc:
        r = wc.request(61, 0, {"topics": [{"name": t, "partition_indexes": [0]}
                                          for t in (A, B, C)]})
        by = {t.name: t.partitions[0] for t in r.topics}
        assert by[A].error_code == ErrorCode.none and len(by[A].active_producers) == 2
        for t in (B, C):  # C: DESCRIBE is not READ
            assert by[t].error_code == ErrorCode.topic_authorization_failed
            assert by[t].error_message == "Topic authorization failed."
        # an unknown topic is not revealed either
        r = wc.request(61, 0, {"topics": [{"name": f"{P}-nosuch", "partition_indexes": [0]}]})
        assert r.topics[0].partitions[0].error_code == ErrorCode.topic_authorization_failed


def test_elect_leaders_and_reassignments_need_cluster_alter(env: Env) -> None:
    elect = {"election_type": 0, "timeout": 10_000,
             "topic_partitions": [{"topic": A, "partitions": [0]}]}
    alter = {"timeout": 10_000, "topics": [{"name": A, "partitions": [
        {"partition_index": 0, "replicas": [env_broker_id(env)]}]}]}
    with env.anon() as wc:
        r = wc.request(43, 2, elect)
        assert r.error_code == ErrorCode.cluster_authorization_failed
        (res,) = r.replica_election_results
        assert res.topic == A
        assert [p.error_code for p in res.partition_result] == [
            ErrorCode.cluster_authorization_failed]
        r = wc.request(43, 2, {**elect, "topic_partitions": None})
        assert r.error_code == ErrorCode.cluster_authorization_failed
        assert list(r.replica_election_results) == []
        r = wc.request(45, 0, alter)
        assert r.error_code == ErrorCode.cluster_authorization_failed
        assert "is not authorized" in (r.error_message or "")
        assert r.responses[0].partitions[0].error_code == ErrorCode.cluster_authorization_failed
        r = wc.request(46, 0, {"timeout": 10_000, "topics": None})
        assert r.error_code == ErrorCode.cluster_authorization_failed
    with env.user("admin") as wc:
        r = wc.request(43, 2, elect)
        assert r.error_code == ErrorCode.none
        assert r.replica_election_results[0].partition_result[0].error_code == \
            ErrorCode.election_not_needed
        r = wc.request(45, 0, alter)
        assert r.error_code == ErrorCode.none
        assert r.responses[0].partitions[0].error_code == ErrorCode.none
        assert wc.request(46, 0, {"timeout": 10_000, "topics": None}).error_code == 0


def test_alter_replica_log_dirs_needs_cluster_alter(env: Env) -> None:
    """Issue 27 item 3: AlterReplicaLogDirs, as Kafka, needs ALTER on the cluster: every
    partition CLUSTER_AUTHORIZATION_FAILED without it."""
    here = os.path.abspath(env.broker.data_dir)
    body = {"dirs": [{"path": here, "topics": [{"name": A, "partitions": [0]}]}]}
    with env.anon() as wc:
        r = wc.request(34, 2, body)
        assert r.results[0].partitions[0].error_code == \
            ErrorCode.cluster_authorization_failed
    with env.user("admin") as wc:
        assert wc.request(34, 2, body).results[0].partitions[0].error_code == ErrorCode.none


def env_broker_id(env: Env) -> int:
    with env.anon() as wc:
        return int(wc.request(60, 0, {"include_cluster_authorized_operations": False})
                   .brokers[0].broker_id)


def test_consumer_group_heartbeat_needs_group_read_and_topic_describe(env: Env) -> None:
    with env.anon() as wc:
        assert heartbeat(wc, CG_NO, [A]).error_code == ErrorCode.group_authorization_failed
        # DESCRIBE on the group is not READ
        assert heartbeat(wc, CG_A, [A]).error_code == ErrorCode.group_authorization_failed
        # READ on the group, but B is not DESCRIBE-able
        assert heartbeat(wc, CG_HB, [A, B]).error_code == ErrorCode.topic_authorization_failed
        r = heartbeat(wc, CG_HB, [A])
        assert r.error_code == ErrorCode.none and r.member_id and r.member_epoch >= 1


def test_consumer_group_describe(env: Env) -> None:
    body = {"group_ids": [CG_A, CG_AB, CG_NO], "include_authorized_operations": True}
    with env.anon() as wc:
        groups = wc.request(69, 0, body).groups
        assert [g.group_id for g in groups] == [CG_NO, CG_A, CG_AB]  # denied ones first
        no, a, ab = groups
        assert no.error_code == ErrorCode.group_authorization_failed
        assert a.error_code == ErrorCode.none and len(a.members) == 1
        assert a.authorized_operations == bits(Op.DESCRIBE)
        assert ab.error_code == ErrorCode.topic_authorization_failed
        assert ab.error_message == ("The group has described topic(s) that the client is "
                                    "not authorized to describe.")
        assert list(ab.members) == []
    with env.user("admin") as wc:
        groups = wc.request(69, 0, {**body, "include_authorized_operations": False}).groups
        assert [g.error_code for g in groups] == [ErrorCode.none, ErrorCode.none,
                                                  ErrorCode.group_id_not_found]
        assert groups[0].authorized_operations == -2147483648
        assert {tp.topic_name for tp in groups[1].members[0].target_assignment
                .topic_partitions} == {A, B}


def test_describe_topic_partitions(env: Env) -> None:
    nosuch = f"{P}-nosuch"
    with env.anon() as wc:
        r = wc.request(75, 0, {"topics": [{"name": n} for n in (A, B, C, nosuch)],
                               "response_partition_limit": 100, "cursor": None})
        assert [t.name for t in r.topics] == [A, C, B, nosuch]  # the refused ones last
        a, c, b, n = r.topics
        assert a.error_code == 0 and len(a.partitions) == 1
        assert a.topic_authorized_operations == bits(Op.READ, Op.DESCRIBE)
        assert c.topic_authorized_operations == bits(Op.DESCRIBE)
        for t in (b, n):  # existence is not revealed
            assert t.error_code == ErrorCode.topic_authorization_failed
            assert not t.partitions and t.topic_id is None  # zero uuid (kio: None)
            assert t.topic_authorized_operations == -2147483648
        # every topic: the refused ones are left out
        r = wc.request(75, 0, {"topics": [], "response_partition_limit": 100,
                               "cursor": None})
        names = {t.name for t in r.topics}
        assert {A, C} <= names and B not in names
        assert not any(n.startswith("__") for n in names)
    with env.user("admin") as wc:
        r = wc.request(75, 0, {"topics": [{"name": B}], "response_partition_limit": 100,
                               "cursor": None})
        assert r.topics[0].error_code == 0
        assert r.topics[0].topic_authorized_operations == bits(*SUPPORTED_OPERATIONS[RT.TOPIC])


def test_offset_for_leader_epoch(env: Env) -> None:
    body = {"replica_id": -1, "topics": [
        {"topic": t, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                     "leader_epoch": 0}]} for t in (A, B)]}

    def answers(wc: WireClient) -> dict[str, Any]:
        return {t.topic: t.partitions[0] for t in wc.request(23, 4, body).topics}

    with env.anon() as wc:  # a consumer: DESCRIBE on the topic
        got = answers(wc)
        assert got[A].error_code == 0 and got[A].end_offset >= 1
        assert got[B].error_code == ErrorCode.topic_authorization_failed
        assert (got[B].leader_epoch, got[B].end_offset) == (-1, -1)
    with env.user("ops") as wc:  # a follower: CLUSTER_ACTION answers every topic
        got = answers(wc)
        assert got[A].error_code == 0 and got[B].error_code == 0 and got[B].end_offset >= 1


def test_list_offsets_v0(env: Env) -> None:
    with env.anon() as wc:
        got = list_offsets_v0(wc, [(A, [(0, -2, 1)]), (B, [(0, -2, 1)])])
        assert got[(A, 0)] == (0, (0,))
        assert got[(B, 0)] == (ErrorCode.topic_authorization_failed, ())
