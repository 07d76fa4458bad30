"""Hanging transactions (issue 23 items 1 and 7; R-TXN-1, R-TXN-2), against in-process
brokers over real sockets:

- transaction verification (KIP-890 part 1, ``transaction.partition.verification.enable``
  on by default): a transactional batch of a producer id the coordinator never gave out,
  or for a partition never added to the transaction, is refused, and read_committed
  consumers keep reading; real clients' transactions still commit (and are verified);
- DescribeProducers reports an open transaction's start offset and the coordinator epoch
  of the producer's last marker;
- ``headrace transactions find-hanging`` and ``abort`` (kafka-transactions.sh) find and
  abort a hanging transaction left by a broker with verification off (data written before
  the upgrade), after which read_committed consumers progress.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from headrace.cli import main
from headrace.cli_support import set_verbose
from tests.batches import make_batch
from tests.clients import create_topic, read_to_end
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient
from tests.txn_wire import (
    add_partitions,
    coordinator,
    end_txn,
    init_producer,
    now_ms,
    offsets,
    produce,
    txn_batch,
)

pytestmark = pytest.mark.timeout(180)

BASE = {"num.partitions": "3", "transaction.state.log.num.partitions": "4",
        "group.initial.rebalance.delay.ms": "0"}


def _broker(tmp_path_factory: pytest.TempPathFactory, name: str,
            extra: dict[str, str]) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp(name), {**BASE, **extra}) as b:
        yield b
        text = "".join(b.stderr_lines)
        assert "Traceback" not in text, text[-3000:]


@pytest.fixture(scope="module")
def verifying(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """The default: transaction.partition.verification.enable=true."""
    yield from _broker(tmp_path_factory, "txn-verify", {})


@pytest.fixture(scope="module")
def unverified(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """Verification off, as a broker before the upgrade: hanging transactions can be
    made."""
    yield from _broker(tmp_path_factory, "txn-unverified",
                       {"transaction.partition.verification.enable": "false"})


def new_topic(b: InProcessBroker, prefix: str, partitions: int = 3) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic("confluent", b.bootstrap, name, partitions)
    return name


def plain(value: bytes) -> bytes:
    return make_batch([(None, value, now_ms(), [])])


def asked(b: InProcessBroker) -> int:
    return int(b.call(lambda broker: broker.txns.verifier.asked))


def test_a_producer_id_never_issued_is_refused_and_read_committed_keeps_reading(
        verifying: InProcessBroker) -> None:
    """One anonymous request used to open a transaction nobody would ever end (the last
    stable offset pinned at it for good). Now: the coordinator has no such producer
    (INVALID_PRODUCER_ID_MAPPING, Kafka's answer), or the request names no transactional
    id at all (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka's ``handleProduceRequest``);
    nothing is appended and a read_committed consumer reads what follows."""
    t = new_topic(verifying, "ghost")
    with WireClient.to(verifying.bootstrap) as wc:
        coordinator(wc, "ghost-id")  # the coordinator is up: its answer is the refusal
        r = produce(wc, "ghost-id", t, 0, txn_batch(987_654, 0, 0, [b"hang"]))
        assert r.error_code == ErrorCode.invalid_producer_id_mapping
        r = produce(wc, None, t, 0, txn_batch(987_655, 0, 0, [b"hang"]), acks=1)
        assert r.error_code == ErrorCode.transactional_id_authorization_failed
        assert produce(wc, None, t, 0, plain(b"after")).error_code == ErrorCode.none
        assert offsets(wc, t, 0) == (1, 1)  # high watermark, last stable offset
        producers = wc.request(61, 0, {"topics": [{"name": t, "partition_indexes": [0]}]})
        assert producers.topics[0].partitions[0].active_producers == ()
    assert read_to_end(verifying.bootstrap, t, 3, "read_committed") == [b"after"]


def test_a_partition_never_added_is_refused(verifying: InProcessBroker) -> None:
    """A real producer (InitProducerId) writing to a partition it never added with
    AddPartitionsToTxn: INVALID_TXN_STATE "Partition was not added to the transaction";
    the partition it added is verified once and takes its batches; another epoch is
    fenced (Kafka: PRODUCER_FENCED from the coordinator becomes INVALID_PRODUCER_EPOCH)."""
    t = new_topic(verifying, "unadded")
    tid = f"unadded-{uuid.uuid4().hex[:6]}"
    with WireClient.to(verifying.bootstrap) as wc:
        pid, epoch = init_producer(wc, tid)
        add_partitions(wc, tid, pid, epoch, t, [1])
        r = produce(wc, tid, t, 0, txn_batch(pid, epoch, 0, [b"stray"]))
        assert r.error_code == ErrorCode.invalid_txn_state
        assert r.error_message == "Partition was not added to the transaction"
        r = produce(wc, tid, t, 2, txn_batch(pid, epoch + 1, 0, [b"fenced"]))
        assert r.error_code == ErrorCode.invalid_producer_epoch
        before = asked(verifying)
        assert produce(wc, tid, t, 1, txn_batch(pid, epoch, 0, [b"in-0"])).error_code == 0
        assert asked(verifying) == before + 1
        # the transaction is ongoing there now: its next batch is not verified again
        assert produce(wc, tid, t, 1, txn_batch(pid, epoch, 1, [b"in-1"])).error_code == 0
        assert asked(verifying) == before + 1
        assert produce(wc, None, t, 0, plain(b"p0")).error_code == ErrorCode.none
        assert offsets(wc, t, 0) == (1, 1)  # nothing of the refused batch
        end_txn(wc, tid, pid, epoch, commit=True)
    got = read_to_end(verifying.bootstrap, t, 3, "read_committed")
    assert sorted(got) == [b"in-0", b"in-1", b"p0"]


def test_confluent_transactions_are_verified_and_commit(verifying: InProcessBroker) -> None:
    """librdkafka's transactions, as every client speaks them (AddPartitionsToTxn before
    the first batch of each partition), pass the verification: a commit and an abort over
    three partitions, each partition's first batch asked of the coordinator."""
    t = new_topic(verifying, "rdkafka")
    p = Producer({"bootstrap.servers": verifying.bootstrap, "linger.ms": 2,
                  "transactional.id": f"rdk-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    before = asked(verifying)
    p.begin_transaction()
    for i in range(9):
        p.produce(t, b"c%d" % i, partition=i % 3)
    p.commit_transaction(30)
    assert asked(verifying) >= before + 3
    p.begin_transaction()
    for i in range(3):
        p.produce(t, b"a%d" % i, partition=i)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(t, b"last", partition=1)
    p.commit_transaction(30)
    got = read_to_end(verifying.bootstrap, t, 3, "read_committed")
    assert sorted(got) == sorted([b"c%d" % i for i in range(9)] + [b"last"])


def test_describe_producers_reports_the_open_transaction(verifying: InProcessBroker) -> None:
    """Item 7: the first offset of the producer's open transaction in the partition (-1
    when none) and the coordinator epoch of its last marker (-1 before any), as Kafka's
    ``ProducerStateEntry``; they were always -1."""
    t = new_topic(verifying, "describe")
    tid = f"describe-{uuid.uuid4().hex[:6]}"

    def state(wc: WireClient) -> tuple[int, int]:
        r = wc.request(61, 0, {"topics": [{"name": t, "partition_indexes": [0]}]})
        (ps,) = r.topics[0].partitions[0].active_producers
        assert ps.producer_id == pid
        return int(ps.current_txn_start_offset), int(ps.coordinator_epoch)

    with WireClient.to(verifying.bootstrap) as wc:
        pid, epoch = init_producer(wc, tid)
        assert produce(wc, None, t, 0, plain(b"x")).error_code == 0  # offset 0
        add_partitions(wc, tid, pid, epoch, t, [0])
        assert produce(wc, tid, t, 0, txn_batch(pid, epoch, 0, [b"a", b"b"])).error_code == 0
        assert state(wc) == (1, -1)
        end_txn(wc, tid, pid, epoch, commit=True)
        txn_epoch = int(verifying.call(
            lambda b: b.replicas.get(_txn_partition(b, tid)).leader_epoch))

        def decided() -> bool:
            return state(wc)[0] == -1
        _wait(decided, "the commit marker")
        assert state(wc) == (-1, txn_epoch)
        add_partitions(wc, tid, pid, epoch, t, [0])
        assert produce(wc, tid, t, 0, txn_batch(pid, epoch, 2, [b"c"])).error_code == 0
        assert state(wc) == (4, txn_epoch)  # 0 x, 1-2 a b, 3 the marker, 4 c


def _txn_partition(b: object, tid: str) -> object:
    from headrace.broker.replica_manager import TopicPartition
    from headrace.broker.txn_service import TXN_TOPIC

    return TopicPartition(TXN_TOPIC, b.txns.partition_for(tid))  # type: ignore[attr-defined]


def _wait(predicate: object, what: str, timeout_s: float = 30.0) -> None:
    from tests.brokerproc import wait_until

    wait_until(predicate, timeout_s, what=what)


# ---------------------------------------------------------------------- the tools


def run(*args: str) -> Result:
    try:
        return CliRunner().invoke(main, list(args), prog_name="headrace",
                                  env={"HEADRACE_BOOTSTRAP": None,
                                       "HEADRACE_COMMAND_CONFIG": None,
                                       "HEADRACE_VERBOSE": None})
    finally:
        set_verbose(False)


def ok(*args: str) -> Result:
    r = run(*args)
    assert r.exit_code == 0, (r.exit_code, r.stdout, r.stderr, r.exception)
    assert "Traceback" not in r.stderr
    return r


def test_find_hanging_and_abort_unpin_read_committed(unverified: InProcessBroker) -> None:
    """Two hanging transactions, made on a broker with verification off (as data written
    before the upgrade): a producer id never issued in partition 0, and a real producer's
    batch in partition 1, which its transaction never added. A third transaction, open in
    partition 2, is its coordinator's and not hanging. ``find-hanging`` lists exactly the
    two (kafka-transactions.sh's columns); ``abort --start-offset`` ends each with an
    ABORT marker; the last stable offsets reach the high watermarks and a read_committed
    consumer reads everything committed after them."""
    b = unverified
    t = new_topic(b, "hanging")
    tid = f"hang-{uuid.uuid4().hex[:6]}"
    with WireClient.to(b.bootstrap) as wc:
        ghost = 424_242
        assert produce(wc, "nobody", t, 0, txn_batch(ghost, 3, 0, [b"ghost"])).error_code == 0
        pid, epoch = init_producer(wc, tid)
        add_partitions(wc, tid, pid, epoch, t, [2])
        assert produce(wc, tid, t, 1, txn_batch(pid, epoch, 0, [b"stray"])).error_code == 0
        assert produce(wc, tid, t, 2, txn_batch(pid, epoch, 0, [b"open"])).error_code == 0
        for p in (0, 1):
            assert produce(wc, None, t, p, plain(b"after-%d" % p)).error_code == 0
            assert offsets(wc, t, p) == (2, 0)  # pinned: read_committed sees nothing
    assert read_to_end(b.bootstrap, t, 3, "read_committed", 10) == []
    node = int(b.call(lambda broker: broker.node_id))
    args = ("--broker-id", str(node), "--max-transaction-timeout", "0",
            "--bootstrap-server", b.bootstrap)
    found = json.loads(ok("transactions", "find-hanging", *args, "--format", "json").stdout)
    assert sorted((r["topic"], r["partition"], r["producer_id"], r["producer_epoch"],
                   r["coordinator_epoch"], r["start_offset"]) for r in found) == [
        (t, 0, ghost, 3, -1, 0), (t, 1, pid, epoch, -1, 0)]
    lines = ok("transactions", "find-hanging", *args).stdout.splitlines()
    assert lines[0].split() == ["Topic", "Partition", "ProducerId", "ProducerEpoch",
                                "CoordinatorEpoch", "StartOffset", "LastTimestamp",
                                "Duration(min)"]
    assert sorted(line.split()[:6] for line in lines[1:]) == [
        [t, "0", str(ghost), "3", "-1", "0"], [t, "1", str(pid), str(epoch), "-1", "0"]]
    # scoped to a topic and partition alike
    one = json.loads(ok("transactions", "find-hanging", "--topic", t, "--partition", "1",
                        "--max-transaction-timeout", "0", "--bootstrap-server",
                        b.bootstrap, "--format", "json").stdout)
    assert [(r["partition"], r["producer_id"]) for r in one] == [(1, pid)]
    # nothing open for more than 15 minutes (the default)
    assert json.loads(ok("transactions", "find-hanging", "--broker-id", str(node),
                         "--bootstrap-server", b.bootstrap, "--format", "json").stdout) == []

    r = run("transactions", "abort", "--topic", t, "--partition", "0", "--start-offset", "1",
            "--bootstrap-server", b.bootstrap)
    assert r.exit_code == 1 and "no open transaction starts at offset 1" in r.stderr
    for p in (0, 1):
        out = ok("transactions", "abort", "--topic", t, "--partition", str(p),
                 "--start-offset", "0", "--bootstrap-server", b.bootstrap).stdout
        assert "Aborted the transaction of producer" in out
    with WireClient.to(b.bootstrap) as wc:
        for p in (0, 1):
            _wait(lambda p=p: offsets(wc, t, p) == (3, 3), f"{t}-{p} unpinned")
    assert sorted(read_to_end(b.bootstrap, t, 3, "read_committed")) == [b"after-0",
                                                                         b"after-1"]
    assert json.loads(ok("transactions", "find-hanging", *args, "--format",
                         "json").stdout) == []
    with WireClient.to(b.bootstrap) as wc:
        end_txn(wc, tid, pid, epoch, commit=True)  # the real transaction still commits
    assert sorted(read_to_end(b.bootstrap, t, 3, "read_committed")) == [
        b"after-0", b"after-1", b"open"]


def test_the_tools_refuse_what_they_cannot_do(unverified: InProcessBroker) -> None:
    b = unverified
    r = run("transactions", "find-hanging", "--bootstrap-server", b.bootstrap)
    assert r.exit_code == 1 and "--topic or --broker-id" in r.stderr
    r = run("transactions", "find-hanging", "--broker-id", "77", "--bootstrap-server",
            b.bootstrap)
    assert r.exit_code == 1 and "broker 77 is not in the cluster" in r.stderr
    r = run("transactions", "abort", "--topic", "no-such-topic", "--partition", "0",
            "--start-offset", "0", "--bootstrap-server", b.bootstrap)
    assert r.exit_code == 1 and "unknown partition no-such-topic-0" in r.stderr
    r = run("transactions", "abort", "--topic", "x", "--partition", "0",
            "--bootstrap-server", b.bootstrap)
    assert r.exit_code == 1 and "--start-offset" in r.stderr
