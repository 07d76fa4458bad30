"""The new kafka-topics.sh / kafka-consumer-groups.sh / rpk options (issue 26, "CLI
parity") through the real entry point, a ``headrace`` process per command, against a
broker process: exit codes and output as a script sees them. Their rules are tested in
process (test_cli_parity.py); this proves the commands as users run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.brokerproc import BrokerProcess

HEADRACE = [sys.executable, "-m", "headrace.cli"]


def test_the_new_options_through_the_real_entry_point(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env["HEADRACE_CONFIG_DIR"] = str(tmp_path / "cfg")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*HEADRACE, *args], capture_output=True, text=True, timeout=60,
                              env=env)

    with BrokerProcess(tmp_path / "data", {"num.partitions": "1"}) as b:
        bs = ("-b", b.bootstrap)
        assert run("profile", "create", "here", *bs, "--use").returncode == 0
        r = run("cluster", "health", "--format", "json")  # through the profile
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["healthy"] is True
        assert run("topics", "create", "t1", "-p", "2", "-c", "min.insync.replicas=2"
                   ).returncode == 0
        r = run("topics", "describe", "t1", "--under-min-isr-partitions")
        assert r.returncode == 0 and r.stdout.count("\tTopic: t1\tPartition:") == 2
        r = run("topics", "delete", "t.*", "--if-exists")
        assert r.returncode == 0 and r.stdout.strip() == "Deleted topic t1."
        r = run("topics", "delete", "t1")
        assert r.returncode == 1 and "does not exist" in r.stderr
        r = run("groups", "describe", "--all-groups", "--state", "--format", "json")
        assert r.returncode == 0 and json.loads(r.stdout) == []
        r = run("groups", "reset-offsets", "g", "--all-topics", "--by-duration", "later")
        assert r.returncode == 2 and "Traceback" not in r.stderr
        # every other new option, as a script runs it
        assert run("topics", "create", "--topic", "t2", "-r", "1").returncode == 0
        assert "__consumer_offsets" not in run("topics", "list", "--exclude-internal").stdout
        for flag in ("--under-replicated-partitions", "--unavailable-partitions"):
            r = run("topics", "describe", "t2", flag)
            assert r.returncode == 0 and r.stdout == "", (flag, r.stdout, r.stderr)
        r = run("topics", "describe", "--exclude-internal", "--at-min-isr-partitions")
        assert r.returncode == 0 and "\tTopic: t2\tPartition: 0" in r.stdout
        from confluent_kafka import Consumer, Producer

        p = Producer({"bootstrap.servers": b.bootstrap})
        for _ in range(4):
            p.produce("t2", b"x")
        p.flush(10)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "pg",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.subscribe(["t2"])
        seen = 0
        import time
        deadline = time.monotonic() + 30
        while seen < 4 and time.monotonic() < deadline:
            m = c.poll(0.5)
            seen += m is not None and not m.error()
        c.commit(asynchronous=False)
        r = run("groups", "describe", "pg", "--members")
        assert r.returncode == 0 and "#PARTITIONS" in r.stdout
        c.close()
        deadline = time.monotonic() + 20
        while "no active members" not in run("groups", "describe", "pg").stdout:
            assert time.monotonic() < deadline
        r = run("groups", "reset-offsets", "pg", "--topic", "t2:0", "--to-current", "--export")
        assert r.returncode == 0 and r.stdout.split() == ["t2,0,4"]
        saved = tmp_path / "offsets.csv"
        saved.write_text("t2,0,1\n")
        r = run("groups", "reset-offsets", "pg", "--from-file", str(saved), "--execute")
        assert r.returncode == 0, r.stderr
        r = run("groups", "reset-offsets", "pg", "--all-topics", "--to-earliest", "--export")
        assert r.stdout.split() == ["t2,0,0"]
        r = run("groups", "delete-offsets", "pg", "--topic", "t2")
        assert r.returncode == 0 and "Successful" in r.stdout
        assert run("profile", "list").stdout.startswith("* here")
        assert run("profile", "delete", "here").returncode == 0
