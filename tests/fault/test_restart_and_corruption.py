"""Durability proven with a real broker process (R-LOG-4, R-PROD-2 on one node).

- graceful restart keeps everything;
- kill -9 during an acks=all produce stream: every acknowledged record is read back after
  restart, in order, without gaps;
- garbage over the tail of the active segment, a truncated index, a deleted index: restart
  recovers, serves every intact earlier batch and never a corrupt one.

What these tests do NOT prove: kill -9 ends the process but keeps the kernel's page cache,
so data written but never fsynced survives it. They test recovery (torn tails, indexes,
offsets) and that acknowledged writes reached the file system, not that they reached the
disk; a power loss or kernel crash is not simulated. The flush policy (``flush.messages=1``
fsyncs the segment before the append returns, a failed fsync is never acknowledged) is
tested by recording fsync calls in tests/unit/test_log.py
(``test_flush_messages_1_fsyncs_the_segment_before_the_append_returns``,
``test_failed_fsync_takes_the_log_offline``).
"""

from __future__ import annotations

import os
import re
import struct
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from tests.brokerproc import BrokerProcess, wait_until
from tests.clients import Rec, consume, create_topic, produce


def _values(n: int, tag: str = "v") -> list[Rec]:
    return [Rec(0, f"k{i}".encode(), f"{tag}-{i:06d}".encode()) for i in range(n)]


def _segment_files(data_dir: Path, topic: str, suffix: str) -> list[Path]:
    return sorted((data_dir / f"{topic}-0").glob(f"*{suffix}"))


def _assert_one_startup_summary(lines: list[str], truncated: int) -> None:
    """Issue 13 item 8: the broker says in one INFO line how many partition logs it opened
    and how long that took; the per-partition "opened log"/"created log" lines are DEBUG."""
    summary = [ln for ln in lines if re.search(r"opened \d+ partition log\(s\)", ln)]
    assert len(summary) == 1, lines
    assert re.search(r"in [\d.]+ s", summary[0]), summary
    if truncated:
        assert f"recovery truncated {truncated} segment(s)" in summary[0], summary
    else:
        assert "no segment truncated" in summary[0], summary
    assert not [ln for ln in lines if "opened log" in ln or "created log" in ln], lines


def test_graceful_restart_keeps_everything(data_dir: Path) -> None:
    with BrokerProcess(data_dir) as b:
        create_topic("confluent", b.bootstrap, "keep", 1)
        produce("confluent", b.bootstrap, "keep", _values(500))
        assert b.stop() == 0
        b.start()
        # issue 13 item 8: one summary line for what was opened, no line per partition
        _assert_one_startup_summary(b.stderr_lines, truncated=0)
        got = consume("confluent", b.bootstrap, "keep", [0], 500)
        assert [r.value for r in got] == [r.value for r in _values(500)]
        assert [r.offset for r in got] == list(range(500))
        # and the log goes on from where it was
        assert produce("confluent", b.bootstrap, "keep", [Rec(0, None, b"after")]) == [(0, 500)]


def test_kill_9_during_produce_loses_no_acknowledged_record(data_dir: Path) -> None:
    """R-LOG-4: every record acknowledged (acks=all) before a kill -9 is read back at its
    offset. kill -9 keeps the page cache: this proves recovery, not fsync (module doc)."""
    b = BrokerProcess(data_dir).start()
    try:
        create_topic("confluent", b.bootstrap, "crash", 1)
        acked: list[tuple[int, bytes]] = []
        lock = threading.Lock()
        stop = threading.Event()
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 2,
                      "message.timeout.ms": 5000, "retries": 0})

        def on_delivery(err: object, msg: object) -> None:
            if err is None:
                with lock:
                    acked.append((msg.offset(), msg.value()))  # type: ignore[attr-defined]

        def run() -> None:
            i = 0
            while not stop.is_set():
                try:
                    p.produce("crash", f"rec-{i:07d}".encode(), partition=0,
                              on_delivery=on_delivery)
                    i += 1
                except BufferError:
                    pass
                p.poll(0.0005 if i % 50 else 0.002)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        wait_until(lambda: len(acked) > 3000, 30, what="3000 acknowledged records")
        b.kill()  # SIGKILL while the stream is running
        stop.set()
        t.join(10)
        p.flush(6)  # the rest fail: the broker is gone
        with lock:
            acknowledged = sorted(acked)
        assert acknowledged, "nothing was acknowledged"
        b.start()
        n = acknowledged[-1][0] + 1
        got = consume("confluent", b.bootstrap, "crash", [0], n, timeout_s=30)
        by_offset = {r.offset: r.value for r in got}
        assert [r.offset for r in got[:n]] == list(range(n)), "gap in the recovered log"
        for off, value in acknowledged:
            assert by_offset.get(off) == value, f"acknowledged offset {off} lost or changed"
    finally:
        b.kill()


def _fill(b: BrokerProcess, topic: str, batches: int, per_batch: int = 20) -> list[Rec]:
    """Produce ``batches`` separate batches (one flush each) so the log has many batches."""
    create_topic("confluent", b.bootstrap, topic, 1,
                 {"segment.bytes": "20000", "index.interval.bytes": "200"})
    sent: list[Rec] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "acks": "all"})
    for j in range(batches):
        for i in range(per_batch):
            r = Rec(0, None, f"b{j:04d}-r{i:03d}-".encode() + b"x" * 40)
            p.produce(topic, r.value, partition=0)
            sent.append(r)
        assert p.flush(10) == 0
    return sent


def _intact_end(segment: bytes, damage_at: int) -> int:
    """The next offset after the last batch of ``segment`` that ends at or before
    ``damage_at`` (batches: baseOffset int64, length int32, then ``length`` bytes; the last
    offset delta is at byte 23 of a batch). The segment's base if none does."""
    pos, end = 0, None
    while pos + 27 <= len(segment):
        base, length = struct.unpack_from(">qi", segment, pos)
        (last_delta,) = struct.unpack_from(">i", segment, pos + 23)
        if pos + 12 + length > damage_at:
            break
        end = base + last_delta + 1
        pos += 12 + length
    assert end is not None, "no batch before the damage point"
    return end


def test_garbage_over_the_tail_of_the_active_segment(data_dir: Path) -> None:
    """R-LOG-4: garbage over the last 300 bytes of the active segment (and junk after):
    after restart every acknowledged (offset, value) before the damage point is served
    exactly, nothing after it is, and new writes continue right after it."""
    b = BrokerProcess(data_dir).start()
    try:
        sent = _fill(b, "garbage", 40)
        b.kill()
        segments = _segment_files(data_dir, "garbage", ".log")
        assert len(segments) >= 2
        active = segments[-1]
        content = active.read_bytes()
        damage_at = len(content) - 300
        intact = _intact_end(content, damage_at)
        assert int(active.name.split(".")[0]) < intact < len(sent)
        with open(active, "r+b") as f:  # overwrite the last 300 bytes and append junk
            f.seek(damage_at)
            f.write(os.urandom(300))
            f.write(os.urandom(1000))
        b.start()
        # the truncated segment is named in a warning; the summary line counts it
        assert any("WARNING" in ln and active.name in ln and "truncated" in ln
                   for ln in b.stderr_lines), b.stderr_lines
        _assert_one_startup_summary(b.stderr_lines, truncated=1)
        got = consume("confluent", b.bootstrap, "garbage", [0], intact, timeout_s=30)
        assert [(r.offset, r.value) for r in got] == [
            (i, r.value) for i, r in enumerate(sent[:intact])]
        # nothing past the damage point is served, and the log continues right there
        assert produce("confluent", b.bootstrap, "garbage", [Rec(0, None, b"new")]) == [
            (0, intact)]
        got = consume("confluent", b.bootstrap, "garbage", [0], intact + 1, timeout_s=30)
        assert [(r.offset, r.value) for r in got] == [
            (i, r.value) for i, r in enumerate(sent[:intact])] + [(intact, b"new")]
    finally:
        b.kill()


def test_truncated_and_deleted_index_files_are_rebuilt(data_dir: Path) -> None:
    b = BrokerProcess(data_dir).start()
    try:
        sent = _fill(b, "indexes", 40)
        b.kill()
        indexes = _segment_files(data_dir, "indexes", ".index")
        assert len(indexes) >= 3
        with open(indexes[0], "r+b") as f:
            f.truncate(max(0, indexes[0].stat().st_size // 2 - 3))
        indexes[1].unlink()
        (_segment_files(data_dir, "indexes", ".timeindex")[1]).unlink()
        with open(indexes[-1], "r+b") as f:
            f.write(os.urandom(64))
        b.start()
        got = consume("confluent", b.bootstrap, "indexes", [0], len(sent), timeout_s=30)
        assert [r.value for r in got] == [r.value for r in sent]
        # seek into the middle of every segment: the rebuilt index must find the batch
        for target in (5, 333, len(sent) // 2, len(sent) - 7):
            from confluent_kafka import Consumer, TopicPartition

            c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "seek",
                          "enable.auto.commit": False})
            c.assign([TopicPartition("indexes", 0, target)])
            deadline = time.monotonic() + 10
            m = None
            while m is None and time.monotonic() < deadline:
                m = c.poll(0.5)
            c.close()
            assert m is not None and m.error() is None
            assert (m.offset(), m.value()) == (target, sent[target].value)
    finally:
        b.kill()
