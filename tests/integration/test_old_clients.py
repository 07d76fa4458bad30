"""Old clients and tools, over TCP against a broker process (issue 11 items 1, 2, 4, 7;
R-PROTO-1, R-PROTO-3, R-PROTO-5, R-LOG-3, R-NF-1).

- Debian's kcat (librdkafka 2.0.2) compresses with gzip, snappy and lz4 only if the broker
  advertises Produce v0 (librdkafka's check before the KAFKA-18659 fix): the stored batches
  carry the codec. Produce v0-v2 stay refused, as Kafka 4.0 refuses them.
- ListOffsets v0 (sarama, hence Burrow) is answered as Kafka 3.9 answers it.
- A batch with bad records is refused record by record: record_errors with Kafka's
  messages, so librdkafka fails only the bad records with INVALID_RECORD and the rest with
  "different record" (librdkafka's test 0011).
- A fetch parked on a topic that is then deleted is answered UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

import collections
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from headrace.protocol.legacy import (
    ListOffsetsPartitionResponseV0,
    decode_list_offsets_v0_response,
)
from headrace.protocol.records import HEADER, HEADER_SIZE, LOG_OVERHEAD
from tests.batches import Record, make_batch
from tests.brokerproc import BrokerProcess, wait_until
from tests.conftest import require_tool
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.timeout(180)

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.fixture(scope="module")
def old(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data = tmp_path_factory.mktemp("old-clients")
    with InProcessBroker(data, {"num.partitions": "1"}) as b:
        yield b
        text = "".join(b.stderr_lines)
        assert "Traceback" not in text, text[-3000:]


def wire(b: BrokerProcess) -> WireClient:
    return WireClient.to(b.bootstrap, timeout_s=15)


def create_topic(wc: WireClient, configs: dict[str, str] | None = None,
                 partitions: int = 1) -> str:
    name = f"old-{uuid.uuid4().hex[:10]}"
    resp = wc.request(19, 7, {
        "topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                    "assignments": [], "configs": [{"name": k, "value": v}
                                                   for k, v in (configs or {}).items()]}],
        "timeout": 10_000, "validate_only": False})
    assert resp.topics[0].error_code == ErrorCode.none, resp.topics[0].error_message
    return name


def api_ranges(wc: WireClient) -> dict[int, tuple[int, int]]:
    r = wc.request(18, 3, {"client_software_name": "old", "client_software_version": "1"})
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in r.api_keys}


def stored_batches(b: BrokerProcess, topic: str, partition: int = 0) -> list[tuple[int, ...]]:
    """The header fields of every batch in the partition's segment files, as stored."""
    out = []
    for seg in sorted((b.data_dir / f"{topic}-{partition}").glob("*.log")):
        data = seg.read_bytes()
        pos = 0
        while pos + HEADER_SIZE <= len(data):
            fields = HEADER.unpack_from(data, pos)
            out.append(fields)
            pos += LOG_OVERHEAD + fields[1]
    return out


def kcat(b: BrokerProcess, *args: str, stdin: bytes | None = None) -> str:
    r = subprocess.run([require_tool("kcat"), "-b", b.bootstrap, *args], input=stdin,
                       capture_output=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.decode()


# ------------------------------------------------------------------ item 1: Produce v0-v2


def test_produce_is_advertised_from_v0_as_kafka_4_does(old: BrokerProcess) -> None:
    with wire(old) as wc:
        ranges = api_ranges(wc)
    assert ranges[0] == (0, 12)
    assert ranges[2] == (0, 10)  # ListOffsets v0 served again (Kafka 3.9: 0-9)
    assert ranges[1][0] == 4 and ranges[3][0] == 0  # Fetch v4+, Metadata v0+


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_old_kcat_compresses(old: BrokerProcess, codec: str) -> None:
    """Debian's kcat -z CODEC: every stored batch carries the codec (before Produce v0 was
    advertised, librdkafka 2.0.2 logged "Broker does not support compression type" and
    stored gzip, snappy and lz4 batches uncompressed), and kcat reads the lines back."""
    require_tool("kcat")
    with wire(old) as wc:
        topic = create_topic(wc)
    lines = [f"{codec}-line-{i}-" + "x" * 50 for i in range(20)]
    kcat(old, "-P", "-t", topic, "-p", "0", "-z", codec,
         stdin=("\n".join(lines) + "\n").encode())
    batches = stored_batches(old, topic)
    assert batches, "nothing stored"
    assert sum(f[12] for f in batches) == len(lines)  # records_count
    assert {f[5] & 0x07 for f in batches} == {CODECS[codec]}, [f[5] for f in batches]
    out = kcat(old, "-C", "-t", topic, "-o", "beginning", "-e", "-q")
    assert out.splitlines() == lines


def _produce_frame(version: int, topic: str, correlation_id: int) -> bytes:
    """A Produce v0-v2 request as librdkafka would send it (magic 1 message set)."""
    client = b"old"
    name = topic.encode()
    message_set = b"\0" * 34  # its content does not matter: the version is refused first
    body = (struct.pack(">hi", 1, 5000) + struct.pack(">i", 1) + struct.pack(">h", len(name))
            + name + struct.pack(">i", 1) + struct.pack(">ii", 0, len(message_set))
            + message_set)
    payload = (struct.pack(">hhih", 0, version, correlation_id, len(client)) + client + body)
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.parametrize("version", [0, 1, 2])
def test_produce_v0_to_v2_are_refused_like_kafka_4(old: BrokerProcess, version: int) -> None:
    """Kafka 4.0 advertises Produce v0-v2 and refuses them (UnsupportedVersionException
    while parsing the header: the connection is closed); nothing is stored, and the broker
    goes on serving."""
    with wire(old) as wc:
        topic = create_topic(wc)
    with wire(old) as wc:
        wc.send_raw(_produce_frame(version, topic, 5))
        assert wc.is_closed_by_peer(10.0)
    assert stored_batches(old, topic) == []
    wait_until(lambda: any(f"API key 0 version {version}" in line
                           and "UNSUPPORTED_VERSION" in line for line in old.stderr_lines),
               timeout_s=10, what="the broker's log line naming the refused version")
    with wire(old) as wc:
        assert api_ranges(wc)[0] == (0, 12)


# ------------------------------------------------------------------ item 2: ListOffsets v0


def list_offsets_v0(wc: WireClient, topics: list[tuple[str, list[tuple[int, int, int]]]],
                    replica_id: int = -1) -> dict[tuple[str, int], tuple[int, tuple[int, ...]]]:
    """Send a ListOffsets v0 request, bytes written as Kafka 3.9's schema lays them out:
    {(topic, partition): (error code, offsets)}."""
    body = struct.pack(">ii", replica_id, len(topics))
    for name, parts in topics:
        raw = name.encode()
        body += struct.pack(">h", len(raw)) + raw + struct.pack(">i", len(parts))
        for index, ts, max_num in parts:
            body += struct.pack(">iqi", index, ts, max_num)
    wc.correlation_id += 1
    cid = wc.correlation_id
    payload = struct.pack(">hhih", 2, 0, cid, 6) + b"sarama" + body
    wc.send_raw(struct.pack(">i", len(payload)) + payload)
    frame = wc.recv_frame()
    assert struct.unpack_from(">i", frame)[0] == cid
    out: dict[tuple[str, int], tuple[int, tuple[int, ...]]] = {}
    for name, answered in decode_list_offsets_v0_response(frame[4:]):
        for p in answered:
            assert isinstance(p, ListOffsetsPartitionResponseV0)
            out[(name, p.partition_index)] = (p.error_code, p.old_style_offsets)
    return out


def produce_v9(wc: WireClient, topic: str, batch: bytes, partition: int = 0) -> Any:
    resp = wc.request(0, 9, {"transactional_id": None, "acks": 1, "timeout": 10_000,
                             "topic_data": [{"name": topic, "partition_data": [
                                 {"index": partition, "records": batch}]}]})
    (p,) = resp.responses[0].partition_responses
    return p


def test_list_offsets_v0_answers_as_kafka_3_9(old: BrokerProcess) -> None:
    now = int(time.time() * 1000)
    with wire(old) as wc:
        topic = create_topic(wc)
        empty = create_topic(wc)
        for n in (3, 2):
            p = produce_v9(wc, topic, make_batch([(b"k", b"v", now, [])] * n))
            assert p.error_code == ErrorCode.none
        got = list_offsets_v0(wc, [(topic, [(0, -1, 1)]), (empty, [(0, -1, 1), (0, -2, 1)]),
                                   ("no-such-topic", [(0, -1, 1)])])
        assert got[(topic, 0)] == (0, (5,))
        assert got[(empty, 0)] == (0, (0,))  # an empty log: its one segment's base offset
        assert got[("no-such-topic", 0)] == (ErrorCode.unknown_topic_or_partition, ())
        many = list_offsets_v0(wc, [(topic, [(0, -1, 10)])])
        assert many[(topic, 0)] == (0, (5, 0))  # log end, then the segment's base offset
        assert list_offsets_v0(wc, [(topic, [(0, -2, 10)])])[(topic, 0)] == (0, (0,))
        # by time: segments modified at or before the time; far future: all of them
        assert list_offsets_v0(wc, [(topic, [(0, 2**62, 10)])])[(topic, 0)] == (0, (5, 0))
        assert list_offsets_v0(wc, [(topic, [(0, 0, 10)])])[(topic, 0)] == (0, ())
        assert list_offsets_v0(wc, [(topic, [(0, -3, 1)])])[(topic, 0)] == (
            ErrorCode.unsupported_version, ())
        assert list_offsets_v0(wc, [(topic, [(7, -1, 1)])])[(topic, 7)] == (
            ErrorCode.unknown_topic_or_partition, ())
        # the same connection goes on with a kio-decoded version
        r = wc.request(2, 1, {"replica_id": -1, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
        assert int(r.topics[0].partitions[0].offset) == 5


def test_list_offsets_v0_huge_claims_close_the_connection(old: BrokerProcess) -> None:
    for body in (struct.pack(">ii", -1, 2**31 - 1),
                 struct.pack(">iih", -1, 1, 1) + b"t" + struct.pack(">i", 2**31 - 1)):
        payload = struct.pack(">hhih", 2, 0, 1, -1) + body
        with wire(old) as wc:
            wc.send_raw(struct.pack(">i", len(payload)) + payload)
            assert wc.is_closed_by_peer(10.0)
    with wire(old) as wc:
        assert api_ranges(wc)[2] == (0, 10)


# ------------------------------------------------------------------ item 4: record_errors


def test_bad_records_are_reported_record_by_record(old: BrokerProcess) -> None:
    """LogValidator's words: each keyless record of a compacted topic is a RecordError
    naming the partition; the error message lists the first three; nothing is stored."""
    now = int(time.time() * 1000)
    with wire(old) as wc:
        topic = create_topic(wc, {"cleanup.policy": "compact"})
        records: list[Record] = [(None if i in (0, 3, 4, 6) else b"k%d" % i, b"v", now, [])
                                 for i in range(8)]
        p = produce_v9(wc, topic, make_batch(records))
    assert p.error_code == ErrorCode.invalid_record
    keyless = f"Compacted topic cannot accept message without key in topic partition {topic}-0"
    assert [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] == [
        (i, keyless) for i in (0, 3, 4, 6)]
    assert p.error_message == (
        "One or more records have been rejected due to 4 record errors in total, and only "
        "showing the first three errors at most: ["
        + ", ".join(f"RecordError(batchIndex={i}, message='{keyless}')" for i in (0, 3, 4))
        + "]")
    assert stored_batches(old, topic) == []
    with wire(old) as wc:  # a timestamp far in the future: INVALID_TIMESTAMP, Kafka's words
        t2 = create_topic(wc, {"message.timestamp.after.max.ms": "3600000"})
        p = produce_v9(wc, t2, make_batch([(b"k", b"v", now, []),
                                           (b"k", b"v", now + 86_400_000, [])]))
    assert p.error_code == ErrorCode.invalid_timestamp
    assert p.error_message == "One or more records have been rejected due to invalid timestamp"
    ((index, message),) = [(e.batch_index, e.batch_index_error_message) for e in p.record_errors]
    assert index == 1
    assert message.startswith(f"Timestamp {now + 86_400_000} of message with offset 1 is out "
                              "of range. The timestamp should be within [")


@pytest.mark.parametrize("one_per_batch", [False, True], ids=["one-batch", "batch-size-1"])
def test_librdkafka_0011_record_fail(old: BrokerProcess, one_per_batch: bool) -> None:
    """librdkafka's test 0011 (test_message_single_partition_record_fail): 100 messages to a
    topic made compacted with IncrementalAlterConfigs APPEND, every tenth without a key. In
    one batch: 10 INVALID_RECORD and 90 _INVALID_DIFFERENT_RECORD; one message per batch:
    10 INVALID_RECORD and 90 delivered."""
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    with wire(old) as wc:
        topic = create_topic(wc)
    admin = AdminClient({"bootstrap.servers": old.bootstrap})
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(
        "cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(timeout=30)
    # all 100 in one batch: a linger longer than any produce loop on a loaded machine (with
    # 200 ms a slow loop split them, 22 keyed ones then delivered in a batch of their own);
    # flush() sends at once, linger or not
    conf = {"bootstrap.servers": old.bootstrap, "linger.ms": 30_000}
    if one_per_batch:
        conf["batch.size"] = 1
    producer = Producer(conf)
    outcome: collections.Counter[str] = collections.Counter()

    def report(err: Any, msg: Any) -> None:
        outcome["ok" if err is None else {
            KafkaError.INVALID_RECORD: "invalid",
            KafkaError._INVALID_DIFFERENT_RECORD: "different"}.get(err.code(), err.name())] += 1

    for i in range(100):
        producer.produce(topic, value=b"test message #%d" % i,
                         key=None if i % 10 == 0 else b"key-%d" % i, partition=0,
                         on_delivery=report)
    assert producer.flush(60) == 0
    if one_per_batch:
        assert outcome == {"invalid": 10, "ok": 90}
    else:
        assert outcome == {"invalid": 10, "different": 90}


# ------------------------------------------------------------------ item 7: parked fetch


@pytest.mark.parametrize("version", [12, 16])
def test_fetch_parked_on_a_deleted_topic_is_unknown_topic(old: BrokerProcess,
                                                          version: int) -> None:
    with wire(old) as admin, wire(old) as fetcher:
        topic = create_topic(admin)
        md = admin.request(3, 12, {"topics": [{"name": topic, "topic_id": None}],
                                   "allow_auto_topic_creation": False,
                                   "include_topic_authorized_operations": False})
        topic_id = md.topics[0].topic_id
        fetcher.send_raw(fetcher.encode(1, version, {
            "replica_id": -1, "max_wait": 30_000, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": topic, "topic_id": topic_id, "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                 "last_fetched_epoch": -1, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 20}]}]}))
        for _ in range(2):  # round trips on another connection: the fetch is parked by now
            api_ranges(admin)
        started = time.monotonic()
        r = admin.request(20, 6, {"topics": [{"name": topic, "topic_id": None}],
                                  "timeout": 10_000})
        assert r.responses[0].error_code == ErrorCode.none
        resp = fetcher.read_response(1, version)
        assert time.monotonic() - started < 15  # woken by the delete, not by max_wait
    (t,) = resp.responses
    (p,) = t.partitions
    assert p.error_code == ErrorCode.unknown_topic_or_partition


# ------------------------------------------------------------------ item 7: name collisions


def test_topic_names_colliding_on_dot_and_underscore_are_refused(old: BrokerProcess) -> None:
    """Kafka's ``Topic.hasCollision``: 'a.b_c' then 'a_b.c' (equal once '.' and '_' are
    equated, as metric names equate them) is INVALID_TOPIC_EXCEPTION, naming the existing
    topic; within one request the second of two colliding names is refused; a name that
    merely shares a prefix is fine. confluent-kafka and kafka-python."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic
    from kafka.errors import InvalidTopicError

    tag = uuid.uuid4().hex[:8]
    first, clash = f"col{tag}.b_c", f"col{tag}_b.c"
    admin = AdminClient({"bootstrap.servers": old.bootstrap})
    admin.create_topics([NewTopic(first, 1, 1)])[first].result(30)
    with pytest.raises(KafkaException) as e:
        admin.create_topics([NewTopic(clash, 1, 1)])[clash].result(30)
    err = e.value.args[0]
    assert err.code() == KafkaError.TOPIC_EXCEPTION, err
    assert first in err.str(), err.str()

    kp = KafkaAdminClient(bootstrap_servers=old.bootstrap, request_timeout_ms=30_000)
    try:
        with pytest.raises(InvalidTopicError):
            kp.create_topics([KpNewTopic(clash, 1, 1)])
        # two colliding names in one request: the first is created, the second refused
        pair = (f"pair{tag}.x", f"pair{tag}_x")
        futures = admin.create_topics([NewTopic(n, 1, 1) for n in pair])
        futures[pair[0]].result(30)
        with pytest.raises(KafkaException) as e2:
            futures[pair[1]].result(30)
        assert e2.value.args[0].code() == KafkaError.TOPIC_EXCEPTION
        fine = f"col{tag}.b_cd"  # no collision: differs in more than '.'/'_'
        admin.create_topics([NewTopic(fine, 1, 1)])[fine].result(30)
        names = set(kp.list_topics())
        assert {first, pair[0], fine} <= names
        assert clash not in names and pair[1] not in names
    finally:
        kp.close()
