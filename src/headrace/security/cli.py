"""``headrace acls ...``, ``headrace users ...`` and ``headrace quotas ...``: kafka-acls.sh-
and kafka-configs.sh-like (SCRAM users, client quotas) administration over the Kafka
protocol, through confluent-kafka's AdminClient (CreateAcls, DescribeAcls, DeleteAcls,
AlterUserScramCredentials, DescribeUserScramCredentials) or, for client quotas, which it
lacks, the project's wire client; so it works against headrace and Kafka alike.
"""

from __future__ import annotations

import os
from typing import Any

import click

from headrace.admin_cli import TIMEOUT_S, _admin, _fail, _result, _table, bootstrap_option
from headrace.cli_support import emit_json, format_option

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
        click.option("--transactional-id", "transactional_ids", multiple=True,
                     help="A transactional id (or prefix)."),
        click.option("--resource-pattern-type", "pattern_type", default="literal",
                     show_default=True,
                     type=click.Choice(["literal", "prefixed", "any", "match"],
                                       case_sensitive=False),
                     help="How resource names match: literal or prefixed (list and remove "
                          "also take any and match)."),
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
@click.option("--allow-principal", "allow", multiple=True, metavar="User:NAME",
              help="A principal the ACL allows (repeatable).")
@click.option("--deny-principal", "deny", multiple=True, metavar="User:NAME",
              help="A principal the ACL denies (repeatable).")
@click.option("--operation", "operations", multiple=True, required=True,
              type=click.Choice(OPERATIONS, case_sensitive=False),
              help="An operation (repeatable).")
@click.option("--host", "hosts", multiple=True, help="Default: every host (*).")
@resource_options
def acls_add(bootstrap: str, allow: tuple[str, ...], deny: tuple[str, ...],
             operations: tuple[str, ...], hosts: tuple[str, ...], topics: tuple[str, ...],
             groups: tuple[str, ...], cluster: bool, transactional_ids: tuple[str, ...],
             pattern_type: str) -> None:
    """Add ACLs: each principal, operation, host and resource named."""
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
@click.option("--principal", default=None, metavar="User:NAME",
              help="Only this principal's ACLs.")
@resource_options
@format_option
def acls_list(bootstrap: str, principal: str | None, topics: tuple[str, ...],
              groups: tuple[str, ...], cluster: bool, transactional_ids: tuple[str, ...],
              pattern_type: str, fmt: str) -> None:
    """The ACLs matching the options (none: every ACL)."""
    resources = _resources(topics, groups, cluster, transactional_ids)
    default_pattern = "any" if pattern_type == "literal" and not resources else pattern_type
    admin = _admin(bootstrap)
    rows: list[tuple[object, ...]] = [("RESOURCE", "PATTERN", "PRINCIPAL", "HOST",
                                       "OPERATION", "PERMISSION")]
    for flt in _filter(principal, (), (), resources, default_pattern, None):
        for b in _result(admin.describe_acls(flt, request_timeout=TIMEOUT_S)):
            rows.append((f"{b.restype.name}:{b.name}", b.resource_pattern_type.name,
                         b.principal, b.host, b.operation.name, b.permission_type.name))
    if fmt == "json":
        emit_json([dict(zip(("resource", "pattern", "principal", "host", "operation",
                             "permission"), r, strict=True)) for r in rows[1:]])
        return
    _table(rows)


@acls.command("remove")
@bootstrap_option
@click.option("--allow-principal", "allow", multiple=True, metavar="User:NAME",
              help="Only this principal's allowing ACLs (repeatable).")
@click.option("--deny-principal", "deny", multiple=True, metavar="User:NAME",
              help="Only this principal's denying ACLs (repeatable).")
@click.option("--operation", "operations", multiple=True,
              type=click.Choice(OPERATIONS, case_sensitive=False),
              help="Only ACLs of this operation (repeatable).")
@click.option("--host", "hosts", multiple=True, help="Only ACLs of this host (repeatable).")
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
              type=click.Choice(MECHANISMS), help="The SCRAM mechanism.")
@click.option("--password", default=None,
              help="Default: $HEADRACE_PASSWORD, or asked for on the terminal.")
@click.option("--iterations", type=click.IntRange(4096, 16384), default=4096,
              show_default=True, help="PBKDF2 iterations (Kafka's bounds).")
def users_add(bootstrap: str, user: str, mechanism: str, password: str | None,
              iterations: int) -> None:
    """Add a SCRAM user, or set a user's password for a mechanism."""
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
@format_option
def users_list(bootstrap: str, names: tuple[str, ...], fmt: str) -> None:
    """SCRAM users with their mechanisms and iterations (NAMES: only those)."""
    admin = _admin(bootstrap)
    fut = admin.describe_user_scram_credentials(list(names) or None,
                                                request_timeout=TIMEOUT_S)
    described = _result(fut) if not names else {n: _result(f) for n, f in fut.items()}
    rows: list[tuple[object, ...]] = [("USER", "MECHANISM", "ITERATIONS")]
    for user in sorted(described):
        for info in described[user].scram_credential_infos:
            rows.append((user, info.mechanism.name.replace("_", "-"), info.iterations))
    if fmt == "json":
        emit_json([{"user": r[0], "mechanism": r[1], "iterations": r[2]} for r in rows[1:]])
        return
    _table(rows)


@users.command("remove")
@bootstrap_option
@click.argument("user")
@click.option("--mechanism", "mechanisms", multiple=True, type=click.Choice(MECHANISMS),
              help="Default: every mechanism the user has.")
def users_remove(bootstrap: str, user: str, mechanisms: tuple[str, ...]) -> None:
    """Remove a SCRAM user's credentials."""
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


# ---------------------------------------------------------------- client quotas
# confluent-kafka's AdminClient (2.16) has no client quota API: DescribeClientQuotas (48) and
# AlterClientQuotas (49) v1 go over the project's own wire client, as ``transactions`` does,
# with --command-config's TLS and SASL (headrace.admin_wire).
def _quota_request(bootstrap: str, api_key: int, body: dict[str, Any]) -> Any:
    from headrace.admin_cli import _broker_request
    from headrace.cli_support import check_reachable, parse_bootstrap

    check_reachable(bootstrap)
    host, port = parse_bootstrap(bootstrap)[0]
    return _broker_request(host, port, api_key, 1, body)


def entity_options(fn: Any) -> Any:
    for option in reversed([
        click.option("--user", default=None, help="A user principal's name."),
        click.option("--user-default", is_flag=True, help="The default user (<default>)."),
        click.option("--client-id", default=None, help="A client id."),
        click.option("--client-default", is_flag=True,
                     help="The default client id (<default>)."),
        click.option("--ip", default=None, help="An IP address (connection_creation_rate)."),
        click.option("--ip-default", is_flag=True, help="The default IP (<default>)."),
    ]):
        fn = option(fn)
    return fn


def _entity(user: str | None, user_default: bool, client_id: str | None,
            client_default: bool, ip: str | None, ip_default: bool
            ) -> list[tuple[str, str | None, bool]]:
    """(entity type, name or None for the default, given) per entity type named."""
    out: list[tuple[str, str | None, bool]] = []
    for kind, name, default in (("user", user, user_default),
                                ("client-id", client_id, client_default),
                                ("ip", ip, ip_default)):
        if name is not None and default:
            raise click.UsageError(f"give either --{kind.split('-')[0]} NAME or its "
                                   "--...-default, not both")
        if name is not None or default:
            out.append((kind, name, True))
    return out


def _describe_entity(entity: Any) -> str:
    words = {"user": "user-principal", "client-id": "client-id", "ip": "ip"}
    return ", ".join(f"{words.get(e.entity_type, e.entity_type)} "
                     + ("the default" if e.entity_name is None else f"'{e.entity_name}'")
                     for e in entity)


def _check_alter(resp: Any) -> None:
    from kio.schema.errors import ErrorCode

    for entry in resp.entries:
        if entry.error_code != ErrorCode.none:
            _fail(f"{_describe_entity(entry.entity)}: {ErrorCode(entry.error_code).name.upper()}"
                  f"{': ' + entry.error_message if entry.error_message else ''}")


@click.group()
def quotas() -> None:
    """Set, describe and remove client quotas (kafka-configs.sh --entity-type
    users/clients/ips --add-config producer_byte_rate=...)."""


@quotas.command("set")
@bootstrap_option
@entity_options
@click.option("--add-config", "add", default="", metavar="K=V,K=V",
              help="producer_byte_rate, consumer_byte_rate, request_percentage, "
                   "controller_mutation_rate; connection_creation_rate for --ip.")
@click.option("--delete-config", "delete", default="", metavar="K,K",
              help="Quotas to remove.")
@click.option("--validate-only", is_flag=True, help="Check the change; store nothing.")
def quotas_set(bootstrap: str, user: str | None, user_default: bool, client_id: str | None,
               client_default: bool, ip: str | None, ip_default: bool, add: str,
               delete: str, validate_only: bool) -> None:
    """Set (or remove) quotas of a user, a client id, both, or an IP."""
    entity = _entity(user, user_default, client_id, client_default, ip, ip_default)
    if not entity:
        raise click.UsageError("name an entity: --user/--user-default, "
                               "--client-id/--client-default or --ip/--ip-default")
    ops: list[dict[str, Any]] = []
    for item in (x.strip() for x in add.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or number != number:
            raise click.BadParameter(f"expected key=number, got {item!r}",
                                     param_hint="--add-config")
        ops.append({"key": key.strip(), "value": number, "remove": False})
    ops += [{"key": k.strip(), "value": 0.0, "remove": True}
            for k in delete.split(",") if k.strip()]
    if not ops:
        raise click.UsageError("nothing to change: --add-config and/or --delete-config")
    resp = _quota_request(bootstrap, 49, {"validate_only": validate_only, "entries": [{
        "entity": [{"entity_type": t, "entity_name": n} for t, n, _ in entity],
        "ops": ops}]})
    _check_alter(resp)
    what = "Validated" if validate_only else "Completed updating"
    click.echo(f"{what} quota configs for {_describe_entity(resp.entries[0].entity)}.")


@quotas.command("describe")
@bootstrap_option
@entity_options
@click.option("--strict", is_flag=True,
              help="Only entities with exactly the types named (Kafka's strict match).")
@format_option
def quotas_describe(bootstrap: str, user: str | None, user_default: bool,
                    client_id: str | None, client_default: bool, ip: str | None,
                    ip_default: bool, strict: bool, fmt: str) -> None:
    """The quotas of every entity the options match (none: every entity)."""
    from kio.schema.errors import ErrorCode

    components = [{"entity_type": t, "match_type": 0 if n is not None else 1, "match": n}
                  for t, n, _ in _entity(user, user_default, client_id, client_default, ip,
                                         ip_default)]
    resp = _quota_request(bootstrap, 48, {"components": components, "strict": strict})
    if resp.error_code != ErrorCode.none:
        _fail(f"{ErrorCode(resp.error_code).name.upper()}"
              f"{': ' + resp.error_message if resp.error_message else ''}")
    if fmt == "json":
        emit_json([{"entity": {e.entity_type: e.entity_name for e in entry.entity},
                    "quotas": {v.key: v.value for v in entry.values}}
                   for entry in resp.entries or ()])
        return
    if not resp.entries:  # said on stderr: stdout stays empty for scripts
        click.echo("headrace: no client quotas" + (" match" if components else " are set"),
                   err=True)
    for entry in resp.entries or ():
        values = ", ".join(f"{v.key}={v.value}" for v in entry.values)
        click.echo(f"Quota configs for {_describe_entity(entry.entity)} are {values}")


@quotas.command("remove")
@bootstrap_option
@entity_options
@click.option("--config", "keys", default="", metavar="K,K",
              help="Default: every quota the entity has.")
def quotas_remove(bootstrap: str, user: str | None, user_default: bool, client_id: str | None,
                  client_default: bool, ip: str | None, ip_default: bool, keys: str) -> None:
    """Remove quotas of an entity (default: all of them)."""
    entity = _entity(user, user_default, client_id, client_default, ip, ip_default)
    if not entity:
        raise click.UsageError("name an entity to remove the quotas of")
    names = [k.strip() for k in keys.split(",") if k.strip()]
    if not names:
        resp = _quota_request(bootstrap, 48, {"strict": True, "components": [
            {"entity_type": t, "match_type": 0 if n is not None else 1, "match": n}
            for t, n, _ in entity]})
        names = sorted({v.key for e in resp.entries or () for v in e.values})
        if not names:
            _fail("that entity has no quotas")
    resp = _quota_request(bootstrap, 49, {"validate_only": False, "entries": [{
        "entity": [{"entity_type": t, "entity_name": n} for t, n, _ in entity],
        "ops": [{"key": k, "value": 0.0, "remove": True} for k in names]}]})
    _check_alter(resp)
    click.echo(f"Removed {', '.join(names)} of {_describe_entity(resp.entries[0].entity)}.")
