"""PURE formats (plus small file helpers) of a partition's producer-state snapshots and
aborted-transaction indexes, byte for byte as Kafka writes them (issue 10).

``N.snapshot`` (Kafka's ``ProducerStateManager`` snapshot, version 1): the idempotent and
transactional producer state after every batch below offset ``N``::

    version  int16 (1)
    crc      uint32: CRC-32C of everything after this field
    entries  int32 count, then per producer:
        producer_id int64, epoch int16, last_sequence int32, last_offset int64,
        offset_delta int32 (last - first sequence of the last batch), timestamp int64,
        coordinator_epoch int32, current_txn_first_offset int64 (-1: no open transaction)

As in Kafka only each producer's LAST batch is kept (a retry of an older one of its last
five batches, after a restart, is refused as out of order rather than answered as a
duplicate); a producer with no batch (only a marker moved its epoch) has last_offset -1.

``N.txnindex`` (Kafka's ``TransactionIndex``): one 34-byte entry per aborted transaction
whose ABORT marker lies in segment ``N``: version int16 (0), producer_id int64,
first_offset int64, last_offset int64 (the marker), last_stable_offset int64.

Both are derived data: a missing, torn or corrupt file only costs a longer scan of the log
at open (``PartitionLog`` falls back to an older snapshot or the batch headers).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import crc32c

from headrace.fsutil import write_atomically
from headrace.log.segment import TXN_INDEX_SUFFIX
from headrace.log.transactions import AbortedTxn

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
_HEAD = struct.Struct(">hI")
_COUNT = struct.Struct(">i")
_ENTRY = struct.Struct(">qhiqiqiq")
_CRC_FROM = _HEAD.size
_TXN_ENTRY = struct.Struct(">hqqqq")
TXN_ENTRY_SIZE = _TXN_ENTRY.size  # 34


class CorruptStateFileError(ValueError):
    """A snapshot or transaction index that cannot be trusted."""


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    producer_id: int
    epoch: int
    last_sequence: int  # -1: no batch
    last_offset: int  # -1: no batch
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int  # -1: no open transaction


def encode_snapshot(entries: Iterable[SnapshotEntry]) -> bytes:
    items = list(entries)
    body = bytearray(_COUNT.pack(len(items)))
    for e in items:
        body += _ENTRY.pack(e.producer_id, e.epoch, e.last_sequence, e.last_offset,
                            e.offset_delta, e.timestamp, e.coordinator_epoch,
                            e.current_txn_first_offset)
    return _HEAD.pack(SNAPSHOT_VERSION, crc32c.crc32c(body)) + bytes(body)


def decode_snapshot(data: bytes) -> list[SnapshotEntry]:
    """Raises ``CorruptStateFileError`` for a wrong version, CRC or length."""
    if len(data) < _HEAD.size + _COUNT.size:
        raise CorruptStateFileError(f"snapshot of {len(data)} bytes is too short")
    version, crc = _HEAD.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptStateFileError(f"unknown snapshot version {version}")
    if crc32c.crc32c(memoryview(data)[_CRC_FROM:]) != crc:
        raise CorruptStateFileError("snapshot CRC does not match its content")
    (count,) = _COUNT.unpack_from(data, _HEAD.size)
    if count < 0 or len(data) != _HEAD.size + _COUNT.size + count * _ENTRY.size:
        raise CorruptStateFileError(f"snapshot claims {count} entries in {len(data)} bytes")
    return [SnapshotEntry(*_ENTRY.unpack_from(data, _HEAD.size + _COUNT.size + i * _ENTRY.size))
            for i in range(count)]


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offsets(directory: Path) -> list[int]:
    """Offsets of the snapshot files in ``directory``, ascending."""
    return sorted(int(p.stem) for p in directory.glob(f"*{SNAPSHOT_SUFFIX}")
                  if p.stem.isdigit())


def write_snapshot(directory: Path, offset: int, entries: Iterable[SnapshotEntry]) -> None:
    """Renamed into place, not fsynced (the CRC catches a file an OS crash tore)."""
    write_atomically(snapshot_path(directory, offset), encode_snapshot(entries), fsync=False)


def encode_aborted(txns: Iterable[AbortedTxn]) -> bytes:
    return b"".join(_TXN_ENTRY.pack(0, a.producer_id, a.first_offset, a.last_offset,
                                    a.last_stable_offset) for a in txns)


def decode_aborted(data: bytes) -> list[AbortedTxn]:
    """The entries of a ``.txnindex``; a torn last entry (a crash mid-append) is dropped,
    any other inconsistency raises ``CorruptStateFileError``."""
    whole = len(data) - len(data) % TXN_ENTRY_SIZE
    out: list[AbortedTxn] = []
    for pos in range(0, whole, TXN_ENTRY_SIZE):
        version, pid, first, last, lso = _TXN_ENTRY.unpack_from(data, pos)
        if version != 0 or not 0 <= first <= last or (out and last <= out[-1].last_offset):
            raise CorruptStateFileError(f"bad transaction index entry at byte {pos}")
        out.append(AbortedTxn(pid, first, last, lso))
    return out


def txn_index_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}{TXN_INDEX_SUFFIX}"


def append_aborted(path: Path, txn: AbortedTxn) -> None:
    """Append one entry (one ``write`` to an ``O_APPEND`` file; fsynced with the segment's
    data by ``PartitionLog.flush``)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        data = encode_aborted([txn])
        if os.write(fd, data) != len(data):
            raise OSError(f"short write to {path}")
    finally:
        os.close(fd)


def read_aborted(path: Path) -> list[AbortedTxn] | None:
    """None if the file is missing or corrupt (the caller rebuilds it)."""
    try:
        return decode_aborted(path.read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, CorruptStateFileError):
        return None


def write_aborted(path: Path, txns: list[AbortedTxn]) -> None:
    """Replace the index (renamed into place); an empty one is removed."""
    if not txns:
        path.unlink(missing_ok=True)
        return
    write_atomically(path, encode_aborted(txns), fsync=False)
