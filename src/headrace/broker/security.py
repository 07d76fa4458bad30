"""The broker's authorization and credential store (issue 12): the shell around the pure
``security.acl.Authorizer`` and the metadata store's ACLs and SCRAM credentials.

``authorizer.class.name`` unset: no authorizer; every check passes, ACL APIs answer
SECURITY_DISABLED (Kafka's behaviour without an authorizer). Set: every handler asks
``allowed`` (one line each) with the operation Kafka checks; ``super.users`` and
``allow.everyone.if.no.acl.found`` as in Kafka.

Writes go to the metadata store (SQLite on the loop, ZooKeeper in a worker thread) and are
installed in the in-memory index before the handler answers, so a client's next request
sees them; the other brokers of a cluster re-read on the change notification.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from headrace.config import ConfigError
from headrace.metadata.store import AclEntries, UserCredentials
from headrace.security.acl import (
    SUPPORTED_OPERATIONS,
    AclOperation,
    Authorizer,
    ResourcePattern,
    ResourceType,
    parse_super_users,
)
from headrace.security.scram import ScramCredential

if TYPE_CHECKING:
    from headrace.broker.handlers.base import RequestContext
    from headrace.broker.server import Broker

UNKNOWN_AUTHORIZED_OPERATIONS = -2147483648  # Integer.MIN_VALUE: "not requested"
CLUSTER_NAME = "kafka-cluster"

TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
CLUSTER = ResourceType.CLUSTER
TRANSACTIONAL_ID = ResourceType.TRANSACTIONAL_ID

READ = AclOperation.READ
WRITE = AclOperation.WRITE
CREATE = AclOperation.CREATE
DELETE = AclOperation.DELETE
ALTER = AclOperation.ALTER
DESCRIBE = AclOperation.DESCRIBE
CLUSTER_ACTION = AclOperation.CLUSTER_ACTION
DESCRIBE_CONFIGS = AclOperation.DESCRIBE_CONFIGS
ALTER_CONFIGS = AclOperation.ALTER_CONFIGS
IDEMPOTENT_WRITE = AclOperation.IDEMPOTENT_WRITE


_P = ParamSpec("_P")
_T = TypeVar("_T")


async def store_change(clustered: bool, change: Callable[_P, _T], *args: _P.args,
                       **kwargs: _P.kwargs) -> _T:
    """A write to the metadata store: in a worker thread in a cluster (ZooKeeper's calls
    block), on the loop otherwise (SQLite)."""
    if clustered:
        return await asyncio.to_thread(change, *args, **kwargs)
    return change(*args, **kwargs)


class Security:
    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._store = broker.metadata
        config = broker.config
        self.authorizer: Authorizer | None = None
        if str(config["authorizer.class.name"]):
            try:
                supers = parse_super_users(str(config["super.users"]))
            except ValueError as e:
                raise ConfigError("super.users", str(e)) from None
            self.authorizer = Authorizer(self._store.acl_index, supers,
                                         bool(config["allow.everyone.if.no.acl.found"]))

    @property
    def enabled(self) -> bool:
        return self.authorizer is not None

    # ---------------------------------------------------------------- checks
    def allowed(self, ctx: RequestContext, operation: AclOperation,
                resource_type: ResourceType, name: str) -> bool:
        """Kafka's ``AuthHelper.authorize``; always True without an authorizer."""
        a = self.authorizer
        return a is None or a.authorize(ctx.principal, ctx.host, operation, resource_type, name)

    def cluster_allowed(self, ctx: RequestContext, operation: AclOperation) -> bool:
        return self.allowed(ctx, operation, CLUSTER, CLUSTER_NAME)

    def allowed_on_some(self, ctx: RequestContext, operation: AclOperation,
                        resource_type: ResourceType) -> bool:
        """Kafka's ``authorizeByResourceType``: allowed on at least one resource."""
        a = self.authorizer
        return a is None or a.authorize_by_resource_type(ctx.principal, ctx.host, operation,
                                                         resource_type)

    def allowed_names(self, ctx: RequestContext, operation: AclOperation,
                      resource_type: ResourceType, names: Iterable[str]) -> set[str]:
        """The names the operation is allowed on (Kafka's ``filterByAuthorized``)."""
        a = self.authorizer
        if a is None:
            return set(names)
        return {n for n in set(names)
                if a.authorize(ctx.principal, ctx.host, operation, resource_type, n)}

    def authorized_operations(self, ctx: RequestContext, resource_type: ResourceType,
                              name: str) -> int:
        """Kafka's bit field (``AuthHelper.authorizedOperations``): every supported
        operation without an authorizer."""
        a = self.authorizer
        if a is None:
            bits = 0
            for op in SUPPORTED_OPERATIONS[resource_type]:
                bits |= 1 << int(op)
            return bits
        return a.authorized_operations(ctx.principal, ctx.host, resource_type, name)

    # ---------------------------------------------------------------- storage
    async def change_acls(self, pattern: ResourcePattern, add: AclEntries,
                          remove: AclEntries) -> AclEntries:
        store = self._store
        after = await store_change(self._broker.config.clustered, store.change_acls,
                                   pattern, add, remove)
        store.install_acls(pattern, after)
        return after

    async def change_credentials(self, user: str, upsert: Mapping[str, ScramCredential],
                                 delete: set[str]) -> UserCredentials:
        store = self._store
        after = await store_change(self._broker.config.clustered, store.change_credentials,
                                   user, upsert, delete)
        store.install_credentials(user, after)
        return after

    def user_credentials(self) -> Mapping[str, UserCredentials]:
        return self._store.user_credentials()

    def scram_credential(self, mechanism: str, user: str) -> ScramCredential | None:
        return self._store.user_credentials().get(user, {}).get(mechanism)
