"""ACLs and SCRAM credentials in ZooKeeper (issue 12): Kafka's znodes and change
notifications, and a second store (another broker) seeing every change through them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from kazoo.client import KazooClient

from headrace.cluster import zk_layout as L
from headrace.cluster.zk_store import ZkMetadataStore
from headrace.cluster.zookeeper_server import ZooKeeperServer
from headrace.security.acl import (
    AccessControlEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from headrace.security.scram import format_credential, from_password
from tests.integration.test_zk_store import make_store, until
from tests.zk import chroot, zookeeper  # noqa: F401

pytestmark = pytest.mark.timeout(60)

READ = AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)
DENY = AccessControlEntry("User:bob", "*", AclOperation.ALL, AclPermissionType.DENY)
TOPIC_A = ResourcePattern(ResourceType.TOPIC, "a", PatternType.LITERAL)
PREFIX = ResourcePattern(ResourceType.TOPIC, "fin-", PatternType.PREFIXED)


@pytest.fixture
async def setup(zookeeper: ZooKeeperServer  # noqa: F811
                ) -> AsyncIterator[tuple[str, ZkMetadataStore, ZkMetadataStore]]:
    connect = chroot(zookeeper)
    a, b = make_store(connect, 1), make_store(connect, 2)
    await a.start()
    await b.start()
    try:
        yield connect, a, b
    finally:
        a.close()
        b.close()


async def test_acls_in_kafkas_znodes_seen_by_every_broker(
        setup: tuple[str, ZkMetadataStore, ZkMetadataStore]) -> None:
    connect, a, b = setup
    after = await asyncio.to_thread(a.change_acls, TOPIC_A, frozenset({READ, DENY}),
                                    frozenset())
    assert after == {READ, DENY}
    a.install_acls(TOPIC_A, after)
    await asyncio.to_thread(a.change_acls, PREFIX, frozenset({READ}), frozenset())
    await until(lambda: b.acl_index.get(TOPIC_A) == {READ, DENY}
                and b.acl_index.get(PREFIX) == {READ})
    # the znodes are Kafka's
    zk = KazooClient(hosts=connect)
    zk.start()
    try:
        data, _ = zk.get("/kafka-acl/Topic/a")
        assert {(x["principal"], x["operation"], x["permissionType"], x["host"])
                for x in json.loads(data)["acls"]} == {("User:alice", "Read", "Allow", "*"),
                                                       ("User:bob", "All", "Deny", "*")}
        assert zk.exists("/kafka-acl-extended/prefixed/Topic/fin-") is not None
        changes = zk.get_children("/kafka-acl-changes")
        assert [zk.get(f"/kafka-acl-changes/{c}")[0] for c in changes] == [b"Topic:a"]
        assert len(zk.get_children("/kafka-acl-extended-changes")) == 1
        # a change written by another program (Kafka's tools) is picked up the same way
        zk.set("/kafka-acl/Topic/a", L.encode_acls(frozenset({READ})))
        zk.create("/kafka-acl-changes/acl_changes_", b"Topic:a", sequence=True)
        await until(lambda: a.acl_index.get(TOPIC_A) == {READ}
                    and b.acl_index.get(TOPIC_A) == {READ})
        # the last ACL removed: the znode goes
        await asyncio.to_thread(b.change_acls, TOPIC_A, frozenset(), frozenset({READ}))
        assert zk.exists("/kafka-acl/Topic/a") is None
        await until(lambda: not a.acl_index.get(TOPIC_A))
    finally:
        zk.stop()
        zk.close()
    # a store started now reads everything
    c = make_store(connect, 3)
    await c.start()
    try:
        assert dict(c.acl_index.resources()) == {PREFIX: {READ}}
    finally:
        c.close()


async def test_scram_credentials_in_config_users(
        setup: tuple[str, ZkMetadataStore, ZkMetadataStore]) -> None:
    connect, a, b = setup
    cred = from_password("SCRAM-SHA-512", "pw", 4096)
    zk = KazooClient(hosts=connect)
    zk.start()
    try:
        # another config of the user (a quota) is kept
        zk.create("/config/users/alice", L.encode_config({"producer_byte_rate": "1024"}),
                  makepath=True)
        await asyncio.to_thread(a.change_credentials, "alice", {"SCRAM-SHA-512": cred}, set())
        data, _ = zk.get("/config/users/alice")
        assert json.loads(data) == {"version": 1, "config": {
            "SCRAM-SHA-512": format_credential(cred), "producer_byte_rate": "1024"}}
        changes = zk.get_children("/config/changes")
        assert [json.loads(zk.get(f"/config/changes/{n}")[0]) for n in changes] == [
            {"version": 2, "entity_path": "users/alice"}]
        await until(lambda: b.user_credentials().get("alice") == {"SCRAM-SHA-512": cred})
        await asyncio.to_thread(b.change_credentials, "alice", {}, {"SCRAM-SHA-512"})
        await until(lambda: "alice" not in a.user_credentials())
        assert json.loads(zk.get("/config/users/alice")[0])["config"] == {
            "producer_byte_rate": "1024"}
    finally:
        zk.stop()
        zk.close()
