"""One consumer-group member for ``bench/groups.py``, run as its own process.

    python group_member.py BOOTSTRAP GROUP TOPIC CLIENT_ID

A confluent-kafka Consumer (classic protocol, range assignor, session.timeout.ms=6000,
heartbeat.interval.ms=500) that connects, prints ``ready``, waits for ``go`` on stdin, then
subscribes to TOPIC and polls until it reads ``close`` (close() with LeaveGroup, then exit)
or stdin ends. It reports on stdout, one event a line, stamped with ``time.monotonic_ns()``
(CLOCK_MONOTONIC, the same clock in every process of the machine):

    ready
    subscribed <ns>
    assigned <ns> <partition,partition,...>   (the whole new assignment; eager protocol)
    revoked <ns>
    lost <ns>
    error <ns> <text>
    closing <ns>
    closed <ns>

Being a separate process lets the benchmark SIGKILL it: a member that vanishes without
LeaveGroup, which the group only notices when its session times out.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 500

_out_lock = threading.Lock()


def emit(*parts: object) -> None:
    with _out_lock:
        sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
        sys.stdout.flush()


def now() -> int:
    return time.monotonic_ns()


def member_config(bootstrap: str, group: str, client_id: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": client_id,
        "group.protocol": "classic",
        "partition.assignment.strategy": "range",
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "error_cb": lambda err: emit("error", now(), _one_line(str(err))),
        "log_level": 0,  # librdkafka's own logs: nothing (errors come through error_cb)
    }


def _one_line(text: str) -> str:
    return " ".join(text.split())


def main(argv: list[str]) -> int:
    bootstrap, group, topic, client_id = argv[1:5]
    commands: queue.Queue[str] = queue.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("close")  # the parent went away

    threading.Thread(target=read_stdin, name="stdin", daemon=True).start()

    def on_assign(_c: Consumer, partitions: list[TopicPartition]) -> None:
        emit("assigned", now(), ",".join(str(p.partition) for p in partitions) or "-")

    def on_revoke(_c: Consumer, _partitions: list[TopicPartition]) -> None:
        emit("revoked", now())

    def on_lost(_c: Consumer, _partitions: list[TopicPartition]) -> None:
        emit("lost", now())

    consumer = Consumer(member_config(bootstrap, group, client_id))
    consumer.list_topics(topic, timeout=15.0)  # connect and learn the topic before "go"
    emit("ready")
    if commands.get() != "go":
        consumer.close()
        return 0
    emit("subscribed", now())
    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    while True:
        msg = consumer.poll(0.05)
        err = msg.error() if msg is not None else None
        if err is not None and err.code() != KafkaError._PARTITION_EOF:
            emit("error", now(), _one_line(str(err)))
        try:
            command = commands.get_nowait()
        except queue.Empty:
            continue
        if command == "close":
            break
    emit("closing", now())
    consumer.close()  # unsubscribe, revoke, LeaveGroup
    emit("closed", now())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
