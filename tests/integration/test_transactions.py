"""Transactions with real clients over TCP against a broker process (issue 10; R-PROD-2,
R-PROTO-7): commit and abort seen through read_committed and read_uncommitted,
consume-transform-produce with send_offsets_to_transaction killed with -9 and restarted
(exactly once), zombie fencing, a hung transaction aborted after its timeout (the LSO
advances), the same loop with kafka-python and aiokafka, DescribeTransactions and
ListTransactions."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from tests.brokerproc import BrokerProcess, wait_until
from tests.clients import create_topic, read_to_end
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient
from tests.workerproc import WorkerProcess

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def txb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """In process: the tests kill clients (worker processes), never this broker."""
    with InProcessBroker(tmp_path_factory.mktemp("txn"), {
            "num.partitions": "2",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "300"}) as b:
        yield b
        text = "".join(b.stderr_lines)
        assert "Traceback" not in text, text[-3000:]


def topic(b: BrokerProcess | InProcessBroker, prefix: str, partitions: int = 2) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic("confluent", b.bootstrap, name, partitions)
    return name


def txn_producer(b: BrokerProcess | InProcessBroker, tid: str, **extra: Any) -> Producer:
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": tid, "linger.ms": 2,
                  **extra})
    p.init_transactions(30)
    return p


def read_all(b: BrokerProcess | InProcessBroker, name: str, isolation: str, partitions: int = 2,
             timeout_s: float = 30) -> list[bytes]:
    """Every record of ``name`` up to its end (the LSO for read_committed)."""
    return read_to_end(b.bootstrap, name, partitions, isolation, timeout_s)


def test_commit_and_abort_as_each_isolation_level_sees_them(txb: InProcessBroker) -> None:
    out = topic(txb, "iso")
    p = txn_producer(txb, f"iso-{uuid.uuid4().hex[:6]}")
    p.begin_transaction()
    for i in range(6):
        p.produce(out, b"c%d" % i, partition=i % 2)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(6):
        p.produce(out, b"a%d" % i, partition=i % 2)
    p.flush(30)  # on the broker before the abort
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(out, b"d0", partition=0)
    p.commit_transaction(30)
    committed = read_all(txb, out, "read_committed")
    everything = read_all(txb, out, "read_uncommitted")
    assert sorted(committed) == sorted([b"c%d" % i for i in range(6)] + [b"d0"])
    assert sorted(everything) == sorted(committed + [b"a%d" % i for i in range(6)])


def test_killed_consume_transform_produce_is_exactly_once(txb: InProcessBroker,
                                                         tmp_path: Path) -> None:
    """The issue's first check: kill -9 mid-stream, restart; the output read with
    read_committed holds each input record exactly once."""
    source, sink = topic(txb, "in"), topic(txb, "out")
    group, tid = f"g-{uuid.uuid4().hex[:6]}", f"ctp-{uuid.uuid4().hex[:6]}"
    n = 3_000
    plain = Producer({"bootstrap.servers": txb.bootstrap, "linger.ms": 5})
    for i in range(n):
        plain.produce(source, b"v%d" % i, partition=i % 2)
    assert plain.flush(30) == 0
    args = [sys.executable, "-m", "tests.txn_worker", txb.bootstrap, source, sink, group, tid]
    log = tmp_path / "worker.log"

    def committed() -> int:
        # read_uncommitted: librdkafka then sends OffsetFetch without require_stable (KIP-447).
        # A worker killed between TxnOffsetCommit and EndTxn leaves offsets pending until the
        # restarted worker fences it (or transaction.timeout.ms ends it); a read_committed
        # consumer's committed() is answered UNSTABLE_OFFSET_COMMIT, retries and times out.
        c = Consumer({"bootstrap.servers": txb.bootstrap, "group.id": group,
                      "isolation.level": "read_uncommitted"})
        try:
            got = c.committed([TopicPartition(source, p) for p in range(2)], timeout=10)
        finally:
            c.close()
        return sum(max(tp.offset, 0) for tp in got)

    # 60 transactions of 50 records, 50 ms apart: killed after a quarter, well before the end
    w = WorkerProcess([*args, "0.05"], log).start()
    try:
        wait_until(lambda: w.alive() and committed() >= n // 4, 60, 0.1,
                   "the worker's first transactions")
        w.kill9()
        at_kill = committed()
        assert at_kill < n, "the worker had finished before it was killed"
        w = WorkerProcess(args, log).start()
        wait_until(lambda: w.alive() and committed() == n, 120, 0.5,
                   "the restarted worker to commit every input offset")
    finally:
        w.stop()
    out = read_all(txb, sink, "read_committed")
    keys = [v.split(b":", 2)[2] for v in out]
    assert len(keys) == n and set(keys) == {b"v%d" % i for i in range(n)}, (
        len(keys), len(set(keys)), log.read_text()[-2000:])
    # read_uncommitted also sees whatever the killed worker had written in its open
    # transaction (aborted when the restarted one fenced it)
    assert len(read_all(txb, sink, "read_uncommitted")) >= n


def test_a_second_producer_fences_the_first(txb: InProcessBroker) -> None:
    """Zombie fencing: a second producer with the same transactional id fences the first;
    the first's open transaction is aborted and it cannot commit."""
    out = topic(txb, "zombie")
    tid = f"z-{uuid.uuid4().hex[:6]}"
    zombie = txn_producer(txb, tid)
    zombie.begin_transaction()
    zombie.produce(out, b"zombie", partition=0)
    zombie.flush(30)
    fresh = txn_producer(txb, tid)
    fresh.begin_transaction()
    fresh.produce(out, b"fresh", partition=0)
    fresh.commit_transaction(30)
    with pytest.raises(KafkaException) as e:
        zombie.commit_transaction(10)
    assert e.value.args[0].fatal() or e.value.args[0].code() in (
        KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    assert read_all(txb, out, "read_committed") == [b"fresh"]
    assert sorted(read_all(txb, out, "read_uncommitted")) == [b"fresh", b"zombie"]


def test_a_hung_transaction_is_aborted_after_its_timeout(txb: InProcessBroker) -> None:
    """A producer that never ends its transaction holds read_committed consumers back at
    its first record only until transaction.timeout.ms: then the coordinator aborts it and
    the LSO moves on."""
    out = topic(txb, "hung", partitions=1)
    hung = txn_producer(txb, f"h-{uuid.uuid4().hex[:6]}", **{"transaction.timeout.ms": 2000})
    hung.begin_transaction()
    hung.produce(out, b"hung", partition=0)
    hung.flush(30)
    started = time.monotonic()
    plain = Producer({"bootstrap.servers": txb.bootstrap})
    plain.produce(out, b"after", partition=0)
    assert plain.flush(30) == 0
    # until the abort, read_committed stops before the hung record
    assert read_all(txb, out, "read_committed", partitions=1) == []
    wait_until(lambda: read_all(txb, out, "read_committed", partitions=1) == [b"after"], 30,
               0.3, "the hung transaction to be aborted")
    assert time.monotonic() - started >= 1.5  # not before its timeout
    with pytest.raises(KafkaException):
        hung.commit_transaction(10)


def _txn_state(b: InProcessBroker, tid: str) -> str:
    with WireClient.to(b.bootstrap) as wc:
        return str(wc.request(65, 0, {"transactional_ids": [tid]})
                   .transaction_states[0].transaction_state)


def test_send_offsets_after_a_timed_out_transaction_is_fatal(txb: InProcessBroker) -> None:
    """Issue 27 item 1 (Quix Streams' ``test_produce_transaction_timeout_no_abort``): the
    coordinator aborts a transaction past ``transaction.timeout.ms`` and fences its
    producer; ``send_offsets_to_transaction`` (librdkafka sends AddOffsetsToTxn v0) is then
    a fatal error, INVALID_PRODUCER_EPOCH at v0-v1 as Kafka answers (KIP-588), not an
    abortable one that an abort-and-retry loop would keep using the zombie after."""
    out = topic(txb, "timedout", partitions=1)
    tid = f"to-{uuid.uuid4().hex[:6]}"
    p = txn_producer(txb, tid, **{"transaction.timeout.ms": 1000})
    p.begin_transaction()
    p.produce(out, b"late", partition=0)
    assert p.flush(30) == 0
    wait_until(lambda: _txn_state(txb, tid) == "CompleteAbort", 30, 0.1,
               "the coordinator to abort the timed-out transaction")
    c = Consumer({"bootstrap.servers": txb.bootstrap, "group.id": f"g-{tid}"})
    try:
        with pytest.raises(KafkaException) as e:
            p.send_offsets_to_transaction([TopicPartition(out, 0, 1)],
                                          c.consumer_group_metadata(), 10)
    finally:
        c.close()
    err = e.value.args[0]
    assert err.fatal() and not err.txn_requires_abort(), err


def test_aiokafka_fenced_producer_raises_producer_fenced(txb: InProcessBroker) -> None:
    """Issue 27 item 1 (aiokafka's ``test_producer_transactional_fences_off_previous``):
    aiokafka 0.14 sends AddPartitionsToTxn v0 and knows INVALID_PRODUCER_EPOCH, not
    PRODUCER_FENCED; a fenced producer's next transaction raises ProducerFenced, not
    UnknownError."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import ProducerFenced

    out = topic(txb, "aio-fence", partitions=1)
    tid = f"aiof-{uuid.uuid4().hex[:6]}"

    async def run() -> None:
        first = AIOKafkaProducer(bootstrap_servers=txb.bootstrap, transactional_id=tid)
        await first.start()
        second = AIOKafkaProducer(bootstrap_servers=txb.bootstrap, transactional_id=tid)
        await second.start()
        try:
            async with second.transaction():
                await second.send_and_wait(out, b"second", partition=0)
            with pytest.raises(ProducerFenced):
                async with first.transaction():
                    await first.send_and_wait(out, b"first", partition=0)
        finally:
            await second.stop()
            await first.stop()

    # aiokafka leaves its sender's failed future (ProducerFenced) unretrieved; asyncio
    # reports it, with its traceback, whenever it is collected: now, and not logged
    def not_fenced(record: logging.LogRecord) -> bool:
        return "ProducerFenced" not in str(record.msg) + str(getattr(record, "args", ""))

    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addFilter(not_fenced)
    try:
        asyncio.run(asyncio.wait_for(run(), 60))
        gc.collect()
    finally:
        asyncio_log.removeFilter(not_fenced)
    assert read_all(txb, out, "read_committed", partitions=1) == [b"second"]


def test_kafka_python_transactional_loop(txb: InProcessBroker) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    source, sink = topic(txb, "kp-in"), topic(txb, "kp-out")
    group = f"kp-{uuid.uuid4().hex[:6]}"
    plain = Producer({"bootstrap.servers": txb.bootstrap})
    for i in range(200):
        plain.produce(source, b"k%d" % i, partition=i % 2)
    plain.flush(30)
    producer = KafkaProducer(bootstrap_servers=txb.bootstrap,
                             transactional_id=f"kp-{uuid.uuid4().hex[:6]}")
    consumer = KafkaConsumer(bootstrap_servers=txb.bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             isolation_level="read_committed")
    tps = [KTP(source, p) for p in range(2)]
    consumer.assign(tps)
    try:
        producer.init_transactions()
        done = 0
        aborted_once = False
        deadline = time.monotonic() + 60
        while done < 200:
            assert time.monotonic() < deadline
            batch = consumer.poll(timeout_ms=500, max_records=40)
            records = [r for rs in batch.values() for r in rs]
            if not records:
                continue
            producer.begin_transaction()
            for r in records:
                producer.send(sink, r.value, partition=r.partition)
            if not aborted_once:  # one transaction aborted: its input is read again
                aborted_once = True
                producer.flush()
                producer.abort_transaction()
                for tp in tps:
                    committed = consumer.committed(tp)
                    consumer.seek(tp, committed if committed is not None else 0)
                continue
            from kafka.structs import OffsetAndMetadata
            offsets = {tp: OffsetAndMetadata(consumer.position(tp), "", -1) for tp in tps}
            producer.send_offsets_to_transaction(offsets, group)
            producer.commit_transaction()
            done += len(records)
    finally:
        producer.close()
        consumer.close()
    got = read_all(txb, sink, "read_committed")
    assert sorted(got) == sorted(b"k%d" % i for i in range(200))


def test_aiokafka_transactional_loop(txb: InProcessBroker) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATP

    source, sink = topic(txb, "aio-in"), topic(txb, "aio-out")
    group = f"aio-{uuid.uuid4().hex[:6]}"
    plain = Producer({"bootstrap.servers": txb.bootstrap})
    for i in range(150):
        plain.produce(source, b"x%d" % i, partition=i % 2)
    plain.flush(30)

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=txb.bootstrap,
                                    transactional_id=f"aio-{uuid.uuid4().hex[:6]}")
        consumer = AIOKafkaConsumer(bootstrap_servers=txb.bootstrap, group_id=group,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    isolation_level="read_committed")
        await producer.start()
        await consumer.start()
        tps = [ATP(source, p) for p in range(2)]
        consumer.assign(tps)
        try:
            done = 0
            deadline = time.monotonic() + 60
            while done < 150:
                assert time.monotonic() < deadline
                batch = await consumer.getmany(timeout_ms=500, max_records=30)
                records = [r for rs in batch.values() for r in rs]
                if not records:
                    continue
                async with producer.transaction():
                    for r in records:
                        await producer.send(sink, r.value, partition=r.partition)
                    await producer.send_offsets_to_transaction(
                        {tp: await consumer.position(tp) for tp in tps}, group)
                done += len(records)
        finally:
            await consumer.stop()
            await producer.stop()

    asyncio.run(run())
    got = read_all(txb, sink, "read_committed")
    assert sorted(got) == sorted(b"x%d" % i for i in range(150))
    c = Consumer({"bootstrap.servers": txb.bootstrap, "group.id": group})
    try:
        committed = c.committed([TopicPartition(source, p) for p in range(2)], timeout=10)
    finally:
        c.close()
    assert sum(tp.offset for tp in committed) == 150


def test_describe_and_list_transactions_on_the_wire(txb: InProcessBroker) -> None:
    out = topic(txb, "desc")
    tid = f"d-{uuid.uuid4().hex[:6]}"
    p = txn_producer(txb, tid)
    p.begin_transaction()
    p.produce(out, b"x", partition=1)
    p.flush(30)
    with WireClient.to(txb.bootstrap) as wc:
        fc = wc.request(10, 4, {"key_type": 1, "coordinator_keys": [tid]})
        assert fc.coordinators[0].error_code == ErrorCode.none
        d = wc.request(65, 0, {"transactional_ids": [tid, "nope"]})
        mine, unknown = d.transaction_states
        assert mine.error_code == ErrorCode.none and mine.transaction_state == "Ongoing"
        assert [(t.topic, list(t.partitions)) for t in mine.topics] == [(out, [1])]
        assert unknown.error_code == ErrorCode.transactional_id_not_found
        lst = wc.request(66, 1, {"state_filters": ["Ongoing"], "producer_id_filters": [],
                                 "duration_filter": -1})
        assert tid in {s.transactional_id for s in lst.transaction_states}
        bad = wc.request(66, 0, {"state_filters": ["Bogus"], "producer_id_filters": []})
        assert list(bad.unknown_state_filters) == ["Bogus"]
    p.abort_transaction(30)
    with WireClient.to(txb.bootstrap) as wc:
        d = wc.request(65, 0, {"transactional_ids": [tid]})
        assert d.transaction_states[0].transaction_state in ("PrepareAbort", "CompleteAbort")


@pytest.mark.slow  # the command line: a process per call
def test_cli_lists_and_describes_transactions(txb: InProcessBroker) -> None:
    """``headrace transactions list|describe`` (kafka-transactions.sh's columns)."""
    import subprocess

    out = topic(txb, "cli")
    tid = f"cli-{uuid.uuid4().hex[:6]}"
    p = txn_producer(txb, tid)

    def cli(*args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "headrace.cli", "transactions", *args,
                            "--bootstrap-server", txb.bootstrap], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    # Empty (just initialised): no transaction begun, its start time is "None"
    lines = cli("describe", tid).splitlines()
    assert lines[0].split()[:5] == ["CoordinatorId", "TransactionalId", "ProducerId",
                                    "ProducerEpoch", "TransactionState"]
    row = lines[1].split()
    assert row[1] == tid and row[4] == "Empty" and row[6] == "None"
    p.begin_transaction()
    p.produce(out, b"x", partition=0)
    p.flush(30)
    row = cli("describe", tid).splitlines()[1].split()
    assert row[4] == "Ongoing" and int(row[6]) > 0 and row[8] == f"{out}-0"
    listed = [line.split() for line in cli("list", "--state", "Ongoing").splitlines()[1:]]
    assert [tid, "0"] in [r[:2] for r in listed]
    p.commit_transaction(30)
    assert tid not in cli("list", "--state", "Ongoing")
    r = subprocess.run([sys.executable, "-m", "headrace.cli", "transactions", "describe",
                        "no-such-id", "--bootstrap-server", txb.bootstrap],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "TRANSACTIONAL_ID_NOT_FOUND" in r.stderr


@pytest.mark.slow
def test_kill_9_with_many_segments_keeps_transactions_through_snapshots_and_txnindexes(
    tmp_path: Path,
) -> None:
    """Item 2 on disk: commits and aborts over many segment rolls leave Kafka's
    ``N.snapshot`` and ``N.txnindex`` files; after kill -9 the restarted broker (which
    reads its state from them and the active segment, not every batch) gives read_committed
    and read_uncommitted consumers exactly what they saw before, an idempotent producer's
    sequence continues, and the transactional id works on."""
    with BrokerProcess(tmp_path / "data", {"num.partitions": "1"}) as b:
        name = f"seg-{uuid.uuid4().hex[:8]}"
        create_topic("confluent", b.bootstrap, name, 1, {"segment.bytes": "16384"})
        tid = f"seg-{uuid.uuid4().hex[:6]}"
        p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": tid,
                      "linger.ms": 2})
        p.init_transactions(30)
        for t in range(40):
            p.begin_transaction()
            for i in range(20):
                p.produce(name, b"t%d-%d-" % (t, i) + b"x" * 80, partition=0)
            if t % 3 == 1:
                p.flush(30)
                p.abort_transaction(30)
            else:
                p.commit_transaction(30)
        p.begin_transaction()  # left open across the kill
        p.produce(name, b"open", partition=0)
        p.flush(30)
        committed = read_to_end(b.bootstrap, name, 1, "read_committed", 30)
        everything = read_to_end(b.bootstrap, name, 1, "read_uncommitted", 30)
        assert len(committed) == 27 * 20 and len(everything) == 40 * 20 + 1
        pdir = b.data_dir / f"{name}-0"
        assert len(list(pdir.glob("*.log"))) > 5
        assert list(pdir.glob("*.snapshot")) and list(pdir.glob("*.txnindex"))
        b.kill()
        b.start()
        assert sorted(read_to_end(b.bootstrap, name, 1, "read_uncommitted", 30)) == sorted(
            everything)
        # the open transaction still holds read_committed back until a new producer with
        # the same id fences it (its transaction is aborted)
        again = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": tid,
                          "linger.ms": 2})
        again.init_transactions(30)
        again.begin_transaction()
        again.produce(name, b"after", partition=0)
        again.commit_transaction(30)
        assert sorted(read_to_end(b.bootstrap, name, 1, "read_committed", 30)) == sorted(
            [*committed, b"after"])
        p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
        p.produce(name, b"idem", partition=0)
        assert p.flush(30) == 0
        text = "".join(b.stderr_lines)
        assert "Traceback" not in text, text[-3000:]
