"""No client can pin, starve or lock out the others (issue 23, items 2, 3, 4 and 6; R-NF-3).

Each hostile client here stays within the protocol and takes a shared resource: the request
memory pool (size prefixes that promise frames never sent), request slots (frames never
completed), connection slots (idle connections from one address), the SASL listener
(password guessing). Hostile clients are raw sockets, most from 127.0.0.2 (Linux routes all
of 127.0.0.0/8 to loopback); the well-behaved clients (a raw ApiVersions, an administrator
logging in, a confluent-kafka producer and consumer group) come from 127.0.0.1 and must be
served meanwhile. The broker runs in process (``tests/inproc.py``) over real TCP, so the
tests can also read its pool and request counts.
"""

from __future__ import annotations

import resource
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tests.brokerproc import wait_until
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient
from tests.security_helpers import listener_ports, plain_jaas

pytestmark = pytest.mark.timeout(240)

MB = 1024 * 1024
HOSTILE_IP = "127.0.0.2"
USERS = {"admin": "admin-secret", "alice": "alice-secret"}
API_VERSIONS = {"client_software_name": "t", "client_software_version": "1"}
META = {"topics": None, "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False}


def raw(port: int, source_ip: str = HOSTILE_IP) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind((source_ip, 0))
    s.connect(("127.0.0.1", port))
    return s


def open_many(port: int, n: int, first_bytes: bytes = b"",
              source_ip: str = HOSTILE_IP) -> list[socket.socket]:
    socks = []
    try:
        for _ in range(n):
            s = raw(port, source_ip)
            socks.append(s)
            if first_bytes:
                s.sendall(first_bytes)
    except BaseException:
        close_all(socks)
        raise
    return socks


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def closed_by_peer(s: socket.socket, timeout_s: float) -> bool:
    s.settimeout(timeout_s)
    try:
        while True:
            if s.recv(65536) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def api_versions_within(bootstrap: str, timeout_s: float) -> float:
    """A fresh ApiVersions from 127.0.0.1: its round trip in seconds (raises on timeout)."""
    t0 = time.monotonic()
    with WireClient.to(bootstrap, timeout_s=timeout_s) as wc:
        assert wc.request(18, 3, API_VERSIONS).error_code == 0
    return time.monotonic() - t0


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> str:
    with WireClient.to(bootstrap) as wc:
        resp = wc.request(19, 7, {"topics": [{
            "name": name, "num_partitions": partitions, "replication_factor": 1,
            "assignments": [], "configs": []}], "timeout": 10_000, "validate_only": False})
        assert resp.topics[0].error_code == 0, resp.topics[0].error_message
    return name


def produce_and_consume_in_a_group(bootstrap: str, n: int = 20,
                                   deadline_s: float = 40.0) -> float:
    """A confluent-kafka producer (acks=all) writes ``n`` records; a consumer in a group
    (subscribe: FindCoordinator, JoinGroup, SyncGroup, heartbeats, OffsetFetch, Fetch,
    pipelined by librdkafka) reads every one. Returns the seconds it took."""
    from confluent_kafka import Consumer, Producer

    t0 = time.monotonic()
    topic = create_topic(bootstrap, f"good-{uuid.uuid4().hex[:6]}", partitions=2)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(n):
        p.produce(topic, b"good-%d" % i)
    assert p.flush(deadline_s) == 0, "the producer's records were not all acknowledged"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    got: set[bytes] = set()
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + deadline_s
        while len(got) < n and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                got.add(bytes(msg.value()))
    finally:
        c.close()
    assert len(got) == n, f"the consumer group read {len(got)} of {n} records"
    return time.monotonic() - t0


def arrived(conn: Any) -> bool:
    """The broker has a hostile connection's size prefix (its frame reserved or waiting)."""
    return bool(conn.decoder.reserved_partial or conn.decoder.waiting_set)


def paced_lines(since: float) -> int:
    """The most lines an event paced at one per 10 s may have written since ``since``."""
    return 2 + int((time.monotonic() - since) / 10)


def log_text(b: InProcessBroker) -> str:
    return "".join(b.stderr_lines)


# ------------------------------------------------------------------ item 2: memory pool


def test_size_prefixes_alone_do_not_take_the_request_memory_pool(tmp_path: Path) -> None:
    """Issue 23 item 2 (R-NF-3): 130 connections from one address each send only a size
    prefix promising 2 MiB (260 MiB, over the whole default pool of 256 MiB). That address
    holds at most queued.max.unreceived.bytes.per.ip (32 MiB) of the pool; its other
    prefixes wait for its own bytes, with a log line. ApiVersions, produce and a consumer
    group from another address go on (before: every other connection stopped being read
    for connections.max.idle.ms, with nothing logged)."""
    with InProcessBroker(tmp_path / "data", {"group.initial.rebalance.delay.ms": "0"}) as b:
        t0 = time.monotonic()
        socks = open_many(b.port, 130, struct.pack(">i", 2 * MB))
        try:
            wait_until(lambda: b.call(lambda br: sum(1 for c in br.connections if arrived(c)))
                       >= 130, 10.0, what="the 130 prefixes to arrive")
            assert api_versions_within(b.bootstrap, 10.0) < 5.0
            used = b.call(lambda br: br.memory_pool.used)
            assert used <= 32 * MB + MB, f"one address holds {used} bytes of the pool"
            produce_and_consume_in_a_group(b.bootstrap)
            wait_until(lambda: "connections from 127.0.0.2 wait" in log_text(b), 5.0,
                       what="a log line about the address's unreceived bytes")
            lines = [ln for ln in b.stderr_lines if "connections from 127.0.0.2 wait" in ln]
            assert len(lines) <= paced_lines(t0), lines  # paced: one per 10 s
        finally:
            close_all(socks)
        # everything comes back once they are gone
        wait_until(lambda: b.call(lambda br: (br.memory_pool.used, br.unreceived.per_ip))
                   == (0, {}), 10.0, what="the pool and the address budget to be released")
        assert "Traceback" not in log_text(b)


def test_prefixes_from_many_addresses_fill_the_pool_for_a_bounded_time(tmp_path: Path) -> None:
    """Issue 23 item 2: prefixes from 8 addresses, each within its per-address cap, fill a
    small pool (8 MiB): the pool-full condition is logged (one line, paced), and the frames
    never sent are closed after request.receive.timeout.ms (1.5 s) although they are far
    from connections.max.idle.ms (10 min); then a large frame from a good client gets the
    memory (before: no log line and the pool stayed taken for 10 minutes)."""
    with InProcessBroker(tmp_path / "data", {
            "queued.max.request.bytes": str(8 * MB),
            "queued.max.unreceived.bytes.per.ip": str(MB),
            "request.receive.timeout.ms": "3000"}) as b:
        t0 = time.monotonic()
        socks: list[socket.socket] = []
        try:
            for i in range(8):
                socks += open_many(b.port, 4, struct.pack(">i", 256 * 1024 - 16),
                                   source_ip=f"127.0.0.{10 + i}")
            # large frames may take all but the headroom (an eighth): 28 of the 32 prefixes
            wait_until(lambda: b.call(lambda br: br.memory_pool.used) >= 6 * MB, 10.0,
                       what="the pool to be taken by prefixes")
            # a 2 MiB frame (a large one: no headroom for it) waits for the pool, until
            # the receive timeout closes the prefixes that hold it
            with WireClient.to(b.bootstrap, timeout_s=20.0) as wc:
                big = wc.encode(18, 3, {"client_software_name": "x" * (2 * MB - 100),
                                        "client_software_version": "1"})
                wc.send_raw(big)
                assert wc.read_response(18, 3).error_code == 0
            assert all(closed_by_peer(s, 10.0) for s in socks)
            text = log_text(b)
            assert "request memory pool full (queued.max.request.bytes=8388608" in text
            assert "within 3000 ms (request.receive.timeout.ms" in text
            assert sum("request memory pool full" in ln
                       for ln in b.stderr_lines) <= paced_lines(t0)
        finally:
            close_all(socks)
        assert "Traceback" not in log_text(b)


def test_frames_before_an_oversized_prefix_give_their_memory_back(tmp_path: Path) -> None:
    """Issue 23 item 2: a request followed, in the same packet, by a prefix over
    socket.request.max.bytes closes the connection; the request's reservation goes back to
    the pool (before: it was lost with the error, and 50 such packets kept part of the pool
    reserved for good)."""
    with InProcessBroker(tmp_path / "data") as b:
        with WireClient.to(b.bootstrap) as wc:
            frame = wc.encode(18, 3, API_VERSIONS)
        for _ in range(50):
            with socket.create_connection(("127.0.0.1", b.port), timeout=5) as s:
                s.sendall(frame + struct.pack(">i", 200 * MB))
                assert closed_by_peer(s, 5.0)
        wait_until(lambda: b.call(lambda br: (br.memory_pool.used, br.queued_requests))
                   == (0, 0), 10.0, what="every reservation given back")
        assert api_versions_within(b.bootstrap, 10.0) < 5.0


@pytest.fixture
def sasl_broker(tmp_path: Path) -> Iterator[tuple[InProcessBroker, dict[str, int]]]:
    with InProcessBroker(tmp_path / "data", {
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain_jaas(USERS),
            "connection.failed.authentication.delay.ms": "300"}) as b:
        yield b, listener_ports(b)  # type: ignore[arg-type]
        assert "Traceback" not in log_text(b)


def test_unauthenticated_prefixes_reserve_nothing_and_do_not_lock_out_the_admin(
        sasl_broker: tuple[InProcessBroker, dict[str, int]]) -> None:
    """Issue 23 item 2: 520 unauthenticated connections on the SASL listener each send a
    prefix promising sasl.server.max.receive.size (512 KiB: 260 MiB in all). Before
    authentication nothing is reserved from the shared pool (its use stays 0) and frames are
    buffered only as their bytes arrive; the administrator logs in and is served at once
    (before: the 520 prefixes took the whole pool and the administrator could not log in)."""
    b, ports = sasl_broker
    sasl = f"127.0.0.1:{ports['SASL_PLAINTEXT']}"
    socks = open_many(ports["SASL_PLAINTEXT"], 520, struct.pack(">i", 512 * 1024))
    try:
        wait_until(lambda: b.call(lambda br: sum(1 for c in br.connections if arrived(c)))
                   >= 520, 15.0, what="the prefixes to arrive")
        assert b.call(lambda br: br.memory_pool.used) == 0
        t0 = time.monotonic()
        with WireClient.to(sasl, timeout_s=10.0) as admin:
            assert admin.request(18, 3, API_VERSIONS).error_code == 0
            admin.sasl_plain("admin", USERS["admin"])
            assert admin.request(3, 12, META).brokers
        assert time.monotonic() - t0 < 5.0
        assert b.call(lambda br: br.memory_pool.used) == 0
    finally:
        close_all(socks)


# ------------------------------------------------------------------ item 3: request slots


def test_frames_never_completed_take_no_request_slots(tmp_path: Path) -> None:
    """Issue 23 item 3 (R-NF-3): 500 connections (queued.max.requests) each send 8 bytes
    of a 100-byte frame and nothing more. Only complete requests take request slots (as
    Kafka queues only complete requests), so a confluent-kafka producer and consumer group,
    which pipeline their requests, keep working (before: the 500 held every slot and the
    group stalled for connections.max.idle.ms)."""
    with InProcessBroker(tmp_path / "data", {"group.initial.rebalance.delay.ms": "0"}) as b:
        socks = open_many(b.port, 500, struct.pack(">i", 100) + b"\0\x12\0\x03")
        try:
            wait_until(lambda: b.call(lambda br: sum(1 for c in br.connections if arrived(c)))
                       >= 500, 15.0, what="the 500 partial frames to arrive")
            took = produce_and_consume_in_a_group(b.bootstrap, deadline_s=40.0)
            print(f"producer and consumer group beside 500 partial frames: {took:.1f} s")
            # none of the 500 holds a request slot (the good clients' last may be in flight)
            wait_until(lambda: b.call(lambda br: br.queued_requests) == 0, 10.0,
                       what="no request slot held")
        finally:
            close_all(socks)
        assert "Traceback" not in log_text(b)


# ------------------------------------------------------------------ item 4: connection slots


def test_one_address_cannot_take_every_connection_slot(tmp_path: Path) -> None:
    """Issue 23 item 4 (R-NF-3): max.connections.per.ip defaults to 1,000 (a tenth of
    max.connections): 1,500 idle connections from one address get 1,000; the rest are
    refused (one log line per interval), and a client from another address is served
    (before: the default was unlimited, so 10,000 idle connections refused everyone).
    Both ends live in this process (about 2,600 descriptors; the broker raises the soft
    limit to the hard one): under a hard limit too small for that, the same is checked
    with max.connections.per.ip=300 set."""
    with InProcessBroker(tmp_path / "data", {"max.connections": "1200"}) as b:
        per_ip = 1000
        if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 3000:
            b.stop()
            per_ip = 300
            b.overrides["max.connections.per.ip"] = str(per_ip)
            b.start()
        t0 = time.monotonic()
        socks = open_many(b.port, per_ip * 3 // 2)
        try:
            wait_until(lambda: b.call(lambda br: br.quotas.per_ip.get(HOSTILE_IP, 0))
                       == per_ip, 15.0, what=f"{per_ip} connections admitted from one address")
            assert closed_by_peer(socks[-1], 5.0)
            assert api_versions_within(b.bootstrap, 10.0) < 5.0
            refusals = [ln for ln in b.stderr_lines if "refusing connections" in ln]
            assert 1 <= len(refusals) <= paced_lines(t0), refusals
            assert f"max.connections.per.ip={per_ip}" in refusals[0]
        finally:
            close_all(socks)


def test_the_inter_broker_listener_keeps_its_capacity(tmp_path: Path) -> None:
    """Issue 23 item 4, KIP-402: with the client listener full (max.connections=40, 10
    idle connections from each of 4 addresses), a new connection there is refused, but one
    on the inter-broker listener is still accepted and served (before: refused too)."""
    with InProcessBroker(tmp_path / "data", {
            "listeners": "INTERNAL://127.0.0.1:0,CLIENT://127.0.0.1:0",
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT,CLIENT:PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
            "max.connections": "40", "max.connections.per.ip": "10"}) as b:
        ports = listener_ports(b)  # type: ignore[arg-type]
        socks: list[socket.socket] = []
        try:
            for i in range(4):
                socks += open_many(ports["CLIENT"], 10, source_ip=f"127.0.0.{4 + i}")
            wait_until(lambda: b.call(lambda br: br.quotas.total) == 40, 10.0,
                       what="the client listener to be full")
            refused = raw(ports["CLIENT"], "127.0.0.9")
            assert closed_by_peer(refused, 5.0)
            refused.close()
            with WireClient.to(f"127.0.0.1:{ports['INTERNAL']}", timeout_s=10.0) as wc:
                assert wc.request(18, 3, API_VERSIONS).error_code == 0
                assert wc.request(3, 12, META).brokers
        finally:
            close_all(socks)


def test_per_ip_overrides_give_one_address_more(tmp_path: Path) -> None:
    """Issue 23 item 4: max.connections.per.ip.overrides (Kafka's host:count form) lets one
    address past max.connections.per.ip; the others keep the default."""
    with InProcessBroker(tmp_path / "data", {
            "max.connections.per.ip": "5",
            "max.connections.per.ip.overrides": "127.0.0.5:12,localhost:7"}) as b:
        socks = open_many(b.port, 14, source_ip="127.0.0.5")
        socks += open_many(b.port, 8, source_ip="127.0.0.4")
        try:
            wait_until(lambda: b.call(lambda br: br.quotas.per_ip) == {
                "127.0.0.5": 12, "127.0.0.4": 5}, 10.0, what="the per-address counts")
            assert b.call(lambda br: br.quotas.limit_for("127.0.0.1")) == 7
        finally:
            close_all(socks)


def test_connections_that_never_complete_a_request_are_reaped_first(tmp_path: Path) -> None:
    """Issue 23 item 4: connections.first.request.timeout.ms (1.5 s here) closes 200 idle
    connections that never sent a complete request, and one that sent half a frame, while
    an established connection as idle as they are stays open (connections.max.idle.ms, 10
    minutes); one log line (before: all stayed for connections.max.idle.ms)."""
    with InProcessBroker(tmp_path / "data",
                         {"connections.first.request.timeout.ms": "1500"}) as b:
        t0 = time.monotonic()
        silent = open_many(b.port, 200)
        half = raw(b.port)
        half.sendall(struct.pack(">i", 1000)[:2])
        established = WireClient.to(b.bootstrap)
        try:
            assert established.request(18, 3, API_VERSIONS).error_code == 0
            for s in (*silent, half):
                assert closed_by_peer(s, 10.0), "a connection with no request was left open"
            assert time.monotonic() - t0 >= 1.4
            assert not established.is_closed_by_peer(1.0)
            assert established.request(18, 3, API_VERSIONS).error_code == 0
            wait_until(lambda: "connections.first.request.timeout.ms" in log_text(b), 5.0,
                       what="the log line")
            lines = [ln for ln in b.stderr_lines if "connections.first.request" in ln]
            assert len(lines) <= paced_lines(t0), lines
        finally:
            close_all([*silent, half])
            established.close()


# ------------------------------------------------------------------ item 6: password guessing


def _guess(sasl: str, stats: dict[str, list[float]], stop: threading.Event) -> None:
    """Guess passwords in a loop: connect, SaslHandshake v1, SaslAuthenticate; records the
    time each failure's answer took."""
    while not stop.is_set():
        with WireClient.to(sasl, timeout_s=10.0) as w:
            assert w.request(17, 1, {"mechanism": "PLAIN"}).error_code == 0
            t0 = time.monotonic()
            r = w.request(36, 2, {"auth_bytes": b"\0alice\0guess-%d" % len(stats["v1"])})
            stats["v1"].append(time.monotonic() - t0)
            assert r.error_code == ErrorCode.sasl_authentication_failed
            assert w.is_closed_by_peer(5.0)


def test_password_guessing_is_held_to_one_guess_per_delay(
        sasl_broker: tuple[InProcessBroker, dict[str, int]]) -> None:
    """Issue 23 item 6: a failed SaslAuthenticate is answered only after
    connection.failed.authentication.delay.ms (300 ms here), so four clients guessing in a
    loop for 3 s get at most one guess per 300 ms each; after SaslHandshake v0 a wrong bare
    token is held as long before the close. Meanwhile another client's requests are answered
    at once (the wait blocks neither the event loop nor the others), and the log says so in
    a bounded number of lines (before: answered at once, hundreds of guesses a second, and
    one unpaced line per v0 failure)."""
    b, ports = sasl_broker
    sasl = f"127.0.0.1:{ports['SASL_PLAINTEXT']}"
    stats: dict[str, list[float]] = {"v1": []}
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _guess(sasl, stats, stop)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    witness_rtts = []
    with WireClient.to(f"127.0.0.1:{ports['PLAINTEXT']}") as witness:
        while time.monotonic() - t0 < 3.0:
            w0 = time.monotonic()
            assert witness.request(18, 3, API_VERSIONS).error_code == 0
            witness_rtts.append(time.monotonic() - w0)
    stop.set()
    for t in threads:
        t.join(15)
    elapsed = time.monotonic() - t0
    assert not errors, errors
    guesses = len(stats["v1"])
    print(f"4 guessing clients: {guesses} guesses in {elapsed:.1f} s; witness max "
          f"{max(witness_rtts) * 1000:.0f} ms")
    assert guesses >= 4
    assert min(stats["v1"]) >= 0.25, min(stats["v1"])  # every failure held for the delay
    assert guesses <= 4 * (elapsed / 0.3 + 1), guesses
    # the median round trip: not held for the delay (300 ms) as the guessers are
    assert sorted(witness_rtts)[len(witness_rtts) // 2] < 0.25
    # SaslHandshake v0: a wrong bare token is held, then the connection closes
    with WireClient.to(sasl) as w:
        assert w.request(17, 0, {"mechanism": "PLAIN"}).error_code == 0
        t1 = time.monotonic()
        w.send_raw((12).to_bytes(4, "big") + b"\0alice\0wrong")
        assert w.is_closed_by_peer(5.0)
        assert time.monotonic() - t1 >= 0.25
    # the right password still gets in
    with WireClient.to(sasl) as w:
        w.sasl_plain("alice", USERS["alice"])
        assert w.request(3, 12, META).brokers
    lines = [ln for ln in b.stderr_lines if "authentication failed" in ln]
    assert 1 <= len(lines) <= paced_lines(t0), lines  # one per 10 s, with a count
    assert not any("level=WARNING" in ln or "level=ERROR" in ln for ln in b.stderr_lines
                   if "authentication" in ln)
