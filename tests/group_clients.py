"""Group consumers of the three clients behind one small interface, for group tests.

Each ``GroupMember`` runs one subscribed consumer in its own thread (a client blocks in its
poll while it rejoins, so members must not share a thread), recording what it consumed and
its current assignment. ``stop()`` closes the consumer (LeaveGroup), joins the thread and
re-raises whatever the member's thread raised; ``check()`` and ``wait_settled`` re-raise it
while the test is waiting, so a client error fails the test instead of dying in a thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.brokerproc import wait_until

FAST = {"session_timeout_ms": 6000, "heartbeat_ms": 300}


@dataclass
class GroupMember:
    client: str
    bootstrap: str
    topics: list[str]
    group: str
    session_timeout_ms: int = 6000
    heartbeat_ms: int = 300
    auto_commit: bool = False
    assignor: str | None = None
    instance_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    records: list[tuple[int, int, bytes | None]] = field(default_factory=list)
    assignment: frozenset[int] = frozenset()
    revokes: int = 0
    member_id: str = ""
    error: BaseException | None = None
    connection_errors: int = 0  # kafka-python: refused connections poll() raised

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> GroupMember:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        """Close the consumer and join its thread; raise what the thread raised."""
        self._stop.set()
        if self._thread.ident is None:  # never started
            return
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"{self.client} consumer did not close"
        self.check()

    def check(self) -> None:
        """Re-raise, in the test's thread, an error the member's thread died of."""
        if self.error is not None:
            raise AssertionError(f"{self.client} member {self.member_id or '?'} failed: "
                                 f"{self.error!r}") from self.error

    def _run(self) -> None:
        try:
            if self.client == "confluent":
                self._run_confluent()
            elif self.client == "kafka-python":
                self._run_kafka_python()
            else:
                asyncio.run(self._run_aiokafka())
        except BaseException as e:  # surfaced by the tests
            self.error = e

    def _run_confluent(self) -> None:
        from confluent_kafka import Consumer

        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap, "group.id": self.group,
            "auto.offset.reset": "earliest", "enable.auto.commit": self.auto_commit,
            "session.timeout.ms": self.session_timeout_ms,
            "heartbeat.interval.ms": self.heartbeat_ms,
            "topic.metadata.refresh.interval.ms": 1000,
        }
        if self.assignor:
            conf["partition.assignment.strategy"] = self.assignor
        if self.instance_id:
            conf["group.instance.id"] = self.instance_id
        conf.update(self.extra)
        c = Consumer(conf)

        def on_revoke(consumer: Any, partitions: Any) -> None:
            if partitions:
                self.revokes += 1

        c.subscribe(self.topics, on_revoke=on_revoke)
        try:
            while not self._stop.is_set():
                m = c.poll(0.1)
                if m is not None and m.error() is None:
                    self.records.append((m.partition(), m.offset(), m.value()))
                self.assignment = frozenset(tp.partition for tp in c.assignment())
                self.member_id = c.memberid() or ""
        finally:
            c.close()

    def _run_kafka_python(self) -> None:
        from kafka import KafkaConsumer

        kw: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap, "group_id": self.group,
            "auto_offset_reset": "earliest", "enable_auto_commit": self.auto_commit,
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_ms, "metadata_max_age_ms": 1000,
        }
        if self.instance_id:
            kw["group_instance_id"] = self.instance_id
        kw.update(self.extra)
        c = KafkaConsumer(**kw)
        # subscribe once the metadata holds the topics: see consume_and_commit in
        # tests/integration/test_offsets.py (a kafka-python 3.0.12 race after an empty
        # first assignment)
        deadline = time.monotonic() + 10
        while (not all(c.partitions_for_topic(t) for t in self.topics)
               and time.monotonic() < deadline and not self._stop.is_set()):
            time.sleep(0.05)
        c.subscribe(self.topics)
        from kafka.errors import KafkaConnectionError

        try:
            while not self._stop.is_set():
                try:
                    polled = c.poll(100)
                except KafkaConnectionError:
                    # kafka-python 3.0.12 lets a refused connection out of poll(): in
                    # ensure_coordinator_ready_async (coordinator/base.py) the metadata
                    # refresh that follows a failed coordinator lookup catches only
                    # KafkaTimeoutError. Seen when the only broker restarts (a Kafka broker
                    # refuses the same way); the consumer stays usable, as an application
                    # that polls again finds.
                    self.connection_errors += 1
                    self._stop.wait(0.1)  # back off as the client's own retry would
                    continue
                for tp, msgs in polled.items():
                    for m in msgs:
                        self.records.append((tp.partition, m.offset, m.value))
                self.assignment = frozenset(tp.partition for tp in c.assignment())
        finally:
            c.close()

    async def _run_aiokafka(self) -> None:
        from aiokafka import AIOKafkaConsumer

        c = AIOKafkaConsumer(
            *self.topics, bootstrap_servers=self.bootstrap, group_id=self.group,
            auto_offset_reset="earliest", enable_auto_commit=self.auto_commit,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_ms, metadata_max_age_ms=1000,
            **self.extra,
        )
        await c.start()
        try:
            while not self._stop.is_set():
                batch = await c.getmany(timeout_ms=100)
                for tp, msgs in batch.items():
                    for m in msgs:
                        self.records.append((tp.partition, m.offset, m.value))
                self.assignment = frozenset(tp.partition for tp in c.assignment())
        finally:
            await c.stop()


def stop_all(members: list[GroupMember]) -> None:
    """Stop every member, then raise the first error any of them died of."""
    errors: list[BaseException] = []
    for m in members:
        try:
            m.stop()
        except BaseException as e:  # stop the others first
            errors.append(e)
    if errors:
        raise errors[0]


def check_all(members: list[GroupMember]) -> None:
    for m in members:
        m.check()


def settled(members: list[GroupMember], partitions: int) -> bool:
    """Every member has partitions, none shared, all covered."""
    sets = [m.assignment for m in members]
    union: set[int] = set().union(*sets)
    return (all(sets) and sum(len(s) for s in sets) == len(union)
            and union == set(range(partitions)))


def wait_settled(members: list[GroupMember], partitions: int, timeout_s: float = 30.0,
                 stable_for_s: float = 0.0) -> None:
    """Wait until ``settled``; with ``stable_for_s``, until it stays so that long. A member
    whose thread died fails the wait at once with its error."""
    def ok() -> bool:
        check_all(members)
        return settled(members, partitions)

    wait_until(ok, timeout_s,
               what=f"{len(members)} members to share {partitions} partitions: "
               f"{[sorted(m.assignment) for m in members]}")
    if stable_for_s:
        snapshot = [m.assignment for m in members]
        deadline = time.monotonic() + stable_for_s
        while time.monotonic() < deadline:
            check_all(members)
            if [m.assignment for m in members] != snapshot:
                wait_settled(members, partitions, timeout_s, stable_for_s)
                return
            time.sleep(0.05)
