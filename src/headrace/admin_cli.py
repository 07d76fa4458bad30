"""``headrace topics ...`` and ``headrace groups ...``: kafka-topics.sh- and
kafka-consumer-groups.sh-like administration over the Kafka protocol.

Talks to any Kafka-compatible broker through confluent-kafka's AdminClient, so it works
against headrace and Kafka alike.
"""

from __future__ import annotations

import re
import sys
from typing import Any, NoReturn

import click

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
TIMEOUT_S = 15.0

# The client settings of ``headrace --command-config FILE`` (or HEADRACE_COMMAND_CONFIG):
# how the admin commands reach a TLS or SASL listener (issue 12).
CLIENT_CONFIG: dict[str, str] = {}

_JAAS_USER = re.compile(r'username\s*=\s*"([^"]*)"')
_JAAS_PASSWORD = re.compile(r'password\s*=\s*"([^"]*)"')


def client_config(props: dict[str, str]) -> dict[str, str]:
    """A Kafka tool's ``--command-config`` properties as librdkafka settings: Java names
    translated (``sasl.jaas.config`` -> ``sasl.username``/``sasl.password``, PEM
    ``ssl.truststore.location`` -> ``ssl.ca.location``, PEM ``ssl.keystore.location`` ->
    ``ssl.certificate.location`` + ``ssl.key.location``), librdkafka names kept."""
    out: dict[str, str] = {}
    for key, value in props.items():
        if key == "sasl.jaas.config":
            user, password = _JAAS_USER.search(value), _JAAS_PASSWORD.search(value)
            if user:
                out["sasl.username"] = user.group(1)
            if password:
                out["sasl.password"] = password.group(1)
        elif key == "ssl.truststore.location":
            out["ssl.ca.location"] = value
        elif key == "ssl.keystore.location":
            out["ssl.certificate.location"] = out["ssl.key.location"] = value
        elif key in ("ssl.truststore.type", "ssl.keystore.type", "ssl.key.password"):
            if key == "ssl.key.password":
                out["ssl.key.password"] = value
        else:
            out[key] = value
    return out


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000,
                        **CLIENT_CONFIG})


def _pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        if "=" not in v:
            raise click.BadParameter(f"expected key=value, got {v!r}", param_hint=what)
        k, val = v.split("=", 1)
        out[k.strip()] = val.strip()
    return out


def _fail(msg: str) -> NoReturn:
    click.echo(f"headrace: {msg}", err=True)
    sys.exit(1)


def _result(fut: Any) -> Any:
    from confluent_kafka import KafkaException

    try:
        return fut.result(timeout=TIMEOUT_S)
    except KafkaException as e:
        _fail(str(e.args[0].str() if e.args else e))
    except Exception as e:  # timeouts
        _fail(str(e))


bootstrap_option = click.option(
    "--bootstrap-server", "bootstrap", default=DEFAULT_BOOTSTRAP, show_default=True,
    help="host:port of a broker.",
)


@click.group()
def topics() -> None:
    """Create, list, describe, delete topics and alter their configs."""


@topics.command("create")
@bootstrap_option
@click.option("--topic", required=True)
@click.option("--partitions", type=int, default=-1, help="Default: the broker's num.partitions.")
@click.option("--replication-factor", type=int, default=-1)
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE")
@click.option("--if-not-exists", is_flag=True)
def create(bootstrap: str, topic: str, partitions: int, replication_factor: int,
           configs: tuple[str, ...], if_not_exists: bool) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    nt = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor,
                  config=_pairs(configs, "--config"))
    admin = _admin(bootstrap)  # keep the client alive until its futures resolve
    fut = admin.create_topics([nt], operation_timeout=TIMEOUT_S)[topic]
    try:
        fut.result(timeout=TIMEOUT_S)
    except KafkaException as e:
        err = e.args[0]
        if if_not_exists and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        _fail(err.str())
    click.echo(f"Created topic {topic}.")


@topics.command("list")
@bootstrap_option
def list_(bootstrap: str) -> None:
    md = _admin(bootstrap).list_topics(timeout=TIMEOUT_S)
    for name in sorted(md.topics):
        click.echo(name)


@topics.command("describe")
@bootstrap_option
@click.option("--topic", default=None, help="Default: every topic.")
def describe(bootstrap: str, topic: str | None) -> None:
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    admin = _admin(bootstrap)
    md = admin.list_topics(topic=topic, timeout=TIMEOUT_S)
    names = sorted(md.topics) if topic is None else [topic]
    for name in names:
        t = md.topics.get(name)
        if t is None or t.error is not None:
            _fail(f"topic {name}: {t.error.str() if t is not None and t.error else 'not found'}")
        assert t is not None
        res = ConfigResource(ConfigResource.Type.TOPIC, name)
        cfg = _result(admin.describe_configs([res])[res])
        overrides = ",".join(
            f"{k}={v.value}" for k, v in sorted(cfg.items()) if not v.is_default
        )
        rf = len(next(iter(t.partitions.values())).replicas) if t.partitions else 0
        click.echo(f"Topic: {name}\tPartitionCount: {len(t.partitions)}\t"
                   f"ReplicationFactor: {rf}\tConfigs: {overrides}")
        for pid in sorted(t.partitions):
            p = t.partitions[pid]
            click.echo(f"\tTopic: {name}\tPartition: {pid}\tLeader: {p.leader}\t"
                       f"Replicas: {','.join(map(str, p.replicas))}\t"
                       f"Isr: {','.join(map(str, p.isrs))}")


@topics.command("delete")
@bootstrap_option
@click.option("--topic", required=True)
def delete(bootstrap: str, topic: str) -> None:
    admin = _admin(bootstrap)
    _result(admin.delete_topics([topic], operation_timeout=TIMEOUT_S)[topic])
    click.echo(f"Deleted topic {topic}.")


@topics.command("alter-config")
@bootstrap_option
@click.option("--topic", required=True)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE")
@click.option("--delete", "deletes", multiple=True, metavar="KEY")
def alter_config(bootstrap: str, topic: str, sets: tuple[str, ...],
                 deletes: tuple[str, ...]) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    if not sets and not deletes:
        raise click.UsageError("give --set KEY=VALUE and/or --delete KEY")
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
               for k, v in _pairs(sets, "--set").items()]
    entries += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE)
                for k in deletes]
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    admin = _admin(bootstrap)
    _result(admin.incremental_alter_configs([res])[res])
    click.echo(f"Altered configs of topic {topic}.")


@topics.command("delete-records")
@bootstrap_option
@click.option("--topic", required=True)
@click.option("--partition", "partitions", type=int, multiple=True,
              help="Repeatable. Default: every partition of the topic.")
@click.option("--offset", type=int, default=-1, show_default=True,
              help="Delete the records before this offset; -1: every record up to the "
                   "high watermark.")
def delete_records(bootstrap: str, topic: str, partitions: tuple[int, ...],
                   offset: int) -> None:
    """Delete a topic's records before an offset (kafka-delete-records.sh): the log start
    offset moves there; consumers below it reset (auto.offset.reset)."""
    from confluent_kafka import TopicPartition

    if offset < -1:
        raise click.BadParameter("must be -1 or an offset", param_hint="--offset")
    admin = _admin(bootstrap)  # keep the client alive until its futures resolve
    if not partitions:
        md = admin.list_topics(topic=topic, timeout=TIMEOUT_S)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            _fail(f"topic {topic}: {t.error.str() if t is not None and t.error else 'not found'}")
        assert t is not None
        partitions = tuple(sorted(t.partitions))
    futs = admin.delete_records([TopicPartition(topic, p, offset) for p in partitions],
                                request_timeout=TIMEOUT_S)
    for tp, fut in sorted(futs.items(), key=lambda kv: kv[0].partition):
        result = _result(fut)
        click.echo(f"partition: {topic}-{tp.partition}\tlow_watermark: {result.low_watermark}")


@topics.command("elect-leaders")
@bootstrap_option
@click.option("--topic", default=None, help="With --partition: one partition.")
@click.option("--partition", type=int, default=None)
@click.option("--all-topic-partitions", is_flag=True, help="Every partition of the cluster.")
@click.option("--election-type", type=click.Choice(["preferred", "unclean"]),
              default="preferred", show_default=True)
def elect_leaders(bootstrap: str, topic: str | None, partition: int | None,
                  all_topic_partitions: bool, election_type: str) -> None:
    """Leader elections (kafka-leader-election.sh): preferred replicas back as leaders, or
    an out-of-sync replica for an offline partition (unclean: may lose records)."""
    from confluent_kafka import ElectionType, TopicPartition

    if all_topic_partitions == (topic is not None):
        raise click.UsageError("give either --all-topic-partitions or --topic/--partition")
    if topic is not None and partition is None:
        raise click.UsageError("--topic needs --partition")
    kind = ElectionType.PREFERRED if election_type == "preferred" else ElectionType.UNCLEAN
    wanted = None
    if topic is not None and partition is not None:
        wanted = [TopicPartition(topic, partition)]
    admin = _admin(bootstrap)
    results = _result(admin.elect_leaders(kind, wanted))
    for tp, err in sorted((results or {}).items(), key=lambda x: (x[0].topic, x[0].partition)):
        outcome = "elected" if err is None else err.str()
        click.echo(f"{tp.topic}-{tp.partition}: {outcome}")


def _controller_request(bootstrap: str, api_key: int, version: int,
                        body: dict[str, Any]) -> Any:
    """One request to the cluster's controller (found with Metadata), over the Kafka
    protocol (confluent-kafka's AdminClient has no reassignment API)."""
    from headrace.spark.wire import Connection

    md = _admin(bootstrap).list_topics(timeout=TIMEOUT_S)
    broker = md.brokers.get(md.controller_id)
    if broker is None:
        _fail(f"no controller is known to {bootstrap}")
    conn = Connection(broker.host, broker.port, TIMEOUT_S)
    try:
        return conn.request(api_key, version, body)
    except (OSError, ConnectionError) as e:
        _fail(f"the controller at {broker.host}:{broker.port} did not answer: {e}")
    finally:
        conn.close()


@topics.command("reassign")
@bootstrap_option
@click.option("--topic", required=True)
@click.option("--partition", type=int, required=True)
@click.option("--replicas", default=None, metavar="ID,ID,...",
              help="The new replicas, preferred leader first.")
@click.option("--cancel", is_flag=True, help="Cancel the partition's ongoing reassignment.")
def reassign(bootstrap: str, topic: str, partition: int, replicas: str | None,
             cancel: bool) -> None:
    """Move a partition to other brokers (kafka-reassign-partitions.sh --execute); the new
    replicas catch up, then the old ones are dropped."""
    from kio.schema.errors import ErrorCode

    if cancel == (replicas is not None):
        raise click.UsageError("give either --replicas or --cancel")
    target = None if cancel else [int(x) for x in str(replicas).split(",") if x.strip()]
    resp = _controller_request(bootstrap, 45, 0, {
        "timeout": 30_000,
        "topics": [{"name": topic, "partitions": [
            {"partition_index": partition, "replicas": target}]}]})
    if resp.error_code != ErrorCode.none:
        _fail(f"{ErrorCode(resp.error_code).name.upper()}: {resp.error_message or ''}")
    for t in resp.responses:
        for p in t.partitions:
            if p.error_code != ErrorCode.none:
                _fail(f"{t.name}-{p.partition_index}: {ErrorCode(p.error_code).name.upper()} "
                      f"{p.error_message or ''}".rstrip())
    click.echo(f"{'Cancelled' if cancel else 'Started'} the reassignment of "
               f"{topic}-{partition}.")


@topics.command("reassignments")
@bootstrap_option
def reassignments(bootstrap: str) -> None:
    """Ongoing reassignments (kafka-reassign-partitions.sh --verify / --list)."""
    from kio.schema.errors import ErrorCode

    resp = _controller_request(bootstrap, 46, 0, {"timeout": 30_000, "topics": None})
    if resp.error_code != ErrorCode.none:
        _fail(f"{ErrorCode(resp.error_code).name.upper()}: {resp.error_message or ''}")
    rows = 0
    for t in resp.topics:
        for p in t.partitions:
            rows += 1
            click.echo(f"{t.name}-{p.partition_index}\treplicas: "
                       f"{','.join(map(str, p.replicas))}\tadding: "
                       f"{','.join(map(str, p.adding_replicas)) or '-'}\tremoving: "
                       f"{','.join(map(str, p.removing_replicas)) or '-'}")
    if not rows:
        click.echo("No reassignment in progress.")


# ---------------------------------------------------------------------- groups
#
# ``headrace groups ...``: kafka-consumer-groups.sh-like, over the group APIs (ListGroups,
# DescribeGroups, OffsetFetch, OffsetCommit) through confluent-kafka's AdminClient, plus a
# group-less Consumer for watermarks and timestamps (ListOffsets).

NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: nothing committed
_DESCRIBE_HEADER = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                    "CONSUMER-ID", "HOST", "CLIENT-ID")
_INACTIVE_STATES = ("EMPTY", "DEAD")


def _offsets_consumer(bootstrap: str) -> Any:
    """A consumer that never joins its group: only for watermarks and offsets_for_times."""
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": "headrace-cli",
                     "enable.auto.commit": False, "socket.timeout.ms": 10000,
                     **CLIENT_CONFIG})


def _table(rows: list[tuple[object, ...]]) -> None:
    """Left-aligned columns separated by two spaces, like kafka-consumer-groups.sh."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    for r in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _state_name(state: Any) -> str:
    return str(getattr(state, "name", state)).upper()


def _describe_group(admin: Any, group: str) -> Any:
    desc = _result(admin.describe_consumer_groups([group], request_timeout=TIMEOUT_S)[group])
    if _state_name(desc.state) == "DEAD" and not desc.members:
        _fail(f"consumer group '{group}' does not exist.")
    return desc


def _committed(admin: Any, group: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    req = [ConsumerGroupTopicPartitions(group)]
    res = _result(admin.list_consumer_group_offsets(req, request_timeout=TIMEOUT_S)[group])
    return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions or []
            if tp.error is None}


def _watermarks(consumer: Any, tps: list[tuple[str, int]]
                ) -> dict[tuple[str, int], tuple[int, int]]:
    from confluent_kafka import KafkaException, TopicPartition

    out = {}
    for topic, partition in tps:
        try:
            out[(topic, partition)] = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=TIMEOUT_S)
        except KafkaException as e:
            _fail(f"{topic}-{partition}: {e.args[0].str() if e.args else e}")
    return out


def _lag_rows(bootstrap: str, group: str) -> tuple[Any, list[tuple[object, ...]]]:
    admin = _admin(bootstrap)
    desc = _describe_group(admin, group)
    committed = _committed(admin, group)
    owner: dict[tuple[str, int], Any] = {}
    for m in desc.members:
        for tp in (m.assignment.topic_partitions if m.assignment else []) or []:
            owner[(tp.topic, tp.partition)] = m
    tps = sorted(set(committed) | set(owner))
    consumer = _offsets_consumer(bootstrap)
    try:
        marks = _watermarks(consumer, tps)
    finally:
        consumer.close()
    rows: list[tuple[object, ...]] = []
    for tp in tps:
        current = committed.get(tp, NO_OFFSET)
        end = marks[tp][1]
        lag: object = end - current if current >= 0 else "-"
        m = owner.get(tp)
        rows.append((group, tp[0], tp[1], current if current >= 0 else "-", end, lag,
                     m.member_id if m else "-", m.host if m else "-",
                     m.client_id if m else "-"))
    return desc, rows


@click.group()
def groups() -> None:
    """List and describe consumer groups, show their lag, reset their offsets."""


@groups.command("list")
@bootstrap_option
def groups_list(bootstrap: str) -> None:
    """Every group's id, one per line (like ``kafka-consumer-groups.sh --list``)."""
    admin = _admin(bootstrap)  # keep the client alive until its future resolves
    res = _result(admin.list_consumer_groups(request_timeout=TIMEOUT_S))
    for err in res.errors or []:
        click.echo(f"headrace: {err}", err=True)
    for listing in sorted(res.valid, key=lambda g: g.group_id):
        click.echo(listing.group_id)


@groups.command("describe")
@bootstrap_option
@click.argument("group")
def groups_describe(bootstrap: str, group: str) -> None:
    """Committed offset, log end and lag per partition, with the owning member."""
    desc, rows = _lag_rows(bootstrap, group)
    click.echo(f"Consumer group '{group}': state {_state_name(desc.state)}, "
               f"{len(desc.members)} member(s), assignor {desc.partition_assignor or '-'}")
    if not desc.members:
        click.echo(f"Consumer group '{group}' has no active members.")
    click.echo()
    _table([_DESCRIBE_HEADER, *rows])


@groups.command("lag")
@bootstrap_option
@click.argument("group")
def groups_lag(bootstrap: str, group: str) -> None:
    """Lag per partition and in total."""
    _, rows = _lag_rows(bootstrap, group)
    _table([_DESCRIBE_HEADER[:6], *(r[:6] for r in rows)])
    total = sum(r[5] for r in rows if isinstance(r[5], int))
    click.echo(f"TOTAL-LAG {total}")


def _parse_datetime(text: str) -> int:
    """ISO 8601 (``2024-05-01T12:00:00``, optional fraction and offset; local time without
    one, like kafka-consumer-groups.sh) to epoch milliseconds."""
    from datetime import datetime

    try:
        dt = datetime.fromisoformat(text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--to-datetime") from e
    return int(dt.timestamp() * 1000)


@groups.command("reset-offsets")
@bootstrap_option
@click.argument("group")
@click.option("--topic", required=True, help="Topic whose partitions are reset (all of them).")
@click.option("--to-earliest", is_flag=True)
@click.option("--to-latest", is_flag=True)
@click.option("--to-offset", type=int, default=None)
@click.option("--to-datetime", default=None, metavar="YYYY-MM-DDTHH:mm:SS[.sss][+hh:mm]")
@click.option("--shift-by", type=int, default=None)
@click.option("--dry-run", is_flag=True, help="Show the new offsets only (the default).")
@click.option("--execute", is_flag=True, help="Commit the new offsets.")
def groups_reset_offsets(bootstrap: str, group: str, topic: str, to_earliest: bool,
                         to_latest: bool, to_offset: int | None, to_datetime: str | None,
                         shift_by: int | None, dry_run: bool, execute: bool) -> None:
    """Reset a group's committed offsets for a topic; the group must be inactive."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    modes = [to_earliest, to_latest, to_offset is not None, to_datetime is not None,
             shift_by is not None]
    if sum(modes) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-offset, "
                               "--to-datetime, --shift-by")
    if dry_run and execute:
        raise click.UsageError("--dry-run and --execute are exclusive")
    admin = _admin(bootstrap)
    desc = _result(admin.describe_consumer_groups([group], request_timeout=TIMEOUT_S)[group])
    state = _state_name(desc.state)
    if desc.members or state not in _INACTIVE_STATES:
        _fail(f"assignments can only be reset if the group '{group}' is inactive, "
              f"but the current state is {state}.")
    md = admin.list_topics(topic=topic, timeout=TIMEOUT_S)
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        _fail(f"topic {topic}: {t.error.str() if t is not None and t.error else 'not found'}")
    assert t is not None
    tps = [(topic, p) for p in sorted(t.partitions)]
    committed = _committed(admin, group)
    consumer = _offsets_consumer(bootstrap)
    try:
        marks = _watermarks(consumer, tps)
        by_time: dict[tuple[str, int], int] = {}
        if to_datetime is not None:
            ts = _parse_datetime(to_datetime)
            found = consumer.offsets_for_times(
                [TopicPartition(tp, p, ts) for tp, p in tps], timeout=TIMEOUT_S)
            by_time = {(f.topic, f.partition): f.offset for f in found}
    finally:
        consumer.close()
    new: dict[tuple[str, int], int] = {}
    for tp in tps:
        low, high = marks[tp]
        if to_earliest:
            target = low
        elif to_latest:
            target = high
        elif to_offset is not None:
            target = to_offset
        elif shift_by is not None:
            current = committed.get(tp, NO_OFFSET)
            target = (current if current >= 0 else low) + shift_by
        else:
            found_offset = by_time.get(tp, -1)
            target = found_offset if found_offset >= 0 else high
        new[tp] = min(max(target, low), high)
    _table([("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"),
            *((group, tp[0], tp[1], off) for tp, off in new.items())])
    if not execute:
        click.echo("(dry run: nothing committed; add --execute to commit)")
        return
    req = [ConsumerGroupTopicPartitions(
        group, [TopicPartition(tp, p, off) for (tp, p), off in new.items()])]
    res = _result(admin.alter_consumer_group_offsets(req, request_timeout=TIMEOUT_S)[group])
    failed = [tp for tp in res.topic_partitions or [] if tp.error is not None]
    if failed:
        _fail("; ".join(f"{tp.topic}-{tp.partition}: {tp.error}" for tp in failed))
    click.echo(f"Reset offsets of group '{group}' for topic {topic}.")


# ---------------------------------------------------------------------- transactions


def _broker_request(host: str, port: int, api_key: int, version: int,
                    body: dict[str, Any], raw: bool = False) -> Any:
    from headrace.spark.wire import Connection

    try:
        conn = Connection(host, port, TIMEOUT_S)
    except OSError as e:
        _fail(f"cannot reach a broker at {host}:{port}: {e}")
    try:
        return conn.request_raw(api_key, version, body) if raw else conn.request(
            api_key, version, body)
    except (OSError, ConnectionError) as e:
        _fail(f"the broker at {host}:{port} did not answer: {e}")
    finally:
        conn.close()


@click.group()
def transactions() -> None:
    """List and describe transactions (like ``kafka-transactions.sh``)."""


@transactions.command("list")
@bootstrap_option
@click.option("--state", "states", multiple=True,
              help="Only transactions in this state (Empty, Ongoing, PrepareCommit, ...).")
def transactions_list(bootstrap: str, states: tuple[str, ...]) -> None:
    """Every transactional id, asked of every broker (each lists those it coordinates)."""
    md = _admin(bootstrap).list_topics(timeout=TIMEOUT_S)
    rows: list[tuple[object, ...]] = [
        ("TransactionalId", "Coordinator", "ProducerId", "TransactionState")]
    for b in sorted(md.brokers.values(), key=lambda b: b.id):
        resp = _broker_request(b.host, b.port, 66, 0, {"state_filters": list(states),
                                                        "producer_id_filters": []})
        for bad in resp.unknown_state_filters:
            _fail(f"unknown transaction state {bad!r}")
        rows += [(s.transactional_id, b.id, s.producer_id, s.transaction_state)
                 for s in resp.transaction_states]
    _table(rows[:1] + sorted(rows[1:], key=lambda r: str(r[0])))


@transactions.command("describe")
@bootstrap_option
@click.argument("transactional_id")
def transactions_describe(bootstrap: str, transactional_id: str) -> None:
    """One transactional id's state, from its coordinator."""
    import time

    from kio.schema.errors import ErrorCode

    from headrace.txn.describe import decode_describe_transactions_v0

    md = _admin(bootstrap).list_topics(timeout=TIMEOUT_S)
    first = next(iter(md.brokers.values()), None)
    if first is None:
        _fail(f"no broker is known to {bootstrap}")
    found = _broker_request(first.host, first.port, 10, 4,
                            {"key_type": 1, "coordinator_keys": [transactional_id]})
    c = found.coordinators[0]
    if c.error_code != ErrorCode.none:
        _fail(f"no coordinator for {transactional_id!r}: {ErrorCode(c.error_code).name.upper()}")
    frame, n = _broker_request(c.host, c.port, 65, 0,
                               {"transactional_ids": [transactional_id]}, raw=True)
    (t,) = decode_describe_transactions_v0(frame, n)
    if t.error_code != ErrorCode.none:
        _fail(f"{transactional_id!r}: {ErrorCode(t.error_code).name.upper()}")
    now = int(time.time() * 1000)
    started = "None" if t.start_ms < 0 else str(t.start_ms)
    duration = "None" if t.start_ms < 0 else str(now - t.start_ms)
    _table([("CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
             "TransactionState", "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
             "TransactionDurationMs", "TopicPartitions"),
            (c.node_id, t.transactional_id, t.producer_id, t.producer_epoch, t.state,
             t.timeout_ms, started, duration,
             ",".join(f"{tp}-{p}" for tp, p in t.partitions) or "None")])
