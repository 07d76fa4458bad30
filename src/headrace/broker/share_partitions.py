"""The share-partition manager: the asyncio shell around ``SharePartition`` (KIP-932).

Kafka's ``SharePartitionManager`` and ``DelayedShareFetch``, for the partitions this broker
leads. What it does, and nothing more:

- **holds** one ``SharePartition`` per (group, topic id, partition), made the first time a
  ShareFetch names it: its state is read from the share coordinator through
  ``broker.share_persister`` (ReadShareGroupState at the partition's leader epoch); a start
  offset of -1 (initialized by the group coordinator without one) is resolved with the
  group's ``share.auto.offset.reset`` (latest: the high watermark; earliest: the log start;
  ``by_duration:<ISO-8601 duration>``: the first offset at or after now - duration) and
  written back at once, so a later leader starts from the same place. Concurrent fetches
  wait for the one read. A cached share-partition made at another leader epoch, or of a
  partition this broker no longer leads, is dropped (Kafka's ``SharePartitionListener``);
- **fetches**: reads the log from ``next_fetch_offset()`` (up to the high watermark, or the
  last stable offset under ``share.isolation.level=read_committed`` with aborted batches
  marked), lets the share-partition acquire, and answers the whole batches overlapping what
  was acquired with the acquired ranges. Nothing acquired and ``max_wait`` left: the fetch
  is parked until the log grows or a record of the group's partitions becomes available
  again (acknowledged RELEASE, a lock timeout, a member released), as DelayedShareFetch
  is completed; partitions are rotated by the session epoch (``PartitionRotateStrategy``);
- **acknowledges**: applies a member's acknowledgements, then writes what changed
  (WriteShareGroupState) before answering, as Kafka completes an acknowledgement only once
  it is persisted. A failed write is answered with its error and the next write sends the
  whole state; a fenced one (FENCED_STATE_EPOCH / FENCED_LEADER_EPOCH /
  NOT_LEADER_OR_FOLLOWER) drops the share-partition;
- **releases** a member's acquired records when its share session closes (epoch -1, its
  connection closes, it leaves the group: ``ShareGroupListener``) and **times out** locks:
  a supervised loop calls ``expire_locks`` every ``TICK_S``.

Everything runs on the broker's event loop; the share-partitions are pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.replica_manager import Partition, TopicPartition
from headrace.broker.share_persister import (
    UNINITIALIZED_START_OFFSET,
    StateKey,
    WriteEntry,
)
from headrace.config import parse_duration_ms
from headrace.log.errors import LogError
from headrace.protocol.records import InvalidRecordError, iter_batches
from headrace.share.partition import (
    DEFAULT_MAX_DELIVERY_COUNT,
    DEFAULT_MAX_IN_FLIGHT_RECORDS,
    DEFAULT_RECORD_LOCK_DURATION_MS,
    AcknowledgementBatch,
    AcquiredRecords,
    FetchedBatch,
    IsolationLevel,
    SharePartition,
    ShareStateError,
)
from headrace.share.session import ShareSessionCache

if TYPE_CHECKING:
    from headrace.broker.server import Broker

log = logging.getLogger("headrace.share")

TICK_S = 0.1
# errors after which the cached share-partition is no longer ours (Kafka's
# fencedSharePartitionHandler)
FENCING = {ErrorCode.not_leader_or_follower, ErrorCode.fenced_state_epoch,
           ErrorCode.fenced_leader_epoch, ErrorCode.group_id_not_found,
           ErrorCode.unknown_topic_or_partition}

ShareKey = tuple[str, uuid.UUID, int]  # (group id, topic id, partition)


@dataclass(frozen=True, slots=True)
class ShareGroupSettings:
    """The group configs a share-partition reads (Kafka's ``GroupConfig`` share.* with the
    broker's ``group.share.*`` defaults)."""

    record_lock_duration_ms: int = DEFAULT_RECORD_LOCK_DURATION_MS
    delivery_count_limit: int = DEFAULT_MAX_DELIVERY_COUNT
    max_record_locks: int = DEFAULT_MAX_IN_FLIGHT_RECORDS
    auto_offset_reset: str = "latest"
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED


def group_settings(broker: Broker, group_id: str) -> ShareGroupSettings:
    """The effective share settings of ``group_id`` (``share_config.share_group_config``:
    its group configs over the broker's ``group.share.*``)."""
    from headrace.broker.share_config import share_group_config

    values = {k: str(v) for k, v in share_group_config(broker, group_id).items()}

    def get(group_key: str, broker_key: str, default: str) -> str:
        if group_key in values:
            return values[group_key]
        try:
            return str(broker.config[broker_key])
        except (KeyError, TypeError):
            return default

    isolation = get("share.isolation.level", "share.isolation.level", "read_uncommitted")
    return ShareGroupSettings(
        record_lock_duration_ms=int(get("share.record.lock.duration.ms",
                                        "group.share.record.lock.duration.ms",
                                        str(DEFAULT_RECORD_LOCK_DURATION_MS))),
        delivery_count_limit=int(get("share.delivery.count.limit",
                                     "group.share.delivery.count.limit",
                                     str(DEFAULT_MAX_DELIVERY_COUNT))),
        max_record_locks=int(get("share.partition.max.record.locks",
                                 "group.share.partition.max.record.locks",
                                 str(DEFAULT_MAX_IN_FLIGHT_RECORDS))),
        auto_offset_reset=get("share.auto.offset.reset", "share.auto.offset.reset", "latest"),
        isolation_level=(IsolationLevel.READ_COMMITTED if isolation == "read_committed"
                         else IsolationLevel.READ_UNCOMMITTED),
    )


@dataclass(slots=True)
class PartitionFetch:
    """One partition's share of a ShareFetch answer."""

    error: ErrorCode = ErrorCode.none
    error_message: str | None = None
    records: bytes = b""
    acquired: list[AcquiredRecords] = field(default_factory=list)


@dataclass
class _Entry:
    key: ShareKey
    tp: TopicPartition
    leader_epoch: int
    sp: SharePartition | None = None
    ready: asyncio.Future[ErrorCode] | None = None
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    rewrite: bool = False  # a write failed: the next one sends the whole state

    @property
    def state_key(self) -> StateKey:
        return StateKey(*self.key)


class SharePartitionManager:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        max_sessions = 2000
        with contextlib.suppress(KeyError, TypeError, ValueError):
            max_sessions = int(broker.config["group.share.max.share.sessions"])
        self.sessions = ShareSessionCache(max_sessions)
        self._entries: dict[ShareKey, _Entry] = {}
        self._waiters: dict[ShareKey, set[asyncio.Future[None]]] = {}

    # -- lookup and initialization ------------------------------------------------------

    def now_ms(self) -> int:
        return self.broker.clock.wall_ms()

    def _led(self, topic_id: uuid.UUID, index: int
             ) -> tuple[TopicPartition | None, Partition | None, ErrorCode]:
        topic = self.broker.metadata.topic_by_id(topic_id)
        if topic is None:
            return None, None, ErrorCode.unknown_topic_id
        if not 0 <= index < len(topic.partitions):
            return None, None, ErrorCode.unknown_topic_or_partition
        tp = TopicPartition(topic.name, index)
        partition = self.broker.replicas.get(tp)
        if partition is None or not partition.is_leader(self.broker.node_id):
            return tp, None, ErrorCode.not_leader_or_follower
        return tp, partition, ErrorCode.none

    def cached(self, key: ShareKey) -> SharePartition | None:
        entry = self._entries.get(key)
        return entry.sp if entry is not None else None

    async def share_partition(self, key: ShareKey) -> tuple[_Entry | None, ErrorCode]:
        """The share-partition of ``key``, read from the persister the first time."""
        _group_id, topic_id, index = key
        tp, partition, err = self._led(topic_id, index)
        if err is not ErrorCode.none or tp is None or partition is None:
            self.drop(key)
            return None, err
        entry = self._entries.get(key)
        if entry is not None and entry.leader_epoch != partition.leader_epoch:
            self.drop(key)  # another leader may have written since: read again
            entry = None
        if entry is None:
            entry = _Entry(key, tp, partition.leader_epoch)
            self._entries[key] = entry
            entry.ready = asyncio.get_running_loop().create_future()
            task = asyncio.ensure_future(self._initialize(entry, partition))
            task.add_done_callback(_log_failure)
        assert entry.ready is not None
        code = await asyncio.shield(entry.ready)
        if code is not ErrorCode.none:
            return None, code
        return entry, ErrorCode.none

    async def _initialize(self, entry: _Entry, partition: Partition) -> None:
        assert entry.ready is not None
        code = ErrorCode.none
        try:
            code = await self._read_state(entry, partition)
        except Exception as e:  # reported to the waiters, never a traceback per fetch
            log.warning("share-partition %s:%s-%d failed to load: %s: %s", entry.key[0],
                        entry.tp.topic, entry.tp.partition, type(e).__name__, e)
            code = ErrorCode.unknown_server_error
        if code is not ErrorCode.none and self._entries.get(entry.key) is entry:
            del self._entries[entry.key]  # the next fetch tries again
        if not entry.ready.done():
            entry.ready.set_result(code)

    async def _read_state(self, entry: _Entry, partition: Partition) -> ErrorCode:
        persister = self.broker.share_persister
        if persister is None:
            return ErrorCode.coordinator_not_available
        result = (await persister.read_state([entry.state_key], entry.leader_epoch)
                  ).get(entry.state_key)
        if result is None:
            return ErrorCode.unknown_server_error
        if result.error is not ErrorCode.none:
            return result.error
        settings = group_settings(self.broker, entry.key[0])
        options = dict(max_in_flight_records=settings.max_record_locks,
                       max_delivery_count=settings.delivery_count_limit,
                       record_lock_duration_ms=settings.record_lock_duration_ms,
                       isolation_level=settings.isolation_level,
                       state_epoch=result.state_epoch)
        plog = partition.log
        if result.start_offset == UNINITIALIZED_START_OFFSET:
            start = self._reset_offset(partition, settings.auto_offset_reset)
            entry.sp = SharePartition(start, **options)  # type: ignore[arg-type]
            entry.rewrite = True  # the resolved start is written at once
            if await self.write(entry) is not ErrorCode.none:
                return ErrorCode.coordinator_not_available
        else:
            try:
                entry.sp = SharePartition.recover(
                    result.start_offset, result.state_batches, **options)  # type: ignore[arg-type]
            except ValueError as e:
                log.warning("share-partition %s:%s-%d has invalid state: %s", entry.key[0],
                            entry.tp.topic, entry.tp.partition, e)
                return ErrorCode.unknown_server_error
        if plog.log_start_offset > entry.sp.start_offset:
            entry.sp.update_log_start_offset(plog.log_start_offset)
        return ErrorCode.none

    def _reset_offset(self, partition: Partition, policy: str) -> int:
        plog = partition.log
        if policy == "earliest":
            return plog.log_start_offset
        if policy.startswith("by_duration:"):
            duration = parse_duration_ms(policy.split(":", 1)[1])
            if duration is not None:
                found = plog.offset_for_timestamp(self.now_ms() - duration)
                return found[0] if found is not None else plog.high_watermark
        return plog.high_watermark

    def drop(self, key: ShareKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._wake(key)

    # -- fetch ---------------------------------------------------------------------------

    async def fetch(self, group_id: str, member_id: str, parts: list[tuple[uuid.UUID, int]],
                    *, max_records: int, max_bytes: int, min_bytes: int, max_wait_ms: int,
                    rotate: int = 0, strict: bool = False,
                    ) -> dict[tuple[uuid.UUID, int], PartitionFetch]:
        """Acquire records of ``parts`` for the member; parked up to ``max_wait_ms`` while
        there is nothing to acquire."""
        out: dict[tuple[uuid.UUID, int], PartitionFetch] = {}
        if not parts:
            return out
        if len(parts) > 1 and rotate:
            shift = rotate % len(parts)
            parts = parts[shift:] + parts[:shift]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, max_wait_ms) / 1000
        while True:
            entries: list[tuple[tuple[uuid.UUID, int], _Entry]] = []
            for part in parts:
                entry, err = await self.share_partition((group_id, *part))
                if entry is None:
                    out[part] = PartitionFetch(err)
                else:
                    entries.append((part, entry))
            got = self._acquire(member_id, entries, max_records, max_bytes, out, strict)
            if got >= max(1, min_bytes) or not entries or self.broker.stopping:
                break
            left = deadline - loop.time()
            if left <= 0:
                break
            keys = [e.key for _, e in entries]
            tps = [e.tp for _, e in entries]
            fut = self.broker.replicas.watch(tps)
            for key in keys:
                self._waiters.setdefault(key, set()).add(fut)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(fut), left)
            finally:
                self.broker.replicas.unwatch(tps, fut)
                for key in keys:
                    waiters = self._waiters.get(key)
                    if waiters is not None:
                        waiters.discard(fut)
                        if not waiters:
                            del self._waiters[key]
            if got:  # acquired less than min_bytes: answer what is held after the wait
                break
        self._count_fetch(parts, out)
        return out

    def _count_fetch(self, parts: list[tuple[uuid.UUID, int]],
                     out: dict[tuple[uuid.UUID, int], PartitionFetch]) -> None:
        """BrokerTopicMetrics' share fetch counters: once per topic per request."""
        metrics = self.broker.metrics
        failed: dict[str, bool] = {}
        for part in parts:
            topic = self.broker.metadata.topic_by_id(part[0])
            if topic is None:
                continue
            r = out.get(part)
            failed[topic.name] = failed.get(topic.name, False) or (
                r is not None and r.error is not ErrorCode.none)
            if r is not None and r.records:
                metrics.fetched(topic.name, len(r.records), 0)
        for name, bad in failed.items():
            metrics.share_fetched(name, bad)

    def _acquire(self, member_id: str, entries: list[tuple[tuple[uuid.UUID, int], _Entry]],
                 max_records: int, max_bytes: int,
                 out: dict[tuple[uuid.UUID, int], PartitionFetch], strict: bool = False,
                 ) -> int:
        """One pass over the partitions: acquire what is there; the bytes answered."""
        remaining_records = max(1, max_records)
        remaining_bytes = max_bytes
        total = 0
        now = self.now_ms()
        for part, entry in entries:
            result = out.setdefault(part, PartitionFetch())
            sp = entry.sp
            assert sp is not None
            if remaining_records <= 0 or (remaining_bytes <= 0 and total > 0):
                continue
            partition = self.broker.replicas.get(entry.tp)
            if partition is None or not partition.is_leader(self.broker.node_id):
                self.drop(entry.key)
                result.error = ErrorCode.not_leader_or_follower
                continue
            plog = partition.log
            if plog.log_start_offset > sp.start_offset:
                sp.update_log_start_offset(plog.log_start_offset)
            if not sp.can_acquire_records():
                continue
            offset = sp.next_fetch_offset()
            read_committed = sp.isolation_level is IsolationLevel.READ_COMMITTED
            max_offset = plog.last_stable_offset if read_committed else plog.high_watermark
            if offset >= max_offset:
                continue
            try:
                chunks, _size, _cut = plog.read_chunks(
                    offset, max(remaining_bytes, 0), max_offset=max_offset,
                    min_one_batch=total == 0)
            except LogError as e:
                result.error = ErrorCode(e.error_code)
                continue
            aborted: dict[int, list[tuple[int, int]]] = {}
            if read_committed:
                for a in plog.aborted_transactions(offset, max_offset):
                    aborted.setdefault(a.producer_id, []).append((a.first_offset, a.last_offset))
            batches: list[FetchedBatch] = []
            slices: list[tuple[int, int, memoryview]] = []
            try:
                for chunk in chunks:
                    view = memoryview(chunk)
                    for h in iter_batches(view):
                        is_aborted = (h.is_transactional and not h.is_control and any(
                            first <= h.base_offset <= last
                            for first, last in aborted.get(h.producer_id, ())))
                        batches.append(FetchedBatch(h.base_offset, h.last_offset,
                                                    h.is_control, is_aborted))
                        slices.append((h.base_offset, h.last_offset,
                                       view[h.position:h.position + h.size]))
            except InvalidRecordError as e:
                log.warning("share fetch of %s read a malformed batch: %s", entry.tp, e)
                result.error = ErrorCode.corrupt_message
                continue
            if not batches:
                continue
            try:
                acquired = sp.acquire(member_id, batches, remaining_records, now,
                                      strict=strict)
            except ShareStateError as e:  # our bug: one line, the partition answers an error
                log.error("share-partition %s acquire failed: %s", entry.key, e)
                result.error = ErrorCode.unknown_server_error
                continue
            if not acquired:
                continue
            wanted = [(a.first_offset, a.last_offset) for a in acquired]
            keep = [view for first, last, view in slices
                    if any(first <= hi and lo <= last for lo, hi in wanted)]
            data = b"".join(keep)
            result.records += data
            result.acquired.extend(acquired)
            total += len(data)
            remaining_bytes -= len(data)
            remaining_records -= sum(a.last_offset - a.first_offset + 1 for a in acquired)
        return total

    # -- acknowledge and release ---------------------------------------------------------

    async def acknowledge(self, group_id: str, member_id: str,
                          acks: dict[tuple[uuid.UUID, int], list[AcknowledgementBatch]]
                          ) -> dict[tuple[uuid.UUID, int], ErrorCode]:
        out: dict[tuple[uuid.UUID, int], ErrorCode] = {}
        for part, batches in acks.items():
            key = (group_id, *part)
            entry = self._entries.get(key)
            if entry is None or entry.sp is None:
                out[part] = ErrorCode.unknown_topic_or_partition  # Kafka: not in the cache
                continue
            code = entry.sp.acknowledge(member_id, batches, self.now_ms())
            if code is ErrorCode.none:
                code = await self.write(entry)
            out[part] = code
            self._wake(key)
            self.broker.metrics.share_acknowledged(
                entry.tp.topic, code is not ErrorCode.none,
                _ack_counts(batches) if code is ErrorCode.none else None)
        return out

    async def release(self, group_id: str, member_id: str,
                      parts: Iterable[tuple[uuid.UUID, int]]) -> None:
        """The member's acquired records in ``parts`` become available again (its share
        session closed)."""
        now = self.now_ms()
        for part in parts:
            key = (group_id, *part)
            entry = self._entries.get(key)
            if entry is None or entry.sp is None:
                continue
            if entry.sp.release_member(member_id, now):
                await self.write(entry)
                self._wake(key)

    def close_session(self, group_id: str, member_id: str) -> None:
        """Remove the member's share session and release what it holds (in the background:
        the writes wait for the share coordinator)."""
        session = self.sessions.remove(group_id, member_id)
        if session is not None:
            self._spawn(self.release(group_id, member_id, list(session.partitions)))

    def connection_closed(self, connection_id: str) -> None:
        session = self.sessions.connection_closed(connection_id)
        if session is not None:
            group_id, member_id = session.key
            self._spawn(self.release(group_id, member_id, list(session.partitions)))

    # ShareGroupListener
    def on_member_leave(self, group_id: str, member_id: str) -> None:
        self.close_session(group_id, member_id)

    def on_group_delete(self, group_id: str) -> None:
        for session in self.sessions.sessions_of_group(group_id):
            self.sessions.remove(*session.key)
        for key in [k for k in self._entries if k[0] == group_id]:
            self.drop(key)

    # -- persistence ---------------------------------------------------------------------

    async def write(self, entry: _Entry) -> ErrorCode:
        """Write what changed in ``entry`` (the whole state after a failed write)."""
        async with entry.write_lock:
            sp = entry.sp
            persister = self.broker.share_persister
            if sp is None or persister is None:
                return ErrorCode.coordinator_not_available
            if entry.rewrite:
                sp.take_changes()
                change = sp.snapshot()
            else:
                pending = sp.take_changes()
                if pending is None:
                    return ErrorCode.none
                change = pending
            results = await persister.write_state(
                [WriteEntry(entry.state_key, entry.leader_epoch, change)])
            code = results.errors.get(entry.state_key, ErrorCode.none)
            if code is ErrorCode.none:
                entry.rewrite = False
                return code
            entry.rewrite = True
            log.warning("share-partition %s:%s-%d: state write failed: %s", entry.key[0],
                        entry.tp.topic, entry.tp.partition, code.name)
            if code in FENCING:
                self.drop(entry.key)
            return code

    # -- wake-ups and the lock timer ------------------------------------------------------

    def _wake(self, key: ShareKey) -> None:
        for fut in self._waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    def expire_locks(self) -> list[_Entry]:
        """Time out the acquisition locks that are due; the entries that changed."""
        now = self.now_ms()
        changed = []
        for key, entry in list(self._entries.items()):
            sp = entry.sp
            if sp is None:
                continue
            deadline = sp.next_deadline()
            if deadline is None or deadline > now:
                continue
            if sp.expire_locks(now):
                changed.append(entry)
                self._wake(key)
        return changed

    async def run(self, stopped: asyncio.Event) -> None:
        while not stopped.is_set():
            for entry in self.expire_locks():
                await self.write(entry)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), TICK_S)

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        task.add_done_callback(_log_failure)


_ACK_NAMES = {0: "gap", 1: "accept", 2: "release", 3: "reject", 4: "renew"}


def _ack_counts(batches: list[AcknowledgementBatch]) -> dict[str, int]:
    """Records acknowledged per type (Kafka's ShareGroupMetrics ackType tag)."""
    counts: dict[str, int] = {}
    for b in batches:
        if len(b.acknowledge_types) == 1:
            name = _ACK_NAMES.get(b.acknowledge_types[0], "unknown")
            counts[name] = counts.get(name, 0) + b.last_offset - b.first_offset + 1
        else:
            for t in b.acknowledge_types:
                name = _ACK_NAMES.get(t, "unknown")
                counts[name] = counts.get(name, 0) + 1
    return counts


def _log_failure(task: asyncio.Future[Any]) -> None:
    if task.cancelled():
        return
    e = task.exception()
    if e is not None:
        log.error("share-partition task failed: %s: %s", type(e).__name__, e)
