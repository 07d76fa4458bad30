"""An asyncio Kafka-protocol connection from one broker to another (replica fetchers).

One request at a time per connection; requests and responses are encoded by kio. Every
read is bounded by a timeout and every claimed length is checked against
``MAX_RESPONSE_BYTES`` before anything is allocated (a peer is a peer, even a broker).
Any socket, framing or decoding failure raises ``BrokerConnectionError`` and closes the
connection; the caller reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import struct
from typing import Any

from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from headrace.protocol.codec import request_class, response_class
from headrace.protocol.entities import build
from headrace.security.listeners import InterBrokerClient

_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES = 512 * 1024 * 1024  # default cap; fetchers pass their own


class BrokerConnectionError(Exception):
    """The connection to a broker failed (refused, closed, timed out, garbage)."""


class BrokerConnection:
    """``security``: the inter-broker listener's TLS context and SASL credentials
    (issue 12); None on a PLAINTEXT one."""

    def __init__(self, host: str, port: int, client_id: str,
                 max_response_bytes: int = MAX_RESPONSE_BYTES,
                 security: InterBrokerClient | None = None) -> None:
        self.max_response_bytes = max_response_bytes
        self.host = host
        self.port = port
        self.client_id = client_id
        self.security = security
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation = 0

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self, timeout_s: float) -> None:
        sec = self.security
        tls = sec.ssl_context if sec is not None else None
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=1 << 20, ssl=tls,
                                        server_hostname=self.host if tls else None),
                timeout_s)
        except (OSError, TimeoutError) as e:
            raise BrokerConnectionError(
                f"cannot connect to {self.host}:{self.port}: {e or 'timed out'}") from None
        if sec is not None and sec.mechanism:
            await self._authenticate(sec, timeout_s)

    async def _authenticate(self, sec: InterBrokerClient, timeout_s: float) -> None:
        """SaslHandshake v1 and SaslAuthenticate with the inter-broker mechanism (PLAIN or
        SCRAM, as a Kafka broker's inter-broker client)."""
        resp = await self.request(17, 1, {"mechanism": sec.mechanism}, timeout_s)
        if resp.error_code != 0:
            self.close()
            raise BrokerConnectionError(f"{self.host}:{self.port} does not accept SASL "
                                        f"mechanism {sec.mechanism} ({resp.error_code})")
        tokens: Any
        if sec.mechanism == "PLAIN":
            tokens = iter([f"\0{sec.username}\0{sec.password}".encode()])
            client = None
        else:
            from scramp import ScramClient

            client = ScramClient([sec.mechanism], sec.username, sec.password)
            tokens = None
        step = 0
        while True:
            if client is None:
                token = next(tokens, None)
                if token is None:
                    return
            elif step == 0:
                token = client.get_client_first().encode()
            elif step == 1:
                token = client.get_client_final().encode()
            else:
                return
            resp = await self.request(36, 2, {"auth_bytes": token}, timeout_s)
            if resp.error_code != 0:
                self.close()
                raise BrokerConnectionError(
                    f"authentication to {self.host}:{self.port} failed: {resp.error_message}")
            if client is not None:
                reply = bytes(resp.auth_bytes).decode()
                try:
                    if step == 0:
                        client.set_server_first(reply)
                    else:
                        client.set_server_final(reply)
                except Exception as e:  # scramp's ScramException: the server is not genuine
                    self.close()
                    raise BrokerConnectionError(
                        f"SCRAM with {self.host}:{self.port} failed: {e}") from None
            step += 1

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._reader = self._writer = None

    def next_correlation_id(self) -> int:
        """The correlation id of the next request (``exchange``)."""
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        return self._correlation

    async def request(self, api_key: int, version: int, body: dict[str, Any],
                      timeout_s: float) -> Any:
        cls = request_class(api_key, version)
        hdr = cls.__header_schema__
        correlation_id = self.next_correlation_id()
        buf = io.BytesIO()
        buf.write(b"\0\0\0\0")
        entity_writer(hdr)(buf, hdr(request_api_key=i16(api_key),
                                    request_api_version=i16(version),
                                    correlation_id=i32(correlation_id),
                                    client_id=self.client_id))
        entity_writer(cls)(buf, build(cls, body))
        payload = buf.getbuffer()
        _SIZE.pack_into(payload, 0, len(payload) - 4)
        frame = await self.exchange(bytes(payload), timeout_s)
        del payload
        return self.read_response(api_key, version, frame, correlation_id)

    def read_response(self, api_key: int, version: int, frame: bytes,
                      correlation_id: int) -> Any:
        """The body of a response frame (after its size prefix), read by kio's native
        reader; one that does not parse or answers another request closes the connection."""
        rcls = response_class(api_key, version)  # cached: kio's resolves an import path
        try:
            header, n = entity_reader(rcls.__header_schema__)(frame, 0)
            if header.correlation_id != correlation_id:
                raise BrokerConnectionError(
                    f"response {header.correlation_id}, expected {correlation_id}")
            body_obj, _ = entity_reader(rcls)(frame, n)
        except BrokerConnectionError:
            self.close()
            raise
        except Exception as e:  # kio's errors for bytes it cannot read
            self.close()
            raise BrokerConnectionError(f"undecodable response: {e}") from None
        return body_obj

    async def exchange(self, request: bytes, timeout_s: float) -> bytes:
        """Send one whole request frame (size prefix included); the response frame after
        its size prefix. The caller checks its correlation id."""
        reader, writer = self._reader, self._writer  # close() may run while we wait
        if writer is None or reader is None:
            raise BrokerConnectionError("not connected")
        try:
            # one deadline for the exchange (a wait_for per step made a task per step)
            async with asyncio.timeout(timeout_s):
                writer.write(request)
                await writer.drain()
                head = await reader.readexactly(4)
                (size,) = _SIZE.unpack(head)
                if not 0 < size <= self.max_response_bytes:
                    raise BrokerConnectionError(f"response frame of {size} bytes")
                frame = await reader.readexactly(size)
            if self._reader is not reader:
                raise OSError("the connection was closed meanwhile")
        except BrokerConnectionError:
            self.close()  # a frame size out of bounds: the stream cannot be read on
            raise
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
            self.close()
            raise BrokerConnectionError(
                f"request to {self.host}:{self.port} failed: {e!r}") from None
        return frame
