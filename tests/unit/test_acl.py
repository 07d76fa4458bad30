"""Kafka's authorizer semantics (R-SEC-3): headrace.security.acl, pure."""

from __future__ import annotations

import pytest

from headrace.security import acl
from headrace.security.acl import (
    AccessControlEntry,
    AclIndex,
    AclOperation,
    AclPermissionType,
    Authorizer,
    PatternType,
    ResourcePattern,
    ResourceType,
)

ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
Op = AclOperation
ALICE = "User:alice"


def index(*acls: tuple[ResourceType, str, PatternType, str, str, Op, AclPermissionType]
          ) -> AclIndex:
    idx = AclIndex()
    for rt, name, pt, principal, host, op, perm in acls:
        p = ResourcePattern(rt, name, pt)
        idx.set_acls(p, idx.get(p) | {AccessControlEntry(principal, host, op, perm)})
    return idx


def test_no_acl_refused_unless_allow_everyone() -> None:
    idx = index((TOPIC, "other", LIT, ALICE, "*", Op.READ, ALLOW))
    assert not Authorizer(idx).authorize(ALICE, "1.2.3.4", Op.READ, TOPIC, "t")
    assert Authorizer(idx, allow_everyone_if_no_acl_found=True).authorize(
        ALICE, "1.2.3.4", Op.READ, TOPIC, "t")
    # an ACL on the resource for someone else: allow.everyone no longer applies
    idx = index((TOPIC, "t", LIT, "User:bob", "*", Op.READ, ALLOW))
    assert not Authorizer(idx, allow_everyone_if_no_acl_found=True).authorize(
        ALICE, "h", Op.READ, TOPIC, "t")


def test_literal_allow_and_principal_host_matching() -> None:
    idx = index((TOPIC, "a", LIT, ALICE, "10.0.0.1", Op.READ, ALLOW),
                (TOPIC, "b", LIT, "User:*", "*", Op.WRITE, ALLOW))
    a = Authorizer(idx)
    assert a.authorize(ALICE, "10.0.0.1", Op.READ, TOPIC, "a")
    assert not a.authorize(ALICE, "10.0.0.2", Op.READ, TOPIC, "a")  # other host
    assert not a.authorize("User:bob", "10.0.0.1", Op.READ, TOPIC, "a")
    assert not a.authorize(ALICE, "10.0.0.1", Op.WRITE, TOPIC, "a")  # other operation
    assert not a.authorize(ALICE, "10.0.0.1", Op.READ, GROUP, "a")  # other type
    assert a.authorize("User:anyone", "h", Op.WRITE, TOPIC, "b")  # User:* and host *


def test_deny_beats_allow_and_all() -> None:
    idx = index((TOPIC, "t", LIT, ALICE, "*", Op.ALL, ALLOW),
                (TOPIC, "t", LIT, "User:*", "*", Op.WRITE, DENY))
    a = Authorizer(idx)
    assert a.authorize(ALICE, "h", Op.READ, TOPIC, "t")
    assert a.authorize(ALICE, "h", Op.ALTER_CONFIGS, TOPIC, "t")
    assert not a.authorize(ALICE, "h", Op.WRITE, TOPIC, "t")
    # a DENY on the wildcard resource or a prefix denies too
    idx = index((TOPIC, "t", LIT, ALICE, "*", Op.READ, ALLOW),
                (TOPIC, "*", LIT, ALICE, "h2", Op.READ, DENY),
                (TOPIC, "secret-", PRE, ALICE, "*", Op.ALL, DENY),
                (TOPIC, "secret-x", LIT, ALICE, "*", Op.READ, ALLOW))
    a = Authorizer(idx)
    assert a.authorize(ALICE, "h1", Op.READ, TOPIC, "t")
    assert not a.authorize(ALICE, "h2", Op.READ, TOPIC, "t")
    assert not a.authorize(ALICE, "h1", Op.READ, TOPIC, "secret-x")


def test_implied_operations_and_deny_not_implied() -> None:
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        a = Authorizer(index((TOPIC, "t", LIT, ALICE, "*", op, ALLOW)))
        assert a.authorize(ALICE, "h", Op.DESCRIBE, TOPIC, "t"), op
        assert not a.authorize(ALICE, "h", Op.DESCRIBE_CONFIGS, TOPIC, "t")
    a = Authorizer(index((TOPIC, "t", LIT, ALICE, "*", Op.CREATE, ALLOW)))
    assert not a.authorize(ALICE, "h", Op.DESCRIBE, TOPIC, "t")
    a = Authorizer(index((TOPIC, "t", LIT, ALICE, "*", Op.ALTER_CONFIGS, ALLOW)))
    assert a.authorize(ALICE, "h", Op.DESCRIBE_CONFIGS, TOPIC, "t")
    assert not a.authorize(ALICE, "h", Op.DESCRIBE, TOPIC, "t")
    # DENY READ does not deny DESCRIBE (allowed through WRITE)
    a = Authorizer(index((TOPIC, "t", LIT, ALICE, "*", Op.WRITE, ALLOW),
                         (TOPIC, "t", LIT, ALICE, "*", Op.READ, DENY)))
    assert a.authorize(ALICE, "h", Op.DESCRIBE, TOPIC, "t")
    assert not a.authorize(ALICE, "h", Op.READ, TOPIC, "t")


def test_prefixed_and_wildcard_resources() -> None:
    idx = index((TOPIC, "fin-", PRE, ALICE, "*", Op.READ, ALLOW),
                (GROUP, "*", LIT, ALICE, "*", Op.READ, ALLOW))
    a = Authorizer(idx)
    assert a.authorize(ALICE, "h", Op.READ, TOPIC, "fin-ledger")
    assert a.authorize(ALICE, "h", Op.READ, TOPIC, "fin-")
    assert not a.authorize(ALICE, "h", Op.READ, TOPIC, "fi")
    assert not a.authorize(ALICE, "h", Op.READ, TOPIC, "hr-fin-x")
    assert a.authorize(ALICE, "h", Op.READ, GROUP, "any-group")
    # removing the prefixed pattern removes its effect (the length index too)
    idx.set_acls(ResourcePattern(TOPIC, "fin-", PRE), ())
    assert not a.authorize(ALICE, "h", Op.READ, TOPIC, "fin-ledger")
    assert len(idx) == 1


def test_super_users() -> None:
    supers = acl.parse_super_users("User:admin; User:ops ;")
    assert supers == {"User:admin", "User:ops"}
    a = Authorizer(index((TOPIC, "t", LIT, "User:*", "*", Op.ALL, DENY)), supers)
    assert a.authorize("User:admin", "h", Op.WRITE, TOPIC, "t")
    assert not a.authorize(ALICE, "h", Op.WRITE, TOPIC, "t")
    with pytest.raises(ValueError):
        acl.parse_super_users("admin")


def test_authorize_by_resource_type() -> None:
    a = Authorizer(index((TOPIC, "t", LIT, ALICE, "*", Op.WRITE, ALLOW)))
    assert a.authorize_by_resource_type(ALICE, "h", Op.WRITE, TOPIC)
    assert not a.authorize_by_resource_type("User:bob", "h", Op.WRITE, TOPIC)
    a = Authorizer(index((TOPIC, "t", LIT, ALICE, "*", Op.WRITE, ALLOW),
                         (TOPIC, "t", LIT, ALICE, "*", Op.WRITE, DENY)))
    assert not a.authorize_by_resource_type(ALICE, "h", Op.WRITE, TOPIC)
    a = Authorizer(index((TOPIC, "abc", PRE, ALICE, "*", Op.WRITE, ALLOW),
                         (TOPIC, "ab", PRE, ALICE, "*", Op.WRITE, DENY)))
    assert not a.authorize_by_resource_type(ALICE, "h", Op.WRITE, TOPIC)
    a = Authorizer(index((TOPIC, "x", LIT, ALICE, "*", Op.WRITE, ALLOW),
                         (TOPIC, "*", LIT, ALICE, "*", Op.WRITE, DENY)))
    assert not a.authorize_by_resource_type(ALICE, "h", Op.WRITE, TOPIC)


def test_authorized_operations_bits() -> None:
    a = Authorizer(index((TOPIC, "t", LIT, ALICE, "*", Op.READ, ALLOW),
                         (GROUP, "g", LIT, ALICE, "*", Op.ALL, ALLOW)))
    bits = a.authorized_operations(ALICE, "h", TOPIC, "t")
    assert acl.operations_from_bits(bits) == {Op.READ, Op.DESCRIBE}
    assert bits == (1 << 3) | (1 << 8)
    assert acl.operations_from_bits(a.authorized_operations(ALICE, "h", GROUP, "g")) == {
        Op.READ, Op.DESCRIBE, Op.DELETE}


def test_filters_match_as_kafka() -> None:
    idx = index((TOPIC, "a", LIT, ALICE, "*", Op.READ, ALLOW),
                (TOPIC, "*", LIT, ALICE, "*", Op.READ, ALLOW),
                (TOPIC, "a-", PRE, "User:bob", "h", Op.WRITE, DENY),
                (GROUP, "a", LIT, ALICE, "*", Op.READ, ALLOW))

    def names(rt: int, name: str | None, pt: int, principal: str | None = None,
              op: int = Op.ANY, perm: int = AclPermissionType.ANY) -> list[tuple[str, str]]:
        f = acl.binding_filter(rt, name, pt, principal, None, op, perm)
        return [(b.pattern.name, b.pattern.pattern_type.name) for b in idx.bindings(f)]

    assert names(ResourceType.ANY, None, PatternType.ANY) == [
        ("*", "LITERAL"), ("a", "LITERAL"), ("a-", "PREFIXED"), ("a", "LITERAL")]
    assert names(TOPIC, "a", PatternType.ANY) == [("a", "LITERAL")]
    assert names(TOPIC, "a-x", PatternType.MATCH) == [("*", "LITERAL"), ("a-", "PREFIXED")]
    assert names(TOPIC, "a", LIT) == [("a", "LITERAL")]
    assert names(TOPIC, "a-", PRE) == [("a-", "PREFIXED")]
    assert names(TOPIC, None, PRE) == [("a-", "PREFIXED")]
    assert names(TOPIC, None, PatternType.ANY, principal="User:bob") == [("a-", "PREFIXED")]
    assert names(TOPIC, None, PatternType.ANY, op=Op.WRITE, perm=DENY) == [("a-", "PREFIXED")]
    assert names(TOPIC, None, PatternType.ANY, op=Op.WRITE, perm=ALLOW) == []
    with pytest.raises(acl.AclError):
        acl.binding_filter(0, None, PatternType.ANY, None, None, Op.ANY, 1)


def test_binding_validation() -> None:
    b = acl.binding(TOPIC, "t", LIT, ALICE, "*", Op.READ, ALLOW)
    assert b.pattern == ResourcePattern(TOPIC, "t", LIT)
    for args, message in [
        ((CLUSTER, "c", LIT, ALICE, "*", Op.ALTER, ALLOW), "kafka-cluster"),
        ((TOPIC, "", LIT, ALICE, "*", Op.READ, ALLOW), "empty"),
        ((TOPIC, "t", PatternType.MATCH, ALICE, "*", Op.READ, ALLOW), "non-specific"),
        ((TOPIC, "t", LIT, ALICE, "*", Op.ANY, ALLOW), "non-specific"),
        ((99, "t", LIT, ALICE, "*", Op.READ, ALLOW), "unknown"),
        ((TOPIC, "t", LIT, "alice", "*", Op.READ, ALLOW), "principal"),
    ]:
        with pytest.raises(acl.AclError, match=message):
            acl.binding(*args)


def test_many_acls_lookup_is_indexed() -> None:
    """10,000 literal and 1,000 prefixed ACLs: a check looks at its own resource only."""
    idx = AclIndex()
    for i in range(10_000):
        idx.set_acls(ResourcePattern(TOPIC, f"t{i}", LIT),
                     {AccessControlEntry(f"User:u{i}", "*", Op.READ, ALLOW)})
    for i in range(1_000):
        idx.set_acls(ResourcePattern(TOPIC, f"p{i}-", PRE),
                     {AccessControlEntry(f"User:u{i}", "*", Op.WRITE, ALLOW)})
    assert len(idx.matching(TOPIC, "t77")) == 1
    assert len(idx.matching(TOPIC, "p7-x")) == 1
    a = Authorizer(idx)
    assert a.authorize("User:u77", "h", Op.READ, TOPIC, "t77")
    assert a.authorize("User:u7", "h", Op.WRITE, TOPIC, "p7-x")
    assert not a.authorize("User:u7", "h", Op.WRITE, TOPIC, "p77-x")
