"""Operating share groups (KIP-932, issue 25 item 6): ``headrace share-groups
list|describe|reset-offsets|delete-offsets|delete`` (kafka-share-groups.sh) over
ListGroups v5, ShareGroupDescribe (77), DescribeShareGroupOffsets (90),
AlterShareGroupOffsets (91), DeleteShareGroupOffsets (92) and DeleteGroups, against an
in-process broker with a real ``ShareConsumer``; and the APIs' own errors on the wire."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Producer, ShareConsumer
from kio.schema.errors import ErrorCode

from headrace.cli import main
from headrace.cli_support import set_verbose
from tests.inproc import InProcessBroker
from tests.integration.test_share_consumers import OVERRIDES, assigned_members, setup_topic
from tests.kafka_wire import WireClient


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("shareadmin"), OVERRIDES) as b:
        yield b


def run(*args: str) -> Result:
    try:
        return CliRunner().invoke(main, list(args), prog_name="headrace",
                                  env={"HEADRACE_BOOTSTRAP": None,
                                       "HEADRACE_COMMAND_CONFIG": None,
                                       "HEADRACE_VERBOSE": None})
    finally:
        set_verbose(False)


def ok(*args: str) -> Result:
    r = run(*args)
    assert r.exit_code == 0, (r.exit_code, r.stdout, r.stderr, r.exception)
    assert "Traceback" not in r.stderr
    return r


def consume(broker: InProcessBroker, group: str, topic: str, n: int,
            close: bool = True) -> tuple[ShareConsumer, list[int]]:
    c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                       "max.poll.records": 100})
    c.subscribe([topic])
    got: list[int] = []
    deadline = time.monotonic() + 20
    while len(got) < n and time.monotonic() < deadline:
        got += [int(m.value()) for m in c.poll(0.5) or [] if not m.error()]
    c.commit_sync()
    if close:
        c.close()
    return c, got


def test_the_share_groups_commands(broker: InProcessBroker, topic_name: str) -> None:
    b = broker.bootstrap
    group = "ops"
    setup_topic(broker, topic_name, group, 30)
    c, got = consume(broker, group, topic_name, 30, close=False)
    assert sorted(got) == list(range(30))
    try:
        assert group in ok("share-groups", "list", "-b", b).stdout.split()
        doc = json.loads(ok("share-groups", "describe", group, "-b", b, "--members",
                            "--format", "json").stdout)
        (m,) = doc["members"]
        assert m["assignment"] == [f"{topic_name}:0"]
        state = ok("share-groups", "describe", group, "-b", b, "--state").stdout
        assert "Stable" in state
        # the group is active: its offsets cannot be reset or deleted
        r = run("share-groups", "reset-offsets", group, "--topic", topic_name,
                "--to-earliest", "--execute", "-b", b)
        assert r.exit_code == 1 and "member" in r.stderr
    finally:
        c.close()
    # everything accepted: start offset 30, lag 0
    doc = json.loads(ok("share-groups", "describe", group, "-b", b, "--format",
                        "json").stdout)
    (p,) = doc["partitions"]
    assert (p["topic"], p["partition"], p["start_offset"], p["lag"]) == (topic_name, 0, 30, 0)
    # empty now (its member left): back to the start, and the records come again
    deadline = time.monotonic() + 10
    while assigned_members(broker, group) and time.monotonic() < deadline:
        time.sleep(0.1)
    out = ok("share-groups", "reset-offsets", group, "--topic", topic_name, "--to-earliest",
             "--execute", "-b", b).stdout
    assert "Reset the start offsets" in out
    doc = json.loads(ok("share-groups", "describe", group, "-b", b, "--format",
                        "json").stdout)
    assert doc["partitions"][0]["start_offset"] == 0
    _, again = consume(broker, group, topic_name, 30)
    assert sorted(again) == list(range(30))
    deadline = time.monotonic() + 10
    while assigned_members(broker, group) and time.monotonic() < deadline:
        time.sleep(0.1)
    ok("share-groups", "delete-offsets", group, "--topic", topic_name, "-b", b)
    doc = json.loads(ok("share-groups", "describe", group, "-b", b, "--format",
                        "json").stdout)
    assert doc["partitions"] == []  # no initialized share-partition left
    assert "Deleted share group" in ok("share-groups", "delete", group, "-b", b).stdout
    r = run("share-groups", "describe", group, "-b", b)
    assert r.exit_code == 1 and "does not exist" in r.stderr
    assert group not in ok("share-groups", "list", "-b", b).stdout.split()


def test_the_admin_apis_errors(broker: InProcessBroker, topic_name: str) -> None:
    with WireClient.to(broker.bootstrap) as wc:
        r = wc.request(90, 1, {"groups": [{"group_id": "nope", "topics": None}]})
        assert r.groups[0].error_code == ErrorCode.group_id_not_found
        r = wc.request(92, 0, {"group_id": "nope", "topics": [{"topic_name": topic_name}]})
        assert r.error_code == ErrorCode.group_id_not_found
        # AlterShareGroupOffsets makes an unknown group, as Kafka; an unknown topic is
        # refused for its partitions
        r = wc.request(91, 0, {"group_id": "fresh", "topics": [{
            "topic_name": "no-such-topic", "partitions": [
                {"partition_index": 0, "start_offset": 0}]}]})
        assert r.error_code == ErrorCode.none
        assert r.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
        # ListGroups v5's type filter: a consumer group's id is not a share group
        p = Producer({"bootstrap.servers": broker.bootstrap})
        p.produce(topic_name, b"x")
        p.flush(10)
        r: Any = wc.request(16, 5, {"states_filter": [], "types_filter": ["share"]})
        assert all(g.group_type == "share" for g in r.groups)
