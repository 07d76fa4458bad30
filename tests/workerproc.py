"""A test's worker child process (``python -m tests.... worker ...``), as fault tests drive it:
started with its stderr in a log file, stopped with SIGTERM (bounded) or killed with SIGKILL."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class WorkerProcess:
    def __init__(self, args: list[str], log: Path) -> None:
        self.args = args
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=subprocess.DEVNULL,
                                         stderr=log)
        return self

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        """True while it runs; fails the test with its log if it exited."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited {self.proc.returncode}:\n" + self.log_text())
        return True

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: alive but silent (a zombie once a successor takes over)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # if paused
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise
