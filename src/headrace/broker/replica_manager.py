"""The partitions this broker hosts: their logs, leader state and waiters.

A ``Partition`` joins a ``PartitionLog`` (storage) with its replica state from the metadata
store (leader, leader epoch, ISR). The high watermark is the smallest log end offset across
the ISR (R-REP-4); on a single node the ISR is this broker alone, so it equals the log end
offset after every append. Replication will feed follower log end offsets in through
``update_follower`` without changing callers.

Waiting (the purgatories of Kafka's ``ReplicaManager``): a long-poll Fetch parks a future
on the partitions it reads (``watch``); an append that moves the high watermark wakes them.
An acks=all Produce waits for the high watermark to pass its last offset (``wait_for_hw``).
Everything runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from headrace.clock import Clock
from headrace.config import BrokerConfig, log_config
from headrace.log.partition_log import AppendResult, PartitionLog
from headrace.metadata.store import MetadataStore, PartitionState, TopicState

log = logging.getLogger("headrace.replica")


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class Partition:
    def __init__(self, tp: TopicPartition, log_: PartitionLog, state: PartitionState) -> None:
        self.tp = tp
        self.log = log_
        self.state = state
        self.follower_leo: dict[int, int] = {}
        self._hw_waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    def is_leader(self, node_id: int) -> bool:
        return self.state.leader == node_id

    def in_sync_count(self) -> int:
        return len(self.state.isr)

    def append_as_leader(self, records: bytes | memoryview) -> AppendResult:
        result = self.log.append_as_leader(records, self.state.leader_epoch)
        self._advance_hw()
        return result

    def append_own_batch(self, batch: bytes) -> AppendResult:
        """``append_as_leader`` of one batch built by the broker (``PartitionLog``)."""
        result = self.log.append_own_batch(batch, self.state.leader_epoch)
        self._advance_hw()
        return result

    def _advance_hw(self) -> None:
        leo = self.log.log_end_offset
        others = [self.follower_leo.get(r, 0) for r in self.state.isr if r != self.state.leader]
        new_hw = min([leo, *others])
        if new_hw > self.log.high_watermark:
            self.log.high_watermark = new_hw
        if self._hw_waiters:
            hw = self.log.high_watermark
            still = []
            for offset, fut in self._hw_waiters:
                if hw >= offset:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    still.append((offset, fut))
            self._hw_waiters = still

    def update_follower(self, node_id: int, log_end_offset: int) -> None:
        self.follower_leo[node_id] = log_end_offset
        self._advance_hw()

    async def wait_for_hw(self, offset: int, timeout_s: float) -> bool:
        """Wait until the high watermark reaches ``offset``; False on timeout."""
        if self.log.high_watermark >= offset:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._hw_waiters.append((offset, fut))
        try:
            await asyncio.wait_for(fut, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self._hw_waiters = [(o, f) for o, f in self._hw_waiters if f is not fut]


def partition_dir(data_dir: Path, tp: TopicPartition) -> Path:
    return data_dir / f"{tp.topic}-{tp.partition}"


class ReplicaManager:
    def __init__(
        self, data_dir: Path, config: BrokerConfig, metadata: MetadataStore, clock: Clock
    ) -> None:
        self.data_dir = data_dir
        self.config = config
        self.metadata = metadata
        self.clock = clock
        self.node_id = config.node_id
        self.partitions: dict[TopicPartition, Partition] = {}
        self._watchers: dict[TopicPartition, set[asyncio.Future[None]]] = {}

    # ---------------------------------------------------------------- lifecycle
    def load(self) -> None:
        """Open (and recover) the log of every partition this broker hosts."""
        for topic in list(self.metadata.topics().values()):
            self.open_topic(topic, range(len(topic.partitions)))

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
                logs[tp] = PartitionLog.open(partition_dir(self.data_dir, tp), cfg, self.clock)
        except BaseException:
            for plog in logs.values():
                try:
                    plog.close()
                except Exception:
                    log.exception("closing log %s failed", plog.dir)
            raise
        return logs

    def install(self, topic: TopicState, logs: dict[TopicPartition, PartitionLog]) -> None:
        """Make logs opened by ``open_logs`` live (on the event loop)."""
        for tp, plog in logs.items():
            plog.high_watermark = plog.log_end_offset  # single node: ISR == {self}
            self.partitions[tp] = Partition(tp, plog, topic.partitions[tp.partition])

    def open_topic(self, topic: TopicState, indexes: Iterable[int]) -> None:
        self.install(topic, self.open_logs(topic, indexes))

    def delete_topic(self, name: str) -> None:
        for tp in [tp for tp in self.partitions if tp.topic == name]:
            p = self.partitions.pop(tp)
            p.log.delete()
            self.wake(tp)
        # directories of partitions not open here (e.g. left by a crash mid-delete)
        for d in self.data_dir.glob(f"{name}-*"):
            suffix = d.name[len(name) + 1 :]
            if d.is_dir() and suffix.isdigit():
                shutil.rmtree(d, ignore_errors=True)

    def update_topic_config(self, topic: TopicState) -> None:
        cfg = log_config(self.config, topic_overrides(topic))
        for tp, p in self.partitions.items():
            if tp.topic == topic.name:
                p.log.update_config(cfg)

    def close(self) -> None:
        for p in self.partitions.values():
            try:
                p.log.close()
            except Exception:
                log.exception("closing log %s failed", p.tp)
        self.partitions.clear()

    def get(self, tp: TopicPartition) -> Partition | None:
        return self.partitions.get(tp)

    # ---------------------------------------------------------------- retention
    async def run_retention(self) -> int:
        """Delete segments past retention (cleanup.policy delete) and compact logs
        (cleanup.policy compact, R-LOG-6); returns the number of segments deleted."""
        deleted = 0
        for p in list(self.partitions.values()):
            try:
                stats = p.log.compact(self.clock.wall_ms())
            except Exception:
                log.exception("compaction failed for %s", p.tp)
            else:
                if stats is not None and stats.groups_rewritten:
                    log.info("compacted %s: %d group(s), %d record(s) removed, %d -> %d bytes",
                             p.tp, stats.groups_rewritten, stats.records_removed,
                             stats.bytes_before, stats.bytes_after)
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

    def flush_due(self) -> None:
        """Flush every log whose unflushed data is older than its ``flush.ms``."""
        for p in list(self.partitions.values()):
            try:
                p.log.flush_if_due()
            except OSError:
                log.exception("flush failed for %s", p.tp)

    def flush_all(self) -> None:
        for p in self.partitions.values():
            p.log.flush()

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


def topic_overrides(topic: TopicState) -> dict[str, object]:
    from headrace.config import TOPIC_CONFIGS, parse_overrides

    return parse_overrides(
        {k: v for k, v in topic.configs.items() if k in TOPIC_CONFIGS}, TOPIC_CONFIGS
    )
