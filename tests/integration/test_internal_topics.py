"""Internal topics cannot be damaged through the admin APIs (issue 23 item 5).

``__consumer_offsets`` and ``__transaction_state`` keep every group's committed offsets and
every transactional id's state as the latest record per key: only compaction may remove
their records, and their partition count places every group and transactional id on its
coordinator. A client with ALTER_CONFIGS / ALTER on them (every client without ACLs) asked
for ``cleanup.policy=delete`` + ``retention.ms=1`` and the broker accepted it: retention then
removed the offsets topic's segments and, after the next restart, every group's commits were
gone (42 -> -1001). Kafka's brokers accept that change and CreatePartitions on internal topics;
headrace refuses both (INVALID_CONFIG, INVALID_REQUEST: README, "Durability and hostile
clients"), as it already refused DeleteTopics and DeleteRecords on them as Kafka does.

Real clients (confluent-kafka's AdminClient, Consumer, transactional Producer) against an
in-process broker over a real socket; a clean in-process restart replays the offsets topic.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KTopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    ResourceType,
)

from tests.clients import create_topic
from tests.inproc import InProcessBroker

pytestmark = pytest.mark.timeout(180)

INTERNAL = ("__consumer_offsets", "__transaction_state")
# retention checked every 100 ms: before the fix a refused change would have been applied
# (and its segments deleted) long before the restart
CONFIG = {"group.initial.rebalance.delay.ms": "0", "num.partitions": "1",
          "offsets.topic.num.partitions": "3", "transaction.state.log.num.partitions": "2",
          "log.retention.check.interval.ms": "100"}


def _committed(bootstrap: str, group: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = c.committed([KTopicPartition(topic, 0)], timeout=15)
        return int(tp.offset)
    finally:
        c.close()


def _state(b: InProcessBroker) -> dict[str, Any]:
    """What must not change: each internal topic's stored overrides, partition count and
    the files of its partition directories."""
    def read(broker: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in INTERNAL:
            topic = broker.metadata.topic(name)
            out[name] = (dict(topic.configs), len(topic.partitions))
        return out

    state = b.call(read)
    for d in sorted(b.data_dir.iterdir()):
        if d.is_dir() and d.name.startswith(INTERNAL):
            state[d.name] = sorted(f.name for f in d.iterdir() if f.suffix == ".log")
    return state


def _refused(future: Any, code: int) -> str:
    with pytest.raises(KafkaException) as e:
        future.result(15)
    err = e.value.args[0]
    assert err.code() == code, err
    return str(err.str())


def _incremental(name: str, *ops: tuple[str, str | None, AlterConfigOpType]) -> ConfigResource:
    return ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops])


SET, DELETE, APPEND = AlterConfigOpType.SET, AlterConfigOpType.DELETE, AlterConfigOpType.APPEND

# each a change that leaves the topic's effective cleanup.policy other than compact
DAMAGING: list[tuple[str, Callable[[str], ConfigResource], bool]] = [
    ("incremental delete + retention.ms=1",
     lambda n: _incremental(n, ("cleanup.policy", "delete", SET), ("retention.ms", "1", SET)),
     True),
    ("incremental compact,delete",
     lambda n: _incremental(n, ("cleanup.policy", "compact,delete", SET)), True),
    ("incremental APPEND delete",
     lambda n: _incremental(n, ("cleanup.policy", "delete", APPEND)), True),
    ("incremental DELETE cleanup.policy (back to the broker's delete)",
     lambda n: _incremental(n, ("cleanup.policy", None, DELETE)), True),
    ("legacy cleanup.policy=delete",
     lambda n: ConfigResource(ResourceType.TOPIC, n, set_config={
         "cleanup.policy": "delete", "retention.ms": "1"}), False),
    ("legacy retention.ms=1 alone (drops the compact override)",
     lambda n: ConfigResource(ResourceType.TOPIC, n, set_config={"retention.ms": "1"}),
     False),
]


def test_internal_topics_refuse_damaging_changes_and_keep_commits(data_dir: Path) -> None:
    """Every config change that would leave an internal topic's cleanup.policy other than
    ``compact`` (IncrementalAlterConfigs SET / APPEND / DELETE, AlterConfigs, validate_only
    or not) is refused with INVALID_CONFIG; CreatePartitions (and its validate_only) with
    INVALID_REQUEST; DeleteRecords with Kafka's INVALID_TOPIC_EXCEPTION. Nothing changes
    (stored configs, partition counts, segment files), a harmless change (segment.ms) is
    still accepted, and after a restart the group's committed offset is still 42."""
    b = InProcessBroker(data_dir, CONFIG).start()
    try:
        create_topic("confluent", b.bootstrap, "t", 1)
        group = f"g-{uuid.uuid4().hex[:6]}"
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group})
        try:  # creates __consumer_offsets
            c.commit(offsets=[KTopicPartition("t", 0, 42)], asynchronous=False)
        finally:
            c.close()
        p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "tx-internal"})
        p.init_transactions(15)  # creates __transaction_state
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        before = _state(b)
        assert before["__consumer_offsets"] == ({"cleanup.policy": "compact",
                                                 "segment.bytes": "104857600"}, 3)

        for name in INTERNAL:
            for what, resource, incremental in DAMAGING:
                for validate_only in (True, False):
                    alter = admin.incremental_alter_configs if incremental \
                        else admin.alter_configs
                    (fut,) = alter([resource(name)], validate_only=validate_only,
                                   request_timeout=15).values()
                    message = _refused(fut, KafkaError.INVALID_CONFIG)
                    assert f"Internal topic {name} must keep cleanup.policy=compact" \
                        in message, (what, message)
            for validate_only in (True, False):
                fut = admin.create_partitions([NewPartitions(name, 10)],
                                              validate_only=validate_only)[name]
                message = _refused(fut, KafkaError.INVALID_REQUEST)
                assert f"partitions of internal topic {name} cannot be changed" in message
            fut = admin.delete_records([KTopicPartition(name, 0, 1)])[
                KTopicPartition(name, 0, 1)]
            _refused(fut, KafkaError.TOPIC_EXCEPTION)  # DeleteRecords carries no message
        assert _state(b) == before

        # a change that keeps compaction (what an operator may do) is still accepted
        (fut,) = admin.incremental_alter_configs([_incremental(
            "__consumer_offsets", ("segment.ms", "3600000", SET))]).values()
        fut.result(15)
        p.flush(5)
        b.restart()
        assert _committed(b.bootstrap, group, "t") == 42
        after = _state(b)
        assert after["__consumer_offsets"] == ({"cleanup.policy": "compact",
                                                "segment.bytes": "104857600",
                                                "segment.ms": "3600000"}, 3)
        assert after["__transaction_state"] == before["__transaction_state"]
        text = "".join(b.stderr_lines)
        assert "Traceback" not in text, text[-3000:]
    finally:
        b.stop()


def test_client_cannot_create_an_internal_topic_without_compaction(data_dir: Path) -> None:
    """A client creating ``__consumer_offsets`` itself (before any group made it) with
    ``cleanup.policy=delete`` (or no override: the broker's default is delete) is refused
    with INVALID_CONFIG, and the topic the broker creates later is compacted."""
    from confluent_kafka.admin import NewTopic

    with InProcessBroker(data_dir, CONFIG) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for configs in ({"cleanup.policy": "delete"}, {}):
            fut = admin.create_topics([NewTopic("__consumer_offsets", 1, 1, config=configs)],
                                      request_timeout=15)["__consumer_offsets"]
            assert "must keep cleanup.policy=compact" in _refused(
                fut, KafkaError.INVALID_CONFIG)
        assert b.call(lambda broker: broker.metadata.topic("__consumer_offsets")) is None
        create_topic("confluent", b.bootstrap, "t", 1)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g"})
        try:
            c.commit(offsets=[KTopicPartition("t", 0, 7)], asynchronous=False)
        finally:
            c.close()
        assert b.call(lambda broker: dict(broker.metadata.topic(
            "__consumer_offsets").configs))["cleanup.policy"] == "compact"


def test_a_stored_delete_policy_of_an_internal_topic_is_not_applied(data_dir: Path) -> None:
    """An internal topic whose stored overrides say ``cleanup.policy=delete`` (stored before
    the admin APIs refused it, or written by another tool) runs compacted only after a
    restart, with one warning line: retention never removes the committed offsets, which
    are still 42 after a second restart."""
    b = InProcessBroker(data_dir, CONFIG).start()
    try:
        create_topic("confluent", b.bootstrap, "t", 1)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g"})
        try:
            c.commit(offsets=[KTopicPartition("t", 0, 42)], asynchronous=False)
        finally:
            c.close()
        b.call(lambda broker: broker.metadata.set_topic_configs("__consumer_offsets", {
            "cleanup.policy": "delete", "retention.ms": "1"}))
        b.restart()

        def policies(broker: Any) -> set[str]:
            return {p.log.config.cleanup_policy for tp, p in broker.replicas.partitions.items()
                    if tp.topic == "__consumer_offsets"}

        assert b.call(policies) == {"compact"}
        warnings = [line for line in b.stderr_lines if "stored cleanup.policy=delete" in line]
        assert len(warnings) == 1 and "level=WARNING" in warnings[0], warnings
        assert _committed(b.bootstrap, "g", "t") == 42
        b.restart()
        assert _committed(b.bootstrap, "g", "t") == 42
    finally:
        b.stop()
