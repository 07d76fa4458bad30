"""The command line Kafka and rpk users expect (issue 26, "CLI parity"), in process with
click's CliRunner against an in-process broker: kafka-topics.sh's --exclude-internal,
describe's partition filters, deleting several topics or a pattern with --if-exists, rpk's
short flags, topics named as arguments everywhere."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, Producer

from headrace.cli import main
from headrace.cli_support import set_verbose
from tests.inproc import InProcessBroker


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("cli-parity"), {"num.partitions": "1"}) as b:
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


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_list_includes_internal_topics_unless_excluded(broker: InProcessBroker) -> None:
    b = broker.bootstrap
    t = name("plain")
    ok("topics", "create", "--topic", t, "-p", "2", "-r", "1", "-c", "retention.ms=60000",
       "-b", b)
    c = Consumer({"bootstrap.servers": b, "group.id": name("g")})  # makes __consumer_offsets
    c.subscribe([t])
    c.poll(1)
    c.close()
    listed = ok("topics", "list", "-b", b).stdout.split()
    assert t in listed and "__consumer_offsets" in listed
    listed = ok("topics", "list", "--exclude-internal", "-b", b).stdout.split()
    assert t in listed and "__consumer_offsets" not in listed
    doc = json.loads(ok("topics", "describe", t, "-b", b, "--format", "json").stdout)
    (d,) = doc
    assert d["partition_count"] == 2 and d["configs"]["retention.ms"] == "60000"
    docs = json.loads(ok("topics", "describe", "--exclude-internal", "-b", b,
                         "--format", "json").stdout)
    assert t in {x["name"] for x in docs} and not any(x["internal"] for x in docs)


def test_describe_filters_partitions_as_kafka_topics_does(broker: InProcessBroker) -> None:
    """One broker: every partition has ISR 1 = replicas; a topic asking for
    min.insync.replicas=2 is under its min ISR, one with the default 1 at it."""
    b = broker.bootstrap
    at, under = name("atmin"), name("undermin")
    ok("topics", "create", at, "-b", b)  # the topic as an argument, as produce takes it
    ok("topics", "create", "--topic", under, "-c", "min.insync.replicas=2", "-b", b)
    assert ok("topics", "describe", at, under, "--under-replicated-partitions",
              "-b", b).stdout == ""
    assert ok("topics", "describe", at, under, "--unavailable-partitions", "-b", b).stdout == ""
    out = ok("topics", "describe", at, under, "--at-min-isr-partitions", "-b", b).stdout
    assert out.startswith("\tTopic: " + at) and under not in out and "PartitionCount" not in out
    out = ok("topics", "describe", at, under, "--under-min-isr-partitions", "-b", b).stdout
    assert f"Topic: {under}\tPartition: 0" in out and at not in out
    doc = json.loads(ok("topics", "describe", at, under, "--under-min-isr-partitions",
                        "-b", b, "--format", "json").stdout)
    assert [d["name"] for d in doc] == [under]


def test_delete_several_topics_a_pattern_and_if_exists(broker: InProcessBroker) -> None:
    b = broker.bootstrap
    tag = uuid.uuid4().hex[:6]
    topics = [f"del-{tag}-{i}" for i in range(3)]
    keep = f"keep-{tag}"
    for t in [*topics, keep]:
        ok("topics", "create", "--topic", t, "-b", b)
    p = Producer({"bootstrap.servers": b})
    p.produce(keep, b"x")
    p.flush(10)
    out = ok("topics", "delete", topics[0], "--topic", f"del-{tag}-[12]", "-b", b).stdout
    assert sorted(out.splitlines()) == [f"Deleted topic {t}." for t in topics]
    listed = ok("topics", "list", "-b", b).stdout.split()
    assert keep in listed and not set(topics) & set(listed)
    r = run("topics", "delete", f"del-{tag}-9", "-b", b)
    assert r.exit_code == 1 and "does not exist" in r.stderr
    assert ok("topics", "delete", f"del-{tag}-9", "--if-exists", "-b", b).stdout == ""
    r = run("topics", "delete", "-b", b)
    assert r.exit_code == 2  # nothing named: a usage error
    assert run("topics", "create", "a", "--topic", "b", "-b", b).exit_code == 2  # named twice
    # a pattern never matches an internal topic
    c = Consumer({"bootstrap.servers": b, "group.id": name("g")})  # makes __consumer_offsets
    c.subscribe([keep])
    c.poll(1)
    c.close()
    assert "__consumer_offsets" in ok("topics", "list", "-b", b).stdout.split()
    assert ok("topics", "delete", "__.*", "--if-exists", "-b", b).stdout == ""
    assert "__consumer_offsets" in ok("topics", "list", "-b", b).stdout.split()


def test_groups_views_all_groups_and_delete_offsets(broker: InProcessBroker) -> None:
    """kafka-consumer-groups.sh's --members, --state, --all-groups and --delete-offsets
    (OffsetDelete, API 47; a topic with partition numbers as T:0,1)."""
    b = broker.bootstrap
    t, group = name("gv"), name("g")
    ok("topics", "create", "--topic", t, "-p", "2", "-b", b)
    p = Producer({"bootstrap.servers": b})
    for i in range(4):
        p.produce(t, b"x", partition=i % 2)
    p.flush(10)
    c = Consumer({"bootstrap.servers": b, "group.id": group, "auto.offset.reset": "earliest",
                  "client.id": "parity-client"})
    c.subscribe([t])
    got = 0
    import time
    deadline = time.monotonic() + 30
    while got < 4 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got += 1
    c.commit(asynchronous=False)
    try:
        out = ok("groups", "describe", group, "--members", "-b", b).stdout
        assert "CONSUMER-ID" in out and "parity-client" in out and "#PARTITIONS" in out
        doc = json.loads(ok("groups", "describe", group, "--state", "-b", b,
                            "--format", "json").stdout)
        assert doc["state"] == "STABLE" and doc["members"] == 1
        docs = json.loads(ok("groups", "describe", "--all-groups", "-b", b,
                             "--format", "json").stdout)
        assert group in {d["group"] for d in docs}
        # the group still consumes the topic: Kafka refuses
        r = run("groups", "delete-offsets", group, "--topic", f"{t}:0", "-b", b)
        assert r.exit_code == 1 and "GROUP_SUBSCRIBED_TO_TOPIC" in r.stdout
    finally:
        c.close()
    out = ok("groups", "delete-offsets", group, "--topic", f"{t}:0", "-b", b).stdout
    assert "Successful" in out
    doc = json.loads(ok("groups", "describe", group, "-b", b, "--format", "json").stdout)
    assert {p["partition"] for p in doc["partitions"]} == {1}  # partition 0's offset went
    r = run("groups", "describe", "-b", b)
    assert r.exit_code == 2  # neither a group nor --all-groups


def test_cluster_health(broker: InProcessBroker) -> None:
    doc = json.loads(ok("cluster", "health", "-b", broker.bootstrap, "--format", "json").stdout)
    assert doc["healthy"] is True and doc["controller"] == 0
    assert doc["brokers_up"] == [0] and doc["brokers_down"] == []
    assert "Healthy:" in ok("cluster", "health", "-b", broker.bootstrap).stdout


def test_reset_offsets_selections_export_and_from_file(broker: InProcessBroker,
                                                       tmp_path: Any) -> None:
    """kafka-consumer-groups.sh --reset-offsets: T:P selections, --all-topics,
    --to-current with --export (CSV), --from-file of that CSV, --by-duration."""
    import time

    b = broker.bootstrap
    t, group = name("rs"), name("g")
    ok("topics", "create", "--topic", t, "-p", "2", "-b", b)
    p = Producer({"bootstrap.servers": b})
    for i in range(10):
        p.produce(t, b"x", partition=i % 2)
    p.flush(10)
    c = Consumer({"bootstrap.servers": b, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([t])
    got = 0
    deadline = time.monotonic() + 30
    while got < 10 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got += 1
    c.commit(asynchronous=False)
    c.close()
    deadline = time.monotonic() + 20
    while "no active members" not in ok("groups", "describe", group, "-b", b).stdout:
        assert time.monotonic() < deadline, "the group never became empty"
        time.sleep(0.1)
    csv = ok("groups", "reset-offsets", group, "--all-topics", "--to-current", "--export",
             "-b", b).stdout
    assert sorted(csv.split()) == [f"{t},0,5", f"{t},1,5"]
    ok("groups", "reset-offsets", group, "--topic", f"{t}:1", "--to-earliest", "--execute",
       "-b", b)
    doc = json.loads(ok("groups", "describe", group, "-b", b, "--format", "json").stdout)
    assert {q["partition"]: q["current_offset"] for q in doc["partitions"]} == {0: 5, 1: 0}
    saved = tmp_path / "offsets.csv"
    saved.write_text(csv)
    ok("groups", "reset-offsets", group, "--from-file", str(saved), "--execute", "-b", b)
    doc = json.loads(ok("groups", "describe", group, "-b", b, "--format", "json").stdout)
    assert {q["partition"]: q["current_offset"] for q in doc["partitions"]} == {0: 5, 1: 5}
    dry = ok("groups", "reset-offsets", group, "--all-topics", "--by-duration", "PT1H",
             "--export", "-b", b).stdout
    assert sorted(dry.split()) == [f"{t},0,0", f"{t},1,0"]  # everything is from the last hour
    r = run("groups", "reset-offsets", group, "--all-topics", "--by-duration", "soon", "-b", b)
    assert r.exit_code == 2


def test_connection_profiles(broker: InProcessBroker, tmp_path: Any) -> None:
    """rpk-style profiles: a bootstrap address (and a --command-config) chosen once; the
    command's -b and $HEADRACE_BOOTSTRAP still win."""
    env = {"HEADRACE_BOOTSTRAP": None, "HEADRACE_COMMAND_CONFIG": None,
           "HEADRACE_VERBOSE": None, "HEADRACE_CONFIG_DIR": str(tmp_path / "cfg")}

    def prun(*args: str, **extra: str) -> Result:
        try:
            return CliRunner().invoke(main, list(args), prog_name="headrace",
                                      env={**env, **extra})
        finally:
            set_verbose(False)

    t = name("prof")
    ok("topics", "create", "--topic", t, "-b", broker.bootstrap)
    r = prun("profile", "create", "local", "-b", broker.bootstrap, "--use")
    assert r.exit_code == 0, r.output
    r = prun("topics", "list")  # no -b: the profile's address
    assert r.exit_code == 0 and t in r.stdout.split(), (r.stdout, r.stderr)
    dead = "127.0.0.1:1"
    assert prun("topics", "list", "-b", dead).exit_code == 3  # -b wins
    assert prun("topics", "list", HEADRACE_BOOTSTRAP=dead).exit_code == 3  # so does the env
    tls = tmp_path / "tls.properties"
    tls.write_text("security.protocol=SSL\n")
    assert prun("profile", "create", "tls", "-b", broker.bootstrap,
                "--command-config", str(tls)).exit_code == 0
    listed = prun("profile", "list").stdout.splitlines()
    assert listed[0].startswith("* local") and listed[1].startswith("  tls")
    assert prun("profile", "use", "tls").exit_code == 0
    r = prun("topics", "list")  # its command-config applies: TLS against a plain listener
    assert r.exit_code == 4 and "TLS" in r.stderr
    assert prun("profile", "use", "nope").exit_code == 1
    assert prun("profile", "delete", "tls").exit_code == 0
    doc = json.loads(prun("profile", "list", "--format", "json").stdout)
    assert [(d["name"], d["in_use"]) for d in doc] == [("local", False)]
    assert (tmp_path / "cfg" / "profiles.json").stat().st_mode & 0o777 == 0o600
