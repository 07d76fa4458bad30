"""The ``headrace`` command: broker start-up errors and ``topics`` administration
(issue 2 §5; R-PROTO-5, R-NF-1)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.brokerproc import BrokerProcess

HEADRACE = [sys.executable, "-m", "headrace.cli"]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HEADRACE, *args], capture_output=True, text=True, timeout=timeout)


def test_port_taken_exits_non_zero_with_a_clear_message(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _run("broker", "--data-dir", str(tmp_path / "d"), "--port", str(port), timeout=30)
    assert r.returncode != 0
    assert f"port {port}" in r.stderr and "already in use" in r.stderr


def test_unusable_data_dir_exits_non_zero(tmp_path: Path) -> None:
    f = tmp_path / "a-file"
    f.write_text("not a directory")
    r = _run("broker", "--data-dir", str(f), "--port", "0", timeout=30)
    assert r.returncode != 0
    assert "not a directory" in r.stderr


def test_bad_config_exits_non_zero(tmp_path: Path) -> None:
    r = _run("broker", "--data-dir", str(tmp_path), "--port", "0", "-o",
             "num.partitions=zero", timeout=30)
    assert r.returncode == 2
    assert "num.partitions" in r.stderr and "expected an integer" in r.stderr


def test_topics_commands(broker: BrokerProcess) -> None:
    bs = ["--bootstrap-server", broker.bootstrap]
    r = _run("topics", "create", *bs, "--topic", "cli-t", "--partitions", "3",
             "--config", "retention.ms=12345")
    assert r.returncode == 0, r.stderr
    assert "cli-t" in _run("topics", "list", *bs).stdout.split()
    d = _run("topics", "describe", *bs, "--topic", "cli-t")
    assert d.returncode == 0, d.stderr
    assert "PartitionCount: 3" in d.stdout and "retention.ms=12345" in d.stdout
    assert d.stdout.count("Partition: ") == 3
    r = _run("topics", "alter-config", *bs, "--topic", "cli-t", "--set", "retention.ms=999",
             "--delete", "nothing.here")
    assert r.returncode != 0 and "nothing.here" in r.stderr  # unknown config: INVALID_CONFIG
    r = _run("topics", "alter-config", *bs, "--topic", "cli-t", "--set", "retention.ms=999")
    assert r.returncode == 0, r.stderr
    assert "retention.ms=999" in _run("topics", "describe", *bs, "--topic", "cli-t").stdout
    r = _run("topics", "create", *bs, "--topic", "cli-t")
    assert r.returncode != 0 and "already exists" in r.stderr
    r = _run("topics", "create", *bs, "--topic", "bad name!")
    assert r.returncode != 0 and "illegal" in r.stderr.lower()
    r = _run("topics", "delete", *bs, "--topic", "cli-t")
    assert r.returncode == 0, r.stderr
    assert "cli-t" not in _run("topics", "list", *bs).stdout.split()
