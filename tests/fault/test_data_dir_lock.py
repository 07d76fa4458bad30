"""The data directory's lock and start-up checks (issue 8, items 3 and 13; R-LOG-4).

Two brokers appending to one segment assign the same offsets and lose acknowledged records
at the next recovery, so a second broker on a data dir in use must refuse to start, with one
clear line, before it opens any log (Kafka's ``.lock`` in every log dir).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headrace.broker.embedded import EmbeddedBroker
from headrace.broker.server import StartupError
from tests.brokerproc import BrokerProcess
from tests.clients import Rec, consume, create_topic, produce


def _run_broker(data_dir: Path, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    """``headrace broker`` that is expected to refuse to start (exits by itself)."""
    return subprocess.run(
        [sys.executable, "-m", "headrace.cli", "broker", "--data-dir", str(data_dir),
         "--port", "0"],
        capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_second_broker_process_on_a_locked_data_dir_is_refused(data_dir: Path) -> None:
    """Issue 8 item 3, R-LOG-4: with one broker running on ``data_dir``, a second
    ``headrace broker`` on it exits non-zero with one line naming the lock, opens no log,
    and the first broker's acknowledged records stay intact."""
    with BrokerProcess(data_dir) as first:
        create_topic("confluent", first.bootstrap, "locked", 1)
        produce("confluent", first.bootstrap, "locked",
                [Rec(0, None, f"a-{i}".encode()) for i in range(100)])
        second = _run_broker(data_dir)
        assert second.returncode != 0
        lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert any("in use by another broker" in ln and str(data_dir) in ln for ln in lines), (
            second.stderr)
        assert "Traceback" not in second.stderr
        assert not any("opened log" in ln or "created log" in ln or "partition log" in ln
                       for ln in lines), lines
        assert not any("listening on" in ln for ln in lines)
        produce("confluent", first.bootstrap, "locked",
                [Rec(0, None, f"b-{i}".encode()) for i in range(100)])
        got = consume("confluent", first.bootstrap, "locked", [0], 200)
        assert [(r.offset, r.value) for r in got] == (
            [(i, f"a-{i}".encode()) for i in range(100)]
            + [(100 + i, f"b-{i}".encode()) for i in range(100)])
        assert first.proc is not None and first.proc.poll() is None
    # the first broker stopped: its lock went with it, a new broker starts on the dir
    with BrokerProcess(data_dir) as again:
        got = consume("confluent", again.bootstrap, "locked", [0], 200)
        assert len(got) == 200


def test_lock_is_released_by_kill_9(data_dir: Path) -> None:
    """Issue 8 item 3: the lock is a kernel lock (flock), so a broker killed with kill -9
    leaves no stale lock: the next broker starts on the same dir, and holds the lock in
    turn (a further broker is refused)."""
    b = BrokerProcess(data_dir).start()
    b.kill()
    b.start()
    try:
        refused = _run_broker(data_dir)
        assert refused.returncode != 0 and "in use by another broker" in refused.stderr
    finally:
        b.stop()


def test_embedded_broker_start_stop_start_and_a_second_one_refused(data_dir: Path) -> None:
    """Issue 8 item 3: an EmbeddedBroker takes the lock and gives it back on stop (it can
    start again on the same dir); a second one on the same dir, in the same process, is
    refused with a StartupError while the first runs (flock locks are per open file, so
    this holds within one process too)."""
    first = EmbeddedBroker(data_dir).start()
    try:
        second = EmbeddedBroker(data_dir)
        with pytest.raises(StartupError, match="in use by another broker"):
            second.start()
    finally:
        first.stop()
    again = EmbeddedBroker(data_dir).start()
    again.stop()
    again = EmbeddedBroker(data_dir).start()
    again.stop()


def test_data_dir_whose_parent_is_a_file(tmp_path: Path) -> None:
    """Issue 8 item 13: a data dir whose parent is a file is reported as such."""
    parent = tmp_path / "afile"
    parent.write_text("x")
    r = _run_broker(parent / "data")
    assert r.returncode != 0
    assert f"parent {parent} is not a directory" in r.stderr, r.stderr
    assert "exists and is not a directory" not in r.stderr
    assert "Traceback" not in r.stderr
