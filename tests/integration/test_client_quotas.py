"""Client quotas end to end (issue 12, item 4): AlterClientQuotas and DescribeClientQuotas
on the wire (every version, Kafka's validation and errors, authorization), through
``headrace quotas``, kept across a restart; kafka-python sees the throttle of a produce
quota in its metrics and a muted connection waits it out. The 1 MB/s measurement is in
``test_quota_produce_rate.py``."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from tests.brokerproc import BrokerProcess
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.timeout(120)


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker process: the tests that measure rates and throttles (and the restart)."""
    with BrokerProcess(tmp_path / "data") as b:
        yield b


@pytest.fixture()
def wire_broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    """In process, for the tests that read only answers on the wire (no rate, no kill)."""
    with InProcessBroker(tmp_path / "data") as b:
        yield b


Entity = list[tuple[str, str | None]]
Ops = list[tuple[str, float, bool]]


def alter(w: WireClient, version: int, entries: list[tuple[Entity, Ops]],
          validate_only: bool = False) -> list[tuple[int, str | None]]:
    resp = w.request(49, version, {"validate_only": validate_only, "entries": [
        {"entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
         "ops": [{"key": k, "value": v, "remove": r} for k, v, r in ops]}
        for entity, ops in entries]})
    return [(int(e.error_code), e.error_message) for e in resp.entries]


def describe(w: WireClient, version: int, components: list[tuple[str, int, str | None]],
             strict: bool = False) -> tuple[int, str | None, dict[tuple[tuple[str, str | None],
                                                                 ...], dict[str, float]] | None]:
    resp = w.request(48, version, {"strict": strict, "components": [
        {"entity_type": t, "match_type": m, "match": n} for t, m, n in components]})
    if resp.entries is None:
        return int(resp.error_code), resp.error_message, None
    return int(resp.error_code), resp.error_message, {
        tuple((e.entity_type, e.entity_name) for e in entry.entity):
            {v.key: v.value for v in entry.values} for entry in resp.entries}


OK = (0, None)


@pytest.mark.parametrize("version", [0, 1])
def test_alter_and_describe_round_trip(wire_broker: InProcessBroker, version: int) -> None:
    with WireClient.to(wire_broker.bootstrap) as w:
        assert alter(w, version, [
            ([("user", "alice"), ("client-id", "app")], [("producer_byte_rate", 1048576, False)]),
            ([("user", "alice")], [("request_percentage", 50.5, False)]),
            ([("user", None)], [("consumer_byte_rate", 2048, False)]),
            ([("client-id", None)], [("producer_byte_rate", 4096, False),
                                     ("consumer_byte_rate", 4096, False)]),
            ([("ip", "10.0.0.1")], [("connection_creation_rate", 10, False)]),
        ]) == [OK] * 5
        code, _, all_ = describe(w, version, [])
        assert code == 0 and all_ == {
            (("user", "alice"), ("client-id", "app")): {"producer_byte_rate": 1048576.0},
            (("user", "alice"),): {"request_percentage": 50.5},
            (("user", None),): {"consumer_byte_rate": 2048.0},
            (("client-id", None),): {"consumer_byte_rate": 4096.0,
                                     "producer_byte_rate": 4096.0},
            (("ip", "10.0.0.1"),): {"connection_creation_rate": 10.0},
        }
        # EXACT names, DEFAULT the default, SPECIFIED any (the default included); strict
        # leaves out entities with types the filter does not name
        assert describe(w, version, [("user", 0, "alice")], strict=True)[2] == {
            (("user", "alice"),): {"request_percentage": 50.5}}
        assert set(describe(w, version, [("user", 0, "alice")])[2] or {}) == {
            (("user", "alice"),), (("user", "alice"), ("client-id", "app"))}
        assert set(describe(w, version, [("user", 1, None)])[2] or {}) == {(("user", None),)}
        assert set(describe(w, version, [("user", 2, None)], strict=True)[2] or {}) == {
            (("user", "alice"),), (("user", None),)}
        assert set(describe(w, version, [("client-id", 2, None)])[2] or {}) == {
            (("user", "alice"), ("client-id", "app")), (("client-id", None),)}
        assert set(describe(w, version, [("ip", 2, None)])[2] or {}) == {(("ip", "10.0.0.1"),)}
        # removing the last key removes the entity; validate_only changes nothing
        assert alter(w, version, [([("user", "alice")], [("request_percentage", 0, True)])]) \
            == [OK]
        assert alter(w, version, [([("user", None)], [("consumer_byte_rate", 1, False)])],
                     validate_only=True) == [OK]
        _, _, after = describe(w, version, [("user", 2, None)], strict=True)
        assert after == {(("user", None),): {"consumer_byte_rate": 2048.0}}


def test_kafkas_validation_errors(wire_broker: InProcessBroker) -> None:
    bad = ErrorCode.invalid_request
    with WireClient.to(wire_broker.bootstrap) as w:
        assert alter(w, 1, [
            ([], [("producer_byte_rate", 1, False)]),
            ([("user", "")], [("producer_byte_rate", 1, False)]),
            ([("group", "g")], [("producer_byte_rate", 1, False)]),
            ([("user", "u"), ("ip", "1.2.3.4")], [("producer_byte_rate", 1, False)]),
            ([("user", "u")], [("foo", 1, False)]),
            ([("user", "u")], [("producer_byte_rate", 1.5, False)]),
            ([("client-id", "c")], [("connection_creation_rate", 1, False)]),
            ([("ip", "not-an-ip")], [("connection_creation_rate", 1, False)]),
            ([("user", "u")], [("producer_byte_rate", 10, False)]),
        ]) == [
            (bad, "Invalid empty client quota entity"),
            (bad, "Empty user not supported"),
            (bad, "Unhandled client quota entity type: group"),
            (bad, "Invalid quota entity combination, IP entity should not be combined with "
                  "User or ClientId"),
            (bad, "Invalid configuration key foo"),
            (bad, "Configuration producer_byte_rate must be a LONG value"),
            (bad, "Invalid configuration key connection_creation_rate"),
            (bad, "not-an-ip is not a valid IP or resolvable host."),
            OK,
        ]
        assert describe(w, 1, [("user", 2, None), ("user", 0, "x")])[:2] == (
            bad, "Duplicate user filter component entity type")
        assert describe(w, 1, [("", 2, None)])[:2] == (
            bad, "Unexpected empty filter component entity type")
        assert describe(w, 1, [("group", 2, None)])[:2] == (
            ErrorCode.unsupported_version, "Custom entity type 'group' not supported")
        assert describe(w, 1, [("user", 2, None), ("ip", 2, None)])[0] == bad


def test_authorization_needs_cluster_configs_access(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path / "d", {
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"}) as b, \
            WireClient.to(b.bootstrap) as w:
        assert alter(w, 1, [([("user", "u")], [("producer_byte_rate", 10, False)])]) == [
            (ErrorCode.cluster_authorization_failed, None)]
        assert describe(w, 1, [])[:3] == (ErrorCode.cluster_authorization_failed, None, None)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headrace.cli", "quotas", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_cli_set_describe_remove_and_restart(broker: BrokerProcess) -> None:
    bs = ["--bootstrap-server", broker.bootstrap]
    r = run_cli("set", *bs, "--user", "alice", "--client-id", "app",
                "--add-config", "producer_byte_rate=1048576,consumer_byte_rate=2097152")
    assert r.returncode == 0, r.stderr
    assert "Completed updating quota configs for user-principal 'alice', client-id 'app'" \
        in r.stdout
    assert run_cli("set", *bs, "--client-default", "--add-config",
                   "request_percentage=25").returncode == 0
    bad = run_cli("set", *bs, "--user", "alice", "--add-config", "foo=1")
    assert bad.returncode == 1 and "INVALID_REQUEST: Invalid configuration key foo" in bad.stderr
    broker.restart()
    bs = ["--bootstrap-server", broker.bootstrap]
    out = run_cli("describe", *bs).stdout
    assert ("Quota configs for user-principal 'alice', client-id 'app' are "
            "consumer_byte_rate=2097152.0, producer_byte_rate=1048576.0") in out
    assert "Quota configs for client-id the default are request_percentage=25.0" in out
    only = run_cli("describe", *bs, "--client-default", "--strict").stdout
    assert "alice" not in only and "request_percentage=25.0" in only
    r = run_cli("remove", *bs, "--user", "alice", "--client-id", "app")
    assert r.returncode == 0, r.stderr
    assert "alice" not in run_cli("describe", *bs).stdout
    r = run_cli("set", *bs, "--client-default", "--delete-config", "request_percentage")
    assert r.returncode == 0 and run_cli("describe", *bs).stdout == ""


@pytest.mark.slow
def test_kafka_python_sees_the_throttle_and_the_connection_is_muted(
        broker: BrokerProcess) -> None:
    from kafka import KafkaProducer

    with WireClient.to(broker.bootstrap) as w:
        assert alter(w, 1, [([("client-id", "slow-py")],
                             [("producer_byte_rate", 10240, False)])]) == [OK]
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, client_id="slow-py",
                             acks=1, linger_ms=0, batch_size=64 * 1024)
    try:
        value = b"x" * 50_000
        started = time.monotonic()
        # 400 kB against 10 kB/s (100 kB of initial credit): throttled, and the next
        # produce waits for the mute to end
        for _ in range(8):
            producer.send("quota-py", value).get(timeout=60)
        elapsed = time.monotonic() - started
        throttles = [v for group in producer.metrics().values() for k, v in group.items()
                     if k == "throttle-time-max"]
        assert throttles and max(throttles) > 0, producer.metrics()
        assert elapsed >= 2.0  # without the mute, 8 acks=1 produces take milliseconds
    finally:
        producer.close(timeout=5)


@pytest.mark.slow
def test_a_consumer_quota_holds_a_fetching_consumer_to_its_rate(broker: BrokerProcess) -> None:
    """consumer_byte_rate on a client id: after the bucket's initial credit (11 windows of
    quota), a confluent-kafka consumer reading as fast as it can gets the quota, and its
    fetches answer throttle_time_ms (the connection muted meanwhile)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    quota = 200_000
    topic = "fq"
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    for _ in range(4000):
        p.produce(topic, b"x" * 1000, partition=0)
    assert p.flush(30) == 0
    with WireClient.to(broker.bootstrap) as w:
        assert alter(w, 1, [([("client-id", "slow-reader")],
                             [("consumer_byte_rate", quota, False)])]) == [OK]
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "fq-g",
                  "client.id": "slow-reader", "enable.auto.commit": False,
                  "fetch.max.bytes": 1_000_000, "max.partition.fetch.bytes": 1_000_000})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    marks: list[tuple[float, int]] = []
    start = time.monotonic()
    try:
        while got < 4000 and time.monotonic() - start < 60:
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    got += 1
            marks.append((time.monotonic() - start, got))
    finally:
        c.close()
    assert got == 4000
    elapsed = marks[-1][0]
    # ~4.1 MB: 2.2 MB of credit at once, the rest at 200 kB/s: about 9.5 s
    assert elapsed >= 6.0, marks
    # after the credit, the rate stays near the quota
    after = [(t, n) for t, n in marks if n >= 2600]
    if len(after) >= 2 and after[-1][0] > after[0][0]:
        rate = (after[-1][1] - after[0][1]) * 1000 / (after[-1][0] - after[0][0])
        assert rate <= quota * 1.3, (rate, marks)


def test_connection_creation_rate_per_ip(broker: BrokerProcess) -> None:
    """connection_creation_rate on the client's IP (KIP-612): connections beyond the rate
    are closed at once; a connection within it is served."""
    import selectors
    import socket

    with WireClient.to(broker.bootstrap) as w:
        assert alter(w, 1, [([("ip", "127.0.0.1")],
                             [("connection_creation_rate", 2.0, False)])]) == [OK]
    host, port = broker.bootstrap.rsplit(":", 1)
    socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(30)]
    closed: set[socket.socket] = set()
    deadline = time.monotonic() + 2.0
    # a selector, not select.select: in a long pytest process the sockets' descriptors
    # may be past select's limit of 1024
    sel = selectors.DefaultSelector()
    try:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        while time.monotonic() < deadline and len(closed) < len(socks):
            for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                s = key.fileobj  # type: ignore[assignment]
                try:
                    if s.recv(1) == b"":
                        closed.add(s)
                        sel.unregister(s)
                except ConnectionResetError:
                    closed.add(s)
                    sel.unregister(s)
    finally:
        sel.close()
        for s in socks:
            s.close()
    # the sampled rate starts with (samples - 1) windows of credit: 2/s x 10 s = 20
    # connections pass, the other 10 of the 30 are closed at once
    assert len(closed) >= 8, len(closed)


def test_request_percentage_throttles_a_busy_client(broker: BrokerProcess) -> None:
    """request_percentage (handler time, percent of one thread per second): a client id
    allowed 0.0001 % that sends request after request gets throttle_time_ms back; another
    client id is not throttled."""
    with WireClient.to(broker.bootstrap) as w:  # client id "wire-test"
        assert alter(w, 1, [([("client-id", "wire-test")],
                             [("request_percentage", 0.0001, False)])]) == [OK]
        meta = {"topics": None, "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False}
        throttled = None
        for i in range(50):  # each Metadata costs some microseconds of handler time (10 s of
            # quota credit: 10 µs), so one of the first few is throttled; a throttle that
            # a response does not announce would mute this loop for a window per request
            if w.request(3, 12, meta).throttle_time.total_seconds() > 0:
                throttled = i
                break
    assert throttled is not None
    from confluent_kafka.admin import AdminClient

    other = AdminClient({"bootstrap.servers": broker.bootstrap, "client.id": "free"})
    for _ in range(5):
        assert other.list_topics(timeout=10).brokers
