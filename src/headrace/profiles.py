"""``headrace profile ...``: named connection profiles, as rpk's (issue 26).

A profile is a bootstrap address and, optionally, a ``--command-config`` file (TLS, SASL),
chosen once (``headrace profile use NAME``) instead of ``-b`` and ``--command-config`` on
every command. Precedence, highest first: the command's ``-b`` / ``--command-config``,
then ``$HEADRACE_BOOTSTRAP`` / ``$HEADRACE_COMMAND_CONFIG``, then the profile in use, then
127.0.0.1:9092. Profiles live in ``profiles.json`` under ``$HEADRACE_CONFIG_DIR``, else
``$XDG_CONFIG_HOME/headrace``, else ``~/.config/headrace`` (written atomically, mode 0600:
a profile may name files holding credentials).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import click

from headrace.cli_support import (
    BOOTSTRAP_ENV,
    bootstrap_option,
    emit_json,
    fail,
    format_option,
    parse_bootstrap,
)

PROFILES_FILE = "profiles.json"
COMMAND_CONFIG_ENV = "HEADRACE_COMMAND_CONFIG"


def config_dir() -> Path:
    explicit = os.environ.get("HEADRACE_CONFIG_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "headrace"


def load() -> dict[str, Any]:
    """``{"current": name or None, "profiles": {name: {"bootstrap", "command_config"}}}``;
    an unreadable file is one clear error (exit 2)."""
    path = config_dir() / PROFILES_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"current": None, "profiles": {}}
    except (OSError, ValueError) as e:
        fail(f"{path}: not a profiles file ({e})", 2)
    if not isinstance(doc, dict) or not isinstance(doc.get("profiles"), dict):
        fail(f"{path}: not a profiles file (no \"profiles\" object)", 2)
    return {"current": doc.get("current"), "profiles": doc["profiles"]}


def save(doc: dict[str, Any]) -> None:
    d = config_dir()
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".profiles-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, d / PROFILES_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def apply_current() -> None:
    """Make the profile in use the default of this command (below its own options and the
    environment): called by ``headrace``'s group before a subcommand parses its options."""
    path = config_dir() / PROFILES_FILE
    if not path.exists():
        return
    doc = load()
    name = doc.get("current")
    profile = doc["profiles"].get(name) if name else None
    if not isinstance(profile, dict):
        return
    if profile.get("bootstrap") and not os.environ.get(BOOTSTRAP_ENV):
        os.environ[BOOTSTRAP_ENV] = str(profile["bootstrap"])


def current_command_config() -> Path | None:
    """The profile in use's command-config file, if it names one."""
    path = config_dir() / PROFILES_FILE
    if not path.exists():
        return None
    doc = load()
    name = doc.get("current")
    profile = doc["profiles"].get(name) if name else None
    if isinstance(profile, dict) and profile.get("command_config"):
        return Path(str(profile["command_config"]))
    return None


@click.group("profile")
def profile() -> None:
    """Named connection profiles (a bootstrap address and a --command-config), as rpk's."""


@profile.command("create")
@click.argument("name")
@bootstrap_option(default=None, help="host:port of a broker (or several, comma-separated): "
                                     "the profile's address.")
@click.option("--command-config", type=click.Path(dir_okay=False, exists=True,
                                                  path_type=Path), default=None,
              help="Client properties (TLS, SASL) for this cluster.")
@click.option("--use", "use_it", is_flag=True, help="Use it from now on.")
def create(name: str, bootstrap: str | None, command_config: Path | None,
           use_it: bool) -> None:
    """Create (or replace) a profile."""
    if bootstrap is None:
        raise click.UsageError("give the profile's address: -b HOST:PORT")
    try:
        parse_bootstrap(bootstrap)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--bootstrap-server") from None
    if not name.strip() or "/" in name:
        raise click.BadParameter("a profile name is a non-empty word", param_hint="NAME")
    doc = load()
    doc["profiles"][name] = {"bootstrap": bootstrap, "command_config":
                             str(command_config.resolve()) if command_config else None}
    if use_it:
        doc["current"] = name
    save(doc)
    click.echo(f"Created profile {name}" + (" (in use)." if use_it else "."))


@profile.command("use")
@click.argument("name")
def use(name: str) -> None:
    """Use a profile from now on."""
    doc = load()
    if name not in doc["profiles"]:
        fail(f"no profile '{name}' (headrace profile list)", 1)
    doc["current"] = name
    save(doc)
    click.echo(f"Using profile {name}.")


@profile.command("list")
@format_option
def list_(fmt: str) -> None:
    """Every profile; the one in use is marked."""
    doc = load()
    rows = [{"name": n, "bootstrap": p.get("bootstrap"),
             "command_config": p.get("command_config"), "in_use": n == doc["current"]}
            for n, p in sorted(doc["profiles"].items())]
    if fmt == "json":
        emit_json(rows)
        return
    for r in rows:
        mark = "*" if r["in_use"] else " "
        click.echo(f"{mark} {r['name']}\t{r['bootstrap']}"
                   + (f"\t{r['command_config']}" if r["command_config"] else ""))


@profile.command("delete")
@click.argument("name")
def delete(name: str) -> None:
    """Delete a profile (no profile is in use after deleting the one that was)."""
    doc = load()
    if doc["profiles"].pop(name, None) is None:
        fail(f"no profile '{name}'", 1)
    if doc["current"] == name:
        doc["current"] = None
    save(doc)
    click.echo(f"Deleted profile {name}.")
