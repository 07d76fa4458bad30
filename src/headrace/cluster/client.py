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

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from headrace.protocol.entities import build

_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES = 512 * 1024 * 1024  # default cap; fetchers pass their own


class BrokerConnectionError(Exception):
    """The connection to a broker failed (refused, closed, timed out, garbage)."""


class BrokerConnection:
    def __init__(self, host: str, port: int, client_id: str,
                 max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        self.max_response_bytes = max_response_bytes
        self.host = host
        self.port = port
        self.client_id = client_id
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation = 0

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self, timeout_s: float) -> None:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=1 << 20), timeout_s)
        except (OSError, TimeoutError) as e:
            raise BrokerConnectionError(
                f"cannot connect to {self.host}:{self.port}: {e or 'timed out'}") from None

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._reader = self._writer = None

    async def request(self, api_key: int, version: int, body: dict[str, Any],
                      timeout_s: float) -> Any:
        reader, writer = self._reader, self._writer  # close() may run while we wait
        if writer is None or reader is None:
            raise BrokerConnectionError("not connected")
        cls = load_request_schema(api_key, version)
        hdr = cls.__header_schema__
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        buf = io.BytesIO()
        buf.write(b"\0\0\0\0")
        entity_writer(hdr)(buf, hdr(request_api_key=i16(api_key),
                                    request_api_version=i16(version),
                                    correlation_id=i32(self._correlation),
                                    client_id=self.client_id))
        entity_writer(cls)(buf, build(cls, body))
        payload = buf.getbuffer()
        _SIZE.pack_into(payload, 0, len(payload) - 4)
        try:
            writer.write(bytes(payload))
            del payload
            await asyncio.wait_for(writer.drain(), timeout_s)
            head = await asyncio.wait_for(reader.readexactly(4), timeout_s)
            (size,) = _SIZE.unpack(head)
            if not 0 < size <= self.max_response_bytes:
                raise BrokerConnectionError(f"response frame of {size} bytes")
            frame = await asyncio.wait_for(reader.readexactly(size), timeout_s)
            if self._reader is not reader:
                raise OSError("the connection was closed meanwhile")
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
            self.close()
            raise BrokerConnectionError(
                f"request to {self.host}:{self.port} failed: {e!r}") from None
        rcls = load_response_schema(api_key, version)
        try:
            header, n = entity_reader(rcls.__header_schema__)(frame, 0)
            if header.correlation_id != self._correlation:
                raise BrokerConnectionError(
                    f"response {header.correlation_id}, expected {self._correlation}")
            body_obj, _ = entity_reader(rcls)(frame, n)
        except BrokerConnectionError:
            self.close()
            raise
        except Exception as e:  # kio's errors for bytes it cannot read
            self.close()
            raise BrokerConnectionError(f"undecodable response: {e}") from None
        return body_obj
