"""A headrace broker in a thread of the test process, with ``BrokerProcess``'s interface.

For tests where nothing is killed, paused or restarted: it starts in a fraction of the time
of a broker process (no interpreter start-up, no imports), on 127.0.0.1 and a free port, and
clients still reach it over real TCP. ``call(fn)`` runs ``fn(broker)`` on the broker's own
event loop, so a test can read state a process hides (the memory pool, the coordinators).
``stderr_lines`` holds what the process would have written to stderr since the last start:
the ``headrace`` and ``asyncio`` loggers' records at INFO and above, formatted as the
command formats them, tracebacks included (a handler on those loggers while it runs; any
broker of this process logs there).
Tests that kill, pause or restart a broker use ``tests.brokerproc.BrokerProcess``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from headrace.broker.embedded import EmbeddedBroker
from tests.ports import reserve_port

_LOGGERS = ("headrace", "asyncio")


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines
        self.setFormatter(logging.Formatter(
            "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record) + "\n")


class InProcessBroker:
    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.overrides = dict(overrides or {})
        self.proc = None  # no process: ``alive`` says whether the broker's thread runs
        self._embedded: EmbeddedBroker | None = None
        self.port = reserve_port()  # outside the ephemeral range (tests/ports.py)
        self.stderr_lines: list[str] = []
        self._handler: _Lines | None = None
        self._levels: dict[str, int] = {}

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        e = self._embedded
        return e is not None and e._thread is not None and e._thread.is_alive()

    def start(self, timeout_s: float = 30.0) -> InProcessBroker:
        """Start on ``port`` (a restart keeps it, as ``BrokerProcess`` does, so that
        clients reconnect to the same address)."""
        self.stderr_lines = []
        self._handler = _Lines(self.stderr_lines)
        for name in _LOGGERS:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)
            logger.addHandler(self._handler)
        try:
            self._embedded = EmbeddedBroker(self.data_dir, self.port, self.overrides).start(
                timeout_s)
        except BaseException:
            self._unhook()
            raise
        self.port = self._embedded.port
        return self

    def _unhook(self) -> None:
        if self._handler is not None:
            for name in _LOGGERS:
                logger = logging.getLogger(name)
                logger.removeHandler(self._handler)
                logger.setLevel(self._levels.pop(name, logging.NOTSET))
            self._handler = None

    def call(self, fn: Any, timeout_s: float = 10.0) -> Any:
        """``fn(broker)`` on the broker's event loop; its result."""
        assert self._embedded is not None, "not started"
        return self._embedded.call(fn, timeout_s)

    def acall(self, fn: Any, timeout_s: float = 10.0) -> Any:
        """``await fn(broker)`` on the broker's event loop; its result."""
        embedded = self._embedded
        assert embedded is not None and embedded._loop is not None, "not started"
        return asyncio.run_coroutine_threadsafe(fn(embedded.broker), embedded._loop).result(
            timeout_s)

    def stop(self, timeout_s: float = 15.0) -> None:
        """The graceful path (every log flushed and closed), as SIGTERM to a process."""
        embedded = self._embedded
        if embedded is not None:
            thread = embedded._thread
            embedded.stop(timeout_s)
            self._embedded = None
            self._unhook()
            if thread is not None and thread.is_alive():
                raise RuntimeError(f"the in-process broker did not stop within {timeout_s} s")

    def restart(self) -> InProcessBroker:
        """Stop (gracefully: an in-process broker cannot be killed; tests that kill use
        ``BrokerProcess``) and start again on the same data dir and port."""
        self.stop()
        return self.start()

    def __enter__(self) -> InProcessBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
