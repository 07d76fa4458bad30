"""ACLs and SCRAM credentials in the metadata store (issue 12): the SQLite store's round
trip across a reopen, and Kafka's ZooKeeper JSON for ACLs, change notifications and
users (zk_layout, pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.cluster import zk_layout as L
from headrace.metadata.store import BrokerInfo, LocalMetadataStore
from headrace.security.acl import (
    AccessControlEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from headrace.security.scram import from_password

READ = AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)
DENY_WRITE = AccessControlEntry("User:*", "10.0.0.1", AclOperation.WRITE,
                                AclPermissionType.DENY)
TOPIC_A = ResourcePattern(ResourceType.TOPIC, "a", PatternType.LITERAL)
PREFIX = ResourcePattern(ResourceType.GROUP, "team-", PatternType.PREFIXED)


def open_store(path: Path) -> LocalMetadataStore:
    return LocalMetadataStore(path, BrokerInfo(0, "127.0.0.1", 9092))


def test_sqlite_acls_and_credentials_survive_a_reopen(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    assert store.change_acls(TOPIC_A, frozenset({READ, DENY_WRITE}), frozenset()) == {
        READ, DENY_WRITE}
    store.change_acls(PREFIX, frozenset({READ}), frozenset())
    store.change_acls(TOPIC_A, frozenset(), frozenset({DENY_WRITE}))
    cred = from_password("SCRAM-SHA-512", "secret", 8192)
    cred256 = from_password("SCRAM-SHA-256", "other")
    store.change_credentials("alice", {"SCRAM-SHA-512": cred, "SCRAM-SHA-256": cred256}, set())
    store.change_credentials("alice", {}, {"SCRAM-SHA-256"})
    store.change_credentials("bob", {"SCRAM-SHA-256": cred256}, set())
    store.change_credentials("bob", {}, {"SCRAM-SHA-256"})
    store.close()
    store = open_store(tmp_path)
    assert dict(store.acl_index.resources()) == {TOPIC_A: {READ}, PREFIX: {READ}}
    assert store.user_credentials() == {"alice": {"SCRAM-SHA-512": cred}}
    # the last ACL removed: the resource is gone, in memory and on disk
    store.change_acls(PREFIX, frozenset(), frozenset({READ}))
    store.close()
    store = open_store(tmp_path)
    assert list(store.acl_index.resources()) == [TOPIC_A]
    # no password in clear anywhere in the database
    assert b"secret" not in (tmp_path / LocalMetadataStore.DB_NAME).read_bytes()
    store.close()


def test_zk_acl_json_is_kafkas() -> None:
    assert L.acl_path(TOPIC_A) == "/kafka-acl/Topic/a"
    assert L.acl_path(PREFIX) == "/kafka-acl-extended/prefixed/Group/team-"
    data = L.encode_acls(frozenset({READ}))
    assert data == (b'{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow",'
                    b'"operation":"Read","host":"*"}]}')
    assert L.decode_acls("x", data) == {READ}
    # what Kafka 3.x writes (its field order)
    kafka = (b'{"version":1,"acls":[{"principal":"User:*","permissionType":"Deny",'
             b'"operation":"Write","host":"10.0.0.1"},{"principal":"User:alice",'
             b'"permissionType":"Allow","operation":"IdempotentWrite","host":"*"}]}')
    assert L.decode_acls("x", kafka) == {DENY_WRITE, AccessControlEntry(
        "User:alice", "*", AclOperation.IDEMPOTENT_WRITE, AclPermissionType.ALLOW)}
    with pytest.raises(L.LayoutError):
        L.decode_acls("x", b'{"version":1,"acls":[{"principal":"User:a"}]}')


def test_zk_change_notifications() -> None:
    assert L.encode_acl_change(TOPIC_A) == b"Topic:a"
    assert L.decode_acl_change(False, b"Topic:a") == TOPIC_A
    ext = L.encode_acl_change(PREFIX)
    assert ext == (b'{"version":1,"resourceType":"Group","name":"team-",'
                   b'"patternType":"PREFIXED"}')
    assert L.decode_acl_change(True, ext) == PREFIX
    with pytest.raises(L.LayoutError):
        L.decode_acl_change(False, b"Nonsense:a")
    assert L.sequence_number("acl_changes_0000000042") == 42
    assert L.sequence_number("junk") == -1


def test_zk_user_config_and_change() -> None:
    assert L.user_path("alice") == "/config/users/alice"
    assert L.user_path("a b@c*") == "/config/users/a%20b%40c%2A"
    assert L.desanitize("a%20b%40c%2A") == "a b@c*"
    change = L.encode_user_change("a b")
    assert change == b'{"version":2,"entity_path":"users/a%20b"}'
    assert L.decode_user_change(change) == "a b"
    assert L.decode_user_change(b'{"version":2,"entity_path":"topics/t"}') is None
    assert L.decode_user_change(
        b'{"version":1,"entity_type":"users","entity_name":"bob"}') == "bob"
