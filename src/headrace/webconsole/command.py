"""``headrace console``: the web console, served until Ctrl-C or SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

import click

from headrace.cli_support import (
    EXIT_AUTH,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_UNREACHABLE,
    bootstrap_option,
    check_reachable,
    fail,
    verbose,
)


@click.command("console")
@bootstrap_option()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to serve the console on (another than loopback exposes it, "
                   "topic creation included, to that network: there is no login).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to serve on (0: any free port; the printed URL says which).")
@click.option("--interval", "interval_s", type=click.FloatRange(0.2, 3600), default=2.0,
              show_default=True, metavar="SECONDS",
              help="How often to sample the cluster (tables, throughput and lag charts).")
def console_command(bootstrap: str, host: str, port: int, interval_s: float) -> None:
    """A web console for the cluster: brokers and controller, topics with partitions,
    leaders, ISR, offsets and sizes, consumer groups with members and lag over time,
    throughput charts, a message browser and topic creation.

    Prints its URL, then serves until Ctrl-C. Talks to the cluster over the Kafka protocol
    (with headrace --command-config's TLS and SASL settings)."""
    from headrace.admin_cli import CLIENT_CONFIG
    from headrace.logging_setup import configure
    from headrace.webconsole.model import ApiError, AuthFailed, Unavailable
    from headrace.webconsole.server import Console, ListenError, plotly_js_path, serve
    from headrace.webconsole.source import ClusterSource

    if not plotly_js_path().is_file():
        fail(f"Plotly.js is missing ({plotly_js_path()}): reinstall the plotly package")
    check_reachable(bootstrap)
    configure("INFO")
    source = ClusterSource(bootstrap, dict(CLIENT_CONFIG), quiet=not verbose())
    console = Console(source, interval_s, verbose=verbose())

    def listening(url: str) -> None:
        click.echo(f"headrace console: {url} (cluster at {bootstrap}; Ctrl-C stops)")
        sys.stdout.flush()

    interrupted = False

    async def run() -> None:
        nonlocal interrupted
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_sigint() -> None:
            nonlocal interrupted
            interrupted = True
            stop.set()

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        try:  # the first sample: the tables have data before the URL is printed
            await console.blocking(source.check_connection)
            console.record(await console.blocking(source.snapshot))
        except AuthFailed as e:
            fail(e.message, EXIT_AUTH)
        except ApiError as e:  # the port accepts connections, Kafka does not answer
            fail(f"cannot reach a broker at {bootstrap}"
                 + (f": {e.message}" if verbose() else ""), EXIT_UNREACHABLE)
        if not stop.is_set():  # Ctrl-C during the first sample: no URL
            await serve(console, host, port, stop, listening)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run())
    except ListenError as e:
        fail(str(e), EXIT_FAILED)
    except Unavailable as e:
        fail(e.message, EXIT_UNREACHABLE)
    finally:
        loop.close()
    if interrupted:
        click.echo("headrace: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
