"""``headrace topics describe`` during a failover (issue 26 defect 3), fast: the document and
the text made from Metadata and the brokers' answers (:mod:`headrace.topic_describe`), and
the command against an in-process broker with a dead address first in the bootstrap list
and a dead broker in the metadata. The slow twin with a killed broker of a real cluster is
tests/cluster/test_cli_failover.py."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from click.testing import CliRunner
from tests.inproc import InProcessBroker

from headrace.cli import main
from headrace.topic_describe import BrokerReply, describe_doc, describe_lines


def _partition(index: int, leader: int, replicas: list[int], isr: list[int]) -> NS:
    return NS(partition_index=index, leader_id=leader, replica_nodes=replicas,
              isr_nodes=isr, offline_replicas=[r for r in replicas if r not in isr])


def _docs() -> list[dict[str, object]]:
    topic = NS(name="t", is_internal=False, partitions=[
        _partition(0, 1, [1], [1]),  # led by a broker that answered
        _partition(1, -1, [2], [2]),  # no leader: its only replica is dead
        _partition(2, 3, [3], [3]),  # its leader is in the metadata but did not answer
    ])
    brokers = {1: ("h", 1), 3: ("h", 3)}
    replies = {1: BrokerReply(offsets={("t", 0): (2, 9)}, sizes={("t", 0): 100}),
               3: BrokerReply(error="Connection refused")}
    return describe_doc([topic], brokers, replies, {"t": {"retention.ms": "5"}})


def test_a_partition_without_a_leader_is_shown_as_such() -> None:
    """Leader null/none and offline, offsets unknown as null/"-", never -1 or -1001."""
    (doc,) = _docs()
    p0, p1, p2 = doc["partitions"]  # type: ignore[index]
    assert (p0["leader"], p0["offline"], p0["log_start_offset"], p0["log_end_offset"],
            p0["size_bytes"]) == (1, False, 2, 9, 100)
    assert (p1["leader"], p1["offline"], p1["log_end_offset"]) == (None, True, None)
    assert (p2["leader"], p2["offline"], p2["log_end_offset"]) == (3, False, None)
    lines = describe_lines([doc])
    assert lines[0] == "Topic: t\tPartitionCount: 3\tReplicationFactor: 1\tConfigs: retention.ms=5"
    assert lines[1].endswith("Leader: 1\tReplicas: 1\tIsr: 1\tLogStartOffset: 2\t"
                             "LogEndOffset: 9\tSize: 100")
    assert "\tLeader: none\t" in lines[2] and lines[2].endswith("\tSize: -\t(offline)")
    assert "LogEndOffset: -\t" in lines[3] and "(offline)" not in lines[3]
    assert not any("-1" in line for line in lines)


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("describe"), {"num.partitions": "2"}) as b:
        yield b


def test_describe_skips_a_dead_bootstrap_address(broker: InProcessBroker) -> None:
    """A dead address first in the bootstrap list costs nothing: exit 0 at once, every
    partition with its offsets (R-CLI; issue 26 defect 3)."""
    from confluent_kafka import Producer

    t = f"dd-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(5):
        p.produce(t, b"x", partition=i % 2)
    assert p.flush(30) == 0
    bootstrap = f"127.0.0.1:{_dead_port()},{broker.bootstrap}"
    start = time.monotonic()
    r = CliRunner().invoke(main, ["topics", "describe", "-b", bootstrap, "--topic", t,
                                  "--format", "json"], env={"HEADRACE_BOOTSTRAP": None})
    took = time.monotonic() - start
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert took < 3.0, took
    (doc,) = json.loads(r.stdout)
    assert [(q["leader"], q["offline"], q["log_end_offset"]) for q in doc["partitions"]] == [
        (0, False, 3), (0, False, 2)]


def test_describe_unknown_topic_is_one_line(broker: InProcessBroker, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["topics", "describe", "-b", broker.bootstrap, "--topic",
                                  "never-there"], env={"HEADRACE_BOOTSTRAP": None})
    assert r.exit_code == 1 and r.stderr.strip() == "headrace: topic 'never-there' does not exist"


def test_describe_skips_a_silent_bootstrap_address(broker: InProcessBroker) -> None:
    """A first address that accepts connections and never answers (a SIGSTOPped broker)
    is passed over for the next one: exit 0 within a few seconds, not exit 3 (issue 26:
    "once exited 3 with two brokers up")."""
    t = f"ds-{uuid.uuid4().hex[:6]}"
    assert CliRunner().invoke(main, ["topics", "create", "-b", broker.bootstrap, "--topic",
                                     t]).exit_code == 0
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        bootstrap = f"127.0.0.1:{silent.getsockname()[1]},{broker.bootstrap}"
        start = time.monotonic()
        r = CliRunner().invoke(main, ["topics", "describe", "-b", bootstrap, "--topic", t],
                               env={"HEADRACE_BOOTSTRAP": None})
        took = time.monotonic() - start
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert f"Topic: {t}\tPartition: 0\tLeader: 0\t" in r.stdout
    assert took < 5.0, took
