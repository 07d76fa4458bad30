"""The broker process: an asyncio server over the sans-IO protocol and storage cores.

``Connection`` turns bytes into frames (``FrameDecoder``), frames into requests
(``decode_request``), runs the handler for each request in arrival order and writes the
responses in that order (R-PROTO-1: one request at a time per connection, as Kafka does).
A peer's bad bytes (``ProtocolError``) close only that connection. A fully received request
is handled even if the client disconnects right after sending it (acks=0 producers).

Shutdown is a fixed, bounded sequence: stop accepting → wake parked requests → let
connections finish their current request (with a timeout) → cancel → flush and close logs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
from pathlib import Path
from typing import Any

from headrace.broker.group_service import GroupService
from headrace.broker.handlers import HANDLERS, RequestContext
from headrace.broker.replica_manager import ReplicaManager
from headrace.broker.topics import TopicAdmin
from headrace.clock import SYSTEM_CLOCK, Clock
from headrace.config import BrokerConfig
from headrace.log.log_dir import DataDirError, prepare_data_dir
from headrace.metadata.store import BrokerInfo, LocalMetadataStore, MetadataStore
from headrace.protocol.codec import (
    decode_request,
    encode_api_versions_fallback,
    encode_response_chunks,
)
from headrace.protocol.errors import ProtocolError, UnknownApiError
from headrace.protocol.framing import FrameDecoder

log = logging.getLogger("headrace.broker")

API_VERSIONS = 18
WRITE_HIGH_WATER = 4 * 1024 * 1024
QUEUE_HIGH_WATER = 64
FLUSH_SCHEDULER_INTERVAL_MS = 1000  # how often flush.ms is checked between appends
_IOV_MAX = 1024  # Linux's limit on writev's buffer count


class StartupError(Exception):
    """The broker cannot start (port taken, data dir unusable, bad metadata)."""


class ProducerIdAllocator:
    """Hands out producer ids from blocks reserved (and persisted) in the metadata store."""

    BLOCK = 1000

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._next = 0
        self._end = 0

    def next(self) -> int:
        if self._next >= self._end:
            self._next = self._store.allocate_producer_ids(self.BLOCK)
            self._end = self._next + self.BLOCK
        pid = self._next
        self._next += 1
        return pid


class Connection(asyncio.Protocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.decoder = FrameDecoder(int(broker.config["socket.request.max.bytes"]))
        self.frames: collections.deque[bytes | memoryview] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.closed = False
        self._wakeup = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading_paused = False
        self._fd = -1
        self.task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            self._fd = sock.fileno()
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.task = asyncio.get_running_loop().create_task(self._serve())
        self.broker.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except ProtocolError as e:
            self._protocol_error(e)
            return
        if frames:
            self.frames.extend(frames)
            self._wakeup.set()
            if len(self.frames) > QUEUE_HIGH_WATER and not self._reading_paused:
                assert self.transport is not None
                self.transport.pause_reading()
                self._reading_paused = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()
        self._wakeup.set()  # the server task drains fully received frames, then ends

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # ------------------------------------------------------------ request loop
    def _protocol_error(self, e: Exception) -> None:
        log.warning("closing connection from %s: %s", self.peer, e)
        self.frames.clear()
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.closed = True
        self._wakeup.set()

    async def _serve(self) -> None:
        try:
            while True:
                if not self.frames:
                    if self.closed:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                frame = self.frames.popleft()
                if self._reading_paused and len(self.frames) < QUEUE_HIGH_WATER // 2:
                    self._reading_paused = False
                    if self.transport is not None and not self.closed:
                        self.transport.resume_reading()
                response = await self._handle(frame)
                if response is not None and not self.closed:
                    self._write(response)
                    if not self._writable.is_set():
                        await self._writable.wait()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("connection from %s failed; closing it", self.peer)
            self.close()
        finally:
            self.broker.connections.discard(self)

    def _write(self, chunks: list[bytes | memoryview]) -> None:
        """Write a response given as chunks. When nothing is queued in the transport, the
        chunks go to the socket in one ``writev`` without being joined (a Fetch response's
        records are never copied in user space); only what the kernel did not take is
        joined and handed to the transport, which sends it when the socket is writable."""
        transport = self.transport
        assert transport is not None
        if len(chunks) == 1:
            transport.write(chunks[0])
            return
        if (self._fd < 0 or transport.is_closing() or transport.get_write_buffer_size()
                or len(chunks) > _IOV_MAX):
            transport.write(b"".join(chunks))
            return
        try:
            sent = os.writev(self._fd, chunks)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # let the transport see and report the error
            transport.write(b"".join(chunks))
            return
        for i, chunk in enumerate(chunks):
            n = len(chunk)
            if sent < n:
                rest = [memoryview(chunk)[sent:], *chunks[i + 1 :]] if sent else chunks[i:]
                transport.write(b"".join(rest))
                return
            sent -= n

    async def _handle(self, frame: bytes | memoryview) -> list[bytes | memoryview] | None:
        try:
            request = decode_request(frame)
        except UnknownApiError as e:
            if e.api_key == API_VERSIONS:
                return self._api_versions_fallback(e.correlation_id)
            self._protocol_error(e)
            return None
        except ProtocolError as e:
            self._protocol_error(e)
            return None
        header = request.header
        h = HANDLERS.get(header.api_key)
        if h is None or not h.min_version <= header.api_version <= h.max_version:
            if header.api_key == API_VERSIONS:
                return self._api_versions_fallback(header.correlation_id)
            self._protocol_error(
                ProtocolError(
                    f"unsupported API key {header.api_key} version {header.api_version}"
                )
            )
            return None
        ctx = RequestContext(header, self.peer)
        body = await h.fn(self.broker, ctx, request.body)
        if body is None:
            return None
        return encode_response_chunks(
            header.api_key, header.api_version, header.correlation_id, body
        )

    def _api_versions_fallback(self, correlation_id: int) -> list[bytes | memoryview]:
        """Kafka answers an ApiVersions version it does not know with a v0 response
        carrying UNSUPPORTED_VERSION and its own ranges, so the client can retry lower."""
        from kio.schema.errors import ErrorCode

        from headrace.broker.handlers.api_versions import advertised_versions

        return [encode_api_versions_fallback(
            correlation_id, ErrorCode.unsupported_version, advertised_versions()
        )]


class Broker:
    """One broker: config, metadata, partitions and the listener."""

    def __init__(self, config: BrokerConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self.node_id = config.node_id
        self.data_dir = config.data_dir
        self.connections: set[Connection] = set()
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.host = str(config["host"])
        self.port = int(config["port"])
        self._prepare_data_dir()
        try:
            self.metadata: MetadataStore = LocalMetadataStore(
                self.data_dir, BrokerInfo(self.node_id, self.host, self.port),
                str(config["cluster.id"]),
            )
        except BaseException:
            self._dir_lock.release()
            raise
        self.replicas = ReplicaManager(self.data_dir, config, self.metadata, clock)
        self.topics = TopicAdmin(config, self.metadata, self.replicas)
        self.producer_ids = ProducerIdAllocator(self.metadata)
        self.groups = GroupService(self)

    def _prepare_data_dir(self) -> None:
        try:
            self._dir_lock = prepare_data_dir(self.data_dir)
        except DataDirError as e:
            raise StartupError(str(e)) from None

    def advertised_brokers(self) -> list[BrokerInfo]:
        host = str(self.config["advertised.host"]) or self.host
        port = int(self.config["advertised.port"]) or self.port
        out = []
        for b in self.metadata.live_brokers():
            if b.node_id == self.node_id:
                out.append(BrokerInfo(b.node_id, host, port, b.rack))
            else:
                out.append(b)
        return out

    async def start(self) -> None:
        """Recover logs, then listen. Raises StartupError with a clear message."""
        loop = asyncio.get_running_loop()
        self.replicas.load()
        self.groups.start()
        try:
            self._server = await loop.create_server(
                lambda: Connection(self), self.host, self.port, reuse_address=True,
                backlog=1024,
            )
        except OSError as e:
            self.replicas.close()
            self._dir_lock.release()
            if e.errno == errno.EADDRINUSE:
                raise StartupError(f"port {self.port} on {self.host} is already in use") from None
            raise StartupError(f"cannot listen on {self.host}:{self.port}: {e.strerror}") from None
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        self._spawn(self._retention_loop())
        self._spawn(self._flush_loop())
        self._spawn(self.groups.run(self._stopped))
        log.info("headrace broker %d listening on %s:%d (data dir %s, %d partitions)",
                 self.node_id, self.host, self.port, self.data_dir, len(self.replicas.partitions))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed: %r", task.exception())

    async def _flush_loop(self) -> None:
        """Kafka's log flusher: fsync logs whose ``flush.ms`` has passed (R-LOG-7)."""
        interval = FLUSH_SCHEDULER_INTERVAL_MS / 1000
        while not self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), interval)
            if self.stopping:
                return
            self.replicas.flush_due()

    async def _retention_loop(self) -> None:
        interval = int(self.config["log.retention.check.interval.ms"]) / 1000
        while not self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), interval)
            if self.stopping:
                return
            await self.replicas.run_retention()

    async def stop(self, timeout_s: float = 5.0) -> None:
        if self.stopping:
            return
        self.stopping = True
        self._stopped.set()
        if self._server is not None:
            self._server.close()
        # wake every parked long poll and group request so it answers now
        self.groups.close()
        for tp in list(self.replicas._watchers):
            self.replicas.wake(tp)
        conns = list(self.connections)
        for c in conns:
            c.closed = True
            c._wakeup.set()
        tasks = [c.task for c in conns if c.task is not None] + list(self._tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        for c in conns:
            if c.transport is not None:
                c.transport.close()
        self.replicas.close()
        self._dir_lock.release()
        log.info("headrace broker %d stopped", self.node_id)

    async def serve_forever(self, stop: asyncio.Event) -> None:
        await self.start()
        await stop.wait()
        await self.stop()


def make_config(data_dir: Path | str, port: int = 0, **overrides: Any) -> BrokerConfig:
    return BrokerConfig.from_mapping({"log.dirs": str(data_dir), "port": port, **overrides})
