"""The request fuzzers' side of the wire (``test_request_fuzz``, ``test_api_fuzz``): a
connection that reads response frames, one request sent with a ping behind it and its
answer checked (a well-formed response with its correlation id, a closed connection, or
nothing for Produce acks=0), and what a broker must never log."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader
from kio.serial.errors import OutOfBoundValue

from headrace.protocol import legacy
from headrace.protocol.codec import decode_request
from headrace.protocol.entities import has_field
from tests.fuzz import encode_request, minimal

PING_CID = 0x7FFF_FFF0
# requests the broker may rightly hold for long (long poll, rebalance barriers)
PARKING = {1, 11, 14}


def ping() -> bytes:
    body = encode_request(18, 0, minimal(load_request_schema(18, 0)), PING_CID)
    return struct.pack(">i", len(body)) + body


class Conn:
    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.buf = bytearray()

    def close(self) -> None:
        self.sock.close()

    def frame(self, deadline: float) -> bytes | None:
        """The next response frame; None when the broker closed the connection."""
        while True:
            if len(self.buf) >= 4:
                (size,) = struct.unpack_from(">i", self.buf)
                assert 0 <= size < 64 << 20, f"bad response size {size}"
                if len(self.buf) >= 4 + size:
                    out = bytes(self.buf[4:4 + size])
                    del self.buf[:4 + size]
                    return out
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            try:
                got = self.sock.recv(1 << 16)
            except (ConnectionResetError, BrokenPipeError):
                return None
            if not got:
                return None
            self.buf += got


def check_response(request: bytes, response: bytes) -> None:
    """A well-formed response to ``request``: kio reads it whole."""
    from headrace.broker.handlers import HANDLERS

    api_key, version = struct.unpack_from(">hh", request)
    if (api_key, version) in legacy.HAND_CODED:
        # a version kio has no schema for, coded by hand (ListOffsets v0): the broker's
        # own reader for it, as strict as kio's (header v0: the correlation id only)
        assert api_key == LIST_OFFSETS, f"no checker for hand-coded API {api_key} v{version}"
        legacy.decode_list_offsets_v0_response(response[4:])
        return
    h = HANDLERS.get(api_key)
    if h is None and api_key != 18:
        # an API the broker does not serve at all: answered in its own response with
        # UNSUPPORTED_VERSION (issue 27), when kio knows it and it has a top-level error
        cls = load_response_schema(api_key, version)
        assert has_field(cls, "error_code"), f"answer to unserved API {api_key} v{version}"
    elif h is None or not h.min_version <= version <= h.max_version:
        # a version the broker does not serve: only ApiVersions is answered (Kafka's v0
        # fallback with UNSUPPORTED_VERSION), anything else is a closed connection
        assert api_key == 18, f"answer to unserved API {api_key} v{version}"
        cls = load_response_schema(18, 0)
    else:
        cls = load_response_schema(api_key, version)
    hdr = ResponseHeaderV0 if api_key == 18 else cls.__header_schema__
    _, n = entity_reader(hdr)(response, 0)
    try:
        _, m = entity_reader(cls)(response, n)
    except OutOfBoundValue as e:
        # DescribeTransactions answers -1 as the start time of a transaction not begun (as
        # Kafka does; Java reads it as "none"), which kio's reader refuses to parse
        assert api_key == DESCRIBE_TRANSACTIONS and "negative timestamp" in str(e), e
        return
    assert n + m == len(response), f"API {api_key} v{version}: {len(response) - n - m} trailing"


DESCRIBE_TRANSACTIONS = 65
LIST_OFFSETS = 2


def exchange(bootstrap: str, conn: Conn | None, request: bytes) -> tuple[Conn | None, str]:
    """Send one request and a ping; check what comes back. Returns (connection to reuse or
    None, outcome)."""
    if conn is None:
        conn = Conn(bootstrap)
    try:
        conn.sock.sendall(struct.pack(">i", len(request)) + request + ping())
    except (BrokenPipeError, ConnectionResetError):
        conn.close()
        return None, "closed"
    cid = struct.unpack_from(">i", request, 4)[0] if len(request) >= 8 else None
    deadline = time.monotonic() + 5
    answered = False
    try:
        while True:
            resp = conn.frame(deadline)
            if resp is None:
                conn.close()
                return None, "closed"
            (got,) = struct.unpack_from(">i", resp)
            if got == PING_CID and cid != PING_CID:
                if not answered:
                    no_answer_allowed(request)
                    return conn, "no answer"
                return conn, "answered"
            assert got == cid and not answered, f"correlation id {got}, expected {cid}"
            check_response(request, resp)
            answered = True
            if cid == PING_CID:
                return conn, "answered"
    except TimeoutError:
        api_key = struct.unpack_from(">h", request)[0]
        assert api_key in PARKING, f"no answer within 5 s to API {api_key}: {request[:64]!r}"
        conn.close()
        return None, "parked"


def no_answer_allowed(request: bytes) -> None:
    """Only a Produce with acks=0 goes unanswered (Kafka's rule)."""
    req = decode_request(request)
    assert req.header.api_key == 0 and int(req.body.acks) == 0, (
        f"no answer to API {req.header.api_key}")


def is_bug(log_line: str) -> bool:
    """A traceback, or an ERROR line (the server logs a handler's exception as one ERROR
    line, R-NF-1): what hostile input must never cause."""
    return "Traceback" in log_line or "level=ERROR" in log_line or "level=CRITICAL" in log_line


def assert_healthy(broker: Any) -> None:
    """A broker process (``BrokerProcess``) or thread (``InProcessBroker``) still runs and
    has logged no bug."""
    running = broker.alive() if broker.proc is None else broker.proc.poll() is None
    assert running, "".join(broker.stderr_lines[-50:])
    tracebacks = [line for line in broker.stderr_lines if is_bug(line)]
    assert not tracebacks, "".join(broker.stderr_lines[-80:])


def real_client_works(bootstrap: str, topic: str) -> None:
    from tests.clients import Rec, consume, create_topic, produce

    create_topic("confluent", bootstrap, topic, 1)
    produce("confluent", bootstrap, topic, [Rec(0, b"k", b"still serving")])
    got = consume("confluent", bootstrap, topic, [0], 1)
    assert [r.value for r in got] == [b"still serving"]


