"""Error codes by request version (issue 27 item 1; R-TXN-1): a client hears only codes its
request version knows, as Kafka downgrades them (``KafkaApis``' ``version < N`` checks and
the group coordinator's), against an in-process broker over the wire:

- a fenced producer (KIP-588): AddPartitionsToTxn, AddOffsetsToTxn and EndTxn v0-v1 and
  InitProducerId v0-v3 answer INVALID_PRODUCER_EPOCH (47), later versions PRODUCER_FENCED
  (90); TxnOffsetCommit passes the log's INVALID_PRODUCER_EPOCH on at every version;
- DeleteTopics v1-v2 with ``delete.topic.enable=false``: INVALID_REQUEST (v3 brought
  TOPIC_DELETION_DISABLED);
- OffsetCommit below v9 by a KIP-848 member: UNSUPPORTED_VERSION (v9 brought
  STALE_MEMBER_EPOCH).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tests.brokerproc import wait_until
from tests.clients import create_topic
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient
from tests.txn_wire import RETRIABLE, add_partitions, init_producer

pytestmark = pytest.mark.timeout(120)

OVERRIDES = {"num.partitions": "1", "transaction.state.log.num.partitions": "2",
             "offsets.topic.num.partitions": "2", "group.initial.rebalance.delay.ms": "0",
             "delete.topic.enable": "false"}


@pytest.fixture(scope="module")
def b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("version-errors"), OVERRIDES) as broker:
        yield broker
        text = "".join(broker.stderr_lines)
        assert "Traceback" not in text, text[-3000:]


def _fenced(b: InProcessBroker) -> tuple[WireClient, str, int, int]:
    """A transactional id whose producer epoch 0 was fenced by a second InitProducerId:
    (client, id, producer id, the fenced epoch)."""
    wc = WireClient.to(b.bootstrap)
    tid = f"fenced-{uuid.uuid4().hex[:6]}"
    pid, epoch = init_producer(wc, tid)
    pid2, epoch2 = init_producer(wc, tid)
    assert (pid2, epoch2) == (pid, epoch + 1)
    return wc, tid, pid, epoch


def _retried(fn: Any) -> ErrorCode:
    """``fn()``'s error code once it is not a retriable coordinator error."""
    codes: list[ErrorCode] = []

    def settled() -> bool:
        codes.append(ErrorCode(fn()))
        return codes[-1] not in RETRIABLE

    wait_until(settled, 30, 0.05, "a non-retriable answer")
    return codes[-1]


def _expected(version: int, first_fenced_version: int) -> ErrorCode:
    return (ErrorCode.invalid_producer_epoch if version < first_fenced_version
            else ErrorCode.producer_fenced)


def test_add_partitions_to_txn_fenced_by_version(b: InProcessBroker) -> None:
    """AddPartitionsToTxn v0-v1: INVALID_PRODUCER_EPOCH; v2-v3: PRODUCER_FENCED."""
    topic = f"apt-{uuid.uuid4().hex[:6]}"
    create_topic("confluent", b.bootstrap, topic, 1)
    wc, tid, pid, epoch = _fenced(b)
    with wc:
        for version in range(4):
            def add(v: int = version) -> int:
                r = wc.request(24, v, {
                    "v3_and_below_transactional_id": tid, "v3_and_below_producer_id": pid,
                    "v3_and_below_producer_epoch": epoch,
                    "v3_and_below_topics": [{"name": topic, "partitions": [0]}]})
                return int(r.results_by_topic_v3_and_below[0].results_by_partition[0]
                           .partition_error_code)
            assert _retried(add) == _expected(version, 2), version


def test_add_offsets_to_txn_fenced_by_version(b: InProcessBroker) -> None:
    """AddOffsetsToTxn v0-v1 (aiokafka and librdkafka send v0): INVALID_PRODUCER_EPOCH,
    which librdkafka takes as fatal; v2-v4: PRODUCER_FENCED."""
    wc, tid, pid, epoch = _fenced(b)
    with wc:
        for version in range(5):
            def add(v: int = version) -> int:
                return int(wc.request(25, v, {
                    "transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
                    "group_id": "g-offsets"}).error_code)
            assert _retried(add) == _expected(version, 2), version


def test_end_txn_and_init_producer_id_fenced_by_version(b: InProcessBroker) -> None:
    """EndTxn v0-v1 and InitProducerId v3 (v3 is the first to send the current epoch):
    INVALID_PRODUCER_EPOCH below the version that brought PRODUCER_FENCED."""
    wc, tid, pid, epoch = _fenced(b)
    with wc:
        for version in range(5):
            def end(v: int = version) -> int:
                return int(wc.request(26, v, {
                    "transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
                    "committed": False}).error_code)
            assert _retried(end) == _expected(version, 2), version
        # fenced twice: the epoch is neither the current one nor the last (a retry)
        assert init_producer(wc, tid) == (pid, epoch + 2)
        for version in (3, 4, 5):
            def init(v: int = version) -> int:
                return int(wc.request(22, v, {
                    "transactional_id": tid, "transaction_timeout": 60_000,
                    "producer_id": pid, "producer_epoch": epoch}).error_code)
            assert _retried(init) == _expected(version, 4), version


def test_txn_offset_commit_of_a_fenced_producer_is_invalid_producer_epoch(
        b: InProcessBroker) -> None:
    """TxnOffsetCommit by a producer fenced after it joined the group's offsets partition to
    its transaction: INVALID_PRODUCER_EPOCH (the log's error, as Kafka passes it on) at
    every version, v3 included, which librdkafka sends and takes 47 as fatal (it would take
    PRODUCER_FENCED as abortable)."""
    topic = f"toc-{uuid.uuid4().hex[:6]}"
    create_topic("confluent", b.bootstrap, topic, 1)
    group = f"g-{uuid.uuid4().hex[:6]}"
    with WireClient.to(b.bootstrap) as wc:
        tid = f"toc-{uuid.uuid4().hex[:6]}"
        pid, epoch = init_producer(wc, tid)
        add_partitions(wc, tid, pid, epoch, topic, [0])
        assert _retried(lambda: int(wc.request(25, 3, {
            "transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
            "group_id": group}).error_code)) == ErrorCode.none

        def commit(version: int) -> int:
            r = wc.request(28, version, {
                "transactional_id": tid, "group_id": group, "producer_id": pid,
                "producer_epoch": epoch, "generation_id": -1, "member_id": "",
                "topics": [{"name": topic, "partitions": [
                    {"partition_index": 0, "committed_offset": 1,
                     "committed_metadata": ""}]}]})
            return int(r.topics[0].partitions[0].error_code)

        assert _retried(lambda: commit(3)) == ErrorCode.none
        # a second producer fences this one: its transaction is aborted with a newer
        # epoch, markers included (InitProducerId answers CONCURRENT_TRANSACTIONS until
        # then), and the new producer gets the epoch after that
        pid2, epoch2 = init_producer(wc, tid)
        assert pid2 == pid and epoch2 > epoch
        for version in range(5):
            assert _retried(lambda v=version: commit(v)) == ErrorCode.invalid_producer_epoch, \
                version


def test_delete_topics_with_deletion_disabled_by_version(b: InProcessBroker) -> None:
    """``delete.topic.enable=false``: DeleteTopics v1-v2 INVALID_REQUEST, v3+
    TOPIC_DELETION_DISABLED (Kafka's ``handleDeleteTopicsRequest``)."""
    topic = f"keep-{uuid.uuid4().hex[:6]}"
    create_topic("confluent", b.bootstrap, topic, 1)
    with WireClient.to(b.bootstrap) as wc:
        for version in range(1, 7):
            body: dict[str, Any] = {"timeout": 10_000}
            if version >= 6:
                body["topics"] = [{"name": topic, "topic_id": uuid.UUID(int=0)}]
            else:
                body["topic_names"] = [topic]
            (res,) = wc.request(20, version, body).responses
            want = (ErrorCode.invalid_request if version < 3
                    else ErrorCode.topic_deletion_disabled)
            assert res.error_code == want, version


def test_offset_commit_below_v9_by_a_kip848_member_is_unsupported_version(
        b: InProcessBroker) -> None:
    """A consumer-protocol (KIP-848) member commits with OffsetCommit v9+: below, Kafka's
    ``ConsumerGroup.validateOffsetCommit`` answers UNSUPPORTED_VERSION, not the
    STALE_MEMBER_EPOCH that v9 brought; v9 with the member's epoch commits."""
    topic = f"oc-{uuid.uuid4().hex[:6]}"
    create_topic("confluent", b.bootstrap, topic, 1)
    group = f"g848-{uuid.uuid4().hex[:6]}"
    with WireClient.to(b.bootstrap) as wc:
        def join() -> Any:
            return wc.request(68, 0, {"group_id": group, "member_id": str(uuid.uuid4()),
                                      "member_epoch": 0, "rebalance_timeout": 30_000,
                                      "subscribed_topic_names": [topic],
                                      "topic_partitions": []})
        answers = [join()]
        wait_until(lambda: ErrorCode(answers[-1].error_code) not in RETRIABLE
                   or answers.append(join()), 30, 0.05, "the group coordinator")
        hb = answers[-1]
        assert hb.error_code == ErrorCode.none, ErrorCode(hb.error_code).name
        member_id, member_epoch = str(hb.member_id), int(hb.member_epoch)

        def commit(version: int) -> ErrorCode:
            r = wc.request(8, version, {
                "group_id": group, "generation_id_or_member_epoch": member_epoch,
                "member_id": member_id, "group_instance_id": None, "retention_time_ms": -1,
                "topics": [{"name": topic, "partitions": [
                    {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                     "committed_metadata": ""}]}]})
            return ErrorCode(r.topics[0].partitions[0].error_code)

        for version in range(2, 9):
            assert commit(version) == ErrorCode.unsupported_version, version
        assert commit(9) == ErrorCode.none


def test_txn_offset_commit_v0_v1_hear_coordinator_not_available_while_loading(
        b: InProcessBroker) -> None:
    """While the group's offsets partition loads, TxnOffsetCommit v0-v1 answer
    COORDINATOR_NOT_AVAILABLE (clients before Kafka 2.0 crash on
    COORDINATOR_LOAD_IN_PROGRESS, KAFKA-7296), v2+ COORDINATOR_LOAD_IN_PROGRESS."""
    topic = f"load-{uuid.uuid4().hex[:6]}"
    create_topic("confluent", b.bootstrap, topic, 1)
    group = f"gl-{uuid.uuid4().hex[:6]}"
    with WireClient.to(b.bootstrap) as wc:
        # the group's coordinator is up (FindCoordinator creates __consumer_offsets)
        wait_until(lambda: wc.request(10, 4, {"key_type": 0, "coordinator_keys": [group]})
                   .coordinators[0].error_code == ErrorCode.none, 30, 0.05,
                   "the group coordinator")
        index = b.call(lambda broker: broker.groups.partition_for(group))
        b.call(lambda broker: broker.groups.loading.add(index))
        try:
            for version in range(5):
                r = wc.request(28, version, {
                    "transactional_id": "t-load", "group_id": group, "producer_id": 1,
                    "producer_epoch": 0, "generation_id": -1, "member_id": "",
                    "topics": [{"name": topic, "partitions": [
                        {"partition_index": 0, "committed_offset": 1,
                         "committed_metadata": ""}]}]})
                want = (ErrorCode.coordinator_not_available if version < 2
                        else ErrorCode.coordinator_load_in_progress)
                assert r.topics[0].partitions[0].error_code == want, version
        finally:
            b.call(lambda broker: broker.groups.loading.discard(index))
