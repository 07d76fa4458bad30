"""ACLs for authenticated principals (issue 12, item 3) with confluent-kafka against one broker
process with Kafka's AclAuthorizer and three listeners:

    SASL_PLAINTEXT (PLAIN): User:admin (a super user), User:alice, User:bob
    MTLS   (SSL, client certificates required, ssl.principal.mapping.rules taking the CN):
           the certificate CN=carol,OU=clients,O=headrace is User:carol
    MTLSDN (SSL, client certificates required, no rules): the certificate's whole DN is the
           principal, User:CN=dave,OU=clients,O=headrace

A principal allowed to read topic A cannot read B, cannot commit for a group it has no READ
on, cannot create or delete topics, cannot reset or delete another group's offsets; a DENY
beats an ALLOW; prefixed patterns; the super user may do everything; internal topics stay
closed to ordinary principals. Everything is set up by the super user.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (  # type: ignore[attr-defined]
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
    AdminClient,
    NewTopic,
    ResourceType,
)

from headrace.security.devcerts import write_dev_certs
from tests.brokerproc import BrokerProcess
from tests.inproc import InProcessBroker
from tests.security_helpers import (
    ACL_AUTHORIZER,
    DENY,
    PRE,
    acl,
    code_of,
    commit,
    listener_ports,
    ok,
    pem_keystore,
    plain_jaas,
    sasl_conf,
)

pytestmark = pytest.mark.timeout(120)

USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
JAAS = plain_jaas(USERS)
DAVE = "User:CN=dave,OU=clients,O=headrace"
P = f"aa-{uuid.uuid4().hex[:6]}"
A, B = f"{P}-a", f"{P}-b"
PRE_X, PRE_Y = f"{P}-pre-x", f"{P}-pre-y"
G_ALICE, G_BOB, G_CAROL = f"{P}-g-alice", f"{P}-g-bob", f"{P}-carol-1"
G_DAVE = f"{P}-g-dave"
ALL_TOPICS = (A, B, PRE_X, PRE_Y)
ALICE, BOB, CAROL = "User:alice", "User:bob", "User:carol"

GRANTS = [
    acl(ResourceType.TOPIC, A, AclOperation.READ, principal=ALICE),
    acl(ResourceType.GROUP, G_ALICE, AclOperation.READ, principal=ALICE),
    # DESCRIBE on bob's group (FindCoordinator answers) is not READ
    acl(ResourceType.GROUP, G_BOB, AclOperation.DESCRIBE, principal=ALICE),
    acl(ResourceType.TOPIC, f"{P}-pre-", AclOperation.READ, pattern=PRE, principal=ALICE),
    acl(ResourceType.TOPIC, PRE_X, AclOperation.READ, DENY, principal=ALICE),  # deny beats allow
    acl(ResourceType.TOPIC, B, AclOperation.READ, principal=BOB),
    acl(ResourceType.GROUP, G_BOB, AclOperation.READ, principal=BOB),
    acl(ResourceType.TOPIC, f"{P}-pre-", AclOperation.ALL, pattern=PRE, principal=CAROL),
    acl(ResourceType.GROUP, f"{P}-carol-", AclOperation.READ, pattern=PRE, principal=CAROL),
    acl(ResourceType.TOPIC, A, AclOperation.READ, principal=DAVE),
    acl(ResourceType.GROUP, G_DAVE, AclOperation.READ, principal=DAVE),
]


@dataclass
class Env:
    broker: BrokerProcess
    ports: dict[str, int]
    certs: dict[str, Path]

    def conf(self, who: str, **extra: Any) -> dict[str, Any]:
        c: dict[str, Any]
        if who in USERS:
            c = sasl_conf(f"127.0.0.1:{self.ports['SASL_PLAINTEXT']}", who, USERS[who])
        else:
            listener = "MTLS" if who == "carol" else "MTLSDN"
            c = {"bootstrap.servers": f"127.0.0.1:{self.ports[listener]}",
                 "security.protocol": "SSL", "ssl.ca.location": str(self.certs["ca.pem"]),
                 "ssl.certificate.location": str(self.certs[f"client-{who}-cert.pem"]),
                 "ssl.key.location": str(self.certs[f"client-{who}-key.pem"])}
        c.update(extra)
        return c

    def admin(self, who: str) -> AdminClient:
        return AdminClient(self.conf(who))


def group_result_codes(fut: Any) -> set[int]:
    """A group offsets admin result's error: raised for the group, or per partition."""
    try:
        res = ok(fut)
    except KafkaException as e:
        return {int(e.args[0].code())}
    return {0 if tp.error is None else int(tp.error.code()) for tp in res.topic_partitions}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("acl-auth")
    certs = write_dev_certs(base / "certs", clients=("carol", "dave"))
    overrides = {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0,MTLS://127.0.0.1:0,MTLSDN://127.0.0.1:0",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,MTLS:SSL,MTLSDN:SSL",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        **pem_keystore(certs),
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.mtls.ssl.principal.mapping.rules":
            "RULE:^CN=([^,]+),OU=clients,O=headrace$/$1/L,DEFAULT",
        "listener.name.mtlsdn.ssl.client.auth": "required",
        **ACL_AUTHORIZER,
        "super.users": "User:admin",
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
    }
    with InProcessBroker(base / "data", overrides) as b:
        e = Env(b, listener_ports(b), certs)
        a = e.admin("admin")
        for f in a.create_topics([NewTopic(t, 1, 1) for t in ALL_TOPICS]).values():
            ok(f)
        p = Producer(e.conf("admin"))
        for t in ALL_TOPICS:
            for i in range(3):
                p.produce(t, f"{t}-{i}".encode())
        assert p.flush(15) == 0
        for f in a.create_acls(GRANTS).values():
            ok(f)
        # offsets of bob's group, committed by bob
        c = Consumer(e.conf("bob", **{"group.id": G_BOB, "enable.auto.commit": False}))
        try:
            c.commit(offsets=[TopicPartition(B, 0, 2)], asynchronous=False)
        finally:
            c.close()
        yield e


def consume(env: Env, who: str, topic: str) -> tuple[list[bytes], int | None]:
    """What ``who`` reads of ``topic`` from offset 0, subscribed in its own group (librdkafka
    reports a topic it may not describe as a consumer error only for subscriptions):
    (values, error code)."""
    own = {"alice": G_ALICE, "bob": G_BOB, "carol": G_CAROL, "dave": G_DAVE,
           "admin": f"{P}-admin"}
    c = Consumer(env.conf(who, **{"group.id": own[who], "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False}))
    try:
        c.subscribe([topic], on_assign=lambda c, ps: c.assign(
            [TopicPartition(p.topic, p.partition, 0) for p in ps]))
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is None:
                continue
            if m.error():
                return got, int(m.error().code())
            got.append(m.value())
            if len(got) == 3:
                return got, None
        return got, None
    finally:
        c.close()


def values(topic: str) -> list[bytes]:
    return [f"{topic}-{i}".encode() for i in range(3)]


def test_sasl_user_reads_a_not_b(env: Env) -> None:
    assert consume(env, "alice", A) == (values(A), None)
    assert consume(env, "alice", B) == ([], KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert consume(env, "bob", B) == (values(B), None)
    assert consume(env, "bob", A) == ([], KafkaError.TOPIC_AUTHORIZATION_FAILED)


def test_mtls_principals_from_rules_and_from_the_dn(env: Env) -> None:
    # carol: the rule maps her certificate to User:carol, who holds prefixed ALL
    assert consume(env, "carol", PRE_X) == (values(PRE_X), None)
    assert consume(env, "carol", A) == ([], KafkaError.TOPIC_AUTHORIZATION_FAILED)
    # dave: no rules, his principal is the DN, which holds READ on A
    assert consume(env, "dave", A) == (values(A), None)
    assert consume(env, "dave", B) == ([], KafkaError.TOPIC_AUTHORIZATION_FAILED)


def test_commit_needs_read_on_the_group(env: Env) -> None:
    assert commit(env.conf("alice", **{"group.id": G_BOB}), TopicPartition(A, 0, 1)) == \
        KafkaError.GROUP_AUTHORIZATION_FAILED
    assert commit(env.conf("alice", **{"group.id": G_ALICE}), TopicPartition(A, 0, 1)) == 0
    # carol: a group matching her prefixed group ACL
    assert commit(env.conf("carol", **{"group.id": G_CAROL}), TopicPartition(PRE_Y, 0, 2)) == 0


def test_no_create_no_delete(env: Env) -> None:
    for who in ("alice", "carol", "dave"):
        a = env.admin(who)
        name = f"{P}-new-{who}"
        assert code_of(a.create_topics([NewTopic(name, 1, 1)])[name]) == \
            KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert code_of(a.delete_topics([A])[A]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert env.admin("admin").list_topics(timeout=10).topics[A].error is None


def test_cannot_reset_or_delete_another_groups_offsets(env: Env) -> None:
    a = env.admin("alice")
    reset = ConsumerGroupTopicPartitions(G_BOB, [TopicPartition(B, 0, 0)])
    (fut,) = a.alter_consumer_group_offsets([reset]).values()
    # OffsetCommit answers per partition (librdkafka: the partition's error)
    assert group_result_codes(fut) == {KafkaError.GROUP_AUTHORIZATION_FAILED}
    # OffsetDelete (confluent-kafka's Python API has none: kafka-python's admin client)
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP
    from kafka.errors import GroupAuthorizationFailedError

    ka = KafkaAdminClient(bootstrap_servers=env.conf("alice")["bootstrap.servers"],
                          security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                          sasl_plain_username="alice", sasl_plain_password=USERS["alice"])
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            ka.delete_group_offsets(G_BOB, [KTP(B, 0)])
    finally:
        ka.close()
    # bob's offset is untouched
    bob = Consumer(env.conf("bob", **{"group.id": G_BOB, "enable.auto.commit": False}))
    try:
        assert bob.committed([TopicPartition(B, 0)], timeout=10)[0].offset == 2
    finally:
        bob.close()


def test_deny_beats_allow_and_prefixed_patterns(env: Env) -> None:
    # alice: prefixed ALLOW READ on "<P>-pre-", literal DENY READ on "<P>-pre-x"
    assert consume(env, "alice", PRE_Y) == (values(PRE_Y), None)
    assert consume(env, "alice", PRE_X) == ([], KafkaError.TOPIC_AUTHORIZATION_FAILED)
    # carol: prefixed ALL includes WRITE on every "<P>-pre-*" topic, nothing else
    p = Producer(env.conf("carol", **{"message.timeout.ms": 5000}))
    results: dict[str, int] = {}
    for t in (PRE_Y, A):
        p.produce(t, b"w", on_delivery=lambda e, m, t=t: results.__setitem__(
            t, 0 if e is None else int(e.code())))
    p.flush(15)
    assert results == {PRE_Y: 0, A: KafkaError.TOPIC_AUTHORIZATION_FAILED}


def test_super_user_may_do_everything(env: Env) -> None:
    assert consume(env, "admin", B) == (values(B), None)
    a = env.admin("admin")
    name = f"{P}-super"
    ok(a.create_topics([NewTopic(name, 1, 1)])[name])
    ok(a.delete_topics([name])[name])
    # and reset bob's offsets
    (fut,) = a.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(G_BOB, [TopicPartition(B, 0, 1)])]).values()
    ok(fut)
    assert "__consumer_offsets" in a.list_topics(timeout=10).topics


def test_internal_topics_closed(env: Env) -> None:
    for who in ("alice", "carol", "dave"):
        a = env.admin(who)
        md = a.list_topics(timeout=10)
        assert "__consumer_offsets" not in md.topics
        assert code_of(a.delete_topics(["__consumer_offsets"])["__consumer_offsets"]) == \
            KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert consume(env, "carol", "__consumer_offsets")[1] == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
