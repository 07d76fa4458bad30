"""The web console's sampler when a broker stops answering (issue 26, defect 1): one broker
that does not answer costs only what it alone would have said; the groups it coordinates
show the outage, every other group and topic stays current; a sample ends within its
bound. Real TCP against an in-process broker, plus a "silent broker": a socket that
accepts connections and never answers (a SIGSTOPped or half-dead broker, the worst case
for a client: no refusal, only timeouts).
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from headrace.webconsole.source import BROKER_ROUND_TRIPS, ClusterSource
from tests.inproc import InProcessBroker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("console-outage"),
                         {"num.partitions": "2"}) as b:
        yield b


@pytest.fixture
def silent() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)  # accepted by the kernel, never read: every request times out
    yield s
    s.close()


def _group_with_lag(bootstrap: str, topic: str, group: str) -> Consumer:
    """A consumer of ``group`` that committed 3 of ``topic``'s 10 records (lag 7), still
    a member."""
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        p.produce(topic, value=b"v%d" % i, partition=0)
    assert p.flush(10) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < 3 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m)
    assert len(got) >= 3
    c.commit(message=got[2], asynchronous=False)  # committed offset 3
    return c


class _WithSilentBroker(ClusterSource):
    """The real cluster's metadata plus broker 99, which never answers."""

    def __init__(self, bootstrap: str, silent_port: int) -> None:
        super().__init__(bootstrap, {}, timeout_s=1.0)
        self.silent_port = silent_port

    def metadata(self) -> Any:
        from confluent_kafka.admin import BrokerMetadata

        md = super().metadata()
        b = BrokerMetadata()
        b.id, b.host, b.port = 99, "127.0.0.1", self.silent_port
        md.brokers[99] = b
        return md


def test_groups_are_sampled_from_their_coordinator(broker: InProcessBroker) -> None:
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    consumer = _group_with_lag(broker.bootstrap, topic, group)
    try:
        source = ClusterSource(broker.bootstrap, {}, timeout_s=2.0)
        snap = source.snapshot()
        (g,) = [g for g in snap["groups"] if g["group"] == group]
        assert g["lag"] == 7 and g["error"] is None
        assert g["topics"] == [topic] and g["members"] == 1 and g["state"] == "STABLE"
        assert snap["high_watermarks"][topic] == {0: 10, 1: 0}
        (t,) = [t for t in snap["topics"] if t["name"] == topic]
        assert t["records"] == 10 and t["size_bytes"] and t["size_bytes"] > 0
    finally:
        consumer.close()


def test_a_silent_broker_costs_only_its_own_groups(broker: InProcessBroker,
                                                   silent: socket.socket) -> None:
    """Issue 26: one group coordinator that did not answer froze every page for over 2
    minutes ("group ev-readers: no broker answered"). Now the sample ends within its
    bound, the other groups and the topics are current, and the silent broker's group
    shows the outage with its last known state."""
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    consumer = _group_with_lag(broker.bootstrap, topic, group)
    try:
        source = _WithSilentBroker(broker.bootstrap, silent.getsockname()[1])
        # a group the silent broker coordinated when it last answered
        source._known_groups["ev-readers"] = {
            "group": "ev-readers", "state": "STABLE", "members": 2, "protocol": "range",
            "topics": ["ev"], "lag": 679, "coordinator": 99, "error": None,
            "error_since_ms": None}
        started = time.monotonic()
        snap = source.snapshot()
        took = time.monotonic() - started
        assert took < source.broker_timeout_s * BROKER_ROUND_TRIPS + 2, took
        by_id = {g["group"]: g for g in snap["groups"]}
        assert by_id[group]["lag"] == 7 and by_id[group]["error"] is None
        ghost = by_id["ev-readers"]
        assert ghost["lag"] is None and ghost["members"] == 2
        assert "broker 99" in ghost["error"] and "does not answer" in ghost["error"]
        assert ghost["error_since_ms"] == snap["time_ms"]
        (t,) = [t for t in snap["topics"] if t["name"] == topic]
        assert t["records"] == 10
        # the next sample keeps the outage's start
        later = source.snapshot()
        assert {g["group"]: g for g in later["groups"]}["ev-readers"]["error_since_ms"] \
            == snap["time_ms"]
    finally:
        consumer.close()
