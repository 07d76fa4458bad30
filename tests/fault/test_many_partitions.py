"""More partitions than the open-file limit (issue 8, item 9; R-NF-1).

Before the fix each partition held its segment files open: past the fd limit the broker
spun on EMFILE and then refused to start on that data dir at all. Now segment files go
through a capped LRU (``headrace.log.index.OPEN_FILES``, half the soft limit, which start-up
raises to the hard limit), so a broker whose hard limit is 256 hosts 600 partitions, starts,
and serves produce and fetch on every one of them.
"""

from __future__ import annotations

import functools
import resource
import subprocess
from pathlib import Path

import pytest

from tests import brokerproc
from tests.brokerproc import BrokerProcess
from tests.clients import Rec, consume, create_topic, produce

PARTITIONS = 600
LIMIT = 256


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def test_broker_with_more_partitions_than_its_fd_limit_starts_and_serves(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 item 9, R-NF-1: 600 partitions made in a normal run, then a broker limited
    to 256 fds starts on them, keeps its fds under the limit, and every partition takes a
    record and reads back all of its own; a topic of 600 more partitions can be created and
    used in the low-limit run too."""
    with BrokerProcess(data_dir) as b:
        create_topic("confluent", b.bootstrap, "many", PARTITIONS)
        produce("confluent", b.bootstrap, "many",
                [Rec(p, None, f"a{p}".encode()) for p in range(PARTITIONS)])
    monkeypatch.setattr(brokerproc.subprocess, "Popen",
                        functools.partial(subprocess.Popen, preexec_fn=_low_fd_limit))
    b = BrokerProcess(data_dir).start(timeout_s=120)
    monkeypatch.undo()
    try:
        assert b.proc is not None
        assert resource.prlimit(b.proc.pid, resource.RLIMIT_NOFILE) == (LIMIT, LIMIT)
        assert _open_fds(b.proc.pid) < LIMIT
        produce("confluent", b.bootstrap, "many",
                [Rec(p, None, f"b{p}".encode()) for p in range(PARTITIONS)])
        got = consume("confluent", b.bootstrap, "many", list(range(PARTITIONS)),
                      2 * PARTITIONS, timeout_s=60)
        assert sorted((r.partition, r.offset, r.value) for r in got) == sorted(
            [(p, 0, f"a{p}".encode()) for p in range(PARTITIONS)]
            + [(p, 1, f"b{p}".encode()) for p in range(PARTITIONS)])
        create_topic("confluent", b.bootstrap, "more", PARTITIONS)
        produce("confluent", b.bootstrap, "more",
                [Rec(p, None, f"c{p}".encode()) for p in range(PARTITIONS)])
        got = consume("confluent", b.bootstrap, "more", list(range(PARTITIONS)), PARTITIONS,
                      timeout_s=60)
        assert sorted((r.partition, r.offset) for r in got) == [
            (p, 0) for p in range(PARTITIONS)]
        assert _open_fds(b.proc.pid) < LIMIT
        assert not [ln for ln in b.stderr_lines if "Traceback" in ln or "EMFILE" in ln
                    or "Too many open files" in ln]
    finally:
        b.kill()
