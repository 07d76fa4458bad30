"""A transactional consume-transform-produce loop (confluent-kafka), run as its own
process by tests/integration/test_transactions.py so that it can be killed with -9.

    python -m tests.txn_worker BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID [PAUSE_S]

Each input record (partition p, offset o) becomes one output record ``p:o:value`` in
the same transaction that commits the input offsets (send_offsets_to_transaction).
Transactions of up to 50 records, each held open PAUSE_S seconds before it commits (so
that a test's kill -9 lands inside one); runs until killed or SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition


def main() -> int:
    bootstrap, source, sink, group, tid = sys.argv[1:6]
    pause_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                         "linger.ms": 5})
    producer.init_transactions(60)
    # assign() at the group's committed offsets: no group membership to wait out after a
    # kill -9 (the offsets still go through the transaction, generation -1)
    parts = sorted(consumer.list_topics(source, timeout=30).topics[source].partitions)
    committed = consumer.committed([TopicPartition(source, p) for p in parts], timeout=30)
    consumer.assign([TopicPartition(source, tp.partition,
                                    tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                     for tp in committed])
    print("ready", file=sys.stderr, flush=True)
    while not stop:
        msgs = consumer.consume(50, 0.5)
        msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            continue
        producer.begin_transaction()
        for m in msgs:
            producer.produce(sink, f"{m.partition()}:{m.offset()}:".encode() + m.value(),
                             partition=m.partition())
        time.sleep(pause_s)  # inside the transaction: a kill now leaves it open
        try:
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 60)
            producer.commit_transaction(60)
        except KafkaException as e:
            print(f"transaction failed: {e}", file=sys.stderr, flush=True)
            return 1
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
