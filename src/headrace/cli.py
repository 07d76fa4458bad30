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

from headrace.cli_support import EXIT_CODES_HELP, EXIT_USAGE, HeadraceGroup, parse_pair, set_verbose
from headrace.config import BrokerConfig, ConfigError, load_properties
from headrace.gc_policy import GcPolicy

LOG_LEVELS = click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                          case_sensitive=False)
PORT = click.IntRange(0, 65535)


def _parse_overrides(pairs: tuple[str, ...]) -> dict[str, str]:
    return dict(parse_pair(pair, "-o") for pair in pairs)


def _check_overrides(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
                     ) -> tuple[str, ...]:
    _parse_overrides(value)  # a bad pair: one line, exit 2, before anything starts
    return value


@click.group(cls=HeadraceGroup, epilog=EXIT_CODES_HELP,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="headrace")
@click.option("--command-config", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              envvar="HEADRACE_COMMAND_CONFIG", show_envvar=True, default=None,
              help="Client properties for the admin commands (as Kafka tools' "
                   "--command-config: security.protocol, sasl.mechanism, sasl.jaas.config, "
                   "ssl.truststore.location, ... or librdkafka's names).")
@click.option("-v", "--verbose", is_flag=True, envvar="HEADRACE_VERBOSE",
              help="Show the Kafka client library's logs and, on an unexpected error, the "
                   "traceback.")
def main(command_config: Path | None, verbose: bool) -> None:
    """headrace: a Kafka-protocol commit log in Python.

    The admin commands find a broker with -b/--bootstrap-server HOST:PORT, else
    $HEADRACE_BOOTSTRAP, else the profile in use (headrace profile), else 127.0.0.1:9092."""
    set_verbose(verbose)
    from headrace.admin_cli import CLIENT_CONFIG
    from headrace.profiles import apply_current, current_command_config

    CLIENT_CONFIG.clear()  # this invocation's settings only (several run in one process)

    apply_current()  # the profile in use, below the command's options and the environment
    if command_config is None:
        command_config = current_command_config()
    if command_config is not None:
        from headrace.admin_cli import CLIENT_CONFIG, client_config

        try:
            CLIENT_CONFIG.update(client_config(load_properties(command_config)))
        except (ConfigError, OSError, UnicodeDecodeError) as e:
            click.echo(f"headrace: --command-config {command_config}: {e}", err=True)
            sys.exit(EXIT_USAGE)


@main.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A server.properties-style file.")
@click.option("--data-dir", type=click.Path(path_type=Path), envvar="HEADRACE_DATA_DIR",
              show_envvar=True, help="Data directory (log.dirs).")
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=PORT, envvar="HEADRACE_PORT", show_envvar=True,
              help="Port to listen on (default 9092; 0 = any free port).")
@click.option("--node-id", "--broker-id", "node_id", type=click.IntRange(min=0),
              help="Broker id (node.id, alias broker.id; default 0).")
@click.option("--zookeeper", default=None, metavar="HOST:PORT[/chroot]",
              help="Join the cluster whose metadata is in this ZooKeeper ensemble "
                   "(zookeeper.connect; default: a single node).")
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              callback=_check_overrides,
              help="Any broker config, e.g. -o num.partitions=4 (repeatable).")
@click.option("--log-level", type=LOG_LEVELS, default="INFO", show_default=True,
              help="The broker's log level.")
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

    configure(log_level.upper())
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
        config.listeners()  # listeners, TLS files, SASL settings: refused before anything
    except (ConfigError, OSError) as e:
        click.echo(f"headrace: invalid configuration: {e}", err=True)
        sys.exit(2)
    import logging

    for note in config.notes:  # Kafka settings with no effect here, extra log dirs
        logging.getLogger("headrace.config").warning("%s", note)

    # SIGUSR1 dumps every thread's stack to stderr (what a stuck broker is doing)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # this process is a broker: freed request buffers stay for the next requests
    from headrace import malloc_policy

    malloc_policy.install()

    async def run() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            b = Broker(config)
            await b.start()
            # this process is a broker: its long-lived objects leave the full collections
            GcPolicy().install()
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


@main.group(invoke_without_command=True)
@click.option("--brokers", type=click.IntRange(1, 32), default=3, show_default=True,
              help="How many brokers to run.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("cluster-data"),
              envvar="HEADRACE_DATA_DIR", show_envvar=True, show_default=True,
              help="ZooKeeper's and every broker's data under here.")
@click.option("--port", type=click.IntRange(1, 65535), default=9092, show_default=True,
              envvar="HEADRACE_PORT", show_envvar=True,
              help="First broker's port; broker N listens on PORT+N-1.")
@click.option("--zookeeper-port", type=click.IntRange(1, 65535), default=2181,
              envvar="HEADRACE_ZOOKEEPER_PORT", show_envvar=True,
              show_default=True, help="ZooKeeper's client port.")
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              callback=_check_overrides,
              help="A broker config for every broker (repeatable).")
@click.option("--log-level", type=LOG_LEVELS, default="INFO", show_default=True,
              help="The brokers' log level.")
@click.pass_context
def cluster(ctx: click.Context, brokers: int, data_dir: Path, port: int, zookeeper_port: int,
            overrides: tuple[str, ...], log_level: str) -> None:
    """Run a local cluster: a ZooKeeper and BROKERS brokers on 127.0.0.1 (Ctrl-C stops
    everything it runs). "headrace cluster info" describes a running cluster,
    "headrace cluster stop-broker N" and "restart-broker N" stop and restart one of its
    brokers."""
    if ctx.invoked_subcommand is not None:
        return
    from headrace.cluster.local import run_local_cluster

    sys.exit(run_local_cluster(brokers, data_dir, port, zookeeper_port, list(overrides),
                               log_level.upper()))


def _control_options(fn: Any) -> Any:
    fn = click.option("--data-dir", type=click.Path(path_type=Path), default=None,
                      help="The running cluster's --data-dir (default: the one given to "
                           "'headrace cluster', else $HEADRACE_DATA_DIR, else cluster-data).")(fn)
    return click.argument("broker_id", metavar="N", type=click.IntRange(min=1))(fn)


def _control(ctx: click.Context, data_dir: Path | None, action: str, broker_id: int) -> None:
    from headrace.cli_support import fail
    from headrace.cluster.local import ControlError, send_request

    if data_dir is None:
        data_dir = ctx.parent.params["data_dir"] if ctx.parent is not None else Path(
            "cluster-data")
    try:
        done, message = send_request(data_dir, action, broker_id)
    except ControlError as e:
        fail(str(e))
    if not done:
        fail(message)
    click.echo(message)


@cluster.command("restart-broker")
@_control_options
@click.pass_context
def restart_broker(ctx: click.Context, broker_id: int, data_dir: Path | None) -> None:
    """Restart broker N of the running "headrace cluster" (start it if it is not running):
    a clean stop, then the same command line, data dir and port; waits until it listens."""
    _control(ctx, data_dir, "restart", broker_id)


@cluster.command("stop-broker")
@_control_options
@click.option("--kill", is_flag=True,
              help="kill -9 instead of a clean stop (a crash, for trying failover).")
@click.pass_context
def stop_broker(ctx: click.Context, broker_id: int, data_dir: Path | None, kill: bool) -> None:
    """Stop broker N of the running "headrace cluster" (SIGTERM: it moves its leadership
    away first; --kill: kill -9). The cluster keeps running; "headrace cluster
    restart-broker N" brings it back."""
    _control(ctx, data_dir, "kill" if kill else "stop", broker_id)


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
    from headrace.admin_cli import (
        cluster_health,
        cluster_info,
        configs,
        groups,
        topics,
        transactions,
    )

    cluster.add_command(cluster_info)
    cluster.add_command(cluster_health)
    main.add_command(configs)
    main.add_command(topics)
    main.add_command(groups)
    main.add_command(transactions)
    from headrace.share_cli import share_groups

    main.add_command(share_groups)
    from headrace.profiles import profile

    main.add_command(profile)
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
    from headrace.webconsole.command import console_command

    main.add_command(console_command)
    from headrace.simulation.command import simulate_command

    main.add_command(simulate_command)


_register_subcommands()

if __name__ == "__main__":
    main()
