"""``headrace topics ...``: kafka-topics.sh-like administration over the Kafka protocol.

Talks to any Kafka-compatible broker through confluent-kafka's AdminClient, so it works
against headrace and Kafka alike.
"""

from __future__ import annotations

import sys
from typing import Any

import click

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
TIMEOUT_S = 15.0


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})


def _pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        if "=" not in v:
            raise click.BadParameter(f"expected key=value, got {v!r}", param_hint=what)
        k, val = v.split("=", 1)
        out[k.strip()] = val.strip()
    return out


def _fail(msg: str) -> None:
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
    from confluent_kafka.admin import NewTopic

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
    from confluent_kafka.admin import ConfigResource

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
    from confluent_kafka.admin import (
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
