"""A transactional consume-transform-produce loop (confluent-kafka), run as its own
process by tests/integration/test_transactions.py and tests/cluster/test_transactions_cluster.py
so that it can be killed with -9.

    python -m tests.txn_worker BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID [PAUSE_S [MAX]]

Each input record (partition p, offset o) becomes one output record ``p:o:value`` in
the same transaction that commits the input offsets (send_offsets_to_transaction).
Transactions of up to MAX records (default 50), each held open PAUSE_S seconds before it
commits (so that a test's kill -9 lands inside one); runs until killed or SIGTERM.

Errors are handled as librdkafka's transactional API prescribes (brokers may die under
it): a retriable error retries the call; an abortable one aborts the transaction and
rewinds the consumer to the group's committed offsets (what the aborted transaction
consumed is transformed again); a fatal one (fenced by a newer instance) ends the process
with exit code 1.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

T = TypeVar("T")
CALL_TIMEOUT_S = 20.0  # each transactional call's own timeout
CALL_DEADLINE_S = 120.0  # retriable failures of one call retried this long
HUNG_EXIT = 3
_in_call: list[tuple[float, str]] = []  # the call under way: (start, name)


def watchdog(limit_s: float) -> None:
    """librdkafka's send_offsets_to_transaction can block past its timeout, for good,
    when the group coordinator dies during the transaction (confluentinc/librdkafka
    #5456, #5511: the coordinator request's timeout is never checked). A call blocked
    ``limit_s`` ends the process with HUNG_EXIT: like a kill -9, which the transactional
    id's next instance recovers from."""
    while True:
        time.sleep(1.0)
        started, what = _in_call[0] if _in_call else (None, "")
        if started is not None and time.monotonic() - started > limit_s:
            print(f"hung: {what} blocked {limit_s:.0f} s (its timeout: {CALL_TIMEOUT_S:.0f} s); "
                  "exiting", file=sys.stderr, flush=True)
            os._exit(HUNG_EXIT)


def retrying(what: str, call: Callable[[], T]) -> T:
    """``call`` again while it fails with a retriable error (bounded)."""
    deadline = time.monotonic() + CALL_DEADLINE_S
    while True:
        _in_call[:] = [(time.monotonic(), what)]
        try:
            return call()
        except KafkaException as e:
            err: Any = e.args[0]
            if not err.retriable() or time.monotonic() > deadline:
                raise
            print(f"retrying {what}: {err}", file=sys.stderr, flush=True)
        finally:
            _in_call.clear()


def committed_positions(consumer: Consumer, source: str, parts: list[int]
                        ) -> list[TopicPartition]:
    tps = [TopicPartition(source, p) for p in parts]
    got = retrying("committed", lambda: consumer.committed(tps, timeout=CALL_TIMEOUT_S))
    return [TopicPartition(source, tp.partition,
                           tp.offset if tp.offset >= 0 else OFFSET_BEGINNING) for tp in got]


def abort(producer: Producer, err: Any) -> bool:
    """Abort the transaction after an abortable ``err``; False after a fatal error (this
    instance fenced): the process must end."""
    if err.fatal() or not err.txn_requires_abort():
        print(f"transaction failed: {err}", file=sys.stderr, flush=True)
        return False
    print(f"aborting the transaction: {err}", file=sys.stderr, flush=True)
    try:
        retrying("abort_transaction", lambda: producer.abort_transaction(CALL_TIMEOUT_S))
    except KafkaException as e:
        print(f"abort failed: {e.args[0]}", file=sys.stderr, flush=True)
        return False
    return True


def main() -> int:
    bootstrap, source, sink, group, tid = sys.argv[1:6]
    pause_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    most = int(sys.argv[7]) if len(sys.argv) > 7 else 50
    stop = []
    threading.Thread(target=watchdog, args=(CALL_TIMEOUT_S + 10,), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    debug = {"debug": os.environ["TXN_WORKER_DEBUG"]} if os.environ.get("TXN_WORKER_DEBUG") else {}
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                         "linger.ms": 5, **debug})
    retrying("init_transactions", lambda: producer.init_transactions(CALL_TIMEOUT_S))
    # assign() at the group's committed offsets: no group membership to wait out after a
    # kill -9 (the offsets still go through the transaction, generation -1)
    parts = sorted(consumer.list_topics(source, timeout=30).topics[source].partitions)
    consumer.assign(committed_positions(consumer, source, parts))
    print("ready", file=sys.stderr, flush=True)
    while not stop:
        msgs = consumer.consume(most, 0.5)
        msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            continue
        try:
            producer.begin_transaction()
            for m in msgs:
                producer.produce(sink, f"{m.partition()}:{m.offset()}:".encode() + m.value(),
                                 partition=m.partition())
            time.sleep(pause_s)  # inside the transaction: a kill now leaves it open
            retrying("send_offsets_to_transaction", lambda: producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(),
                CALL_TIMEOUT_S))
            retrying("commit_transaction", lambda: producer.commit_transaction(CALL_TIMEOUT_S))
        except KafkaException as e:
            if not abort(producer, e.args[0]):
                # at once, without tearing the clients down: librdkafka's destruction of a
                # fenced producer with records still queued, during the interpreter's
                # shutdown, once aborted the process (glibc: "unaligned tcache chunk
                # detected" at thread exit) instead of exiting 1
                sys.stderr.flush()
                os._exit(1)
            for tp in committed_positions(consumer, source, parts):
                consumer.seek(tp)
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
