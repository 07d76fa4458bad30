"""Transactions on a 3-broker cluster (issue 10; R-PROD-2): markers reach partitions led
by other brokers (WriteTxnMarkers); a transactional producer stays exactly once while the
transaction coordinator's broker and a partition leader are killed; and a
consume-transform-produce loop (tests/txn_worker.py) stays exactly once while the
transaction coordinator, an output leader and the group coordinator are killed -9, the
worker itself is killed -9 and restarted, and a paused worker comes back as a zombie."""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from tests.brokerproc import wait_until
from tests.clients import Rec, produce, read_to_end
from tests.clusterproc import Cluster
from tests.txn_worker import HUNG_EXIT
from tests.workerproc import WorkerProcess

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("cluster")]

PARTS = 3


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def read_all(cluster: Cluster, name: str, isolation: str, timeout_s: float = 60) -> list[bytes]:
    return read_to_end(cluster.live_bootstrap(), name, PARTS, isolation, timeout_s)


def txn_producer(cluster: Cluster, tid: str) -> Producer:
    p = Producer({"bootstrap.servers": cluster.live_bootstrap(), "transactional.id": tid,
                  "linger.ms": 2, "transaction.timeout.ms": 20_000})
    p.init_transactions(60)
    return p


def test_markers_reach_every_leader(healthy: Cluster) -> None:
    """A transaction over partitions led by all three brokers commits (and one aborts)
    wherever the coordinator is."""
    cluster = healthy
    out = _topic("txout")
    cluster.create_topic(out, PARTS, 3, {"min.insync.replicas": "2"})
    leaders = {cluster.wait_leader(out, p) for p in range(PARTS)}
    assert len(leaders) > 1  # the markers cross brokers
    p = txn_producer(cluster, _topic("tid"))
    p.begin_transaction()
    for i in range(30):
        p.produce(out, b"c%d" % i, partition=i % PARTS)
    p.commit_transaction(60)
    p.begin_transaction()
    for i in range(30):
        p.produce(out, b"a%d" % i, partition=i % PARTS)
    p.flush(60)
    p.abort_transaction(60)
    assert sorted(read_all(cluster, out, "read_committed")) == sorted(
        b"c%d" % i for i in range(30))
    assert len(read_all(cluster, out, "read_uncommitted")) == 60


def _coordinator(cluster: Cluster, key: str, key_type: int = 1) -> int:
    """The broker FindCoordinator names for ``key`` (key type 1: a transactional id, 0: a
    group), asked of the live brokers until one answers."""
    from tests.kafka_wire import WireClient

    def find() -> int | None:
        for b in cluster.brokers.values():
            if not b.alive:
                continue
            try:
                with WireClient.to(b.address) as wc:
                    r = wc.request(10, 4, {"key_type": key_type, "coordinator_keys": [key]})
            except OSError:
                continue
            c = r.coordinators[0]
            if int(c.error_code) == 0 and int(c.node_id) > 0:
                return int(c.node_id)
        return None

    return int(wait_until(find, 30, 0.2, f"the coordinator of {key!r}"))


def test_exactly_once_while_the_coordinator_and_a_leader_are_killed(healthy: Cluster) -> None:
    cluster = healthy
    out = _topic("eo")
    cluster.create_topic(out, PARTS, 3, {"min.insync.replicas": "2"})
    tid = _topic("eo-tid")
    p = txn_producer(cluster, tid)
    committed: list[bytes] = []
    victims: list[int] = []
    i = 0
    deadline = time.monotonic() + 180
    while len(committed) < 600:
        assert time.monotonic() < deadline, f"{len(committed)} committed; killed {victims}"
        if len(committed) >= 200 and not victims:
            victims.append(_coordinator(cluster, tid))
            cluster.brokers[victims[0]].kill()
        if len(committed) >= 400 and len(victims) == 1:
            cluster.brokers[victims[0]].start()
            leader = cluster.wait_leader(out, 0)
            victims.append(leader)
            cluster.brokers[leader].kill()
        batch = [b"r%d" % (i + k) for k in range(20)]
        i += len(batch)
        p.begin_transaction()
        for k, v in enumerate(batch):
            p.produce(out, v, partition=k % PARTS)
        while True:  # librdkafka's rules: retry a retriable commit, abort an abortable one
            assert time.monotonic() < deadline
            try:
                p.commit_transaction(60)
                committed += batch
                break
            except KafkaException as e:
                err: Any = e.args[0]
                if err.retriable():
                    continue
                if err.txn_requires_abort():
                    p.abort_transaction(60)
                    break  # nothing of it may be read committed
                raise
    for b in cluster.brokers.values():
        if not b.alive:
            b.start()
    got = read_all(cluster, out, "read_committed", timeout_s=90)
    assert sorted(got) == sorted(committed), (len(got), len(committed), victims)


def _full_isr(cluster: Cluster, topics: list[str], timeout_s: float = 60) -> None:
    """Every partition of ``topics`` led and with all its replicas in sync (a restarted
    broker has caught up: the next kill leaves min.insync.replicas = 2 everywhere)."""
    def ok() -> bool:
        for t in topics:
            try:
                parts = cluster.describe(t)
            except Exception:
                return False
            if not parts or any(
                    int(p.leader) < 0 or {int(r) for r in p.isrs} != {int(r) for r in p.replicas}
                    for p in parts.values()):
                return False
        return True

    wait_until(ok, timeout_s, 0.2, f"every replica of {topics} in sync")


def test_consume_transform_produce_is_exactly_once_while_brokers_and_worker_are_killed(
        healthy: Cluster, tmp_path: Path) -> None:
    """The issue's cluster check: the transactional consume-transform-produce loop
    (tests/txn_worker.py, confluent-kafka, send_offsets_to_transaction) runs while the
    transaction coordinator's broker, an output partition's leader and the group
    coordinator are killed -9 (one at a time, each restarted and back in every ISR before
    the next); the worker itself is killed -9 mid-stream and replaced by one with the same
    transactional id (which aborts the first's open transaction), and one worker is paused
    (SIGSTOP) while a successor takes over, then resumed: that zombie must be fenced.
    read_committed output holds every input record exactly once."""
    cluster = healthy
    n = 3_000
    source, sink = _topic("ctp-in"), _topic("ctp-out")
    for t in (source, sink):
        cluster.create_topic(t, PARTS, 3, {"min.insync.replicas": "2"})
    group, tid = _topic("ctp-g"), _topic("ctp-tid")
    placed = produce("confluent", cluster.live_bootstrap(), source,
                     [Rec(i % PARTS, None, b"v%d" % i) for i in range(n)],
                     extra={"enable.idempotence": True})
    expected = Counter(b"%d:%d:v%d" % (p, o, i) for i, (p, o) in enumerate(placed))
    assert len(expected) == n and all(o >= 0 for _, o in placed)

    def committed() -> int:
        """Input offsets the group committed, summed (-1: not answered now)."""
        c = Consumer({"bootstrap.servers": cluster.live_bootstrap(), "group.id": group,
                      "socket.connection.setup.timeout.ms": 2000})
        try:
            got = c.committed([TopicPartition(source, p) for p in range(PARTS)], timeout=5)
        except KafkaException:
            return -1
        finally:
            c.close()
        if any(tp.error is not None for tp in got):
            return -1
        return sum(max(tp.offset, 0) for tp in got)

    workers: list[WorkerProcess] = []
    events: list[str] = []

    def start_worker() -> WorkerProcess:
        # transactions of at most 20 records, each open 0.25 s: about 150 of them, so
        # every fault lands on a running stream
        w = WorkerProcess([sys.executable, "-m", "tests.txn_worker", cluster.bootstrap, source,
                           sink, group, tid, "0.25", "20"],
                          tmp_path / f"worker-{len(workers)}.log").start()
        workers.append(w)
        return w

    def logs() -> str:
        return "\n".join(f"--- {w.log.name}:\n{w.log_text()[-1500:]}" for w in workers)

    def worker() -> WorkerProcess:
        """The running worker. One that exited HUNG_EXIT (librdkafka blocked for good in
        a transactional call: see tests/txn_worker.py) is replaced, as a supervisor
        would; any other exit fails the test."""
        w = workers[-1]
        assert w.proc is not None
        if w.proc.poll() == HUNG_EXIT:
            events.append(f"worker {len(workers) - 1} hung in librdkafka, replaced")
            w = start_worker()
        assert w.proc is not None and w.proc.poll() is None, (
            f"worker exited {w.proc.returncode}; {events}\n{logs()}")
        return w

    def progress() -> int:
        """The committed offsets, waited for (bounded) while the group cannot answer."""
        return int(wait_until(lambda: (c := committed()) >= 0 and worker() and c + 1, 60,
                              0.2, f"the group's committed offsets; {events}")) - 1

    def advance(by: int, what: str) -> None:
        """Wait (bounded) until the group's committed offsets moved ``by`` records on;
        the stream must not have ended yet when a fault is about to be injected."""
        start = progress()
        assert start < n, f"the stream ended before {what}; {events}"
        wait_until(lambda: worker() and committed() >= start + by, 90, 0.3,
                   f"{by} more records committed {what}; {events}\n{logs()}")

    def kill_broker(victim: int, role: str) -> None:
        events.append(f"killed broker {victim} ({role}) at {progress()}")
        cluster.brokers[victim].kill()
        advance(60, f"with broker {victim} ({role}) down")
        cluster.brokers[victim].start()
        _full_isr(cluster, [source, sink, "__consumer_offsets", "__transaction_state"])

    start_worker()
    try:
        advance(200, "by the first worker")
        # 1. the transaction coordinator's broker
        kill_broker(_coordinator(cluster, tid), "transaction coordinator")
        # 2. the worker itself, inside a transaction; its successor aborts that one
        advance(40, "after the coordinator came back")
        events.append(f"killed the worker at {progress()}")
        worker().kill9()
        start_worker()
        advance(60, "by the second worker")
        # 3. an output partition's leader (one that is not the group coordinator, if any)
        gc = _coordinator(cluster, group, key_type=0)
        leaders = [cluster.wait_leader(sink, p) for p in range(PARTS)]
        victim = next((b for b in leaders if b != gc), gc)
        kill_broker(victim, "output leader" + (" and group coordinator" if victim == gc
                                               else ""))
        # 4. the group coordinator (the leader of the group's __consumer_offsets
        # partition), unless step 3 was it
        if victim != gc:
            kill_broker(_coordinator(cluster, group, key_type=0), "group coordinator")
        # 5. a zombie: the worker paused, a successor takes over, the first resumes; it
        # must be fenced (a fatal error: exit 1) and what it writes never committed
        zombie = worker()
        events.append(f"paused the worker at {progress()}")
        zombie.pause()
        start_worker()
        advance(60, "by the zombie's successor")
        zombie.resume()
        assert zombie.proc is not None
        wait_until(lambda: zombie.proc.poll() is not None, 60, 0.2,
                   f"the zombie to be fenced; {events}\n{logs()}")
        assert zombie.proc.returncode == 1, logs()
        assert "fenced" in zombie.log_text().lower(), logs()
        wait_until(lambda: worker() and committed() == n, 120, 0.3,
                   f"the worker to commit every input offset; {events}\n{logs()}")
    finally:
        for x in workers:
            x.stop()
    got = Counter(read_all(cluster, sink, "read_committed", timeout_s=90))
    missing, doubled = expected - got, got - expected
    assert not missing and not doubled, (
        f"{sum(missing.values())} missing, e.g. {sorted(missing)[:5]}; "
        f"{sum(doubled.values())} extra, e.g. "
        f"{sorted(doubled)[:5]}; {events}\n{logs()}")
    # read_uncommitted also holds what the killed worker and the aborted transactions wrote
    everything = Counter(read_all(cluster, sink, "read_uncommitted", timeout_s=90))
    assert not expected - everything, (sum((expected - everything).values()), events)


def test_a_transactions_first_batch_is_verified_by_a_coordinator_on_another_broker(
        healthy: Cluster) -> None:
    """KIP-890 on a cluster (issue 23): the leader of a partition asks the transaction
    coordinator on another broker (AddPartitionsToTxn v4, verify_only) before it appends
    the first batch of a producer's transaction there. A partition not yet added is
    refused (INVALID_TXN_STATE), a producer id the coordinator did not give this id
    too (INVALID_PRODUCER_ID_MAPPING); once added it is verified and takes the batch, the
    transaction commits, and the partition's last stable offset follows. librdkafka's
    transaction with that coordinator commits too."""
    from kio.schema.errors import ErrorCode

    from tests.kafka_wire import WireClient
    from tests.txn_wire import (
        add_partitions,
        coordinator,
        end_txn,
        init_producer,
        offsets,
        txn_batch,
    )
    from tests.txn_wire import produce as txn_produce

    cluster = healthy
    out = _topic("verify")
    cluster.create_topic(out, PARTS, 3, {"min.insync.replicas": "2"})
    leader = cluster.wait_leader(out, 0)
    with WireClient.to(cluster.brokers[leader].address, timeout_s=30) as lw:
        for _ in range(200):  # a transactional id coordinated elsewhere
            tid = _topic("vtid")
            node, host, port = coordinator(lw, tid)
            if node != leader:
                break
        assert node != leader
        with WireClient(host, port, timeout_s=30) as cw:
            pid, epoch = init_producer(cw, tid)
            add_partitions(cw, tid, pid, epoch, out, [1])
            r = txn_produce(lw, tid, out, 0, txn_batch(pid, epoch, 0, [b"stray"]))
            assert r.error_code == ErrorCode.invalid_txn_state, ErrorCode(r.error_code).name
            r = txn_produce(lw, tid, out, 0, txn_batch(pid + 77_777, 0, 0, [b"ghost"]))
            assert r.error_code == ErrorCode.invalid_producer_id_mapping
            assert offsets(lw, out, 0) == (0, 0)
            add_partitions(cw, tid, pid, epoch, out, [0])
            r = txn_produce(lw, tid, out, 0, txn_batch(pid, epoch, 0, [b"in-0", b"in-1"]))
            assert r.error_code == ErrorCode.none, ErrorCode(r.error_code).name
            assert offsets(lw, out, 0) == (2, 0)  # open
            end_txn(cw, tid, pid, epoch, commit=True)
        wait_until(lambda: offsets(lw, out, 0) == (3, 3), 60, what="the commit marker")
    p = Producer({"bootstrap.servers": cluster.live_bootstrap(), "transactional.id": tid,
                  "linger.ms": 2, "transaction.timeout.ms": 20_000})
    p.init_transactions(60)
    p.begin_transaction()
    for i in range(6):
        p.produce(out, b"rdk-%d" % i, partition=i % PARTS)
    p.commit_transaction(60)
    got = read_all(cluster, out, "read_committed")
    assert sorted(got) == sorted([b"in-0", b"in-1"] + [b"rdk-%d" % i for i in range(6)])
