"""Crash-safe DeleteTopics and stray partition directories (issue 8, items 4 and 7; R-LOG-4).

Before the fix a topic left the metadata first and its directories were removed one by one
afterwards; a kill -9 in between left them behind, nothing cleaned them up at start, and a
later CreateTopics of the same name reopened them (1,366 records of a deleted topic showed
up in the new one). Now the directories are renamed to ``<topic>-<p>.<uuid>-delete`` and
removed in the background, every partition directory records its topic id
(``partition.metadata``), and at start leftovers and directories that no topic owns (or that
hold another topic's id) are removed.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KTopicPartition
from confluent_kafka.admin import AdminClient

from headrace.broker.embedded import EmbeddedBroker
from headrace.log.partition_log import read_partition_metadata, write_partition_metadata
from tests.brokerproc import BrokerProcess, wait_until
from tests.clients import Rec, consume, create_topic, produce
from tests.kafka_wire import WireClient

PARTITIONS = 24


def _fill(bootstrap: str, topic: str, per_partition: int, tag: str) -> None:
    recs = [Rec(p, None, f"{tag}-{p}-{i:05d}".encode() + b"." * 200)
            for i in range(per_partition) for p in range(PARTITIONS)]
    produce("confluent", bootstrap, topic, recs, extra={"linger.ms": 5, "batch.size": 2000})


def _watermarks(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wm-{uuid.uuid4().hex}"})
    try:
        return [c.get_watermark_offsets(KTopicPartition(topic, p), timeout=10)
                for p in range(partitions)]
    finally:
        c.close()


def _topics(bootstrap: str) -> set[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return set(admin.list_topics(timeout=10).topics)


def _delete(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=10)[topic].result(15)


def _leftovers(data_dir: Path, topic: str) -> list[str]:
    return sorted(p.name for p in data_dir.iterdir() if p.name.startswith(f"{topic}-"))


@pytest.mark.parametrize("delay_s", [0.0, 0.003, 0.02])
def test_kill_9_during_delete_of_a_large_topic_then_recreate_sees_no_old_record(
    data_dir: Path, delay_s: float
) -> None:
    """Issue 8 item 4, R-LOG-4: DeleteTopics of a topic of many partitions and segments,
    kill -9 ``delay_s`` after sending it, restart: the topic is either still whole or gone;
    re-created under the same name it has no old record, and no old directory survives."""
    b = BrokerProcess(data_dir).start()
    try:
        create_topic("confluent", b.bootstrap, "big", PARTITIONS, {"segment.bytes": "4096"})
        _fill(b.bootstrap, "big", 60, "old")
        assert len(list((data_dir / "big-0").glob("*.log"))) > 3
        # a raw request: a client library would resend it to the restarted broker
        wc = WireClient.to(b.bootstrap)
        wc.send_raw(wc.encode(20, 4, {"topic_names": ["big"], "timeout_ms": 10_000}))
        time.sleep(delay_s)  # where the kill lands: not synchronisation
        b.kill()
        wc.close()
        b.start()
        if "big" in _topics(b.bootstrap):  # the kill came before the delete committed
            assert [hw for _, hw in _watermarks(b.bootstrap, "big", PARTITIONS)] == (
                [60] * PARTITIONS)
            _delete(b.bootstrap, "big")
        create_topic("confluent", b.bootstrap, "big", PARTITIONS)
        assert _watermarks(b.bootstrap, "big", PARTITIONS) == [(0, 0)] * PARTITIONS
        produce("confluent", b.bootstrap, "big", [Rec(p, None, b"new") for p in
                                                  range(PARTITIONS)])
        got = consume("confluent", b.bootstrap, "big", list(range(PARTITIONS)), PARTITIONS)
        assert sorted((r.partition, r.offset, r.value) for r in got) == [
            (p, 0, b"new") for p in range(PARTITIONS)]
        wait_until(lambda: _leftovers(data_dir, "big") == [f"big-{p}" for p in
                                                           sorted(range(PARTITIONS), key=str)],
                   20, what="the old directories to be removed")
        assert not [ln for ln in b.stderr_lines if "Traceback" in ln]
    finally:
        b.kill()


def test_start_removes_strays_and_never_adopts_another_topics_files(data_dir: Path) -> None:
    """Issue 8 item 4: at start, ``-delete`` leftovers, partition directories no topic owns
    and directories holding another topic id than their topic's are removed; the
    partitions of the topic that owns its directories keep every record."""
    b = EmbeddedBroker(data_dir).start()
    try:
        create_topic("confluent", b.bootstrap_servers, "keep", 3)
        produce("confluent", b.bootstrap_servers, "keep",
                [Rec(p, None, f"k{p}-{i}".encode()) for p in range(3) for i in range(20)])
        topic_id = b.call(lambda br: br.metadata.topic("keep").topic_id)
    finally:
        b.stop()
    assert read_partition_metadata(data_dir / "keep-0") == topic_id
    # a directory of a deleted topic "gone" (a crash between the metadata commit and the
    # renames), a leftover of an interrupted removal, and keep-2 holding another topic id
    shutil.copytree(data_dir / "keep-1", data_dir / "gone-3")
    write_partition_metadata(data_dir / "gone-3", uuid.uuid4())
    shutil.copytree(data_dir / "keep-1", data_dir / f"gone-1.{uuid.uuid4().hex}-delete")
    write_partition_metadata(data_dir / "keep-2", uuid.uuid4())
    (data_dir / "notes-1").mkdir()  # not a partition directory: left alone
    (data_dir / "notes-1" / "README.txt").write_text("mine")
    b = EmbeddedBroker(data_dir).start()
    try:
        b.call(lambda br: br.replicas.wait_for_removals(20))
        assert not (data_dir / "gone-3").exists()
        assert not [p for p in data_dir.iterdir() if p.name.endswith("-delete")]
        assert (data_dir / "notes-1" / "README.txt").read_text() == "mine"
        assert _watermarks(b.bootstrap_servers, "keep", 3) == [(0, 20), (0, 20), (0, 0)]
        assert read_partition_metadata(data_dir / "keep-2") == topic_id
        create_topic("confluent", b.bootstrap_servers, "gone", 4)
        assert _watermarks(b.bootstrap_servers, "gone", 4) == [(0, 0)] * 4
    finally:
        b.stop()


def test_open_of_a_directory_with_another_topic_id_starts_empty(tmp_path: Path) -> None:
    """Issue 8 item 4: ``PartitionLog.open`` with a topic id removes a directory holding
    another topic's id (and its records) instead of adopting it; one without
    partition.metadata is adopted and gets the file (Kafka's format)."""
    from headrace.clock import ManualClock
    from headrace.config import LogConfig
    from headrace.log.partition_log import PartitionLog
    from tests.batches import simple_batch

    clock = ManualClock(wall_ms=1_700_000_000_000)
    old, new = uuid.uuid4(), uuid.uuid4()
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, LogConfig(), clock, topic_id=old)
    log.append_as_leader(simple_batch(5), 0)
    log.close()
    text = (d / "partition.metadata").read_text()
    assert text.startswith("version: 0\ntopic_id: ") and "=" not in text
    log = PartitionLog.open(d, LogConfig(), clock, topic_id=old)
    assert log.log_end_offset == 5
    log.close()
    log = PartitionLog.open(d, LogConfig(), clock, topic_id=new)
    assert log.log_end_offset == 0 and read_partition_metadata(d) == new
    log.append_as_leader(simple_batch(2), 0)
    log.close()
    (d / "partition.metadata").unlink()
    log = PartitionLog.open(d, LogConfig(), clock, topic_id=old)
    assert log.log_end_offset == 2 and read_partition_metadata(d) == old
    log.close()
    assert not [p for p in tmp_path.iterdir() if p.name != "t-0"]


@pytest.mark.parametrize("name", ["__consumer_offsets", "__transaction_state"])
def test_delete_topics_refuses_internal_topics(broker: BrokerProcess, name: str) -> None:
    """Issue 8 item 7: DeleteTopics of a topic the broker owns is refused (INVALID_TOPIC_
    EXCEPTION, Kafka's answer to client writes to internal topics) and the topic stays."""
    from confluent_kafka import KafkaError

    # make __consumer_offsets exist (a group commit creates it)
    create_topic("confluent", broker.bootstrap, f"t-{name}", 1)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-internal",
                  "enable.auto.commit": False})
    try:
        c.commit(offsets=[KTopicPartition(f"t-{name}", 0, 0)], asynchronous=False)
    finally:
        c.close()
    existed = name in _topics(broker.bootstrap)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with pytest.raises(KafkaException) as e:
        admin.delete_topics([name], operation_timeout=10)[name].result(15)
    assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION
    assert (name in _topics(broker.bootstrap)) == existed
    if name == "__consumer_offsets":
        assert existed


@pytest.mark.parametrize("point", ["delete-start", "delete-renaming", "delete-removing"])
def test_kill_9_at_each_step_of_a_delete_then_recreate_sees_no_old_record(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """Issue 8 item 4, R-LOG-4: the broker SIGKILLs itself exactly inside a DeleteTopics of
    a topic of many partitions and segments (``HEADRACE_FAILPOINT``): after the metadata
    commit but before any rename; after 3 of 24 renames; while the background removal
    runs. After a restart the topic is gone, its directories are removed, and the topic
    re-created under the same name holds no old record."""
    monkeypatch.setenv("HEADRACE_FAILPOINT", point)
    b = BrokerProcess(data_dir).start()
    monkeypatch.delenv("HEADRACE_FAILPOINT")
    try:
        create_topic("confluent", b.bootstrap, "big", PARTITIONS, {"segment.bytes": "4096"})
        _fill(b.bootstrap, "big", 60, "old")
        assert len(list((data_dir / "big-0").glob("*.log"))) > 3
        assert b.proc is not None
        proc = b.proc
        with WireClient.to(b.bootstrap) as wc:
            wc.send_raw(wc.encode(20, 4, {"topic_names": ["big"], "timeout_ms": 10_000}))
            wait_until(lambda: proc.poll() is not None, 30, what=f"the failpoint {point}")
        assert proc.returncode == -9
        left = _leftovers(data_dir, "big")
        assert left, "the crash left no directory"
        if point != "delete-removing":  # every directory stays (some renamed)
            assert len(left) == PARTITIONS
        b.proc = None
        b.start()
        assert "big" not in _topics(b.bootstrap)
        # the start removes what the delete left, before anything re-creates the name
        wait_until(lambda: not _leftovers(data_dir, "big"), 20, what="leftovers removed")
        create_topic("confluent", b.bootstrap, "big", PARTITIONS)
        assert _watermarks(b.bootstrap, "big", PARTITIONS) == [(0, 0)] * PARTITIONS
        produce("confluent", b.bootstrap, "big", [Rec(p, None, b"new") for p in
                                                  range(PARTITIONS)])
        got = consume("confluent", b.bootstrap, "big", list(range(PARTITIONS)), PARTITIONS)
        assert sorted((r.partition, r.offset, r.value) for r in got) == [
            (p, 0, b"new") for p in range(PARTITIONS)]
        wait_until(lambda: _leftovers(data_dir, "big") == sorted(
            f"big-{p}" for p in range(PARTITIONS)), 20, what="the old directories removed")
        assert not [ln for ln in b.stderr_lines if "Traceback" in ln]
    finally:
        b.kill()
