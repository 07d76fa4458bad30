"""The log of one partition: segments, offsets, recovery, retention (R-LOG-1..5, 7).

``PartitionLog`` is the one storage class the broker uses. Directory layout (Kafka's)::

    <topic>-<partition>/
        00000000000000000000.log        segments, named by base offset (``LogSegment``)
        00000000000000000000.index
        00000000000000000000.timeindex
        leader-epoch-checkpoint          text: "0" (version), entry count, then one
                                         "<leader epoch> <start offset>" line per epoch
        log-start-offset                 text: "0" (version), then the log start offset
                                         that DeleteRecords moved past the first
                                         segment's base offset (absent otherwise)
        00000000000000000000.txnindex    aborted transactions whose ABORT markers are in
                                         that segment (Kafka's format, 34-byte entries;
                                         only segments with some have one)
        00000000000000001234.snapshot    producer state after every batch below offset
                                         1234 (Kafka's version 1), written at each roll
                                         and at close (``headrace.log.state_files``)
        partition.metadata               text: "version: 0\ntopic_id: <id>\n" (Kafka's;
                                         the id base64url without padding): whose
                                         partition this is. ``open`` with a topic id
                                         removes a directory holding another topic's id
                                         and starts the log afresh (a new topic never
                                         adopts old files); one without the file is
                                         adopted and gets it.
        N.log.cleaned, N.log.swap        compaction output (``headrace.log.cleaner``); open
                                         discards .cleaned and completes .swap first

Offsets: ``log_start_offset`` is the first segment's base offset (retention deletes whole
segments, so that is where the log starts; after everything is deleted the empty active
segment is named by the log end offset, which is how a reopen knows where it was), unless
DeleteRecords moved it further (``increment_log_start_offset``, Kafka's
``maybeIncrementLogStartOffset``): then it may lie inside the first segment, and it is kept
in the partition's ``log-start-offset`` file (Kafka keeps one ``log-start-offset-checkpoint``
per log dir, written every minute; ours is per partition and written at once, renamed into
place, and fsynced by the caller off the event loop: a kill -9 never loses it). ``open``
takes the larger of the file and the first segment's base offset; if the file is past the
recovered log end offset the log is emptied and restarts there (Kafka's
``deleteSegmentsIfLogStartGreaterThanLogEnd``). Segments wholly below the log start offset
are deleted when it moves and at open.
``log_end_offset`` is the next offset to assign. ``high_watermark`` is a plain attribute that
the broker sets (R-REP-4); reads never return data at or past the ``max_offset`` they are
given, and retention never deletes past it. ``last_stable_offset`` is the high
watermark held back by undecided transactions (``TxnTracker``, rebuilt with the producer
state on open: control batches carry the markers).

Appends and reads are batch-level (R-LOG-3): a produce request's batches are validated from
their headers and CRCs, and each written with one ``os.writev`` of a rewritten 16-byte prefix
(base offset, length, partition leader epoch: outside the CRC) and the rest of the batch
straight from the request (LogAppendTime topics rewrite one copy of the request bytes, since
that changes bytes under the CRC); a read is an index lookup, a short header scan and one
``os.pread`` per segment touched. No per-record Python work.

Crash behaviour (R-LOG-4): ``open`` always re-validates the last segment batch by batch
(CRC-32C) and truncates it at the first invalid or torn batch, since there is no clean-
shutdown marker or recovery-point checkpoint yet; that costs one read of the active segment
(up to ``segment.bytes``). Other segments are trusted if their indexes pass sanity checks and
the batches after their last index entry are valid; otherwise they are recovered the same
way, and if that truncates one, every later segment is deleted (Kafka's ``LogLoader`` does
the same: offsets past a hole cannot be trusted). Index files are rebuilt whenever they are
missing or inconsistent. The idempotent-producer state, the transactions and the
leader-epoch cache are loaded as Kafka's ``LogLoader`` does: the newest producer snapshot at
or below the recovered log end offset, the ``.txnindex`` files and leader-epoch checkpoint
below it, then the batch headers from it on (after a clean shutdown none; after a kill -9
those of the active segment: ``bench/recovery_bench.py``). A missing or corrupt snapshot or
damaged ``.txnindex`` costs a longer scan (an older snapshot, or every batch header), never
wrong state; snapshots past the end are removed, as a truncation does. Data is fsynced per
``flush.messages`` / ``flush.ms`` (checked on append and by the
broker's periodic ``flush_if_due``) or when ``flush`` is called; otherwise it is in the
page cache (R-LOG-7).

Storage failures (issue 8): an append whose write fails (ENOSPC, EIO; in the ``.log`` or an
index) is undone exactly (``LogSegment.undo_to``: files cut back and their sizes checked) and
answered KAFKA_STORAGE_ERROR; if it cannot be undone, or an fsync fails, the log goes
``offline`` (Kafka's ``LogDirFailureChannel``): every append and read answers
KAFKA_STORAGE_ERROR until the broker restarts and recovery truncates the torn tail. Nothing
is acknowledged that cannot be read back. ``OfflineLog`` stands for a partition that could
not be opened at all.

Thread-safety: the log belongs to the broker's event-loop thread, except that the heavy
part of a compaction (``CompactionJob.run``) runs in a worker thread on a snapshot of the
segments; its result is swapped in on the loop only if nothing removed or replaced segments
meanwhile (``_generation``). Segment fds are shared through the locked ``OPEN_FILES`` LRU.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import struct
import threading
import uuid
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple, overload

from kio.schema.errors import ErrorCode

from headrace.clock import Clock
from headrace.config import LogConfig
from headrace.fsutil import fsync_dir, fsync_file, overwrite_in_place, write_atomically
from headrace.log import cleaner
from headrace.log.errors import LogError, OffsetOutOfRangeError
from headrace.log.producer_state import ProducerStateManager, VerificationGuard
from headrace.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    REGION_MIN_BYTES,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    FileRegion,
    LogSegment,
    SegmentMark,
)
from headrace.log.state_files import (
    CorruptStateFileError,
    SnapshotEntry,
    append_aborted,
    decode_snapshot,
    read_aborted,
    snapshot_offsets,
    snapshot_path,
    txn_index_path,
    write_aborted,
    write_snapshot,
)
from headrace.log.transactions import AbortedTxn, TxnTracker, control_batch, marker_info
from headrace.log.validator import validate_batches
from headrace.protocol.records import (
    INT32_MAX,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    InvalidRecordError,
    read_header,
    record_timestamps,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    split_batches,
    whole_batches_length,
)
from headrace.replication.epochs import end_offset_for_epoch

log = logging.getLogger("headrace.log")

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
LOG_START_OFFSET_FILE = "log-start-offset"
PARTITION_METADATA = "partition.metadata"
# A stored batch begins: baseOffset int64, batchLength int32, partitionLeaderEpoch int32.
_OFFSET = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_PREFIX = 16
_CHECKPOINT_VERSION = 0
LOG_APPEND_TIME = "LogAppendTime"


class AppendResult(NamedTuple):
    """Where a produce request's batches went.

    ``log_append_time_ms`` is the broker time written into the batches of a LogAppendTime
    topic, -1 for CreateTime. For a duplicate (retried) request the offsets are those of the
    original append.
    """

    first_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int


OFFLINE_EVENTS = [0]  # logs of this process that went offline (Metadata's cache key)


def _note_offline() -> None:
    OFFLINE_EVENTS[0] += 1


class PartitionLog:
    """One partition's log; see the module docstring for files, offsets and crashes."""

    def __init__(
        self, directory: Path, config: LogConfig, clock: Clock, segments: list[LogSegment]
    ) -> None:
        self.dir = directory
        self.config = config
        self.clock = clock
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self.log_start_offset = segments[0].base_offset
        self.high_watermark = 0
        # Kafka's rule for a producer id we know nothing of: accept its sequence (its
        # state may have gone with retention); see ProducerStateManager.
        self.producer_state = ProducerStateManager(strict_new_producers=False)
        self.txns = TxnTracker()
        self.leader_epochs: list[tuple[int, int]] = []  # (epoch, start offset), increasing
        self._unflushed: list[LogSegment] = []
        self._unflushed_messages = 0
        self._last_flush_ms = clock.monotonic_ms()
        # compaction: cleanable end of the last run, and when a kept tombstone expires
        self._cleaned_to: int | None = None
        self._tombstone_expiry_ms: int | None = None
        # why the log is offline (an I/O error it could not undo), None while it is online
        self.offline: str | None = None
        self.topic_id: uuid.UUID | None = None  # as recorded in partition.metadata
        # segments whose recovery at open truncated something (each logged as a warning)
        self.recovery_truncated = 0
        # bumped whenever segments are removed or replaced (retention, truncation,
        # compaction, config, close): a compaction job read in a worker thread is swapped
        # in only if nothing changed under it
        self._generation = 0
        self._compaction: CompactionJob | None = None
        # base offsets of segments whose .txnindex was appended to since the last flush
        self._txn_index_dirty: set[int] = set()
        self.scanned_batches = 0  # batch headers the last state load read (tests, bench)
        # The leader-epoch checkpoint: written at once unless ``defer_epochs`` is set (a
        # broker's replica manager sets it and writes the pending checkpoints in a worker
        # thread: a failover that makes 10,000 partitions change epoch wrote 10,000 files
        # on the event loop). ``_epochs_version`` counts changes, ``_epochs_written`` the
        # change on disk; the lock orders the writers, so an older content never replaces
        # a newer one. A pending checkpoint is written before any producer snapshot (open
        # trusts the checkpoint's epochs below the newest snapshot) and at close. The file
        # is rewritten in place, not fsynced (``_epochs_synced`` is the change known to be
        # on disk), except before a snapshot: a rewrite of a page is not ordered with the
        # file system's journal, so the snapshot could outlive it in an OS crash.
        self.defer_epochs: Callable[[PartitionLog], None] | None = None
        self._epochs_lock = threading.Lock()
        self._epochs_version = 0
        self._epochs_written = 0
        self._epochs_synced = 0
        self._epochs_closed = False

    # ------------------------------------------------------------------ open / recovery
    @classmethod
    def open(cls, dir: Path, config: LogConfig, clock: Clock, *,
             topic_id: uuid.UUID | None = None) -> PartitionLog:
        """Open (creating if needed) and recover the log in ``dir``.

        A directory that does not exist yet gets one empty segment and its
        ``partition.metadata`` and nothing else: there is nothing to recover, and nothing
        is fsynced (an empty partition lost in a crash is recreated, empty, by the next
        open), so creating a topic of many partitions (``__consumer_offsets``, or 10,000 in
        ``bench/cluster_bench.py --scale``) does not stall the event loop. Its
        leader-epoch checkpoint is written by the first epoch (``assign_epoch`` or the first
        append); until then a missing one means no epochs, which an empty log has.

        ``topic_id`` (not 0): the topic this partition belongs to. An existing directory
        whose ``partition.metadata`` names another topic is a stray of a deleted topic: it
        is renamed to a ``-delete`` name, removed, and the log starts empty.
        """
        now = clock.wall_ms()
        known_id = topic_id if topic_id is not None and topic_id.int else None
        if known_id is not None and dir.is_dir():
            found = read_partition_metadata(dir)
            if found is not None and found != known_id:
                log.warning("removing stray partition directory %s: it holds topic id %s, "
                            "not %s", dir, found, known_id)
                doomed = dir.with_name(f"{dir.name}.{uuid.uuid4().hex}-delete")
                dir.rename(doomed)
                shutil.rmtree(doomed, ignore_errors=True)
        try:
            dir.mkdir(parents=True)
        except FileExistsError:
            pass
        else:
            plog = cls(dir, config, clock, [LogSegment.create(
                dir, 0, index_interval_bytes=config.index_interval_bytes,
                max_index_bytes=config.segment_index_bytes, now_ms=now)])
            if known_id is not None:
                write_partition_metadata(dir, known_id)
                plog.topic_id = known_id
            log.debug("created log %s", dir)
            return plog
        plog = cls._recover(dir, config, clock, now)
        plog.topic_id = read_partition_metadata(dir)
        if known_id is not None and plog.topic_id is None:
            write_partition_metadata(dir, known_id)  # adopted (made before topic ids)
            plog.topic_id = known_id
        return plog

    @classmethod
    def _recover(cls, dir: Path, config: LogConfig, clock: Clock, now: int) -> PartitionLog:
        for tmp in dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        cleaner.complete_swaps(dir)
        bases = sorted(int(p.stem) for p in dir.glob(f"*{LOG_SUFFIX}") if p.stem.isdigit())
        _remove_orphan_indexes(dir, set(bases))
        segments: list[LogSegment] = []
        truncated_segments = 0
        interval, max_index = config.index_interval_bytes, config.segment_index_bytes
        for i, base in enumerate(bases):
            last = i == len(bases) - 1
            if last:
                seg = LogSegment(dir, base, index_interval_bytes=interval,
                                 max_index_bytes=max_index, created_ms=now)
                consistent = False
            else:
                seg, consistent = LogSegment.open(
                    dir, base, index_interval_bytes=interval, max_index_bytes=max_index,
                    now_ms=now, offset_limit=bases[i + 1],
                )
            if consistent:
                segments.append(seg)
                continue
            if not last:
                log.warning("recovering segment %s", seg.log_path)
            truncated = seg.recover()
            if truncated:
                truncated_segments += 1
            segments.append(seg)
            if seg.size and seg.created_ms == now:
                first = next(seg.headers(0))
                if first.max_timestamp >= 0:
                    seg.created_ms = min(now, first.max_timestamp)
            if truncated and not last:
                for later in bases[i + 1 :]:
                    log.warning("deleting segment %020d after truncated segment %020d",
                                later, base)
                    LogSegment(dir, later, index_interval_bytes=interval,
                               max_index_bytes=max_index, created_ms=now).delete()
                break
        if not segments:
            segments.append(LogSegment.create(dir, 0, index_interval_bytes=interval,
                                              max_index_bytes=max_index, now_ms=now))
        plog = cls(dir, config, clock, segments)
        # a compaction swap completed just now changed segments under the snapshots' and
        # indexes' feet only in ways they tolerate (entries deduplicated), so they stay
        plog._load_state(_read_checkpoint(dir / LEADER_EPOCH_CHECKPOINT))
        plog._apply_stored_log_start()
        plog.recovery_truncated = truncated_segments
        log.debug("opened log %s: offsets [%d, %d), %d segment(s)", dir,
                 plog.log_start_offset, plog.log_end_offset, len(segments))
        return plog

    def _load_state(self, known_epochs: list[tuple[int, int]] | None) -> None:
        """Rebuild producer state, transactions and leader epochs (at open and after a
        truncation), Kafka's way: from the newest producer snapshot at or below the log end
        offset, the ``.txnindex`` files of the segments below it and ``known_epochs`` (the
        leader-epoch cache's entries) below it, then the batch headers from the snapshot
        on (a control batch's marker type read from its record). With no usable snapshot,
        or without ``known_epochs``, or with a damaged ``.txnindex`` below the snapshot,
        every batch header is read. ``.txnindex`` files of the scanned segments are
        rewritten where they differ from what the scan found."""
        leo = self.log_end_offset
        for off in snapshot_offsets(self.dir):  # past the log end: the log lost that part
            if off > leo:
                _unlink_quietly(snapshot_path(self.dir, off))
        snap = self._newest_snapshot() if known_epochs is not None else None
        aborted: list[AbortedTxn] | None = None
        if snap is not None:
            aborted = self._aborted_below(snap[0])
            if aborted is None:
                snap = None
        producers = self.producer_state
        producers.producers.clear()
        self.txns.clear()
        epochs: list[tuple[int, int]] = []
        scan_from = 0
        if snap is not None and aborted is not None and known_epochs is not None:
            scan_from, entries = snap
            producers.load_snapshot(entries)
            for e in entries:
                if e.current_txn_first_offset >= 0:
                    self.txns.ongoing[e.producer_id] = e.current_txn_first_offset
            self.txns.aborted = aborted
            epochs = [(e, o) for e, o in known_epochs if o < scan_from]
        self.scanned_batches = 0
        n = len(self._segments)
        for i, seg in enumerate(self._segments):
            end = self._segments[i + 1].base_offset if i + 1 < n else leo
            if end <= scan_from and i + 1 < n:
                continue  # wholly below the snapshot: its .txnindex was read
            position = 0
            if scan_from > seg.base_offset:
                found = seg.find_position(scan_from)
                position = seg.size if found is None else found
            before = len(self.txns.aborted)
            kept = [a for a in self.txns.aborted if a.last_offset >= seg.base_offset]
            for h in seg.headers(position):
                self.scanned_batches += 1
                self._track(h, *self._marker_of(seg, h))
                if h.partition_leader_epoch >= 0 and (
                    not epochs or h.partition_leader_epoch > epochs[-1][0]
                ):
                    epochs.append((h.partition_leader_epoch, h.base_offset))
            mine = kept + self.txns.aborted[before:]
            path = txn_index_path(self.dir, seg.base_offset)
            if read_aborted(path) != mine:
                try:
                    write_aborted(path, mine)
                except OSError as e:  # derived: the next open scans this segment again
                    log.warning("could not write %s: %s", path, e)
        self.leader_epochs = epochs
        if _read_checkpoint(self.dir / LEADER_EPOCH_CHECKPOINT) != epochs:
            self._save_epochs()

    def _newest_snapshot(self) -> tuple[int, list[SnapshotEntry]] | None:
        """The newest readable snapshot at or below the log end offset; a corrupt one is
        removed (with a warning) and the next older one tried."""
        for off in reversed(snapshot_offsets(self.dir)):
            if off > self.log_end_offset:
                continue
            path = snapshot_path(self.dir, off)
            try:
                return off, decode_snapshot(path.read_bytes())
            except (OSError, CorruptStateFileError) as e:
                log.warning("ignoring producer snapshot %s: %s", path, e)
                _unlink_quietly(path)
        return None

    def _aborted_below(self, offset: int) -> list[AbortedTxn] | None:
        """The aborted transactions whose markers are below ``offset`` (from the segments'
        ``.txnindex`` files, deduplicated: an interrupted compaction may leave an entry in
        two files); None if a file that should hold some is damaged."""
        found: dict[int, AbortedTxn] = {}
        for seg in self._segments:
            if seg.base_offset >= offset:
                break
            entries = read_aborted(txn_index_path(self.dir, seg.base_offset))
            if entries is None:
                log.warning("transaction index of %s is damaged: rebuilding it from the log",
                            seg.log_path)
                return None
            for a in entries:
                if a.last_offset < offset:
                    found[a.last_offset] = a
        return [found[k] for k in sorted(found)]

    @staticmethod
    def _marker_of(seg: LogSegment, h: BatchHeader) -> tuple[int | None, int]:
        """(marker type or None, coordinator epoch or -1) of a batch in ``seg``."""
        if not h.is_control:
            return None, -1
        try:
            return marker_info(seg.read(h.position, h.size))
        except InvalidRecordError:
            return None, -1

    def _track(self, h: BatchHeader, kind: int | None,
               coordinator_epoch: int = -1) -> AbortedTxn | None:
        """Producer state and transactions after a batch was appended: a marker moves its
        producer's epoch (a fenced zombie's next batch is refused) without touching its
        sequence numbers, and records its coordinator epoch, as Kafka's
        ``appendEndTxnMarker``. Returns the aborted transaction an ABORT marker ended."""
        if h.is_control:
            self.producer_state.marker(h.producer_id, h.producer_epoch, h.max_timestamp,
                                       coordinator_epoch)
        else:
            self.producer_state.update(h)
        if h.is_transactional:
            return self.txns.on_batch(h, kind)
        return None

    def _index_aborted(self, seg: LogSegment, txns: list[AbortedTxn]) -> None:
        """Append aborted transactions to the active segment's ``.txnindex`` after their
        markers were written. The markers are in the log already, so a failure takes the
        log offline (Kafka's answer to any I/O error): a restart rescans the segment."""
        path = txn_index_path(self.dir, seg.base_offset)
        try:
            for txn in txns:
                append_aborted(path, txn)
        except OSError as e:
            self._go_offline(f"could not write {path}: {e}")
            raise LogError(ErrorCode.kafka_storage_error,
                           f"could not write {path}: {e}") from e
        self._txn_index_dirty.add(seg.base_offset)

    def take_snapshot(self) -> None:
        """Write the producer state as ``<log end offset>.snapshot`` (at each roll and at
        close, as Kafka does) and drop snapshots older than the first segment, except the
        newest. Derived data: a failure is logged, never raised."""
        if self.offline is not None:
            return
        offset = self.log_end_offset
        # epochs below the snapshot are trusted from the file: on disk before the snapshot
        self.write_epochs_now(sync=True)
        try:
            write_snapshot(self.dir, offset,
                           self.producer_state.snapshot_entries(self.txns.ongoing))
        except OSError as e:
            log.warning("could not write producer snapshot %s: %s",
                        snapshot_path(self.dir, offset), e)
        self._delete_old_snapshots()

    def _delete_all_snapshots(self) -> None:
        for off in snapshot_offsets(self.dir):
            _unlink_quietly(snapshot_path(self.dir, off))

    def _delete_old_snapshots(self) -> None:
        offsets = snapshot_offsets(self.dir)
        first = self._segments[0].base_offset
        for off in offsets[:-1]:
            if off < first:
                _unlink_quietly(snapshot_path(self.dir, off))

    def _epochs_content(self) -> bytes:
        lines = [str(_CHECKPOINT_VERSION), str(len(self.leader_epochs))]
        lines += [f"{epoch} {offset}" for epoch, offset in self.leader_epochs]
        return ("\n".join(lines) + "\n").encode()

    def pending_epochs(self) -> tuple[int, bytes] | None:
        """The checkpoint not written yet (its change number and content), on the log's
        thread; None if the file is current."""
        if self._epochs_written >= self._epochs_version:
            return None
        return self._epochs_version, self._epochs_content()

    def write_epochs(self, version: int, content: bytes, *, sync: bool = False) -> None:
        """Write the checkpoint of change ``version`` (any thread), unless a newer one is
        on disk already or the log is closed. Rewritten in place and not fsynced unless
        ``sync``: ``open`` rebuilds the epochs from the batch headers and rewrites a stale
        or torn file, so an fsync here would only stall the writer on every new partition
        and epoch, and a new inode per write (a rename into place) cost a failover of
        10,000 partitions about 2 CPU-seconds per broker (``fsutil.overwrite_in_place``).
        With ``sync``, the file on disk is fsynced even if this change is already in it."""
        path = self.dir / LEADER_EPOCH_CHECKPOINT
        with self._epochs_lock:
            if self._epochs_closed:
                return
            try:
                if version > self._epochs_written:
                    overwrite_in_place(path, content, fsync=sync)
                    self._epochs_written = version
                elif sync and self._epochs_synced < self._epochs_written:
                    fsync_file(path)
                else:
                    return
            except OSError as e:  # derived data: open rebuilds it from the batch headers
                log.warning("could not write %s: %s", path, e)
                return
            if sync:
                self._epochs_synced = self._epochs_written

    def write_epochs_now(self, *, sync: bool = False) -> None:
        """Write a pending checkpoint at once (before a snapshot, with ``sync``; at close)."""
        pending = self.pending_epochs()
        if pending is not None:
            self.write_epochs(*pending, sync=sync)
        elif sync:
            self.write_epochs(self._epochs_written, b"", sync=True)  # fsync only

    # ------------------------------------------------------------------ properties
    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def last_stable_offset(self) -> int:
        """The high watermark, or the first offset of the earliest transaction not yet
        decided (or whose marker is not yet replicated), if that is smaller."""
        return self.txns.last_stable_offset(self.high_watermark)

    def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """``producer.id.expiration.ms``: forget idle producers (not one with an open
        transaction here)."""
        return self.producer_state.expire(now_ms, expiration_ms, set(self.txns.ongoing))

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in [start, end) (a read_committed fetch)."""
        return self.txns.aborted_in(start, end)

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    # ------------------------------------------------------------------ append
    def should_roll(self, records_size: int, last_offset: int) -> bool:
        """Whether an append of ``records_size`` bytes ending at ``last_offset`` needs a new
        segment: segment.bytes would be exceeded, segment.ms has passed since the active
        segment was created (per the clock), an index is full, or the offsets would not fit
        the index's 4-byte relative offsets. An empty segment never rolls."""
        seg = self.active_segment
        if seg.size == 0:
            return False
        return (
            seg.size + records_size > self.config.segment_bytes
            or self.clock.wall_ms() - seg.created_ms > self.config.segment_ms
            or seg.index.is_full
            or seg.time_index.is_full
            or last_offset - seg.base_offset > INT32_MAX
        )

    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset."""
        old = self.active_segment
        seg = LogSegment.create(
            self.dir, self.log_end_offset, index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes, now_ms=self.clock.wall_ms(),
        )
        old.on_become_inactive()
        self._segments.append(seg)
        self._bases.append(seg.base_offset)
        self.take_snapshot()
        log.info("rolled log %s: new segment %020d (previous %d bytes)", self.dir,
                 seg.base_offset, old.size)
        return seg

    def start_txn_verification(self, producer_id: int) -> VerificationGuard | None:
        """Before a transactional batch of ``producer_id`` is appended as leader: None if
        its transaction is already ongoing here (nothing to verify: the steady state),
        else the guard of a verification with the transaction coordinator (KIP-890, Kafka's
        ``maybeStartTransactionVerification``), to pass back to ``append_as_leader``."""
        if producer_id in self.txns.ongoing:
            return None
        return self.producer_state.start_verification(producer_id, self.clock.wall_ms())

    def append_as_leader(self, records: bytes | memoryview, leader_epoch: int, *,
                         verify_txn: bool = False,
                         guard: VerificationGuard | None = None) -> AppendResult:
        """Validate, assign offsets to and append a produce request's batches.

        ``verify_txn`` (``transaction.partition.verification.enable``): a transactional
        batch whose producer has no ongoing transaction here is appended only with the
        ``guard`` of a verification that succeeded and is still current (no batch or
        marker of the producer written since), else INVALID_TXN_STATE, as Kafka's
        ``analyzeAndValidateProducerState``.

        Raises ``InvalidRecordError`` (CORRUPT_MESSAGE, UNSUPPORTED_VERSION,
        MESSAGE_TOO_LARGE, INVALID_RECORD, INVALID_PRODUCER_EPOCH,
        OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_TXN_STATE) or ``LogError``
        (KAFKA_STORAGE_ERROR on an I/O error); then nothing of the request is appended. A
        retried duplicate appends nothing and returns the original offsets.
        """
        self._check_online()
        headers = split_batches(records, self.config.max_message_bytes)
        for h in headers:
            if h.base_offset != 0:
                raise InvalidRecordError(
                    ErrorCode.invalid_record,
                    f"a produced batch must have baseOffset 0, not {h.base_offset}",
                )
            if h.is_control:  # markers come from the transaction coordinator only
                raise InvalidRecordError(
                    ErrorCode.invalid_record,
                    "clients are not allowed to write control records",
                )
            if h.is_transactional and h.producer_id < 0:
                raise InvalidRecordError(
                    ErrorCode.invalid_record,
                    "a transactional batch needs a producer id",
                )
        validate_batches(records, headers, self.config, self.clock.wall_ms())
        log_append = self.config.message_timestamp_type == LOG_APPEND_TIME
        duplicate = self.producer_state.check_append(headers)
        if duplicate is not None:
            return AppendResult(duplicate.first_offset, duplicate.last_offset,
                                duplicate.timestamp if log_append else -1, self.log_start_offset)
        if verify_txn:
            for h in headers:
                if (h.is_transactional and h.producer_id not in self.txns.ongoing
                        and not self.producer_state.is_verified(h.producer_id, guard)):
                    raise InvalidRecordError(ErrorCode.invalid_txn_state,
                                             "Record was not part of an ongoing transaction")

        return self._append_headers(records, headers, leader_epoch, log_append)

    def append_own_batch(self, batch: bytes, leader_epoch: int) -> AppendResult:
        """Append one batch the broker built itself (``build_batch``: v2, uncompressed, no
        producer id, CRC computed from these bytes), e.g. to ``__consumer_offsets``.

        Skips what ``append_as_leader`` checks for untrusted client input (the CRC over
        the whole batch, producer sequences, transactional/control flags) but keeps the
        size limit; the bytes are written and flushed exactly as a produced batch is.
        """
        self._check_online()
        header = read_header(batch, 0)
        # ours: no producer, or a coordinator's transactional batch (TxnOffsetCommit: a
        # producer id and epoch, no sequence, as Kafka's coordinator-origin appends)
        coordinator_txn = (header.is_transactional and header.producer_id >= 0
                           and header.base_sequence == -1)
        if (header.size != len(batch) or header.base_offset != 0 or header.is_control
                or (header.producer_id != -1 and not coordinator_txn)
                or (header.is_transactional and not coordinator_txn)):
            return self.append_as_leader(batch, leader_epoch)  # not what we build: check it
        if coordinator_txn:
            entry = self.producer_state.producers.get(header.producer_id)
            if entry is not None and header.producer_epoch < entry.epoch:
                raise InvalidRecordError(
                    ErrorCode.invalid_producer_epoch,
                    f"producer {header.producer_id} has epoch {header.producer_epoch}, "
                    f"older than the current {entry.epoch}")
        if header.size > self.config.max_message_bytes:
            raise InvalidRecordError(
                ErrorCode.message_too_large,
                f"batch of {header.size} bytes exceeds "
                f"max.message.bytes={self.config.max_message_bytes}",
            )
        log_append = self.config.message_timestamp_type == LOG_APPEND_TIME
        return self._append_headers(batch, [header], leader_epoch, log_append)

    def append_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                      coordinator_epoch: int, leader_epoch: int) -> AppendResult:
        """Write a transaction marker (WriteTxnMarkers, R-PROD-2): a control batch ending
        ``producer_id``'s transaction here. A marker older than the producer's epoch is
        INVALID_PRODUCER_EPOCH (the coordinator lost a race with a newer one)."""
        self._check_online()
        self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
        batch = control_batch(producer_id, producer_epoch, commit, coordinator_epoch,
                              self.clock.wall_ms())
        header = read_header(batch, 0)
        return self._append_headers(batch, [header], leader_epoch, False,
                                    marker=1 if commit else 0,
                                    coordinator_epoch=coordinator_epoch)

    def _append_headers(self, records: bytes | memoryview, headers: list[BatchHeader],
                        leader_epoch: int, log_append: bool,
                        marker: int | None = None, coordinator_epoch: int = -1
                        ) -> AppendResult:
        """Assign offsets to validated batches and write them (``append_as_leader``;
        ``marker``: the type of a control batch being written, ``append_marker``)."""
        first_offset = self.log_end_offset
        now = self.clock.wall_ms()
        # LogAppendTime changes bytes under the CRC: rewrite a copy. Otherwise only the base
        # offset and leader epoch change (outside the CRC): write a rewritten 16-byte prefix
        # and the rest of each batch straight from the request (no copy of the records).
        buf = bytearray(records) if log_append else None
        view = memoryview(records if buf is None else buf)
        stored: list[BatchHeader] = []
        next_offset = first_offset
        for h in headers:
            attributes, max_timestamp = h.attributes, h.max_timestamp
            if buf is not None:
                set_base_offset(buf, h, next_offset)
                set_partition_leader_epoch(buf, h, leader_epoch)
                set_log_append_time(buf, h, now)
                attributes |= TIMESTAMP_TYPE_BIT
                max_timestamp = now
            # what dataclasses.replace would give, without its per-call overhead
            stored.append(BatchHeader(
                next_offset, h.batch_length, leader_epoch, h.magic, h.crc, attributes,
                h.last_offset_delta, h.base_timestamp, max_timestamp, h.producer_id,
                h.producer_epoch, h.base_sequence, h.records_count, h.position))
            next_offset += h.last_offset_delta + 1
        last_offset = next_offset - 1

        if self.should_roll(len(view), last_offset):
            self._roll_for_append()
        seg = self.active_segment
        mark = seg.mark()
        try:
            for h in stored:
                pos = h.position
                if buf is not None:
                    seg.append(view[pos : pos + h.size], h)
                else:
                    prefix = _OFFSET.pack(h.base_offset) + view[pos + 8 : pos + 12].tobytes() + (
                        _EPOCH.pack(leader_epoch))
                    seg.append_parts([prefix, view[pos + _PREFIX : pos + h.size]], h)
        except (OSError, ValueError) as e:
            self._undo_append(seg, mark, e)
            raise LogError(ErrorCode.kafka_storage_error,
                           f"append to {seg.log_path} failed: {e}") from e
        aborted = [a for h in stored
                   if (a := self._track(h, marker, coordinator_epoch)) is not None]
        if aborted:
            self._index_aborted(seg, aborted)
        if not self.leader_epochs or leader_epoch > self.leader_epochs[-1][0]:
            self.leader_epochs.append((leader_epoch, first_offset))
            self._save_epochs()
        self._after_append(seg, sum(h.records_count for h in stored))
        return AppendResult(first_offset, last_offset, now if log_append else -1,
                            self.log_start_offset)

    # ------------------------------------------------------------------ replication
    def append_as_follower(self, records: bytes | memoryview) -> AppendResult | None:
        """Append batches a leader returned to a follower's Fetch, byte for byte (R-REP-3,
        Kafka's ``appendAsFollower``): offsets and partition leader epochs are kept as the
        leader stored them. A torn last batch (the leader cut its read at the byte limit)
        is dropped; batches wholly below the log end offset (a retried fetch) are skipped.
        Every batch is checked (header, magic 2, CRC-32C, offsets moving forward; gaps are
        allowed: a compacted leader has them) before anything is written; no size limit
        applies (Kafka's followers ignore max.message.bytes). The producer state and the
        leader-epoch cache follow the appended batches, so a new leader deduplicates a
        producer's retries from its own log (R-PROD-2). None if nothing was appended.

        Raises ``InvalidRecordError`` (nothing appended) or ``LogError`` (I/O)."""
        self._check_online()
        view = memoryview(records)
        whole = whole_batches_length(view)
        if whole == 0:
            return None
        headers = [h for h in split_batches(view[:whole], INT32_MAX)
                   if h.last_offset >= self.log_end_offset]
        if not headers:
            return None
        expected = self.log_end_offset
        for h in headers:
            if h.base_offset < expected:
                raise InvalidRecordError(
                    ErrorCode.corrupt_message,
                    f"batch at offset {h.base_offset} overlaps the log (next offset "
                    f"{expected}) of {self.dir.name}")
            expected = h.last_offset + 1
        first_offset = headers[0].base_offset
        last_offset = headers[-1].last_offset
        size = sum(h.size for h in headers)
        if self.should_roll(size, last_offset):
            self._roll_for_append()
        seg = self.active_segment
        mark = seg.mark()
        try:
            for h in headers:
                if last_offset - seg.base_offset > INT32_MAX:  # pragma: no cover - huge gaps
                    raise ValueError("offsets do not fit the segment's index")
                seg.append(view[h.position:h.position + h.size], h)
        except (OSError, ValueError) as e:
            self._undo_append(seg, mark, e)
            raise LogError(ErrorCode.kafka_storage_error,
                           f"append to {seg.log_path} failed: {e}") from e
        epochs_changed = False
        aborted: list[AbortedTxn] = []
        for h in headers:
            kind, cepoch = None, -1
            if h.is_control:
                try:
                    kind, cepoch = marker_info(view[h.position:h.position + h.size])
                except InvalidRecordError:
                    kind = None
            txn = self._track(h, kind, cepoch)
            if txn is not None:
                aborted.append(txn)
            epoch = h.partition_leader_epoch
            if epoch >= 0 and (not self.leader_epochs or epoch > self.leader_epochs[-1][0]):
                self.leader_epochs.append((epoch, h.base_offset))
                epochs_changed = True
        if aborted:
            self._index_aborted(seg, aborted)
        if epochs_changed:
            self._save_epochs()
        self._after_append(seg, sum(h.records_count for h in headers))
        return AppendResult(first_offset, last_offset, -1, self.log_start_offset)

    def _save_epochs(self) -> None:
        """The epochs changed: write the checkpoint now, or have it written (``defer_epochs``)."""
        self._epochs_version += 1
        if self.defer_epochs is not None:
            self.defer_epochs(self)
        else:
            self.write_epochs_now()

    def latest_epoch(self) -> int | None:
        return self.leader_epochs[-1][0] if self.leader_epochs else None

    def assign_epoch(self, epoch: int, start_offset: int) -> None:
        """A new leader records its epoch at its log end offset before it appends (Kafka's
        ``Partition.makeLeader``), so OffsetForLeaderEpoch answers for it at once."""
        if epoch < 0 or (self.leader_epochs and epoch <= self.leader_epochs[-1][0]):
            return
        self.leader_epochs = [(e, o) for e, o in self.leader_epochs if o < start_offset]
        self.leader_epochs.append((epoch, start_offset))
        self._save_epochs()

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's ``LeaderEpochFileCache.endOffsetFor`` over this log's epochs
        (``replication.epochs.end_offset_for_epoch``)."""
        return end_offset_for_epoch(self.leader_epochs, epoch, self.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Empty the log and restart it at ``offset`` (a follower whose leader's log starts
        past its own end)."""
        log.warning("restarting log %s at offset %d (the leader's log starts there)",
                    self.dir, offset)
        self._generation += 1
        for seg in self._segments:
            seg.delete()
        self._segments = [LogSegment.create(
            self.dir, offset, index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes, now_ms=self.clock.wall_ms())]
        self._bases = [offset]
        self._unflushed = []
        self._delete_all_snapshots()
        self.log_start_offset = offset
        self._forget_stored_log_start()
        self.high_watermark = min(self.high_watermark, offset)
        self.producer_state.producers.clear()
        self.txns.clear()
        self.leader_epochs = []
        self._save_epochs()

    def _undo_append(self, seg: LogSegment, mark: SegmentMark, cause: Exception) -> None:
        """Put the active segment back as it was before a failed append; if even that
        fails, take the log offline (Kafka's ``LogDirFailureChannel``): a torn batch must
        never stay in front of later appends, which would be acknowledged but unreadable."""
        try:
            seg.undo_to(mark)
        except OSError as e:
            self._go_offline(f"append failed ({cause}) and could not be undone ({e})")
        else:
            log.warning("append to %s failed (%s); the segment is back at %d bytes",
                        seg.log_path, cause, mark.size)

    def _go_offline(self, reason: str) -> None:
        if self.offline is None:
            self.offline = reason
            _note_offline()
            log.error("log %s is offline until restart: %s", self.dir, reason)

    def _check_online(self) -> None:
        if self.offline is not None:
            raise LogError(ErrorCode.kafka_storage_error,
                           f"log {self.dir} is offline: {self.offline}")

    def _roll_for_append(self) -> None:
        """``roll`` for an append: a failure leaves no new segment file behind (or takes the
        log offline) and raises KAFKA_STORAGE_ERROR."""
        base = self.log_end_offset
        try:
            self.roll()
        except OSError as e:
            if self.active_segment.base_offset != base:  # the new segment's files: remove
                try:
                    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                        (self.dir / f"{base:020d}{suffix}").unlink(missing_ok=True)
                except OSError as e2:
                    self._go_offline(f"roll failed ({e}) and its files stay ({e2})")
            raise LogError(ErrorCode.kafka_storage_error,
                           f"rolling a new segment of {self.dir} failed: {e}") from e

    def _after_append(self, seg: LogSegment, messages: int) -> None:
        if not self._unflushed or self._unflushed[-1] is not seg:
            self._unflushed.append(seg)
        self._unflushed_messages += messages
        if (self._unflushed_messages >= self.config.flush_messages
                or self.clock.monotonic_ms() - self._last_flush_ms >= self.config.flush_ms):
            self.flush()

    # ------------------------------------------------------------------ read
    def _segment_index(self, offset: int) -> int:
        return max(bisect_right(self._bases, offset) - 1, 0)

    def read(self, offset: int, max_bytes: int, *, max_offset: int, min_one_batch: bool) -> bytes:
        """Whole batches from the one containing ``offset``, all below ``max_offset``.

        At most ``max_bytes``, except that with ``min_one_batch`` the first batch is returned
        whole even if larger (KIP-74). b"" at the log end or at/after ``max_offset``.
        OFFSET_OUT_OF_RANGE below the log start or above the log end offset.
        """
        chunks, _, _ = self.read_chunks(offset, max_bytes, max_offset=max_offset,
                                        min_one_batch=min_one_batch)
        if len(chunks) == 1 and isinstance(chunks[0], bytes):
            return chunks[0]
        return b"".join(chunks)

    @overload
    def read_chunks(
        self, offset: int, max_bytes: int, *, max_offset: int, min_one_batch: bool,
        regions: Literal[False] = False,
    ) -> tuple[list[bytes | memoryview], int, bool]: ...

    @overload
    def read_chunks(
        self, offset: int, max_bytes: int, *, max_offset: int, min_one_batch: bool,
        regions: bool,
    ) -> tuple[list[bytes | memoryview | FileRegion], int, bool]: ...

    def read_chunks(
        self, offset: int, max_bytes: int, *, max_offset: int, min_one_batch: bool,
        regions: bool = False,
    ) -> tuple[list[Any], int, bool]:
        """``read`` without joining: (one chunk per segment read, their total size, whether
        batches below ``max_offset`` were left out for ``max_bytes``). Each chunk is one
        ``os.pread`` (a view of it when it ends in a partial batch), so the Fetch path writes
        the stored bytes without copying them again; with ``regions``, a segment's whole
        batches of at least ``REGION_MIN_BYTES`` are a ``FileRegion`` instead, which the
        connection sends with ``sendfile`` (the caller must not need the bytes)."""
        self._check_online()
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset)
        limit = min(max_offset, self.log_end_offset)
        chunks: list[bytes | memoryview | FileRegion] = []
        remaining = max_bytes
        i = self._segment_index(offset)
        while offset < limit and i < len(self._segments):
            seg = self._segments[i]
            first = seg.find_batch(offset)
            i += 1
            if first is None:
                continue
            if first.last_offset >= limit:
                break
            if limit >= seg.next_offset:
                end = seg.size
            else:
                stop = seg.find_batch(limit)
                assert stop is not None
                end = stop.position
            length = end - first.position
            if length <= remaining:
                chunks.append(seg.read_region(first.position, length) if regions
                              else seg.read(first.position, length))
                remaining -= length
                offset = seg.next_offset
                continue
            if regions and remaining >= REGION_MIN_BYTES:
                whole = seg.whole_batches_within(first.position, remaining, limit)
                if whole >= REGION_MIN_BYTES:
                    chunks.append(seg.read_region(first.position, whole))
                    return chunks, max_bytes - remaining + whole, True
            data = seg.read(first.position, remaining) if remaining > 0 else b""
            whole = whole_batches_length(data)
            if whole:
                chunks.append(data if whole == len(data) else memoryview(data)[:whole])
                remaining -= whole
            elif min_one_batch and not chunks:
                chunks.append(seg.read(first.position, first.size))
                remaining -= first.size
            return chunks, max_bytes - remaining, True
        return chunks, max_bytes - remaining, False

    # ------------------------------------------------------------------ timestamps
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with a timestamp >= ``timestamp``.

        Finds the first segment whose max timestamp reaches it, starts at its time index
        entry and decodes only the candidate batch(es). None if no record is that recent.
        """
        self._check_online()
        for seg in self._segments:
            if seg.max_timestamp < timestamp:
                continue
            start = seg.find_batch(max(seg.time_index.lookup(timestamp), self.log_start_offset))
            if start is None:
                continue
            for h in seg.headers(start.position):
                if h.max_timestamp < timestamp:
                    continue
                for offset, ts in record_timestamps(seg.read(h.position, h.size)):
                    if ts >= timestamp and offset >= self.log_start_offset:
                        return offset, ts
        return None

    def max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with the largest timestamp (KIP-734)."""
        self._check_online()
        best: LogSegment | None = None
        for seg in self._segments:
            if seg.max_timestamp >= 0 and (best is None or seg.max_timestamp > best.max_timestamp):
                best = seg
        if best is None:
            return None
        h = best.find_batch(best.offset_of_max_timestamp)
        if h is None:
            return None
        for offset, ts in record_timestamps(best.read(h.position, h.size)):
            if ts == best.max_timestamp:
                return offset, ts
        return h.last_offset, best.max_timestamp

    # ------------------------------------------------------------------ retention
    def delete_old_segments(self) -> int:
        """Delete whole segments past retention.ms or retention.bytes (R-LOG-5).

        Only with cleanup.policy delete. Time: a segment goes when its largest timestamp
        (file mtime if it has none) is more than retention.ms old. Size: oldest segments go
        while the log stays at least retention.bytes large without them (Kafka's rule; the
        log may exceed the limit by less than one segment). Both stop at the first segment
        that must stay and never delete data at or past the high watermark. If the whole
        log, active segment included, is deletable, a new segment is rolled first. Returns
        the number of segments deleted; the log start offset advances.
        """
        if not self.config.delete:
            return 0
        deleted = 0
        now = self.clock.wall_ms()
        if self.config.retention_ms >= 0:
            retention_ms = self.config.retention_ms
            deleted += self._delete_segments(
                lambda seg: now - _largest_timestamp(seg) > retention_ms, "retention.ms"
            )
        if self.config.retention_bytes >= 0:
            excess = self.size_in_bytes - self.config.retention_bytes

            def over_size(seg: LogSegment) -> bool:
                nonlocal excess
                if excess - seg.size < 0:
                    return False
                excess -= seg.size
                return True

            deleted += self._delete_segments(over_size, "retention.bytes")
        return deleted

    def _delete_segments(self, predicate: Callable[[LogSegment], bool], reason: str) -> int:
        deletable: list[LogSegment] = []
        n = len(self._segments)
        for i, seg in enumerate(self._segments):
            last = i == n - 1
            upper = self.log_end_offset if last else self._segments[i + 1].base_offset
            if (last and seg.size == 0) or self.high_watermark < upper or not predicate(seg):
                break
            deletable.append(seg)
        if not deletable:
            return 0
        if len(deletable) == n:
            self.roll()
        for seg in deletable:
            log.info("deleting segment %s (%s): offsets [%d, %d), %d bytes", seg.log_path,
                     reason, seg.base_offset, seg.next_offset, seg.size)
            self._segments.remove(seg)
            if seg in self._unflushed:
                self._unflushed.remove(seg)
            seg.delete()
        self._bases = [s.base_offset for s in self._segments]
        self._generation += 1
        self.log_start_offset = max(self.log_start_offset, self._segments[0].base_offset)
        self.txns.drop_before(self.log_start_offset)
        self._truncate_epochs_from_start(self.log_start_offset)
        self._delete_old_snapshots()
        return len(deletable)

    # ------------------------------------------------------------------ compaction
    def compact(self, now_ms: int, *, force: bool = False) -> cleaner.CleanerStats | None:
        """Compact the closed segments below the high watermark (R-LOG-6, ``cleaner``), all
        on this thread: ``prepare_compaction``, ``CompactionJob.run``, ``finish_compaction``.

        Only with cleanup.policy compact. Skipped (None) unless a segment became cleanable
        since the last run or a kept tombstone has expired (``force`` runs it anyway).
        """
        job = self.prepare_compaction(now_ms, force=force)
        if job is None:
            return None
        try:
            job.run()
        except BaseException:
            self.abandon_compaction(job)
            raise
        return self.finish_compaction(job)

    def prepare_compaction(self, now_ms: int, *, force: bool = False) -> CompactionJob | None:
        """On the log's thread: a compaction job if one is due (see ``compact``), whose
        ``run`` (the decoding, filtering and writing of ``.cleaned`` files: the heavy part)
        may go to a worker thread while appends and reads go on; then ``finish_compaction``
        (or ``abandon_compaction``) on the log's thread again. One job at a time."""
        if not self.config.compact or self._compaction is not None or self.offline:
            return None
        upto = min(self.high_watermark, self.log_end_offset)
        k = 0
        while k < len(self._segments) - 1 and self._segments[k + 1].base_offset <= upto:
            k += 1
        cleanable_end = self._segments[k].base_offset
        expiry = self._tombstone_expiry_ms
        if not force and cleanable_end == self._cleaned_to and (
            expiry is None or now_ms < expiry
        ):
            return None
        job = CompactionJob(list(self._segments), upto, self.config, now_ms, self._generation)
        self._compaction = job
        return job

    def abandon_compaction(self, job: CompactionJob) -> None:
        """The job failed or the log is going away: remove its output."""
        if self._compaction is job:
            self._compaction = None
        job.discard()

    def finish_compaction(self, job: CompactionJob) -> cleaner.CleanerStats | None:
        """On the log's thread: swap the job's cleaned groups in, unless the segments it
        read changed meanwhile (retention, truncation, a config change, close): then its
        output is discarded and None returned (the next run starts over). An I/O error
        after the point of no return takes the log offline (restart completes the swap)."""
        if self._compaction is job:
            self._compaction = None
        stats = job.stats
        if stats is None or job.generation != self._generation or self.offline is not None:
            job.discard()
            return None
        cleanable = job.cleanable
        assert self._segments[:cleanable] == job.segments[:cleanable]
        result: list[LogSegment] = []
        try:
            for group, path in job.groups:
                if path is None:
                    result.append(group[0].segment)
                else:
                    result.append(self._swap_in(group, path))
        except OSError as e:
            job.discard()
            self._go_offline(f"compaction swap failed: {e}")
            raise LogError(ErrorCode.kafka_storage_error,
                           f"compaction of {self.dir} failed: {e}") from e
        self._segments = result + self._segments[cleanable:]
        self._bases = [s.base_offset for s in self._segments]
        self._unflushed = [s for s in self._unflushed if s in self._segments]
        self._cleaned_to = stats.cleanable_end
        self._tombstone_expiry_ms = stats.next_tombstone_expiry_ms
        if stats.groups_rewritten:
            self._generation += 1
        return stats

    def _swap_in(self, group: list[cleaner.CleanedSegment], cleaned: Path) -> LogSegment:
        """Replace a group of segments by its cleaned file (the cleaner's ``.swap``
        protocol: ``open`` completes a swap interrupted by a crash)."""
        first = group[0].segment
        base = first.base_offset
        swap = self.dir / f"{base:020d}{LOG_SUFFIX}{cleaner.SWAP_SUFFIX}"
        failpoint("compaction-cleaned")
        try:
            # the group's aborted transactions, all in the first segment's .txnindex before
            # the swap (until it completes they are in two files: a load deduplicates)
            nxt = self._segments.index(group[-1].segment) + 1
            end = self._segments[nxt].base_offset if nxt < len(self._segments) else 2**63
            write_aborted(txn_index_path(self.dir, base),
                          [a for a in self.txns.aborted if base <= a.last_offset < end])
            os.replace(cleaned, swap)
            fsync_dir(self.dir)
        except OSError:
            cleaned.unlink(missing_ok=True)
            raise
        # the point of no return: from here on, open completes the swap
        failpoint("compaction-swap")
        created_ms = min(c.segment.created_ms for c in group)
        for c in group[1:]:
            c.segment.delete()
        first.close()
        first.index.delete()
        first.time_index.delete()
        failpoint("compaction-deleted")
        os.replace(swap, first.log_path)
        fsync_dir(self.dir)
        seg = LogSegment(self.dir, base, index_interval_bytes=self.config.index_interval_bytes,
                         max_index_bytes=self.config.segment_index_bytes, created_ms=created_ms)
        seg.recover()
        seg.on_become_inactive()
        log.info("compacted segment(s) %s of %s into %020d: %d -> %d bytes",
                 ", ".join(str(c.segment.base_offset) for c in group), self.dir, base,
                 sum(c.segment.size for c in group), seg.size)
        return seg

    def _truncate_epochs_from_start(self, start: int) -> None:
        epochs = [(e, o) for e, o in self.leader_epochs if o >= start]
        older = [(e, o) for e, o in self.leader_epochs if o < start]
        if older and (not epochs or epochs[0][1] > start):
            epochs.insert(0, (older[-1][0], start))
        if epochs != self.leader_epochs:
            self.leader_epochs = epochs
            self._save_epochs()

    # ------------------------------------------------------------------ log start offset
    @property
    def log_start_offset_path(self) -> Path:
        return self.dir / LOG_START_OFFSET_FILE

    def increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset forward to ``offset`` (DeleteRecords; Kafka's
        ``maybeIncrementLogStartOffset``): records below it are no longer served (a fetch
        there gets OFFSET_OUT_OF_RANGE, ListOffsets earliest answers it), segments wholly
        below it are deleted, the leader-epoch cache is cut at it; producer state stays (as
        Kafka's does). ``offset`` at or below the current start changes nothing (False).

        The new offset is written to ``log-start-offset`` (renamed into place, not
        fsynced: ``sync_log_start_offset`` does that, off the event loop) before anything
        else changes. Raises ``LogError``: OFFSET_OUT_OF_RANGE past the high watermark,
        KAFKA_STORAGE_ERROR if the log is offline or the file cannot be written (then
        nothing changed)."""
        self._check_online()
        if offset > self.high_watermark:
            raise LogError(ErrorCode.offset_out_of_range,
                           f"cannot move the log start offset of {self.dir.name} to {offset}: "
                           f"past the high watermark {self.high_watermark}")
        if offset <= self.log_start_offset:
            return False
        try:
            write_atomically(self.log_start_offset_path,
                             f"{_CHECKPOINT_VERSION}\n{offset}\n".encode(), fsync=False)
        except OSError as e:
            raise LogError(ErrorCode.kafka_storage_error,
                           f"cannot write {self.log_start_offset_path}: {e}") from e
        log.info("log start offset of %s moved from %d to %d", self.dir, self.log_start_offset,
                 offset)
        self.log_start_offset = offset
        self.txns.drop_before(offset)
        self._truncate_epochs_from_start(offset)
        self._delete_segments_below_start()
        return True

    def _delete_segments_below_start(self) -> int:
        """Delete the segments whose every offset is below the log start offset (Kafka's
        ``deleteLogStartOffsetBreachedSegments``); the active segment always stays."""
        doomed: list[LogSegment] = []
        for seg, nxt in zip(self._segments, self._segments[1:], strict=False):
            if nxt.base_offset > self.log_start_offset:
                break
            doomed.append(seg)
        if not doomed:
            return 0
        for seg in doomed:
            log.info("deleting segment %s (below the log start offset %d): offsets [%d, %d), "
                     "%d bytes", seg.log_path, self.log_start_offset, seg.base_offset,
                     seg.next_offset, seg.size)
            self._segments.remove(seg)
            if seg in self._unflushed:
                self._unflushed.remove(seg)
            try:
                seg.delete()
            except OSError as e:  # out of the log either way; open deletes it again
                log.warning("could not delete segment %s: %s", seg.log_path, e)
        self._bases = [s.base_offset for s in self._segments]
        self._generation += 1
        self._delete_old_snapshots()
        return len(doomed)

    def _apply_stored_log_start(self) -> None:
        """At open: a log start offset that DeleteRecords stored past the first segment's
        base offset (see the module docstring)."""
        stored = _read_log_start(self.log_start_offset_path)
        if stored is None or stored <= self.log_start_offset:
            return
        if stored > self.log_end_offset:
            log.warning("log %s ends at %d, before its stored log start offset %d: emptying it",
                        self.dir, self.log_end_offset, stored)
            self.truncate_fully_and_start_at(stored)
            return
        self.log_start_offset = stored
        self._truncate_epochs_from_start(stored)
        self._delete_segments_below_start()

    def _forget_stored_log_start(self) -> None:
        """The log restarted at or below its old start (truncation): the stored start no
        longer holds."""
        try:
            self.log_start_offset_path.unlink(missing_ok=True)
        except OSError as e:
            log.error("could not remove %s: %s; the next open may start the log there",
                      self.log_start_offset_path, e)

    # ------------------------------------------------------------------ truncation
    def truncate_to(self, offset: int) -> None:
        """Remove every batch with offsets >= ``offset`` (a follower diverging from its
        leader, R-REP-7). A batch containing ``offset`` is removed whole. Below the log start
        offset the log is emptied and restarts at ``offset``. At or past the log end offset
        no batch goes, but epochs starting at the log end do (Kafka's ``truncateTo``): a
        former leader that assigned its epoch and appended nothing before another was
        elected would otherwise keep claiming that epoch."""
        if offset >= self.log_end_offset:
            leo = self.log_end_offset
            if self.leader_epochs and self.leader_epochs[-1][1] >= leo:
                self.leader_epochs = [(e, o) for e, o in self.leader_epochs if o < leo]
                self._save_epochs()
            return
        log.warning("truncating log %s from %d to %d", self.dir, self.log_end_offset, offset)
        self._generation += 1
        if offset <= self.log_start_offset:
            for seg in self._segments:
                seg.delete()
            self._segments = [LogSegment.create(
                self.dir, offset, index_interval_bytes=self.config.index_interval_bytes,
                max_index_bytes=self.config.segment_index_bytes, now_ms=self.clock.wall_ms(),
            )]
            self._delete_all_snapshots()
            self.log_start_offset = offset
            self._forget_stored_log_start()
        else:
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                self._segments.pop().delete()
            self._segments[-1].truncate_to(offset)
        self._bases = [s.base_offset for s in self._segments]
        self._unflushed = [s for s in self._unflushed if s in self._segments]
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        # Kafka's truncateAndReload: the newest snapshot at or below the new end, then the
        # batches after it (snapshots past the end are removed)
        self._load_state(self.leader_epochs)

    # ------------------------------------------------------------------ config, lifecycle
    def update_config(self, config: LogConfig) -> None:
        """Apply new topic settings; index sizes apply to segments created from now on."""
        self.config = config
        self._cleaned_to = None
        self._generation += 1
        for seg in self._segments:
            seg.index_interval_bytes = config.index_interval_bytes

    def flush_if_due(self) -> bool:
        """fsync if data has waited ``flush.ms`` since the last flush (the broker's flusher
        calls this periodically, like Kafka's ``log.flush.scheduler.interval.ms``)."""
        if self._unflushed and (
                self.clock.monotonic_ms() - self._last_flush_ms >= self.config.flush_ms):
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """fsync every segment written since the last flush. A failed fsync takes the log
        offline (the kernel may have dropped the dirty pages: what was written cannot be
        trusted, as Kafka and PostgreSQL conclude) and raises KAFKA_STORAGE_ERROR."""
        if self.offline is not None:
            return
        try:
            for seg in self._unflushed:
                seg.flush()
            for base in sorted(self._txn_index_dirty):
                fsync_file(txn_index_path(self.dir, base))
        except OSError as e:
            self._go_offline(f"fsync failed: {e}")
            raise LogError(ErrorCode.kafka_storage_error,
                           f"flushing {self.dir} failed: {e}") from e
        self._unflushed.clear()
        self._txn_index_dirty.clear()
        self._unflushed_messages = 0
        self._last_flush_ms = self.clock.monotonic_ms()

    def close(self) -> None:
        """Flush and close every file, after writing a producer snapshot at the log end
        (Kafka's clean shutdown), so the next open reads no batch header for its state (a
        running compaction's output is discarded when it finishes)."""
        self._generation += 1
        if self.offline is None and self.active_segment.size:
            self.take_snapshot()
        if self.offline is None:
            self.write_epochs_now()
        with self._epochs_lock:
            self._epochs_closed = True  # a deferred write still queued is dropped
        try:
            self.flush()
        finally:
            for seg in self._segments:
                seg.close()

    def delete(self) -> None:
        """Close and remove the partition's directory."""
        self._generation += 1
        with self._epochs_lock:
            self._epochs_closed = True
        for seg in self._segments:
            seg.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        log.info("deleted log %s", self.dir)


# ---------------------------------------------------------------------- compaction job


class CompactionJob:
    """One compaction pass over a snapshot of a log's segments (``prepare_compaction``).

    ``run`` only reads the snapshot's closed segments (and the headers and records of the
    others for the offset map) and writes ``N.log.cleaned`` files (fsynced), so it may run
    in a worker thread while the log appends and serves reads; the log's thread then swaps
    the output in (``finish_compaction``) if the segments did not change meanwhile.
    """

    def __init__(self, segments: list[LogSegment], upto: int, config: LogConfig, now_ms: int,
                 generation: int) -> None:
        self.segments = segments
        self.upto = upto
        self.config = config
        self.now_ms = now_ms
        self.generation = generation
        self.cleanable = 0
        self.stats: cleaner.CleanerStats | None = None
        # each group of segments with its cleaned file (None: left as it is)
        self.groups: list[tuple[list[cleaner.CleanedSegment], Path | None]] = []

    def run(self) -> None:
        """Decode, filter and write (see the class docstring); on an error nothing of
        this job stays on disk and the error propagates."""
        try:
            self._run()
        except BaseException:
            self.discard()
            raise

    def _run(self) -> None:
        self.cleanable, stats, groups = cleaner.plan(
            self.segments, self.upto, self.config, self.now_ms)
        for group, rewrite in groups:
            self.groups.append((group, cleaner.write_cleaned(group) if rewrite else None))
        self.stats = stats

    def discard(self) -> None:
        for _, path in self.groups:
            if path is not None:
                try:
                    path.unlink(missing_ok=True)
                except OSError as e:  # open removes .cleaned files anyway
                    log.warning("could not remove %s: %s", path, e)
        self.groups = []


# ---------------------------------------------------------------------- offline


class OfflineLog(PartitionLog):
    """A partition whose log could not be opened at start (an unreadable file, a directory
    replaced by a file): it holds no file, answers every read and append with
    KAFKA_STORAGE_ERROR, and reports empty offsets until the broker restarts."""

    def __init__(self, directory: Path, config: LogConfig, clock: Clock, reason: str) -> None:
        self.dir = directory
        self.config = config
        self.clock = clock
        self._segments = []
        self._bases = []
        self.log_start_offset = 0
        self.high_watermark = 0
        self.producer_state = ProducerStateManager(strict_new_producers=False)
        self.txns = TxnTracker()
        self.leader_epochs = []
        self.defer_epochs = None
        self._epochs_lock = threading.Lock()
        self._epochs_version = self._epochs_written = self._epochs_synced = 0
        self._epochs_closed = True  # no file to write
        self._unflushed = []
        self._unflushed_messages = 0
        self._last_flush_ms = clock.monotonic_ms()
        self._cleaned_to = None
        self._tombstone_expiry_ms = None
        self.offline = reason
        _note_offline()
        self.topic_id = None
        self._generation = 0
        self._compaction = None

    @property
    def active_segment(self) -> LogSegment:
        raise LogError(ErrorCode.kafka_storage_error, f"log {self.dir} is offline")

    @property
    def log_end_offset(self) -> int:
        return 0

    @property
    def size_in_bytes(self) -> int:
        return 0

    def compact(self, now_ms: int, *, force: bool = False) -> cleaner.CleanerStats | None:
        return None

    def delete_old_segments(self) -> int:
        return 0

    def truncate_to(self, offset: int) -> None:
        self._check_online()

    def update_config(self, config: LogConfig) -> None:
        self.config = config

    def flush_if_due(self) -> bool:
        return False

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None

    def delete(self) -> None:
        if self.dir.is_dir():
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            self.dir.unlink(missing_ok=True)


# ---------------------------------------------------------------------- helpers

FAILPOINT_ENV = "HEADRACE_FAILPOINT"


def failpoint(name: str) -> None:
    """Crash tests: SIGKILL this process here if ``HEADRACE_FAILPOINT`` names this point
    (a kill -9 landing exactly between two steps of a multi-file change)."""
    if os.environ.get(FAILPOINT_ENV) == name:
        import signal

        log.warning("failpoint %s: killing the process", name)
        os.kill(os.getpid(), signal.SIGKILL)


def _topic_id_text(topic_id: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString``: base64url of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def read_partition_metadata(directory: Path) -> uuid.UUID | None:
    """The topic id in ``directory``'s partition.metadata; None if absent or unreadable."""
    try:
        text = (directory / PARTITION_METADATA).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    try:
        if fields.get("version", "").strip() != "0":
            return None
        raw = fields["topic_id"].strip()
        data = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        return uuid.UUID(bytes=data)
    except (KeyError, ValueError):
        return None


def write_partition_metadata(directory: Path, topic_id: uuid.UUID) -> None:
    """Write partition.metadata (renamed into place, not fsynced: losing it in a crash
    only means the directory is adopted by its topic again at the next open)."""
    write_atomically(directory / PARTITION_METADATA,
                     f"version: 0\ntopic_id: {_topic_id_text(topic_id)}\n".encode(),
                     fsync=False)


def is_partition_dir(path: Path) -> bool:
    """Whether ``path`` looks like a partition directory this broker made (so removing it
    as a stray cannot destroy anything else a person put into the data dir)."""
    try:
        if not path.is_dir():
            return False
        names = os.listdir(path)
    except OSError:
        return False
    return not names or any(
        n in (PARTITION_METADATA, LEADER_EPOCH_CHECKPOINT) or n.endswith(LOG_SUFFIX)
        for n in names)


def _largest_timestamp(seg: LogSegment) -> int:
    """The segment's largest record timestamp, or its file's mtime if it has none (Kafka)."""
    if seg.max_timestamp >= 0:
        return seg.max_timestamp
    return os.stat(seg.log_path).st_mtime_ns // 1_000_000


def _remove_orphan_indexes(directory: Path, bases: set[int]) -> None:
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
        for p in directory.glob(f"*{suffix}"):
            if p.stem.isdigit() and int(p.stem) not in bases:
                log.info("removing orphan index file %s", p)
                p.unlink(missing_ok=True)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        log.warning("could not remove %s: %s", path, e)


def _read_checkpoint(path: Path) -> list[tuple[int, int]] | None:
    """The entries of a leader-epoch-checkpoint file; None if missing or malformed. As
    strict as Kafka's ``CheckpointFile`` reader: the version line, the count line, exactly
    that many "epoch offset" lines, each ended by a newline, and nothing after them. The
    file is rewritten in place (``PartitionLog.write_epochs``), so an OS crash can leave a
    new content cut at the old length or an old one followed by the rest of a longer page:
    either is rejected here and the epochs are rebuilt from the batch headers."""
    try:
        lines = path.read_bytes().decode("ascii").split("\n")
        if int(lines[0]) != _CHECKPOINT_VERSION:
            return None
        count = int(lines[1])
        if count < 0 or len(lines) != count + 3 or lines[-1]:
            return None
        entries = []
        for line in lines[2 : 2 + count]:
            epoch, offset = line.split(" ")
            entries.append((int(epoch), int(offset)))
        return entries
    except (OSError, ValueError, IndexError):  # (UnicodeDecodeError is a ValueError)
        return None


def _read_log_start(path: Path) -> int | None:
    """The offset in a ``log-start-offset`` file; None if missing or malformed (a torn or
    bad file is ignored with one warning: the log then starts at its first segment)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        log.warning("cannot read %s (%s); ignoring it", path, e)
        return None
    lines = text.split("\n")
    try:
        if int(lines[0]) != _CHECKPOINT_VERSION:
            raise ValueError(f"version {lines[0]!r}")
        offset = int(lines[1])
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        return offset
    except (ValueError, IndexError) as e:
        log.warning("malformed %s (%s); ignoring it", path, e)
        return None


def sync_log_start_offset(plog_dir: Path) -> None:
    """fsync a partition's ``log-start-offset`` file and its directory (blocking: run it in
    a worker thread). A file gone meanwhile (the topic was deleted) is fine."""
    if fsync_file(plog_dir / LOG_START_OFFSET_FILE):
        fsync_dir(plog_dir)
