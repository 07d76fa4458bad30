"""Exactly-once output without two-phase commit (R-REL-6), on SQLite.

At-least-once delivery plus an output that absorbs replays gives exactly-once output. Two
ways, after seed 002:

1. ``IdempotentSqliteSink``: every result row is keyed by the record it came from
   ``(topic, partition, offset[, sub-key])``; a replay writes the same key again and
   ``INSERT OR REPLACE`` overwrites instead of duplicating.
2. ``SqliteOffsetStore``: the results and the record's "processed" mark are written in one
   SQLite transaction (``with store.transaction(topic, partition, offset) as conn``). The
   block is skipped (``conn is None``) for a record already processed, so a replay changes
   nothing. ``start_offset(topic, partition, base_offset)`` is the end of the contiguous
   processed prefix: the consumer seeks there when a partition is assigned
   (``ReliableConsumer(offset_store=...)``). Marks rather than a single offset per partition,
   because handlers finish out of order: storing "offset + 1" after 15 while 14 is still
   running would skip 14 after a crash. ``compact()`` folds the marks below the prefix into
   one row per partition.

File format: an ordinary SQLite database (tables ``headrace_processed``,
``headrace_low_watermark`` and the sink's table). Crash behaviour: SQLite's — a transaction
is either wholly in the file or not at all. Thread-safety: one connection shared under a
lock (``check_same_thread=False``); transactions are serialised.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def idempotent_key(topic: str, partition: int, offset: int, *sub: object) -> str:
    """The unique key of a result derived from record (topic, partition, offset)."""
    return "/".join([topic, str(partition), str(offset), *(str(s) for s in sub)])


class IdempotentSqliteSink:
    """A key-value table where writing the same key twice keeps one row."""

    def __init__(self, conn: sqlite3.Connection, table: str = "results") -> None:
        if not table.isidentifier():
            raise ValueError(f"bad table name {table!r}")
        self.conn = conn
        self.table = table
        self._lock = threading.Lock()
        with self._lock, conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table} "
                         "(key TEXT PRIMARY KEY, value BLOB)")

    def write(self, key: str, value: Any) -> None:
        with self._lock, self.conn:
            self.conn.execute(f"INSERT OR REPLACE INTO {self.table} (key, value) VALUES (?, ?)",
                              (key, value))

    def write_many(self, rows: list[tuple[str, Any]]) -> None:
        with self._lock, self.conn:
            self.conn.executemany(
                f"INSERT OR REPLACE INTO {self.table} (key, value) VALUES (?, ?)", rows)

    def count(self) -> int:
        with self._lock:
            row = self.conn.execute(f"SELECT count(*) FROM {self.table}").fetchone()
        return int(row[0])

    def values(self) -> list[Any]:
        with self._lock:
            return [r[0] for r in self.conn.execute(f"SELECT value FROM {self.table}")]


class SqliteOffsetStore:
    """Processed-marks written in the results' transaction; seek-on-assign offsets."""

    def __init__(self, path: str, group_id: str) -> None:
        self.group_id = group_id
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.RLock()
        with self._lock:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("CREATE TABLE IF NOT EXISTS headrace_processed (grp TEXT, "
                              "topic TEXT, part INTEGER, off INTEGER, "
                              "PRIMARY KEY (grp, topic, part, off))")
            self.conn.execute("CREATE TABLE IF NOT EXISTS headrace_low_watermark (grp TEXT, "
                              "topic TEXT, part INTEGER, off INTEGER, "
                              "PRIMARY KEY (grp, topic, part))")

    @contextmanager
    def transaction(self, topic: str, partition: int,
                    offset: int) -> Iterator[sqlite3.Connection | None]:
        """One transaction for a record's results and its processed-mark. Yields None (and
        writes nothing) if the record was processed before; rolls back on an exception."""
        with self._lock:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                if self._is_processed(topic, partition, offset):
                    conn.execute("ROLLBACK")
                    yield None
                    return
                yield conn
                conn.execute("INSERT INTO headrace_processed VALUES (?, ?, ?, ?)",
                              (self.group_id, topic, partition, offset))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def is_processed(self, topic: str, partition: int, offset: int) -> bool:
        with self._lock:
            return self._is_processed(topic, partition, offset)

    def _is_processed(self, topic: str, partition: int, offset: int) -> bool:
        row = self.conn.execute(
            "SELECT off FROM headrace_low_watermark WHERE grp=? AND topic=? AND part=?",
            (self.group_id, topic, partition)).fetchone()
        if row is not None and offset < row[0]:
            return True
        return self.conn.execute(
            "SELECT 1 FROM headrace_processed WHERE grp=? AND topic=? AND part=? AND off=?",
            (self.group_id, topic, partition, offset)).fetchone() is not None

    def start_offset(self, topic: str, partition: int, base_offset: int) -> int:
        """One past the contiguous processed prefix that starts at ``base_offset`` (a
        known-processed point: the group's committed offset, or the log start offset when
        there is none) or at the stored low watermark, whichever is higher. Offsets are
        assumed dense (compacted topics: use ``IdempotentSqliteSink``)."""
        with self._lock:
            row = self.conn.execute(
                "SELECT off FROM headrace_low_watermark WHERE grp=? AND topic=? AND part=?",
                (self.group_id, topic, partition)).fetchone()
            nxt = base_offset if row is None else max(base_offset, int(row[0]))
            marks = [int(r[0]) for r in self.conn.execute(
                "SELECT off FROM headrace_processed WHERE grp=? AND topic=? AND part=? "
                "AND off>=? ORDER BY off", (self.group_id, topic, partition, nxt))]
        for off in marks:
            if off != nxt:
                break
            nxt = off + 1
        return nxt

    def compact(self, topic: str, partition: int, base_offset: int) -> None:
        """Fold the contiguous prefix of marks into the low-watermark row."""
        with self._lock:
            low = self.start_offset(topic, partition, base_offset)
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("INSERT OR REPLACE INTO headrace_low_watermark VALUES (?,?,?,?)",
                              (self.group_id, topic, partition, low))
            self.conn.execute("DELETE FROM headrace_processed WHERE grp=? AND topic=? AND "
                              "part=? AND off<?", (self.group_id, topic, partition, low))
            self.conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self.conn.close()
