"""ACLs and SCRAM credentials end to end (issue 12, R-SEC-3): confluent-kafka's AdminClient
creates, describes and deletes ACLs and SCRAM users on a broker with Kafka's AclAuthorizer
configured, then, without super users, the ANONYMOUS principal (PLAINTEXT) is held to
those ACLs by every API with real clients. The brokers run in process (``tests/inproc.py``:
nothing here is killed; a restart is a graceful stop and a new broker on the same data
dir), the ``headrace users`` command as a process."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kio.schema.errors import ErrorCode

from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient
from tests.security_helpers import ACL_AUTHORIZER as AUTHZ
from tests.security_helpers import ANON, DENY, PRE, acl, code_of, commit, ok

pytestmark = pytest.mark.timeout(120)

P = f"acl-{uuid.uuid4().hex[:6]}"
TOPIC_A, TOPIC_B, PREFIXED_TOPIC = f"{P}-a", f"{P}-b", f"{P}-pre-x"
GROUP = f"{P}-group"


GRANTS = [
    acl(ResourceType.TOPIC, TOPIC_A, AclOperation.READ),
    acl(ResourceType.TOPIC, TOPIC_A, AclOperation.WRITE),
    acl(ResourceType.TOPIC, TOPIC_B, AclOperation.WRITE),
    acl(ResourceType.GROUP, GROUP, AclOperation.READ),
    # DESCRIBE only (FindCoordinator answers), not READ (OffsetCommit is refused)
    acl(ResourceType.GROUP, f"{P}-other", AclOperation.DESCRIBE),
    acl(ResourceType.TOPIC, f"{P}-pre-", AclOperation.ALL, pattern=PRE),
    acl(ResourceType.TOPIC, f"{P}-pre-x", AclOperation.WRITE, DENY),  # deny beats allow
    acl(ResourceType.BROKER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE),
]


def admin(b: InProcessBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """A broker where ANONYMOUS is first a super user (to set up topics and ACLs), then,
    restarted, an ordinary principal with only the ACLs of ``GRANTS``."""
    b = InProcessBroker(tmp_path_factory.mktemp("acl"), {
        **AUTHZ, "super.users": ANON, "auto.create.topics.enable": "false"})
    with b:
        a = admin(b)
        for f in a.create_topics([NewTopic(t, 1, 1) for t in (TOPIC_A, TOPIC_B,
                                                               PREFIXED_TOPIC)]).values():
            ok(f)
        p = Producer({"bootstrap.servers": b.bootstrap})
        for t in (TOPIC_A, TOPIC_B, PREFIXED_TOPIC):
            p.produce(t, b"seed")
        assert p.flush(15) == 0
        for f in a.create_acls(GRANTS).values():
            ok(f)
        b.stop()
        b.overrides["super.users"] = ""
        b.start()
        yield b


def test_acls_created_described_deleted_with_admin_client(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path, {**AUTHZ, "super.users": ANON}) as b:
        a = admin(b)
        mine = [acl(ResourceType.TOPIC, "t1", AclOperation.READ, principal="User:alice"),
                acl(ResourceType.GROUP, "g-", AclOperation.READ, pattern=PRE,
                    principal="User:alice"),
                acl(ResourceType.TOPIC, "t1", AclOperation.WRITE, DENY, principal="User:bob")]
        for f in a.create_acls(mine).values():
            ok(f)
        everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None,
                                      None, AclOperation.ANY, AclPermissionType.ANY)
        assert sorted(map(str, ok(a.describe_acls(everything)))) == sorted(map(str, mine))
        # MATCH: the ACLs that apply to group g-1
        match = AclBindingFilter(ResourceType.GROUP, "g-1", ResourcePatternType.MATCH, None,
                                 None, AclOperation.ANY, AclPermissionType.ANY)
        assert [str(x) for x in ok(a.describe_acls(match))] == [str(mine[1])]
        bob = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob",
                               None, AclOperation.ANY, AclPermissionType.ANY)
        (deleted,) = a.delete_acls([bob]).values()
        assert [str(x) for x in ok(deleted)] == [str(mine[2])]
        # a CLUSTER resource must be kafka-cluster (INVALID_REQUEST)
        (bad,) = a.create_acls([acl(ResourceType.BROKER, "other", AclOperation.ALTER)]).values()
        assert code_of(bad) == KafkaError.INVALID_REQUEST
        b.restart()  # stored: the same after a restart
        a = admin(b)
        assert sorted(map(str, ok(a.describe_acls(everything)))) == sorted(
            map(str, mine[:2]))


def test_scram_users_through_admin_client_and_cli(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path) as b:
        a = admin(b)
        ups = [UserScramCredentialUpsertion(
            "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"pw", b"salt"),
            UserScramCredentialUpsertion(
            "bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"pw", b"salt")]
        results = a.alter_user_scram_credentials(ups)
        ok(results["alice"])
        assert code_of(results["bob"]) == KafkaError.UNACCEPTABLE_CREDENTIAL
        described = ok(a.describe_user_scram_credentials())
        assert {u: [(i.mechanism, i.iterations) for i in d.scram_credential_infos]
                for u, d in described.items()} == {
            "alice": [(ScramMechanism.SCRAM_SHA_512, 8192)]}
        assert code_of(a.describe_user_scram_credentials(["nobody"])["nobody"]) == \
            KafkaError.RESOURCE_NOT_FOUND
        # the CLI: add, list, remove
        cli = [sys.executable, "-m", "headrace.cli", "users"]
        run = subprocess.run([*cli, "add", "carol", "--bootstrap-server", b.bootstrap,
                              "--password", "s3cret", "--mechanism", "SCRAM-SHA-256"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        listed = subprocess.run([*cli, "list", "--bootstrap-server", b.bootstrap],
                                capture_output=True, text=True, timeout=60).stdout
        assert "carol" in listed and "SCRAM-SHA-256" in listed and "alice" in listed
        ok(a.alter_user_scram_credentials([UserScramCredentialDeletion(
            "alice", ScramMechanism.SCRAM_SHA_512)])["alice"])
        run = subprocess.run([*cli, "remove", "carol", "--bootstrap-server", b.bootstrap],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert ok(a.describe_user_scram_credentials()) == {}
        # the password itself is nowhere in the data dir
        assert all(b"s3cret" not in f.read_bytes() for f in tmp_path.rglob("*") if f.is_file())


def consume(b: InProcessBroker, topic: str, group: str) -> tuple[list[bytes], KafkaError | None]:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        for _ in range(50):
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                return got, m.error()
            got.append(m.value())
            return got, None
        return got, None
    finally:
        c.close()


def test_anonymous_held_to_its_acls(secured: InProcessBroker) -> None:
    b = secured
    # read A (allowed), not B (only WRITE)
    assert consume(b, TOPIC_A, GROUP) == ([b"seed"], None)
    got, err = consume(b, TOPIC_B, GROUP)
    assert got == [] and err is not None
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # prefixed ALL allows reading ...-pre-x; DENY WRITE on it beats the prefixed ALL
    assert consume(b, PREFIXED_TOPIC, GROUP) == ([b"seed"], None)
    p = Producer({"bootstrap.servers": b.bootstrap, "message.timeout.ms": 5000})
    errors: list[KafkaError] = []
    p.produce(PREFIXED_TOPIC, b"x", on_delivery=lambda e, m: errors.append(e))
    p.produce(TOPIC_A, b"y", on_delivery=lambda e, m: errors.append(e))
    p.flush(15)
    codes = sorted(str(e.code()) if e else "ok" for e in errors)
    assert codes == sorted(["ok", str(KafkaError.TOPIC_AUTHORIZATION_FAILED)])


def test_groups_topics_and_cluster_refused(secured: InProcessBroker) -> None:
    b = secured
    a = admin(b)
    # a group with DESCRIBE but without READ: the commit is refused
    assert commit({"bootstrap.servers": b.bootstrap, "group.id": f"{P}-other"},
                  TopicPartition(TOPIC_A, 0, 1)) == KafkaError.GROUP_AUTHORIZATION_FAILED
    # its own group: allowed
    assert commit({"bootstrap.servers": b.bootstrap, "group.id": GROUP},
                  TopicPartition(TOPIC_A, 0, 1)) == 0
    # no CREATE, no DELETE
    assert code_of(a.create_topics([NewTopic(f"{P}-new", 1, 1)])[f"{P}-new"]) == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert code_of(a.delete_topics([TOPIC_A])[TOPIC_A]) == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    # nor ACL administration: CreateAcls needs CLUSTER ALTER, DescribeAcls CLUSTER DESCRIBE
    # (librdkafka drops DescribeAcls' top-level error, so that one is read on the wire)
    (created,) = a.create_acls([acl(ResourceType.TOPIC, TOPIC_B, AclOperation.READ)]).values()
    assert code_of(created) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    with WireClient.to(b.bootstrap, timeout_s=10) as wc:
        r = wc.request(29, 3, {"resource_type_filter": 1, "resource_name_filter": None,
                               "pattern_type_filter": 1, "principal_filter": None,
                               "host_filter": None, "operation": 1, "permission_type": 1})
        assert r.error_code == ErrorCode.cluster_authorization_failed and not r.resources
    # Metadata lists only what it may describe; internal topics stay closed
    names = set(a.list_topics(timeout=10).topics)
    assert {TOPIC_A, TOPIC_B, PREFIXED_TOPIC} <= names
    assert "__consumer_offsets" not in names


def test_kafka_python_and_aiokafka_refused_too(secured: InProcessBroker) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import TopicAuthorizationFailedError
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    from kafka.errors import TopicAuthorizationFailedError as KTopicAuthError

    kc = KafkaConsumer(bootstrap_servers=b_(secured), auto_offset_reset="earliest",
                       enable_auto_commit=False)
    try:
        kc.assign([KTP(TOPIC_B, 0)])
        with pytest.raises(KTopicAuthError):
            for _ in range(50):
                kc.poll(timeout_ms=200)
        kc.assign([KTP(TOPIC_A, 0)])
        kc.seek(KTP(TOPIC_A, 0), 0)
        records = kc.poll(timeout_ms=5000)
        assert [r.value for rs in records.values() for r in rs][:1] == [b"seed"]
    finally:
        kc.close()

    async def aio() -> None:
        c = AIOKafkaConsumer(bootstrap_servers=b_(secured), auto_offset_reset="earliest",
                             enable_auto_commit=False)
        await c.start()
        try:
            from aiokafka import TopicPartition as ATP

            c.assign([ATP(TOPIC_B, 0)])
            with pytest.raises(TopicAuthorizationFailedError):
                await asyncio.wait_for(c.getone(), 10)
        finally:
            await c.stop()

    asyncio.run(aio())


def b_(b: InProcessBroker) -> str:
    return b.bootstrap
