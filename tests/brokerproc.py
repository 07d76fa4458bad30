"""A headrace broker in a child process, as users run it (``headrace broker``).

Integration and fault tests drive it over real TCP on 127.0.0.1; fault tests kill it with
SIGKILL and start it again on the same data dir. Readiness is the ``listening on HOST:PORT``
line on stderr, waited for with a deadline (never a sleep).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.ports import reserve_port

_LISTENING = re.compile(r"listening on ([\d.]+):(\d+)")


class BrokerProcess:
    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None,
                 port: int = 0) -> None:
        self.data_dir = Path(data_dir)
        self.overrides = dict(overrides or {})
        # outside the ephemeral range, so that a restart finds it free (tests/ports.py)
        self.port = port or reserve_port()
        self.proc: subprocess.Popen[str] | None = None
        self.stderr_lines: list[str] = []

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> BrokerProcess:
        args = [sys.executable, "-m", "headrace.cli", "broker", "--data-dir", str(self.data_dir),
                "--port", str(self.port)]
        for k, v in self.overrides.items():
            args += ["-o", f"{k}={v}"]
        self.stderr_lines = []
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        found = threading.Event()  # the listening line, or stderr's end
        listening = threading.Event()  # the listening line itself
        lines = self.stderr_lines
        proc = self.proc

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)
                m = _LISTENING.search(line)
                if m and not listening.is_set():
                    self.port = int(m.group(2))
                    listening.set()
                    found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        if (not found.wait(timeout_s) or not listening.is_set()
                or self.proc.poll() is not None):
            self.kill()
            raise RuntimeError("broker did not start:\n" + "".join(lines))
        return self

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait: the graceful path (flush and close every log)."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise RuntimeError("broker did not stop within the timeout") from None
        self.proc = None
        return rc

    def kill(self) -> None:
        """SIGKILL: no flush, no close (kill -9)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def restart(self, graceful: bool = True) -> BrokerProcess:
        if graceful:
            self.stop()
        else:
            self.kill()
        return self.start()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            try:
                self.stop()
            except RuntimeError:
                self.kill()


def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.02,  # type: ignore[no-untyped-def]
               what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)
