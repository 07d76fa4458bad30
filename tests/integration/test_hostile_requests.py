"""Hostile requests cannot end the broker; every handler answers what it can decode
(issue 8 items 1, 8 (fetch.max.bytes) and 11; R-NF-1, R-PROTO-1, R-PROTO-4).

Each case runs against ``headrace broker`` in a child process over real TCP. A *witness*
connection opened before the bad input must still answer afterwards, the process must be
alive, its log must hold no traceback, and confluent-kafka must still produce and consume.
"""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from headrace.broker.handlers import HANDLERS
from headrace.protocol import legacy
from tests.batches import make_batch
from tests.brokerproc import BrokerProcess
from tests.clients import Rec, consume, create_topic, produce
from tests.fuzz import claim_variants, encode_request, minimal
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.timeout(180)

FETCH_MAX_BYTES = 1 << 20


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path_factory.mktemp("hostile"),
                       {"auto.create.topics.enable": "false", "num.partitions": "1",
                        "fetch.max.bytes": str(FETCH_MAX_BYTES),
                        "message.max.bytes": str(4 << 20)}) as b:
        yield b


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def closed_after(bootstrap: str, frame: bytes, timeout_s: float = 10.0) -> bool:
    """Send ``frame`` (size prefix included) on a fresh connection: True if the broker
    closed it without answering, False if an answer came."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(frame)
        try:
            return s.recv(4) == b""
        except ConnectionResetError:
            return True


def metadata(wc: WireClient) -> Any:
    return wc.request(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                              "include_topic_authorized_operations": False})


def _is_bug(log_line: str) -> bool:
    """A traceback, or an ERROR line (the server logs a handler's exception as one ERROR
    line, R-NF-1): what hostile input must never cause."""
    return "Traceback" in log_line or "level=ERROR" in log_line or "level=CRITICAL" in log_line


def assert_healthy(broker: BrokerProcess, witness: WireClient | None = None) -> None:
    assert broker.proc is not None and broker.proc.poll() is None, "broker died:\n" + "".join(
        broker.stderr_lines[-40:])
    if witness is not None:
        metadata(witness)
    with WireClient.to(broker.bootstrap) as fresh:
        metadata(fresh)
    tracebacks = [line for line in broker.stderr_lines if _is_bug(line)]
    assert not tracebacks, "".join(broker.stderr_lines[-60:])


def real_client_works(broker: BrokerProcess, topic: str) -> None:
    create_topic("confluent", broker.bootstrap, topic, 1)
    produce("confluent", broker.bootstrap, topic, [Rec(0, b"k", b"alive")])
    assert [r.value for r in consume("confluent", broker.bootstrap, topic, [0], 1)] == [b"alive"]


# ------------------------------------------------------------------ item 1: claimed lengths


def test_22_byte_metadata_frame_closes_only_its_connection(broker: BrokerProcess) -> None:
    """The issue's 22-byte Metadata v12 frame (topics claims 2^32-1 elements) aborted the
    process (kio's native reader allocated ~34 GB); now that one connection is closed and
    the broker goes on serving (issue 8 item 1; R-NF-1)."""
    frame = framed(struct.pack(">hhih", 3, 12, 1, -1) + b"\x00"
                   + b"\xff\xff\xff\xff\x0f" + b"\x01\x00")
    assert len(frame) == 22
    with WireClient.to(broker.bootstrap) as witness:
        metadata(witness)
        for _ in range(3):
            assert closed_after(broker.bootstrap, frame)
        assert_healthy(broker, witness)
    real_client_works(broker, "after-22-bytes")


def _served_versions() -> list[tuple[int, int]]:
    """(key, lowest and highest version) of every API decoded through kio's schemas (the
    hand-coded ListOffsets v0 and the advertised-only Produce v0-v2 have tests of their
    own: tests/unit/test_list_offsets_v0.py, tests/integration/test_old_clients.py)."""
    out = []
    for key, h in sorted(HANDLERS.items()):
        lo = h.min_version
        while (key, lo) in legacy.HAND_CODED or legacy.is_refused(key, lo):
            lo += 1
        for v in sorted({lo, h.max_version}):
            out.append((key, v))
    return out


def test_huge_claims_at_every_array_of_every_request_type(broker: BrokerProcess) -> None:
    """For every API the broker serves (lowest and highest version: legacy int32 counts and
    compact varint counts), each array count of a request, top-level or nested, replaced by
    2^32-2 (2^31-1 legacy) and by 2^20: the connection is closed, nothing else happens
    (issue 8 item 1; R-NF-1). Before the prescan the first of these aborted the process."""
    cases = 0
    arrays: set[str] = set()
    with WireClient.to(broker.bootstrap) as witness:
        for key, version in _served_versions():
            for path, claim, frame in claim_variants(key, version, (2**32 - 2, 2**20)):
                assert closed_after(broker.bootstrap, framed(frame)), (key, version, path, claim)
                arrays.add(f"{key}:{path}")
                cases += 1
        assert_healthy(broker, witness)
    assert cases > 100
    assert {"3:topics", "1:topics.partitions", "0:topic_data.partition_data"} <= arrays
    real_client_works(broker, "after-claims")


# ------------------------------------------------------------------ item 11: handlers answer


def _fetch_zero_id(version: int) -> dict[str, Any]:
    return {"max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic_id": uuid.UUID(int=0), "partitions": [
                {"partition": p, "current_leader_epoch": -1, "fetch_offset": 0,
                 "last_fetched_epoch": -1, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 20} for p in (0, 1)]}]}


@pytest.mark.parametrize("version", [13, 14, 15, 16])
def test_fetch_naming_the_all_zero_topic_id(broker: BrokerProcess, version: int) -> None:
    """Fetch v13+ naming the all-zero topic id raised AttributeError (a traceback and a
    dropped connection per request); Kafka answers UNKNOWN_TOPIC_ID per partition, and the
    connection stays usable (issue 8 item 11; R-PROTO-4)."""
    with WireClient.to(broker.bootstrap) as wc:
        for _ in range(2):
            resp = wc.request(1, version, _fetch_zero_id(version))
            assert resp.error_code == ErrorCode.none
            (t,) = resp.responses
            assert t.topic_id is None  # all-zero on the wire
            assert [(p.partition_index, p.error_code) for p in t.partitions] == [
                (0, ErrorCode.unknown_topic_id), (1, ErrorCode.unknown_topic_id)]
        metadata(wc)
    assert_healthy(broker)


def test_partition_outside_the_topic_is_unknown(broker: BrokerProcess) -> None:
    """Fetch and ListOffsets naming partition -1 or 7 of a one-partition topic answer
    UNKNOWN_TOPIC_OR_PARTITION, as Kafka does (they answered NOT_LEADER_OR_FOLLOWER, which
    sends a client to refresh metadata for ever); the other partition is served
    (R-PROTO-4, R-PROTO-5)."""
    with WireClient.to(broker.bootstrap) as wc:
        create_topic("confluent", broker.bootstrap, "one-part", 1)
        resp = wc.request(1, 12, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": "one-part", "partitions": [
                {"partition": p, "current_leader_epoch": -1, "fetch_offset": 0,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}
                for p in (-1, 0, 7)]}]})
        codes = [(p.partition_index, p.error_code) for p in resp.responses[0].partitions]
        assert codes == [(-1, ErrorCode.unknown_topic_or_partition), (0, ErrorCode.none),
                         (7, ErrorCode.unknown_topic_or_partition)]
        resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": "one-part", "partitions": [
                {"partition_index": p, "current_leader_epoch": -1, "timestamp": -1}
                for p in (-1, 0, 7)]}]})
        codes = [(p.partition_index, p.error_code) for p in resp.topics[0].partitions]
        assert codes == [(-1, ErrorCode.unknown_topic_or_partition), (0, ErrorCode.none),
                         (7, ErrorCode.unknown_topic_or_partition)]
    assert_healthy(broker)


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_v10_v11_null_name_or_topic_id_is_invalid_request(
        broker: BrokerProcess, version: int) -> None:
    """Metadata v10/v11 may carry a null topic name or a topic id on the wire, but their
    responses have no null names: the handler raised TypeError while encoding (found by
    the fuzzer). Kafka answers INVALID_REQUEST for every requested topic (a null name as
    ""), and the connection stays usable (issue 8 item 11; R-PROTO-1)."""
    with WireClient.to(broker.bootstrap) as wc:
        some_id = uuid.uuid4()
        resp = wc.request(3, version, {
            "topics": [{"name": None, "topic_id": None},
                       {"name": "named", "topic_id": some_id}],
            "allow_auto_topic_creation": False, "include_cluster_authorized_operations": False,
            "include_topic_authorized_operations": False})
        assert [(t.name, t.error_code) for t in resp.topics] == [
            ("", ErrorCode.invalid_request), ("named", ErrorCode.invalid_request)]
        assert resp.topics[1].topic_id == some_id
        resp = wc.request(3, version, {"topics": [{"name": "plain", "topic_id": None}],
                                       "allow_auto_topic_creation": False,
                                       "include_cluster_authorized_operations": False,
                                       "include_topic_authorized_operations": False})
        assert resp.topics[0].error_code == ErrorCode.unknown_topic_or_partition
    assert_healthy(broker)


def _null_array_frame(api_key: int, version: int, field: str, cid: int) -> bytes:
    """A minimal request whose top-level array ``field`` is sent as null."""
    from tests.fuzz import array_count_positions, header_size

    cls = load_request_schema(api_key, version)
    frame = encode_request(api_key, version, minimal(cls, 0), cid)
    for path, pos, width in array_count_positions(cls, frame, header_size(frame)):
        if path == field:
            null = b"\x00" if cls.__flexible__ else struct.pack(">i", -1)
            return frame[:pos] + null + frame[pos + width:]
    raise AssertionError(f"no array {field} in API {api_key} v{version}")


@pytest.mark.parametrize(("api_key", "version", "field"), [
    (8, 2, "topics"), (8, 8, "topics"), (8, 9, "topics"),       # OffsetCommit
    (9, 1, "topics"), (9, 8, "groups"),                          # OffsetFetch
    (2, 7, "topics"), (2, 1, "topics"),                          # ListOffsets
    (15, 5, "groups"), (42, 2, "groups_names"), (32, 4, "resources"),
    (11, 9, "protocols"), (14, 5, "assignments"), (47, 0, "topics"),
    (1, 12, "topics"), (1, 16, "forgotten_topics_data"),
])
def test_null_for_a_non_nullable_array_closes_the_connection(
        broker: BrokerProcess, api_key: int, version: int, field: str) -> None:
    """A null where the schema has no null raised TypeError in OffsetCommit and OffsetFetch
    handlers (a traceback per request). Kafka cannot parse such a request either (its
    generated readers throw "non-nullable field X was serialized as null") and closes the
    connection: the decoder now refuses it the same way, before any handler (issue 8 item
    11; R-NF-1)."""
    frame = _null_array_frame(api_key, version, field, 5)
    with WireClient.to(broker.bootstrap) as witness:
        assert closed_after(broker.bootstrap, framed(frame))
        assert_healthy(broker, witness)


def test_nullable_arrays_sent_as_null_are_answered(broker: BrokerProcess) -> None:
    """Where Kafka's schema allows null, null is a question with an answer: Metadata topics
    null (every topic), OffsetFetch v2-v7 topics null and v8+ groups[].topics null (every
    committed partition), DescribeConfigs configuration_keys null (every config), and
    ConsumerGroupHeartbeat's unchanged-subscription nulls (R-PROTO-1, R-GRP-6). This guards
    the length prescan against refusing a null the schema allows (it fails if the prescan
    treats these arrays as non-nullable)."""
    with WireClient.to(broker.bootstrap) as wc:
        assert metadata(wc).topics is not None
        for version in (2, 7):
            resp = wc.request(9, version, {"group_id": "g-null", "topics": None,
                                           "require_stable": False})
            assert resp.error_code in (ErrorCode.none, ErrorCode.coordinator_not_available,
                                       ErrorCode.coordinator_load_in_progress)
        resp = wc.request(9, 9, {"groups": [{"group_id": "g-null", "member_id": None,
                                             "member_epoch": -1, "topics": None}],
                                 "require_stable": False})
        (g,) = resp.groups
        assert g.group_id == "g-null"
        create = wc.request(19, 7, {"topics": [{"name": "cfg-null", "num_partitions": 1,
                                                "replication_factor": 1, "assignments": [],
                                                "configs": []}],
                                    "timeout": 10_000, "validate_only": False})
        assert create.topics[0].error_code in (ErrorCode.none, ErrorCode.topic_already_exists)
        resp = wc.request(32, 4, {"resources": [{"resource_type": 2, "resource_name": "cfg-null",
                                                 "configuration_keys": None}],
                                  "include_synonyms": False, "include_documentation": False})
        (r,) = resp.results
        assert r.error_code == ErrorCode.none and len(r.configs) > 10
        resp = wc.request(68, 0, {"group_id": "g-848-null", "member_id": str(uuid.uuid4()),
                                  "member_epoch": 0, "instance_id": None, "rack_id": None,
                                  "rebalance_timeout": 30000, "subscribed_topic_names": ["x"],
                                  "server_assignor": None, "topic_partitions": []})
        member_id, epoch = resp.member_id, resp.member_epoch
        if resp.error_code == ErrorCode.none:
            resp = wc.request(68, 0, {"group_id": "g-848-null", "member_id": member_id,
                                      "member_epoch": epoch, "instance_id": None,
                                      "rack_id": None, "rebalance_timeout": -1,
                                      "subscribed_topic_names": None, "server_assignor": None,
                                      "topic_partitions": None})
        assert resp.error_code in (ErrorCode.none, ErrorCode.coordinator_not_available,
                                   ErrorCode.coordinator_load_in_progress)
        metadata(wc)
    assert_healthy(broker)


# ------------------------------------------------------------------ item 8: fetch.max.bytes


def _produce(wc: WireClient, topic: str, batch: bytes) -> None:
    resp = wc.request(0, 9, {"transactional_id": None, "acks": -1, "timeout": 10_000,
                             "topic_data": [{"name": topic, "partition_data": [
                                 {"index": 0, "records": batch}]}]})
    assert resp.responses[0].partition_responses[0].error_code == ErrorCode.none


def _fetch_size(wc: WireClient, topic: str, offset: int) -> tuple[int, int]:
    """(records bytes, whole response frame bytes) of a Fetch v11 asking for 2 GiB."""
    wc.send_raw(wc.encode(1, 11, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 2**31 - 1,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
             "log_start_offset": -1, "partition_max_bytes": 2**31 - 1}]}]}))
    frame = wc.recv_frame()
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    cls = load_response_schema(1, 11)
    _, n = entity_reader(cls.__header_schema__)(frame, 0)
    body, _ = entity_reader(cls)(frame, n)
    (p,) = body.responses[0].partitions
    assert p.error_code == ErrorCode.none
    return len(p.records or b""), len(frame)


def test_fetch_response_capped_at_fetch_max_bytes(broker: BrokerProcess) -> None:
    """A Fetch asking for max_bytes 2 GiB (and partition_max_bytes 2 GiB) over a 3 MiB
    backlog gets at most the broker's fetch.max.bytes (1 MiB here), as Kafka caps the
    request's max_bytes at fetch.max.bytes; it returned the whole backlog before (a 404 MB
    response in the issue). The first batch still goes whole when it alone is larger
    (KIP-74) (issue 8 item 8; R-PROTO-4)."""
    value = b"v" * (60 << 10)
    with WireClient.to(broker.bootstrap) as wc:
        create_topic("confluent", broker.bootstrap, "capped", 1)
        batch_size = len(make_batch([(None, value, 1_700_000_000_000, [])]))
        for _ in range(52):  # ~3 MiB
            _produce(wc, "capped", make_batch([(None, value, 1_700_000_000_000, [])]))
        records, frame = _fetch_size(wc, "capped", 0)
        assert FETCH_MAX_BYTES - batch_size < records <= FETCH_MAX_BYTES, records
        assert frame < FETCH_MAX_BYTES + 4096

        create_topic("confluent", broker.bootstrap, "capped-big", 1)
        big = make_batch([(None, b"b" * (3 << 19), 1_700_000_000_000, [])])  # 1.5 MiB
        _produce(wc, "capped-big", big)
        _produce(wc, "capped-big", big)
        records, _ = _fetch_size(wc, "capped-big", 0)
        assert records == len(big)  # exactly the first batch, whole
    assert_healthy(broker)
