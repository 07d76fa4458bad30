"""LocalMetadataStore on SQLite: incremental, transactional, migrated from the JSON format
(issue 8 item 10, the metadata half of item 2; R-LOG-4: nothing acknowledged is lost,
R-NF-1: no stall, R-REP-9: metadata survives restarts)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from headrace.metadata.store import (
    BrokerInfo,
    LocalMetadataStore,
    MetadataError,
    MetadataWriteError,
    PartitionState,
)

ME = BrokerInfo(0, "127.0.0.1", 9092)


def old_json_document(tmp_path: Path) -> dict[str, Any]:
    """A metadata file exactly as headrace wrote it before SQLite."""
    doc = {
        "version": 1,
        "cluster_id": "AAAAAAAAAAAAAAAAAAAAAA",
        "next_producer_id": 4242,
        "topics": {
            "events": {
                "topic_id": "6f1d0b8e-0000-4000-8000-000000000001",
                "configs": {"retention.ms": "60000"},
                "partitions": [
                    {"replicas": [0], "leader": 0, "leader_epoch": 3, "isr": [0],
                     "partition_epoch": 2},
                    {"replicas": [0], "leader": 0, "leader_epoch": 0, "isr": [0],
                     "partition_epoch": 0},
                ],
            },
            "__consumer_offsets": {
                "topic_id": "6f1d0b8e-0000-4000-8000-000000000002",
                "configs": {"cleanup.policy": "compact"},
                "partitions": [{"replicas": [0], "leader": 0, "leader_epoch": 0, "isr": [0],
                                "partition_epoch": 0}],
            },
        },
    }
    (tmp_path / LocalMetadataStore.FILE_NAME).write_text(json.dumps(doc, indent=1))
    return doc


def test_json_metadata_is_migrated_once_and_kept_as_a_backup(tmp_path: Path) -> None:
    """An existing data dir keeps working: its JSON document is imported on the first start
    (topic ids, configs, epochs, producer ids) and renamed to a backup; later starts read
    the database only (R-REP-9)."""
    doc = old_json_document(tmp_path)
    store = LocalMetadataStore(tmp_path, ME, "ignored-when-migrating")
    assert store.cluster_id == doc["cluster_id"]
    events = store.topic("events")
    assert events is not None
    assert events.topic_id == uuid.UUID(doc["topics"]["events"]["topic_id"])
    assert events.configs == {"retention.ms": "60000"}
    assert [p.leader_epoch for p in events.partitions] == [3, 0]
    assert events.partitions[0].partition_epoch == 2
    assert store.topic_by_id(events.topic_id) is events
    assert set(store.topics()) == {"events", "__consumer_offsets"}
    assert store.allocate_producer_ids(5) == 4242
    assert not (tmp_path / LocalMetadataStore.FILE_NAME).exists()
    backup = tmp_path / (LocalMetadataStore.FILE_NAME + LocalMetadataStore.BACKUP_SUFFIX)
    assert json.loads(backup.read_text()) == doc
    store.close()

    again = LocalMetadataStore(tmp_path, ME)
    assert again.cluster_id == doc["cluster_id"]
    assert again.allocate_producer_ids(1) == 4247  # ids never reused across the migration
    assert again.topic("events") is not None
    assert json.loads(backup.read_text()) == doc  # the backup is not touched again


def test_json_left_by_a_crash_after_the_migration_is_not_imported_twice(
        tmp_path: Path) -> None:
    """A crash between the migrating commit and the rename leaves the JSON next to the
    database: the database wins (changes made since are kept) and the JSON is renamed."""
    old_json_document(tmp_path)
    store = LocalMetadataStore(tmp_path, ME)
    store.delete_topic("events")
    store.close()
    backup = tmp_path / (LocalMetadataStore.FILE_NAME + LocalMetadataStore.BACKUP_SUFFIX)
    backup.rename(tmp_path / LocalMetadataStore.FILE_NAME)  # as if the rename never happened
    again = LocalMetadataStore(tmp_path, ME)
    assert again.topic("events") is None
    assert not (tmp_path / LocalMetadataStore.FILE_NAME).exists()
    assert backup.exists()


def test_durable_settings(tmp_path: Path) -> None:
    """WAL with synchronous=FULL: a committed change is fsynced before the call returns
    (R-LOG-4)."""
    store = LocalMetadataStore(tmp_path, ME)
    db = store._db
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


class FailingCommit:
    """The store's connection, except that COMMIT fails as on a full disk."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("database or disk is full")
        return self.real.execute(sql, *args)

    def executemany(self, sql: str, rows: Any) -> Any:
        return self.real.executemany(sql, rows)

    @property
    def in_transaction(self) -> bool:
        return self.real.in_transaction


def test_a_failed_write_changes_nothing_in_memory_or_on_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes go to SQLite first and to memory only after the commit: a write failing at
    its commit (ENOSPC) leaves the in-memory view and the database as they were (issue 8
    item 2: no half-created topic)."""
    store = LocalMetadataStore(tmp_path, ME)
    t = store.create_topic("t", [PartitionState([0], 0, 0, [0])], {"retention.ms": "5"})
    pid = store.allocate_producer_ids(1)
    monkeypatch.setattr(store, "_db", FailingCommit(store._db))
    with pytest.raises(MetadataWriteError, match="disk is full"):
        store.create_topic("u", [PartitionState([0], 0, 0, [0])], {})
    with pytest.raises(MetadataWriteError):
        store.add_partitions("t", [PartitionState([0], 0, 0, [0])])
    with pytest.raises(MetadataWriteError):
        store.set_topic_configs("t", {"retention.ms": "9"})
    with pytest.raises(MetadataWriteError):
        store.update_partition("t", 0, PartitionState([0], 0, 7, [0], 7))
    with pytest.raises(MetadataWriteError):
        store.allocate_producer_ids(10)
    with pytest.raises(MetadataWriteError):
        store.delete_topic("t")

    def unchanged(s: LocalMetadataStore) -> None:
        assert s.topic("u") is None
        got = s.topic("t")
        assert got is not None and got.topic_id == t.topic_id
        assert len(got.partitions) == 1 and got.partitions[0].leader_epoch == 0
        assert got.configs == {"retention.ms": "5"}

    unchanged(store)
    monkeypatch.undo()  # the disk has room again
    assert store.allocate_producer_ids(1) == pid + 1
    store.close()
    reopened = LocalMetadataStore(tmp_path, ME)
    unchanged(reopened)  # and nothing of the failed writes reached the database


def test_every_change_is_persisted_incrementally(tmp_path: Path) -> None:
    """Each kind of change survives a reopen (R-REP-9); a 10,000-partition topic is one
    transaction (no document rewritten per change)."""
    store = LocalMetadataStore(tmp_path, ME)
    big = store.create_topic("big", [PartitionState([0], 0, 0, [0])] * 10_000, {})
    store.create_topic("small", [PartitionState([0], 0, 0, [0])], {})
    store.add_partitions("small", [PartitionState([0], 0, 1, [0])])
    store.set_topic_configs("small", {"cleanup.policy": "compact"})
    store.update_partition("small", 0, PartitionState([0], 0, 4, [0], 5))
    store.delete_topic("small")
    store.create_topic("small", [PartitionState([0], 0, 0, [0])] * 2, {"segment.ms": "1"})
    store.close()
    again = LocalMetadataStore(tmp_path, ME)
    got = again.topic("big")
    assert got is not None and got.topic_id == big.topic_id and len(got.partitions) == 10_000
    small = again.topic("small")
    assert small is not None
    assert small.configs == {"segment.ms": "1"} and len(small.partitions) == 2
    assert small.partitions[0].leader_epoch == 0
    # partition states are independent objects (a shared input list is copied)
    got.partitions[0].leader_epoch = 9
    assert got.partitions[1].leader_epoch == 0


def test_a_damaged_database_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / LocalMetadataStore.DB_NAME).write_bytes(b"this is not a database" * 100)
    with pytest.raises(MetadataError, match="cluster metadata"):
        LocalMetadataStore(tmp_path, ME)


def test_a_database_missing_a_partition_row_is_a_clear_error(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path, ME)
    store.create_topic("t", [PartitionState([0], 0, 0, [0])] * 3, {})
    store._db.execute("DELETE FROM partitions WHERE topic='t' AND idx=1")
    store.close()
    with pytest.raises(MetadataError, match="lacks partition 1"):
        LocalMetadataStore(tmp_path, ME)
