"""Compaction with tombstones on a real broker killed with kill -9 while it compacts
(issue 8, "the tests must prove what the README claims"; R-LOG-4, R-LOG-6).

A producer keeps writing updates and tombstones over a few keys (acks=all) to a compacted
topic with small segments while the broker compacts every 100 ms; the broker is killed
with SIGKILL right after it logged a compaction (with the producer still writing, so the
next compaction is under way or about to be), restarted, and this is done three times.
Then a reader from the beginning must see, for every key, its latest acknowledged record
(or a later one the broker stored before dying without acknowledging it), a deleted key
either absent or ending in its tombstone, offsets strictly increasing, and no cleaner
output left behind. Such kills rarely land inside a swap (a swap takes milliseconds), so a
second test makes the broker SIGKILL itself at each step of the swap (the
``HEADRACE_FAILPOINT`` environment variable, ``partition_log.failpoint``). kill -9 keeps
the page cache: this tests the ``.cleaned``/``.swap`` protocol and recovery, not fsync (see
tests/fault/test_restart_and_corruption.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KTopicPartition

from tests.brokerproc import BrokerProcess, wait_until
from tests.clients import create_topic

KEYS = 30


class _Writer:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[bytes, tuple[int, bytes | None]] = {}  # key -> latest acked
        self.sent: dict[bytes, set[bytes | None]] = {}
        self.n_acked = 0
        self.stop = threading.Event()
        self.bootstrap = ""

    def _done(self, err: object, msg: object) -> None:
        if err is not None:
            return
        key, offset = msg.key(), msg.offset()  # type: ignore[attr-defined]
        with self.lock:
            self.n_acked += 1
            if key not in self.acked or self.acked[key][0] < offset:
                self.acked[key] = (offset, msg.value())  # type: ignore[attr-defined]

    def run(self, bootstrap: str) -> None:
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2,
                      "batch.num.messages": 10, "retries": 0, "message.timeout.ms": 3000,
                      "enable.idempotence": False})
        i = 0
        while not self.stop.is_set():
            key = b"k%02d" % (i % KEYS)
            value = None if i % 11 == 5 else b"v-%07d-" % i + b"." * 100
            with self.lock:
                self.sent.setdefault(key, set()).add(value)
            try:
                p.produce("compacted", value, key, partition=0, on_delivery=self._done)
                i += 1
            except BufferError:
                pass
            p.poll(0.001)
        p.flush(5)


def _read_all(bootstrap: str) -> list[tuple[int, bytes, bytes | None]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "compaction-crash",
                  "enable.auto.commit": False})
    try:
        low, high = c.get_watermark_offsets(KTopicPartition("compacted", 0), timeout=10)
        c.assign([KTopicPartition("compacted", 0, low)])
        out: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + 60
        while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                out.append((m.offset(), m.key(), m.value()))
        assert out and out[-1][0] == high - 1, "did not read up to the high watermark"
        return out
    finally:
        c.close()


def _compactions(b: BrokerProcess) -> int:
    return sum(1 for ln in b.stderr_lines if "compacted " in ln)


def test_kill_9_during_compaction_keeps_latest_acknowledged_per_key(data_dir: Path) -> None:
    """R-LOG-4, R-LOG-6: three kill -9 while compacting with tombstones; every key's
    latest acknowledged record (or a later stored one) survives, deleted keys stay
    deleted, nothing is duplicated, no cleaner output stays behind."""
    b = BrokerProcess(data_dir, {"log.retention.check.interval.ms": "100"}).start()
    w = _Writer()
    try:
        create_topic("confluent", b.bootstrap, "compacted", 1,
                     {"cleanup.policy": "compact", "segment.bytes": "8192",
                      "delete.retention.ms": "0"})
        for round_ in range(1, 4):
            w.stop.clear()
            t = threading.Thread(target=w.run, args=(b.bootstrap,), daemon=True)
            t.start()
            wait_until(lambda: w.n_acked >= 600 * round_ and _compactions(b) >= 2, 60,  # noqa: B023
                       what="600 more acknowledged records and two compactions")
            b.kill()  # right after a compaction, with the writer still writing
            w.stop.set()
            t.join(15)
            assert not t.is_alive()
            b.start()
        assert w.n_acked > 1000
        # more records after the last restart: the kill may have come so soon after a
        # compaction that too little was left dirty for the cleaner to take up again
        w.stop.clear()
        t = threading.Thread(target=w.run, args=(b.bootstrap,), daemon=True)
        t.start()
        before = w.n_acked
        wait_until(lambda: w.n_acked >= before + 300 and _compactions(b) >= 1, 60,
                   what="300 more acknowledged records and a compaction after restart")
        w.stop.set()
        t.join(15)
        assert not t.is_alive()
        _check(b, w, data_dir)
    finally:
        w.stop.set()
        b.kill()


@pytest.mark.parametrize("point", ["compaction-cleaned", "compaction-swap",
                                   "compaction-deleted"])
def test_kill_9_at_each_step_of_a_compaction_swap(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """R-LOG-4, R-LOG-6: the broker kills itself (SIGKILL) exactly at one step of a
    compaction's file swap (``.cleaned`` written; renamed to ``.swap``; old segments
    deleted, before the final rename); after a restart without the failpoint the swap is
    discarded or completed, and every key's latest acknowledged record (deleted keys:
    absent or their tombstone) is served, with no cleaner output left behind."""
    monkeypatch.setenv("HEADRACE_FAILPOINT", point)
    b = BrokerProcess(data_dir, {"log.retention.check.interval.ms": "100"}).start()
    monkeypatch.delenv("HEADRACE_FAILPOINT")
    w = _Writer()
    try:
        create_topic("confluent", b.bootstrap, "compacted", 1,
                     {"cleanup.policy": "compact", "segment.bytes": "8192",
                      "delete.retention.ms": "0"})
        t = threading.Thread(target=w.run, args=(b.bootstrap,), daemon=True)
        t.start()
        assert b.proc is not None
        proc = b.proc
        wait_until(lambda: proc.poll() is not None, 60, what=f"the failpoint {point}")
        assert proc.returncode == -9
        assert any(f"failpoint {point}" in ln for ln in b.stderr_lines)
        w.stop.set()
        t.join(15)
        b.proc = None
        b.start()
        recovery = [ln for ln in b.stderr_lines
                    if "unfinished cleaner output" in ln or "completing compaction swap" in ln]
        assert recovery, "the restart found no interrupted compaction"
        _check(b, w, data_dir)
    finally:
        w.stop.set()
        b.kill()


def _check(b: BrokerProcess, w: _Writer, data_dir: Path) -> None:
    got = _read_all(b.bootstrap)
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets)), "offsets not strictly increasing"
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in got:
        latest[key] = (offset, value)
    with w.lock:
        acked, sent = dict(w.acked), {k: set(v) for k, v in w.sent.items()}
    assert acked
    for key, (offset, value) in acked.items():
        if key not in latest:  # only a deleted key may be gone (tombstone removed)
            assert value is None, f"{key!r}: latest acknowledged value lost"
            continue
        got_offset, got_value = latest[key]
        assert got_offset >= offset, f"{key!r}: latest acknowledged record lost"
        if got_offset == offset:
            assert got_value == value
        else:
            assert got_value in sent[key]
    assert not list((data_dir / "compacted-0").glob("*.cleaned"))
    assert not list((data_dir / "compacted-0").glob("*.swap"))
    assert not [ln for ln in b.stderr_lines if "Traceback" in ln]
