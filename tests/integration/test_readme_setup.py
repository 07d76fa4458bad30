"""The README's two set-up commands and `bash scripts/run.sh broker`, as written (issue 13,
item 4).

`bash scripts/test.sh` is what CI runs (`.ci/run` execs it; this test run is it), so the test
here checks that `.ci/run` runs exactly the README's command. `bash scripts/run.sh` (the
whole demo) runs once per test run, as written, and `test_demo.py` reads it
(``test_main_job_as_written``; issue 22: one demo run shared by its readers). These run
from the clone with its own `.venv` (what CI has); elsewhere (a git worktree whose tests
use another clone's venv) the scripts would build a second `.venv`, so they skip there."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.brokerproc import wait_until
from tests.ports import reserve_port
from tests.readme import ROOT, commands

pytestmark = pytest.mark.timeout(400)

VENV = Path(sys.executable).parent.parent


def _in_clone() -> None:
    if VENV.resolve() != (ROOT / ".venv").resolve():
        pytest.skip(f"tests run with {VENV}, not this clone's .venv: the scripts would "
                    "install a second one")


def _free_port() -> int:
    return reserve_port()  # outside the ephemeral range (tests/ports.py)


def test_ci_runs_the_readmes_test_command() -> None:
    run, test = commands("setup-commands")
    assert (run, test) == ("bash scripts/run.sh", "bash scripts/test.sh")
    ci = (ROOT / ".ci" / "run").read_text()
    last = [ln for ln in ci.splitlines() if ln.strip() and not ln.startswith("#")][-1]
    assert re.fullmatch(r'bash scripts/test\.sh( -rs)? "\$@"', last), last


def test_run_broker_as_written(tmp_path: Path) -> None:
    """`bash scripts/run.sh broker`, its port and data dir from HEADRACE_PORT and
    HEADRACE_DATA_DIR: it serves a client, and SIGTERM stops it cleanly."""
    _in_clone()
    (line,) = commands("run-broker")
    port = _free_port()
    env = {**os.environ, "HEADRACE_PORT": str(port), "HEADRACE_DATA_DIR": str(tmp_path / "d")}
    log = tmp_path / "broker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", "-c", line], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        def listening() -> bool:
            assert proc.poll() is None, log.read_text()
            return f"listening on 127.0.0.1:{port}" in log.read_text()

        wait_until(listening, 120, 0.1, "run.sh's broker")
        bootstrap = f"127.0.0.1:{port}"
        p = Producer({"bootstrap.servers": bootstrap})
        p.produce("run-broker", b"hello", partition=0)
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g"})
        c.assign([TopicPartition("run-broker", 0, 0)])
        got = wait_until(lambda: c.poll(0.5), 20, 0, "the record")
        c.close()
        assert got.value() == b"hello"
        assert (tmp_path / "d" / "run-broker-0").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)  # run.sh execs the broker: the signal reaches it
        rc = proc.wait(60)
    assert rc == 0, log.read_text()
    assert "Traceback" not in log.read_text()
