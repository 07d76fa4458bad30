"""Bad input gets a Kafka error or a clean close, never a crash (R-NF-1, R-PROTO-1, R-PROTO-6).

Every case runs against a broker with ``auto.create.topics.enable=false`` while a *witness*
connection, opened before the bad input, must still answer a Metadata round trip afterwards,
a fresh connection must get served, and the broker process must still be alive. One test
keeps a confluent-kafka producer streaming through all the protocol abuse at once.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from tests.batches import make_batch
from tests.brokerproc import BrokerProcess, wait_until
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.timeout(120)

LATEST, EARLIEST = -1, -2
TOPIC_RESOURCE = 2
SET, APPEND = 0, 2


# ------------------------------------------------------------------ fixtures and helpers


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker that never auto-creates topics."""
    data = tmp_path_factory.mktemp("strict")
    with BrokerProcess(data, {"auto.create.topics.enable": "false",
                              "num.partitions": "1"}) as b:
        yield b

def wire(b: BrokerProcess | InProcessBroker) -> WireClient:
    return WireClient.to(b.bootstrap, timeout_s=10)


def metadata(wc: WireClient, topics: list[str] | None, allow_auto: bool = True) -> Any:
    body = {"topics": None if topics is None else [{"name": t, "topic_id": None}
                                                   for t in topics],
            "allow_auto_topic_creation": allow_auto,
            "include_topic_authorized_operations": False}
    return wc.request(3, 12, body)


def topic_names(wc: WireClient) -> set[str]:
    return {t.name for t in metadata(wc, None).topics}


def create_topics(wc: WireClient, topics: list[tuple[str, dict[str, str]]],
                  partitions: int = 1, version: int = 7) -> dict[str, Any]:
    resp = wc.request(19, version, {
        "topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                    "assignments": [], "configs": [{"name": k, "value": v}
                                                   for k, v in cfg.items()]}
                   for name, cfg in topics],
        "timeout": 10_000, "validate_only": False})
    return {t.name: t for t in resp.topics}


def new_topic(wc: WireClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    res = create_topics(wc, [(name, {})])[name]
    assert res.error_code == ErrorCode.none, res.error_message
    return name


def produce_raw(wc: WireClient, topic: str, records: bytes, acks: int = 1,
                partition: int = 0) -> Any:
    resp = wc.request(0, 9, {"transactional_id": None, "acks": acks, "timeout": 10_000,
                             "topic_data": [{"name": topic, "partition_data": [
                                 {"index": partition, "records": records}]}]})
    (t,) = resp.responses
    assert t.name == topic
    (p,) = t.partition_responses
    return p


def list_offset(wc: WireClient, topic: str, ts: int, partition: int = 0) -> tuple[Any, int]:
    resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": partition, "timestamp": ts}]}]})
    (p,) = resp.topics[0].partitions
    return p.error_code, int(p.offset)


def raw_header(api_key: int, version: int, correlation_id: int,
               client_id: bytes = b"bad-input") -> bytes:
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def rss_kb(pid: int) -> int | None:
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


class Witness:
    """A connection opened before the bad input; proves others are unaffected."""

    def __init__(self, b: BrokerProcess) -> None:
        self.b = b
        self.wc = wire(b)
        assert metadata(self.wc, []).brokers, "witness: no brokers before the test"

    def check(self) -> None:
        assert self.b.proc is not None and self.b.proc.poll() is None, "broker died"
        md = metadata(self.wc, [])
        assert [(x.host, x.port) for x in md.brokers] == [("127.0.0.1", self.b.port)]
        with wire(self.b) as fresh:  # and the broker still accepts new connections
            resp = fresh.request(18, 3, {"client_software_name": "witness",
                                         "client_software_version": "1"})
            assert resp.error_code == ErrorCode.none
        self.wc.close()


@pytest.fixture
def witness(strict: BrokerProcess) -> Iterator[Witness]:
    w = Witness(strict)
    yield w
    w.check()


# ------------------------------------------------------------------ framing


@pytest.mark.parametrize("garbage", [
    pytest.param(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", id="http-request"),
    # a plausible size with a header whose client id length runs past the frame
    pytest.param(framed(struct.pack(">hhih", 3, 12, 1, 0x7FFF) + b"xy"), id="torn-client-id"),
    # a whole Metadata v12 request cut short (size prefix adjusted)
    pytest.param(b"truncated-metadata", id="truncated-body"),
    pytest.param(framed(b"\x01"), id="frame-shorter-than-header"),
    pytest.param(framed(b""), id="empty-frame"),
])
def test_garbage_bytes_close_the_connection(strict: BrokerProcess, witness: Witness,
                                            garbage: bytes) -> None:
    """R-NF-1, R-PROTO-6: bytes that are not a request close that connection only."""
    with wire(strict) as wc:
        if garbage == b"truncated-metadata":
            whole = wc.encode(3, 12, {"topics": [{"name": "abc", "topic_id": None}],
                                      "allow_auto_topic_creation": False,
                                      "include_topic_authorized_operations": False})
            payload = whole[4:-6]
            garbage = framed(payload)
        wc.send_raw(garbage)
        assert wc.is_closed_by_peer(5.0), "broker kept a connection that sent garbage"


@pytest.mark.parametrize("size", [2**31 - 1, 200 * 1024 * 1024], ids=["2GB", "200MB"])
def test_oversize_frame_is_closed_promptly_without_buffering(strict: BrokerProcess,
                                                             witness: Witness,
                                                             size: int) -> None:
    """R-NF-1, R-PROTO-1: a size prefix above socket.request.max.bytes (100 MiB) closes the
    connection as soon as the prefix is read; the broker buffers none of the body."""
    assert strict.proc is not None
    before = rss_kb(strict.proc.pid)
    with wire(strict) as wc:
        t0 = time.monotonic()
        wc.send_raw(struct.pack(">i", size) + b"\0" * 1000)
        closed = False
        # keep pushing body bytes until the broker hangs up; bounded by 8 MB / 5 s
        sent = 0
        try:
            while sent < 8 * 1024 * 1024 and time.monotonic() - t0 < 5:
                wc.sock.settimeout(5)
                wc.sock.sendall(b"\0" * 65536)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        closed = closed or wc.is_closed_by_peer(5.0)
        elapsed = time.monotonic() - t0
    assert closed, "the broker did not close a connection announcing a huge frame"
    assert elapsed < 5.0, f"closing took {elapsed:.2f}s"
    after = rss_kb(strict.proc.pid)
    if before is not None and after is not None:
        assert after - before < 64 * 1024, f"broker RSS grew by {(after - before) // 1024} MB"


def test_negative_size_prefix_is_closed(strict: BrokerProcess, witness: Witness) -> None:
    """R-NF-1: a negative size prefix is a protocol error: the connection is closed."""
    with wire(strict) as wc:
        wc.send_raw(struct.pack(">i", -5) + b"abcdefgh")
        assert wc.is_closed_by_peer(5.0)


def test_partial_frame_then_disconnect_leaves_the_broker_serving(strict: BrokerProcess,
                                                                 witness: Witness) -> None:
    """R-NF-1: a client that sends half a frame and vanishes costs nothing: the broker
    process keeps serving (the witness checks). The memory it held: the next test."""
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", strict.port), timeout=5)
        s.sendall(struct.pack(">i", 1000) + b"\0" * 100)
        s.close()


@pytest.fixture(scope="module")
def inproc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """The strict broker's settings, in this process: its memory pool can be read."""
    with InProcessBroker(tmp_path_factory.mktemp("strict-inproc"),
                         {"auto.create.topics.enable": "false"}) as b:
        yield b


def test_a_vanished_half_frame_gives_its_memory_and_slot_back(inproc: InProcessBroker) -> None:
    """R-NF-1, R-NF-3: the size prefix of a frame reserves its bytes of the shared memory
    pool (``queued.max.request.bytes``), counted against its address's bytes not yet
    received (``queued.max.unreceived.bytes.per.ip``), and no request slot (only complete
    requests take one, issue 23); a client that sends half the frame and vanishes gives
    them back. Checked on the broker's own pool: held while the half frame waits, all
    returned after 20 such clients, and the broker still serves."""
    def pool(b: Any) -> tuple[int, int, int, int]:
        return (b.memory_pool.used, b.memory_pool.waiting, b.queued_requests,
                b.unreceived.per_ip.get("127.0.0.1", 0))

    assert inproc.call(pool) == (0, 0, 0, 0)
    for i in range(20):
        s = socket.create_connection(("127.0.0.1", inproc.port), timeout=5)
        s.sendall(struct.pack(">i", 1000 + i) + b"\0" * 100)
        # the prefix reserved the frame's bytes while the rest is awaited
        wait_until(lambda i=i: inproc.call(pool) == (1000 + i, 0, 0, 900 + i), 10,
                   what=f"half frame {i}'s reservation: {inproc.call(pool)}")
        s.close()
        wait_until(lambda: inproc.call(pool) == (0, 0, 0, 0), 10,
                   what=f"the memory back after client {i} vanished: {inproc.call(pool)}")
    with wire(inproc) as wc:
        resp = wc.request(18, 3, {"client_software_name": "after",
                                  "client_software_version": "1"})
        assert resp.error_code == ErrorCode.none


# ------------------------------------------------------------------ api keys and versions


def test_unknown_api_key_closes_the_connection(strict: BrokerProcess, witness: Witness) -> None:
    """R-PROTO-1, R-NF-1: Kafka closes a connection sending an API key it does not know."""
    for key in (999, 32767, -1):
        with wire(strict) as wc:
            wc.send_raw(framed(raw_header(key, 0, 42) + b"\0" * 8))
            assert wc.is_closed_by_peer(5.0), f"api key {key}"


def test_api_versions_of_an_unknown_version_gets_a_v0_error_with_ranges(
        strict: BrokerProcess, witness: Witness) -> None:
    """R-PROTO-1 (KIP-511): ApiVersions v99 is answered with an ApiVersions v0 response
    carrying UNSUPPORTED_VERSION and the supported ranges; the connection stays usable."""
    from kio.schema.api_versions.v0.response import ApiVersionsResponse
    from kio.schema.response_header.v0.header import ResponseHeader
    from kio.serial import entity_reader

    with wire(strict) as wc:
        # header v2 of a future version: client id, then an empty tagged-field block and
        # the (flexible) body's own empty client software name/version and tags
        wc.send_raw(framed(raw_header(18, 99, 4242) + b"\x00" + b"\x01\x01\x00"))
        frame = wc.recv_frame()
        header, n = entity_reader(ResponseHeader)(frame, 0)
        body, _ = entity_reader(ApiVersionsResponse)(frame, n)
        assert header.correlation_id == 4242
        assert body.error_code == ErrorCode.unsupported_version
        ranges = {int(k.api_key): (int(k.min_version), int(k.max_version))
                  for k in body.api_keys}
        assert ranges[18][0] == 0 and ranges[18][1] >= 3
        for key in (0, 1, 2, 3, 19, 22):
            assert key in ranges, f"api key {key} missing from the fallback ranges"
        # a client then retries with a version in range on the same connection
        resp = wc.request(18, ranges[18][1], {"client_software_name": "retry",
                                              "client_software_version": "1"})
        assert resp.error_code == ErrorCode.none


@pytest.mark.parametrize("key,version", [(3, 99), (3, 13), (1, 17), (2, 11), (0, 13)],
                         ids=["metadata-v99", "metadata-v13", "fetch-v17", "listoffsets-v11",
                              "produce-v13"])
def test_unsupported_version_of_another_api_closes(strict: BrokerProcess, witness: Witness,
                                                   key: int, version: int) -> None:
    """R-PROTO-1, R-NF-1: a version outside the advertised range (whether or not kio has a
    schema for it) closes the connection, as Kafka does; nothing is half-answered."""
    with wire(strict) as wc:
        adv = wc.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        ranges = {int(k.api_key): (int(k.min_version), int(k.max_version))
                  for k in adv.api_keys}
        lo, hi = ranges[key]
        assert not lo <= version <= hi, f"v{version} of key {key} is advertised"
        try:
            payload = wc.encode(key, version, _minimal_body(key, version))
        except Exception:  # kio has no schema: send a header and some bytes
            payload = framed(raw_header(key, version, 77) + b"\0" * 16)
        wc.send_raw(payload)
        assert wc.is_closed_by_peer(5.0)


def _minimal_body(key: int, version: int) -> dict[str, Any]:
    if key == 3:
        return {"topics": [], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False}
    if key == 1:
        return {"max_wait": 0, "min_bytes": 0, "max_bytes": 1024, "topics": [],
                "forgotten_topics_data": []}
    if key == 2:
        return {"replica_id": -1, "isolation_level": 0, "topics": []}
    raise KeyError(key)


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(key=st.sampled_from([0, 1, 2, 3, 18, 19, 20, 22, 32, 37, 44, 60, 999]),
       version=st.integers(-1, 20), body=st.binary(max_size=64))
def test_fuzzed_frames_get_a_response_or_a_close(strict: BrokerProcess, key: int,
                                                 version: int, body: bytes) -> None:
    """R-NF-1: a frame with a plausible header and random body is either answered (with its
    correlation id) or closes the connection; never a hang, never a dead broker. A valid
    ApiVersions v0 request follows the fuzzed frame so a silent (acks=0) request can't hang."""
    with wire(strict) as wc:
        wc.sock.settimeout(5)
        wc.send_raw(framed(raw_header(key, version, 900_001) + body))
        wc.send_raw(framed(raw_header(18, 0, 900_002)))
        deadline = time.monotonic() + 10
        outcome = None
        while outcome is None:
            assert time.monotonic() < deadline, "no response and no close"
            try:
                frame = wc.recv_frame()
            except TimeoutError:
                raise AssertionError("no response and no close within 5 s") from None
            except OSError:  # EOF or reset: a clean close
                outcome = "closed"
                break
            (cid,) = struct.unpack_from(">i", frame, 0)
            assert cid in (900_001, 900_002), f"unexpected correlation id {cid}"
            if cid == 900_002:
                outcome = "answered"
    assert strict.proc is not None and strict.proc.poll() is None


def test_a_producer_streams_through_all_the_abuse(strict: BrokerProcess) -> None:
    """R-NF-1, R-PROTO-6: a confluent-kafka producer (acks=all) running while other
    connections send garbage, huge frames, unknown keys and bad versions loses nothing."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    with wire(strict) as wc:
        topic = new_topic(wc, "abuse")
    errors: list[Any] = []
    delivered: list[int] = []
    stop = threading.Event()
    p = Producer({"bootstrap.servers": strict.bootstrap, "acks": "all", "linger.ms": 1,
                  "enable.idempotence": True, "message.timeout.ms": 20_000})

    def run() -> None:
        i = 0
        while not stop.is_set() or i < 200:
            try:
                p.produce(topic, f"m{i:06d}".encode(), partition=0,
                          on_delivery=lambda e, m: errors.append(e) if e
                          else delivered.append(m.offset()))
                i += 1
            except BufferError:
                p.poll(0.01)
            p.poll(0.001)
        p.flush(20)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    rng = random.Random(7)
    abuses = [
        b"GET / HTTP/1.1\r\n\r\n",
        struct.pack(">i", 2**31 - 1) + b"\0" * 64,
        struct.pack(">i", -1),
        framed(raw_header(999, 0, 1)),
        framed(raw_header(3, 99, 1) + b"\0" * 8),
        framed(raw_header(0, 9, 1) + bytes(rng.getrandbits(8) for _ in range(200))),
    ]
    for _ in range(3):
        for blob in abuses:
            with wire(strict) as bad:
                bad.send_raw(blob)
                assert bad.is_closed_by_peer(5.0)
    wait_until(lambda: len(delivered) >= 200, 30, what="200 deliveries")
    stop.set()
    t.join(30)
    assert not t.is_alive()
    assert not errors, errors[:5]
    n = len(delivered)
    assert sorted(delivered) == list(range(n)), "gaps or duplicates in the produced offsets"
    c = Consumer({"bootstrap.servers": strict.bootstrap, "group.id": "abuse-check",
                  "enable.auto.commit": False})
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()
    assert (lo, hi) == (0, n)


# ------------------------------------------------------------------ unknown topics


def test_produce_to_unknown_topic_without_auto_create(strict: BrokerProcess,
                                                      witness: Witness) -> None:
    """R-NF-1, R-PROTO-6: with auto.create.topics.enable=false a produce to a missing topic
    gets UNKNOWN_TOPIC_OR_PARTITION and creates nothing; the connection stays usable."""
    name = f"nope-{uuid.uuid4().hex[:8]}"
    with wire(strict) as wc:
        p = produce_raw(wc, name, make_batch([(b"k", b"v", 1_700_000_000_000, [])]))
        assert p.error_code == ErrorCode.unknown_topic_or_partition
        assert p.base_offset == -1
        assert name not in topic_names(wc)
        # an unknown partition of an existing topic too
        existing = new_topic(wc, "onepart")
        p = produce_raw(wc, existing, make_batch([(None, b"v", 1, [])]), partition=5)
        assert p.error_code == ErrorCode.unknown_topic_or_partition


def test_metadata_for_unknown_topic_without_auto_create(strict: BrokerProcess,
                                                        witness: Witness) -> None:
    """R-PROTO-2, R-NF-1: Metadata for a missing topic answers UNKNOWN_TOPIC_OR_PARTITION
    (even when the request allows auto-creation) and does not create it."""
    name = f"ghost-{uuid.uuid4().hex[:8]}"
    with wire(strict) as wc:
        for allow in (True, False):
            md = metadata(wc, [name], allow_auto=allow)
            (t,) = md.topics
            assert (t.name, t.error_code) == (name, ErrorCode.unknown_topic_or_partition)
            assert list(t.partitions) == []
        assert name not in topic_names(wc)
        # other clients see the same
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": strict.bootstrap})
        md = admin.list_topics(timeout=10)
        assert name not in md.topics


# ------------------------------------------------------------------ topic names and configs

BAD_NAMES = ["", ".", "..", "a" * 250, "has space", "slash/name", "ümlaut", "star*",
             "semi;colon"]


@pytest.mark.parametrize("version", [5, 7])
def test_create_topics_rejects_invalid_names(strict: BrokerProcess, witness: Witness,
                                             version: int) -> None:
    """R-PROTO-5, R-NF-1: invalid names get INVALID_TOPIC_EXCEPTION (17) per topic; a valid
    topic in the same request is created (v7 responses carry topic ids)."""
    good = f"fine.name_{uuid.uuid4().hex[:6]}-ok"
    with wire(strict) as wc:
        res = create_topics(wc, [(n, {}) for n in BAD_NAMES] + [(good, {})], version=version)
        for n in BAD_NAMES:
            assert res[n].error_code == ErrorCode.invalid_topic_exception, n[:20]
            assert res[n].error_message, "an error message says why"
        assert res[good].error_code == ErrorCode.none
        names = topic_names(wc)
        assert good in names
        assert not names & set(BAD_NAMES)
        assert "a" * 249 not in names  # sanity: the longest legal name was not sent


def test_metadata_auto_create_rejects_invalid_names(broker: BrokerProcess) -> None:
    """R-PROTO-2, R-NF-1: with auto-creation on, Metadata for an illegal name answers
    INVALID_TOPIC_EXCEPTION and creates nothing, while a legal name is auto-created."""
    bad = ["has space", "a" * 250, "..", "slash/name"]
    good = f"auto-{uuid.uuid4().hex[:8]}"
    w = Witness(broker)
    with wire(broker) as wc:
        md = metadata(wc, [*bad, good], allow_auto=True)
        by_name = {t.name: t for t in md.topics}
        for n in bad:
            assert by_name[n].error_code == ErrorCode.invalid_topic_exception, n[:20]
        assert by_name[good].error_code == ErrorCode.none
        assert len(by_name[good].partitions) == 1
        names = topic_names(wc)
        assert good in names and not names & set(bad)
    w.check()


BAD_CONFIGS = [
    {"retention.ms": "abc"},
    {"segment.bytes": "1"},
    {"no.such.config": "1"},
    {"cleanup.policy": "shred"},
    {"message.timestamp.type": "Whenever"},
    {"max.message.bytes": "-5"},
]


@pytest.mark.parametrize("version", [5, 7])
def test_create_topics_rejects_invalid_configs(strict: BrokerProcess, witness: Witness,
                                               version: int) -> None:
    """R-PROTO-5, R-NF-1: a bad topic config gets INVALID_CONFIG (40) and no topic."""
    with wire(strict) as wc:
        named = [(f"badcfg-{i}-{uuid.uuid4().hex[:6]}", cfg) for i, cfg in enumerate(BAD_CONFIGS)]
        res = create_topics(wc, named, version=version)
        for name, cfg in named:
            assert res[name].error_code == ErrorCode.invalid_config, cfg
            assert res[name].error_message
        assert not topic_names(wc) & {n for n, _ in named}


def _describe(wc: WireClient, topic: str, keys: list[str]) -> dict[str, str | None]:
    resp = wc.request(32, 4, {"resources": [{"resource_type": TOPIC_RESOURCE,
                                             "resource_name": topic,
                                             "configuration_keys": keys}],
                              "include_synonyms": False, "include_documentation": False})
    (r,) = resp.results
    assert r.error_code == ErrorCode.none
    return {c.name: c.value for c in r.configs}


def test_incremental_alter_configs_rejects_invalid_configs(strict: BrokerProcess,
                                                           witness: Witness) -> None:
    """R-PROTO-5, R-NF-1: IncrementalAlterConfigs with a bad value, an unknown name or
    APPEND to a non-list gets INVALID_CONFIG, and nothing of that resource is stored."""
    with wire(strict) as wc:
        topic = new_topic(wc, "alter")
        before = _describe(wc, topic, ["retention.ms", "segment.bytes"])
        cases = [
            [("retention.ms", SET, "12345"), ("segment.bytes", SET, "not-a-number")],
            [("retention.ms", SET, "12345"), ("no.such.config", SET, "1")],
            [("retention.ms", APPEND, "5")],
            [("segment.bytes", SET, "1")],
        ]
        for ops in cases:
            resp = wc.request(44, 1, {"resources": [{
                "resource_type": TOPIC_RESOURCE, "resource_name": topic,
                "configs": [{"name": n, "config_operation": op, "value": v}
                            for n, op, v in ops]}], "validate_only": False})
            (r,) = resp.responses
            assert r.error_code == ErrorCode.invalid_config, ops
            assert _describe(wc, topic, ["retention.ms", "segment.bytes"]) == before, ops
        # the same connection still applies a valid change
        resp = wc.request(44, 1, {"resources": [{
            "resource_type": TOPIC_RESOURCE, "resource_name": topic,
            "configs": [{"name": "retention.ms", "config_operation": SET,
                         "value": "12345"}]}], "validate_only": False})
        assert resp.responses[0].error_code == ErrorCode.none
        assert _describe(wc, topic, ["retention.ms"])["retention.ms"] == "12345"


# ------------------------------------------------------------------ bad produce requests


def _leo(wc: WireClient, topic: str) -> int:
    code, off = list_offset(wc, topic, LATEST)
    assert code == ErrorCode.none
    return off


def test_invalid_required_acks(strict: BrokerProcess, witness: Witness) -> None:
    """R-PROTO-3: acks=2 (or -2) gets INVALID_REQUIRED_ACKS (21) and appends nothing."""
    with wire(strict) as wc:
        topic = new_topic(wc, "acks")
        assert produce_raw(wc, topic, make_batch([(None, b"ok", 1, [])])).error_code == 0
        for acks in (2, -2, 5):
            p = produce_raw(wc, topic, make_batch([(None, b"bad", 1, [])]), acks=acks)
            assert p.error_code == ErrorCode.invalid_required_acks, acks
        assert _leo(wc, topic) == 1


def test_corrupted_crc_is_rejected(strict: BrokerProcess, witness: Witness) -> None:
    """R-LOG-4: a batch whose CRC-32C does not match gets CORRUPT_MESSAGE (2); nothing is
    appended; a good batch on the same connection is then stored at offset 0."""
    with wire(strict) as wc:
        topic = new_topic(wc, "crc")
        good = make_batch([(b"k", b"value-%d" % i, 1_700_000_000_000 + i, []) for i in range(3)])
        bad = bytearray(good)
        bad[-1] ^= 0xFF  # flip a byte of the last record (covered by the CRC)
        p = produce_raw(wc, topic, bytes(bad))
        assert p.error_code == ErrorCode.corrupt_message
        bad2 = bytearray(good)
        bad2[17] ^= 0x01  # the stored CRC itself
        assert produce_raw(wc, topic, bytes(bad2)).error_code == ErrorCode.corrupt_message
        # Kafka's ProduceRequest.validateRecords (v3+): no whole batch, or more than one
        # batch in a partition's records, is INVALID_RECORD
        torn = good[:-5]  # a batch shorter than its batchLength
        assert produce_raw(wc, topic, torn).error_code == ErrorCode.invalid_record
        p = produce_raw(wc, topic, good + bytes(bad))
        assert p.error_code == ErrorCode.invalid_record
        p = produce_raw(wc, topic, good + good)  # two good batches: refused too
        assert p.error_code == ErrorCode.invalid_record
        assert _leo(wc, topic) == 0
        p = produce_raw(wc, topic, good)
        assert (p.error_code, p.base_offset) == (ErrorCode.none, 0)
        assert _leo(wc, topic) == 3


def test_magic_v1_message_set_is_rejected(strict: BrokerProcess, witness: Witness) -> None:
    """R-LOG-3, R-NF-1: a v1 (magic 1) message set in a Produce v3+ is refused with
    INVALID_RECORD, as Kafka's ProduceRequest.validateRecords answers ("only allowed to
    contain record batches with magic version 2"), and the log end offset does not move."""
    from aiokafka.record.legacy_records import LegacyRecordBatchBuilder

    b = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    for i in range(3):
        b.append(i, timestamp=1_700_000_000_000 + i, key=b"k", value=b"old-format")
    legacy = bytes(b.build())
    with wire(strict) as wc:
        topic = new_topic(wc, "magic1")
        p = produce_raw(wc, topic, legacy)
        assert p.error_code == ErrorCode.invalid_record, p.error_code
        assert _leo(wc, topic) == 0
        # magic 0 too, and the connection keeps working
        b0 = LegacyRecordBatchBuilder(magic=0, compression_type=0, batch_size=1 << 20)
        b0.append(0, timestamp=None, key=None, value=b"ancient")
        p = produce_raw(wc, topic, bytes(b0.build()))
        assert p.error_code == ErrorCode.invalid_record
        assert _leo(wc, topic) == 0


def test_random_bytes_as_records_are_rejected(strict: BrokerProcess, witness: Witness) -> None:
    """R-LOG-4, R-NF-1: random bytes in the records field never reach the log."""
    rng = random.Random(1234)
    with wire(strict) as wc:
        topic = new_topic(wc, "noise")
        for n in (1, 11, 61, 300):
            blob = bytes(rng.getrandbits(8) for _ in range(n))
            p = produce_raw(wc, topic, blob)
            assert p.error_code != ErrorCode.none, n
        assert _leo(wc, topic) == 0



# ------------------------------------------------------------------ records validated (issue 8)

CORPUS = Path(__file__).parents[1] / "fuzz" / "corpus" / "batches"
BOMB = CORPUS / "invalid_record--zstd-bomb-1.5GiB.bin"


def _corpus() -> list[Path]:
    # the far-future file's timestamps are fixed (2023 + 1 day): in the past by now
    return [p for p in sorted(CORPUS.glob("*.bin"))
            if not p.name.startswith("invalid_timestamp")]


def produce_raw_v(wc: WireClient, version: int, topic: str, records: bytes | None) -> Any:
    resp = wc.request(0, version, {"transactional_id": None, "acks": 1, "timeout": 10_000,
                                   "topic_data": [{"name": topic, "partition_data": [
                                       {"index": 0, "records": records}]}]})
    (p,) = resp.responses[0].partition_responses
    return p


def test_bad_batches_get_kafkas_codes_and_record_errors(strict: BrokerProcess,
                                                        witness: Witness) -> None:
    """R-LOG-3, R-LOG-4, R-NF-1 (issue 8): every batch of the fuzz corpus (records that
    contradict their header, broken framing, the compression bomb, two batches, magic 1,
    ...) is refused over TCP with the code its file name says, an error_message, and
    record_errors naming the bad record where a record is to blame; nothing is stored and
    a real client's batch is then stored at offset 0."""
    with wire(strict) as wc:
        topic = new_topic(wc, "records")
        for path in _corpus():
            expected = ErrorCode[path.name.split("--")[0]]
            p = produce_raw_v(wc, 9, topic, path.read_bytes())
            assert p.error_code == expected, (path.name, p.error_code, p.error_message)
            assert p.error_message, path.name
            assert p.base_offset == -1
        p = produce_raw_v(wc, 9, topic, (CORPUS / (
            "invalid_record--offset-delta-past-last-offset-delta.bin")).read_bytes())
        assert [(e.batch_index, "offset delta 7" in (e.batch_index_error_message or ""))
                for e in p.record_errors] == [(2, True)]
        assert _leo(wc, topic) == 0
    from tests.clients import Rec, produce
    assert produce("confluent", strict.bootstrap, topic,
                   [Rec(0, b"k", b"after")]) == [(0, 0)]


def test_null_and_empty_records_are_invalid_record(strict: BrokerProcess,
                                                   witness: Witness) -> None:
    """R-NF-1: a null or empty records field is INVALID_RECORD (Kafka: "must have at least
    one record batch per partition"), not an exception in the broker."""
    with wire(strict) as wc:
        topic = new_topic(wc, "null-records")
        for version in (3, 9, 12):
            for records in (None, b""):
                p = produce_raw_v(wc, version, topic, records)
                assert p.error_code == ErrorCode.invalid_record, (version, records)
        assert _leo(wc, topic) == 0
    assert not [line for line in strict.stderr_lines if "Traceback" in line]


def test_zstd_before_produce_v7_is_unsupported_compression_type(strict: BrokerProcess,
                                                                 witness: Witness) -> None:
    """R-PROTO-3: ProduceRequest.validateRecords: zstd needs Produce v7+."""
    with wire(strict) as wc:
        topic = new_topic(wc, "zstd-v6")
        batch = make_batch([(b"k", b"v", int(time.time() * 1000), [])], compression="zstd")
        assert produce_raw_v(wc, 6, topic, batch).error_code == (
            ErrorCode.unsupported_compression_type)
        assert produce_raw_v(wc, 7, topic, batch).error_code == ErrorCode.none


def test_produce_into_internal_topic_is_refused(strict: BrokerProcess, witness: Witness) -> None:
    """R-GROUP (issue 8): a plain Produce into __consumer_offsets (a forged offset commit)
    is refused as Kafka's ReplicaManager does for clients (INVALID_TOPIC_EXCEPTION, "Cannot
    append to internal topic") and nothing reaches the log; confluent-kafka gets the error."""
    from confluent_kafka import KafkaError, Producer

    with wire(strict) as wc:
        resp = wc.request(10, 3, {"key": "forged-group", "key_type": 0})  # creates the topic
        assert resp.error_code == ErrorCode.none
        (md,) = metadata(wc, ["__consumer_offsets"]).topics
        assert md.is_internal
        n = len(md.partitions)
        before = [list_offset(wc, "__consumer_offsets", LATEST, p)[1] for p in range(n)]
    p = Producer({"bootstrap.servers": strict.bootstrap, "acks": "all", "retries": 0,
                  "message.timeout.ms": 10_000})
    errors: list[Any] = []
    p.produce("__consumer_offsets", b"forged-value", b"forged-key", partition=0,
              on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(15) == 0
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == KafkaError.TOPIC_EXCEPTION, errors[0]
    with wire(strict) as wc:
        p0 = produce_raw(wc, "__consumer_offsets", make_batch([(b"k", b"v", 1, [])]))
        assert p0.error_code == ErrorCode.invalid_topic_exception
        assert "internal topic" in (p0.error_message or "")
        after = [list_offset(wc, "__consumer_offsets", LATEST, p)[1] for p in range(n)]
    assert after == before


def test_far_future_timestamp_is_invalid_timestamp(strict: BrokerProcess,
                                                   witness: Witness) -> None:
    """KIP-937 (issue 8): with CreateTime, a confluent-kafka record stamped more than
    message.timestamp.after.max.ms (default one hour) ahead of the broker's clock fails
    with INVALID_TIMESTAMP; a topic allowing it, and a record an hour old, are stored."""
    from confluent_kafka import KafkaError, Producer

    with wire(strict) as wc:
        topic = new_topic(wc, "future")
        lax = f"lax-{uuid.uuid4().hex[:8]}"
        res = create_topics(wc, [(lax, {"message.timestamp.after.max.ms": str(10 * 86_400_000),
                                        "message.timestamp.before.max.ms": "60000"})])
        assert res[lax].error_code == ErrorCode.none
    now = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": strict.bootstrap, "acks": "all",
                  "message.timeout.ms": 10_000})
    results: dict[str, Any] = {}

    def send(name: str, t: str, ts: int) -> None:
        p.produce(t, b"v", b"k", partition=0, timestamp=ts,
                  on_delivery=lambda err, msg: results.__setitem__(name, err))
        p.flush(15)

    send("future", topic, now + 2 * 86_400_000)
    send("past", topic, now - 3_600_000)
    send("lax-future", lax, now + 2 * 86_400_000)
    send("lax-past", lax, now - 3_600_000)
    assert results["future"] is not None
    assert results["future"].code() == KafkaError.INVALID_TIMESTAMP, results["future"]
    assert results["past"] is None
    assert results["lax-future"] is None
    assert results["lax-past"] is not None
    assert results["lax-past"].code() == KafkaError.INVALID_TIMESTAMP
    with wire(strict) as wc:
        assert _leo(wc, topic) == 1
        p9 = produce_raw(wc, topic, make_batch([(b"k", b"v", now, []),
                                               (b"k", b"v", now + 86_400_000, [])]))
        assert p9.error_code == ErrorCode.invalid_timestamp
        assert [e.batch_index for e in p9.record_errors] == [1]


def _vm_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def test_compression_bomb_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """R-NF-1 (issue 8): the 48 KB zstd batch that inflates to 1.5 GiB (it stalled every
    client for 7 s at 3 GB RSS on a compacted topic) is refused with INVALID_RECORD, to a
    compacted and to a plain topic, promptly, with the broker's peak RSS (VmHWM) growing by
    less than 200 MB; a witness and a real producer carry on; no traceback."""
    with BrokerProcess(tmp_path / "bomb", {"num.partitions": "1"}) as b:
        assert b.proc is not None
        w = Witness(b)
        bomb = BOMB.read_bytes()
        with wire(b) as wc:
            plain = new_topic(wc, "bomb")
            compacted = f"bomb-compacted-{uuid.uuid4().hex[:8]}"
            res = create_topics(wc, [(compacted, {"cleanup.policy": "compact"})])
            assert res[compacted].error_code == ErrorCode.none
            hwm_before = _vm_kb(b.proc.pid, "VmHWM")
            for topic in (compacted, plain, compacted):
                start = time.monotonic()
                p = produce_raw(wc, topic, bomb)
                took = time.monotonic() - start
                assert p.error_code == ErrorCode.invalid_record, p.error_message
                assert "inflate past" in (p.error_message or "")
                assert took < 3, took
                assert _leo(wc, topic) == 0
            grown_mb = (_vm_kb(b.proc.pid, "VmHWM") - hwm_before) / 1024
            assert grown_mb < 200, grown_mb
        w.check()
        from tests.clients import Rec, produce
        assert produce("confluent", b.bootstrap, plain, [Rec(0, b"k", b"v")]) == [
            (0, 0)]
        assert not [line for line in b.stderr_lines if "Traceback" in line]


def test_a_bomb_already_on_disk_is_served_and_compacted_in_bounded_memory(
        tmp_path: Path) -> None:
    """R-LOG-6, R-NF-1 (issue 8): a zstd bomb stored before records were validated (written
    here straight into a segment file while the broker is down) neither breaks ListOffsets
    by timestamp (answered at the bomb's batch, not by inflating 1.5 GiB) nor the log
    cleaner of its compacted topic (which keeps the batch and logs it, every pass, instead
    of failing with MemoryError); the broker's VmHWM stays bounded, no traceback."""
    old_ts, bomb_ts = 1_600_000_000_000, 1_700_000_000_000
    data = tmp_path / "ondisk"
    overrides = {"num.partitions": "1", "log.retention.check.interval.ms": "200"}
    with BrokerProcess(data, overrides) as b, wire(b) as wc:
        topic = f"ondisk-{uuid.uuid4().hex[:8]}"
        res = create_topics(wc, [(topic, {"cleanup.policy": "compact",
                                          "segment.bytes": "2000"})])
        assert res[topic].error_code == ErrorCode.none
        for i in range(10):
            p = produce_raw(wc, topic, make_batch([(b"k%d" % (i % 3), b"old", old_ts + i, [])]))
            assert p.error_code == ErrorCode.none
    seg = max((data / f"{topic}-0").glob("*.log"))
    bomb = bytearray(BOMB.read_bytes())
    struct.pack_into(">q", bomb, 0, 10)  # its base offset: the log end offset
    with seg.open("ab") as f:
        f.write(bomb)
    with BrokerProcess(data, overrides) as b, wire(b) as wc:
        assert b.proc is not None
        assert _leo(wc, topic) == 11
        hwm_before = _vm_kb(b.proc.pid, "VmHWM")
        now = int(time.time() * 1000)
        for i in range(40):  # roll past the bomb: it lands in a closed, cleanable segment
            p = produce_raw(wc, topic, make_batch([(b"k%d" % (i % 3), b"new" * 20, now, [])]))
            assert p.error_code == ErrorCode.none
        code, offset = list_offset(wc, topic, (old_ts + bomb_ts) // 2)
        assert (code, offset) == (ErrorCode.none, 10)
        wait_until(lambda: any("unreadable batch" in line for line in b.stderr_lines),
                   timeout_s=30)
        assert list_offset(wc, topic, (old_ts + bomb_ts) // 2) == (ErrorCode.none, 10)
        grown_mb = (_vm_kb(b.proc.pid, "VmHWM") - hwm_before) / 1024
        assert grown_mb < 200, grown_mb
        assert not [line for line in b.stderr_lines if "Traceback" in line or "MemoryError"
                    in line]
