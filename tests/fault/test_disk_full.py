"""A full disk under a real broker process (issue 8, item 2; R-LOG-4, R-NF-1).

The data dir lives on a small tmpfs. The disk is filled, produces fail (KAFKA_STORAGE_ERROR,
never an acknowledgement of what was not stored), space is freed, more records are
acknowledged with acks=all, the broker restarts, and every acknowledged (offset, value) is
read back exactly. Before the fix a failed write left a torn batch in the active segment;
later batches were written behind it, acknowledged, never readable, and truncated away at
the restart.

Needs root to mount the tmpfs; skipped (visibly) only if the mount is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.brokerproc import BrokerProcess
from tests.clients import consume, create_topic


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def _fill(path: Path) -> int:
    """Write ``path`` until the file system is full; returns the bytes written."""
    written = 0
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                n = f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                chunk = chunk[: len(chunk) // 2]
                if not chunk:
                    return written
                continue
            written += n or 0


class _Acker:
    """acks=all, no retries: records whose delivery report says stored, with offsets."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: dict[int, bytes] = {}
        self.failed = 0
        self.lock = threading.Lock()
        self.p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "retries": 0,
                           "linger.ms": 5, "batch.num.messages": 20,
                           "message.timeout.ms": 15000, "enable.idempotence": False})

    def _done(self, err: object, msg: object) -> None:
        with self.lock:
            if err is None:
                self.acked[msg.offset()] = msg.value()  # type: ignore[attr-defined]
            else:
                self.failed += 1

    def send(self, values: list[bytes]) -> None:
        for v in values:
            while True:
                try:
                    self.p.produce("full", v, partition=0, on_delivery=self._done)
                    break
                except BufferError:
                    self.p.poll(0.05)
            self.p.poll(0)
        assert self.p.flush(30) == 0


def test_full_disk_then_freed_space_loses_no_acknowledged_record(small_disk: Path) -> None:
    """Issue 8 item 2, R-LOG-4: fill the disk, produce (errors), free space, produce more
    with acks=all, restart: every acknowledged (offset, value) reads back, in place."""
    data = small_disk / "data"
    filler = small_disk / "filler"
    b = BrokerProcess(data, {"log.segment.bytes": str(1 << 20)}).start()
    try:
        create_topic("confluent", b.bootstrap, "full", 1)
        acker = _Acker(b.bootstrap)
        acker.send([f"before-{i:05d}-".encode() + b"x" * 500 for i in range(500)])
        assert len(acker.acked) == 500 and acker.failed == 0
        _fill(filler)
        acker.send([f"full-{i:05d}-".encode() + b"y" * 3000 for i in range(300)])
        assert acker.failed > 0, "nothing failed on a full disk"
        filler.unlink()
        acker.send([f"after-{i:05d}-".encode() + b"z" * 500 for i in range(500)])
        after = [v for v in acker.acked.values() if v.startswith(b"after-")]
        assert len(after) == 500, f"{len(after)} of 500 acknowledged after space was freed"
        acked = dict(acker.acked)
        # what the running broker serves, and what the restarted one recovers
        for restart in (None, "kill", "graceful"):
            if restart == "kill":
                b.kill()
                b.start()
            elif restart == "graceful":
                b.restart()
            got = consume("confluent", b.bootstrap, "full", [0], max(acked) + 1, timeout_s=30)
            served = {r.offset: r.value for r in got}
            missing = [o for o in acked if served.get(o) != acked[o]]
            assert not missing, (restart, len(missing), missing[:5])
            assert sorted(served) == list(range(len(served))), "gap in the offsets"
        assert not [ln for ln in b.stderr_lines if "Traceback" in ln]
    finally:
        b.kill()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(filler)
