"""A minimal Kafka wire client for tests: kio-encoded requests over a blocking socket.

Real clients hide what the broker answered on the wire; tests of error codes, long polls,
duplicate batches and bad input need to see it. Requests are built with kio's generated
classes (through ``headrace.protocol.entities.build``, which fills defaults from dicts).
"""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader, entity_writer

from headrace.protocol.entities import build


class WireClient:
    def __init__(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.correlation_id = 0

    @classmethod
    def to(cls, bootstrap: str, timeout_s: float = 10.0) -> WireClient:
        host, port = bootstrap.rsplit(":", 1)
        return cls(host, int(port), timeout_s)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def encode(self, api_key: int, version: int, body: Any) -> bytes:
        cls = load_request_schema(api_key, version)
        if isinstance(body, dict):
            body = build(cls, body)
        hdr = cls.__header_schema__
        self.correlation_id += 1
        buf = io.BytesIO()
        entity_writer(hdr)(buf, hdr(request_api_key=api_key, request_api_version=version,
                                    correlation_id=self.correlation_id, client_id="wire-test"))
        entity_writer(cls)(buf, body)
        payload = buf.getvalue()
        return struct.pack(">i", len(payload)) + payload

    def sasl_plain(self, user: str, password: str) -> WireClient:
        """Authenticate this connection with SASL PLAIN (SaslHandshake v1, SaslAuthenticate
        v2) on a SASL_PLAINTEXT listener; AssertionError if refused."""
        hs = self.request(17, 1, {"mechanism": "PLAIN"})
        assert hs.error_code == 0, hs
        r = self.request(36, 2, {"auth_bytes": f"\0{user}\0{password}".encode()})
        assert r.error_code == 0, r
        return self

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        head = self._recv_exactly(4)
        (size,) = struct.unpack(">i", head)
        return self._recv_exactly(size)

    def _recv_exactly(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            got = self.sock.recv(n - len(chunks))
            if not got:
                raise ConnectionError("connection closed by the broker")
            chunks += got
        return bytes(chunks)

    def request(self, api_key: int, version: int, body: Any) -> Any:
        self.send_raw(self.encode(api_key, version, body))
        return self.read_response(api_key, version)

    def read_response(self, api_key: int, version: int) -> Any:
        frame = self.recv_frame()
        cls = load_response_schema(api_key, version)
        hdr = ResponseHeaderV0 if api_key == 18 else cls.__header_schema__
        _, n = entity_reader(hdr)(frame, 0)
        body, _ = entity_reader(cls)(frame, n)
        return body

    def is_closed_by_peer(self, timeout_s: float = 5.0) -> bool:
        """True when the broker closed this connection (EOF or reset) within the timeout."""
        self.sock.settimeout(timeout_s)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
