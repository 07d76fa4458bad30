"""The partitions this broker hosts: their logs, leader state and waiters.

A ``Partition`` joins a ``PartitionLog`` (storage) with its replica state from the metadata
store (leader, leader epoch, ISR). The high watermark is the smallest log end offset across
the ISR (R-REP-4); on a single node the ISR is this broker alone, so it equals the log end
offset after every append. Replication will feed follower log end offsets in through
``update_follower`` without changing callers.

Waiting (the purgatories of Kafka's ``ReplicaManager``): a long-poll Fetch parks a future
on the partitions it reads (``watch``); an append that moves the high watermark wakes them.
An acks=all Produce waits for the high watermark to pass its last offset (``wait_for_hw``).
Everything runs on the broker's event loop, except ``open_logs`` (filesystem only, safe in
a worker thread) and the removal of deleted partition directories (a background thread).

Deleting is crash-safe (Kafka's way): a deleted partition's directory is first renamed to
``<topic>-<p>.<uuid hex>-delete`` (one rename each, then an fsync of the data dir) and
removed afterwards in a background thread. Each partition directory holds its topic's id
(``partition.metadata``, ``PartitionLog``); at start, ``-delete`` leftovers are removed and
so is every partition directory that no topic owns or whose topic id is not its topic's
(``stray``: e.g. a kill -9 between the metadata commit of a delete and the renames), so a
topic re-created under an old name never adopts old files. A partition whose log cannot be
opened at start (an unreadable file, a directory replaced by a file) does not stop the
broker: it is logged once and served as offline (KAFKA_STORAGE_ERROR) until restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from headrace.clock import Clock
from headrace.config import LONG_MAX, BrokerConfig, log_config
from headrace.fsutil import fsync_dir, fsync_file
from headrace.log.errors import LogError
from headrace.log.partition_log import (
    AppendResult,
    OfflineLog,
    PartitionLog,
    failpoint,
    is_partition_dir,
    read_partition_metadata,
    sync_log_start_offset,
    write_partition_metadata,
)
from headrace.log.producer_state import VerificationGuard
from headrace.metadata.store import MetadataStore, PartitionState, TopicState
from headrace.replication.leader import (
    FollowerFetch,
    IsrChange,
    PartitionLeader,
    check_follower_fetch,
)

log = logging.getLogger("headrace.replica")


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class Partition:
    """A hosted partition: its log and its replica state.

    ``leading``: this broker acts as the partition's leader. On a single node every
    partition leads. On a cluster it is set by the transitions of ``ClusterNode`` (the
    state's leader is this broker and its ZooKeeper session is live) and cleared when
    another broker leads or the session is lost, so a deposed or fenced leader answers
    NOT_LEADER_OR_FOLLOWER at once.

    The leader side of replication is ``core``, a pure ``replication.leader.PartitionLeader``
    (follower states, the ISR with its pending change, the high watermark over the maximal
    ISR, R-REP-3/R-REP-4): this shell gives it the log end offset and the time, writes the
    high watermark it computes into the log, and wakes waiters when it moved. ``state.isr``
    is the committed ISR (``core.isr``); ``core`` exists while leading.
    """

    def __init__(self, tp: TopicPartition, log_: PartitionLog, state: PartitionState,
                 leading: bool = True) -> None:
        self.tp = tp
        self.log = log_
        self.state = state
        self.leading = False
        self.core: PartitionLeader | None = None
        self.wake: Callable[[TopicPartition], None] | None = None  # long polls
        self._hw_waiters: list[tuple[int, asyncio.Future[bool]]] = []
        if leading:
            self.become_leader(0)

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    def is_leader(self, node_id: int) -> bool:
        return self.leading and self.state.leader == node_id

    def in_sync_count(self) -> int:
        return len(self.state.isr)

    def append_as_leader(self, records: bytes | memoryview, *, verify_txn: bool = False,
                         guard: VerificationGuard | None = None) -> AppendResult:
        result = self.log.append_as_leader(records, self.state.leader_epoch,
                                           verify_txn=verify_txn, guard=guard)
        self._after_append()
        return result

    def append_own_batch(self, batch: bytes) -> AppendResult:
        """``append_as_leader`` of one batch built by the broker (``PartitionLog``)."""
        result = self.log.append_own_batch(batch, self.state.leader_epoch)
        self._after_append()
        return result

    def append_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                      coordinator_epoch: int) -> AppendResult:
        """A transaction marker (WriteTxnMarkers), as leader."""
        result = self.log.append_marker(producer_id, producer_epoch, commit, coordinator_epoch,
                                        self.state.leader_epoch)
        self._after_append()
        return result

    def _after_append(self) -> None:
        self._advance_hw()
        if self.wake is not None and len(self.state.replicas) > 1:
            self.wake(self.tp)  # followers long-polling for new data, in the ISR or not

    def _advance_hw(self) -> None:
        core = self.core
        if core is None:
            return
        if core.maybe_increment_high_watermark(self.log.log_end_offset):
            self._hw_moved()

    def _hw_moved(self) -> None:
        """The core's high watermark moved: into the log, then wake who waits for it."""
        assert self.core is not None
        self.log.high_watermark = self.core.high_watermark
        if self.wake is not None and len(self.core.followers):
            self.wake(self.tp)  # consumers see more
        if self._hw_waiters:
            hw = self.log.high_watermark
            still = []
            for offset, fut in self._hw_waiters:
                if hw >= offset:
                    if not fut.done():
                        fut.set_result(True)
                else:
                    still.append((offset, fut))
            self._hw_waiters = still

    def follower_fetched(self, node_id: int, fetch_offset: int, now_ms: int) -> None:
        """A follower's fetch at ``fetch_offset`` (its log end offset) was served from this
        log at ``now_ms`` (only after a successful read: ``check_follower_fetch``)."""
        if self.core is not None and self.core.follower_fetched(
                node_id, fetch_offset, self.log.log_end_offset, now_ms):
            self._hw_moved()

    def follower_caught_up(self, node_id: int, now_ms: int) -> None:
        """An idle ISR follower's session fetch with nothing new: still caught up."""
        if self.core is not None:
            self.core.follower_caught_up(node_id, now_ms)

    def check_follower_fetch(self, last_fetched_epoch: int, fetch_offset: int
                             ) -> FollowerFetch:
        return check_follower_fetch(self.log.leader_epochs, self.log.log_start_offset,
                                    self.log.log_end_offset, last_fetched_epoch, fetch_offset)

    def maybe_expand_isr(self, node_id: int, eligible: bool = True) -> IsrChange | None:
        return None if self.core is None else self.core.maybe_expand_isr(node_id, eligible)

    def maybe_shrink_isr(self, now_ms: int, lag_ms: int) -> IsrChange | None:
        """ISR followers not caught up for ``lag_ms`` (``replica.lag.time.max.ms``), as a
        pending change, or None."""
        if self.core is None:
            return None
        return self.core.maybe_shrink_isr(self.log.log_end_offset, now_ms, lag_ms)

    def isr_committed(self, change: IsrChange, state: PartitionState, now_ms: int) -> None:
        """The state store took ``change``; ``state`` is the partition state written."""
        self.state = state
        if self.core is not None and self.core.isr_committed(
                change, self.log.log_end_offset, now_ms):
            self._hw_moved()

    def isr_failed(self, change: IsrChange) -> None:
        if self.core is not None:
            self.core.isr_failed(change)

    def update_state(self, state: PartitionState, now_ms: int) -> IsrChange | None:
        """New state from the metadata for the leader and epoch acted on (the controller
        changed the ISR, a reassignment the replicas). Returns this leader's pending ISR
        change if the state settled it as taken (its write's answer not yet seen, or
        lost): the caller reports it, as it would on the answer."""
        self.state = state
        core = self.core
        if core is None or core.leader_epoch != state.leader_epoch:
            return None
        if tuple(state.replicas) != core.replicas:
            core.set_replicas(state.replicas)
        pending = core.pending
        if pending is not None:
            # a newer state settles a pending change: ours if it lists that ISR (its answer
            # may have been lost, or the watch came first), else someone else decided and
            # ours will be refused
            if tuple(state.isr) == pending.isr:
                if core.isr_committed(pending, self.log.log_end_offset, now_ms):
                    self._hw_moved()
                return pending
            core.isr_failed(pending)
        if tuple(state.isr) != core.isr and core.set_isr(
                state.isr, self.log.log_end_offset, now_ms):
            self._hw_moved()
        if self.wake is not None:
            # a follower's session looks at the partition again: one taken out of the ISR
            # while caught up rejoins at its next fetch, not at the session's full pass
            self.wake(self.tp)
        return None

    def become_leader(self, now_ms: int) -> None:
        """Lead at ``state``'s epoch, from the log end offset (Kafka's ``makeLeader``)."""
        self.leading = True
        self.core = PartitionLeader(
            self.state.leader, self.state.leader_epoch, self.state.replicas, self.state.isr,
            self.log.log_end_offset, self.log.high_watermark, now_ms)
        self._advance_hw()

    def become_follower(self) -> None:
        self.leading = False
        self.core = None
        self.fail_waiters()

    def fail_waiters(self) -> None:
        """Leadership is gone: acks=all requests waiting here are answered now
        (NOT_LEADER_OR_FOLLOWER) rather than at their timeout."""
        for _, fut in self._hw_waiters:
            if not fut.done():
                fut.set_result(False)
        self._hw_waiters = []

    async def wait_for_hw(self, offset: int, timeout_s: float) -> bool | None:
        """Wait until the high watermark reaches ``offset``: True; None on timeout; False
        if this broker stopped leading meanwhile."""
        if self.log.high_watermark >= offset:
            return True
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._hw_waiters.append((offset, fut))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return None
        finally:
            self._hw_waiters = [(o, f) for o, f in self._hw_waiters if f is not fut]


def partition_dir(data_dir: Path, tp: TopicPartition) -> Path:
    return data_dir / f"{tp.topic}-{tp.partition}"


EPOCH_WRITE_INTERVAL_S = 0.2  # how often changed leader-epoch checkpoints are written
_PARTITION_DIR = re.compile(r"^(.+)-(0|[1-9][0-9]{0,9})$")
_DELETE_DIR = re.compile(r"^.+-[0-9]+\.[0-9a-f]{32}-delete$")
_FUTURE_DIR = re.compile(r"^.+-[0-9]+\.[0-9a-f]{32}-future$")
DELETE_SUFFIX = "-delete"


def delete_dir_name(d: Path) -> Path:
    """Kafka's name for a partition directory being deleted: ``<topic>-<p>.<uuid>-delete``."""
    return d.with_name(f"{d.name}.{uuid.uuid4().hex}{DELETE_SUFFIX}")


def _remove_trees(paths: list[Path]) -> None:
    failed = []
    for path in paths:
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass
        except NotADirectoryError:
            path.unlink(missing_ok=True)
        except OSError as e:
            failed.append(f"{path.name}: {e.strerror}")
    if failed:
        log.error("could not remove %d deleted partition director%s (first: %s); the next "
                  "start retries", len(failed), "y" if len(failed) == 1 else "ies", failed[0])


class ReplicaManager:
    def __init__(
        self, data_dir: Path, config: BrokerConfig, metadata: MetadataStore, clock: Clock
    ) -> None:
        self.data_dir = data_dir
        # every log dir, ``data_dir`` first (it holds the broker's state and new
        # partitions); a partition living in another one is in ``_located``
        self.log_dirs: list[Path] = [data_dir, *config.log_dirs[1:]]
        self._located: dict[TopicPartition, Path] = {}
        # compaction jobs and replica moves take turns (a move closes the log a job reads)
        self._maintenance = asyncio.Lock()
        self.config = config
        self.metadata = metadata
        self.clock = clock
        self.node_id = config.node_id
        self.partitions: dict[TopicPartition, Partition] = {}
        self.clustered = config.clustered
        # high watermarks from replication-offset-checkpoint (a cluster's replicas)
        self.hw_checkpoint: dict[TopicPartition, int] = {}
        self._watchers: dict[TopicPartition, set[asyncio.Future[None]]] = {}
        # follower fetch sessions (fetch_sessions.FetchSession) subscribed to a partition
        # for as long as it is in the session: a wake marks it dirty there and wakes the
        # session's parked fetch (weak: an evicted session needs no unsubscribing)
        self._session_subs: dict[Any, weakref.WeakSet[Any]] = {}
        self._removers: list[threading.Thread] = []
        # logs whose leader-epoch checkpoint changed and is not written yet (their own
        # order: one entry per log however often it changed); see ``write_epochs_loop``
        self._epochs_pending: dict[int, PartitionLog] = {}
        # the partitions whose log has a finite flush.ms (the flusher looks only at them:
        # 30,000 partitions checked every second was 5% of a broker's event loop)
        self._timed_flush: dict[TopicPartition, Partition] = {}
        self._epochs_pending_lock = threading.Lock()

    # ---------------------------------------------------------------- lifecycle
    def load(self) -> None:
        """Remove what deletes left behind, then open (and recover) the log of every
        partition this broker hosts; one that cannot be opened is served offline."""
        topics = list(self.metadata.topics().values())
        for d in self.log_dirs[1:]:  # Kafka creates every log dir at start
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                log.error("log dir %s cannot be created (%s): no replica can move there",
                          d, e.strerror)
        self.remove_strays(topics)
        offline = 0
        opened = truncated = 0
        started = time.monotonic()
        for topic in topics:
            cfg = log_config(self.config, topic_overrides(topic))
            for i, state in enumerate(topic.partitions):
                if self.node_id not in state.replicas:
                    continue
                tp = TopicPartition(topic.name, i)
                d = partition_dir(self.dir_for(tp), tp)
                try:
                    plog = PartitionLog.open(d, cfg, self.clock, topic_id=topic.topic_id)
                except (OSError, LogError, ValueError) as e:
                    offline += 1
                    reason = f"{type(e).__name__}: {e}"
                    log.error("partition %s is offline: its log %s cannot be opened (%s)",
                              tp, d, reason)
                    plog = OfflineLog(d, cfg, self.clock, reason)
                else:
                    opened += 1
                    truncated += plog.recovery_truncated
                self.install_one(tp, plog, state)
        # one line for the lot (each partition's own line is DEBUG; recovered or truncated
        # segments and offline partitions are named above, one WARNING/ERROR each)
        log.info("opened %d partition log(s) of %d topic(s) in %s in %.2f s%s", opened,
                 len(topics), self.data_dir, time.monotonic() - started,
                 f"; recovery truncated {truncated} segment(s)" if truncated else
                 "; no segment truncated")
        if offline:
            log.error("%d partition(s) offline (KAFKA_STORAGE_ERROR until restart)", offline)

    def dir_for(self, tp: TopicPartition) -> Path:
        """The log dir ``tp``'s log lives in (or is created in)."""
        return self._located.get(tp, self.data_dir)

    def _scan(self, d: Path) -> list[os.DirEntry[str]]:
        try:
            return list(os.scandir(d))
        except OSError as e:
            log.error("cannot list log dir %s: %s", d, e.strerror)
            return []

    def remove_strays(self, topics: list[TopicState]) -> None:
        """At start: remove ``-delete`` and ``-future`` leftovers (a delete or a replica
        move cut short), and partition directories that no topic owns or that hold another
        topic id than their topic's (renamed first, so a crash here is finished by the next
        start). The removal runs in a background thread. A partition found in the other
        log dirs is located there (``dir_for``); found in two (a move cut short after its
        copy was complete: both hold the same records), the copy in the later dir of
        ``log.dirs`` is removed."""
        hosted: dict[str, uuid.UUID] = {}
        for topic in topics:
            for i, state in enumerate(topic.partitions):
                if self.node_id in state.replicas:
                    hosted[f"{topic.name}-{i}"] = topic.topic_id
        doomed: list[Path] = []
        renamed: set[Path] = set()
        self._located.clear()
        seen: set[str] = set()
        for log_dir in self.log_dirs:
            for entry in self._scan(log_dir):
                path = Path(entry.path)
                if _DELETE_DIR.match(entry.name) or _FUTURE_DIR.match(entry.name):
                    doomed.append(path)
                    continue
                m = _PARTITION_DIR.match(entry.name)
                if m is None or not is_partition_dir(path):
                    continue
                owner = hosted.get(entry.name)
                if entry.name in seen:
                    why = "a copy of a replica found in an earlier log dir"
                elif owner is not None:
                    found = read_partition_metadata(path)
                    if found is None or found == owner or owner.int == 0:
                        seen.add(entry.name)
                        if log_dir != self.data_dir:
                            self._located[TopicPartition(m.group(1), int(m.group(2)))] = \
                                log_dir
                        continue
                    why = f"topic id {found}, not its topic's {owner}"
                else:
                    why = "no topic owns it"
                target = delete_dir_name(path)
                try:
                    path.rename(target)
                except OSError as e:
                    log.error("cannot remove stray partition directory %s: %s", path,
                              e.strerror)
                    continue
                log.warning("removing stray partition directory %s (%s)", path, why)
                renamed.add(log_dir)
                doomed.append(target)
        for log_dir in renamed:
            self._fsync_dir(log_dir)
        if doomed:
            log.info("removing %d deleted partition director%s in the background",
                     len(doomed), "y" if len(doomed) == 1 else "ies")
            self._remove_later(doomed)

    def _remove_later(self, paths: list[Path]) -> None:
        t = threading.Thread(target=_remove_trees, args=(paths,), name="headrace-delete",
                             daemon=True)
        t.start()
        self._removers = [r for r in self._removers if r.is_alive()] + [t]

    def wait_for_removals(self, timeout_s: float | None = None) -> None:
        """Wait for background removals of deleted directories (tests, shutdown)."""
        for t in self._removers:
            t.join(timeout_s)

    def _fsync_data_dir(self) -> None:
        self._fsync_dir(self.data_dir)

    def _fsync_dir(self, d: Path) -> None:
        try:
            fsync_dir(d)
        except OSError as e:
            log.error("fsync of log dir %s failed: %s", d, e.strerror)

    def open_logs(
        self, topic: TopicState, indexes: Iterable[int]
    ) -> dict[TopicPartition, PartitionLog]:
        """Open (creating or recovering) the logs of ``topic``'s partitions ``indexes`` that
        this broker hosts. Only filesystem work: it touches no ReplicaManager state, so it is
        safe in a worker thread (CreateTopics runs it off the event loop); ``install`` then
        makes the logs live. On an error the logs opened so far are closed."""
        cfg = log_config(self.config, topic_overrides(topic))
        logs: dict[TopicPartition, PartitionLog] = {}
        try:
            for i in indexes:
                state = topic.partitions[i]
                if self.node_id not in state.replicas:
                    continue
                tp = TopicPartition(topic.name, i)
                logs[tp] = PartitionLog.open(partition_dir(self.dir_for(tp), tp), cfg,
                                             self.clock, topic_id=topic.topic_id)
        except BaseException:
            for plog in logs.values():
                try:
                    plog.close()
                except Exception:
                    log.exception("closing log %s failed", plog.dir)
            raise
        return logs

    def install(self, topic: TopicState, logs: dict[TopicPartition, PartitionLog]) -> None:
        """Make logs opened by ``open_logs`` live (on the event loop). Logs opened before
        the topic had its id (``topic_id`` 0) get their ``partition.metadata`` here."""
        for tp, plog in logs.items():
            if topic.topic_id.int and plog.topic_id != topic.topic_id:
                try:
                    write_partition_metadata(plog.dir, topic.topic_id)
                    plog.topic_id = topic.topic_id
                except OSError as e:  # written again at the next start (adopted then)
                    log.warning("cannot write the topic id of %s: %s", tp, e.strerror)
            self.install_one(tp, plog, topic.partitions[tp.partition])

    def install_one(self, tp: TopicPartition, plog: PartitionLog, state: PartitionState) -> None:
        if self.clustered:
            # a replica's high watermark comes from its checkpoint, within [log start
            # offset, log end offset] (Kafka's updateHighWatermark); it leads nothing until
            # the cluster node's transition says so
            plog.high_watermark = max(plog.log_start_offset,
                                      min(self.hw_checkpoint.get(tp, 0), plog.log_end_offset))
            p = Partition(tp, plog, state, leading=False)
        else:
            plog.high_watermark = plog.log_end_offset  # single node: ISR == {self}
            p = Partition(tp, plog, state)
        p.wake = self.wake
        plog.defer_epochs = self._epochs_changed
        self.partitions[tp] = p
        self._track_flush(tp, p)

    def _track_flush(self, tp: TopicPartition, p: Partition) -> None:
        if p.log.config.flush_ms < LONG_MAX:
            self._timed_flush[tp] = p
        else:
            self._timed_flush.pop(tp, None)

    def open_topic(self, topic: TopicState, indexes: Iterable[int]) -> None:
        self.install(topic, self.open_logs(topic, indexes))

    def delete_topic(self, name: str) -> None:
        """Close the topic's logs, rename its partition directories to ``-delete`` names
        (crash-safe: a restart finishes the job and never reopens them) and remove them in
        a background thread. Called after the metadata forgot the topic."""
        doomed: list[Path] = []
        failpoint("delete-start")
        for tp in [tp for tp in self.partitions if tp.topic == name]:
            p = self.partitions.pop(tp)
            try:
                p.log.close()
            except Exception as e:  # the directory goes anyway
                log.warning("closing log %s before deleting it failed: %s", tp, e)
            self.wake(tp)
        # and directories of partitions not open here (e.g. left by a crash mid-delete)
        entries = [Path(e.path) for log_dir in self.log_dirs for e in self._scan(log_dir)]
        for tp in [tp for tp in self._located if tp.topic == name]:
            del self._located[tp]
        for d in entries:
            m = _PARTITION_DIR.match(d.name)
            if m is None or m.group(1) != name:
                continue
            target = delete_dir_name(d)
            try:
                d.rename(target)
            except OSError as e:
                log.error("cannot rename %s for deletion: %s", d, e.strerror)
                continue
            doomed.append(target)
            if len(doomed) == 3:
                failpoint("delete-renaming")
        if doomed:
            for parent in {d.parent for d in doomed}:
                self._fsync_dir(parent)
            log.info("deleting %d partition director%s of topic %s", len(doomed),
                     "y" if len(doomed) == 1 else "ies", name)
            self._remove_later(doomed)
            failpoint("delete-removing")

    def remove_dirs(self, dirs: list[Path]) -> None:
        """Remove partition directories whose logs are closed (a replica moved away):
        renamed to ``-delete`` names first (crash-safe), removed in the background."""
        doomed = []
        for d in dirs:
            target = delete_dir_name(d)
            try:
                d.rename(target)
            except FileNotFoundError:
                continue
            except OSError as e:
                log.error("cannot rename %s for deletion: %s", d, e.strerror)
                continue
            doomed.append(target)
        if doomed:
            for parent in {d.parent for d in doomed}:
                self._fsync_dir(parent)
            self._remove_later(doomed)

    # ---------------------------------------------------------------- log dir moves
    async def move_replica(self, tp: TopicPartition, dest: Path) -> ErrorCode:
        """Move ``tp``'s replica to log dir ``dest`` (AlterReplicaLogDirs): NONE once its
        log is open there, or at once if it is there already; REPLICA_NOT_AVAILABLE if
        this broker hosts no such replica; KAFKA_STORAGE_ERROR if its log is offline or
        the copy failed (the replica then stays where it was).

        Unlike Kafka, which copies into a future replica in the background while the
        current one keeps serving, the move is done here and now on the event loop: the
        log is closed (flushed, producer snapshot and epochs written), its directory
        copied to ``dest/<topic>-<p>.<uuid>-future`` and fsynced, renamed to
        ``dest/<topic>-<p>`` (fsynced), the old directory renamed to a ``-delete`` name and
        removed in the background, and the log reopened in ``dest`` — nothing is appended
        or read in between. A crash leaves a ``-future`` directory (removed at start; the
        replica is where it was) or, after the rename, two identical copies (the start
        keeps the one in the earlier dir of ``log.dirs``). Compaction waits meanwhile."""
        async with self._maintenance:
            p = self.partitions.get(tp)
            if p is None:
                return ErrorCode.replica_not_available
            if p.log.offline is not None:
                return ErrorCode.kafka_storage_error
            if os.path.abspath(p.log.dir.parent) == os.path.abspath(dest):
                return ErrorCode.none
            return self._move_now(p, dest)

    def _move_now(self, p: Partition, dest: Path) -> ErrorCode:
        old = p.log
        src, tp = old.dir, p.tp
        cfg, topic_id, hw = old.config, old.topic_id, old.high_watermark
        future = dest / f"{src.name}.{uuid.uuid4().hex}-future"
        final = dest / src.name
        started = time.monotonic()
        old.close()
        with self._epochs_pending_lock:  # written by close: not again to the old path
            self._epochs_pending.pop(id(old), None)
        moved = src
        try:
            failpoint("move-copy")
            shutil.copytree(src, future)
            for f in future.iterdir():
                fsync_file(f)
            fsync_dir(future)
            future.rename(final)
            fsync_dir(dest)
            failpoint("move-renamed")
            moved = final
            target = delete_dir_name(src)
            src.rename(target)
            self._fsync_dir(src.parent)
        except OSError as e:
            log.error("moving replica %s from %s to %s failed: %s; it stays in %s", tp,
                      src.parent, dest, e.strerror or e, src.parent)
            doomed = [future] + ([final] if moved == final else [])
            moved = src
            for d in doomed:
                shutil.rmtree(d, ignore_errors=True)
            error = ErrorCode.kafka_storage_error
        else:
            self._remove_later([target])
            error = ErrorCode.none
        try:
            plog = PartitionLog.open(moved, cfg, self.clock, topic_id=topic_id)
        except (OSError, LogError, ValueError) as e:
            reason = f"{type(e).__name__}: {e}"
            log.error("partition %s is offline: its log %s cannot be opened (%s)", tp,
                      moved, reason)
            plog = OfflineLog(moved, cfg, self.clock, reason)
            error = ErrorCode.kafka_storage_error
        plog.high_watermark = max(plog.log_start_offset, min(hw, plog.log_end_offset))
        plog.defer_epochs = self._epochs_changed
        p.log = plog
        if os.path.abspath(moved.parent) == os.path.abspath(self.data_dir):
            self._located.pop(tp, None)
        else:
            self._located[tp] = moved.parent
        self._track_flush(tp, p)
        self.wake(tp)
        if error is ErrorCode.none:
            log.info("moved replica %s from %s to %s (%d bytes) in %.2f s", tp, src.parent,
                     dest, plog.size_in_bytes, time.monotonic() - started)
        return error

    def update_topic_config(self, topic: TopicState) -> None:
        cfg = log_config(self.config, topic_overrides(topic))
        for tp, p in self.partitions.items():
            if tp.topic == topic.name:
                p.log.update_config(cfg)
                self._track_flush(tp, p)

    def close(self) -> None:
        for p in self.partitions.values():
            try:
                p.log.close()
            except Exception:
                log.exception("closing log %s failed", p.tp)
        self.partitions.clear()

    def get(self, tp: TopicPartition) -> Partition | None:
        return self.partitions.get(tp)

    # ---------------------------------------------------------------- delete records
    HIGH_WATERMARK = -1  # DeleteRecords' offset meaning "up to the high watermark"

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """DeleteRecords on this broker as the partition's leader (Kafka's
        ``Partition.deleteRecordsOnLeader``): move the log start offset of ``tp`` to
        ``offset`` (``HIGH_WATERMARK``: to the high watermark) and return the low
        watermark, the log start offset now (the leader's own: followers' log start
        offsets are not tracked, so it is not the minimum over the replicas Kafka waits
        for). The new start is stored but not yet fsynced: ``sync_log_starts`` does that.

        Raises ``LogError``: NOT_LEADER_OR_FOLLOWER (not hosted here, or not leading),
        POLICY_VIOLATION (cleanup.policy without ``delete``), OFFSET_OUT_OF_RANGE (negative,
        or past the high watermark), KAFKA_STORAGE_ERROR."""
        p = self.partitions.get(tp)
        if p is None or not p.is_leader(self.node_id):
            raise LogError(ErrorCode.not_leader_or_follower,
                           f"this broker does not lead {tp}")
        plog = p.log
        if not plog.config.delete:
            raise LogError(ErrorCode.policy_violation,
                           f"Records of partition {tp} can not be deleted due to the "
                           "configured policy")
        target = plog.high_watermark if offset == self.HIGH_WATERMARK else offset
        if target < 0:
            raise LogError(ErrorCode.offset_out_of_range,
                           f"The offset {target} for partition {tp} is not valid")
        plog.increment_log_start_offset(target)
        if p.wake is not None:
            p.wake(tp)  # followers' sessions send the new log start
        return plog.log_start_offset

    async def sync_log_starts(self, tps: Iterable[TopicPartition]) -> set[TopicPartition]:
        """fsync the stored log start offsets of ``tps`` (after ``delete_records``) in a
        worker thread; returns those whose fsync failed (logged here)."""
        dirs = [(tp, p.log.dir) for tp in dict.fromkeys(tps)
                if (p := self.partitions.get(tp)) is not None]
        if not dirs:
            return set()

        def sync() -> set[TopicPartition]:
            failed = set()
            for tp, d in dirs:
                try:
                    sync_log_start_offset(d)
                except OSError as e:
                    log.error("fsync of the log start offset of %s failed: %s", tp, e)
                    failed.add(tp)
            return failed

        return await asyncio.to_thread(sync)

    # ---------------------------------------------------------------- retention
    def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """``producer.id.expiration.ms`` over every hosted partition."""
        return sum(p.log.expire_producers(now_ms, expiration_ms)
                   for p in list(self.partitions.values()) if p.log.offline is None)

    async def run_retention(self) -> int:
        """Delete segments past retention (cleanup.policy delete) and compact logs
        (cleanup.policy compact, R-LOG-6); returns the number of segments deleted.

        A compaction's heavy part (decoding every record, writing the cleaned files) runs
        in a worker thread while the partition keeps appending and serving reads; its
        output is swapped in back on the event loop, and discarded if the log changed
        under it (``PartitionLog.prepare_compaction``)."""
        deleted = 0
        for p in list(self.partitions.values()):
            await self._compact(p)
            if self.partitions.get(p.tp) is not p:  # deleted meanwhile
                continue
            try:
                n = p.log.delete_old_segments()
            except Exception:
                log.exception("retention failed for %s", p.tp)
                continue
            if n:
                log.info("retention deleted %d segment(s) of %s; log start offset %d",
                         n, p.tp, p.log.log_start_offset)
            deleted += n
        return deleted

    async def _compact(self, p: Partition) -> None:
        async with self._maintenance:
            if self.partitions.get(p.tp) is p:
                await self._compact_now(p)

    async def _compact_now(self, p: Partition) -> None:
        try:
            job = p.log.prepare_compaction(self.clock.wall_ms())
        except Exception:
            log.exception("compaction failed for %s", p.tp)
            return
        if job is None:
            return
        try:
            await asyncio.to_thread(job.run)
        except asyncio.CancelledError:
            p.log.abandon_compaction(job)
            raise
        except (OSError, LogError) as e:
            p.log.abandon_compaction(job)
            log.warning("compaction of %s failed: %s", p.tp, e)
            return
        except Exception:
            p.log.abandon_compaction(job)
            log.exception("compaction failed for %s", p.tp)
            return
        try:
            stats = p.log.finish_compaction(job)
        except LogError as e:
            log.warning("compaction of %s failed: %s", p.tp, e)
            return
        if stats is not None and stats.groups_rewritten:
            log.info("compacted %s: %d group(s), %d record(s) removed, %d -> %d bytes",
                     p.tp, stats.groups_rewritten, stats.records_removed,
                     stats.bytes_before, stats.bytes_after)

    def flush_due(self) -> None:
        """Flush every log whose unflushed data is older than its ``flush.ms``."""
        for tp, p in list(self._timed_flush.items()):
            if self.partitions.get(tp) is not p:  # removed or replaced meanwhile
                if self._timed_flush.get(tp) is p:
                    del self._timed_flush[tp]
                continue
            try:
                p.log.flush_if_due()
            except (OSError, LogError) as e:  # the log went offline and said so
                log.debug("flush failed for %s: %s", p.tp, e)

    def flush_all(self) -> None:
        for p in self.partitions.values():
            try:
                p.log.flush()
            except LogError as e:
                log.debug("flush failed for %s: %s", p.tp, e)

    # ---------------------------------------------------------------- epoch checkpoints
    def _epochs_changed(self, plog: PartitionLog) -> None:
        with self._epochs_pending_lock:
            self._epochs_pending[id(plog)] = plog

    def take_pending_epochs(self) -> list[tuple[PartitionLog, int, bytes]]:
        """The leader-epoch checkpoints to write (on the event loop: the epochs are read
        there), each log once with its newest content."""
        with self._epochs_pending_lock:
            logs, self._epochs_pending = self._epochs_pending, {}
        return [(plog, *pending) for plog in logs.values()
                if (pending := plog.pending_epochs()) is not None]

    async def write_epochs_loop(self, stopped: asyncio.Event) -> None:
        """Write the changed leader-epoch checkpoints every EPOCH_WRITE_INTERVAL_S, in a
        worker thread (Kafka 3.7+ also writes them off the request path). A failover that
        hands this broker 10,000 new leader epochs wrote 10,000 files on the event loop
        while clients waited for the new leaders (bench/cluster_bench.py --scale)."""
        while not stopped.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), EPOCH_WRITE_INTERVAL_S)
            await self.flush_pending_epochs()

    async def flush_pending_epochs(self) -> int:
        items = self.take_pending_epochs()
        if items:
            await asyncio.to_thread(_write_epochs, items)
        return len(items)

    # ---------------------------------------------------------------- long poll
    def watch(self, tps: Iterable[TopicPartition]) -> asyncio.Future[None]:
        """A future completed when any of ``tps`` gets new committed data."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for tp in tps:
            self._watchers.setdefault(tp, set()).add(fut)
        return fut

    def unwatch(self, tps: Iterable[TopicPartition], fut: asyncio.Future[None]) -> None:
        for tp in tps:
            s = self._watchers.get(tp)
            if s is not None:
                s.discard(fut)
                if not s:
                    del self._watchers[tp]

    def wake(self, tp: TopicPartition) -> None:
        s = self._watchers.pop(tp, None)
        if s:
            for fut in s:
                if not fut.done():
                    fut.set_result(None)
        subs = self._session_subs.get(tp)
        if subs:
            for session in subs:
                session.dirty.add(tp)
                waiter = session.waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)

    def subscribe_session(self, session: Any, keys: Iterable[Any]) -> None:
        """``session`` (a ``FetchSession``) learns of every wake of ``keys`` from now on."""
        subs = self._session_subs
        for key in keys:
            found = subs.get(key)
            if found is None:
                found = subs[key] = weakref.WeakSet()
            found.add(session)

    def unsubscribe_session(self, session: Any, keys: Iterable[Any]) -> None:
        subs = self._session_subs
        for key in keys:
            found = subs.get(key)
            if found is not None:
                found.discard(session)
                if not found:
                    del subs[key]

    def wake_sessions(self) -> None:
        """Wake every fetch parked on a session (the broker is stopping)."""
        for subs in list(self._session_subs.values()):
            for session in list(subs):
                waiter = session.waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)


def _write_epochs(items: list[tuple[PartitionLog, int, bytes]]) -> None:
    for plog, version, content in items:
        plog.write_epochs(version, content)  # skipped if closed or newer on disk


# (topic, config, value) of the deprecated topic configs already warned about: once each
_WARNED_DEPRECATED: set[tuple[str, str, str]] = set()


def topic_overrides(topic: TopicState) -> dict[str, object]:
    """The topic's overrides its logs run with. An internal topic's logs are always
    compacted only: a stored ``cleanup.policy`` other than ``compact`` (stored before the
    admin APIs refused it, or written to ZooKeeper by another tool) is ignored with a
    warning, so that retention never removes committed offsets or transaction states."""
    from headrace.broker.topics import INTERNAL_TOPICS
    from headrace.config import (
        TOPIC_CONFIGS,
        deprecated_topic_warning,
        fold_deprecated_topic_configs,
        parse_overrides,
    )

    for name, value in topic.configs.items():  # Kafka's LogManager / ConfigHandler warning
        warning = deprecated_topic_warning(topic.name, name, value)
        if warning is not None and (topic.name, name, value) not in _WARNED_DEPRECATED:
            _WARNED_DEPRECATED.add((topic.name, name, value))
            log.warning("%s", warning)
    overrides = parse_overrides(fold_deprecated_topic_configs(topic.configs), TOPIC_CONFIGS)
    if topic.name in INTERNAL_TOPICS and overrides.get("cleanup.policy") != "compact":
        if "cleanup.policy" in overrides:
            log.warning("internal topic %s: stored cleanup.policy=%s ignored, its logs stay "
                        "compact only", topic.name, overrides["cleanup.policy"])
        overrides["cleanup.policy"] = "compact"
    return overrides
