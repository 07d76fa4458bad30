"""A local ZooKeeper server from Debian's ``zookeeper`` package (tests, ``headrace cluster``).

Standalone, on 127.0.0.1, ``tickTime=500`` so session timeouts down to 1 s are allowed
(fault tests use 4 s), the admin server off; its output goes to ``DIR/zookeeper.out``.
Readiness is a ``ruok`` answered ``imok`` (polled with a deadline). ``stop`` kills the
process group (no stray JVM) and waits for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

ZK_SERVER = Path("/usr/share/zookeeper/bin/zkServer.sh")


class ZooKeeperUnavailable(Exception):
    """ZooKeeper is not installed, or did not start."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ruok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"ruok")
            return s.recv(4) == b"imok"
    except OSError:
        return False


def four_letter_word(port: int, word: str, timeout_s: float = 10.0) -> str:
    """The answer of a four-letter word (``mntr``, ``wchs``, ``wchp``: whitelisted)."""
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(word.encode())
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def watches_by_path(port: int, prefix: str = "/") -> dict[str, int]:
    """Watched path -> how many sessions watch it (``wchp``), for paths under ``prefix``
    (a chroot: the server names paths with it)."""
    out: dict[str, int] = {}
    path = None
    for line in four_letter_word(port, "wchp").splitlines():
        if not line.strip():
            continue
        if line.startswith((" ", "\t")):
            if path is not None:
                out[path] = out.get(path, 0) + 1
            continue
        path = line.strip() if line.strip().startswith(prefix) else None
    return out


class ZooKeeperServer:
    def __init__(self, directory: Path, port: int = 0) -> None:
        self.directory = Path(directory)
        self.port = port or _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def connect_string(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> ZooKeeperServer:
        if not ZK_SERVER.exists():
            raise ZooKeeperUnavailable(
                "ZooKeeper is not installed: apt-get install zookeeper")
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.directory / "zoo.cfg"
        cfg.write_text("\n".join([
            "tickTime=500", f"dataDir={data}", f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1", "admin.enableServer=false",
            "minSessionTimeout=1000", "maxSessionTimeout=60000",
            "4lw.commands.whitelist=ruok,srvr,stat,mntr,wchs,wchp", "maxClientCnxns=0",
            ""]))
        out = open(self.directory / "zookeeper.out", "ab")  # noqa: SIM115 (the child's)
        env = {**os.environ, "ZOOCFGDIR": str(self.directory), "ZOO_LOG_DIR": str(self.directory),
               "JVMFLAGS": "-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1"}
        self.proc = subprocess.Popen([str(ZK_SERVER), "start-foreground", str(cfg)],
                                     stdout=out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        out.close()
        deadline = time.monotonic() + timeout_s
        while not _ruok(self.port):
            if self.proc.poll() is not None:
                raise ZooKeeperUnavailable(
                    f"ZooKeeper exited (code {self.proc.returncode}); see "
                    f"{self.directory / 'zookeeper.out'}")
            if time.monotonic() > deadline:
                self.stop()
                raise ZooKeeperUnavailable(f"ZooKeeper did not answer within {timeout_s:.0f} s")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
