"""The broker process: an asyncio server over the sans-IO protocol and storage cores.

``Connection`` turns bytes into frames (``FrameDecoder``), frames into requests
(``decode_request``), runs the handler for each request in arrival order and writes the
responses in that order (R-PROTO-1: one request at a time per connection, as Kafka does).
A peer's bad bytes (``ProtocolError``) close only that connection. When a client
disconnects, its queued requests are dropped, except a fully received Produce, which is
still applied (acks=0 producers close right after sending).

Resource bounds (R-NF-3), Kafka's settings: every frame reserves its size from one memory
pool shared by all connections (``queued.max.request.bytes``) when its size prefix arrives,
and its connection is not read while that waits. ``queued.max.requests`` counts complete
requests only (as Kafka queues only complete requests): past it a connection's next frame
waits, unless the connection has nothing queued (so pipelining clients cannot starve the
rest). A prefix is a promise, so what a connection may hold before its bytes arrive is
bounded (issue 23): one frame in progress per connection, which must be complete within
``request.receive.timeout.ms``; per address at most ``queued.max.unreceived.bytes.per.ip``
reserved for bytes not yet arrived; before SASL authentication nothing is reserved from the
pool (frames of at most ``sasl.server.max.receive.size``, buffered as their bytes arrive).
A connection that completes no request (on SASL: authentication) within
``connections.first.request.timeout.ms`` is closed. A full pool is logged (paced).
Responses nobody reads stop their connection; past the
pool's size in unread responses, Fetches wait their turn (those with nothing queued behind
first), a Fetch's max_bytes is capped by what is left, and connections that took none of
their response for ``STALLED_RESPONSE_S`` are closed. ``connections.max.idle.ms``,
``max.connections`` and ``max.connections.per.ip`` close or refuse connections; EMFILE in
accept and handler exceptions are one log line, not a traceback.
``sasl.server.max.receive.size`` (the limit before authentication) takes effect with SASL
(issue 12); there is nothing to authenticate on a PLAINTEXT listener, so it is not applied.

Shutdown is a fixed, bounded sequence: stop accepting → wake parked requests → let
connections finish their current request (with a timeout) → cancel → flush and close logs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import dataclasses
import errno
import logging
import os
import resource
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.fetch_sessions import FetchSessionCache
from headrace.broker.group_service import GroupService
from headrace.broker.handlers import HANDLERS, RequestContext
from headrace.broker.memory_pool import (
    ConnectionQuotas,
    LogPacer,
    MemoryPool,
    UnreceivedBudget,
    idle_connections,
    parse_per_ip_overrides,
)
from headrace.broker.metrics import BrokerMetrics
from headrace.broker.replica_manager import ReplicaManager
from headrace.broker.share_coordinator import CoordinatorPersister, ShareCoordinatorService
from headrace.broker.share_partitions import SharePartitionManager
from headrace.broker.share_persister import ShareGroupListener, SharePersister
from headrace.broker.topics import TopicAdmin
from headrace.broker.txn_service import TxnService
from headrace.clock import SYSTEM_CLOCK, Clock
from headrace.config import BrokerConfig, ConfigError
from headrace.log.log_dir import DataDirError, prepare_data_dir
from headrace.log.segment import FileRegion
from headrace.metadata.store import BrokerInfo, Endpoint, LocalMetadataStore, MetadataStore
from headrace.protocol.codec import (
    RegionChunks,
    decode_request,
    encode_api_versions_fallback,
    encode_response_chunks,
    response_class,
)
from headrace.protocol.entities import error_response
from headrace.protocol.errors import ProtocolError, UnknownApiError
from headrace.protocol.framing import Frame, FrameDecoder
from headrace.security.listeners import Listener, map_principal
from headrace.security.principal import ANONYMOUS, Principal, user
from headrace.security.sasl import (
    Authenticator,
    JwksKeys,
    OAuthBearerServer,
    PlainServer,
    SaslFailure,
    ScramServer,
)
from headrace.security.scram import ScramCredential
from headrace.security.tls import certificate_dn

log = logging.getLogger("headrace.broker")

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
WRITE_HIGH_WATER = 4 * 1024 * 1024
QUEUE_HIGH_WATER = 64
# Produce requests of one connection applied and waiting for replication at once (their
# frames stay charged to the request memory pool until answered). 16 -> 256: after the
# kill -9 of a broker leading 3,334 partitions, every one acks=all-writable again at
# 13.2 s instead of 32.4 s (librdkafka: one partition per Produce request, bench/
# cluster_bench.py --scale 10000); 1,024 measured no better (15.8 s).
MAX_PIPELINED_PRODUCE = 256
LOG_PACE_S = 10.0  # at most one line per this many seconds for a repeated event
FLUSH_SCHEDULER_INTERVAL_MS = 1000  # how often flush.ms is checked between appends
_IOV_MAX = 1024  # Linux's limit on writev's buffer count


TRIM_AFTER_BYTES = 16 * 1024 * 1024
# with unread responses over the budget and a Fetch waiting, a connection that has taken
# none of its response for this long is closed
STALLED_RESPONSE_S = 2.0


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024


def _glibc(name: str) -> Any:
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):  # not glibc
        return None


_malloc_trim = _glibc("malloc_trim")


def _fix_mmap_threshold() -> None:
    """Allocations of 4 MiB and more (big frames, responses left in a transport, big
    reads) get their own mapping, given back to the kernel when freed. glibc otherwise
    raises this threshold each time such a block is freed (up to 32 MiB), after which
    they come from a heap that keeps its high-water mark: RSS would stay at the peak of
    the last burst."""
    mallopt = _glibc("mallopt")
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


# Metadata and DescribeCluster wait this long for a controller while none is known
# (``Broker.known_controller``), looking every CONTROLLER_POLL_S
CONTROLLER_WAIT_S = 2.0
CONTROLLER_POLL_S = 0.01


class StartupError(Exception):
    """The broker cannot start (port taken, data dir unusable, bad metadata)."""


class ProducerIdAllocator:
    """Hands out producer ids from blocks reserved (and persisted) in the metadata store."""

    BLOCK = 1000

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._next = 0
        self._end = 0
        # when InitProducerId last logged that no block could be reserved (monotonic)
        self.unavailable_logged_at: float | None = None

    def next(self) -> int:
        if self._next >= self._end:
            self._next = self._store.allocate_producer_ids(self.BLOCK)
            self._end = self._next + self.BLOCK
        pid = self._next
        self._next += 1
        return pid

    async def next_async(self) -> int:
        """``next``, with a new block reserved in a worker thread (a cluster's block is a
        ZooKeeper round trip, which must not stall the event loop)."""
        if self._next >= self._end:
            first = await asyncio.to_thread(self._store.allocate_producer_ids, self.BLOCK)
            if self._next >= self._end:  # nobody else refilled it meanwhile
                self._next, self._end = first, first + self.BLOCK
        return self.next()


if TYPE_CHECKING:
    from headrace.broker.cluster_node import ClusterNode

_PRODUCE = 0
_FETCH = 1


def _api_key(frame: Frame) -> int:
    return int.from_bytes(frame[:2], "big", signed=True) if len(frame) >= 2 else -1


class _Wakeup:
    """``asyncio.Event`` for the one task that waits on it (a connection's request loop),
    which can also wait for "this event or that future" without a task per wait: the
    request loop waits so for every acks=all Produce (``asyncio.wait`` over the produce and
    an ``Event.wait`` task was a fifth of a small Produce's broker CPU)."""

    __slots__ = ("_flag", "_waiter")

    def __init__(self) -> None:
        self._flag = False
        self._waiter: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._flag = False

    async def wait(self, also: asyncio.Future[Any] | None = None) -> None:
        """Until ``set`` (at once if it is), or until ``also`` is done."""
        if self._flag or (also is not None and also.done()):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(_: object) -> None:
            if not waiter.done():
                waiter.set_result(None)

        self._waiter = waiter
        if also is not None:
            also.add_done_callback(done)
        try:
            await waiter
        finally:
            self._waiter = None
            if also is not None:
                also.remove_done_callback(done)


class Connection(asyncio.Protocol):
    """One client connection: frames in, requests handled one at a time, responses out.

    Reading stops ("muted", as Kafka says) while the next frame waits for its reservation
    (``waiting``: the broker already holds ``queued.max.requests`` requests, or the memory
    pool, ``queued.max.request.bytes``, cannot give the frame's size yet) or while this
    connection has ``QUEUE_HIGH_WATER`` frames queued (``queue``) or while its responses
    are not being read (``writing``). A connection whose responses
    are not being read handles nothing more until they drain (R-NF-3)."""

    def __init__(self, broker: Broker, listener: Listener) -> None:
        self.broker = broker
        self.pool = broker.memory_pool
        max_frame = min(int(broker.config["socket.request.max.bytes"]), self.pool.max_single)
        self._max_frame = max_frame
        self.decoder = FrameDecoder(max_frame, self._reserve)
        self.spec = listener
        # SASL (issue 12): "handshake" -> "authenticate" -> "done"; None on a listener
        # without SASL. Before "done" a frame may not exceed sasl.server.max.receive.size.
        self.sasl_state: str | None = None
        self._authenticator: Authenticator | None = None
        self._session_end: float | None = None  # KIP-368: monotonic end of the session
        # not yet authenticated on a SASL listener: nothing from the shared pool (issue 23)
        self._pre_auth = listener.uses_sasl
        if listener.uses_sasl:
            self.sasl_state = "handshake"
            self.decoder.max_frame_bytes = min(
                max_frame, int(broker.config["sasl.server.max.receive.size"]))
            self.decoder.lazy = True
        self.frames: collections.deque[Frame] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.ip = "?"
        # who is on the other end (issue 12): set by authentication on a SASL or mutual-TLS
        # listener; the listener's name
        self.principal: Principal = ANONYMOUS
        self.listener = listener.name
        self.closed = False
        self.admitted = False
        self._wakeup = _Wakeup()
        self._writable = asyncio.Event()
        self._writable.set()
        self._muted: set[str] = set()
        self._fd = -1
        self._unsent = 0  # response bytes left in the transport (counted by the broker)
        self._handling = False
        # frames reserved, not yet returned by the decoder: from the pool or not (before
        # authentication); ids of queued frames that hold no pool memory
        self._kinds: collections.deque[bool] = collections.deque()
        self._unpooled: set[int] = set()
        self._slotted_ahead = 0  # frames complete at their reservation (slot already taken)
        self._unreceived = 0  # this connection's part of broker.unreceived
        self._frame_started: float | None = None  # when the frame in progress started
        self._waiting_on = ""  # what a refused reservation waits for: slot, address, pool
        self.proven = False  # completed a request (on a SASL listener: authenticated)
        self.new_since = broker.now()
        self._close_when_written = False  # a failed authentication: close after the answer
        self.last_activity = broker.now()
        self.last_write_progress = self.last_activity
        self._seen_write_buffer = 0
        self.task: asyncio.Task[None] | None = None
        # client quotas (issue 12): while throttled, nothing is read or handled
        self._throttle_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.ip = str(peer[0]) if peer else "?"
        if not self.broker.admit(self):
            self.closed = True
            transport.abort()
            return
        self.admitted = True
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            self._fd = sock.fileno()
        if self.spec.uses_tls and not self.spec.uses_sasl:
            # mutual TLS: the client certificate's distinguished name, mapped by
            # ssl.principal.mapping.rules, is the principal (Kafka's SSL listener)
            ssl_object = transport.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object else None
            if der:
                try:
                    self.principal = user(map_principal(self.spec.principal_rules,
                                                        certificate_dn(der)))
                except ValueError as e:
                    log.warning("closing TLS connection from %s: %s", self.peer, e)
                    self.closed = True
                    transport.abort()
                    return
        self.task = asyncio.get_running_loop().create_task(self._serve())
        self.broker.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            frames = self.decoder.feed(data)
        except ProtocolError as e:
            self._take(getattr(e, "frames", []))
            self._protocol_error(e)
            return
        self._take(frames)
        self._after_feed(bool(frames))
        if self.decoder.waiting_set:
            self._mute("waiting")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.admitted:
            self.admitted = False
            self.broker.quotas.release(self.ip)
        self._drop_queued()
        self._writable.set()
        self.broker.wake_response_waiters()  # a Fetch of ours may wait for room: end it
        self._wakeup.set()  # the server task drains what must still be applied, then ends

    def pause_writing(self) -> None:
        self._writable.clear()
        self._mute("writing")  # a peer not reading its responses sends nothing more in

    def _after_feed(self, completed: bool) -> None:
        """After the decoder ran: this connection's bytes reserved and not yet received
        (the address's budget), and when its frame in progress started."""
        decoder = self.decoder
        actual = decoder.unreceived if self._kinds and self._kinds[-1] else 0
        if actual != self._unreceived:
            delta, self._unreceived = actual - self._unreceived, actual
            self.broker.unreceived_changed(self.ip, delta)
        if not decoder.in_progress:
            self._frame_started = None
        elif completed or self._frame_started is None:
            self._frame_started = self.broker.now()

    def receive_overdue(self, now: float, timeout_s: float) -> bool:
        """``request.receive.timeout.ms``: a frame in progress for that long, counted only
        while the broker reads this connection."""
        started = self._frame_started
        return started is not None and not self._muted and now - started >= timeout_s

    def resume_writing(self) -> None:
        self._set_unsent(0)
        self.last_activity = self.last_write_progress = self.broker.now()
        self._writable.set()
        self.unmute("writing")

    # ------------------------------------------------------------ flow control
    def _reserve(self, size: int) -> bool:
        """The decoder asks for a frame's slot and memory as its size prefix arrives: one
        of ``queued.max.requests``, then ``size`` bytes of the pool. Refused: the decoder
        keeps its bytes and the connection is muted until ``resume_decoding``."""
        broker = self.broker
        if (broker.queued_requests >= broker.max_queued_requests
                and (self.frames or self._slotted_ahead or self._handling)):
            # every connection may always have one request in (as Kafka, which reads a
            # connection's next request only once the previous one is answered): a few
            # clients that pipeline and never read cannot starve the others of slots.
            # Only complete requests hold a slot (issue 23): frames still arriving do not.
            broker.request_waiting.add(self)
            self._waiting_on = "slot"
            return False
        arrived = self.decoder.arrived
        pooled = not self._pre_auth
        if pooled:
            unreceived = size - arrived
            if (not self.pool.granted_to(self)
                    and not broker.unreceived.fits(self.ip, unreceived)):
                broker.wait_for_address(self, unreceived)
                self._waiting_on = "address"
                return False
            if not self.pool.try_reserve(size, self):
                broker.pool_full(self, size)
                self._waiting_on = "pool"
                return False
            if unreceived:
                self._unreceived += unreceived
                broker.unreceived_changed(self.ip, unreceived)
        self._waiting_on = ""
        self._kinds.append(pooled)
        if arrived >= size:  # complete already: a request, which takes its slot now
            self._slotted_ahead += 1
            broker.queued_requests += 1
        return True

    def _take(self, frames: list[Frame]) -> None:
        if not frames:
            return
        self.broker.queued_requests += len(frames) - self._slotted_ahead
        self._slotted_ahead = 0
        for f in frames:
            if not self._kinds.popleft() and len(f):
                self._unpooled.add(id(f))
        if not self._pre_auth:
            self.proven = True
        self.frames.extend(frames)
        self.last_activity = self.broker.now()
        self._wakeup.set()
        if len(self.frames) > QUEUE_HIGH_WATER:
            self._mute("queue")

    def _mute(self, reason: str) -> None:
        if self.closed or self.transport is None:
            return
        if not self._muted:
            self.transport.pause_reading()
        self._muted.add(reason)

    def unmute(self, reason: str) -> None:
        if reason not in self._muted:
            return
        self._muted.discard(reason)
        if not self._muted and not self.closed and self.transport is not None:
            self.transport.resume_reading()
            if self._frame_started is not None:  # time not read does not count
                self._frame_started = self.broker.now()

    def throttle(self, delay_ms: int) -> None:
        """A quota was violated (Kafka's channel muting, KIP-219): the response has gone
        (or goes) out at once; the connection reads and handles nothing more for
        ``delay_ms`` (a later, longer throttle extends it)."""
        if self.closed or delay_ms <= 0:
            return
        loop = asyncio.get_running_loop()
        timer = self._throttle_timer
        if timer is not None:
            if timer.when() >= loop.time() + delay_ms / 1000:
                return
            timer.cancel()
        self._mute("throttle")
        self._throttle_timer = loop.call_later(delay_ms / 1000, self._throttle_ended)

    def _throttle_ended(self) -> None:
        self._throttle_timer = None
        self.unmute("throttle")
        self._wakeup.set()

    def resume_decoding(self) -> None:
        """Memory or a request slot came free for the frame this connection waits for."""
        if self.closed:
            self.broker.release_memory(self.pool.cancel(self))
            return
        if not self.decoder.waiting_set:
            return
        self.last_activity = self.broker.now()  # waiting for the broker is not idleness
        try:
            frames = self.decoder.retry()
        except ProtocolError as e:
            self._take(getattr(e, "frames", []))
            self._protocol_error(e)
            return
        self._take(frames)
        self._after_feed(bool(frames))
        if not self.decoder.waiting_set:
            self.unmute("waiting")

    def _finished(self, frame: Frame) -> None:
        """A queued frame was handled or dropped: give back its memory and its slot."""
        self.broker.queued_requests -= 1
        if len(frame):
            if id(frame) in self._unpooled:  # received before authentication: not pooled
                self._unpooled.discard(id(frame))
            else:
                self.broker.release_memory(self.pool.release(len(frame)))
        self.broker.requests_drained()

    def _drop_queued(self) -> None:
        """The peer is gone: drop its queued requests (their responses could not be sent),
        except Produce, which is applied as if the peer had stayed (acks=0 producers close
        right after sending); give back the memory of a frame half received."""
        keep = [f for f in self.frames if _api_key(f) == _PRODUCE]
        dropped = [f for f in self.frames if _api_key(f) != _PRODUCE]
        self.frames = collections.deque(keep)
        for f in dropped:
            self._finished(f)
        partial = self.decoder.reserved_partial if self._kinds and self._kinds[-1] else 0
        self.decoder = FrameDecoder(0)
        self._kinds.clear()
        self._frame_started = None
        self.broker.request_waiting.discard(self)
        self.broker.forget_address_waiter(self)
        if self._unreceived:
            delta, self._unreceived = -self._unreceived, 0
            self.broker.unreceived_changed(self.ip, delta)
        woken = self.pool.cancel(self)
        if partial:
            woken += self.pool.release(partial)
        self.broker.release_memory(woken)
        self._set_unsent(0)

    def _set_unsent(self, n: int) -> None:
        if n != self._unsent:
            self.broker.unsent_changed(n - self._unsent)
            self._unsent = n

    # ------------------------------------------------------------ request loop
    def _not_served(self, header: Any) -> list[bytes | memoryview] | None:
        """A request of an API Kafka defines and headrace does not serve (not advertised
        in ApiVersions) is answered in the API's own words with UNSUPPORTED_VERSION, as
        Kafka's ``KafkaApis`` refuses an API its broker cannot serve in its mode (an
        ``UnsupportedVersionException`` → ``getErrorResponse``): the client reads an
        error and keeps its connection. None when the response has no top-level error
        code: then the connection is closed, as for an unknown API key."""
        cls = response_class(header.api_key, header.api_version)
        body = error_response(cls, ErrorCode.unsupported_version,
                              f"API key {header.api_key} is not served by this broker")
        if body is None:
            return None
        log.debug("refused API key %d v%d from %s: not served", header.api_key,
                  header.api_version, self.peer)
        return encode_response_chunks(header.api_key, header.api_version,
                                      header.correlation_id, body)

    def _protocol_error(self, e: Exception) -> None:
        log.warning("closing connection from %s: %s", self.peer, e)
        self.close()

    def close(self, abort: bool = False) -> None:
        """Close; ``abort`` also discards responses not yet taken (a peer that does not
        read would otherwise keep the connection, and its memory, forever)."""
        if self.transport is not None:
            if abort:
                self.transport.abort()
            elif not self.transport.is_closing():
                self.transport.close()
        if not self.closed:
            self.closed = True
            self._drop_queued()
        self._wakeup.set()

    def idle_check(self, now: float) -> float:
        """Last activity: a complete request received, or response bytes taken by the peer
        (progress of a buffered response counts; a handler at work counts as busy)."""
        if self._handling:
            self.last_activity = now
        elif self.transport is not None and self._unsent:
            size = self.transport.get_write_buffer_size()
            if size != self._seen_write_buffer:
                self._seen_write_buffer = size
                self.last_activity = self.last_write_progress = now
        return self.last_activity

    def stalled_response(self, now: float) -> bool:
        """A response is waiting in the transport and the peer took none of it lately."""
        return bool(self._unsent) and now - self.last_write_progress >= STALLED_RESPONSE_S

    async def _serve(self) -> None:
        """Handle this connection's requests one at a time, in order, as Kafka does, with
        one exception: consecutive Produce requests are pipelined. Each is applied (its
        batches appended) in request order before the next starts, then waits for
        replication (acks=all) beside the ones before it; responses still leave in
        request order. librdkafka sends one partition per Produce request, so without
        this a connection's acks=all throughput would be one partition per replication
        round trip. Any other request waits until every Produce before it is answered."""
        pipeline: collections.deque[tuple[asyncio.Task[Any], Frame]] = collections.deque()
        try:
            while True:
                throttled = self._throttle_timer is not None and not self.closed
                if pipeline and (not self.frames or _api_key(self.frames[0]) != _PRODUCE
                                 or len(pipeline) >= MAX_PIPELINED_PRODUCE or throttled):
                    # answer the oldest Produce (or wait for it, or for a new frame that
                    # may join the pipeline)
                    head = pipeline[0][0]
                    if not head.done() and not self.frames:
                        self._wakeup.clear()
                        await self._wakeup.wait(also=head)
                        continue
                    if not head.done():
                        await asyncio.wait({head})
                    task, frame = pipeline.popleft()
                    self._finished(frame)
                    del frame
                    self._handling = bool(pipeline)
                    response = task.result()
                    if response is not None and not self.closed:
                        self._write(response)
                        del response
                        self.last_activity = self.last_write_progress = self.broker.now()
                        if not self._writable.is_set():
                            assert self.transport is not None
                            self._set_unsent(self.transport.get_write_buffer_size())
                    if not self._writable.is_set():
                        await self._writable.wait()
                    continue
                if not self.frames:
                    if self.closed:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                if throttled:  # a quota's mute: the next request waits for its end
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                frame = self.frames.popleft()
                if len(self.frames) < QUEUE_HIGH_WATER // 2:
                    self.unmute("queue")
                # a bare SASL token (after a SaslHandshake v0) has no API key, though it
                # may begin with Produce's: not pipelined, or its failure is never closed
                api_key = _api_key(frame) if self.sasl_state != "raw" else -1
                if api_key == _PRODUCE and not self.broker.client_quotas.enabled:
                    # (with client quotas stored, one request at a time as Kafka: each
                    # Produce is recorded and may throttle before the next is read)
                    # applied now, in order: everything up to its wait for replication
                    # runs before the event loop runs the next task (FIFO), and the
                    # handler does not suspend before it has appended
                    self._handling = True
                    pipeline.append((asyncio.get_running_loop().create_task(
                        self._handle(frame)), frame))
                    del frame
                    continue
                try:
                    try:
                        if api_key == _FETCH and not self.closed:
                            await self.broker.response_room(self)
                        self._handling = True
                        response = None if self.closed else await self._handle(frame)
                    finally:
                        self._handling = False
                        self._finished(frame)
                    del frame
                    if response is not None and not self.closed:
                        self._write(response)
                        del response
                        self.last_activity = self.last_write_progress = self.broker.now()
                        if not self._writable.is_set():
                            assert self.transport is not None
                            self._set_unsent(self.transport.get_write_buffer_size())
                    if self._close_when_written:  # the answer goes out, then the close
                        self.close()
                finally:
                    if api_key == _FETCH:
                        self.broker.fetch_done(self)
                if not self._writable.is_set():
                    await self._writable.wait()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.error("connection from %s failed: %s: %s; closing it", self.peer,
                      type(e).__name__, e)
            log.debug("traceback of the failure above", exc_info=True)
            self.close()
        finally:
            self.broker.connections.discard(self)
            self.broker.share_partitions.connection_closed(self.peer)
            for task, frame in pipeline:  # cancelled at shutdown: its appends are done
                task.cancel()
                self._finished(frame)
            pipeline.clear()
            self._handling = False
            while self.frames:  # cancelled at shutdown: give back what is still held
                self._finished(self.frames.popleft())

    def _write(self, chunks: list[bytes | memoryview]) -> None:
        """Write a response given as chunks. When nothing is queued in the transport, the
        chunks go to the socket in one ``writev`` without being joined (a Fetch response's
        records are never copied in user space); what the kernel did not take is handed to
        the transport chunk by chunk (never joined into one more copy)."""
        transport = self.transport
        assert transport is not None
        if chunks.__class__ is RegionChunks:
            self._write_regions(chunks)
            return
        if len(chunks) == 1:
            transport.write(chunks[0])
            return
        if self._fd < 0 or transport.is_closing() or transport.get_write_buffer_size():
            for chunk in chunks:
                transport.write(chunk)
            return
        self._writev(chunks)

    def _writev(self, chunks: list[Any]) -> bool:
        """``writev`` straight to the socket (``_IOV_MAX`` chunks at a time); what it did
        not take goes to the transport, as does everything after a failure (the transport
        then reports the error). Whether all of it went (so the socket may take more
        directly)."""
        transport = self.transport
        assert transport is not None
        for i in range(0, len(chunks), _IOV_MAX):
            part = chunks[i:i + _IOV_MAX]
            try:
                sent = os.writev(self._fd, part)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:  # let the transport see and report the error
                sent = 0
            for j, chunk in enumerate(part):
                n = len(chunk)
                if sent < n:
                    transport.write(memoryview(chunk)[sent:] if sent else chunk)
                    for rest in part[j + 1:]:
                        transport.write(rest)
                    for rest in chunks[i + _IOV_MAX:]:
                        transport.write(rest)
                    return False
                sent -= n
        return True

    def _write_regions(self, chunks: list[Any]) -> None:
        """``_write`` of a response some of whose chunks are ``FileRegion``s (a Fetch
        response's records): while the socket takes everything directly, the bytes before
        a region go in one ``writev`` and the region with ``os.sendfile`` (no copy into or
        out of the broker); once it does not, the rest is read (``pread``) and queued on
        the transport. A region whose segment was cut back since it was taken (the log
        truncated under a response waiting to go out) cannot be sent as it was read: the
        connection is closed instead, and the client fetches again."""
        transport = self.transport
        assert transport is not None
        fd = self._fd
        direct = fd >= 0 and not transport.is_closing() and not transport.get_write_buffer_size()
        pending: list[Any] = []
        try:
            for chunk in chunks:
                if chunk.__class__ is not FileRegion:
                    pending.append(chunk)
                    continue
                region: FileRegion = chunk
                if not region.valid():
                    log.info("closing the connection from %s: a fetch response's log segment "
                             "was truncated before the response went out", self.peer)
                    transport.abort()
                    return
                if pending:
                    if direct:
                        direct = self._writev(pending)
                    else:
                        for c in pending:
                            transport.write(c)
                    pending = []
                done = 0
                if direct:
                    done = self._sendfile(region)
                    direct = done == region.length
                if done < region.length:
                    data = region.read(done)
                    if len(data) != region.length - done:  # cut under us: never send less
                        log.info("closing the connection from %s: a fetch response's log "
                                 "segment was cut while being sent", self.peer)
                        transport.abort()
                        return
                    transport.write(data)
                region.release()
            if pending:
                if direct:
                    self._writev(pending)
                else:
                    for c in pending:
                        transport.write(c)
        finally:
            for chunk in chunks:
                if chunk.__class__ is FileRegion:
                    chunk.release()

    def _sendfile(self, region: FileRegion) -> int:
        """Bytes of ``region`` the socket took with ``os.sendfile`` before it was full."""
        done = 0
        length = region.length
        while done < length:
            try:
                n = os.sendfile(self._fd, region.fd, region.position + done, length - done)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # the transport reports the socket's error on its next write
                break
            if n == 0:  # the file ends before the region: read() finds it out
                break
            done += n
        return done

    async def _handle(self, frame: Frame) -> list[bytes | memoryview] | None:
        if self.sasl_state == "raw":  # after a SaslHandshake v0: the frame is a bare token
            return await self._raw_token(bytes(frame))
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
        if self.sasl_state is not None and header.api_key != API_VERSIONS:
            if header.api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
                return await self._sasl(header, request.body)
            if self.sasl_state != "done":
                self._protocol_error(ProtocolError(
                    f"unexpected request (API key {header.api_key}) before SASL "
                    "authentication completed"))
                return None
            if self._session_end is not None and time.monotonic() >= self._session_end:
                log.info("closing connection from %s (%s): its SASL session expired "
                         "(connections.max.reauth.ms)", self.peer, self.principal)
                self.close()
                return None
        h = HANDLERS.get(header.api_key)
        if h is None or not h.min_version <= header.api_version <= h.max_version:
            if header.api_key == API_VERSIONS:
                return self._api_versions_fallback(header.correlation_id)
            if h is None:  # an API headrace does not serve (kio decoded it: Kafka's)
                refused = self._not_served(header)
                if refused is not None:
                    return refused
            self._protocol_error(
                ProtocolError(
                    f"unsupported API key {header.api_key} version {header.api_version}"
                )
            )
            return None
        ctx = RequestContext(header, self.peer, self.principal, self.listener)
        started = time.monotonic()
        req_body = request.body
        room = self.broker.response_room_left()
        if header.api_key == _FETCH and room is not None and req_body.max_bytes > room:
            # a Fetch may always answer less than max_bytes (the first batch still goes
            # whole, KIP-74): unread responses leave this much of the budget
            req_body = dataclasses.replace(req_body, max_bytes=max(room, 1))
        try:
            quotas = self.broker.client_quotas
            if quotas.enabled:  # issue 12: recorded, throttle_time_ms set, muted
                body, throttle_ms = await quotas.run(h.fn, ctx, req_body, len(frame))
                self.throttle(throttle_ms)
            else:
                body = await h.fn(self.broker, ctx, req_body)
            if body is None:
                return None
            return encode_response_chunks(
                header.api_key, header.api_version, header.correlation_id, body
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a handler bug: one line, the connection closed (R-NF-1)
            log.error("%s v%d request (correlation id %d) from %s failed: %s: %s; closing "
                      "the connection", h.name, header.api_version, header.correlation_id,
                      self.peer, type(e).__name__, e)
            log.debug("traceback of the failure above", exc_info=True)
            self.close()
            return None
        finally:
            self.broker.metrics.request_done(h.name, header.api_version, started)

    async def _sasl(self, header: Any, body: Any) -> list[bytes | memoryview] | None:
        """SaslHandshake (v1) and SaslAuthenticate on a SASL listener, in order; again
        later to re-authenticate (KIP-368: the same principal, a new session). A failed
        authentication is answered SASL_AUTHENTICATION_FAILED and closes the connection."""
        spec = self.spec
        assert spec.sasl is not None
        api, version = header.api_key, header.api_version
        h = HANDLERS[api]
        if not h.min_version <= version <= h.max_version:
            self._protocol_error(ProtocolError(f"unsupported SASL API {api} v{version}"))
            return None
        ctx = RequestContext(header, self.peer, self.principal, self.listener)

        def answer(data: dict[str, Any]) -> list[bytes | memoryview]:
            return encode_response_chunks(api, version, header.correlation_id,
                                          ctx.response(data))

        if api == SASL_HANDSHAKE:
            if self.sasl_state == "authenticate":
                self._protocol_error(ProtocolError("a second SaslHandshake before "
                                                   "SaslAuthenticate"))
                return None
            mechanism = str(body.mechanism)
            enabled = list(spec.sasl.mechanisms)
            if mechanism not in enabled:
                return await self._auth_failed(answer({
                    "error_code": ErrorCode.unsupported_sasl_mechanism,
                    "mechanisms": enabled}))
            self._authenticator = self._new_authenticator(mechanism)
            # v0: the tokens follow as bare size-prefixed frames (Kafka's original form);
            # v1: in SaslAuthenticate requests
            self.sasl_state = "raw" if version == 0 else "authenticate"
            return answer({"error_code": ErrorCode.none, "mechanisms": enabled})
        # SaslAuthenticate
        auth = self._authenticator
        if self.sasl_state != "authenticate" or auth is None:
            return await self._auth_failed(answer({
                "error_code": ErrorCode.illegal_sasl_state,
                "error_message": "SaslAuthenticate before SaslHandshake",
                "auth_bytes": b"", "session_lifetime": 0}))
        try:
            if auth.mechanism == "OAUTHBEARER":  # may fetch a JWKS: off the event loop
                reply = await asyncio.to_thread(auth.step, bytes(body.auth_bytes))
            else:
                reply = auth.step(bytes(body.auth_bytes))
        except SaslFailure as e:
            self._log_auth_failure(auth.mechanism, e)
            return await self._auth_failed(answer({
                "error_code": ErrorCode.sasl_authentication_failed,
                "error_message": str(e), "auth_bytes": b"", "session_lifetime": 0}))
        lifetime = 0
        if auth.complete:
            assert auth.principal is not None
            if self.principal is not ANONYMOUS and auth.principal != self.principal:
                return await self._auth_failed(answer({
                    "error_code": ErrorCode.sasl_authentication_failed,
                    "error_message": "Cannot change principals during re-authentication",
                    "auth_bytes": b"", "session_lifetime": 0}))
            lifetime = self._authenticated(auth)
        return answer({"error_code": ErrorCode.none, "error_message": None,
                       "auth_bytes": reply, "session_lifetime": lifetime})

    async def _raw_token(self, token: bytes) -> list[bytes | memoryview] | None:
        """A SASL token after a SaslHandshake v0: answered with a bare size-prefixed token;
        a failure closes the connection after ``connection.failed.authentication.delay.ms``
        (v0 has no error field: the close is the answer)."""
        auth = self._authenticator
        assert auth is not None
        try:
            if auth.mechanism == "OAUTHBEARER":
                reply = await asyncio.to_thread(auth.step, token)
            else:
                reply = auth.step(token)
        except SaslFailure as e:
            self._log_auth_failure(auth.mechanism, e, " (SaslHandshake v0)")
            return await self._auth_failed(None)
        if auth.complete:
            self._authenticated(auth)
        return [len(reply).to_bytes(4, "big") + reply]

    def _authenticated(self, auth: Authenticator) -> int:
        """The exchange succeeded: the principal, the frame limit back to normal, and the
        session's lifetime in ms (KIP-368; 0: unlimited)."""
        assert auth.principal is not None
        first = self._session_end is None and self.principal is ANONYMOUS
        self.principal = auth.principal
        self.sasl_state = "done"
        self._authenticator = None
        self.decoder.max_frame_bytes = self._max_frame
        # from now on frames reserve from the shared pool (issue 23)
        self._pre_auth = False
        self.decoder.lazy = False
        self.proven = True
        spec = self.spec
        now_ms = int(time.time() * 1000)
        ends = [spec.max_reauth_ms] if spec.max_reauth_ms > 0 else []
        if auth.expires_ms is not None and spec.max_reauth_ms > 0:
            ends.append(max(0, auth.expires_ms - now_ms))
        lifetime = min(ends) if ends else 0
        self._session_end = time.monotonic() + lifetime / 1000 if lifetime else None
        if first:
            log.debug("%s authenticated as %s on %s (%s)", self.peer, self.principal,
                      self.listener, auth.mechanism)
        return lifetime

    def _new_authenticator(self, mechanism: str) -> Authenticator:
        sasl = self.spec.sasl
        assert sasl is not None
        if mechanism == "PLAIN":
            return PlainServer(sasl.plain_users)
        if mechanism == "OAUTHBEARER":
            assert sasl.oauth is not None
            return OAuthBearerServer(sasl.oauth, self.broker.jwks.get(self.listener))
        return ScramServer(mechanism, self.broker.scram_credential)

    async def _auth_failed(self, response: list[bytes | memoryview] | None
                           ) -> list[bytes | memoryview] | None:
        """A failed authentication, on every path: nothing more is read, the answer is
        held for ``connection.failed.authentication.delay.ms`` (as Kafka holds it: a client
        guessing passwords gets one guess per delay per connection; this coroutine waits,
        the event loop and the other connections do not), then sent, and the connection
        closed once it has gone (at once when there is no answer: SaslHandshake v0)."""
        self.sasl_state = "failed"
        self._mute("auth-failed")
        self._close_when_written = True
        delay = int(self.broker.config["connection.failed.authentication.delay.ms"]) / 1000
        if delay > 0 and not self.closed:
            await asyncio.sleep(delay)
        return response

    def _log_auth_failure(self, mechanism: str, e: Exception, how: str = "") -> None:
        """One line per ``LOG_PACE_S`` for all failed authentications, with a count."""
        held = self.broker.auth_failure_log.ready(self.broker.now())
        if held is not None:
            log.info("authentication failed from %s on %s (%s%s): %s%s", self.peer,
                     self.listener, mechanism, how, e,
                     f" ({held} more failures since the last line)" if held else "")

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
        # issue 12: every listener (protocol, TLS context, SASL settings), how this broker
        # reaches the others, and each listener's server and bound port once started
        try:
            self.listeners, self.inter_broker = config.listeners()
        except ConfigError as e:
            raise StartupError(str(e)) from None
        self._servers: dict[str, asyncio.Server] = {}
        self.bound_ports: dict[str, int] = {}
        self.jwks: dict[str, JwksKeys] = {}
        for lst in self.listeners:
            if lst.sasl is not None and lst.sasl.oauth is not None:
                if not lst.sasl.oauth.jwks_url:
                    log.warning("listener %s takes UNSECURED OAUTHBEARER tokens (no "
                                "sasl.oauthbearer.jwks.endpoint.url): for development only",
                                lst.name)
                    continue
                try:
                    self.jwks[lst.name] = JwksKeys(lst.sasl.oauth.jwks_url)
                except (OSError, ValueError) as e:
                    raise StartupError(f"sasl.oauthbearer.jwks.endpoint.url of listener "
                                       f"{lst.name}: {e}") from None
        # R-NF-3: what all connections together may hold
        self.memory_pool = MemoryPool(int(config["queued.max.request.bytes"]))
        self.max_queued_requests = int(config["queued.max.requests"])
        self.queued_requests = 0  # received, not yet handled, across connections
        self.request_waiting: set[Connection] = set()
        self.response_budget: int | None = (
            None if self.memory_pool.unlimited else self.memory_pool.capacity)
        self.unsent_bytes = 0  # response bytes waiting in transports
        self._room_queue: collections.deque[tuple[Connection, asyncio.Future[None]]] = (
            collections.deque())
        self._pressured_fetch: Connection | None = None  # let through, not yet answered
        try:
            overrides = _resolve_overrides(parse_per_ip_overrides(
                str(config["max.connections.per.ip.overrides"])))
        except ValueError as e:
            raise StartupError(f"max.connections.per.ip.overrides: {e}") from None
        self.quotas = ConnectionQuotas(int(config["max.connections"]),
                                       int(config["max.connections.per.ip"]), overrides)
        # issue 23: bytes reserved per address for frames not yet received; connections
        # waiting for their address's bytes to arrive
        self.unreceived = UnreceivedBudget(int(config["queued.max.unreceived.bytes.per.ip"]))
        self.address_waiting: dict[str, set[Connection]] = {}
        self._waking: set[str] = set()
        self._rewake: set[str] = set()
        self.receive_timeout_s = int(config["request.receive.timeout.ms"]) / 1000
        self.first_request_s = int(config["connections.first.request.timeout.ms"]) / 1000
        self._pool_full_log = LogPacer(LOG_PACE_S)
        self._address_log = LogPacer(LOG_PACE_S)
        self._overdue_log = LogPacer(LOG_PACE_S)
        self._unproven_log = LogPacer(LOG_PACE_S)
        self._overdue_closed = 0
        self._unproven_closed = 0
        self.idle_s = int(config["connections.max.idle.ms"]) / 1000
        self._refused_log = LogPacer(LOG_PACE_S)
        self.auth_failure_log = LogPacer(LOG_PACE_S)
        self._accept_log = LogPacer(LOG_PACE_S)
        self._previous_exception_handler: Any = None
        self._prepare_data_dir()
        self.cluster: ClusterNode | None = None
        self.controller: Any = None  # the ControllerService of a cluster member
        try:
            if config.clustered:
                from headrace.cluster.zk_store import ZkMetadataStore

                # registered (with the bound port) in start()
                self.metadata: MetadataStore = ZkMetadataStore(
                    config, self._self_info(), asyncio.get_running_loop())
            else:
                self.metadata = LocalMetadataStore(
                    self.data_dir, BrokerInfo(self.node_id, self.host, self.port),
                    str(config["cluster.id"]),
                )
        except BaseException:
            self._dir_lock.release()
            raise
        self.replicas = ReplicaManager(self.data_dir, config, self.metadata, clock)
        self.fetch_sessions = FetchSessionCache()  # KIP-227, for replica fetchers
        self.topics = TopicAdmin(config, self.metadata, self.replicas)
        self.producer_ids = ProducerIdAllocator(self.metadata)
        self.groups = GroupService(self)
        self.txns = TxnService(self)
        # share groups (KIP-932): the seams in share_persister.py; None until served
        self.share_coordinator = ShareCoordinatorService(self)
        self.share_persister: SharePersister | None = CoordinatorPersister(
            self, self.share_coordinator)
        self.share_partitions = SharePartitionManager(self)
        self.share_listener: ShareGroupListener | None = self.share_partitions
        # authorization and SCRAM credentials (issue 12): ACLs from the metadata store
        from headrace.broker.security import Security

        self.security = Security(self)
        self.authorizer = self.security.authorizer  # None: no authorizer configured
        from headrace.broker.quotas import ClientQuotas

        self.client_quotas = ClientQuotas(self)  # client quotas from the metadata store
        self.metrics = BrokerMetrics(self)  # issue 13: served if metrics.port is set
        # issue 27: dynamic broker configs and group configs; a single node's are in its
        # metadata store already (a cluster member's once it has read ZooKeeper)
        from headrace.broker.dynamic_config import DynamicConfigs

        self.dynamic = DynamicConfigs(self)
        if not config.clustered:
            self.dynamic.apply()

    def scram_credential(self, mechanism: str, user: str) -> ScramCredential | None:
        """The user's stored SCRAM credential for the mechanism ("SCRAM-SHA-256" or
        "SCRAM-SHA-512"), None if it has none (for the SASL exchange)."""
        return self.security.scram_credential(mechanism, user)

    def _self_info(self) -> BrokerInfo:
        """This broker as clients and other brokers reach it: ``host``/``port`` on the
        inter-broker listener, and every listener's advertised endpoint."""
        host = str(self.config["advertised.host"]) or self.host
        port = int(self.config["advertised.port"]) or self.port
        endpoints = []
        for lst in self.listeners:
            if lst.name == self.inter_broker.listener:
                endpoints.append(Endpoint(lst.name, lst.protocol, host, port))
                continue
            ep_host = lst.advertised_host or (
                lst.host if lst.host not in ("", "0.0.0.0", "::") else socket.getfqdn())
            endpoints.append(Endpoint(lst.name, lst.protocol, ep_host, lst.advertised_port
                                      or self.bound_ports.get(lst.name, lst.port)))
        return BrokerInfo(self.node_id, host, port, str(self.config["broker.rack"]) or None,
                          tuple(endpoints))

    def track(self, task: asyncio.Task[Any]) -> None:
        """Keep a reference to a background task; its failure is logged."""
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def follower_fetched(self, partition: Any, replica_id: int, fetch_offset: int) -> None:
        """A follower's Fetch (leader side, R-REP-3): its log end offset, caught-up time,
        the high watermark, and maybe its return to the ISR."""
        partition.follower_fetched(replica_id, fetch_offset, self.clock.wall_ms())
        if self.cluster is not None:
            self.cluster.follower_fetched(partition, replica_id)

    async def known_controller(self) -> int:
        """The controller's id for Metadata and DescribeCluster. On a cluster, while no
        controller is known (a cluster's first tens of milliseconds; between a dead
        controller's znode going and the next one's election), wait for one, up to
        ``CONTROLLER_WAIT_S``. librdkafka's admin client, told -1, waits for a controller
        until something else makes it ask again: a CreateTopics sent as a cluster started
        waited 40 s, until this broker closed the idle connection (1 start in 10-25 here,
        and once in ``bench/cluster_bench.py --scale``). Not while this broker is fenced
        (its ZooKeeper session lost: it knows of no controller until it is back)."""
        cid = self.metadata.controller_id()
        if cid >= 0 or self.cluster is None:
            return cid
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONTROLLER_WAIT_S
        while (cid < 0 and not self.stopping and not self.cluster.fenced
               and loop.time() < deadline):
            await asyncio.sleep(CONTROLLER_POLL_S)
            cid = self.metadata.controller_id()
        return cid

    def _prepare_data_dir(self) -> None:
        try:
            self._dir_lock = prepare_data_dir(self.data_dir)
        except DataDirError as e:
            raise StartupError(str(e)) from None

    # ------------------------------------------------------------ resource bounds (R-NF-3)
    def now(self) -> float:
        return self.clock.monotonic_ms() / 1000

    def admit(self, conn: Connection) -> bool:
        """``max.connections`` / ``max.connections.per.ip``: refused connections are closed
        at once, with at most one log line per interval."""
        # KIP-402: the inter-broker listener, when it is not the only one, keeps its
        # capacity: max.connections does not refuse it (max.connections.per.ip still does)
        protected = conn.listener == self.inter_broker.listener and len(self.listeners) > 1
        why = (self.quotas.admit(conn.ip, protected) if not self.stopping
               else "the broker is stopping")
        if why is None:
            # KIP-612: a per-IP connection_creation_rate refuses, the broker-wide
            # max.connection.creation.rate holds the connection unread
            why, hold_ms = self.client_quotas.admit_connection(conn.ip)
            if why is None:
                conn.throttle(hold_ms)
                return True
            self.quotas.release(conn.ip)
        held = self._refused_log.ready(self.now())
        if held is not None:
            log.warning("refusing connections: %s (refused from %s%s)", why, conn.peer,
                        f", and {held} more since the last line" if held else "")
        return False

    def release_memory(self, woken: list[Any]) -> None:
        """Memory went back to the pool: wake the connections it was granted to."""
        for conn in woken:
            conn.resume_decoding()

    def unreceived_changed(self, ip: str, delta: int) -> None:
        """A connection's bytes reserved and not yet received changed; when they went down,
        that address's waiting connections try again."""
        self.unreceived.change(ip, delta)
        if delta >= 0 or ip not in self.address_waiting:
            return
        if ip in self._waking:  # called back from a retry below: loop there, not here
            self._rewake.add(ip)
            return
        self._waking.add(ip)
        try:
            while True:
                self._rewake.discard(ip)
                waiters = self.address_waiting.pop(ip, set())
                for conn in waiters:
                    conn.resume_decoding()
                if ip not in self._rewake or ip not in self.address_waiting:
                    return
        finally:
            self._waking.discard(ip)

    def wait_for_address(self, conn: Connection, unreceived: int) -> None:
        """``queued.max.unreceived.bytes.per.ip``: ``conn``'s next frame waits for the bytes
        its address already promised to arrive (one line per interval)."""
        self.address_waiting.setdefault(conn.ip, set()).add(conn)
        held = self._address_log.ready(self.now())
        if held is not None:
            log.warning("connections from %s wait: %d bytes of their frames are reserved and "
                        "not yet received (queued.max.unreceived.bytes.per.ip=%d; a %d-byte "
                        "frame waits%s)", conn.ip, self.unreceived.per_ip.get(conn.ip, 0),
                        self.unreceived.cap, unreceived,
                        f", {held} more waits since the last line" if held else "")

    def forget_address_waiter(self, conn: Connection) -> None:
        waiters = self.address_waiting.get(conn.ip)
        if waiters is not None:
            waiters.discard(conn)
            if not waiters:
                del self.address_waiting[conn.ip]

    def pool_full(self, conn: Connection, size: int) -> None:
        """A frame waits for ``queued.max.request.bytes``: one line per interval."""
        held = self._pool_full_log.ready(self.now())
        if held is None:
            return
        pool = self.memory_pool
        top = self.unreceived.top()
        log.warning("request memory pool full (queued.max.request.bytes=%d, %d reserved, %d "
                    "frames waiting): a %d-byte frame from %s waits%s%s", pool.capacity,
                    pool.used, pool.waiting, size, conn.peer,
                    f"; {top[0]} holds the most not yet received ({top[1]} bytes)"
                    if top else "",
                    f" ({held} more waits since the last line)" if held else "")

    def requests_drained(self) -> None:
        """A request slot came free: let connections waiting for one decode on."""
        while self.request_waiting and self.queued_requests < self.max_queued_requests:
            self.request_waiting.pop().resume_decoding()

    def unsent_changed(self, delta: int) -> None:
        self.unsent_bytes += delta
        if delta < 0:
            self._admit_fetches()

    async def response_room(self, conn: Connection) -> None:
        """Wait while responses nobody reads hold more than the budget
        (``queued.max.request.bytes``): only Fetch waits, since only Fetch builds big
        responses; produce, metadata and group traffic go on. Waiting Fetches go one at a
        time in arrival order (each one's response is counted before the next is built).
        While one waits, the idle sweep closes connections that have taken none of their
        response for ``STALLED_RESPONSE_S``: a consumer waits seconds, not
        ``connections.max.idle.ms``."""
        budget = self.response_budget
        if budget is None or self.stopping:
            return
        if (self.unsent_bytes <= budget and not self._room_queue
                and self._pressured_fetch is None):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room_queue.append((conn, fut))
        self._admit_fetches()
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()
                if self._pressured_fetch is conn:
                    self._pressured_fetch = None

    def response_room_left(self) -> int | None:
        budget = self.response_budget
        return None if budget is None else max(budget - self.unsent_bytes, 0)

    def _admit_fetches(self) -> None:
        """Let the next waiting Fetch through: in arrival order, but connections with more
        requests queued behind it (pipelining while their responses are held) go last."""
        budget = self.response_budget
        queue = self._room_queue
        while queue and self._pressured_fetch is None:
            while queue and queue[0][1].done():
                queue.popleft()
            if not queue:
                return
            pick = next((i for i, (c, f) in enumerate(queue)
                         if not f.done() and (c.closed or not c.frames)), 0)
            conn, fut = queue[pick]
            if not (conn.closed or self.stopping or budget is None
                    or self.unsent_bytes <= budget):
                return
            del queue[pick]
            if not conn.closed and not self.stopping:
                self._pressured_fetch = conn
            fut.set_result(None)

    def fetch_done(self, conn: Connection) -> None:
        """A Fetch let through by ``response_room`` is answered (its response counted)."""
        if self._pressured_fetch is conn:
            self._pressured_fetch = None
            self._admit_fetches()

    def wake_response_waiters(self) -> None:
        """A connection closed: its waiting Fetch (if any) ends without being handled."""
        for conn, fut in self._room_queue:
            if conn.closed and not fut.done():
                fut.set_result(None)
        if self._pressured_fetch is not None and self._pressured_fetch.closed:
            self._pressured_fetch = None
        self._admit_fetches()

    async def _idle_loop(self) -> None:
        """``connections.max.idle.ms``: close connections with no complete request and no
        response progress for that long (idle, or stuck mid-frame)."""
        interval = min(max(self.idle_s / 4, 0.05), 1.0)
        while not self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), interval)
            if self.stopping:
                return
            self._maybe_trim()
            now = self.now()
            last = {c: c.idle_check(now) for c in self.connections if not c.closed}
            idle = idle_connections(now, last, self.idle_s)
            for conn in idle:
                conn.close(abort=True)
            if idle:
                log.info("closed %d connection(s) idle for over %d ms (e.g. %s)", len(idle),
                         int(self.idle_s * 1000), idle[0].peer)
            self._reap_unfinished(now)
            budget = self.response_budget
            if self._room_queue and budget is not None and self.unsent_bytes > budget:
                stalled = [c for c in self.connections
                           if not c.closed and c.stalled_response(now)]
                for conn in stalled:
                    conn.close(abort=True)
                if stalled:
                    log.warning("closed %d connection(s) not reading their responses for %.0f s "
                                "while unread responses exceed queued.max.request.bytes "
                                "(e.g. %s)", len(stalled), STALLED_RESPONSE_S, stalled[0].peer)

    def _reap_unfinished(self, now: float) -> None:
        """Issue 23: close connections whose frame in progress is overdue
        (``request.receive.timeout.ms``) and connections that have completed no request (on
        SASL: authentication) within ``connections.first.request.timeout.ms`` of opening (a
        new connection waiting for the broker, for the pool or a request slot, is not
        counted against it). Each kind is one line per interval, with a count."""
        overdue: list[Connection] = []
        unproven: list[Connection] = []
        for conn in self.connections:
            if conn.closed:
                continue
            if conn.receive_overdue(now, self.receive_timeout_s):
                overdue.append(conn)
            elif not conn.proven:
                if conn._waiting_on in ("pool", "slot") or conn._handling:
                    conn.new_since = now
                elif now - conn.new_since >= self.first_request_s:
                    unproven.append(conn)
        for conn in overdue + unproven:
            conn.close(abort=True)
        self._overdue_closed += len(overdue)
        self._unproven_closed += len(unproven)
        if overdue and self._overdue_log.ready(now) is not None:
            log.info("closed %d connection(s) whose request was not received in full within "
                     "%d ms (request.receive.timeout.ms; e.g. %s)", self._overdue_closed,
                     int(self.receive_timeout_s * 1000), overdue[0].peer)
            self._overdue_closed = 0
        if unproven and self._unproven_log.ready(now) is not None:
            log.info("closed %d connection(s) that completed no request (or authentication) "
                     "within %d ms of opening (connections.first.request.timeout.ms; e.g. %s)",
                     self._unproven_closed, int(self.first_request_s * 1000), unproven[0].peer)
            self._unproven_closed = 0

    def _check_fd_limit(self) -> None:
        """One line at start when ``max.connections`` cannot be reached before the process
        runs out of file descriptors (accept then fails with EMFILE and is retried)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and self.quotas.max_connections >= soft:
            log.warning("max.connections=%d is not below the file descriptor limit (%d): "
                        "past that, new connections wait in the listen backlog",
                        self.quotas.max_connections, soft)

    def _maybe_trim(self) -> None:
        """After a burst of request memory has gone back to the pool, ask glibc to return
        its free heap to the kernel (frames of 4 MiB and more are mappings of their own
        and go back by themselves; smaller ones and read buffers come from the heap)."""
        pool = self.memory_pool
        if pool.peak >= TRIM_AFTER_BYTES and pool.used <= pool.peak // 4:
            pool.peak = pool.used
            if _malloc_trim is not None:
                _malloc_trim(0)

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio retries ``accept()`` every second on EMFILE/ENFILE and reports each
        failure with a traceback: report it as one line per interval instead."""
        if context.get("message") == "socket.accept() out of system resource":
            held = self._accept_log.ready(self.now())
            if held is not None:
                log.warning("cannot accept connections: %s; retrying every second%s",
                            context.get("exception"),
                            f" ({held} more failures since the last line)" if held else "")
            return
        if self._previous_exception_handler is not None:
            self._previous_exception_handler(loop, context)
        else:
            loop.default_exception_handler(context)

    def advertised_brokers(self, listener: str | None = None) -> list[BrokerInfo]:
        """The live brokers as a client on ``listener`` reaches them (its endpoints there;
        a broker without that listener is left out, as Kafka does); the inter-broker
        listener's when None."""
        name = listener or self.inter_broker.listener
        out = []
        for b in self.metadata.live_brokers():
            seen = (self._self_info() if b.node_id == self.node_id else b).on_listener(name)
            if seen is not None:
                out.append(seen)
        return out

    async def _bind_listeners(self, start_serving: bool) -> None:
        """Listen on every listener (TLS where its protocol says); the inter-broker one on
        ``host``/``port``. Raises StartupError (nothing stays bound)."""
        loop = asyncio.get_running_loop()
        for lst in self.listeners:
            if lst.name in self._servers:
                continue
            inter = lst.name == self.inter_broker.listener
            host = self.host if inter else (lst.host or None)
            port = self.port if inter else lst.port
            try:
                self._servers[lst.name] = await loop.create_server(
                    lambda lst=lst: Connection(self, lst), host, port,
                    reuse_address=True, backlog=1024, ssl=lst.ssl_context,
                    ssl_handshake_timeout=10.0 if lst.ssl_context else None,
                    start_serving=start_serving)
            except OSError as e:
                for server in self._servers.values():
                    server.close()
                self._servers.clear()
                where = f"{host or '*'}:{port} (listener {lst.name})"
                if e.errno == errno.EADDRINUSE:
                    raise StartupError(
                        f"port {port} on {where} is already in use: stop what listens there "
                        "(another headrace broker? `headrace cluster` listens on 9092-9094 by "
                        "default) or give another --port") from None
                raise StartupError(f"cannot listen on {where}: {e.strerror}") from None
            self.bound_ports[lst.name] = self._servers[lst.name].sockets[0].getsockname()[1]
        self.port = self.bound_ports[self.inter_broker.listener]
        self._server = self._servers[self.inter_broker.listener]

    async def start(self) -> None:
        """Serve metrics (if ``metrics.port`` is set: /health answers during recovery),
        recover logs, then listen. Raises StartupError with a clear message."""
        metrics_port = int(self.config["metrics.port"])
        if metrics_port:
            host = str(self.config["metrics.host"]) or self.host
            try:
                await self.metrics.start(host, metrics_port)
            except OSError as e:
                self.replicas.close()
                self.metadata.close()
                self._dir_lock.release()
                raise StartupError(f"cannot serve metrics on {host}:{metrics_port} "
                                   f"(metrics.port): {e.strerror}") from None
        try:
            await self._start()
        except BaseException:
            await self.metrics.stop()
            raise

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._previous_exception_handler = loop.get_exception_handler()
        loop.set_exception_handler(self._loop_exception)
        _fix_mmap_threshold()
        if self.config.clustered:
            await self._start_cluster_member()
        else:
            self.replicas.load()
        self.groups.start()
        self.txns.start()
        self.share_coordinator.start()
        try:
            if not self._servers:
                await self._bind_listeners(start_serving=True)
            else:
                for server in self._servers.values():
                    await server.start_serving()
        except (StartupError, OSError) as e:
            await self._abort_start()
            if isinstance(e, StartupError):
                raise
            raise StartupError(f"cannot listen: {e.strerror}") from None
        self._check_fd_limit()
        self._spawn(self._retention_loop())
        self._spawn(self._producer_expiration_loop())
        self._spawn(self._flush_loop())
        self._spawn(self.replicas.write_epochs_loop(self._stopped))
        self._spawn(self._idle_loop())
        self._spawn(self.groups.run(self._stopped))
        self._spawn(self.share_partitions.run(self._stopped))
        self._spawn(self.txns.run(self._stopped))
        if self.cluster is not None:
            self._spawn(self.cluster.run(self._stopped))
        if self.controller is not None:
            self._spawn(self.controller.run(self._stopped))
        # the first address is the inter-broker listener's (tools wait for this line)
        where = [f"{self.host}:{self.port} ({self.inter_broker.listener})"] + [
            f"{lst.host or '*'}:{self.bound_ports[lst.name]} ({lst.name} {lst.protocol})"
            for lst in self.listeners if lst.name != self.inter_broker.listener]
        log.info("headrace broker %d listening on %s (data dir %s, %d partitions%s)",
                 self.node_id, ", ".join(where), self.data_dir, len(self.replicas.partitions),
                 f", ZooKeeper {self.config['zookeeper.connect']}" if self.cluster else "")

    async def _abort_start(self) -> None:
        if self.cluster is not None:
            await self.cluster.stop()
        self.replicas.close()
        self.metadata.close()
        self._dir_lock.release()

    async def _start_cluster_member(self) -> None:
        """A cluster member binds its port first (ZooKeeper gets the real one), registers
        and loads the cluster's metadata, opens the logs of its replicas, takes its part
        (leader or follower of each), and only then serves clients."""
        from headrace.broker.cluster_node import ClusterNode
        from headrace.cluster.controller_service import ControllerService
        from headrace.metadata.store import MetadataError

        try:
            await self._bind_listeners(start_serving=False)
        except StartupError:
            self.metadata.close()
            self._dir_lock.release()
            raise
        store: Any = self.metadata
        store.self_broker = self._self_info()
        store.inter_broker_listener = self.inter_broker.listener
        try:
            await store.start()
        except MetadataError as e:
            for server in self._servers.values():
                server.close()
            self.metadata.close()
            self._dir_lock.release()
            raise StartupError(str(e)) from None
        self.cluster = ClusterNode(self, store)
        self.topics.cluster = self.cluster
        self.dynamic.apply()  # before the logs open: their defaults may be dynamic
        store.add_listener(self.dynamic)
        self.cluster.load_hw_checkpoint()
        self.replicas.load()
        await self.cluster.start()
        self.controller = ControllerService(self.node_id, store, self.config, self.clock)

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

    async def _producer_expiration_loop(self) -> None:
        interval = int(self.config["producer.id.expiration.check.interval.ms"]) / 1000
        while not self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), interval)
            if self.stopping:
                return
            expiration_ms = int(self.config["producer.id.expiration.ms"])  # dynamic
            n = self.replicas.expire_producers(self.clock.wall_ms(), expiration_ms)
            if n:
                log.info("forgot %d idle producer id(s) (producer.id.expiration.ms)", n)

    async def stop(self, timeout_s: float = 5.0) -> None:
        if self.stopping:
            return
        if self.cluster is not None and not self._stopped.is_set():
            try:  # while still serving: clients follow the leadership as it moves
                await self.cluster.controlled_shutdown()
            except Exception as e:
                log.warning("controlled shutdown failed: %s", e)
        self.stopping = True
        self._stopped.set()
        for _, fut in self._room_queue:
            if not fut.done():
                fut.set_result(None)
        for server in self._servers.values():
            server.close()
        # wake every parked long poll and group request so it answers now
        self.groups.close()
        self.txns.close()
        self.share_coordinator.close()
        if isinstance(self.share_persister, CoordinatorPersister):
            self.share_persister.close()
        for tp in list(self.replicas._watchers):
            self.replicas.wake(tp)
        self.replicas.wake_sessions()
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
        if self.cluster is not None:
            await self.cluster.stop()
        self.replicas.close()
        self.metadata.close()
        self._dir_lock.release()
        asyncio.get_running_loop().set_exception_handler(self._previous_exception_handler)
        await self.metrics.stop()
        log.info("headrace broker %d stopped", self.node_id)

    async def serve_forever(self, stop: asyncio.Event) -> None:
        await self.start()
        await stop.wait()
        await self.stop()


def _resolve_overrides(overrides: dict[str, int]) -> dict[str, int]:
    """``max.connections.per.ip.overrides`` keys as addresses: a host name counts for each
    address it resolves to now (as Kafka resolves it at start); an address stays as it is."""
    import ipaddress

    out: dict[str, int] = {}
    for host, count in overrides.items():
        try:
            out[str(ipaddress.ip_address(host))] = count
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except OSError as e:
            raise ValueError(f"cannot resolve {host!r}: {e}") from None
        for info in infos:
            out[str(info[4][0])] = count
    return out


def make_config(data_dir: Path | str, port: int = 0, **overrides: Any) -> BrokerConfig:
    return BrokerConfig.from_mapping({"log.dirs": str(data_dir), "port": port, **overrides})
