"""Idempotent-producer deduplication survives a kill -9 of the broker (R-PROTO-7, R-LOG-4).

A producer whose batch was written but whose response was lost (the broker died) retries
the same (producer id, epoch, sequence) batch after the broker restarts. The broker,
restarted from kill -9 (no shutdown, no checkpoint written), must rebuild the producer's
state from the log and answer the retry with the batch's ORIGINAL offsets, appending
nothing; the sequence carries on; a gap is still refused; and a producer id handed out
before the crash is never handed out again (a new producer reusing it would have its first
batches taken for duplicates and silently dropped).

The wire is driven by ``WireClient`` (real RecordBatch v2 bytes from ``tests/batches.py``)
so the test sees exactly what the broker answers to each retry; then confluent-kafka's
idempotent producer does the same for real, behind a proxy that withholds the broker's
responses so that its batches are written but never acknowledged before the kill.
kill -9 keeps the page cache: this tests recovery of the producer state, not fsync.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tests.batches import make_batch
from tests.brokerproc import BrokerProcess
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.timeout(60)

TOPIC = "idem-kill"
BASE_TS = (int(time.time()) - 60) * 1000
EARLIEST, LATEST = -2, -1


def init_pid(wc: WireClient) -> tuple[int, int]:
    r = wc.request(22, 4, {"transactional_id": None, "transaction_timeout": 60_000,
                           "producer_id": -1, "producer_epoch": -1})
    assert r.error_code == ErrorCode.none
    return int(r.producer_id), int(r.producer_epoch)


def batch(pid: int, epoch: int, seq: int, n: int, tag: str) -> bytes:
    return make_batch([(None, f"{tag}-{seq + i}".encode(), BASE_TS + seq + i, [])
                       for i in range(n)],
                      producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def produce(wc: WireClient, records: bytes) -> tuple[int, int]:
    """(error code, base offset) of a Produce v9 acks=all of one batch to partition 0."""
    resp = wc.request(0, 9, {"transactional_id": None, "acks": -1, "timeout": 10_000,
                             "topic_data": [{"name": TOPIC, "partition_data": [
                                 {"index": 0, "records": records}]}]})
    (p,) = resp.responses[0].partition_responses
    return int(p.error_code), int(p.base_offset)


def log_end(wc: WireClient) -> tuple[int, int]:
    out = []
    for ts in (EARLIEST, LATEST):
        resp = wc.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": ts}]}]})
        (p,) = resp.topics[0].partitions
        assert p.error_code == ErrorCode.none
        out.append(int(p.offset))
    return out[0], out[1]


def values(wc: WireClient) -> list[tuple[int, bytes | None]]:
    from aiokafka.record.memory_records import MemoryRecords

    resp = wc.request(1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
        "isolation_level": 0, "forgotten_topics_data": [],
        "topics": [{"topic": TOPIC, "partitions": [{
            "partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
    (p,) = resp.responses[0].partitions
    assert p.error_code == ErrorCode.none
    out: list[tuple[int, bytes | None]] = []
    mr = MemoryRecords(bytes(p.records or b""))
    while (b := mr.next_batch()) is not None:
        out.extend((r.offset, r.value) for r in b)
    return out


def create_topic(wc: WireClient) -> None:
    resp = wc.request(19, 7, {"topics": [{
        "name": TOPIC, "num_partitions": 1, "replication_factor": 1, "assignments": [],
        "configs": []}], "timeout": 10_000, "validate_only": False})
    assert resp.topics[0].error_code == ErrorCode.none, resp.topics[0].error_message


def test_retried_batches_after_kill_9_get_their_original_offsets(data_dir: Path) -> None:
    """R-PROTO-7 across kill -9: each of the last five batches retried after the restart is
    answered with its original offset and not stored again; the next sequence is appended,
    a gap refused; the log holds every record once."""
    b = BrokerProcess(data_dir).start()
    try:
        with WireClient.to(b.bootstrap) as wc:
            create_topic(wc)
            pid, epoch = init_pid(wc)
            sent: list[tuple[bytes, int]] = []  # (batch bytes, original base offset)
            seq = 0
            for n in (3, 2, 4, 1, 5, 2):  # six batches: the last five are retryable
                data = batch(pid, epoch, seq, n, "a")
                err, base = produce(wc, data)
                assert err == ErrorCode.none
                sent.append((data, base))
                seq += n
            assert [base for _, base in sent] == [0, 3, 5, 9, 10, 15]
            assert log_end(wc) == (0, 17)

        b.kill()  # SIGKILL: no shutdown, no producer-state checkpoint
        b.start()

        with WireClient.to(b.bootstrap) as wc:
            # the retries: newest first, as a producer with five in flight may resend them
            for data, base in reversed(sent[1:]):
                assert produce(wc, data) == (ErrorCode.none, base), (
                    f"retry of the batch at {base} not recognised after kill -9")
            assert log_end(wc) == (0, 17), "a retried batch was appended again"
            # the sequence goes on; a gap is still a gap
            assert produce(wc, batch(pid, epoch, 19, 1, "a"))[0] \
                == ErrorCode.out_of_order_sequence_number
            assert produce(wc, batch(pid, epoch, 17, 2, "a")) == (ErrorCode.none, 17)
            assert values(wc) == [(i, f"a-{i}".encode()) for i in range(19)]

            # a new producer gets a new id: its first batch is new data, never a "duplicate"
            pid2, epoch2 = init_pid(wc)
            assert pid2 != pid, "a producer id in use before the crash was handed out again"
            assert produce(wc, batch(pid2, epoch2, 0, 3, "b")) == (ErrorCode.none, 19)
            assert log_end(wc) == (0, 22)
        assert not [line for line in b.stderr_lines if "Traceback" in line], \
            "".join(b.stderr_lines)
    finally:
        b.kill()


class ResponseHoldingProxy:
    """A TCP proxy in front of the broker that can withhold the broker's responses.

    While ``hold`` is set, requests still reach the broker but its responses are dropped:
    the broker writes the batches, the producer never hears so. Closing every connection
    (``drop_all``) then makes the producer retry those batches on new connections.
    """

    def __init__(self) -> None:
        import socket
        import threading

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.upstream_port = 0
        self.hold = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), 5)
                upstream.settimeout(None)  # a held connection is quiet for as long as it likes
            except OSError:
                client.close()  # the broker is down: the client retries later
                continue
            with self._lock:
                self._socks += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True),
                             daemon=True).start()

    def _pipe(self, src: Any, dst: Any, responses: bool) -> None:
        import socket

        try:
            while data := src.recv(65536):
                if not (responses and self.hold.is_set()):
                    dst.sendall(data)
        except OSError:
            pass  # either side closed: close both below
        for s in (src, dst):  # shutdown first: it wakes the other thread's recv
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def drop_all(self) -> None:
        import socket

        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self.listener.close()
        self.drop_all()


def test_idempotent_producer_retries_unacknowledged_batches_after_kill_9(
        data_dir: Path) -> None:
    """R-PROTO-7, R-LOG-4 with a real client: confluent-kafka's idempotent producer sends
    batches the broker writes but whose responses never arrive (a proxy withholds them);
    the broker is killed with kill -9 and restarted on the same data dir; the producer
    retries those batches, and the broker must answer them as duplicates: every record is
    in the log exactly once, at the offset it was acknowledged with."""
    import threading

    from confluent_kafka import Producer

    from tests.brokerproc import wait_until
    from tests.clients import consume

    proxy = ResponseHoldingProxy()
    # clients learn the broker's address from its metadata: advertise the proxy
    b = BrokerProcess(data_dir, {"advertised.port": str(proxy.port)}).start()
    proxy.upstream_port = b.port
    p = None
    try:
        with WireClient.to(b.bootstrap) as wc:
            create_topic(wc)
        acked: dict[bytes, int] = {}
        errors: list[Any] = []
        lock = threading.Lock()
        # An idempotent producer keeps at most 5 requests in flight: the 1,000 records
        # sent while answers are held must fit in 5 batches, or the sixth waits for an
        # answer that never comes (loaded runs, twice: the loop outlasted a 5 ms linger,
        # 5 batches were written, 29 records never sent). flush() does not wait out linger.
        p = Producer({"bootstrap.servers": f"127.0.0.1:{proxy.port}",
                      "enable.idempotence": True, "linger.ms": 1000,
                      "message.timeout.ms": 45_000, "reconnect.backoff.ms": 50,
                      "reconnect.backoff.max.ms": 200})

        def on_delivery(err: Any, msg: Any) -> None:
            with lock:
                if err is None:
                    acked[msg.value()] = msg.offset()
                else:
                    errors.append(err)

        def send(first: int, n: int) -> None:
            assert p is not None
            for i in range(first, first + n):
                p.produce(TOPIC, f"r-{i:06d}".encode(), partition=0, on_delivery=on_delivery)
            p.poll(0)

        def written() -> int:
            with WireClient.to(b.bootstrap) as wc:
                return log_end(wc)[1]

        send(0, 1000)
        assert p.flush(30) == 0 and len(acked) == 1000 and not errors

        proxy.hold.set()  # from now on the broker's answers are lost
        send(1000, 1000)
        try:
            wait_until(lambda: p.poll(0) is not None and written() == 2000, 30, 0.05,
                       "the unacknowledged batches written by the broker")
        except AssertionError as e:  # loaded run 6 (once): the broker's side of it
            raise AssertionError(f"{e}; written {written()}; the broker's log:\n"
                                 + "".join(b.stderr_lines[-40:])) from None
        assert len(acked) == 1000, "a response got through the proxy"

        b.kill()  # SIGKILL: the batches are in the log, their producer state is not saved
        proxy.drop_all()
        proxy.hold.clear()
        b.start()  # same port: the proxy reaches it again
        assert p.flush(45) == 0
        assert not errors, errors[:3]
        assert len(acked) == 2000

        got = consume("confluent", b.bootstrap, TOPIC, [0], 2000, timeout_s=30)
        offsets = {r.value: r.offset for r in got}
        assert len(got) == len(offsets), (
            f"{len(got) - len(offsets)} records stored twice: the retries were not deduped")
        assert len(got) == 2000
        with WireClient.to(b.bootstrap) as wc:
            assert log_end(wc) == (0, 2000)
        assert offsets == acked  # each at the offset it was acknowledged with
        assert not [line for line in b.stderr_lines if "Traceback" in line], \
            "".join(b.stderr_lines)
    finally:
        if p is not None:
            p.flush(0)
        proxy.close()
        b.kill()
