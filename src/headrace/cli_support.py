"""What every ``headrace`` command shares: exit codes, the ``-b/--bootstrap-server`` option,
``--format``, the reachability check, one-line errors (tracebacks only with ``--verbose``).
"""

from __future__ import annotations

import json
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "HEADRACE_BOOTSTRAP"
CONNECT_TIMEOUT_S = 3.0

# Exit codes (the same for every command; documented in ``headrace --help`` and README)
EXIT_OK = 0
EXIT_FAILED = 1  # the operation failed: the broker refused it, not found, loss found, ...
EXIT_USAGE = 2  # invalid usage or input (click's own code for usage errors)
EXIT_UNREACHABLE = 3  # no broker answered at the bootstrap address(es)
EXIT_AUTH = 4  # TLS or SASL failed (bad certificate, wrong password, unsupported mechanism)
EXIT_AUDIT_ERROR = 5  # `headrace audit` could not run at all (not a loss)
EXIT_INTERRUPTED = 130  # Ctrl-C

EXIT_CODES_HELP = (
    "\b\nExit codes:\n"
    f"  {EXIT_OK}    success\n"
    f"  {EXIT_FAILED}    the operation failed (refused by the broker, not found, ...)\n"
    f"  {EXIT_USAGE}    invalid usage or input\n"
    f"  {EXIT_UNREACHABLE}    cannot reach a broker at the bootstrap address\n"
    f"  {EXIT_AUTH}    TLS or SASL authentication failed\n"
    f"  {EXIT_AUDIT_ERROR}    audit could not run at all\n"
    f"  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)"
)


class _State:
    verbose = False


STATE = _State()


def set_verbose(on: bool) -> None:
    STATE.verbose = on


def verbose() -> bool:
    return STATE.verbose


def fail(msg: str, code: int = EXIT_FAILED) -> NoReturn:
    """One line on stderr and the exit code."""
    click.echo(f"headrace: {msg}", err=True)
    sys.exit(code)


# ---------------------------------------------------------------- options


class _AliasOption(click.Option):
    """An option whose long aliases past the shown ones are accepted but not shown in
    ``--help`` (``--bootstrap``, the old spelling of ``--bootstrap-server``)."""

    def __init__(self, *args: Any, hidden_aliases: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hidden_aliases = hidden_aliases

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        saved = self.opts
        self.opts = [o for o in saved if o not in self.hidden_aliases]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = saved

    def get_error_hint(self, ctx: click.Context | None) -> str:
        return " / ".join(f"'{o}'" for o in self.opts if o not in self.hidden_aliases)


def _check_bootstrap(ctx: click.Context, param: click.Parameter, value: str | None
                     ) -> str | None:
    if value is None:
        return None
    try:
        parse_bootstrap(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value


def bootstrap_option(default: str | None = DEFAULT_BOOTSTRAP,
                     help: str = "host:port of a broker (or several, comma-separated)."
                     ) -> Callable[[F], F]:
    """``-b/--bootstrap-server HOST:PORT``, from ``$HEADRACE_BOOTSTRAP`` when not given."""
    return click.option(
        "-b", "--bootstrap-server", "--bootstrap", "bootstrap", cls=_AliasOption,
        hidden_aliases=("--bootstrap",), default=default, show_default=default is not None,
        envvar=BOOTSTRAP_ENV, show_envvar=True, metavar="HOST:PORT", help=help,
        callback=_check_bootstrap)


format_option = click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="text: a table for people; json: one JSON document for scripts.")


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=False, default=str))


def parse_pair(value: str, what: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the key non-empty) or a usage error naming the option."""
    key, sep, val = value.partition("=")
    if not sep or not key.strip():
        raise click.BadParameter(f"expected KEY=VALUE, got {value!r}", param_hint=what)
    return key.strip(), val.strip()


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{item!r} is not HOST:PORT")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no HOST:PORT given")
    return out


def check_reachable(bootstrap: str, timeout_s: float = CONNECT_TIMEOUT_S) -> tuple[str, int]:
    """Fail at once (exit 3, one line) when no bootstrap address accepts a TCP connection,
    instead of the client libraries' retries and logs; else the address that answered."""
    try:
        addresses = parse_bootstrap(bootstrap)
    except ValueError as e:
        fail(f"--bootstrap-server: {e}", EXIT_USAGE)
    deadline = time.monotonic() + timeout_s
    reasons = []
    for i, (host, port) in enumerate(addresses):
        left = max(0.2, deadline - time.monotonic())
        try:
            socket.create_connection((host, port), timeout=left).close()
        except OSError as e:
            reasons.append(f"{host}:{port} ({e.strerror or e or 'timed out'})")
            continue
        try:
            _probe_kafka(host, port, max(1.0, deadline - time.monotonic()))
        except _ProbeFailed as e:
            if e.code == EXIT_UNREACHABLE and i + 1 < len(addresses):
                # accepted but silent (a paused broker, say): the next address may answer
                reasons.append(f"{host}:{port} ({e})")
                deadline = max(deadline, time.monotonic() + 1.0)
                continue
            fail(str(e), e.code)
        return host, port
    where = ", ".join(f"{h}:{p}" for h, p in addresses)
    detail = f": {'; '.join(reasons)}" if verbose() else ""
    fail(f"cannot reach a broker at {where}{detail}", EXIT_UNREACHABLE)


class _ProbeFailed(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def check_kafka(host: str, port: int, timeout_s: float) -> None:
    """:func:`_probe_kafka`, failing (one line, its exit code) when the probe does."""
    try:
        _probe_kafka(host, port, timeout_s)
    except _ProbeFailed as e:
        fail(str(e), e.code)


def _probe(message: str, code: int) -> NoReturn:
    raise _ProbeFailed(message, code)


def _probe_kafka(host: str, port: int, timeout_s: float) -> None:
    """Fail at once, with one line, when ``host:port`` accepts connections but not this
    client as ``--command-config`` sets it up (issue 26): TLS or SASL refused (a wrong
    password, a certificate) or a TLS/SASL listener reached without its settings: exit 4;
    no Kafka broker there at all: exit 3. The client libraries would only retry for 15 s
    and report a transport error.

    The probe is headrace's wire client: the TLS handshake and SASL exchange, then
    ApiVersions and Metadata (a SASL listener closes a connection that skipped SASL)."""
    from headrace.admin_cli import CLIENT_CONFIG
    from headrace.admin_wire import AdminConnection, SecurityError

    protocol = CLIENT_CONFIG.get("security.protocol", "PLAINTEXT").upper()

    class Probe(AdminConnection):
        MAX_RESPONSE_BYTES = 1 << 20

    where = f"{host}:{port}"

    def not_kafka(e: BaseException) -> NoReturn:
        # a TLS listener refuses a plaintext request at once (it is no TLS record); a
        # silent one (a paused broker) would make this check wait its timeout again
        if (protocol in ("PLAINTEXT", "SASL_PLAINTEXT") and not isinstance(e, TimeoutError)
                and _speaks_tls(host, port, timeout_s)):
            _probe(f"{where} is a TLS listener: give its settings with --command-config "
                 "(security.protocol=SSL or SASL_SSL)", EXIT_AUTH)
        _probe(f"{where} does not answer as a Kafka broker over {protocol}"
             + (f" ({type(e).__name__}: {e})" if verbose() else ""), EXIT_UNREACHABLE)

    try:
        conn = Probe(host, port, timeout_s, CLIENT_CONFIG)
    except SecurityError as e:
        _probe(str(e), EXIT_AUTH)
    except (OSError, ConnectionError, ValueError, EOFError) as e:
        not_kafka(e)
    try:
        conn.request(18, 0, {})
    except Exception as e:  # refused, closed, timed out, or bytes that are not Kafka's
        conn.close()
        not_kafka(e)
    try:
        conn.request(3, 1, {"topics": []})
    except (OSError, ConnectionError, ValueError, EOFError):
        if not protocol.startswith("SASL_"):
            _probe(f"{where} closed the connection before authentication: a SASL listener? "
                 "Give its settings with --command-config (security.protocol=SASL_PLAINTEXT "
                 "or SASL_SSL, sasl.mechanism, sasl.jaas.config)", EXIT_AUTH)
    finally:
        conn.close()


def _speaks_tls(host: str, port: int, timeout_s: float) -> bool:
    """Whether ``host:port`` completes a TLS handshake (its certificate not checked)."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                ctx.wrap_socket(raw, server_hostname=host):
            return True
    except (OSError, ssl.SSLError):
        return False


# ---------------------------------------------------------------- the command group


def reader_gone() -> NoReturn:
    """stdout's reader went away (``headrace groups describe | head``): exit 0 quietly, as
    Unix tools do, instead of a BrokenPipeError. stdout is pointed at /dev/null first so
    the interpreter's final flush of what is still buffered cannot fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real stdout (a test's runner)
        pass
    sys.exit(EXIT_OK)


class HeadraceGroup(click.Group):
    """A group whose commands never end in a traceback: an unexpected error is one line and
    exit 1 (the traceback too with ``--verbose``); Ctrl-C is one line and exit 130."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        """Usage errors as one line (``headrace: ... (see 'CMD --help')``), exit 2."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:
            e.show()
            sys.exit(e.exit_code)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "headrace"
            click.echo(f"headrace: {e.format_message()} (see '{where} --help')", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("headrace: aborted", err=True)
            sys.exit(EXIT_FAILED)
        except KeyboardInterrupt:
            click.echo("headrace: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            reader_gone()
        sys.exit(rv if isinstance(rv, int) else EXIT_OK)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort,
                SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("headrace: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            reader_gone()
        except Exception as e:
            if verbose():
                traceback.print_exc()
            name = type(e).__name__
            fail(f"{name}: {e}" if str(e) else name)
