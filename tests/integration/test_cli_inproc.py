"""Fast twins of the command-line tests (tests/integration/test_cli.py, test_cli_ux.py,
test_console.py, test_groups_cli.py; issue 22 item 1): the same ``headrace`` commands and
the same checks of their output and exit codes, run in this process with click's
``CliRunner`` against an in-process broker (tests/inproc.py), so no interpreter starts per
command. The slow modules keep proving the real entry point as users run it.
"""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, Producer

from headrace.broker.embedded import EmbeddedBroker
from headrace.broker.server import StartupError
from headrace.cli import main
from headrace.cli_support import set_verbose
from tests.inproc import InProcessBroker


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data = tmp_path_factory.mktemp("cli-inproc")
    with InProcessBroker(data, {"num.partitions": "1",
                                "group.initial.rebalance.delay.ms": "0"}) as b:
        yield b


def run(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> Result:
    """``headrace ARGS`` in this process: its exit code, stdout and stderr apart."""
    try:
        return CliRunner().invoke(main, list(args), input=stdin, prog_name="headrace",
                                  env={"HEADRACE_BOOTSTRAP": None,
                                       "HEADRACE_COMMAND_CONFIG": None,
                                       "HEADRACE_VERBOSE": None, **(env or {})})
    finally:
        set_verbose(False)  # the option sets a module flag; a process would forget it


def ok(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> Result:
    r = run(*args, stdin=stdin, env=env)
    assert r.exit_code == 0, (r.exit_code, r.stdout, r.stderr, r.exception)
    assert "Traceback" not in r.stderr
    return r


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def _topics(b: InProcessBroker) -> list[str]:
    return ok("topics", "list", "-b", b.bootstrap).stdout.split()


# ------------------------------------------------------------------ test_cli_ux.py's rules

UNREACHABLE = [("topics", "list"), ("topics", "describe", "--topic", "x"),
               ("groups", "describe", "g"), ("cluster", "info"), ("quotas", "describe")]


@pytest.mark.parametrize("argv", UNREACHABLE, ids=" ".join)
def test_nothing_listening_is_one_line_and_exit_3(argv: tuple[str, ...]) -> None:
    port = _dead_port()
    started = time.monotonic()
    r = run(*argv, "-b", f"127.0.0.1:{port}")
    assert r.exit_code == 3, (r.exit_code, r.stderr)
    assert r.stderr == f"headrace: cannot reach a broker at 127.0.0.1:{port}\n"
    assert r.stdout == ""
    assert time.monotonic() - started < 5


BAD_INPUT = [
    ("broker", "--log-level", "LOUD"), ("broker", "-o", "no-equals-sign"),
    ("broker", "--port", "-5"), ("broker", "-o", "num.partitions=zero"),
    ("topics", "create", "--topic", "t", "--partitions", "0"),
    ("topics", "create", "--topic", "t", "--config", "oops"),
    ("topics", "describe", "-b", "no-port"),
    ("topics", "delete-records", "--topic", "t", "--offset", "-7"),
    ("topics", "frobnicate"), ("groups", "reset-offsets", "g", "--topic", "t"),
    ("configs", "describe"), ("quotas", "set", "--user", "u", "--add-config",
                              "producer_byte_rate=fast"),
    ("no-such-command",),
]


@pytest.mark.parametrize("argv", BAD_INPUT, ids=" ".join)
def test_bad_input_is_one_line_exit_2_no_traceback(argv: tuple[str, ...]) -> None:
    r = run(*argv)
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headrace: "), r.stderr


def test_bad_broker_config_names_the_key() -> None:
    """test_cli.py's bad config: exit 2 and the key with the reason."""
    r = run("broker", "--data-dir", "/nonexistent-never-made", "--port", "0",
            "-o", "num.partitions=zero")
    assert r.exit_code == 2
    assert "num.partitions" in r.stderr and "expected an integer" in r.stderr


def test_read_only_commands_create_nothing(broker: InProcessBroker) -> None:
    name = f"never-{uuid.uuid4().hex[:6]}"
    r = run("topics", "describe", "-b", broker.bootstrap, "--topic", name)
    assert r.exit_code == 1 and name in r.stderr and len(r.stderr.splitlines()) == 1
    r = run("consume", name, "-b", broker.bootstrap, "-e")
    assert r.exit_code != 0 and "Traceback" not in r.stderr
    assert name not in _topics(broker)


def test_verbose_adds_the_reason() -> None:
    port = _dead_port()
    r = run("--verbose", "topics", "list", "-b", f"127.0.0.1:{port}")
    assert r.exit_code == 3
    assert "cannot reach a broker" in r.stderr and "refused" in r.stderr.lower()


def _command_paths() -> list[tuple[str, ...]]:
    import click

    out: list[tuple[str, ...]] = []

    def walk(cmd: click.Command, path: tuple[str, ...]) -> None:
        out.append(path)
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, (*path, name))

    walk(main, ())
    return out


def test_every_command_has_help_without_rest_markup_and_shows_defaults() -> None:
    paths = _command_paths()
    assert ("cluster", "info") in paths and ("configs", "alter") in paths
    texts = {}
    for path in paths:
        r = run(*path, "--help")
        assert r.exit_code == 0, path
        texts[path] = r.stdout
        description = r.stdout.partition("\n\n")[2].split("Options:")[0].strip()
        assert description, f"{' '.join(path)}: empty help"
        assert "``" not in r.stdout and ":meth:" not in r.stdout, path
        if path and "--bootstrap-server" in r.stdout:
            assert "-b, --bootstrap-server" in r.stdout and "HEADRACE_BOOTSTRAP" in r.stdout
    for code in ("0", "1", "2", "3", "4", "130"):
        assert re.search(rf"^\s+{code}\s+\w", texts[()], re.M), code
    assert "default: 127.0.0.1:9092" in " ".join(texts[("topics", "list")].split())


def test_bootstrap_option_spellings(broker: InProcessBroker) -> None:
    t = f"spell-{uuid.uuid4().hex[:6]}"
    ok("topics", "create", "-b", broker.bootstrap, "--topic", t)
    for argv, env in ((["-b", broker.bootstrap], None),
                      (["--bootstrap-server", broker.bootstrap], None),
                      (["--bootstrap", broker.bootstrap], None),
                      ([], {"HEADRACE_BOOTSTRAP": broker.bootstrap})):
        assert t in ok("topics", "list", *argv, env=env).stdout.split(), argv


def test_describe_offsets_sizes_and_add_partitions(broker: InProcessBroker) -> None:
    bs = ["-b", broker.bootstrap]
    t = f"sizes-{uuid.uuid4().hex[:6]}"
    ok("topics", "create", "--topic", t, "--partitions", "2", *bs)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(30):
        p.produce(t, b"x" * 100, partition=0 if i < 20 else 1)
    assert p.flush(30) == 0
    ok("topics", "delete-records", "--topic", t, "--partition", "0", "--offset", "5", *bs)
    (doc,) = json.loads(ok("topics", "describe", "--topic", t, "--format", "json", *bs).stdout)
    parts = {x["partition"]: x for x in doc["partitions"]}
    assert (parts[0]["log_start_offset"], parts[0]["log_end_offset"]) == (5, 20)
    assert (parts[1]["log_start_offset"], parts[1]["log_end_offset"]) == (0, 10)
    assert parts[0]["size_bytes"] > 1000 and parts[1]["size_bytes"] > 500
    assert "LogStartOffset: 5\tLogEndOffset: 20\tSize: " in ok(
        "topics", "describe", "--topic", t, *bs).stdout
    r = run("topics", "add-partitions", "--topic", t, "--partitions", "1", *bs)
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1


def test_cluster_info_and_configs(broker: InProcessBroker) -> None:
    bs = ["-b", broker.bootstrap]
    out = ok("cluster", "info", *bs).stdout
    port = broker.bootstrap.rsplit(":", 1)[1]
    assert "Cluster id: " in out and "Controller: 0" in out
    assert re.search(rf"^0\s+127\.0\.0\.1\s+{port}\s+-\s+yes$", out, re.M), out
    doc = json.loads(ok("cluster", "info", "--format", "json", *bs).stdout)
    assert doc["brokers"] == [{"id": 0, "host": "127.0.0.1", "port": int(port), "rack": None}]
    t = f"cfg-{uuid.uuid4().hex[:6]}"
    ok("topics", "create", "--topic", t, *bs)
    ok("configs", "alter", "--topic", t, "--set", "retention.ms=4242", *bs)
    doc = json.loads(ok("configs", "describe", "--topic", t, "--format", "json", *bs).stdout)
    assert {"name": "retention.ms", "value": "4242", "source": "DYNAMIC_TOPIC_CONFIG",
            "read_only": False, "sensitive": False} in doc
    ok("configs", "alter", "--topic", t, "--delete", "retention.ms", *bs)
    assert "retention.ms" not in ok("configs", "describe", "--topic", t, *bs).stdout
    names = {e["name"] for e in json.loads(ok("configs", "describe", "--broker", "0",
                                              "--format", "json", *bs).stdout)}
    assert "log.dirs" in names


def test_configs_of_brokers_defaults_and_groups(tmp_path: Path) -> None:
    """Issue 27: ``configs alter|describe`` on a broker id, the cluster-wide defaults
    (kafka-configs.sh --entity-default) and a group; a read-only config is refused in one
    line with Kafka's text (exit 1). A broker of its own: the changes are dynamic."""
    with InProcessBroker(tmp_path / "data", {"num.partitions": "1"}) as b:
        bs = ["-b", b.bootstrap]
        ok("configs", "alter", "--broker", "0", "--set", "log.retention.ms=3600000", *bs)
        ok("configs", "alter", "--broker-defaults", "--set", "message.max.bytes=5000", *bs)
        doc = json.loads(ok("configs", "describe", "--broker", "0", "--format", "json",
                            *bs).stdout)
        assert {"name": "log.retention.ms", "value": "3600000",
                "source": "DYNAMIC_BROKER_CONFIG", "read_only": False,
                "sensitive": False} in doc
        assert {"name": "message.max.bytes", "value": "5000",
                "source": "DYNAMIC_DEFAULT_BROKER_CONFIG", "read_only": False,
                "sensitive": False} in doc
        out = ok("configs", "describe", "--broker-defaults", *bs).stdout
        assert re.search(r"^message\.max\.bytes\s+5000\s+DYNAMIC_DEFAULT_BROKER_CONFIG$",
                         out, re.M), out
        r = run("configs", "alter", "--broker", "0", "--set", "log.dirs=/x", *bs)
        assert r.exit_code == 1 and r.stderr.strip().splitlines() == [
            "headrace: Invalid config value for resource ConfigResource(type=BROKER, "
            "name='0'): Cannot update these configs dynamically: Set(log.dirs)"], r.stderr
        ok("configs", "alter", "--group", "g1", "--set", "consumer.session.timeout.ms=50000",
           *bs)
        doc = json.loads(ok("configs", "describe", "--group", "g1", "--format", "json",
                            *bs).stdout)
        assert doc == [{"name": "consumer.session.timeout.ms", "value": "50000",
                        "source": "GROUP_CONFIG", "read_only": False, "sensitive": False}]
        ok("configs", "alter", "--broker-defaults", "--delete", "message.max.bytes", *bs)
        assert "No configs set on the default broker configs" in ok(
            "configs", "describe", "--broker-defaults", *bs).stdout


def test_listing_commands_speak_json(broker: InProcessBroker) -> None:
    for argv in (("topics", "list"), ("topics", "describe"), ("topics", "reassignments"),
                 ("groups", "list"), ("transactions", "list"), ("acls", "list"),
                 ("users", "list"), ("quotas", "describe"), ("cluster", "info"),
                 ("configs", "describe", "--broker", "0")):
        json.loads(ok(*argv, "--format", "json", "-b", broker.bootstrap).stdout)


# ------------------------------------------------------------------ test_cli.py's rules


def test_port_taken_and_unusable_data_dir_are_refused_with_the_reason(tmp_path: Path) -> None:
    """The start-up errors ``headrace broker`` prints (test_cli.py), from the broker itself."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        # issue 26 item 7: what to do, as the quickstart's 9092 meets `headrace cluster`'s
        with pytest.raises(StartupError, match=f"port {port}.*already in use: stop what "
                           r"listens there .*headrace cluster.* or give another --port"):
            EmbeddedBroker(tmp_path / "d", port).start()
    f = tmp_path / "a-file"
    f.write_text("not a directory")
    with pytest.raises(StartupError, match="not a directory"):
        EmbeddedBroker(f, 0).start()


def test_topics_commands(broker: InProcessBroker) -> None:
    bs = ["--bootstrap-server", broker.bootstrap]
    t = f"cli-t-{uuid.uuid4().hex[:6]}"
    ok("topics", "create", *bs, "--topic", t, "--partitions", "3",
       "--config", "retention.ms=12345")
    assert t in _topics(broker)
    d = ok("topics", "describe", *bs, "--topic", t).stdout
    assert "PartitionCount: 3" in d and "retention.ms=12345" in d
    assert d.count("Partition: ") == 3
    r = run("topics", "alter-config", *bs, "--topic", t, "--set", "retention.ms=999",
            "--delete", "nothing.here")
    assert r.exit_code != 0 and "nothing.here" in r.stderr
    ok("topics", "alter-config", *bs, "--topic", t, "--set", "retention.ms=999")
    assert "retention.ms=999" in ok("topics", "describe", *bs, "--topic", t).stdout
    r = run("topics", "create", *bs, "--topic", t)
    assert r.exit_code != 0 and "already exists" in r.stderr
    r = run("topics", "create", *bs, "--topic", "bad name!")
    assert r.exit_code != 0 and "illegal" in r.stderr.lower()
    ok("topics", "add-partitions", *bs, "--topic", t, "--partitions", "4")
    assert ok("topics", "describe", *bs, "--topic", t).stdout.count("Partition: ") == 4
    listed = json.loads(ok("topics", "list", *bs, "--format", "json").stdout)
    assert t in json.dumps(listed)
    ok("topics", "delete", *bs, "--topic", t)
    assert t not in _topics(broker)


# ------------------------------------------------------------------ test_console.py's rules


def test_produce_and_consume_keys_headers_and_template(broker: InProcessBroker) -> None:
    t = f"console-{uuid.uuid4().hex[:6]}"
    err = ok("produce", t, "-b", broker.bootstrap, "--key-separator", "=", "-H", "src=test",
             "-H", "n=1", stdin=b"k1=hello\nk2=world=2\nno-key\n").stderr
    assert "produced 3 records" in err and "3 delivered, 0 failed" in err
    out = ok("consume", t, "-b", broker.bootstrap, "--from-beginning", "-e",
             "-F", r"{topic}|{partition}:{offset}\t{key}={value} [{headers}]").stdout
    assert out.splitlines() == [f"{t}|0:0\tk1=hello [src:test,n:1]",
                                f"{t}|0:1\tk2=world=2 [src:test,n:1]",
                                f"{t}|0:2\t=no-key [src:test,n:1]"]
    assert ok("consume", t, "-b", broker.bootstrap, "--from-beginning", "-e"
              ).stdout.splitlines() == ["hello", "world=2", "no-key"]
    rows = [json.loads(x) for x in ok("consume", t, "-b", broker.bootstrap,
                                      "--from-beginning", "-e", "--json").stdout.splitlines()]
    assert [(r["offset"], r["key"], r["value"]) for r in rows] == [
        (0, "k1", "hello"), (1, "k2", "world=2"), (2, None, "no-key")]
    assert rows[0]["headers"] == [{"key": "src", "value": "test"}, {"key": "n", "value": "1"}]


def test_consume_format_means_text_or_json(broker: InProcessBroker) -> None:
    """Issue 26 defect 6: ``consume --format json`` printed the word "json" per record
    (--format was the template for consume, the text/json switch everywhere else). Now
    one meaning per flag: --format text|json, the template is -F/--template; a template
    given as --format (the old spelling) still works, with a one-line note."""
    t = f"console-{uuid.uuid4().hex[:6]}"
    ok("produce", t, "-b", broker.bootstrap, stdin=b"hello\n")
    base = ("consume", t, "-b", broker.bootstrap, "--from-beginning", "-e")
    (row,) = ok(*base, "--format", "json").stdout.splitlines()
    assert json.loads(row)["value"] == "hello"
    assert ok(*base, "--format", "text").stdout.splitlines() == ["hello"]
    assert ok(*base, "--template", "{offset}:{value}").stdout.splitlines() == ["0:hello"]
    old = ok(*base, "--format", "{offset}:{value}")
    assert old.stdout.splitlines() == ["0:hello"]
    assert "now given with -F/--template" in old.stderr
    bad = run(*base, "--format", "yaml")
    assert bad.exit_code == 2 and "--format: expected text or json" in bad.stderr


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_produce_compressed_and_consume_a_count(broker: InProcessBroker, codec: str) -> None:
    t = f"console-{codec}-{uuid.uuid4().hex[:6]}"
    lines = [f"{codec}-{i:04d}-" + "x" * 20 for i in range(300)]
    err = ok("produce", t, "-b", broker.bootstrap, "--compression", codec, "--acks", "1",
             stdin="".join(x + "\n" for x in lines).encode()).stderr
    assert "produced 300 records" in err
    assert ok("consume", t, "-b", broker.bootstrap, "--from-beginning", "-e"
              ).stdout.splitlines() == lines
    assert ok("consume", t, "-b", broker.bootstrap, "--from-beginning", "-n", "5",
              "--timeout-ms", "10000").stdout.splitlines() == lines[:5]


def test_missing_partition_and_unreachable_broker_are_one_line(broker: InProcessBroker) -> None:
    t = f"console-{uuid.uuid4().hex[:6]}"
    ok("topics", "create", "-b", broker.bootstrap, "--topic", t)
    r = run("consume", t, "-b", broker.bootstrap, "-p", "7", "-e")
    assert r.exit_code != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    port = _dead_port()
    r = run("produce", t, "-b", f"127.0.0.1:{port}", stdin=b"x\n")
    assert r.exit_code == 3 and r.stderr == f"headrace: cannot reach a broker at 127.0.0.1:{port}\n"


# ------------------------------------------------------------------ test_groups_cli.py's rules


def _rows(stdout: str, topic: str) -> dict[int, list[str]]:
    return {int(c[2]): c for c in (ln.split() for ln in stdout.splitlines())
            if len(c) >= 4 and c[1] == topic}


def test_groups_describe_lag_and_reset_offsets(broker: InProcessBroker) -> None:
    bs = ["--bootstrap-server", broker.bootstrap]
    t, group = f"grp-t-{uuid.uuid4().hex[:6]}", f"cli-group-{uuid.uuid4().hex[:6]}"
    ok("topics", "create", *bs, "--topic", t, "--partitions", "2")
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for part in range(2):
        for i in range(10):
            p.produce(t, value=b"v%d" % i, partition=part, timestamp=1_000_000 + i)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        c.subscribe([t])
        got, deadline = 0, time.monotonic() + 30
        while got < 20 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got += 1
                c.commit(message=m, asynchronous=False)
        assert got == 20
        rows = _rows(ok("groups", "describe", group, *bs).stdout, t)
        assert {k: r[3:6] for k, r in rows.items()} == {0: ["10", "10", "0"],
                                                        1: ["10", "10", "0"]}
        r = run("groups", "reset-offsets", group, "--topic", t, "--to-earliest", "--execute",
                *bs)
        assert r.exit_code != 0 and "inactive" in r.stderr
    finally:
        c.close()
    assert group in ok("groups", "list", *bs).stdout.split()
    deadline = time.monotonic() + 20
    while "no active members" not in ok("groups", "describe", group, *bs).stdout:
        assert time.monotonic() < deadline, "the group never became empty"
        time.sleep(0.1)
    assert "TOTAL-LAG 0" in ok("groups", "lag", group, *bs).stdout
    dry = ok("groups", "reset-offsets", group, "--topic", t, "--to-earliest", *bs).stdout
    assert all(r[3] == "0" for r in _rows(dry, t).values())
    assert "TOTAL-LAG 0" in ok("groups", "lag", group, *bs).stdout  # a dry run commits nothing

    def reset(*mode: str) -> dict[int, str]:
        ok("groups", "reset-offsets", group, "--topic", t, *mode, "--execute", *bs)
        return {k: r[3] for k, r in _rows(ok("groups", "describe", group, *bs).stdout,
                                         t).items()}

    assert reset("--to-earliest") == {0: "0", 1: "0"}
    assert "TOTAL-LAG 20" in ok("groups", "lag", group, *bs).stdout
    assert reset("--shift-by", "3") == {0: "3", 1: "3"}
    assert reset("--to-offset", "999") == {0: "10", 1: "10"}
    assert reset("--to-datetime", "1970-01-01T00:16:40.005+00:00") == {0: "5", 1: "5"}
    r = run("groups", "describe", "no-such-group", *bs)
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1
    ok("groups", "delete", group, *bs)
    assert group not in ok("groups", "list", *bs).stdout.split()


def test_one_record_is_singular(broker: InProcessBroker) -> None:
    """Issue 26 defect 7: "produced 1 records"."""
    t = f"console-{uuid.uuid4().hex[:6]}"
    err = ok("produce", t, "-b", broker.bootstrap, stdin=b"one\n").stderr
    assert "produced 1 record (" in err
    err = ok("consume", t, "-b", broker.bootstrap, "--from-beginning", "-e").stderr
    assert err.strip() == "headrace: consumed 1 record"
