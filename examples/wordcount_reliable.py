"""Seed 001's word count (sentences → split → count) with headrace.reliable, against headrace.

    python examples/wordcount_reliable.py --bootstrap 127.0.0.1:9092

It creates the topic ``sentences`` (if missing), produces a few sentences, then runs the
topology until every word is counted, and prints the counts. Its consumer group starts where
the topic ended before it produced: a second run (or anything else in the topic) counts only
the sentences that run sent.

- ``split``: a basic bolt — each word it emits is anchored to the sentence automatically and
  the sentence is acked when the function returns;
- ``count``: an explicit bolt on 2 lanes with fields grouping on the word (one lane owns a
  word's counter, no lock); it emits ``(word, count)`` anchored to the word and acks it;
- ``store``: a basic bolt writing each counted word to SQLite keyed by (topic, partition,
  offset, word index): a replay after a crash overwrites instead of counting twice, so the
  totals (``SELECT word, count(*) ... GROUP BY word``) are exactly-once.

A sentence's offset is committed only when all of its words went through all three stages.
"""

from __future__ import annotations

import argparse
import collections
import logging
import sqlite3
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from headrace.reliable import (
    BasicOutputCollector,
    IdempotentSqliteSink,
    Item,
    OutputCollector,
    ReliableConsumer,
    Topology,
    idempotent_key,
)

SENTENCES = [
    "the cow jumped over the moon",
    "an apple a day keeps the doctor away",
    "four score and seven years ago",
    "snow white and the seven dwarfs",
    "i am at two with nature",
]


def split(item: Item, out: BasicOutputCollector) -> None:
    _key, value = item.values
    for index, word in enumerate(value.decode().split()):
        out.emit((word, index))


class Count:
    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def __call__(self, item: Item, collector: OutputCollector) -> None:
        word, index = item.values
        self.counts[word] += 1
        collector.emit((word, self.counts[word], index), anchors=[item])
        collector.ack(item)


def start_at_end(bootstrap: str, topic: str, group: str) -> None:
    """Commit, for ``group``, the topic's current end offsets: the run reads only what it
    produces next, not an earlier run's sentences."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = [TopicPartition(topic, p, c.get_watermark_offsets(
            TopicPartition(topic, p), timeout=10)[1]) for p in sorted(parts)]
        c.commit(offsets=ends, asynchronous=False)
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--topic", default="sentences")
    ap.add_argument("--group", default=f"wordcount-{uuid.uuid4().hex[:6]}")
    ap.add_argument("--repeat", type=int, default=20, help="copies of the sentences to send")
    ap.add_argument("--db", default=":memory:", help="SQLite file for the counted words")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    if args.topic not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(args.topic, 2, 1)])[args.topic].result(15)
    start_at_end(args.bootstrap, args.topic, args.group)
    producer = Producer({"bootstrap.servers": args.bootstrap})
    for i in range(args.repeat * len(SENTENCES)):
        producer.produce(args.topic, SENTENCES[i % len(SENTENCES)].encode())
    producer.flush(30)
    expected = collections.Counter(w for s in SENTENCES for w in s.split())
    total_words = args.repeat * sum(expected.values())

    sink = IdempotentSqliteSink(sqlite3.connect(args.db, check_same_thread=False), "words")
    topic = args.topic

    def store(item: Item, _out: BasicOutputCollector) -> None:
        word, _count, index = item.values
        rec = item.source
        sink.write(idempotent_key(topic, rec.partition, rec.offset, index), word)

    topology = (Topology()
                .basic_bolt("split", split, parallelism=2)
                .bolt("count", Count(), parallelism=2, fields=lambda it: it.values[0])
                .basic_bolt("store", store))
    consumer = ReliableConsumer(
        {"bootstrap.servers": args.bootstrap, "group.id": args.group,
         "auto.offset.reset": "earliest"},
        [topic], topology, max_uncommitted_offsets=1_000, offset_commit_period_ms=1_000)
    done = threading.Event()
    deadline = time.monotonic() + args.timeout
    try:
        while not done.is_set() and time.monotonic() < deadline:
            consumer.run(max_duration_s=0.5)
            if sink.count() >= total_words:
                done.set()
    finally:
        consumer.close()
    rows = sink.conn.execute("SELECT value, count(*) FROM words GROUP BY value "
                             "ORDER BY count(*) DESC, value").fetchall()
    for word, n in rows:
        print(f"{word:10} {n}")
    ok = dict(rows) == {w: n * args.repeat for w, n in expected.items()}
    print("all words counted exactly once" if ok else "counts differ (partial run?)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
