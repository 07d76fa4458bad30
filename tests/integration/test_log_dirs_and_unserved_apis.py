"""AlterReplicaLogDirs and the APIs headrace does not serve (issue 27 item 3; R-PROTO-1,
R-NF-1), against an in-process broker over the wire and with kafka-python's admin client:

- AlterReplicaLogDirs (34) v1-2 answers each partition as Kafka's ``ReplicaManager.
  alterReplicaLogDirs`` does: the replica's current dir NONE, a dir that is not a log dir
  LOG_DIR_NOT_FOUND, a partition of no topic UNKNOWN_TOPIC_OR_PARTITION, a topic name
  past 249 characters INVALID_TOPIC_EXCEPTION (kafka-python's
  ``test_alter_replica_log_dirs`` saw the connection closed); with several ``log.dirs``
  the replica moves (R-LOG-1: nothing acknowledged is lost), DescribeLogDirs reports it
  in its new dir, it stays there across a restart, and a move cut short (a ``-future``
  copy, or two copies) is cleaned up at start;
- a request of an API Kafka defines and headrace does not serve is answered in that API's
  words with UNSUPPORTED_VERSION, and the connection stays usable; one whose response has
  no top-level error code, an unknown API key and a version outside a served API's range
  close the connection, as Kafka does (tests/integration/test_bad_input.py covers the last
  two against a broker process).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tests.clients import Rec, create_topic, produce, read_to_end
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("log-dirs"), {"num.partitions": "2"}) as x:
        yield x
        text = "".join(x.stderr_lines)
        assert "Traceback" not in text, text[-3000:]


def _topic(b: InProcessBroker) -> str:
    name = f"dirs-{uuid.uuid4().hex[:8]}"
    create_topic("confluent", b.bootstrap, name, 2)
    return name


def _alter(wc: WireClient, version: int, dirs: list[tuple[str, str, list[int]]]
           ) -> dict[tuple[str, int], ErrorCode]:
    resp = wc.request(34, version, {"dirs": [
        {"path": path, "topics": [{"name": topic, "partitions": parts}]}
        for path, topic, parts in dirs]})
    return {(str(t.topic_name), int(p.partition_index)): ErrorCode(p.error_code)
            for t in resp.results for p in t.partitions}


def test_alter_replica_log_dirs_on_the_wire(b: InProcessBroker) -> None:
    topic = _topic(b)
    here = os.path.abspath(b.data_dir)
    long_name = "x" * 250
    for version in (1, 2):
        with WireClient.to(b.bootstrap) as wc:
            assert _alter(wc, version, [(here, topic, [0, 1])]) == {
                (topic, 0): ErrorCode.none, (topic, 1): ErrorCode.none}
            assert _alter(wc, version, [("/no/such/dir", topic, [0])]) == {
                (topic, 0): ErrorCode.log_dir_not_found}
            assert _alter(wc, version, [(here, "no-such-topic", [0]), (here, topic, [7]),
                                        (here, long_name, [0])]) == {
                ("no-such-topic", 0): ErrorCode.unknown_topic_or_partition,
                (topic, 7): ErrorCode.unknown_topic_or_partition,
                (long_name, 0): ErrorCode.invalid_topic_exception}
            # named under two dirs: the last one wins (Kafka's partitionDirs map)
            assert _alter(wc, version, [("/elsewhere", topic, [0]), (here, topic, [0])]) == {
                (topic, 0): ErrorCode.none}
    with WireClient.to(b.bootstrap) as wc:  # advertised
        adv = wc.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert {int(k.api_key): (int(k.min_version), int(k.max_version))
                for k in adv.api_keys}[34] == (1, 2)


def test_alter_replica_log_dirs_kafka_python(b: InProcessBroker) -> None:
    """kafka-python's ``alter_replica_log_dirs`` (its ``test_alter_replica_log_dirs``): a
    move to the dir DescribeLogDirs reports is NoError; an unknown dir LogDirNotFound."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import LogDirNotFoundError, NoError
    from kafka.structs import TopicPartitionReplica

    topic = _topic(b)
    k = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    try:
        (entry,) = k.describe_log_dirs(topic_partitions={topic: [0]})
        (log_dir,) = entry["log_dirs"]
        here = TopicPartitionReplica(topic, 0, 0)
        assert k.alter_replica_log_dirs({here: log_dir["log_dir"]}) == {here: NoError}
        other = TopicPartitionReplica(topic, 1, 0)
        assert k.alter_replica_log_dirs({other: "/no/such/dir"}) == {
            other: LogDirNotFoundError}
    finally:
        k.close()


NOT_SERVED = [
    (38, 3, {"owner_principal_type": None, "owner_principal_name": None, "renewers": [],
             "max_lifetime": -1}),  # CreateDelegationToken
    (55, 2, {"topics": []}),  # DescribeQuorum
    (57, 1, {"timeout": 1000, "feature_updates": [], "validate_only": False}),
    (71, 0, {"client_instance_id": uuid.UUID(int=0)}),  # GetTelemetrySubscriptions
]


@pytest.mark.parametrize(("key", "version", "body"), NOT_SERVED,
                         ids=["create-delegation-token", "describe-quorum", "update-features",
                              "get-telemetry-subscriptions"])
def test_an_api_not_served_is_refused_in_its_own_words(b: InProcessBroker, key: int,
                                                        version: int,
                                                        body: dict[str, Any]) -> None:
    with WireClient.to(b.bootstrap) as wc:
        resp = wc.request(key, version, body)
        assert resp.error_code == ErrorCode.unsupported_version
        if hasattr(resp, "error_message"):
            assert resp.error_message == f"API key {key} is not served by this broker"
        # the connection is still in use
        md = wc.request(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False})
        assert [int(x.node_id) for x in md.brokers] == [0]


def test_an_api_without_a_top_level_error_code_closes(b: InProcessBroker) -> None:
    """StreamsGroupDescribe (89, KIP-1071): its response has no top-level error code, so
    the request cannot be refused as a whole; the connection is closed, as Kafka closes one
    sending an API it does not enable. (ReadShareGroupState, this test's API before, is
    served now: ``test_share_coordinator.py``.)"""
    with WireClient.to(b.bootstrap) as wc:
        wc.send_raw(wc.encode(89, 0, {"group_ids": [], "include_authorized_operations": False}))
        assert wc.is_closed_by_peer(5.0)


# ------------------------------------------------------------------ several log dirs


@pytest.fixture(scope="module")
def two_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    base = tmp_path_factory.mktemp("two-log-dirs")
    first, second = base / "a", base / "b"
    with InProcessBroker(first, {"num.partitions": "2",
                                 "log.dirs": f"{first},{second}"}) as x:
        yield x
        text = "".join(x.stderr_lines)
        assert "Traceback" not in text, text[-3000:]


def _describe(wc: WireClient) -> dict[str, dict[str, set[int]]]:
    """log dir → topic → partitions DescribeLogDirs lists there."""
    resp = wc.request(35, 4, {"topics": None})
    out: dict[str, dict[str, set[int]]] = {}
    for r in resp.results:
        assert r.error_code == ErrorCode.none
        out[str(r.log_dir)] = {str(t.name): {int(p.partition_index) for p in t.partitions}
                               for t in r.topics}
    return out


def test_a_replica_moves_between_log_dirs_and_stays_there(two_dirs: InProcessBroker
                                                          ) -> None:
    b = two_dirs
    first = os.path.abspath(b.data_dir)
    second = os.path.abspath(b.data_dir.parent / "b")
    topic = _topic(b)
    produce("confluent", b.bootstrap, topic, [Rec(0, None, b"v%d" % i) for i in range(20)])
    with WireClient.to(b.bootstrap) as wc:
        assert set(_describe(wc)) == {first, second}
        assert _alter(wc, 2, [(second, topic, [0])]) == {(topic, 0): ErrorCode.none}
        where = _describe(wc)
        assert where[second].get(topic) == {0} and where[first].get(topic) == {1}
    assert os.path.isdir(os.path.join(second, f"{topic}-0"))
    assert not os.path.exists(os.path.join(first, f"{topic}-0"))
    assert read_to_end(b.bootstrap, topic, 2, "read_uncommitted") == [
        b"v%d" % i for i in range(20)]
    produce("confluent", b.bootstrap, topic, [Rec(0, None, b"w%d" % i) for i in range(5)])
    want = [b"v%d" % i for i in range(20)] + [b"w%d" % i for i in range(5)]
    b.restart()
    with WireClient.to(b.bootstrap) as wc:
        assert _describe(wc)[second].get(topic) == {0}
    assert read_to_end(b.bootstrap, topic, 2, "read_uncommitted") == want
    with WireClient.to(b.bootstrap) as wc:  # and back
        assert _alter(wc, 1, [(first, topic, [0, 1])]) == {
            (topic, 0): ErrorCode.none, (topic, 1): ErrorCode.none}
        assert _describe(wc)[first].get(topic) == {0, 1}
        assert topic not in _describe(wc)[second]
    assert read_to_end(b.bootstrap, topic, 2, "read_uncommitted") == want


def test_a_move_cut_short_is_cleaned_up_at_start(two_dirs: InProcessBroker) -> None:
    """What a crash mid-move leaves: a ``-future`` copy (the replica stays where it was)
    and, after the copy's rename, the same partition in two dirs (the copy in the later
    dir of ``log.dirs`` goes). Both are removed at start; nothing is lost."""
    import shutil

    b = two_dirs
    first = b.data_dir
    second = b.data_dir.parent / "b"
    topic = _topic(b)
    produce("confluent", b.bootstrap, topic, [Rec(p, None, b"x%d" % p) for p in (0, 1)])
    b.stop()
    future = second / f"{topic}-0.{uuid.uuid4().hex}-future"
    shutil.copytree(first / f"{topic}-0", future)
    shutil.copytree(first / f"{topic}-1", second / f"{topic}-1")
    b.start()
    b.call(lambda broker: broker.replicas.wait_for_removals(10))
    assert not future.exists() and not (second / f"{topic}-1").exists()
    assert (first / f"{topic}-0").is_dir() and (first / f"{topic}-1").is_dir()
    assert sorted(read_to_end(b.bootstrap, topic, 2, "read_uncommitted")) == [b"x0", b"x1"]
