"""Topic administration at scale, and all-or-nothing under limits and failures (issue 8
items 2, 9, 10 and 11; R-NF-1: no client can stall or break the broker, R-LOG-4: nothing
acknowledged is lost, R-REP-9: metadata survives restarts).

Real clients over real TCP: confluent-kafka and kafka-python admin clients, a confluent
producer, and hand-built frames (``tests/kafka_wire.py``) where the wire answer matters.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from headrace.metadata.store import BrokerInfo
from tests.brokerproc import BrokerProcess, wait_until
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.timeout(300)

LIMIT = 40


def no_traceback(b: BrokerProcess | InProcessBroker) -> None:
    log = "".join(b.stderr_lines)
    assert "Traceback" not in log, log[-4000:]


def create_req(name: str, partitions: int, **extra: Any) -> dict[str, Any]:
    return {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                        "assignments": [], "configs": []}],
            "timeout_ms": 120_000, "validate_only": False, **extra}


def metadata_v12(wc: WireClient, topic: str) -> Any:
    return wc.request(3, 12, {"topics": [{"name": topic, "topic_id": None}],
                              "allow_auto_topic_creation": False,
                              "include_topic_authorized_operations": False})


# ------------------------------------------------------------------ the event loop


def delivered_to(out: list[Any]) -> Any:
    return lambda err, msg: out.append(err)


@pytest.mark.slow
def test_clients_are_served_during_a_10000_partition_create(tmp_path: Path) -> None:
    """A 10,000-partition CreateTopics blocked every client for 6.4 s (issue 8 item 10):
    its directories and logs are now made in a worker thread and the metadata is one SQLite
    transaction, so Metadata round trips and confluent-kafka produces from other clients
    stay under 500 ms while it runs (R-NF-1)."""
    from confluent_kafka import Producer

    bound_s = 0.5
    with BrokerProcess(tmp_path, {"auto.create.topics.enable": "false"}) as b:
        with WireClient.to(b.bootstrap, timeout_s=60) as wc:
            assert wc.request(19, 5, create_req("ping", 1)).topics[0].error_code == 0
        producer = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "acks": "all"})
        producer.produce("ping", b"warm-up")
        assert producer.flush(30) == 0

        answer: dict[str, Any] = {}

        def big_create() -> None:
            with WireClient.to(b.bootstrap, timeout_s=240) as big:
                answer["sent"] = time.monotonic()
                answer["resp"] = big.request(19, 5, create_req("big", 10_000))
                answer["done"] = time.monotonic()

        creator = threading.Thread(target=big_create)
        probes: list[tuple[float, float, str]] = []  # (start, latency, kind)
        with WireClient.to(b.bootstrap, timeout_s=60) as wc:
            creator.start()
            wait_until(lambda: "sent" in answer, 10, what="the create to be sent")
            while creator.is_alive():
                t0 = time.monotonic()
                resp = metadata_v12(wc, "ping")
                assert resp.topics[0].error_code == 0
                probes.append((t0, time.monotonic() - t0, "metadata"))
                t0 = time.monotonic()
                delivered: list[Any] = []
                producer.produce("ping", b"during", on_delivery=delivered_to(delivered))
                producer.flush(30)
                assert delivered == [None]
                probes.append((t0, time.monotonic() - t0, "produce"))
            creator.join(240)
        producer.flush(10)
        resp = answer["resp"]
        assert resp.topics[0].error_code == 0, resp.topics[0].error_message
        assert resp.topics[0].num_partitions == 10_000
        during = [(lat, kind) for t0, lat, kind in probes
                  if answer["sent"] <= t0 <= answer["done"]]
        took = answer["done"] - answer["sent"]
        worst = max(during)
        print(f"\n10,000-partition create took {took:.2f} s; {len(during)} round trips "
              f"meanwhile, worst {worst[0] * 1000:.0f} ms ({worst[1]})")
        assert worst[0] < bound_s, f"a {worst[1]} round trip took {worst[0]:.3f} s"
        assert len(during) >= 4, f"too few round trips during the create ({took:.2f} s)"
        with WireClient.to(b.bootstrap, timeout_s=60) as wc:
            got = metadata_v12(wc, "big").topics[0]
            assert got.error_code == 0 and len(got.partitions) == 10_000
        no_traceback(b)


@pytest.mark.slow
def test_a_thousand_topics_are_created_in_bounded_time(tmp_path: Path) -> None:
    """Creating 1,000 topics took 74 s when every change rewrote and fsynced one JSON
    document (issue 8 item 10; 9.6-22 s on this test's machine, depending on its load).
    With one SQLite transaction per change it took 1.4-3.8 s; the bound is 8 s. Every
    topic survives a restart (R-REP-9)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    n = 1000
    with BrokerProcess(tmp_path, {"auto.create.topics.enable": "false"}) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        t0 = time.monotonic()
        for i in range(n):  # one request per topic, as a script creating topics does
            admin.create_topics([NewTopic(f"t-{i}", 1, 1)])[f"t-{i}"].result(30)
        took = time.monotonic() - t0
        print(f"\n{n} topics created one request each in {took:.2f} s")
        assert took < 8, f"{n} topics took {took:.1f} s"
        b.restart()
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        names = set(admin.list_topics(timeout=30).topics)
        assert {f"t-{i}" for i in range(n)} <= names
        no_traceback(b)


# ------------------------------------------------------------------ limits, atomically


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """In process: nothing here is killed or timed."""
    with InProcessBroker(tmp_path_factory.mktemp("limited"),
                         {"max.broker.partitions": str(LIMIT),
                          "auto.create.topics.enable": "false"}) as b:
        yield b


def topic_dirs(b: InProcessBroker, prefix: str) -> list[str]:
    return sorted(d.name for d in b.data_dir.iterdir() if d.name.startswith(prefix))


def test_partition_limit_confluent(limited: InProcessBroker) -> None:
    """max.broker.partitions (issue 8 item 9): CreateTopics whose topics together would
    pass it is refused whole, up front, with POLICY_VIOLATION (what Kafka answers an
    oversized operation: PolicyViolationException), validate_only too; nothing is created
    (no metadata, no directories). CreatePartitions past it likewise; within it works."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": limited.bootstrap})
    admin.create_topics([NewTopic("cf-base", 10, 1)])["cf-base"].result(30)
    for validate_only in (True, False):
        fs = admin.create_topics([NewTopic("cf-a", 10, 1), NewTopic("cf-b", 25, 1)],
                                 validate_only=validate_only)
        for name, f in fs.items():
            with pytest.raises(KafkaException) as info:
                f.result(30)
            err = info.value.args[0]
            assert err.code() == KafkaError.POLICY_VIOLATION, (name, err)
            assert "max.broker.partitions" in err.str()
    topics = admin.list_topics(timeout=30).topics
    assert "cf-a" not in topics and "cf-b" not in topics
    assert topic_dirs(limited, "cf-a-") == [] and topic_dirs(limited, "cf-b-") == []
    # the same two topics one at a time: each is its own result
    admin.create_topics([NewTopic("cf-a", 10, 1)])["cf-a"].result(30)
    with pytest.raises(KafkaException) as info:
        admin.create_partitions([NewPartitions("cf-base", 40)])["cf-base"].result(30)
    assert info.value.args[0].code() == KafkaError.POLICY_VIOLATION
    assert len(admin.list_topics("cf-base", timeout=30).topics["cf-base"].partitions) == 10
    admin.create_partitions([NewPartitions("cf-base", 12)])["cf-base"].result(30)
    assert len(topic_dirs(limited, "cf-base-")) == 12
    admin.delete_topics(["cf-a", "cf-base"])["cf-a"].result(30)
    wait_until(lambda: "cf-base" not in admin.list_topics(timeout=30).topics, 30,
               what="cf-base deleted")
    no_traceback(limited)


def test_partition_limit_kafka_python(limited: InProcessBroker) -> None:
    """The same refusal seen through kafka-python's admin client: PolicyViolationError, and
    no topic of the request exists afterwards (issue 8 item 9)."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import PolicyViolationError

    admin = KafkaAdminClient(bootstrap_servers=limited.bootstrap, request_timeout_ms=30000)
    try:
        with pytest.raises(PolicyViolationError):
            admin.create_topics({"kp-a": {"num_partitions": 5, "replication_factor": 1},
                                 "kp-b": {"num_partitions": LIMIT, "replication_factor": 1}})
        assert not {"kp-a", "kp-b"} & set(admin.list_topics())
        assert topic_dirs(limited, "kp-") == []
        admin.create_topics({"kp-a": {"num_partitions": 5, "replication_factor": 1}})
        with pytest.raises(PolicyViolationError):
            admin.create_partitions({"kp-a": LIMIT + 1})
        assert len(topic_dirs(limited, "kp-a-")) == 5
        admin.delete_topics(["kp-a"])
    finally:
        admin.close()
    no_traceback(limited)


# ------------------------------------------------------------------ null arrays


def _frame(api_key: int, version: int, body: bytes, cid: int = 7) -> bytes:
    client = b"null-test"
    header = struct.pack(">hhih", api_key, version, cid, len(client)) + client
    return struct.pack(">i", len(header) + len(body)) + header + body


def _string(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def _answer_or_closed(wc: WireClient, frame: bytes) -> bytes | None:
    wc.send_raw(frame)
    try:
        return wc.recv_frame()
    except (ConnectionError, OSError):
        return None


def test_null_arrays_in_create_requests(limited: InProcessBroker) -> None:
    """Null arrays in CreateTopics and CreatePartitions raised TypeError in the handlers
    (issue 8 item 11). A null where the schema allows one is answered (CreatePartitions'
    assignments: the broker assigns); a null where it does not is refused (an
    INVALID_REQUEST answer, or the connection closed as Kafka's parser does); the broker
    keeps serving and logs no traceback (R-NF-1)."""
    with WireClient.to(limited.bootstrap) as wc:
        assert wc.request(19, 4, create_req("nul", 1)).topics[0].error_code == 0
    # CreatePartitions v1: topics [{name, count, assignments: null}], timeout, validate_only
    body = (struct.pack(">i", 1) + _string("nul") + struct.pack(">i", 3)
            + struct.pack(">i", -1) + struct.pack(">i", 30000) + b"\x00")
    with WireClient.to(limited.bootstrap) as wc:
        answer = _answer_or_closed(wc, _frame(37, 1, body))
        assert answer is not None
        # response v1: correlation id, throttle, results [{name, error_code, message}]
        (cid, _throttle, count) = struct.unpack_from(">iii", answer, 0)
        assert (cid, count) == (7, 1)
        (name_len,) = struct.unpack_from(">h", answer, 12)
        (code,) = struct.unpack_from(">h", answer, 14 + name_len)
        assert code == 0
    assert len(topic_dirs(limited, "nul-")) == 3
    cases = {
        # CreateTopics v4 topics null
        "topics": (19, 4, struct.pack(">i", -1) + struct.pack(">i", 30000) + b"\x00"),
        # CreateTopics v4: assignments null, configs []
        "assignments": (19, 4, struct.pack(">i", 1) + _string("nul-x") + struct.pack(">ih", 1, 1)
                        + struct.pack(">i", -1) + struct.pack(">i", 0)
                        + struct.pack(">i", 30000) + b"\x00"),
        # CreateTopics v4: assignments [], configs null
        "configs": (19, 4, struct.pack(">i", 1) + _string("nul-y") + struct.pack(">ih", 1, 1)
                    + struct.pack(">i", 0) + struct.pack(">i", -1)
                    + struct.pack(">i", 30000) + b"\x00"),
        # CreatePartitions v1: assignments [{broker_ids: null}]
        "broker_ids": (37, 1, struct.pack(">i", 1) + _string("nul") + struct.pack(">i", 4)
                       + struct.pack(">i", 1) + struct.pack(">i", -1)
                       + struct.pack(">i", 30000) + b"\x00"),
    }
    for what, (api_key, version, body) in cases.items():
        with WireClient.to(limited.bootstrap) as wc:
            answer = _answer_or_closed(wc, _frame(api_key, version, body))
            if answer is not None and what != "topics":
                # first result's error code: after cid, throttle, count, name
                (name_len,) = struct.unpack_from(">h", answer, 12)
                (code,) = struct.unpack_from(">h", answer, 14 + name_len)
                assert code == ErrorCode.invalid_request, what
            elif answer is not None:
                assert struct.unpack_from(">iii", answer, 0)[2] == 0  # no results
    assert topic_dirs(limited, "nul-x") == [] and topic_dirs(limited, "nul-y") == []
    assert len(topic_dirs(limited, "nul-")) == 3
    with WireClient.to(limited.bootstrap) as wc:
        assert metadata_v12(wc, "nul").topics[0].error_code == 0
        wc.request(20, 4, {"topic_names": ["nul"], "timeout_ms": 30000})
    no_traceback(limited)


# ------------------------------------------------------------------ a failed create, cleared


def test_consumer_offsets_works_after_a_failed_create_is_cleared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A failed metadata save left ``__consumer_offsets`` existing with no partition open,
    and consumer groups broken until restart (issue 8 item 2). Now the failed create leaves
    nothing (FindCoordinator answers COORDINATOR_NOT_AVAILABLE, no directory is left), and
    once the disk has room the group service creates the topic through TopicAdmin and a
    confluent-kafka group consumes and commits (R-GRP-1, R-LOG-4)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from headrace.broker.embedded import EmbeddedBroker
    from headrace.metadata.store import LocalMetadataStore, MetadataWriteError

    def full(self: LocalMetadataStore, tx: object) -> None:
        raise MetadataWriteError("cannot write cluster metadata: database or disk is full")

    with EmbeddedBroker(tmp_path, config={"auto.create.topics.enable": "false"}) as broker:
        bootstrap = broker.bootstrap_servers
        with WireClient.to(bootstrap) as wc:
            assert wc.request(19, 5, create_req("work", 1)).topics[0].error_code == 0
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(3):
            producer.produce("work", f"v{i}".encode())
        assert producer.flush(30) == 0

        monkeypatch.setattr(LocalMetadataStore, "_write", full)
        with WireClient.to(bootstrap) as wc:
            resp = wc.request(10, 3, {"key": "g", "key_type": 0})
        assert resp.error_code == ErrorCode.coordinator_not_available
        assert broker.broker is not None
        assert broker.broker.metadata.topic("__consumer_offsets") is None
        assert not [d for d in tmp_path.iterdir() if d.name.startswith("__consumer_offsets")]
        monkeypatch.undo()  # the disk has room again

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        try:
            consumer.subscribe(["work"])
            got: list[bytes] = []
            deadline = time.monotonic() + 60
            while len(got) < 3 and time.monotonic() < deadline:
                m = consumer.poll(0.5)
                if m is not None and m.error() is None:
                    got.append(m.value())
            assert got == [b"v0", b"v1", b"v2"]
            consumer.commit(asynchronous=False)
            committed = consumer.committed([TopicPartition("work", 0)], timeout=30)
            assert committed[0].offset == 3
        finally:
            consumer.close()
        topic = broker.broker.metadata.topic("__consumer_offsets")
        assert topic is not None
        assert len([d for d in tmp_path.iterdir()
                    if d.name.startswith("__consumer_offsets-")]) == len(topic.partitions)
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the broker's log"


# ------------------------------------------------------------------ an existing data dir


def test_a_data_dir_with_json_metadata_keeps_working(tmp_path: Path) -> None:
    """A data dir of the JSON-metadata headrace (issue 8 item 10's migration): records
    produced, then the metadata put back as the old ``headrace-metadata.json`` document
    (the format the old store wrote, the SQLite database removed). The broker starts on
    it, imports it, keeps the JSON as a backup, and serves every record under the same
    topic id, with producer ids never reused (R-LOG-4, R-REP-9)."""
    import json

    from confluent_kafka import Producer

    from headrace.metadata.store import LocalMetadataStore

    # in process: the broker is stopped gracefully and started again, never killed
    with InProcessBroker(tmp_path, {"auto.create.topics.enable": "false"}) as b:
        with WireClient.to(b.bootstrap) as wc:
            assert wc.request(19, 5, create_req("old", 3)).topics[0].error_code == 0
        producer = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
        for i in range(30):
            producer.produce("old", f"r{i}".encode(), partition=i % 3)
        assert producer.flush(30) == 0
        with WireClient.to(b.bootstrap) as wc:
            before = metadata_v12(wc, "old").topics[0].topic_id
            pid_before = wc.request(22, 4, {"transactional_id": None,
                                            "transaction_timeout_ms": 60000,
                                            "producer_id": -1, "producer_epoch": -1}).producer_id
        b.stop()
        store = LocalMetadataStore(tmp_path, BrokerInfo(0, "127.0.0.1", 0))
        doc = {"version": 1, "cluster_id": store.cluster_id,
               "next_producer_id": store.allocate_producer_ids(0),
               "topics": {n: t.to_json() for n, t in store.topics().items()}}
        store.close()
        for f in tmp_path.glob(LocalMetadataStore.DB_NAME + "*"):
            f.unlink()
        (tmp_path / LocalMetadataStore.FILE_NAME).write_text(json.dumps(doc, indent=1))

        b.start()
        assert (tmp_path / (LocalMetadataStore.FILE_NAME + LocalMetadataStore.BACKUP_SUFFIX)
                ).exists()
        assert not (tmp_path / LocalMetadataStore.FILE_NAME).exists()
        with WireClient.to(b.bootstrap) as wc:
            got = metadata_v12(wc, "old").topics[0]
            assert got.error_code == 0 and got.topic_id == before
            pid_after = wc.request(22, 4, {"transactional_id": None,
                                           "transaction_timeout_ms": 60000,
                                           "producer_id": -1, "producer_epoch": -1}).producer_id
            assert pid_after > pid_before
        values = sorted(m for p in range(3) for m in consume_all(b.bootstrap, "old", p))
        assert values == sorted(f"r{i}" for i in range(30))
        no_traceback(b)


def consume_all(bootstrap: str, topic: str, partition: int) -> list[str]:
    from tests.clients import consume

    return [r.value.decode() for r in consume("confluent", bootstrap, topic, [partition], 10)]
