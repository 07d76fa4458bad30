"""``headrace topics ...`` and ``headrace groups ...``: kafka-topics.sh- and
kafka-consumer-groups.sh-like administration over the Kafka protocol.

Talks to any Kafka-compatible broker through confluent-kafka's AdminClient, so it works
against headrace and Kafka alike.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

import click

from headrace.cli_support import (
    DEFAULT_BOOTSTRAP,
    EXIT_AUTH,
    EXIT_FAILED,
    EXIT_UNREACHABLE,
    check_reachable,
    emit_json,
    fail,
    format_option,
    parse_pair,
    verbose,
)
from headrace.cli_support import bootstrap_option as cli_bootstrap_option

__all__ = ["AUTH_CODES", "CLIENT_CONFIG", "DEFAULT_BOOTSTRAP", "UNREACHABLE_CODES",
           "bootstrap_option", "client_config", "log_dir_sizes", "state_name"]

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
    """An AdminClient, once a bootstrap address accepts connections (else exit 3 at once);
    librdkafka's logs only with ``headrace --verbose``."""
    from confluent_kafka.admin import AdminClient

    check_reachable(bootstrap)
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000,
                        **_quiet(), **CLIENT_CONFIG})


def _quiet() -> dict[str, Any]:
    return {} if verbose() else {"log_level": 0}


def _pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    return dict(parse_pair(v, what) for v in values)


def _fail(msg: str, code: int = EXIT_FAILED) -> NoReturn:
    fail(msg, code)


# librdkafka's error codes that mean "no broker answered" and "TLS/SASL failed"
UNREACHABLE_CODES = ("_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE")
AUTH_CODES = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL")


def _kafka_fail(err: Any) -> NoReturn:
    """A librdkafka error as one line and its exit code."""
    name = err.name() if hasattr(err, "name") else ""
    text = err.str() if hasattr(err, "str") else str(err)
    if name in AUTH_CODES:
        _fail(f"authentication failed: {text}", EXIT_AUTH)
    if name in UNREACHABLE_CODES:
        _fail(f"cannot reach a broker: {text}", EXIT_UNREACHABLE)
    _fail(text or name or "failed")


def _result(fut: Any) -> Any:
    from confluent_kafka import KafkaException

    try:
        return fut.result(timeout=TIMEOUT_S)
    except KafkaException as e:
        _kafka_fail(e.args[0] if e.args else e)
    except TimeoutError:
        _fail(f"no answer within {TIMEOUT_S:.0f} s", EXIT_UNREACHABLE)
    except Exception as e:
        _fail(str(e) or type(e).__name__)


bootstrap_option = cli_bootstrap_option()
positive = click.IntRange(min=1)


@click.group()
def topics() -> None:
    """Create, list, describe, delete topics, add partitions and alter their configs."""


@topics.command("create")
@bootstrap_option
@click.argument("topic_arg", metavar="[TOPIC]", required=False)
@click.option("--topic", default=None, help="The topic's name (or give it as the argument).")
@click.option("-p", "--partitions", type=positive, default=None,
              help="Default: the broker's num.partitions.")
@click.option("-r", "--replication-factor", type=positive, default=None,
              help="Default: the broker's default.replication.factor.")
@click.option("-c", "--config", "configs", multiple=True, metavar="KEY=VALUE",
              help="A topic config, e.g. retention.ms=86400000 (repeatable).")
@click.option("--if-not-exists", is_flag=True, help="Succeed if the topic exists already.")
def create(bootstrap: str, topic_arg: str | None, topic: str | None, partitions: int | None,
           replication_factor: int | None, configs: tuple[str, ...],
           if_not_exists: bool) -> None:
    """Create a topic."""
    if (topic is None) == (topic_arg is None):
        raise click.UsageError("name the topic once: as the argument or with --topic")
    topic = topic if topic is not None else topic_arg
    assert topic is not None
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    nt = NewTopic(topic, num_partitions=-1 if partitions is None else partitions,
                  replication_factor=-1 if replication_factor is None else replication_factor,
                  config=_pairs(configs, "--config"))
    admin = _admin(bootstrap)  # keep the client alive until its futures resolve
    fut = admin.create_topics([nt], operation_timeout=TIMEOUT_S)[topic]
    try:
        fut.result(timeout=TIMEOUT_S)
    except KafkaException as e:
        err = e.args[0]
        if if_not_exists and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        _kafka_fail(err)
    except TimeoutError:
        _fail(f"no answer within {TIMEOUT_S:.0f} s", EXIT_UNREACHABLE)
    click.echo(f"Created topic {topic}.")


@topics.command("list")
@bootstrap_option
@click.option("--exclude-internal", is_flag=True,
              help="Leave out the internal topics (__consumer_offsets, ...).")
@format_option
def list_(bootstrap: str, exclude_internal: bool, fmt: str) -> None:
    """Every topic's name, one per line (as kafka-topics.sh --list, internal ones
    included unless --exclude-internal)."""
    from headrace.topic_describe import INTERNAL_TOPICS

    md = _admin(bootstrap).list_topics(timeout=TIMEOUT_S)  # all topics: creates nothing
    names = sorted(n for n in md.topics if not (exclude_internal and n in INTERNAL_TOPICS))
    if fmt == "json":
        emit_json(names)
        return
    for name in names:
        click.echo(name)


def _describe_topics(admin: Any, names: list[str]) -> list[Any]:
    """Metadata of these topics without creating any (DescribeTopics: Metadata with
    allow_auto_topic_creation false)."""
    from confluent_kafka import TopicCollection

    if not names:
        return []
    from confluent_kafka import KafkaError, KafkaException

    futs = admin.describe_topics(TopicCollection(names), request_timeout=TIMEOUT_S)
    out = []
    for name in names:
        try:
            out.append(futs[name].result(timeout=TIMEOUT_S))
        except KafkaException as e:
            if e.args and e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                _fail(f"topic '{name}' does not exist")
            _result(futs[name])
        except TimeoutError:
            _fail(f"no answer within {TIMEOUT_S:.0f} s", EXIT_UNREACHABLE)
    return out


def log_dir_sizes(nodes: list[Any], wanted: dict[str, list[int]],
                  timeout_s: float = TIMEOUT_S, config: dict[str, str] | None = None
                  ) -> dict[tuple[str, int, int], int]:
    """Bytes on disk per (topic, partition, broker) from every broker's DescribeLogDirs;
    brokers that do not answer (or refuse) are left out. ``config``: the client settings
    (default: ``--command-config``'s)."""
    from headrace.admin_wire import AdminConnection, SecurityError

    out: dict[tuple[str, int, int], int] = {}
    for node in nodes:
        try:
            conn = AdminConnection(node.host, node.port, timeout_s,
                                   CLIENT_CONFIG if config is None else config)
        except (OSError, SecurityError):
            continue
        try:
            resp = conn.request(35, 1, {"topics": [{"topic": n, "partitions": ps}
                                                   for n, ps in wanted.items()]})
        except (OSError, ConnectionError):
            continue
        finally:
            conn.close()
        for result in resp.results:
            for t in result.topics:
                for p in t.partitions:
                    out[(t.name, p.partition_index, node.id)] = int(p.partition_size)
    return out


@topics.command("describe")
@bootstrap_option
@click.argument("topic_args", metavar="[TOPIC]...", nargs=-1)
@click.option("--topic", "names", multiple=True,
              help="A topic (repeatable; or name them as arguments). Default: every topic.")
@click.option("--exclude-internal", is_flag=True,
              help="Without topics named: leave out the internal topics.")
@click.option("--under-replicated-partitions", "under_replicated", is_flag=True,
              help="Only partitions whose ISR is smaller than their replicas.")
@click.option("--unavailable-partitions", "unavailable", is_flag=True,
              help="Only partitions without a live leader.")
@click.option("--at-min-isr-partitions", "at_min_isr", is_flag=True,
              help="Only partitions whose ISR is exactly min.insync.replicas.")
@click.option("--under-min-isr-partitions", "under_min_isr", is_flag=True,
              help="Only partitions whose ISR is below min.insync.replicas.")
@format_option
def describe(bootstrap: str, topic_args: tuple[str, ...], names: tuple[str, ...],
             exclude_internal: bool, under_replicated: bool, unavailable: bool,
             at_min_isr: bool, under_min_isr: bool, fmt: str) -> None:
    """Partitions, leaders, replicas and in-sync replicas, log start and end offsets and
    size on disk per partition, and config overrides. Creates nothing (an unknown topic is
    an error, whatever auto.create.topics.enable says). Answers from the brokers that are
    up within seconds: a partition without a leader shows "Leader: none (offline)", what a
    broker that does not answer would have said is "-" (a note on stderr names it)."""
    from headrace.cli_support import parse_bootstrap
    from headrace.topic_describe import DescribeError
    from headrace.topic_describe import describe as wire_describe

    first = check_reachable(bootstrap)  # the address that answered is asked first
    addresses = [first, *(a for a in parse_bootstrap(bootstrap) if a != first)]
    names = (*names, *topic_args)
    try:
        docs, notes = wire_describe(addresses,
                                    sorted(set(names)) if names else None, CLIENT_CONFIG)
    except DescribeError as e:
        _fail(str(e), e.code)
    if exclude_internal and not names:
        docs = [d for d in docs if not d["internal"]]
    filters = [f for f, on in ((_under_replicated, under_replicated),
                               (_unavailable, unavailable), (_at_min_isr, at_min_isr),
                               (_under_min_isr, under_min_isr)) if on]
    if filters:  # kafka-topics.sh: only the matching partitions' lines, no topic lines
        docs = [{**d, "partitions": [p for p in d["partitions"]
                                     if any(f(d, p) for f in filters)]} for d in docs]
        docs = [d for d in docs if d["partitions"]]
    for note in notes:
        click.echo(f"headrace: {note}", err=True)
    if fmt == "json":
        emit_json(docs)
        return
    from headrace.topic_describe import describe_lines

    for line in describe_lines(docs):
        if filters and not line.startswith("\t"):
            continue  # kafka-topics.sh prints only the partitions when filtering
        click.echo(line)


def _min_isr(doc: dict[str, Any]) -> int:
    try:
        return int(doc["configs"].get("min.insync.replicas", "1"))
    except ValueError:
        return 1


def _under_replicated(doc: dict[str, Any], p: dict[str, Any]) -> bool:
    return len(p["isr"]) < len(p["replicas"])


def _unavailable(doc: dict[str, Any], p: dict[str, Any]) -> bool:
    return bool(p["offline"])


def _at_min_isr(doc: dict[str, Any], p: dict[str, Any]) -> bool:
    return len(p["isr"]) == _min_isr(doc)


def _under_min_isr(doc: dict[str, Any], p: dict[str, Any]) -> bool:
    return len(p["isr"]) < _min_isr(doc)


@topics.command("add-partitions")
@bootstrap_option
@click.option("--topic", required=True, help="The topic to grow.")
@click.option("--partitions", type=positive, required=True,
              help="The new total number of partitions (more than it has).")
def add_partitions(bootstrap: str, topic: str, partitions: int) -> None:
    """Add partitions to a topic (kafka-topics.sh --alter --partitions N): N is the new
    total. Keys map to other partitions afterwards."""
    from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]

    admin = _admin(bootstrap)
    _result(admin.create_partitions([NewPartitions(topic, partitions)],
                                    operation_timeout=TIMEOUT_S)[topic])
    click.echo(f"Topic {topic} now has {partitions} partitions.")


@topics.command("delete")
@bootstrap_option
@click.argument("topic_args", metavar="[TOPIC]...", nargs=-1)
@click.option("--topic", "names", multiple=True,
              help="A topic to delete with its records, or a regular expression its whole "
                   "name matches (repeatable; or name them as arguments).")
@click.option("--if-exists", is_flag=True,
              help="Succeed when a topic (or pattern) matches nothing.")
def delete(bootstrap: str, topic_args: tuple[str, ...], names: tuple[str, ...],
           if_exists: bool) -> None:
    """Delete topics and their records (kafka-topics.sh --delete: a name is also a
    regular expression; internal topics are never matched by a pattern)."""
    from headrace.topic_describe import INTERNAL_TOPICS

    wanted = (*names, *topic_args)
    if not wanted:
        raise click.UsageError("name at least one topic (an argument or --topic)")
    admin = _admin(bootstrap)
    existing = set(admin.list_topics(timeout=TIMEOUT_S).topics)
    chosen: list[str] = []
    for w in wanted:
        if w in existing:
            matched = [w]
        else:
            try:
                pattern = re.compile(w)
            except re.error:
                matched = []
            else:
                matched = sorted(n for n in existing
                                 if n not in INTERNAL_TOPICS and pattern.fullmatch(n))
        if not matched and not if_exists:
            _fail(f"topic '{w}' does not exist" + (" (as a name or a pattern)"
                                                   if w != re.escape(w) else ""))
        chosen += [n for n in matched if n not in chosen]
    if not chosen:
        return
    futs = admin.delete_topics(chosen, operation_timeout=TIMEOUT_S)
    for name in chosen:
        _result(futs[name])
        click.echo(f"Deleted topic {name}.")


@topics.command("alter-config")
@bootstrap_option
@click.option("--topic", required=True, help="The topic whose configs change.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Set a config (repeatable).")
@click.option("--delete", "deletes", multiple=True, metavar="KEY",
              help="Remove an override: back to the broker's default (repeatable).")
def alter_config(bootstrap: str, topic: str, sets: tuple[str, ...],
                 deletes: tuple[str, ...]) -> None:
    """Set or remove a topic's config overrides (as headrace configs alter --topic)."""
    _alter_configs(bootstrap, topic, None, sets, deletes)
    click.echo(f"Altered configs of topic {topic}.")


def _alter_configs(bootstrap: str, topic: str | None, broker: int | None,
                   sets: tuple[str, ...], deletes: tuple[str, ...],
                   group: str | None = None) -> None:
    """IncrementalAlterConfigs on a topic or a broker: SET and DELETE entries."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
    )

    if not sets and not deletes:
        raise click.UsageError("give --set KEY=VALUE and/or --delete KEY")
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
               for k, v in _pairs(sets, "--set").items()]
    entries += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE)
                for k in deletes]
    res = _config_resource(topic, broker, group, incremental_configs=entries)
    admin = _admin(bootstrap)
    _result(admin.incremental_alter_configs([res])[res])


@topics.command("delete-records")
@bootstrap_option
@click.option("--topic", required=True, help="The topic whose records go.")
@click.option("--partition", "partitions", type=click.IntRange(min=0), multiple=True,
              help="Repeatable. Default: every partition of the topic.")
@click.option("--offset", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="Delete the records before this offset; -1: every record up to the "
                   "high watermark.")
def delete_records(bootstrap: str, topic: str, partitions: tuple[int, ...],
                   offset: int) -> None:
    """Delete a topic's records before an offset (kafka-delete-records.sh): the log start
    offset moves there; consumers below it reset (auto.offset.reset)."""
    from confluent_kafka import TopicPartition

    admin = _admin(bootstrap)  # keep the client alive until its futures resolve
    if not partitions:
        (t,) = _describe_topics(admin, [topic])
        partitions = tuple(sorted(p.id for p in t.partitions))
    futs = admin.delete_records([TopicPartition(topic, p, offset) for p in partitions],
                                request_timeout=TIMEOUT_S)
    for tp, fut in sorted(futs.items(), key=lambda kv: kv[0].partition):
        result = _result(fut)
        click.echo(f"partition: {topic}-{tp.partition}\tlow_watermark: {result.low_watermark}")


@topics.command("elect-leaders")
@bootstrap_option
@click.option("--topic", default=None, help="With --partition: one partition.")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="The partition of --topic.")
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
    md = _admin(bootstrap).list_topics(timeout=TIMEOUT_S)
    broker = md.brokers.get(md.controller_id)
    if broker is None:
        _fail(f"no controller is known to {bootstrap}")
    return _broker_request(broker.host, broker.port, api_key, version, body)


@topics.command("reassign")
@bootstrap_option
@click.option("--topic", required=True, help="The partition's topic.")
@click.option("--partition", type=click.IntRange(min=0), required=True,
              help="The partition to move.")
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
    try:
        target = None if cancel else [int(x) for x in str(replicas).split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected broker ids like 1,2,3, got {replicas!r}",
                                 param_hint="--replicas") from None
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
@format_option
def reassignments(bootstrap: str, fmt: str) -> None:
    """Ongoing reassignments (kafka-reassign-partitions.sh --verify / --list)."""
    from kio.schema.errors import ErrorCode

    resp = _controller_request(bootstrap, 46, 0, {"timeout": 30_000, "topics": None})
    if resp.error_code != ErrorCode.none:
        _fail(f"{ErrorCode(resp.error_code).name.upper()}: {resp.error_message or ''}")
    if fmt == "json":
        emit_json([{"topic": t.name, "partition": p.partition_index,
                    "replicas": list(p.replicas), "adding": list(p.adding_replicas),
                    "removing": list(p.removing_replicas)}
                   for t in resp.topics for p in t.partitions])
        return
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
                     **_quiet(), **CLIENT_CONFIG})


def _table(rows: list[tuple[object, ...]]) -> None:
    """Left-aligned columns separated by two spaces, like kafka-consumer-groups.sh."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    for r in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def state_name(state: Any) -> str:
    return str(getattr(state, "name", state)).upper()


def _describe_group(admin: Any, group: str) -> Any:
    desc = _result(admin.describe_consumer_groups([group], request_timeout=TIMEOUT_S)[group])
    if state_name(desc.state) == "DEAD" and not desc.members:
        _fail(f"consumer group '{group}' does not exist")
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
            if e.args and e.args[0].name() in UNREACHABLE_CODES + AUTH_CODES:
                _kafka_fail(e.args[0])
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
    """List, describe and delete consumer groups, show their lag, reset their offsets."""


@groups.command("list")
@bootstrap_option
@format_option
def groups_list(bootstrap: str, fmt: str) -> None:
    """Every group's id, one per line (like kafka-consumer-groups.sh --list)."""
    admin = _admin(bootstrap)  # keep the client alive until its future resolves
    res = _result(admin.list_consumer_groups(request_timeout=TIMEOUT_S))
    for err in res.errors or []:
        click.echo(f"headrace: {err}", err=True)
    listings = sorted(res.valid, key=lambda g: g.group_id)
    if fmt == "json":
        emit_json([{"group": g.group_id, "state": state_name(g.state),
                    "simple": bool(g.is_simple_consumer_group)} for g in listings])
        return
    for listing in listings:
        click.echo(listing.group_id)


_ROW_KEYS = ("group", "topic", "partition", "current_offset", "log_end_offset", "lag",
             "consumer_id", "host", "client_id")


def _row_doc(row: tuple[object, ...]) -> dict[str, object]:
    return {k: (None if v == "-" else v) for k, v in zip(_ROW_KEYS, row, strict=False)}


@groups.command("describe")
@bootstrap_option
@click.argument("group", required=False)
@click.option("--all-groups", is_flag=True, help="Every consumer group, one after another.")
@click.option("--members", "view", flag_value="members",
              help="The members: id, host, client id and how many partitions each has.")
@click.option("--state", "view", flag_value="state",
              help="The group's coordinator, assignor, state and member count.")
@format_option
def groups_describe(bootstrap: str, group: str | None, all_groups: bool, view: str | None,
                    fmt: str) -> None:
    """Committed offset, log end and lag per partition, with the owning member (or, as
    kafka-consumer-groups.sh, the --members or --state view; --all-groups for every
    group)."""
    if all_groups == (group is not None):
        raise click.UsageError("name one GROUP or give --all-groups")
    names = [group] if group is not None else _group_ids(bootstrap)
    docs = []
    for i, name in enumerate(names):
        if i and fmt != "json":
            click.echo()
        if view is not None:
            docs.append(_group_view(bootstrap, name, view, fmt))
        else:
            docs.append(_group_offsets_view(bootstrap, name, fmt))
    if fmt == "json":
        emit_json(docs[0] if group is not None else docs)


def _group_ids(bootstrap: str) -> list[str]:
    admin = _admin(bootstrap)
    res = _result(admin.list_consumer_groups(request_timeout=TIMEOUT_S))
    return sorted(g.group_id for g in res.valid)


def _group_view(bootstrap: str, group: str, view: str, fmt: str) -> dict[str, Any]:
    admin = _admin(bootstrap)
    desc = _describe_group(admin, group)
    state = state_name(desc.state)
    coordinator = (f"{desc.coordinator.host}:{desc.coordinator.port} "
                   f"({desc.coordinator.id})" if desc.coordinator else "-")
    members = [{"consumer_id": m.member_id, "host": m.host, "client_id": m.client_id,
                "partitions": len((m.assignment.topic_partitions if m.assignment else [])
                                  or [])} for m in desc.members]
    doc: dict[str, Any] = {"group": group, "state": state,
                           "assignor": desc.partition_assignor or None,
                           "coordinator": desc.coordinator.id if desc.coordinator else None,
                           "members": members if view == "members" else len(members)}
    if fmt == "json":
        return doc
    if view == "state":
        _table([("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"),
                (group, coordinator, desc.partition_assignor or "-", state, len(members))])
    elif members:
        _table([("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"),
                *((group, m["consumer_id"], m["host"], m["client_id"], m["partitions"])
                  for m in members)])
    else:
        click.echo(f"Consumer group '{group}' has no active members.")
    return doc


def _group_offsets_view(bootstrap: str, group: str, fmt: str) -> dict[str, Any]:
    desc, rows = _lag_rows(bootstrap, group)
    doc = {"group": group, "state": state_name(desc.state),
           "members": [{"consumer_id": m.member_id, "client_id": m.client_id,
                        "host": m.host} for m in desc.members],
           "assignor": desc.partition_assignor or None,
           "partitions": [_row_doc(r) for r in rows]}
    if fmt == "json":
        return doc
    click.echo(f"Consumer group '{group}': state {state_name(desc.state)}, "
               f"{len(desc.members)} member(s), assignor {desc.partition_assignor or '-'}")
    if not desc.members:
        click.echo(f"Consumer group '{group}' has no active members.")
    click.echo()
    _table([_DESCRIBE_HEADER, *rows])
    return doc


@groups.command("lag")
@bootstrap_option
@click.argument("group")
@format_option
def groups_lag(bootstrap: str, group: str, fmt: str) -> None:
    """Lag per partition and in total."""
    _, rows = _lag_rows(bootstrap, group)
    total = sum(r[5] for r in rows if isinstance(r[5], int))
    if fmt == "json":
        emit_json({"group": group, "partitions": [_row_doc(r[:6]) for r in rows],
                   "total_lag": total})
        return
    _table([_DESCRIBE_HEADER[:6], *(r[:6] for r in rows)])
    click.echo(f"TOTAL-LAG {total}")


@groups.command("delete")
@bootstrap_option
@click.argument("group_ids", metavar="GROUP...", nargs=-1, required=True)
def groups_delete(bootstrap: str, group_ids: tuple[str, ...]) -> None:
    """Delete consumer groups and their committed offsets; a group must have no active
    members (kafka-consumer-groups.sh --delete)."""
    admin = _admin(bootstrap)
    futs = admin.delete_consumer_groups(list(group_ids), request_timeout=TIMEOUT_S)
    for group in group_ids:
        _result(futs[group])
        click.echo(f"Deleted consumer group '{group}'.")


def _topic_selection(values: tuple[str, ...], admin: Any) -> dict[str, list[int]]:
    """kafka-consumer-groups.sh's ``--topic T`` (every partition) or ``--topic T:0,2``."""
    out: dict[str, list[int]] = {}
    for v in values:
        name, _, parts = v.partition(":")
        if parts:
            try:
                chosen = sorted({int(x) for x in parts.split(",") if x.strip()})
            except ValueError:
                raise click.BadParameter(f"{v!r}: partitions are numbers, as T:0,1",
                                         param_hint="--topic") from None
        else:
            (t,) = _describe_topics(admin, [name])
            chosen = sorted(p.id for p in t.partitions)
        out.setdefault(name, [])
        out[name] = sorted(set(out[name]) | set(chosen))
    return out


@groups.command("delete-offsets")
@bootstrap_option
@click.argument("group")
@click.option("--topic", "topics", multiple=True, required=True, metavar="T[:P,P...]",
              help="A topic (every partition) or some of its partitions (repeatable).")
def groups_delete_offsets(bootstrap: str, group: str, topics: tuple[str, ...]) -> None:
    """Delete a group's committed offsets of some partitions (OffsetDelete, API 47; as
    kafka-consumer-groups.sh --delete-offsets): refused for a topic the group's members
    still consume (GROUP_SUBSCRIBED_TO_TOPIC)."""
    from kio.schema.errors import ErrorCode

    admin = _admin(bootstrap)
    selection = _topic_selection(topics, admin)
    md = admin.list_topics(timeout=TIMEOUT_S)
    first = next(iter(md.brokers.values()), None)
    if first is None:
        _fail(f"no broker is known to {bootstrap}")
    found = _broker_request(first.host, first.port, 10, 4,
                            {"key_type": 0, "coordinator_keys": [group]})
    c = found.coordinators[0]
    if c.error_code != ErrorCode.none:
        _fail(f"no coordinator for group {group!r}: {ErrorCode(c.error_code).name.upper()}")
    resp = _broker_request(c.host, c.port, 47, 0, {"group_id": group, "topics": [
        {"name": t, "partitions": [{"partition_index": p} for p in ps]}
        for t, ps in selection.items()]})
    if resp.error_code != ErrorCode.none:
        code = ErrorCode(resp.error_code)
        if code is ErrorCode.group_id_not_found:
            _fail(f"consumer group '{group}' does not exist")
        _fail(f"group '{group}': {code.name.upper()}")
    rows, failed = [], False
    for t in resp.topics:
        for rp in t.partitions:
            code = ErrorCode(rp.error_code)
            failed = failed or code is not ErrorCode.none
            rows.append((t.name, rp.partition_index,
                         "Successful" if code is ErrorCode.none else code.name.upper()))
    _table([("TOPIC", "PARTITION", "STATUS"), *rows])
    if failed:
        _fail("some offsets were not deleted")


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
@click.option("--topic", "topics", multiple=True, metavar="T[:P,P...]",
              help="A topic (every partition) or some of its partitions (repeatable).")
@click.option("--all-topics", is_flag=True,
              help="Every topic the group has committed offsets for.")
@click.option("--from-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A CSV of topic,partition,offset lines (as --export writes): those "
                   "offsets, clamped to each log's range.")
@click.option("--to-earliest", is_flag=True, help="To each partition's log start offset.")
@click.option("--to-latest", is_flag=True, help="To each partition's log end offset.")
@click.option("--to-current", is_flag=True, help="To the committed offset (e.g. to --export it).")
@click.option("--to-offset", type=click.IntRange(min=0), default=None,
              help="To this offset (clamped to the log's range).")
@click.option("--to-datetime", default=None, metavar="YYYY-MM-DDTHH:mm:SS[.sss][+hh:mm]",
              help="To the first record at or after this time.")
@click.option("--by-duration", default=None, metavar="PnDTnHnMnS",
              help="To the first record at or after now minus this ISO-8601 duration.")
@click.option("--shift-by", type=int, default=None,
              help="Move each committed offset by N (negative: back).")
@click.option("--dry-run", is_flag=True, help="Show the new offsets only (the default).")
@click.option("--execute", is_flag=True, help="Commit the new offsets.")
@click.option("--export", is_flag=True,
              help="Print the new offsets as CSV (topic,partition,offset) for --from-file.")
def groups_reset_offsets(bootstrap: str, group: str, topics: tuple[str, ...],
                         all_topics: bool, from_file: str | None, to_earliest: bool,
                         to_latest: bool, to_current: bool, to_offset: int | None,
                         to_datetime: str | None, by_duration: str | None,
                         shift_by: int | None, dry_run: bool, execute: bool,
                         export: bool) -> None:
    """Reset a group's committed offsets (kafka-consumer-groups.sh --reset-offsets); the
    group must be inactive."""
    import time

    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    from headrace.config import parse_duration_ms

    modes = [to_earliest, to_latest, to_current, to_offset is not None,
             to_datetime is not None, by_duration is not None, shift_by is not None,
             from_file is not None]
    if sum(modes) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-current, "
                               "--to-offset, --to-datetime, --by-duration, --shift-by, "
                               "--from-file")
    if from_file is None and sum([bool(topics), all_topics]) != 1:
        raise click.UsageError("give --topic (repeatable) or --all-topics")
    if dry_run and execute:
        raise click.UsageError("--dry-run and --execute are exclusive")
    ts = _parse_datetime(to_datetime) if to_datetime is not None else None
    if by_duration is not None:
        duration = parse_duration_ms(by_duration)
        if duration is None:
            raise click.BadParameter(f"{by_duration!r} is no ISO-8601 duration (PnDTnHnMnS)",
                                     param_hint="--by-duration")
        ts = int(time.time() * 1000) - duration
    admin = _admin(bootstrap)
    desc = _result(admin.describe_consumer_groups([group], request_timeout=TIMEOUT_S)[group])
    state = state_name(desc.state)
    if desc.members or state not in _INACTIVE_STATES:
        _fail(f"assignments can only be reset if the group '{group}' is inactive, "
              f"but the current state is {state}.")
    committed = _committed(admin, group)
    from_csv: dict[tuple[str, int], int] = {}
    if from_file is not None:
        from_csv = _read_offsets_csv(from_file)
        tps = sorted(from_csv)
        _describe_topics(admin, sorted({t for t, _ in tps}))  # never auto-creates a topic
    elif all_topics:
        tps = sorted(committed)
    else:
        tps = sorted((t, p) for t, ps in _topic_selection(topics, admin).items() for p in ps)
    consumer = _offsets_consumer(bootstrap)
    try:
        marks = _watermarks(consumer, tps)
        by_time: dict[tuple[str, int], int] = {}
        if ts is not None:
            found = consumer.offsets_for_times(
                [TopicPartition(tp, p, ts) for tp, p in tps], timeout=TIMEOUT_S)
            by_time = {(f.topic, f.partition): f.offset for f in found}
    finally:
        consumer.close()
    new: dict[tuple[str, int], int] = {}
    for tp in tps:
        low, high = marks[tp]
        current = committed.get(tp, NO_OFFSET)
        if to_earliest:
            target = low
        elif to_latest:
            target = high
        elif to_current:
            target = current if current >= 0 else low
        elif to_offset is not None:
            target = to_offset
        elif shift_by is not None:
            target = (current if current >= 0 else low) + shift_by
        elif from_file is not None:
            target = from_csv[tp]
        else:
            found_offset = by_time.get(tp, -1)
            target = found_offset if found_offset >= 0 else high
        new[tp] = min(max(target, low), high)
    if export:
        for (t, p), off in new.items():
            click.echo(f"{t},{p},{off}")
    else:
        _table([("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"),
                *((group, tp[0], tp[1], off) for tp, off in new.items())])
    if not execute:
        if not export:
            click.echo("(dry run: nothing committed; add --execute to commit)")
        return
    req = [ConsumerGroupTopicPartitions(
        group, [TopicPartition(tp, p, off) for (tp, p), off in new.items()])]
    res = _result(admin.alter_consumer_group_offsets(req, request_timeout=TIMEOUT_S)[group])
    failed = [tp for tp in res.topic_partitions or [] if tp.error is not None]
    if failed:
        _fail("; ".join(f"{tp.topic}-{tp.partition}: {tp.error}" for tp in failed))
    if not export:
        names = ", ".join(sorted({t for t, _ in new}))
        click.echo(f"Reset offsets of group '{group}' for {names or 'no partition'}.")


def _read_offsets_csv(path: str) -> dict[tuple[str, int], int]:
    """kafka-consumer-groups.sh's reset file: ``topic,partition,offset`` per line."""
    out: dict[tuple[str, int], int] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(",")
            try:
                if len(parts) != 3:
                    raise ValueError
                out[(parts[0], int(parts[1]))] = int(parts[2])
            except ValueError:
                raise click.BadParameter(f"line {n}: expected topic,partition,offset, got "
                                         f"{line!r}", param_hint="--from-file") from None
    return out


# ---------------------------------------------------------------------- transactions


def _broker_request(host: str, port: int, api_key: int, version: int,
                    body: dict[str, Any], raw: bool = False) -> Any:
    """One request over the project's wire client, with ``--command-config``'s TLS and
    SASL; unreachable: exit 3, TLS or SASL failed: exit 4."""
    from headrace.admin_wire import AdminConnection, SecurityError

    try:
        conn = AdminConnection(host, port, TIMEOUT_S, CLIENT_CONFIG)
    except SecurityError as e:
        _fail(str(e), EXIT_AUTH)
    except OSError as e:
        _fail(f"cannot reach a broker at {host}:{port}"
              + (f": {e}" if verbose() else ""), EXIT_UNREACHABLE)
    try:
        return conn.request_raw(api_key, version, body) if raw else conn.request(
            api_key, version, body)
    except (OSError, ConnectionError) as e:
            _fail(f"the broker at {host}:{port} did not answer: {e}", EXIT_UNREACHABLE)
    finally:
        conn.close()


@click.group()
def transactions() -> None:
    """List, describe, find hanging and abort transactions (like kafka-transactions.sh)."""


@transactions.command("list")
@bootstrap_option
@click.option("--state", "states", multiple=True,
              help="Only transactions in this state (Empty, Ongoing, PrepareCommit, ...).")
@format_option
def transactions_list(bootstrap: str, states: tuple[str, ...], fmt: str) -> None:
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
    found = sorted(rows[1:], key=lambda r: str(r[0]))
    if fmt == "json":
        emit_json([{"transactional_id": r[0], "coordinator": r[1], "producer_id": r[2],
                    "state": r[3]} for r in found])
        return
    _table(rows[:1] + found)


@transactions.command("describe")
@bootstrap_option
@click.argument("transactional_id")
@format_option
def transactions_describe(bootstrap: str, transactional_id: str, fmt: str) -> None:
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
    if fmt == "json":
        emit_json({"coordinator": c.node_id, "transactional_id": t.transactional_id,
                   "producer_id": t.producer_id, "producer_epoch": t.producer_epoch,
                   "state": t.state, "timeout_ms": t.timeout_ms,
                   "start_ms": None if t.start_ms < 0 else t.start_ms,
                   "duration_ms": None if t.start_ms < 0 else now - t.start_ms,
                   "partitions": [{"topic": tp, "partition": p} for tp, p in t.partitions]})
        return
    _table([("CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
             "TransactionState", "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
             "TransactionDurationMs", "TopicPartitions"),
            (c.node_id, t.transactional_id, t.producer_id, t.producer_epoch, t.state,
             t.timeout_ms, started, duration,
             ",".join(f"{tp}-{p}" for tp, p in t.partitions) or "None")])


DESCRIBE_PRODUCERS_BATCH = 500  # partitions per DescribeProducers (Kafka's tool too)


def _describe_producers(host: str, port: int, tps: list[tuple[str, int]]
                        ) -> dict[tuple[str, int], list[Any]]:
    """DescribeProducers of ``tps`` on one broker: each partition's active producers; a
    partition's error ends the command (as kafka-transactions.sh)."""
    from kio.schema.errors import ErrorCode

    out: dict[tuple[str, int], list[Any]] = {}
    for i in range(0, len(tps), DESCRIBE_PRODUCERS_BATCH):
        by_topic: dict[str, list[int]] = {}
        for t, p in tps[i:i + DESCRIBE_PRODUCERS_BATCH]:
            by_topic.setdefault(t, []).append(p)
        resp = _broker_request(host, port, 61, 0, {"topics": [
            {"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]})
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code != ErrorCode.none:
                    _fail(f"cannot describe the producers of {t.name}-{p.partition_index}: "
                          f"{ErrorCode(p.error_code).name.upper()}"
                          + (f" ({p.error_message})" if p.error_message else ""))
                out[(str(t.name), int(p.partition_index))] = list(p.active_producers)
    return out


def _transactional_ids(brokers: list[Any], producer_ids: set[int]) -> dict[int, str]:
    """ListTransactions filtered by producer id, asked of every broker (each lists the
    ids it coordinates): producer id -> transactional id."""
    out: dict[int, str] = {}
    for b in brokers:
        resp = _broker_request(b.host, b.port, 66, 0, {
            "state_filters": [], "producer_id_filters": sorted(producer_ids)})
        for s in resp.transaction_states:
            if int(s.producer_id) in producer_ids:
                out[int(s.producer_id)] = str(s.transactional_id)
    return out


def _txn_partitions(brokers: list[Any], tid: str) -> set[tuple[str, int]] | None:
    """The partitions of ``tid``'s transaction as its coordinator describes them
    (DescribeTransactions); None if the coordinator does not know the id."""
    from kio.schema.errors import ErrorCode

    from headrace.txn.describe import decode_describe_transactions_v0

    first = brokers[0]
    found = _broker_request(first.host, first.port, 10, 4,
                            {"key_type": 1, "coordinator_keys": [tid]})
    c = found.coordinators[0]
    if c.error_code != ErrorCode.none:
        _fail(f"no coordinator for {tid!r}: {ErrorCode(c.error_code).name.upper()}")
    frame, n = _broker_request(c.host, c.port, 65, 0, {"transactional_ids": [tid]}, raw=True)
    (t,) = decode_describe_transactions_v0(frame, n)
    if t.error_code == ErrorCode.transactional_id_not_found:
        return None
    if t.error_code != ErrorCode.none:
        _fail(f"cannot describe transaction {tid!r}: {ErrorCode(t.error_code).name.upper()}")
    return set(t.partitions)


@transactions.command("find-hanging")
@bootstrap_option
@click.option("--broker-id", type=int, default=None,
              help="Search the partitions this broker holds a replica of (asked of it).")
@click.option("--max-transaction-timeout", "max_timeout_min", type=click.IntRange(min=0),
              default=15, show_default=True,
              help="Minutes: only transactions open longer than this are candidates.")
@click.option("--topic", default=None, help="Only this topic.")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Only this partition (with --topic).")
@format_option
def transactions_find_hanging(bootstrap: str, broker_id: int | None, max_timeout_min: int,
                              topic: str | None, partition: int | None, fmt: str) -> None:
    """Transactions open in a partition that their coordinator does not know of there
    (like kafka-transactions.sh find-hanging): DescribeProducers lists each partition's
    open transactions, ListTransactions and DescribeTransactions ask the coordinators;
    a transaction is hanging when no coordinator knows its producer id, or its
    transaction does not include the partition. Abort one with "abort"."""
    import time

    if topic is None and broker_id is None:
        _fail("find-hanging needs --topic or --broker-id to limit the search")
    if partition is not None and topic is None:
        _fail("--partition needs --topic")
    md = _admin(bootstrap).list_topics(timeout=TIMEOUT_S)
    brokers = sorted(md.brokers.values(), key=lambda b: b.id)
    if not brokers:
        _fail(f"no broker is known to {bootstrap}")
    by_id = {b.id: b for b in brokers}
    if broker_id is not None and broker_id not in by_id:
        _fail(f"broker {broker_id} is not in the cluster (brokers: "
              f"{', '.join(str(b) for b in sorted(by_id))})")
    names = [topic] if topic is not None else sorted(md.topics)
    targets: dict[int, list[tuple[str, int]]] = {}  # broker asked -> its partitions
    for name in names:
        t = md.topics.get(name)
        if t is None or t.error is not None:
            _fail(f"topic '{name}' does not exist")
        for pid, pinfo in sorted(t.partitions.items()):
            if partition is not None and pid != partition:
                continue
            if broker_id is not None:
                if broker_id in pinfo.replicas:
                    targets.setdefault(broker_id, []).append((name, pid))
            elif pinfo.leader >= 0:
                targets.setdefault(pinfo.leader, []).append((name, pid))
    if partition is not None and not any(targets.values()):
        _fail(f"no partition {topic}-{partition}"
              + (f" on broker {broker_id}" if broker_id is not None else ""))
    max_ms = max_timeout_min * 60_000
    now = int(time.time() * 1000)
    candidates: list[tuple[tuple[str, int], Any]] = []
    for node, tps in sorted(targets.items()):
        b = by_id.get(node)
        if b is None:
            continue
        for tp, producers in _describe_producers(b.host, b.port, tps).items():
            candidates += [(tp, ps) for ps in producers
                           if ps.current_txn_start_offset >= 0
                           and now - ps.last_timestamp > max_ms]
    hanging = []
    if candidates:
        tids = _transactional_ids(brokers, {int(ps.producer_id) for _, ps in candidates})
        parts = {tid: _txn_partitions(brokers, tid) for tid in set(tids.values())}
        for tp, ps in candidates:
            tid = tids.get(int(ps.producer_id))
            known = parts.get(tid) if tid is not None else None
            if known is None or tp not in known:
                hanging.append((tp, ps))
    hanging.sort(key=lambda h: (h[0], int(h[1].producer_id)))
    if fmt == "json":
        emit_json([{"topic": tp[0], "partition": tp[1], "producer_id": ps.producer_id,
                    "producer_epoch": ps.producer_epoch,
                    "coordinator_epoch": ps.coordinator_epoch,
                    "start_offset": ps.current_txn_start_offset,
                    "last_timestamp": ps.last_timestamp,
                    "duration_min": (now - ps.last_timestamp) // 60_000}
                   for tp, ps in hanging])
        return
    _table([("Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
             "StartOffset", "LastTimestamp", "Duration(min)"),
            *((tp[0], tp[1], ps.producer_id, ps.producer_epoch, ps.coordinator_epoch,
               ps.current_txn_start_offset, ps.last_timestamp,
               (now - ps.last_timestamp) // 60_000) for tp, ps in hanging)])


@transactions.command("abort")
@bootstrap_option
@click.option("--topic", required=True, help="The partition's topic.")
@click.option("--partition", type=click.IntRange(min=0), required=True,
              help="The partition.")
@click.option("--start-offset", type=click.IntRange(min=0), default=None,
              help="The first offset of the open transaction to abort (find-hanging's "
                   "StartOffset).")
@click.option("--producer-id", type=click.IntRange(min=0), default=None,
              help="Instead of --start-offset: the producer id (with --producer-epoch "
                   "and --coordinator-epoch).")
@click.option("--producer-epoch", type=click.IntRange(min=0, max=32_767), default=None)
@click.option("--coordinator-epoch", type=int, default=None)
def transactions_abort(bootstrap: str, topic: str, partition: int, start_offset: int | None,
                       producer_id: int | None, producer_epoch: int | None,
                       coordinator_epoch: int | None) -> None:
    """Abort a hanging transaction in one partition (like kafka-transactions.sh abort):
    an ABORT marker written by the partition's leader (WriteTxnMarkers, as Kafka's
    admin abortTransaction), which lets read_committed consumers past it. Needs
    ClusterAction on a cluster with ACLs."""
    from kio.schema.errors import ErrorCode

    if start_offset is None and producer_id is None:
        _fail("name the transaction to abort with --start-offset, or with --producer-id, "
              "--producer-epoch and --coordinator-epoch")
    if start_offset is None and (producer_epoch is None or coordinator_epoch is None):
        _fail("--producer-id needs --producer-epoch and --coordinator-epoch")
    md = _admin(bootstrap).list_topics(timeout=TIMEOUT_S)  # naming it would auto-create it
    t = md.topics.get(topic)
    if t is None or t.error is not None or partition not in t.partitions:
        _fail(f"unknown partition {topic}-{partition}")
    leader = md.brokers.get(t.partitions[partition].leader)
    if leader is None:
        _fail(f"{topic}-{partition} has no leader")
    if start_offset is not None:
        producers = _describe_producers(leader.host, leader.port, [(topic, partition)])
        found = next((ps for ps in producers.get((topic, partition), [])
                      if ps.current_txn_start_offset == start_offset), None)
        if found is None:
            _fail(f"no open transaction starts at offset {start_offset} in "
                  f"{topic}-{partition}")
        producer_id, producer_epoch = int(found.producer_id), int(found.producer_epoch)
        coordinator_epoch = int(found.coordinator_epoch)
    assert producer_id is not None and producer_epoch is not None
    coordinator_epoch = max(0, coordinator_epoch or 0)  # Kafka: none (-1) is 0
    resp = _broker_request(leader.host, leader.port, 27, 1, {"markers": [{
        "producer_id": producer_id, "producer_epoch": producer_epoch,
        "transaction_result": False, "coordinator_epoch": coordinator_epoch,
        "topics": [{"name": topic, "partition_indexes": [partition]}]}]})
    codes = [ErrorCode(p.error_code) for m in resp.markers for tr in m.topics
             for p in tr.partitions]
    bad = [c for c in codes if c is not ErrorCode.none]
    if bad or not codes:
        _fail(f"aborting the transaction of producer {producer_id} in {topic}-{partition} "
              f"failed: {bad[0].name.upper() if bad else 'no answer'}")
    click.echo(f"Aborted the transaction of producer {producer_id} (epoch {producer_epoch})"
               f" in {topic}-{partition}.")


# ---------------------------------------------------------------------- cluster info


@click.command("info")
@bootstrap_option
@format_option
def cluster_info(bootstrap: str, fmt: str) -> None:
    """The cluster's id, its controller and its brokers (DescribeCluster)."""
    admin = _admin(bootstrap)
    res = _result(admin.describe_cluster(request_timeout=TIMEOUT_S))
    controller = res.controller.id if res.controller is not None else None
    nodes = sorted(res.nodes, key=lambda n: n.id)
    if fmt == "json":
        emit_json({"cluster_id": res.cluster_id, "controller": controller,
                   "brokers": [{"id": n.id, "host": n.host, "port": n.port, "rack": n.rack}
                               for n in nodes]})
        return
    click.echo(f"Cluster id: {res.cluster_id}")
    click.echo(f"Controller: {'-' if controller is None else controller}")
    click.echo()
    _table([("BROKER", "HOST", "PORT", "RACK", "CONTROLLER"),
            *((n.id, n.host, n.port, n.rack or "-", "yes" if n.id == controller else "")
              for n in nodes)])


@click.command("health")
@bootstrap_option
@format_option
def cluster_health(bootstrap: str, fmt: str) -> None:
    """Is the cluster healthy (as rpk cluster health): the brokers up, those down (named
    as replicas but not registered), the controller, partitions without a live leader and
    under-replicated ones. Exit 0 when healthy (a controller, no broker down, no leaderless
    or under-replicated partition), 1 when not: for scripts."""
    admin = _admin(bootstrap)
    md = admin.list_topics(timeout=TIMEOUT_S)
    up = sorted(md.brokers)
    known: set[int] = set()
    leaderless: list[str] = []
    under: list[str] = []
    for name, t in sorted(md.topics.items()):
        if t.error is not None:
            continue
        for i, p in sorted(t.partitions.items()):
            known |= set(p.replicas)
            if p.leader < 0 or p.leader not in md.brokers:
                leaderless.append(f"{name}-{i}")
            if len(p.isrs) < len(p.replicas):
                under.append(f"{name}-{i}")
    down = sorted(known - set(up))
    controller = md.controller_id if md.controller_id >= 0 else None
    healthy = controller is not None and not down and not leaderless and not under
    if fmt == "json":
        emit_json({"healthy": healthy, "controller": controller, "brokers_up": up,
                   "brokers_down": down, "leaderless_partitions": leaderless,
                   "under_replicated_partitions": under})
    else:
        click.echo(f"Healthy:                          {'true' if healthy else 'false'}")
        click.echo(f"Controller ID:                    {'-' if controller is None else controller}")
        click.echo(f"All nodes:                        {up + down}")
        click.echo(f"Nodes down:                       {down}")
        click.echo(f"Leaderless partitions ({len(leaderless)}):       {leaderless[:20]}")
        click.echo(f"Under-replicated partitions ({len(under)}): {under[:20]}")
    if not healthy:
        raise SystemExit(EXIT_FAILED)


# ---------------------------------------------------------------------- configs


def _config_resource(topic: str | None, broker: int | None, group: str | None = None,
                     **kwargs: Any) -> Any:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ResourceType,
    )

    if sum(x is not None for x in (topic, broker, group)) != 1:
        raise click.UsageError("give one of --topic NAME, --broker ID, --broker-defaults, "
                               "--group GROUP")
    if topic is not None:
        return ConfigResource(ConfigResource.Type.TOPIC, topic, **kwargs)
    if group is not None:
        return ConfigResource(ResourceType.GROUP, group, **kwargs)
    return ConfigResource(ConfigResource.Type.BROKER, str(broker), **kwargs)


def _broker_defaults(bootstrap: str, sets: dict[str, str] | None = None,
                     deletes: tuple[str, ...] = ()) -> list[Any]:
    """The cluster-wide default broker configs (kafka-configs.sh --entity-default): the
    empty resource name, which confluent-kafka cannot send, over headrace's wire client.
    With ``sets``/``deletes``: IncrementalAlterConfigs; then DescribeConfigs' entries."""
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    if sets is not None:
        ops = [{"name": k, "config_operation": 0, "value": v} for k, v in sets.items()]
        ops += [{"name": k, "config_operation": 1, "value": None} for k in deletes]
        resp = _broker_request(host, int(port), 44, 1, {"resources": [{
            "resource_type": 4, "resource_name": "", "configs": ops}],
            "validate_only": False})
        (r,) = resp.responses
        if r.error_code:
            _fail(r.error_message or f"refused (error {int(r.error_code)})")
        return []
    resp = _broker_request(host, int(port), 32, 4, {"resources": [{
        "resource_type": 4, "resource_name": "", "configuration_keys": None}],
        "include_synonyms": False, "include_documentation": False})
    (r,) = resp.results
    if r.error_code:
        _fail(r.error_message or f"refused (error {int(r.error_code)})")
    return list(r.configs)


def _source_name(source: Any) -> str:
    from confluent_kafka.admin import ConfigSource  # type: ignore[attr-defined]

    try:
        return str(ConfigSource(source).name)
    except ValueError:
        return str(getattr(source, "name", source))


def _entity_options(fn: Any) -> Any:
    fn = click.option("--group", default=None,
                      help="A group's configs (Kafka 4.x group configs).")(fn)
    fn = click.option("--broker-defaults", is_flag=True,
                      help="The cluster-wide default broker configs (kafka-configs.sh "
                           "--entity-default).")(fn)
    fn = click.option("--broker", type=click.IntRange(min=0), default=None,
                      help="A broker's configs, by its id.")(fn)
    return click.option("--topic", default=None, help="A topic's configs.")(fn)


def _what(topic: str | None, broker: int | None, group: str | None) -> str:
    return (f"topic {topic}" if topic is not None else f"group {group}" if group is not None
            else f"broker {broker}" if broker is not None else "the default broker configs")


@click.group()
def configs() -> None:
    """Describe and alter topic, broker and group configs (kafka-configs.sh)."""


@configs.command("describe")
@bootstrap_option
@_entity_options
@click.option("--all", "show_all", is_flag=True,
              help="Every config, defaults too (default: only those set).")
@format_option
def configs_describe(bootstrap: str, topic: str | None, broker: int | None,
                     broker_defaults: bool, group: str | None, show_all: bool,
                     fmt: str) -> None:
    """A topic's, a broker's or a group's configs, or the cluster-wide default broker
    configs: name, value and where the value comes from."""
    if broker_defaults:
        if topic is not None or broker is not None or group is not None:
            raise click.UsageError("give one of --topic NAME, --broker ID, "
                                   "--broker-defaults, --group GROUP")
        rows = [{"name": e.name, "value": e.value, "source": _source_name(
                    int(e.config_source)), "read_only": bool(e.read_only),
                 "sensitive": bool(e.is_sensitive)}
                for e in sorted(_broker_defaults(bootstrap), key=lambda e: e.name)]
    else:
        res = _config_resource(topic, broker, group)
        admin = _admin(bootstrap)
        entries = sorted(_result(admin.describe_configs([res])[res]).values(),
                         key=lambda e: e.name)
        if not show_all:
            entries = [e for e in entries if not e.is_default]
        rows = [{"name": e.name, "value": None if e.is_sensitive else e.value,
                 "source": _source_name(e.source),
                 "read_only": bool(e.is_read_only), "sensitive": bool(e.is_sensitive)}
                for e in entries]
    if fmt == "json":
        emit_json(rows)
        return
    what = _what(topic, broker, group)
    if not rows:
        click.echo(f"No configs set on {what} (--all shows the defaults).")
        return
    _table([("NAME", "VALUE", "SOURCE"),
            *((r["name"], "(sensitive)" if r["sensitive"] else r["value"], r["source"])
              for r in rows)])


@configs.command("alter")
@bootstrap_option
@_entity_options
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Set a config (repeatable).")
@click.option("--delete", "deletes", multiple=True, metavar="KEY",
              help="Remove a config: back to its default (repeatable).")
def configs_alter(bootstrap: str, topic: str | None, broker: int | None,
                  broker_defaults: bool, group: str | None,
                  sets: tuple[str, ...], deletes: tuple[str, ...]) -> None:
    """Set or remove a topic's, a broker's or a group's configs, or the cluster-wide
    default broker configs (IncrementalAlterConfigs: brokers apply them at once)."""
    if broker_defaults:
        if topic is not None or broker is not None or group is not None:
            raise click.UsageError("give one of --topic NAME, --broker ID, "
                                   "--broker-defaults, --group GROUP")
        if not sets and not deletes:
            raise click.UsageError("give --set KEY=VALUE and/or --delete KEY")
        _broker_defaults(bootstrap, _pairs(sets, "--set"), deletes)
    else:
        _alter_configs(bootstrap, topic, broker, sets, deletes, group)
    click.echo(f"Altered configs of {_what(topic, broker, group)}.")
