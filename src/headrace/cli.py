"""The ``headrace`` command."""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from headrace.config import BrokerConfig, ConfigError, load_properties


def _parse_overrides(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"expected key=value, got {pair!r}", param_hint="-o")
        k, v = pair.split("=", 1)
        out[k.strip()] = v.strip()
    return out


@click.group()
@click.version_option(package_name="headrace")
@click.option("--command-config", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              envvar="HEADRACE_COMMAND_CONFIG", default=None,
              help="Client properties for the admin commands (as Kafka tools' "
                   "--command-config: security.protocol, sasl.mechanism, sasl.jaas.config, "
                   "ssl.truststore.location, ... or librdkafka's names).")
def main(command_config: Path | None) -> None:
    """headrace: a Kafka-protocol commit log in Python."""
    if command_config is not None:
        from headrace.admin_cli import CLIENT_CONFIG, client_config
        from headrace.config import load_properties

        CLIENT_CONFIG.update(client_config(load_properties(command_config)))


@main.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A server.properties-style file.")
@click.option("--data-dir", type=click.Path(path_type=Path), help="Data directory (log.dirs).")
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, help="Port to listen on (default 9092; 0 = any free port).")
@click.option("--node-id", "--broker-id", "node_id", type=int,
              help="Broker id (node.id, alias broker.id; default 0).")
@click.option("--zookeeper", default=None, metavar="HOST:PORT[/chroot]",
              help="Join the cluster whose metadata is in this ZooKeeper ensemble "
                   "(zookeeper.connect; default: a single node).")
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Any broker config, e.g. -o num.partitions=4 (repeatable).")
@click.option("--log-level", default="INFO", show_default=True)
def broker(
    config_file: Path | None,
    data_dir: Path | None,
    host: str | None,
    port: int | None,
    node_id: int | None,
    zookeeper: str | None,
    overrides: tuple[str, ...],
    log_level: str,
) -> None:
    """Run a broker until SIGTERM or SIGINT."""
    from headrace.broker.server import Broker, StartupError
    from headrace.logging_setup import configure

    configure(log_level)
    raw: dict[str, Any] = {}
    try:
        if config_file is not None:
            raw.update(load_properties(config_file))
        raw.update(_parse_overrides(overrides))
        for key, value in (("log.dirs", data_dir), ("host", host), ("port", port),
                           ("node.id", node_id), ("zookeeper.connect", zookeeper)):
            if value is not None:
                raw[key] = str(value)
        config = BrokerConfig.from_mapping(raw)
    except (ConfigError, OSError) as e:
        click.echo(f"headrace: invalid configuration: {e}", err=True)
        sys.exit(2)
    import logging

    for note in config.notes:  # Kafka settings with no effect here, extra log dirs
        logging.getLogger("headrace.config").warning("%s", note)

    # SIGUSR1 dumps every thread's stack to stderr (what a stuck broker is doing)
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    async def run() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            b = Broker(config)
            await b.start()
        except StartupError as e:
            click.echo(f"headrace: cannot start broker: {e}", err=True)
            return 1
        except Exception as e:  # e.g. unreadable metadata or logs
            click.echo(f"headrace: cannot start broker: {e}", err=True)
            return 1
        await stop.wait()
        await b.stop()
        await _cancel_leftover_tasks(5.0)
        return 0

    # not asyncio.run(): its final cancel of left-over tasks waits without a bound, and one
    # task that swallows its cancellation would keep a stopped broker's process alive
    loop = asyncio.new_event_loop()
    try:
        rc = loop.run_until_complete(run())
        try:
            loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(), 10))
        except TimeoutError:  # a worker thread stuck in a blocking call: do not wait for it
            import logging
            logging.getLogger("headrace.broker").warning(
                "a worker thread did not finish within 10 s; exiting anyway")
            logging.shutdown()
            os._exit(rc)
    finally:
        loop.close()
    sys.exit(rc)


async def _cancel_leftover_tasks(timeout_s: float) -> None:
    """Cancel what is still running after a stop; name any task that does not end."""
    import logging

    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for t in tasks:
        t.cancel()
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    if pending:
        names = ", ".join(sorted(str(t.get_coro()) for t in pending))
        logging.getLogger("headrace.broker").warning(
            "%d task(s) did not stop within %.0f s (exiting anyway): %s", len(pending),
            timeout_s, names)


@main.command()
@click.option("--brokers", type=click.IntRange(1, 32), default=3, show_default=True)
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("cluster-data"),
              show_default=True, help="ZooKeeper's and every broker's data under here.")
@click.option("--port", type=int, default=9092, show_default=True,
              help="First broker's port; broker N listens on PORT+N-1.")
@click.option("--zookeeper-port", type=int, default=2181, show_default=True)
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="A broker config for every broker (repeatable).")
@click.option("--log-level", default="INFO", show_default=True)
def cluster(brokers: int, data_dir: Path, port: int, zookeeper_port: int,
            overrides: tuple[str, ...], log_level: str) -> None:
    """Run a local cluster: a ZooKeeper and BROKERS brokers on 127.0.0.1 (Ctrl-C stops)."""
    from headrace.cluster.local import run_local_cluster

    _parse_overrides(overrides)  # a bad pair fails here, once
    sys.exit(run_local_cluster(brokers, data_dir, port, zookeeper_port, list(overrides),
                               log_level))


@main.command("dev-certs")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--host", "hosts", multiple=True, metavar="NAME",
              help="Another name or address the broker certificate is valid for "
                   "(localhost and 127.0.0.1 always are); repeatable.")
@click.option("--client", "clients", multiple=True, metavar="CN",
              help="Also a client certificate with this common name (mutual TLS); "
                   "repeatable.")
def dev_certs(directory: Path, hosts: tuple[str, ...], clients: tuple[str, ...]) -> None:
    """Make a development CA, a broker certificate and client certificates (PEM) in
    DIRECTORY: for TLS listeners in development and tests, not for production."""
    from headrace.security.devcerts import write_dev_certs

    for name, path in write_dev_certs(directory, hosts, clients).items():
        click.echo(f"{name:28} {path}")


def _register_subcommands() -> None:
    from headrace.admin_cli import groups, topics, transactions

    main.add_command(topics)
    main.add_command(groups)
    main.add_command(transactions)
    from headrace.security.cli import acls, quotas, users

    main.add_command(acls)
    main.add_command(users)
    main.add_command(quotas)
    # The Spark pipeline; pyspark is imported only when these run (the ``spark`` extra).
    from headrace.demo import audit_command, demo_command

    main.add_command(demo_command)
    main.add_command(audit_command)
    from headrace.console import consume_command, produce_command

    main.add_command(produce_command)
    main.add_command(consume_command)


_register_subcommands()

if __name__ == "__main__":
    main()
