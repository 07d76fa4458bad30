"""A broker in a background thread of this process, for tests and notebooks.

    with EmbeddedBroker(tmp_path, config={"num.partitions": "4"}) as b:
        producer = Producer({"bootstrap.servers": b.bootstrap_servers})
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from headrace.broker.server import Broker, make_config


class EmbeddedBroker:
    def __init__(
        self, data_dir: Path | str, port: int = 0, config: dict[str, Any] | None = None
    ) -> None:
        self.config = make_config(data_dir, port, **(config or {}))
        self.broker: Broker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None

    @property
    def port(self) -> int:
        assert self.broker is not None, "not started"
        return self.broker.port

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> EmbeddedBroker:
        self._thread = threading.Thread(target=self._run, name="headrace-broker", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("embedded broker did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                self.broker = Broker(self.config)
                await self.broker.start()
            except BaseException as e:
                self._error = e
                self._ready.set()
                return
            self._ready.set()
            await self._stop.wait()
            await self.broker.stop()

        asyncio.run(main())

    def call(self, fn: Any, timeout_s: float = 10.0) -> Any:
        """Run ``fn(broker)`` on the broker's loop and return its result."""
        assert self._loop is not None and self.broker is not None
        broker = self.broker

        async def run() -> Any:
            return fn(broker)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout_s)

    def stop(self, timeout_s: float = 15.0) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive() and self._loop is not None and (
                self._stop is not None):
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                self._loop.call_soon_threadsafe(self._stop.set)
        if thread is not None:
            thread.join(timeout_s)
        self._thread = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
