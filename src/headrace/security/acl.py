"""Kafka's ACL model and authorizer semantics (``AclAuthorizer`` / ``StandardAuthorizer``). PURE.

The rules, as Kafka has them:

- An ACL binding is a resource pattern (resource type, name, pattern type LITERAL or
  PREFIXED; a LITERAL name ``*`` matches every resource of its type) and an entry
  (principal ``Type:name`` or ``User:*``, host or ``*``, operation or ALL, ALLOW or DENY).
- ``authorize(principal, host, op, type, name)``: a super user may do everything; otherwise
  the ACLs that *match the resource* are its literal name's, the type's ``*`` and every
  PREFIXED pattern that is a prefix of the name. If there are none at all and
  ``allow.everyone.if.no.acl.found`` is set, the request is allowed. Otherwise a matching
  DENY (same principal or ``User:*``, same host or ``*``, same operation or ALL) refuses it,
  and else a matching ALLOW of the operation, or of one that implies it, allows it:
  DESCRIBE is implied by READ, WRITE, DELETE and ALTER; DESCRIBE_CONFIGS by ALTER_CONFIGS
  (``AclAuthorizer.allowAclExists``). Anything else is refused. A DENY is never implied:
  DENY READ does not deny DESCRIBE.
- Filters (DescribeAcls, DeleteAcls) match as ``ResourcePatternFilter.matches`` and
  ``AccessControlEntryFilter.matches``: ANY matches every value, a null name, principal
  or host everything; pattern type MATCH matches the literal name, the literal ``*`` and
  every prefixed pattern the name starts with.

Lookup is indexed, never a scan of all ACLs: literal patterns by (type, name), prefixed
patterns by (type, name) together with the set of prefix lengths present per type, so a
check costs one dict lookup per distinct prefix length.

The numeric codes are those of the wire (``ResourceType``, ``PatternType``,
``AclOperation``, ``AclPermissionType`` in Kafka's clients).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from headrace.security.principal import Principal


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


WILDCARD_RESOURCE = "*"
WILDCARD_HOST = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"

# Kafka's ZooKeeper names (``SecurityUtils.resourceTypeName``, ``operationName``, ...)
RESOURCE_TYPE_NAMES = {
    ResourceType.TOPIC: "Topic", ResourceType.GROUP: "Group", ResourceType.CLUSTER: "Cluster",
    ResourceType.TRANSACTIONAL_ID: "TransactionalId",
    ResourceType.DELEGATION_TOKEN: "DelegationToken", ResourceType.USER: "User",
}
OPERATION_NAMES = {
    AclOperation.ALL: "All", AclOperation.READ: "Read", AclOperation.WRITE: "Write",
    AclOperation.CREATE: "Create", AclOperation.DELETE: "Delete", AclOperation.ALTER: "Alter",
    AclOperation.DESCRIBE: "Describe", AclOperation.CLUSTER_ACTION: "ClusterAction",
    AclOperation.DESCRIBE_CONFIGS: "DescribeConfigs",
    AclOperation.ALTER_CONFIGS: "AlterConfigs",
    AclOperation.IDEMPOTENT_WRITE: "IdempotentWrite",
    AclOperation.CREATE_TOKENS: "CreateTokens", AclOperation.DESCRIBE_TOKENS: "DescribeTokens",
}
PERMISSION_NAMES = {AclPermissionType.ALLOW: "Allow", AclPermissionType.DENY: "Deny"}

# an ALLOW of any of these allows the key (AclAuthorizer.allowAclExists)
IMPLIED_BY = {
    AclOperation.DESCRIBE: (AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                            AclOperation.DELETE, AclOperation.ALTER),
    AclOperation.DESCRIBE_CONFIGS: (AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS),
}

# Kafka's ``AclEntry.supportedOperations``: what authorized_operations reports per type
SUPPORTED_OPERATIONS = {
    ResourceType.TOPIC: (AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE,
                         AclOperation.DESCRIBE, AclOperation.DELETE, AclOperation.ALTER,
                         AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE),
    ResourceType.CLUSTER: (AclOperation.CREATE, AclOperation.CLUSTER_ACTION,
                           AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
                           AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
                           AclOperation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE),
    ResourceType.DELEGATION_TOKEN: (AclOperation.DESCRIBE,),
    ResourceType.USER: (AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS),
}

AUTHORIZER_CLASS_NAMES = frozenset({
    "kafka.security.authorizer.AclAuthorizer",
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.auth.SimpleAclAuthorizer",
})


class AclError(ValueError):
    """A binding or filter that Kafka refuses (INVALID_REQUEST in the handlers)."""


def _enum(cls: type[enum.IntEnum], code: int) -> enum.IntEnum:
    try:
        return cls(code)
    except ValueError:
        return cls(0)  # UNKNOWN, as Kafka's fromCode


@dataclass(frozen=True, slots=True, order=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType

    def __str__(self) -> str:
        return (f"ResourcePattern(resourceType={self.resource_type.name}, name={self.name}, "
                f"patternType={self.pattern_type.name})")


def _known(resource_type: int, pattern_type: int, operation: int, permission_type: int,
           unknown: str) -> tuple[ResourceType, PatternType, AclOperation, AclPermissionType]:
    """A binding's or filter's four enums from wire codes; AclError(``unknown``) if any of
    them is UNKNOWN (a code Kafka does not know, or 0)."""
    rt = ResourceType(_enum(ResourceType, resource_type))
    pt = PatternType(_enum(PatternType, pattern_type))
    op = AclOperation(_enum(AclOperation, operation))
    perm = AclPermissionType(_enum(AclPermissionType, permission_type))
    if rt is ResourceType.UNKNOWN or pt is PatternType.UNKNOWN or op is AclOperation.UNKNOWN \
            or perm is AclPermissionType.UNKNOWN:
        raise AclError(unknown)
    return rt, pt, op, perm


@dataclass(frozen=True, slots=True, order=True)
class AccessControlEntry:
    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry


def binding(resource_type: int, name: str, pattern_type: int, principal: str, host: str,
            operation: int, permission_type: int) -> AclBinding:
    """A binding from wire codes, validated as Kafka validates a creatable ACL; AclError."""
    rt, pt, op, perm = _known(resource_type, pattern_type, operation, permission_type,
                              "ACL binding contains unknown elements")
    if rt is ResourceType.ANY or pt in (PatternType.ANY, PatternType.MATCH) \
            or op is AclOperation.ANY or perm is AclPermissionType.ANY:
        raise AclError("ACL binding contains non-specific elements (ANY or MATCH)")
    if rt is ResourceType.CLUSTER and name != CLUSTER_NAME:
        raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if not name:
        raise AclError("Invalid empty resource name")
    try:
        Principal.parse(principal)
    except ValueError as e:
        raise AclError(str(e)) from None
    return AclBinding(ResourcePattern(rt, name, pt), AccessControlEntry(principal, host, op, perm))


# ---------------------------------------------------------------- filters
@dataclass(frozen=True, slots=True)
class ResourcePatternFilter:
    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType

    def matches(self, p: ResourcePattern) -> bool:
        if self.resource_type is not ResourceType.ANY and self.resource_type is not p.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) \
                and self.pattern_type is not p.pattern_type:
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, p.pattern_type):
            return self.name == p.name
        if p.pattern_type is PatternType.LITERAL:
            return self.name == p.name or p.name == WILDCARD_RESOURCE
        return self.name.startswith(p.name)  # PREFIXED under MATCH


@dataclass(frozen=True, slots=True)
class AccessControlEntryFilter:
    principal: str | None
    host: str | None
    operation: AclOperation
    permission_type: AclPermissionType

    def matches(self, e: AccessControlEntry) -> bool:
        if self.principal is not None and self.principal != e.principal:
            return False
        if self.host is not None and self.host != e.host:
            return False
        if self.operation is not AclOperation.ANY and self.operation is not e.operation:
            return False
        return (self.permission_type is AclPermissionType.ANY
                or self.permission_type is e.permission_type)


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    pattern: ResourcePatternFilter
    entry: AccessControlEntryFilter

    def matches(self, b: AclBinding) -> bool:
        return self.pattern.matches(b.pattern) and self.entry.matches(b.entry)


ANY_FILTER = AclBindingFilter(
    ResourcePatternFilter(ResourceType.ANY, None, PatternType.ANY),
    AccessControlEntryFilter(None, None, AclOperation.ANY, AclPermissionType.ANY))


def binding_filter(resource_type: int, name: str | None, pattern_type: int,
                   principal: str | None, host: str | None, operation: int,
                   permission_type: int) -> AclBindingFilter:
    """A filter from wire codes; AclError if it has UNKNOWN elements (Kafka's
    ``AclBindingFilter.isUnknown``: such a filter is refused)."""
    rt, pt, op, perm = _known(resource_type, pattern_type, operation, permission_type,
                              "The filter contains UNKNOWN elements")
    return AclBindingFilter(ResourcePatternFilter(rt, name, pt),
                            AccessControlEntryFilter(principal, host, op, perm))


# ---------------------------------------------------------------- the index
class AclIndex:
    """Every ACL, by resource pattern, with the lookups the authorizer needs. The metadata
    stores keep one current (``set_acls`` per changed resource); not thread-safe (the
    broker's event loop owns it)."""

    def __init__(self) -> None:
        self._acls: dict[ResourcePattern, frozenset[AccessControlEntry]] = {}
        self._literal: dict[tuple[ResourceType, str], frozenset[AccessControlEntry]] = {}
        self._prefixed: dict[tuple[ResourceType, str], frozenset[AccessControlEntry]] = {}
        # per type: how many prefixed patterns have each name length
        self._prefix_lengths: dict[ResourceType, dict[int, int]] = {}
        self._per_type: dict[ResourceType, int] = {}
        self.version = 0  # bumped by every change (caches built on the index use it)

    def __len__(self) -> int:
        return sum(len(e) for e in self._acls.values())

    def resources(self) -> Mapping[ResourcePattern, frozenset[AccessControlEntry]]:
        return self._acls

    def get(self, pattern: ResourcePattern) -> frozenset[AccessControlEntry]:
        return self._acls.get(pattern, frozenset())

    def set_acls(self, pattern: ResourcePattern, entries: Iterable[AccessControlEntry]) -> None:
        """Replace the ACLs of one resource pattern (none: the pattern is gone)."""
        new = frozenset(entries)
        old = self._acls.get(pattern, frozenset())
        if new == old:
            return
        self.version += 1
        key = (pattern.resource_type, pattern.name)
        self._per_type[pattern.resource_type] = (
            self._per_type.get(pattern.resource_type, 0) + len(new) - len(old))
        table = self._literal if pattern.pattern_type is PatternType.LITERAL else self._prefixed
        if pattern.pattern_type is PatternType.PREFIXED:
            lengths = self._prefix_lengths.setdefault(pattern.resource_type, {})
            n = len(pattern.name)
            if old and not new:
                lengths[n] -= 1
                if not lengths[n]:
                    del lengths[n]
            elif new and not old:
                lengths[n] = lengths.get(n, 0) + 1
        if new:
            self._acls[pattern] = new
            table[key] = new
        else:
            self._acls.pop(pattern, None)
            table.pop(key, None)

    def clear(self) -> None:
        for pattern in list(self._acls):
            self.set_acls(pattern, ())

    def bindings(self, flt: AclBindingFilter = ANY_FILTER) -> Iterator[AclBinding]:
        """Every binding the filter matches (Describe/DeleteAcls), in pattern order."""
        pf = flt.pattern
        if (pf.resource_type is not ResourceType.ANY and pf.name is not None
                and pf.pattern_type in (PatternType.LITERAL, PatternType.PREFIXED)):
            patterns: Iterable[ResourcePattern] = [ResourcePattern(
                pf.resource_type, pf.name, pf.pattern_type)]
        else:
            patterns = sorted(self._acls)
        for p in patterns:
            if not pf.matches(p):
                continue
            for e in sorted(self._acls.get(p, ())):
                if flt.entry.matches(e):
                    yield AclBinding(p, e)

    def matching(self, resource_type: ResourceType, name: str
                 ) -> list[frozenset[AccessControlEntry]]:
        """The ACL sets that apply to one resource: its literal name, the type's literal
        ``*`` and every prefixed pattern it starts with."""
        out = []
        for key in ((resource_type, name), (resource_type, WILDCARD_RESOURCE)):
            found = self._literal.get(key)
            if found:
                out.append(found)
            if name == WILDCARD_RESOURCE:
                break
        lengths = self._prefix_lengths.get(resource_type)
        if lengths:
            for n in lengths:
                if n <= len(name):
                    found = self._prefixed.get((resource_type, name[:n]))
                    if found:
                        out.append(found)
        return out

    def count_for_type(self, resource_type: ResourceType) -> int:
        return self._per_type.get(resource_type, 0)


# ---------------------------------------------------------------- the authorizer
def parse_super_users(text: str) -> frozenset[str]:
    """``super.users``: principals separated by semicolons ("User:a;User:b")."""
    out = set()
    for item in text.split(";"):
        item = item.strip()
        if item:
            out.add(str(Principal.parse(item)))
    return frozenset(out)


def _entry_matches(e: AccessControlEntry, principal: str, host: str,
                   operation: AclOperation, permission: AclPermissionType) -> bool:
    return (e.permission_type is permission
            and (e.principal == principal or e.principal == WILDCARD_PRINCIPAL)
            and (e.operation is operation or e.operation is AclOperation.ALL)
            and (e.host == host or e.host == WILDCARD_HOST))


class Authorizer:
    """Kafka's authorizer decisions over an ``AclIndex`` (see the module docstring)."""

    def __init__(self, index: AclIndex, super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.index = index
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found

    def is_super_user(self, principal: Principal | str) -> bool:
        return str(principal) in self.super_users

    def authorize(self, principal: Principal | str, host: str, operation: AclOperation,
                  resource_type: ResourceType, name: str) -> bool:
        p = str(principal)
        if p in self.super_users:
            return True
        acls = self.index.matching(resource_type, name)
        if not acls:
            return self.allow_everyone_if_no_acl_found
        for entries in acls:
            for e in entries:
                if _entry_matches(e, p, host, operation, AclPermissionType.DENY):
                    return False
        allowing = IMPLIED_BY.get(operation, (operation,))
        for entries in acls:
            for e in entries:
                for op in allowing:
                    if _entry_matches(e, p, host, op, AclPermissionType.ALLOW):
                        return True
        return False

    def authorize_by_resource_type(self, principal: Principal | str, host: str,
                                   operation: AclOperation,
                                   resource_type: ResourceType) -> bool:
        """Whether ``operation`` is allowed on at least one resource of the type (Kafka's
        ``Authorizer.authorizeByResourceType``: an ALLOW on some literal or prefixed
        pattern that no DENY covers; a DENY on the literal ``*`` refuses all)."""
        p = str(principal)
        if p in self.super_users:
            return True
        if self.allow_everyone_if_no_acl_found and not self.index.count_for_type(resource_type):
            return True
        deny_literal: set[str] = set()
        deny_prefix: set[str] = set()
        allow_literal: set[str] = set()
        allow_prefix: set[str] = set()
        for pattern, entries in self.index.resources().items():
            if pattern.resource_type is not resource_type:
                continue
            for e in entries:
                if not ((e.principal == p or e.principal == WILDCARD_PRINCIPAL)
                        and (e.operation is operation or e.operation is AclOperation.ALL)
                        and (e.host == host or e.host == WILDCARD_HOST)):
                    continue
                deny = e.permission_type is AclPermissionType.DENY
                if pattern.pattern_type is PatternType.LITERAL:
                    if deny and pattern.name == WILDCARD_RESOURCE:
                        return False
                    (deny_literal if deny else allow_literal).add(pattern.name)
                else:
                    (deny_prefix if deny else allow_prefix).add(pattern.name)
        if not allow_literal and not allow_prefix:
            return False

        def denied_by_prefix(name: str) -> bool:
            return any(name.startswith(d) for d in deny_prefix)

        if any(n not in deny_literal and not denied_by_prefix(n) for n in allow_literal):
            return True
        return any(not denied_by_prefix(n) for n in allow_prefix)

    def authorized_operations(self, principal: Principal | str, host: str,
                              resource_type: ResourceType, name: str) -> int:
        """Kafka's bit field of the supported operations allowed on the resource
        (``Utils.to32BitField``: bit ``code`` set for each)."""
        bits = 0
        for op in SUPPORTED_OPERATIONS.get(resource_type, ()):
            if self.authorize(principal, host, op, resource_type, name):
                bits |= 1 << int(op)
        return bits


def operations_from_bits(bits: int) -> set[AclOperation]:
    return {op for op in AclOperation if op > 0 and bits & (1 << int(op))}
