"""``headrace share-groups ...``: Kafka's ``kafka-share-groups.sh`` for share groups
(KIP-932), over the Kafka protocol, so it works against headrace and Kafka alike.

confluent-kafka's AdminClient has no share-group calls yet, so every command speaks the
protocol itself (``admin_wire``'s connection, with ``--command-config``'s TLS and SASL):
ListGroups v5 with the ``share`` type filter on every broker; FindCoordinator for the
group's coordinator, then ShareGroupDescribe (77), DescribeShareGroupOffsets (90),
AlterShareGroupOffsets (91), DeleteShareGroupOffsets (92) and DeleteGroups (42) there.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NoReturn

import click

from headrace.admin_cli import (
    TIMEOUT_S,
    _admin,
    _broker_request,
    _describe_topics,
    _table,
    bootstrap_option,
)
from headrace.cli_support import EXIT_FAILED, emit_json, fail, format_option

LIST_GROUPS_VERSION = 5
FIND_COORDINATOR_VERSION = 4
SHARE_GROUP_DESCRIBE_VERSION = 1
DESCRIBE_OFFSETS_VERSION = 1
ALTER_OFFSETS_VERSION = 0
DELETE_OFFSETS_VERSION = 0
DELETE_GROUPS_VERSION = 2
EMPTY_STATES = ("Empty", "Dead")


def _fail(msg: str, code: int = EXIT_FAILED) -> NoReturn:
    fail(msg, code)


def _error_name(code: int) -> str:
    from kio.schema.errors import ErrorCode

    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)


def _brokers(bootstrap: str) -> list[tuple[int, str, int]]:
    md = _admin(bootstrap).list_topics(timeout=TIMEOUT_S)
    return sorted((b.id, b.host, b.port) for b in md.brokers.values())


def _coordinator(bootstrap: str, group: str) -> tuple[str, int]:
    brokers = _brokers(bootstrap)
    if not brokers:
        _fail(f"no broker is known to {bootstrap}")
    _, host, port = brokers[0]
    found = _broker_request(host, port, 10, FIND_COORDINATOR_VERSION,
                            {"key_type": 0, "coordinator_keys": [group]})
    c = found.coordinators[0]
    if c.error_code != 0:
        _fail(f"no coordinator for share group {group!r}: {_error_name(c.error_code)}")
    return str(c.host), int(c.port)


def _describe(host: str, port: int, group: str) -> Any:
    resp = _broker_request(host, port, 77, SHARE_GROUP_DESCRIBE_VERSION,
                           {"group_ids": [group], "include_authorized_operations": False})
    (g,) = resp.groups
    if g.error_code != 0:
        if _error_name(g.error_code) == "GROUP_ID_NOT_FOUND":
            _fail(f"share group '{group}' does not exist")
        _fail(f"share group '{group}': {g.error_message or _error_name(g.error_code)}")
    return g


def _offsets(host: str, port: int, group: str,
             topics: list[tuple[str, list[int]]] | None = None) -> list[tuple[str, int, int, int]]:
    """(topic, partition, start offset, lag) of the group's share-partitions; all of them
    when ``topics`` is None (Kafka: a null topic list)."""
    body: dict[str, Any] = {"groups": [{
        "group_id": group,
        "topics": None if topics is None else [
            {"topic_name": t, "partitions": ps} for t, ps in topics]}]}
    resp = _broker_request(host, port, 90, DESCRIBE_OFFSETS_VERSION, body)
    (g,) = resp.groups
    if g.error_code != 0:
        _fail(f"share group '{group}': {g.error_message or _error_name(g.error_code)}")
    rows = []
    for t in g.topics:
        for p in t.partitions:
            if p.error_code != 0:
                _fail(f"{t.topic_name}-{p.partition_index}: "
                      f"{p.error_message or _error_name(p.error_code)}")
            rows.append((str(t.topic_name), int(p.partition_index), int(p.start_offset),
                         int(getattr(p, "lag", -1))))
    return sorted(rows)


@click.group("share-groups")
def share_groups() -> None:
    """List, describe, reset and delete share groups (like kafka-share-groups.sh)."""


@share_groups.command("list")
@bootstrap_option
@format_option
def share_groups_list(bootstrap: str, fmt: str) -> None:
    """Every share group's id (ListGroups with the share type, on every broker)."""
    found: dict[str, str] = {}
    for _, host, port in _brokers(bootstrap):
        resp = _broker_request(host, port, 16, LIST_GROUPS_VERSION,
                               {"states_filter": [], "types_filter": ["share"]})
        if resp.error_code != 0:
            _fail(f"ListGroups on {host}:{port}: {_error_name(resp.error_code)}")
        for g in resp.groups:
            found[str(g.group_id)] = str(g.group_state)
    if fmt == "json":
        emit_json([{"group": g, "state": s} for g, s in sorted(found.items())])
        return
    for g in sorted(found):
        click.echo(g)


@share_groups.command("describe")
@bootstrap_option
@click.argument("group")
@click.option("--members", "view", flag_value="members", help="The members and what each "
              "is assigned.")
@click.option("--state", "view", flag_value="state", help="The group's state, epochs and "
              "assignor.")
@click.option("--offsets", "view", flag_value="offsets", default=True,
              help="Start offset and lag per partition (the default).")
@format_option
def share_groups_describe(bootstrap: str, group: str, view: str, fmt: str) -> None:
    """A share group's partitions (start offset and lag), members or state."""
    host, port = _coordinator(bootstrap, group)
    g = _describe(host, port, group)
    if view == "state":
        doc = {"group": group, "state": g.group_state, "group_epoch": g.group_epoch,
               "assignment_epoch": g.assignment_epoch, "assignor": g.assignor_name,
               "members": len(g.members)}
        if fmt == "json":
            emit_json(doc)
            return
        _table([("GROUP", "STATE", "GROUP-EPOCH", "ASSIGNMENT-EPOCH", "ASSIGNOR", "#MEMBERS"),
                (group, g.group_state, g.group_epoch, g.assignment_epoch,
                 g.assignor_name, len(g.members))])
        return
    if view == "members":
        members = [{"member_id": m.member_id, "client_id": m.client_id,
                    "host": m.client_host, "member_epoch": m.member_epoch,
                    "assignment": sorted(f"{tp.topic_name}:{p}"
                                         for tp in m.assignment.topic_partitions
                                         for p in tp.partitions)}
                   for m in g.members]
        if fmt == "json":
            emit_json({"group": group, "members": members})
            return
        _table([("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"),
                *((group, m["member_id"], m["host"], m["client_id"], len(m["assignment"]),
                   ",".join(m["assignment"]) or "-") for m in members)])
        return
    rows = _offsets(host, port, group)
    if fmt == "json":
        emit_json({"group": group, "state": g.group_state, "partitions": [
            {"topic": t, "partition": p, "start_offset": None if s < 0 else s,
             "lag": None if lag < 0 else lag} for t, p, s, lag in rows]})
        return
    if not g.members:
        click.echo(f"Share group '{group}' has no active members.")
    _table([("GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"),
            *((group, t, p, "-" if s < 0 else s, "-" if lag < 0 else lag)
              for t, p, s, lag in rows)])


@share_groups.command("reset-offsets")
@bootstrap_option
@click.argument("group")
@click.option("--topic", required=True, help="Topic whose share-partitions are reset.")
@click.option("--to-earliest", is_flag=True, help="To each partition's log start offset.")
@click.option("--to-latest", is_flag=True, help="To each partition's log end offset.")
@click.option("--to-offset", type=click.IntRange(min=0), default=None,
              help="To this offset (clamped to the log's range).")
@click.option("--to-datetime", default=None, metavar="YYYY-MM-DDTHH:mm:SS[.sss][+hh:mm]",
              help="To the first record at or after this time.")
@click.option("--execute", is_flag=True, help="Apply (the default only shows them).")
def share_groups_reset_offsets(bootstrap: str, group: str, topic: str, to_earliest: bool,
                               to_latest: bool, to_offset: int | None,
                               to_datetime: str | None, execute: bool) -> None:
    """Set a share group's start offset for a topic (AlterShareGroupOffsets); the group
    must have no members, as Kafka requires."""
    from confluent_kafka import Consumer, TopicPartition

    if sum([to_earliest, to_latest, to_offset is not None, to_datetime is not None]) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-offset, "
                               "--to-datetime")
    ts = None
    if to_datetime is not None:
        try:
            ts = int(datetime.fromisoformat(to_datetime).timestamp() * 1000)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--to-datetime") from e
    host, port = _coordinator(bootstrap, group)
    g = _describe(host, port, group)
    if g.members:
        _fail(f"share group '{group}' has {len(g.members)} member(s): offsets can only be "
              "reset while it is empty")
    (t,) = _describe_topics(_admin(bootstrap), [topic])
    parts = sorted(p.id for p in t.partitions)
    from headrace.admin_cli import CLIENT_CONFIG, _quiet

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "headrace-share-cli",
                         "enable.auto.commit": False, **_quiet(), **CLIENT_CONFIG})
    try:
        new: dict[int, int] = {}
        by_time: dict[int, int] = {}
        if ts is not None:
            found = consumer.offsets_for_times([TopicPartition(topic, p, ts) for p in parts],
                                               timeout=TIMEOUT_S)
            by_time = {f.partition: f.offset for f in found}
        for p in parts:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                       timeout=TIMEOUT_S)
            if to_earliest:
                target = low
            elif to_latest:
                target = high
            elif to_offset is not None:
                target = to_offset
            else:
                found_offset = by_time.get(p, -1)
                target = found_offset if found_offset >= 0 else high
            new[p] = min(max(target, low), high)
    finally:
        consumer.close()
    _table([("GROUP", "TOPIC", "PARTITION", "NEW-START-OFFSET"),
            *((group, topic, p, off) for p, off in new.items())])
    if not execute:
        click.echo("(dry run: nothing changed; add --execute to apply)")
        return
    resp = _broker_request(host, port, 91, ALTER_OFFSETS_VERSION, {
        "group_id": group, "topics": [{"topic_name": topic, "partitions": [
            {"partition_index": p, "start_offset": off} for p, off in new.items()]}]})
    if resp.error_code != 0:
        _fail(f"share group '{group}': {resp.error_message or _error_name(resp.error_code)}")
    for rt in resp.responses:
        for rp in rt.partitions:
            if rp.error_code != 0:
                _fail(f"{rt.topic_name}-{rp.partition_index}: "
                      f"{rp.error_message or _error_name(rp.error_code)}")
    click.echo(f"Reset the start offsets of share group '{group}' for topic {topic}.")


@share_groups.command("delete-offsets")
@bootstrap_option
@click.argument("group")
@click.option("--topic", "topics", multiple=True, required=True,
              help="Topic whose share-partition state is deleted (repeatable).")
def share_groups_delete_offsets(bootstrap: str, group: str, topics: tuple[str, ...]) -> None:
    """Delete a share group's state for whole topics (DeleteShareGroupOffsets); the group
    must have no members."""
    host, port = _coordinator(bootstrap, group)
    resp = _broker_request(host, port, 92, DELETE_OFFSETS_VERSION, {
        "group_id": group, "topics": [{"topic_name": t} for t in topics]})
    if resp.error_code != 0:
        _fail(f"share group '{group}': {resp.error_message or _error_name(resp.error_code)}")
    for rt in resp.responses:
        if rt.error_code != 0:
            _fail(f"{rt.topic_name}: {rt.error_message or _error_name(rt.error_code)}")
    click.echo(f"Deleted the offsets of share group '{group}' for "
               f"{', '.join(topics)}.")


@share_groups.command("delete")
@bootstrap_option
@click.argument("group_ids", metavar="GROUP...", nargs=-1, required=True)
def share_groups_delete(bootstrap: str, group_ids: tuple[str, ...]) -> None:
    """Delete share groups and their state; a group must have no members."""
    for group in group_ids:
        host, port = _coordinator(bootstrap, group)
        resp = _broker_request(host, port, 42, DELETE_GROUPS_VERSION, {"groups_names": [group]})
        (r,) = resp.results
        if r.error_code != 0:
            name = _error_name(r.error_code)
            if name == "GROUP_ID_NOT_FOUND":
                _fail(f"share group '{group}' does not exist")
            if name == "NON_EMPTY_GROUP":
                _fail(f"share group '{group}' is not empty: stop its members first")
            _fail(f"share group '{group}': {name}")
        click.echo(f"Deleted share group '{group}'.")
