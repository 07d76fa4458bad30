"""Admin APIs driven by real clients (issue 11 item 3): AlterConfigs (33), DeleteRecords
(21), DescribeLogDirs (35), DescribeTopicPartitions (75), DescribeProducers (61),
OffsetForLeaderEpoch (23) and the ACL APIs (29-31), each with every client that has it
(confluent-kafka, kafka-python, aiokafka), and on the wire (``WireClient``) where a client
hides what the broker answered or no second client has the API:

API (key)                  confluent-kafka     kafka-python                  aiokafka
AlterConfigs (33)          alter_configs       alter_configs(incremental=F)  alter_configs
DeleteRecords (21)         delete_records      delete_records                delete_records
DescribeLogDirs (35)       -                   describe_log_dirs             -
DescribeTopicPartitions    -                   describe_topic_partitions     -
DescribeProducers (61)     -                   describe_producers            -
OffsetForLeaderEpoch (23)  consumer (KIP-320)  consumer (tests/cluster)      -
ACLs (29-31)               *_acls              *_acls                        -

Where only kafka-python has an API, the wire tests are the second client (every version
served, the errors, the cursor, the exact ACL answers).

kafka-python's consumer only validates a position when the leader epoch moved past it,
which takes a leader change: that test is in ``tests/cluster/test_admin_cluster.py``, with
DeleteRecords on a cluster leader and follower.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tests.brokerproc import BrokerProcess, wait_until
from tests.clients import Rec, create_topic, produce
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

TOPIC, BROKER = 2, 4

@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """The module's broker in process (tests/conftest.py's ``broker`` is a process):
    nothing here kills, pauses or restarts it."""
    with InProcessBroker(tmp_path_factory.mktemp("broker"), {"num.partitions": "1"}) as b:
        yield b

DYNAMIC_TOPIC_CONFIG = 1
EARLIEST, LATEST = -2, -1
ADMIN_CLIENTS = ("confluent", "kafka-python", "aiokafka")


# ------------------------------------------------------------------ helpers


def wire(b: BrokerProcess) -> WireClient:
    return WireClient.to(b.bootstrap)


def overrides(b: BrokerProcess, topic: str) -> dict[str, str | None]:
    """The topic's config overrides (DescribeConfigs: source DYNAMIC_TOPIC_CONFIG)."""
    with wire(b) as wc:
        resp = wc.request(32, 4, {"resources": [{"resource_type": TOPIC, "resource_name": topic,
                                                 "configuration_keys": None}],
                                  "include_synonyms": False, "include_documentation": False})
    (r,) = resp.results
    assert r.error_code == ErrorCode.none, r.error_message
    return {c.name: c.value for c in r.configs if c.config_source == DYNAMIC_TOPIC_CONFIG}


def list_offset(b: BrokerProcess, topic: str, partition: int, ts: int) -> int:
    with wire(b) as wc:
        resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition,
                                            "current_leader_epoch": -1, "timestamp": ts}]}]})
    (p,) = resp.topics[0].partitions
    assert p.error_code == ErrorCode.none
    return int(p.offset)


def fetch_error(b: BrokerProcess, topic: str, partition: int, offset: int) -> tuple[int, int]:
    """(error code, log start offset) of a Fetch v11 at ``offset``."""
    with wire(b) as wc:
        resp = wc.request(1, 11, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
            "forgotten_topics_data": [],
            "topics": [{"topic": topic, "partitions": [{
                "partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    (p,) = resp.responses[0].partitions
    return int(p.error_code), int(p.log_start_offset)


def new_topic(b: BrokerProcess, prefix: str, partitions: int = 1,
              configs: dict[str, str] | None = None) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic("confluent", b.bootstrap, name, partitions, configs)
    return name


def fill(b: BrokerProcess, topic: str, counts: dict[int, int], client: str = "confluent"
         ) -> None:
    recs = [Rec(p, b"k", b"v-%d-%d" % (p, i)) for p, n in counts.items() for i in range(n)]
    produce(client, b.bootstrap, topic, recs, extra={"enable.idempotence": False}
            if client == "confluent" else {"enable_idempotence": False})


def consume_offsets(bootstrap: str, topic: str, partition: int, start: int,
                    want: int) -> list[int]:
    """Offsets kafka-python's consumer reads from ``start`` (earliest reset)."""
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, partition)
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      auto_offset_reset="earliest", consumer_timeout_ms=10_000)
    try:
        c.assign([tp])
        c.seek(tp, start)
        got: list[int] = []
        deadline = time.monotonic() + 20
        while len(got) < want and time.monotonic() < deadline:
            for records in c.poll(500).values():
                got += [r.offset for r in records]
        return got
    finally:
        c.close()


# ------------------------------------------------------------------ AlterConfigs


def alter_configs(client: str, bootstrap: str, topic: str, configs: dict[str, str],
                  validate_only: bool = False) -> int:
    """AlterConfigs (33) through ``client``'s admin API; the error code it reports."""
    if client == "confluent":
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, ConfigResource

        admin = AdminClient({"bootstrap.servers": bootstrap})
        res = ConfigResource("topic", topic, set_config=configs)
        with warnings.catch_warnings():  # deprecated in favour of incremental: tested here
            warnings.simplefilter("ignore", DeprecationWarning)
            fut = admin.alter_configs([res], validate_only=validate_only)[res]
        try:
            fut.result(15)
        except KafkaException as e:
            return int(e.args[0].code())
        return 0
    if client == "kafka-python":
        from kafka.admin import ConfigResource as KConfigResource
        from kafka.admin import ConfigResourceType, KafkaAdminClient

        k = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            out = k.alter_configs([KConfigResource(ConfigResourceType.TOPIC, topic,
                                                   configs=dict(configs))],
                                  validate_only=validate_only, raise_on_unknown=False,
                                  incremental=False)
        finally:
            k.close()
        result = out["topic"][topic]  # "OK" or "[Error 40] InvalidConfigurationError: .."
        if result == "OK":
            return 0
        assert result.startswith("[Error "), result
        return int(result[len("[Error "):].split("]", 1)[0])
    assert not validate_only, "aiokafka's alter_configs has no validate_only"

    async def run() -> int:
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.admin.config_resource import ConfigResource as AConfigResource
        from aiokafka.admin.config_resource import ConfigResourceType as AType

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            (resp,) = await admin.alter_configs(
                [AConfigResource(AType.TOPIC, topic, configs=configs)])
        finally:
            await admin.close()
        ((code, _message, _rtype, name),) = resp.resources
        assert name == topic
        return int(code)

    return asyncio.run(run())


@pytest.mark.parametrize("client", ADMIN_CLIENTS)
def test_alter_configs_replaces_the_whole_set(broker: BrokerProcess, client: str) -> None:
    """AlterConfigs sets exactly the given overrides: every other override goes back to
    its default (unlike IncrementalAlterConfigs); a bad value or an unknown name is
    INVALID_CONFIG and changes nothing. kafka-python's legacy path reads the topic's
    overrides first and sends them along with the change (its docs: "AlterConfigsRequest
    resets any omitted key"), so for it the result is the union."""
    initial = {"retention.ms": "86400000", "cleanup.policy": "compact,delete"}
    topic = new_topic(broker, "alter", configs=initial)
    assert overrides(broker, topic) == initial
    change = {"segment.bytes": "1048576", "max.message.bytes": "2000000"}
    want = {**initial, **change} if client == "kafka-python" else change
    assert alter_configs(client, broker.bootstrap, topic, change) == 0
    assert overrides(broker, topic) == want
    for bad in ({"retention.ms": "abc"}, {"no.such.config": "1"}, {"segment.bytes": "1"}):
        assert alter_configs(client, broker.bootstrap, topic, bad) == ErrorCode.invalid_config
        assert overrides(broker, topic) == want, bad
    if client != "kafka-python":  # an empty set removes every override
        assert alter_configs(client, broker.bootstrap, topic, {}) == 0
        assert overrides(broker, topic) == {}


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_alter_configs_validate_only_stores_nothing(broker: BrokerProcess, client: str) -> None:
    topic = new_topic(broker, "alter-vo", configs={"retention.ms": "86400000"})
    assert alter_configs(client, broker.bootstrap, topic, {"segment.bytes": "1048576"},
                         validate_only=True) == 0
    assert overrides(broker, topic) == {"retention.ms": "86400000"}
    assert alter_configs(client, broker.bootstrap, topic, {"segment.bytes": "x"},
                         validate_only=True) == ErrorCode.invalid_config


def test_alter_configs_applies_to_the_log(broker: BrokerProcess) -> None:
    """The replaced set is what the log uses: a max.message.bytes override removed by
    AlterConfigs no longer lets a large record in."""
    topic = new_topic(broker, "alter-log", configs={"max.message.bytes": "10000000"})
    big = [Rec(0, None, b"x" * 1_500_000)]
    produce("kafka-python", broker.bootstrap, topic, big,
            extra={"max_request_size": 4_000_000})
    assert alter_configs("aiokafka", broker.bootstrap, topic, {"retention.ms": "60000"}) == 0
    from kafka.errors import MessageSizeTooLargeError

    with pytest.raises(MessageSizeTooLargeError):
        produce("kafka-python", broker.bootstrap, topic, big,
                extra={"max_request_size": 4_000_000, "retries": 0})


def test_alter_configs_request_errors(broker: BrokerProcess) -> None:
    """Kafka's per-resource errors, on the wire (every version 0-2): duplicate resources,
    duplicate keys, null values, a broker's read-only config (issue 27: broker configs are
    dynamic, log.dirs is not), unknown and default topics."""
    topic = new_topic(broker, "alter-err", configs={"retention.ms": "86400000"})
    missing = f"missing-{uuid.uuid4().hex[:8]}"

    def res(name: str, configs: list[tuple[str, str | None]], rtype: int = TOPIC
            ) -> dict[str, Any]:
        return {"resource_type": rtype, "resource_name": name,
                "configs": [{"name": n, "value": v} for n, v in configs]}

    for version in (0, 1, 2):
        with wire(broker) as wc:
            resp = wc.request(33, version, {"validate_only": False, "resources": [
                res(topic, [("segment.bytes", "1048576"), ("segment.bytes", "2097152")]),
                res(topic + "-x", [("retention.ms", None), ("segment.ms", None)]),
                res(missing, [("retention.ms", "1000")]),
                res("", [("retention.ms", "1000")]),
                res("0", [("log.dirs", "/elsewhere")], BROKER),
                res(missing + "-dup", [("retention.ms", "1000")]),
                res(missing + "-dup", [("retention.ms", "2000")]),
            ]})
        codes = [(r.resource_name, r.error_code, r.error_message) for r in resp.responses]
        assert codes[0] == (topic, ErrorCode.invalid_request,
                            "Error due to duplicate config keys")
        assert codes[1] == (topic + "-x", ErrorCode.invalid_request,
                            "Null value not supported for : retention.ms, segment.ms")
        assert codes[2][:2] == (missing, ErrorCode.unknown_topic_or_partition)
        assert codes[3][:2] == ("", ErrorCode.invalid_request)
        assert codes[4] == ("0", ErrorCode.invalid_config, "Invalid config value for "
                            "resource ConfigResource(type=BROKER, name='0'): Cannot update "
                            "these configs dynamically: Set(log.dirs)")
        assert codes[5][1] == codes[6][1] == ErrorCode.invalid_request
        assert codes[5][2] == "Each resource must appear at most once."
        assert overrides(broker, topic) == {"retention.ms": "86400000"}


# ------------------------------------------------------------------ DeleteRecords


def delete_records(client: str, bootstrap: str, topic: str, offsets: dict[int, int]
                   ) -> dict[int, tuple[int, int]]:
    """DeleteRecords through ``client``'s admin API: partition -> (error code, low
    watermark; -1 with an error)."""
    out: dict[int, tuple[int, int]] = {}
    if client == "confluent":
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as CTP
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": bootstrap})
        futs = admin.delete_records([CTP(topic, p, o) for p, o in offsets.items()])
        for tp, fut in futs.items():
            try:
                out[tp.partition] = (0, int(fut.result(15).low_watermark))
            except KafkaException as e:
                out[tp.partition] = (int(e.args[0].code()), -1)
        return out
    if client == "kafka-python":
        from kafka import TopicPartition
        from kafka.admin import KafkaAdminClient
        from kafka.errors import KafkaError

        k = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            for p, o in offsets.items():  # one call each: an error raises
                tp = TopicPartition(topic, p)
                try:
                    res = k.delete_records({tp: o}, timeout_ms=5000)
                    out[p] = (int(res[tp]["error_code"]), int(res[tp]["low_watermark"]))
                except KafkaError as e:
                    out[p] = (int(e.errno), -1)
        finally:
            k.close()
        return out

    async def run() -> None:
        from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
        from aiokafka.errors import KafkaError as AKafkaError
        from aiokafka.structs import TopicPartition as ATP

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            for p, o in offsets.items():
                try:
                    res = await admin.delete_records({ATP(topic, p): RecordsToDelete(o)})
                    out[p] = (0, int(res[ATP(topic, p)]))
                except AKafkaError as e:
                    out[p] = (int(e.errno), -1)
        finally:
            await admin.close()

    asyncio.run(run())
    return out


@pytest.mark.parametrize("client", ADMIN_CLIENTS)
def test_delete_records(broker: BrokerProcess, client: str) -> None:
    """The log start offset moves to the requested offset (-1: the high watermark) and the
    low watermark comes back; ListOffsets earliest answers it; a fetch below it is
    OFFSET_OUT_OF_RANGE and a consumer resetting to earliest starts there; past the high
    watermark is OFFSET_OUT_OF_RANGE and changes nothing."""
    topic = new_topic(broker, "delrec", partitions=3)
    fill(broker, topic, {0: 20, 1: 5, 2: 4})
    res = delete_records(client, broker.bootstrap, topic, {0: 7, 1: -1})
    assert res == {0: (0, 7), 1: (0, 5)}
    assert list_offset(broker, topic, 0, EARLIEST) == 7
    assert list_offset(broker, topic, 0, LATEST) == 20
    assert list_offset(broker, topic, 1, EARLIEST) == 5
    assert fetch_error(broker, topic, 0, 6) == (ErrorCode.offset_out_of_range, 7)
    assert fetch_error(broker, topic, 0, 7) == (ErrorCode.none, 7)
    assert consume_offsets(broker.bootstrap, topic, 0, 2, 13) == list(range(7, 20))
    # past the high watermark: an error, nothing moves; below the start: nothing moves
    res = delete_records(client, broker.bootstrap, topic, {2: 5})
    assert res == {2: (ErrorCode.offset_out_of_range, -1)}
    assert list_offset(broker, topic, 2, EARLIEST) == 0
    assert delete_records(client, broker.bootstrap, topic, {0: 3}) == {0: (0, 7)}
    assert list_offset(broker, topic, 0, EARLIEST) == 7


def test_delete_records_kafka_python_consumer_sees_out_of_range(broker: BrokerProcess) -> None:
    """A consumer with no reset policy positioned below the new log start gets
    OFFSET_OUT_OF_RANGE (kafka-python raises it from poll)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    topic = new_topic(broker, "delrec-oor")
    fill(broker, topic, {0: 10})
    assert delete_records("confluent", broker.bootstrap, topic, {0: 6}) == {0: (0, 6)}
    tp = TopicPartition(topic, 0)
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                      auto_offset_reset="none")
    try:
        c.assign([tp])
        c.seek(tp, 2)
        with pytest.raises(OffsetOutOfRangeError):
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                assert not c.poll(300), "records below the log start offset were served"
    finally:
        c.close()


def test_delete_records_errors_on_the_wire(broker: BrokerProcess) -> None:
    """Kafka's partition errors, every version 0-2: unknown topic or partition, internal
    topic, compact-only topic (POLICY_VIOLATION), negative offset; low watermark -1."""
    topic = new_topic(broker, "delrec-err", partitions=2)
    compact = new_topic(broker, "delrec-compact", configs={"cleanup.policy": "compact"})
    fill(broker, topic, {0: 6, 1: 3})
    fill(broker, compact, {0: 3})
    # __consumer_offsets exists once a group coordinator was asked for
    with wire(broker) as wc:
        fc = wc.request(10, 3, {"key": "delrec-group", "key_type": 0})
        assert fc.error_code == ErrorCode.none
    for version in (0, 1, 2):
        with wire(broker) as wc:
            resp = wc.request(21, version, {"timeout": 5000, "topics": [
                {"name": topic, "partitions": [{"partition_index": 0, "offset": 2 + version},
                                               {"partition_index": 1, "offset": -7},
                                               {"partition_index": 9, "offset": 1}]},
                {"name": "no-such-topic-x", "partitions": [{"partition_index": 0,
                                                            "offset": 1}]},
                {"name": compact, "partitions": [{"partition_index": 0, "offset": 1}]},
                {"name": "__consumer_offsets", "partitions": [{"partition_index": 0,
                                                               "offset": 0}]},
            ]})
        got = {(t.name, p.partition_index): (p.error_code, p.low_watermark)
               for t in resp.topics for p in t.partitions}
        assert got == {
            (topic, 0): (ErrorCode.none, 2 + version),
            (topic, 1): (ErrorCode.offset_out_of_range, -1),
            (topic, 9): (ErrorCode.unknown_topic_or_partition, -1),
            ("no-such-topic-x", 0): (ErrorCode.unknown_topic_or_partition, -1),
            (compact, 0): (ErrorCode.policy_violation, -1),
            ("__consumer_offsets", 0): (ErrorCode.invalid_topic_exception, -1),
        }, version
    assert list_offset(broker, compact, 0, EARLIEST) == 0


def _segment_bases(data_dir: Path, topic: str, partition: int) -> list[int]:
    d = data_dir / f"{topic}-{partition}"
    return sorted(int(f.stem) for f in d.glob("*.log"))


@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "kill-9"])
@pytest.mark.slow
def test_delete_records_survives_a_restart(data_dir: Path, graceful: bool) -> None:
    """The moved log start offset is stored: after a restart (SIGTERM or kill -9)
    ListOffsets earliest, fetches and consumers still start there; segments wholly below
    it are deleted at once."""
    with BrokerProcess(data_dir, {"num.partitions": "1"}) as b:
        topic = new_topic(b, "delrec-restart", configs={"segment.bytes": "2000"})
        recs = [Rec(0, None, b"%04d" % i + b"." * 200) for i in range(40)]
        for i in range(0, 40, 5):  # small requests: many segments
            produce("kafka-python", b.bootstrap, topic, recs[i:i + 5])
        bases = _segment_bases(data_dir, topic, 0)
        assert len(bases) > 3
        cut = bases[2] + 1  # inside the third segment
        assert delete_records("kafka-python", b.bootstrap, topic, {0: cut}) == {0: (0, cut)}
        assert _segment_bases(data_dir, topic, 0) == bases[2:]
        b.restart(graceful=graceful)
        assert list_offset(b, topic, 0, EARLIEST) == cut
        assert list_offset(b, topic, 0, LATEST) == 40
        assert fetch_error(b, topic, 0, cut - 1) == (ErrorCode.offset_out_of_range, cut)
        assert consume_offsets(b.bootstrap, topic, 0, 0, 40 - cut) == list(range(cut, 40))
        # then everything (-1: the high watermark); more records still append after it
        assert delete_records("aiokafka", b.bootstrap, topic, {0: -1}) == {0: (0, 40)}
        b.restart(graceful=graceful)
        assert list_offset(b, topic, 0, EARLIEST) == 40
        produce("confluent", b.bootstrap, topic, [Rec(0, None, b"after")])
        assert consume_offsets(b.bootstrap, topic, 0, 0, 1) == [40]
        assert not [line for line in b.stderr_lines if "Traceback" in line]


def test_cli_delete_records(broker: BrokerProcess) -> None:
    """``headrace topics delete-records`` (kafka-delete-records.sh's job)."""
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "headrace.cli", "topics", "delete-records",
                               "--bootstrap-server", broker.bootstrap, *args],
                              capture_output=True, text=True, timeout=60)

    topic = new_topic(broker, "delrec-cli", partitions=2)
    fill(broker, topic, {0: 8, 1: 5})
    r = run("--topic", topic, "--partition", "0", "--offset", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"partition: {topic}-0\tlow_watermark: 3\n"
    r = run("--topic", topic, "--partition", "1", "--offset", "9")
    assert r.returncode == 1 and "out of range" in r.stderr.lower(), r.stderr
    assert list_offset(broker, topic, 1, EARLIEST) == 0
    r = run("--topic", topic)  # every partition, up to the high watermark
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"partition: {topic}-0\tlow_watermark: 8",
                                     f"partition: {topic}-1\tlow_watermark: 5"]
    assert [list_offset(broker, topic, p, EARLIEST) for p in (0, 1)] == [8, 5]


# ------------------------------------------------------------------ DescribeLogDirs


def _on_disk_size(data_dir: Path, topic: str, partition: int) -> int:
    d = data_dir / f"{topic}-{partition}"
    return sum(f.stat().st_size for f in d.glob("*.log"))


def test_describe_log_dirs_kafka_python(broker: BrokerProcess) -> None:
    """kafka-python's describe_log_dirs: the data dir's absolute path, each partition's
    size as on disk, offset lag 0, the file system's total and usable bytes."""
    from kafka.admin import KafkaAdminClient

    topic = new_topic(broker, "logdirs", partitions=2)
    fill(broker, topic, {0: 30, 1: 3})
    k = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        (entry,) = k.describe_log_dirs(topic_partitions={topic: [0, 1]})
        everything = k.describe_log_dirs()
    finally:
        k.close()
    (log_dir,) = entry["log_dirs"]
    assert log_dir["error_code"] == 0
    assert log_dir["log_dir"] == os.path.abspath(broker.data_dir)
    (t,) = log_dir["topics"]
    assert t["name"] == topic
    sizes = {p["partition_index"]: p["partition_size"] for p in t["partitions"]}
    assert sizes == {0: _on_disk_size(broker.data_dir, topic, 0),
                     1: _on_disk_size(broker.data_dir, topic, 1)}
    assert sizes[0] > sizes[1] > 0
    assert all(p["offset_lag"] == 0 and not p["is_future_key"] for p in t["partitions"])
    st = os.statvfs(broker.data_dir)
    assert log_dir["total_bytes"] == st.f_blocks * st.f_frsize
    assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
    names = {t["name"] for t in everything[0]["log_dirs"][0]["topics"]}
    assert topic in names


def test_describe_log_dirs_on_the_wire(broker: BrokerProcess) -> None:
    """Every version 1-4: a filter by topic and partition returns just those partitions,
    a partition not hosted is left out, null topics lists everything; total and usable
    bytes from v4."""
    topic = new_topic(broker, "logdirs-wire", partitions=3)
    other = new_topic(broker, "logdirs-other")
    fill(broker, topic, {0: 5, 2: 9})
    for version in (1, 2, 3, 4):
        with wire(broker) as wc:
            resp = wc.request(35, version, {"topics": [
                {"topic": topic, "partitions": [0, 2, 7]},
                {"topic": "no-such-topic", "partitions": [0]}]})
            everything = wc.request(35, version, {"topics": None})
        (r,) = resp.results
        assert r.error_code == ErrorCode.none
        (t,) = r.topics
        assert t.name == topic
        assert [(p.partition_index, p.partition_size, p.offset_lag) for p in t.partitions] == [
            (0, _on_disk_size(broker.data_dir, topic, 0), 0),
            (2, _on_disk_size(broker.data_dir, topic, 2), 0)]
        if version >= 4:
            assert r.total_bytes > 0 and 0 < r.usable_bytes <= r.total_bytes
        names = {t.name for t in everything.results[0].topics}
        assert {topic, other} <= names
        full = {t.name: t for t in everything.results[0].topics}[topic]
        assert sorted(p.partition_index for p in full.partitions) == [0, 1, 2]


# ------------------------------------------------------------------ DescribeTopicPartitions


def test_describe_topic_partitions_kafka_python_pages(broker: BrokerProcess) -> None:
    """kafka-python's describe_topic_partitions, paging with the cursor: partitions in
    topic-name order, at most the limit per response, the cursor at the first partition
    left out (or the next topic's partition 0), none at the end."""
    from kafka.admin import KafkaAdminClient

    prefix = f"dtp-{uuid.uuid4().hex[:6]}"
    a, b_, c = f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"
    for name, n in ((a, 3), (b_, 2), (c, 1)):
        create_topic("confluent", broker.bootstrap, name, n)
    k = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    pages = []
    try:
        cursor = None
        for _ in range(10):
            page = k.describe_topic_partitions([c, a, b_], response_partition_limit=2,
                                               cursor=cursor)
            pages.append([(t["name"], [p["partition_index"] for p in t["partitions"]])
                          for t in page["topics"]])
            cursor = page["next_cursor"]
            if cursor is None:
                break
            cursor = {"topic_name": cursor["topic_name"],
                      "partition_index": cursor["partition_index"]}
        whole = k.describe_topic_partitions([a, "no-such-dtp"])
    finally:
        k.close()
    assert pages == [[(a, [0, 1])], [(a, [2]), (b_, [0])], [(b_, [1]), (c, [0])]]
    by_name = {t["name"]: t for t in whole["topics"]}
    assert by_name["no-such-dtp"]["error_code"] == ErrorCode.unknown_topic_or_partition
    ta = by_name[a]
    assert ta["error_code"] == 0 and not ta["is_internal"]
    assert [(p["partition_index"], p["leader_id"], list(p["replica_nodes"]),
             list(p["isr_nodes"])) for p in ta["partitions"]] == [
        (0, 0, [0], [0]), (1, 0, [0], [0]), (2, 0, [0], [0])]
    assert whole["next_cursor"] is None


def test_describe_topic_partitions_on_the_wire(broker: BrokerProcess) -> None:
    """The topic id is Metadata's; a limit used up at a topic's end points the cursor at
    the next topic's partition 0; all topics (empty list) from a cursor; a cursor topic
    missing from the list, or a negative cursor partition, is INVALID_REQUEST."""
    prefix = f"dtpw-{uuid.uuid4().hex[:6]}"
    a, b_ = f"{prefix}-a", f"{prefix}-b"
    create_topic("confluent", broker.bootstrap, a, 2)
    create_topic("confluent", broker.bootstrap, b_, 2)
    with wire(broker) as wc:
        md = wc.request(3, 12, {"topics": [{"name": a, "topic_id": None}],
                                "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False})
        r = wc.request(75, 0, {"topics": [{"name": a}, {"name": b_}],
                               "response_partition_limit": 2, "cursor": None})
        assert [(t.name, len(t.partitions)) for t in r.topics] == [(a, 2)]
        assert r.topics[0].topic_id == md.topics[0].topic_id
        assert r.topics[0].topic_authorized_operations == 3576  # every topic operation
        assert (r.next_cursor.topic_name, r.next_cursor.partition_index) == (b_, 0)
        # every topic from the cursor on: b's partition 1 first
        r = wc.request(75, 0, {"topics": [], "response_partition_limit": 2000,
                               "cursor": {"topic_name": b_, "partition_index": 1}})
        assert r.topics[0].name == b_
        assert [p.partition_index for p in r.topics[0].partitions] == [1]
        assert all(t.name > b_ for t in r.topics[1:])
        assert r.next_cursor is None
        for cursor in ({"topic_name": "zzz-not-listed", "partition_index": 0},
                       {"topic_name": a, "partition_index": -1}):
            r = wc.request(75, 0, {"topics": [{"name": a}], "response_partition_limit": 5,
                                   "cursor": cursor})
            assert [(t.name, t.error_code, t.partitions) for t in r.topics] == [
                (a, ErrorCode.invalid_request, ())]
        # the connection is still fine
        r = wc.request(75, 0, {"topics": [{"name": "bad/name"}], "cursor": None})
        assert r.topics[0].error_code == ErrorCode.invalid_topic_exception


# ------------------------------------------------------------------ DescribeProducers


def describe_producers(bootstrap: str, topic: str, partition: int) -> list[Any]:
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    k = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        tp = TopicPartition(topic, partition)
        return list(k.describe_producers([tp])[tp].active_producers)
    finally:
        k.close()


def test_describe_producers(data_dir: Path) -> None:
    """kafka-python's describe_producers lists the idempotent producers that wrote to a
    partition (confluent's and kafka-python's), with their last sequence and the last
    batch's timestamp; a non-idempotent producer leaves none; the state survives a
    restart (rebuilt from the log)."""
    with BrokerProcess(data_dir, {"num.partitions": "1"}) as b:
        topic = new_topic(b, "producers", partitions=2)
        t0 = 1_700_000_000_000
        produce("confluent", b.bootstrap, topic,
                [Rec(0, b"k", b"c%d" % i, timestamp=t0 + i) for i in range(7)],
                extra={"enable.idempotence": True})
        produce("kafka-python", b.bootstrap, topic,
                [Rec(0, b"k", b"k%d" % i, timestamp=t0 + 100 + i) for i in range(4)],
                extra={"enable_idempotence": True})
        fill(b, topic, {1: 5})  # not idempotent
        before = describe_producers(b.bootstrap, topic, 0)
        assert sorted((p.producer_epoch, p.last_sequence, p.last_timestamp,
                       p.coordinator_epoch, p.current_transaction_start_offset)
                      for p in before) == [(0, 3, t0 + 103, -1, -1), (0, 6, t0 + 6, -1, -1)]
        assert len({p.producer_id for p in before}) == 2
        assert describe_producers(b.bootstrap, topic, 1) == []
        b.restart(graceful=False)
        after = describe_producers(b.bootstrap, topic, 0)
        assert sorted(map(tuple, after)) == sorted(map(tuple, before))


def test_describe_producers_errors_on_the_wire(broker: BrokerProcess) -> None:
    topic = new_topic(broker, "producers-err", partitions=1)
    with wire(broker) as wc:
        r = wc.request(61, 0, {"topics": [
            {"name": topic, "partition_indexes": [0, 4]},
            {"name": "no-such-producers", "partition_indexes": [0, 1]},
            {"name": "bad name", "partition_indexes": [0]}]})
    got = [(t.name, [(p.partition_index, p.error_code) for p in t.partitions])
           for t in r.topics]
    assert got == [
        (topic, [(0, ErrorCode.none), (4, ErrorCode.unknown_topic_or_partition)]),
        ("no-such-producers", [(0, ErrorCode.unknown_topic_or_partition),
                               (1, ErrorCode.unknown_topic_or_partition)]),
        ("bad name", [(0, ErrorCode.invalid_topic_exception)])]
    assert r.topics[1].partitions[0].error_message == (
        "This server does not host this topic-partition.")
    assert r.topics[0].partitions[0].active_producers == ()


# ------------------------------------------------------------------ OffsetForLeaderEpoch


def test_offset_for_leader_epoch_confluent_detects_truncation(broker: BrokerProcess) -> None:
    """librdkafka validates a position that carries a leader epoch (KIP-320) with
    OffsetForLeaderEpoch: past the epoch's end it reports log truncation naming the
    broker's end offset; within it, it fetches from there."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as CTP

    topic = new_topic(broker, "ofle")
    fill(broker, topic, {0: 10})

    def first_event(offset: int) -> Any:
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}",
                      "auto.offset.reset": "error", "enable.auto.commit": False})
        try:
            c.assign([CTP(topic, 0, offset, leader_epoch=0)])

            def polled() -> Any:
                return c.poll(0.2)

            m = wait_until(polled, timeout_s=20, what="a message or an error")
            return (m.error(), m.offset())
        finally:
            c.close()

    err, _ = first_event(15)
    assert err is not None and err.code() == KafkaError._AUTO_OFFSET_RESET
    assert "truncation detected" in err.str() and "broker end offset is 10" in err.str()
    err, offset = first_event(4)
    assert err is None and offset == 4


# ------------------------------------------------------------------ ACLs


def test_acl_apis_kafka_python_security_disabled(broker: BrokerProcess) -> None:
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )
    from kafka.errors import SecurityDisabledError

    k = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        acl_filter = ACLFilter(principal=None, host="*", operation=ACLOperation.ANY,
                               permission_type=ACLPermissionType.ANY,
                               resource_pattern=ResourcePatternFilter(
                                   ResourceType.TOPIC, None, ACLResourcePatternType.ANY))
        with pytest.raises(SecurityDisabledError):
            k.describe_acls(acl_filter)
        acl = ACL(principal="User:alice", host="*", operation=ACLOperation.READ,
                  permission_type=ACLPermissionType.ALLOW,
                  resource_pattern=ResourcePattern(ResourceType.TOPIC, "t",
                                                   ACLResourcePatternType.LITERAL))
        created = k.create_acls([acl, acl])
        assert created["succeeded"] == []
        assert created["failed"] == [SecurityDisabledError] * 2
        deleted = k.delete_acls([acl_filter])
        assert [(f, list(m), e) for f, m, e in deleted] == [
            (acl_filter, [], SecurityDisabledError)]
        assert k.list_topics()  # the connection still serves
    finally:
        k.close()


def test_acl_apis_confluent_security_disabled(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                           AclOperation.ANY, AclPermissionType.ANY)
    binding = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:alice",
                         "*", AclOperation.READ, AclPermissionType.ALLOW)
    # librdkafka reads DescribeAcls' top-level error code and drops it (2.x,
    # rd_kafka_DescribeAclsResponse_parse): against Kafka too, it reports no bindings
    assert admin.describe_acls(flt).result(15) == []
    for fut in admin.create_acls([binding]).values():
        with pytest.raises(KafkaException) as e:
            fut.result(15)
        assert e.value.args[0].code() == KafkaError.SECURITY_DISABLED
    for fut in admin.delete_acls([flt]).values():
        with pytest.raises(KafkaException) as e:
            fut.result(15)
        assert e.value.args[0].code() == KafkaError.SECURITY_DISABLED


def test_acl_apis_response_shape_on_the_wire(broker: BrokerProcess) -> None:
    """Kafka's exact answers without an authorizer, versions 1-3, and the connection stays
    open (it used to be closed)."""
    acl = {"resource_type": 2, "resource_name": "t", "resource_pattern_type": 3,
           "principal": "User:a", "host": "*", "operation": 3, "permission_type": 3}
    flt = {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
           "principal_filter": None, "host_filter": None, "operation": 1,
           "permission_type": 1}
    with wire(broker) as wc:
        for version in (1, 2, 3):
            d = wc.request(29, version, {"resource_type_filter": 1, "resource_name_filter": None,
                                         "pattern_type_filter": 1, "principal_filter": None,
                                         "host_filter": None, "operation": 1,
                                         "permission_type": 1})
            assert (d.error_code, d.error_message, d.resources) == (
                ErrorCode.security_disabled, "No Authorizer is configured on the broker", ())
            c = wc.request(30, version, {"creations": [acl, acl, acl]})
            assert [(r.error_code, r.error_message) for r in c.results] == [
                (ErrorCode.security_disabled, "No Authorizer is configured.")] * 3
            x = wc.request(31, version, {"filters": [flt, flt]})
            assert [(r.error_code, r.error_message, r.matching_acls)
                    for r in x.filter_results] == [
                (ErrorCode.security_disabled, "No Authorizer is configured.", ())] * 2
        api = wc.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        ranges = {int(k.api_key): (int(k.min_version), int(k.max_version))
                  for k in api.api_keys}
    assert ranges[29] == ranges[30] == ranges[31] == (1, 3)
    assert ranges[21] == (0, 2) and ranges[33] == (0, 2) and ranges[35] == (1, 4)
    assert ranges[61] == (0, 0) and ranges[75] == (0, 0)
