"""A secured 3-broker cluster (issue 12): every broker has an inter-broker listener INTERNAL
(SASL_SSL, SCRAM-SHA-512) and a client listener CLIENT (SASL_SSL, SCRAM-SHA-512), Kafka's
AclAuthorizer, and the brokers' principal User:broker in super.users.

The brokers authenticate to each other with the SCRAM credential of User:broker, so it must
exist before the first broker starts; as Kafka's documentation does (``kafka-configs.sh
--zookeeper ... --alter --add-config 'SCRAM-SHA-512=[...]' --entity-type users``), it is
written into ZooKeeper's ``/config/users/broker`` beforehand, through headrace's own ZooKeeper
layout and SCRAM code (as is the client super user User:admin's).

Shown: replication runs over the secured inter-broker listener (acks=all with
min.insync.replicas=2, the leader killed with -9, everything consumed from the new leader);
ACLs created through one broker give the same allow and deny answers on every broker (each
asked directly); a SCRAM user created through one broker authenticates on every broker.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
    AdminClient,
    NewTopic,
    ResourceType,
)
from kazoo.client import KazooClient

from headrace.cluster import zk_layout as L
from headrace.cluster.zookeeper_server import ZooKeeperServer
from headrace.security.devcerts import write_dev_certs
from headrace.security.scram import format_credential, from_password
from tests.brokerproc import wait_until
from tests.clusterproc import Cluster, free_port
from tests.security_helpers import (
    ACL_AUTHORIZER,
    DENY,
    PRE,
    acl,
    ok,
    pem_keystore,
    sasl_conf,
    scram_user,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]

MECH = "SCRAM-SHA-512"
SEEDED = {"broker": "broker-secret", "admin": "admin-secret"}
P = f"sc-{uuid.uuid4().hex[:6]}"


@dataclass
class Secured:
    cluster: Cluster
    client_ports: dict[int, int]
    ca: Path

    def conf(self, broker_ids: tuple[int, ...], user: str, password: str,
             **extra: Any) -> dict[str, Any]:
        return sasl_conf(",".join(f"127.0.0.1:{self.client_ports[i]}" for i in broker_ids),
                         user, password, mechanism=MECH, protocol="SASL_SSL",
                         **{"ssl.ca.location": str(self.ca)}, **extra)

    def admin(self, *broker_ids: int, user: str = "admin",
              password: str = SEEDED["admin"]) -> AdminClient:
        return AdminClient(self.conf(broker_ids or tuple(self.live()), user, password,
                                     **{"socket.connection.setup.timeout.ms": 3000}))

    def live(self) -> list[int]:
        return [i for i, b in self.cluster.brokers.items() if b.alive]


def seed_credentials(connect: str, chroot: str) -> None:
    """Kafka's bootstrap step: SCRAM credentials in ZooKeeper before any broker starts."""
    kz = KazooClient(hosts=connect)
    kz.start(timeout=15)
    try:
        for user, password in SEEDED.items():
            cred = format_credential(from_password(MECH, password))
            kz.create(chroot + L.user_path(user), L.encode_config({MECH: cred}),
                      makepath=True)
    finally:
        kz.stop()
        kz.close()


@pytest.fixture(scope="module")
def secured(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Secured]:
    root: Path = tmp_path_factory.mktemp("secured")
    certs = write_dev_certs(root / "certs")
    chroot = f"/headrace-{uuid.uuid4().hex[:8]}"
    seed_credentials(zookeeper.connect_string, chroot)
    scram_jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                  f'username="broker" password="{SEEDED["broker"]}";')
    common = {
        "listener.security.protocol.map": "INTERNAL:SASL_SSL,CLIENT:SASL_SSL",
        "inter.broker.listener.name": "INTERNAL",
        "sasl.mechanism.inter.broker.protocol": MECH,
        "sasl.enabled.mechanisms": MECH,
        "listener.name.internal.scram-sha-512.sasl.jaas.config": scram_jaas,
        **pem_keystore(certs),
        **ACL_AUTHORIZER,
        "super.users": "User:broker;User:admin",
        "auto.create.topics.enable": "false",
    }
    c = Cluster(root, zookeeper.connect_string + chroot, 3, common)
    client_ports = {}
    for i, b in c.brokers.items():
        client_ports[i] = free_port()
        b.overrides["listeners"] = (f"INTERNAL://127.0.0.1:{b.port},"
                                    f"CLIENT://127.0.0.1:{client_ports[i]}")
    c.wire_health = False  # no plaintext listener: health as ZooKeeper has it
    c.start()
    try:
        c.wait_healthy()
        yield Secured(c, client_ports, certs["ca.pem"])
    finally:
        c.stop(kill=True)
        c.write_logs()


@pytest.fixture(autouse=True)
def restored(secured: Secured) -> Iterator[None]:
    """After each test: killed brokers restarted, health waited for, no traceback logged."""
    yield
    c = secured.cluster
    crashed = c.restore()
    c.wait_healthy()
    tb = c.new_tracebacks()
    assert not crashed and tb is None, "\n".join([*crashed, tb or ""])


def leader_of(s: Secured, topic: str, not_: int = -1) -> int:
    def found() -> int | None:
        md = s.admin().list_topics(topic, timeout=5).topics[topic]
        if md.error is not None or not md.partitions or md.partitions[0].leader in (-1, not_):
            return None
        return int(md.partitions[0].leader)

    return int(wait_until(found, 30, interval_s=0.2, what=f"a leader for {topic}"))


def test_replication_over_the_secured_inter_broker_listener(secured: Secured) -> None:
    s = secured
    topic = f"{P}-repl"
    a = s.admin()
    a.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})])[
        topic].result(30)

    def full_isr() -> bool:
        md = s.admin().list_topics(topic, timeout=5).topics[topic]
        return md.error is None and len(md.partitions[0].isrs) == 3

    wait_until(full_isr, 60, interval_s=0.2, what="the ISR to hold all three replicas")
    p = Producer(s.conf(tuple(s.live()), "admin", SEEDED["admin"],
                        **{"acks": "all", "enable.idempotence": True}))
    n = 300
    failures: list[Any] = []
    for i in range(n):
        p.produce(topic, str(i).encode(),
                  on_delivery=lambda e, m: failures.append(e) if e else None)
    assert p.flush(60) == 0 and failures == []
    old = leader_of(s, topic)
    s.cluster.brokers[old].kill()  # SIGKILL: the followers were in sync over SASL_SSL
    new = leader_of(s, topic, not_=old)
    c = Consumer(s.conf((new,), "admin", SEEDED["admin"],
                        **{"group.id": f"{P}-g", "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[int] = []

        def all_read() -> bool:
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append(int(m.value()))
            return len(got) >= n

        wait_until(all_read, 60, interval_s=0, what="every acknowledged record")
        assert got == list(range(n))
    finally:
        c.close()
        s.cluster.brokers[old].start()


def test_acls_answer_alike_on_every_broker(secured: Secured) -> None:
    s = secured
    a = s.admin(1)
    # alice, a SCRAM user, created through broker 1
    ok(a.alter_user_scram_credentials([scram_user("alice", "alice-secret")])["alice"])
    ok_topics = {i: f"{P}-ok-{i}" for i in (1, 2, 3)}
    no_topics = {i: f"{P}-no-{i}" for i in (1, 2, 3)}
    new = [NewTopic(t, num_partitions=1, replica_assignment=[[i]]) for d in (ok_topics, no_topics)
           for i, t in d.items()]  # each broker leads one of each
    for f in a.create_topics(new).values():
        f.result(30)
    seed = Producer(s.conf(tuple(s.live()), "admin", SEEDED["admin"]))
    for t in (*ok_topics.values(), *no_topics.values()):
        seed.produce(t, b"v")
    assert seed.flush(30) == 0
    alice = "User:alice"
    acls = [acl(ResourceType.TOPIC, f"{P}-", AclOperation.READ, pattern=PRE, principal=alice),
            acl(ResourceType.TOPIC, f"{P}-no-", AclOperation.READ, DENY, PRE, principal=alice),
            acl(ResourceType.GROUP, f"{P}-alice", AclOperation.READ, principal=alice)]
    for f in a.create_acls(acls).values():
        ok(f)

    def read(i: int, topic: str) -> int | None:
        """alice, bootstrapped to broker ``i`` only, reads ``topic`` (led by ``i``): 0 for
        a record, an error code, None for nothing yet."""
        c = Consumer(s.conf((i,), "alice", "alice-secret",
                            **{"group.id": f"{P}-alice", "enable.auto.commit": False,
                               "auto.offset.reset": "earliest"}))
        try:
            c.subscribe([topic], on_assign=lambda c, ps: c.assign(
                [TopicPartition(q.topic, q.partition, 0) for q in ps]))
            m = wait_until(lambda: c.poll(0.2), 10, interval_s=0, what=f"{topic} on {i}")
            return 0 if not m.error() else int(m.error().code())
        except AssertionError:
            return None
        finally:
            c.close()

    for i in (1, 2, 3):
        # the SCRAM user authenticates on every broker, the ACLs answer alike
        wait_until(lambda i=i: read(i, ok_topics[i]) == 0, 30, interval_s=0.2,
                   what=f"alice reading {ok_topics[i]} on broker {i}")
        assert read(i, no_topics[i]) == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_scram_user_created_on_one_broker_authenticates_on_every_broker(
        secured: Secured) -> None:
    s = secured
    a = s.admin(2)  # created through broker 2 (kept referenced until the answer)
    ok(a.alter_user_scram_credentials([scram_user("carol", "carol-secret")])["carol"])

    def authenticates(i: int, password: str) -> bool:
        a = AdminClient(s.conf((i,), "carol", password))
        try:
            a.list_topics(timeout=3)
            return True
        except KafkaException:
            return False

    for i in (1, 2, 3):
        wait_until(lambda i=i: authenticates(i, "carol-secret"), 30, interval_s=0.2,
                   what=f"carol authenticating on broker {i}")
        assert not authenticates(i, "wrong")
