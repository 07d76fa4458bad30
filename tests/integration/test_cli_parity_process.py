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
