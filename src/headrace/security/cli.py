"""``headrace acls ...`` and ``headrace users ...``: kafka-acls.sh- and
kafka-configs.sh-like (SCRAM users) administration over the Kafka protocol, through
confluent-kafka's AdminClient (CreateAcls, DescribeAcls, DeleteAcls,
AlterUserScramCredentials, DescribeUserScramCredentials), so it works against headrace and
Kafka alike.
"""

from __future__ import annotations

import os
from typing import Any

import click

from headrace.admin_cli import TIMEOUT_S, _admin, _fail, _result, _table, bootstrap_option

OPERATIONS = ("all", "read", "write", "create", "delete", "alter", "describe",
              "cluster_action", "describe_configs", "alter_configs", "idempotent_write")
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def _resources(topics: tuple[str, ...], groups: tuple[str, ...], cluster: bool,
               transactional_ids: tuple[str, ...]) -> list[tuple[str, str]]:
    out = [("TOPIC", t) for t in topics] + [("GROUP", g) for g in groups]
    out += [("TRANSACTIONAL_ID", t) for t in transactional_ids]
    if cluster:
        out.append(("BROKER", "kafka-cluster"))  # confluent-kafka's name for CLUSTER
    return out


def resource_options(fn: Any) -> Any:
    for deco in reversed((
        click.option("--topic", "topics", multiple=True, help="A topic (or prefix)."),
        click.option("--group", "groups", multiple=True, help="A consumer group (or prefix)."),
        click.option("--cluster", is_flag=True, help="The cluster resource."),
        click.option("--transactional-id", "transactional_ids", multiple=True),
        click.option("--resource-pattern-type", "pattern_type", default="literal",
                     show_default=True,
                     type=click.Choice(["literal", "prefixed", "any", "match"],
                                       case_sensitive=False)),
    )):
        fn = deco(fn)
    return fn


def _pattern(name: str) -> Any:
    from confluent_kafka.admin import ResourcePatternType  # type: ignore[attr-defined]

    return ResourcePatternType[name.upper()]


def _rtype(name: str) -> Any:
    from confluent_kafka.admin import ResourceType  # type: ignore[attr-defined]

    return ResourceType[name]


def _op(name: str) -> Any:
    from confluent_kafka.admin import AclOperation  # type: ignore[attr-defined]

    return AclOperation[name.upper()]


@click.group()
def acls() -> None:
    """Add, list and remove ACLs (kafka-acls.sh)."""


@acls.command("add")
@bootstrap_option
@click.option("--allow-principal", "allow", multiple=True, metavar="User:NAME")
@click.option("--deny-principal", "deny", multiple=True, metavar="User:NAME")
@click.option("--operation", "operations", multiple=True, required=True,
              type=click.Choice(OPERATIONS, case_sensitive=False))
@click.option("--host", "hosts", multiple=True, help="Default: every host (*).")
@resource_options
def acls_add(bootstrap: str, allow: tuple[str, ...], deny: tuple[str, ...],
             operations: tuple[str, ...], hosts: tuple[str, ...], topics: tuple[str, ...],
             groups: tuple[str, ...], cluster: bool, transactional_ids: tuple[str, ...],
             pattern_type: str) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclPermissionType,
    )

    resources = _resources(topics, groups, cluster, transactional_ids)
    if not resources:
        _fail("name a resource: --topic, --group, --cluster or --transactional-id")
    if not allow and not deny:
        _fail("name a principal: --allow-principal or --deny-principal")
    if pattern_type.lower() not in ("literal", "prefixed"):
        _fail("--resource-pattern-type must be literal or prefixed to add ACLs")
    bindings = [
        AclBinding(_rtype(rt), name, _pattern(pattern_type), principal, host, _op(op), perm)
        for rt, name in resources
        for perm, principals in ((AclPermissionType.ALLOW, allow), (AclPermissionType.DENY, deny))
        for principal in principals for host in (hosts or ("*",)) for op in operations
    ]
    admin = _admin(bootstrap)
    for b, fut in admin.create_acls(bindings, request_timeout=TIMEOUT_S).items():
        _result(fut)
        click.echo(f"Added {_describe(b)}")


def _filter(principal: str | None, operations: tuple[str, ...], hosts: tuple[str, ...],
            resources: list[tuple[str, str]], pattern_type: str, permission: str | None
            ) -> list[Any]:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBindingFilter,
        AclPermissionType,
    )

    perm = AclPermissionType[permission] if permission else AclPermissionType.ANY
    wanted: list[tuple[str, str | None]] = list(resources) or [("ANY", None)]
    host_filters: tuple[str | None, ...] = hosts or (None,)
    make: Any = AclBindingFilter  # its stubs refuse the None (any) values it accepts
    return [make(_rtype(rt), name, _pattern(pattern_type), principal, host, _op(op), perm)
            for rt, name in wanted
            for op in (operations or ("any",)) for host in host_filters]


def _describe(b: Any) -> str:
    return (f"{b.permission_type.name} {b.principal} {b.operation.name} from {b.host} on "
            f"{b.restype.name}:{b.name} ({b.resource_pattern_type.name})")


@acls.command("list")
@bootstrap_option
@click.option("--principal", default=None, metavar="User:NAME")
@resource_options
def acls_list(bootstrap: str, principal: str | None, topics: tuple[str, ...],
              groups: tuple[str, ...], cluster: bool, transactional_ids: tuple[str, ...],
              pattern_type: str) -> None:
    resources = _resources(topics, groups, cluster, transactional_ids)
    default_pattern = "any" if pattern_type == "literal" and not resources else pattern_type
    admin = _admin(bootstrap)
    rows: list[tuple[object, ...]] = [("RESOURCE", "PATTERN", "PRINCIPAL", "HOST",
                                       "OPERATION", "PERMISSION")]
    for flt in _filter(principal, (), (), resources, default_pattern, None):
        for b in _result(admin.describe_acls(flt, request_timeout=TIMEOUT_S)):
            rows.append((f"{b.restype.name}:{b.name}", b.resource_pattern_type.name,
                         b.principal, b.host, b.operation.name, b.permission_type.name))
    _table(rows)


@acls.command("remove")
@bootstrap_option
@click.option("--allow-principal", "allow", multiple=True, metavar="User:NAME")
@click.option("--deny-principal", "deny", multiple=True, metavar="User:NAME")
@click.option("--operation", "operations", multiple=True,
              type=click.Choice(OPERATIONS, case_sensitive=False))
@click.option("--host", "hosts", multiple=True)
@resource_options
def acls_remove(bootstrap: str, allow: tuple[str, ...], deny: tuple[str, ...],
                operations: tuple[str, ...], hosts: tuple[str, ...], topics: tuple[str, ...],
                groups: tuple[str, ...], cluster: bool, transactional_ids: tuple[str, ...],
                pattern_type: str) -> None:
    """Remove the matching ACLs (without principals: every principal's)."""
    resources = _resources(topics, groups, cluster, transactional_ids)
    if not resources:
        _fail("name a resource: --topic, --group, --cluster or --transactional-id")
    filters: list[Any] = []
    for permission, principals in (("ALLOW", allow), ("DENY", deny)):
        for p in principals:
            filters += _filter(p, operations, hosts, resources, pattern_type, permission)
    if not allow and not deny:
        filters = _filter(None, operations, hosts, resources, pattern_type, None)
    admin = _admin(bootstrap)
    for _, fut in admin.delete_acls(filters, request_timeout=TIMEOUT_S).items():
        for b in _result(fut):
            click.echo(f"Removed {_describe(b)}")


# ---------------------------------------------------------------- users (SCRAM)
@click.group()
def users() -> None:
    """Add, list and remove SCRAM users (kafka-configs.sh --entity-type users)."""


@users.command("add")
@bootstrap_option
@click.argument("user")
@click.option("--mechanism", default="SCRAM-SHA-512", show_default=True,
              type=click.Choice(MECHANISMS))
@click.option("--password", default=None,
              help="Default: $HEADRACE_PASSWORD, or asked for on the terminal.")
@click.option("--iterations", type=int, default=4096, show_default=True)
def users_add(bootstrap: str, user: str, mechanism: str, password: str | None,
              iterations: int) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    if password is None:
        password = os.environ.get("HEADRACE_PASSWORD") or click.prompt(
            f"Password for {user}", hide_input=True, confirmation_prompt=True)
    info = ScramCredentialInfo(ScramMechanism[mechanism.replace("-", "_")], iterations)
    upsert = UserScramCredentialUpsertion(user, info, password.encode(), os.urandom(32))
    admin = _admin(bootstrap)
    for _, fut in admin.alter_user_scram_credentials(
            [upsert], request_timeout=TIMEOUT_S).items():
        _result(fut)
    click.echo(f"Set the {mechanism} credential of {user} ({iterations} iterations).")


@users.command("list")
@bootstrap_option
@click.argument("names", nargs=-1)
def users_list(bootstrap: str, names: tuple[str, ...]) -> None:
    admin = _admin(bootstrap)
    fut = admin.describe_user_scram_credentials(list(names) or None,
                                                request_timeout=TIMEOUT_S)
    described = _result(fut) if not names else {n: _result(f) for n, f in fut.items()}
    rows: list[tuple[object, ...]] = [("USER", "MECHANISM", "ITERATIONS")]
    for user in sorted(described):
        for info in described[user].scram_credential_infos:
            rows.append((user, info.mechanism.name.replace("_", "-"), info.iterations))
    _table(rows)


@users.command("remove")
@bootstrap_option
@click.argument("user")
@click.option("--mechanism", "mechanisms", multiple=True, type=click.Choice(MECHANISMS),
              help="Default: every mechanism the user has.")
def users_remove(bootstrap: str, user: str, mechanisms: tuple[str, ...]) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ScramMechanism,
        UserScramCredentialDeletion,
    )

    admin = _admin(bootstrap)
    if not mechanisms:
        found = _result(admin.describe_user_scram_credentials(
            [user], request_timeout=TIMEOUT_S)[user])
        mechanisms = tuple(i.mechanism.name.replace("_", "-")
                           for i in found.scram_credential_infos)
    deletions = [UserScramCredentialDeletion(user, ScramMechanism[m.replace("-", "_")])
                 for m in mechanisms]
    for _, fut in admin.alter_user_scram_credentials(
            deletions, request_timeout=TIMEOUT_S).items():
        _result(fut)
    click.echo(f"Removed {', '.join(mechanisms)} of {user}.")
