"""A broker's part in a cluster: it follows the metadata in ZooKeeper (docs/cluster.md).

``ClusterNode`` listens to the ``ZkMetadataStore``'s events (on the event loop) and makes
the hosted partitions match them:

- **Transitions** (Kafka's ``ReplicaManager.becomeLeaderOrFollower``, driven by the state
  znodes instead of LeaderAndIsr requests): a partition whose state names this broker as
  leader becomes leader at that leader epoch (its epoch cache gets the epoch at the log
  end offset; every ISR follower counts as caught up from now); any other leader makes it a
  follower fetching from that leader (truncating first); leader -1 stops fetching. A
  state with an older leader epoch than the one acted on is stale and ignored. Partitions
  that appear here get their logs opened in a worker thread; partitions this broker no
  longer hosts (a reassignment, a deleted topic) are closed and their directories removed.
- **ISR** (R-REP-3): as leader, every ``replica.lag.time.max.ms`` / 2 it drops followers
  not caught up for ``replica.lag.time.max.ms`` and, when a follower's fetch reaches the
  high watermark, adds it back. Each change is a conditional write of the state znode
  (expected version = the znode version acted on) and takes effect only after it
  succeeded; a lost race (the controller wrote first) changes nothing and the cache brings
  the new state. One writer task sends every change queued meanwhile together
  (``update_isrs``: up to STATE_WRITE_BATCH to a ZooKeeper transaction, one notification
  each), as Kafka's ``AlterPartitionManager`` batches AlterPartition.
- **Fencing**: when the ZooKeeper session is lost, every partition stops leading at once
  (NOT_LEADER_OR_FOLLOWER; acks=all waiters are answered) and every fetcher stops; after
  the new session's cache is loaded every topic is reconciled again.
- **High watermarks** are checkpointed to ``replication-offset-checkpoint`` (Kafka's file)
  every ``replica.high.watermark.checkpoint.interval.ms`` and when the broker stops.
- Leadership of ``__consumer_offsets`` partitions is handed to the group service (it loads
  the partition's groups when it leads and forgets them when it does not).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from headrace.broker.replica_manager import Partition, TopicPartition
from headrace.cluster.replica_fetcher import ReplicaFetcherManager
from headrace.log.checkpoints import read_offset_checkpoint, write_offset_checkpoint
from headrace.metadata.store import PartitionState, TopicState
from headrace.replication.leader import IsrChange

if TYPE_CHECKING:
    from headrace.broker.server import Broker
    from headrace.cluster.zk_store import ZkMetadataStore

log = logging.getLogger("headrace.cluster")

HW_CHECKPOINT = "replication-offset-checkpoint"


class ClusterNode:
    def __init__(self, broker: Broker, store: ZkMetadataStore) -> None:
        self.broker = broker
        self.store = store
        self.replicas = broker.replicas
        self.node_id = broker.node_id
        self.config = broker.config
        self.lag_ms = int(self.config["replica.lag.time.max.ms"])
        self.fetchers = ReplicaFetcherManager(self.node_id, self.config, self.replicas,
                                              store.broker, broker.inter_broker)
        self.fenced = False
        self._dirty: set[str] = set()
        self._kick = asyncio.Event()
        self._changed = asyncio.Event()  # any reconcile finished (waiters re-check)
        self._stopping = False
        self._configs: dict[str, dict[str, str]] = {}
        self._became_leader: list[str] = []
        self._became_follower: list[str] = []
        self._isr_changes: list[str] = []
        # ISR changes waiting for the writer: (partition, change, state decided on, core)
        self._isr_queue: list[tuple[Partition, IsrChange, PartitionState, Any]] = []
        self._isr_writer: asyncio.Task[None] | None = None
        # the restart rule (README, "The replication rules"; the simulation's
        # ``reread_leads=False``): per hosted partition, the leader epoch of its state
        # before this process registered, and the last epoch this process led. A state
        # naming this broker leader at an epoch it never led and not newer than the one
        # before its registration may have been led by an earlier process of this broker
        # (its high watermark served, then lost with it): it waits for the controller's
        # next epoch
        self._start_epochs: dict[TopicPartition, int] = {}
        self._led_epochs: dict[TopicPartition, int] = {}
        self._waiting: list[str] = []

    def _log_isr_changes(self) -> None:
        """ISR changes written in the last half second, in one line."""
        changes, self._isr_changes = self._isr_changes, []
        if changes:
            more = f" (and {len(changes) - 3} more)" if len(changes) > 3 else ""
            log.info("ISR changed for %d partition(s): %s%s", len(changes),
                     "; ".join(changes[:3]), more)

    def _log_transitions(self) -> None:
        """One line for the leadership this broker took or gave up since the last one."""
        for what, names in (("leading", self._became_leader),
                            ("no longer leading", self._became_follower),
                            ("not leading (an epoch an earlier process of this broker may "
                             "have led; waiting for the controller's next one)",
                             self._waiting)):
            if names:
                more = f" and {len(names) - 5} more" if len(names) > 5 else ""
                log.info("%s %d partition(s): %s%s", what, len(names), ", ".join(names[:5]),
                         more)
                names.clear()

    # ------------------------------------------------------------------ listener
    def topic_changed(self, name: str) -> None:
        # partitions already hosted take their new state at once, so what this broker
        # does (produce checks, fetches) never lags what its Metadata answers; opening
        # new logs, removals and configs follow in the reconcile pass
        topic = self.store.topic(name)
        if topic is not None and not self.fenced:
            parts = getattr(self.store, "changed_partitions", {}).get(name)
            indexes = range(len(topic.partitions)) if parts is None else sorted(parts)
            for i in indexes:
                if i >= len(topic.partitions):
                    continue
                st = topic.partitions[i]
                if self.node_id in st.replicas:
                    p = self.replicas.get(TopicPartition(name, i))
                    if p is not None:
                        self._transition(p, st)
            if parts is not None and all(
                    self.replicas.get(TopicPartition(name, i)) is not None
                    for i in parts if i < len(topic.partitions)
                    and self.node_id in topic.partitions[i].replicas):
                self._log_transitions()
                return  # only states of hosted partitions changed: done
        self._dirty.add(name)
        self._kick.set()

    def topic_deleted(self, name: str) -> None:
        self._dirty.add(name)
        self._kick.set()

    def brokers_changed(self) -> None:
        self._changed.set()

    def controller_changed(self, controller_id: int) -> None:
        self._changed.set()

    def session_lost(self) -> None:
        if self.fenced:
            return
        self.fenced = True
        led = 0
        for p in self.replicas.partitions.values():
            if p.leading:
                led += 1
                p.become_follower()
        self.fetchers.remove_all()
        log.warning("ZooKeeper session lost: this broker stopped leading %d partition(s) "
                    "and fetching until it has re-registered", led)

    def session_restored(self) -> None:
        self.fenced = False
        log.info("ZooKeeper session re-established: reconciling every topic")
        self._dirty.update(self.store.topics().keys())
        self._dirty.update(tp.topic for tp in self.replicas.partitions)
        self._dirty.update(self.broker.metrics.counted_topics())  # deleted while fenced?
        self._kick.set()

    # ------------------------------------------------------------------ lifecycle
    def load_hw_checkpoint(self) -> None:
        found = read_offset_checkpoint(self.replicas.data_dir / HW_CHECKPOINT)
        self.replicas.hw_checkpoint = {TopicPartition(t, p): o for (t, p), o in found.items()}

    def write_hw_checkpoint(self) -> None:
        entries = {(tp.topic, tp.partition): p.log.high_watermark
                   for tp, p in self.replicas.partitions.items() if p.log.offline is None}
        try:
            write_offset_checkpoint(self.replicas.data_dir / HW_CHECKPOINT, entries)
        except OSError as e:
            log.warning("cannot write %s: %s", HW_CHECKPOINT, e)

    async def start(self) -> None:
        """Reconcile everything the store knows (the broker is not listening yet)."""
        self.store.add_listener(self)
        # the states were read after this process registered: one written before it (its
        # mzxid below this broker's epoch, the registration's czxid) holds the epoch an
        # earlier process may have led; one written after it was the controller's
        # decision (a new epoch) on seeing this registration, which this process may lead
        registered = self.store.broker_epochs().get(self.node_id, -1)
        for name, t in self.store.topics().items():
            for i, st in enumerate(t.partitions):
                if self.node_id in st.replicas:
                    mzxid = self.store.state_mzxid(name, i)
                    after = registered >= 0 and mzxid > registered
                    self._start_epochs[TopicPartition(name, i)] = (
                        st.leader_epoch - 1 if after else st.leader_epoch)
        await self._reconcile(set(self.store.topics()) | {tp.topic for tp in
                                                         self.replicas.partitions})

    async def run(self, stopped: asyncio.Event) -> None:
        interval_s = max(self.lag_ms / 2000, 0.05)
        checkpoint_s = int(self.config["replica.high.watermark.checkpoint.interval.ms"]) / 1000
        loop = asyncio.get_running_loop()
        next_isr = loop.time() + interval_s
        next_checkpoint = loop.time() + checkpoint_s
        while not stopped.is_set():
            timeout = max(min(next_isr, next_checkpoint) - loop.time(), 0)
            if not self._dirty:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), timeout)
            self._kick.clear()
            if stopped.is_set():
                break
            if self._dirty:
                names, self._dirty = self._dirty, set()
                try:
                    await self._reconcile(names)
                except Exception:
                    log.exception("reconciling %d topic(s) failed; retrying", len(names))
                    self._dirty |= names
                    await asyncio.sleep(0.5)
            now = loop.time()
            if now >= next_isr:
                next_isr = now + interval_s
                self._shrink_isrs()
            if now >= next_checkpoint:
                next_checkpoint = now + checkpoint_s
                await asyncio.to_thread(self.write_hw_checkpoint)

    async def controlled_shutdown(self) -> None:
        """Before a clean stop (SIGTERM): ask the controller to move leadership away and
        wait, bounded, until this broker leads nothing that another replica could lead."""
        if not self.config["controlled.shutdown.enable"] or self.fenced:
            return

        def leading() -> int:
            # only what another live in-sync replica could take over counts: a partition
            # whose other ISR members are dead stays with us (the controller cannot move it),
            # and so does one whose other ISR members are shutting down too (the controller
            # elects none of them: Kafka's shuttingDownBrokerIds). Without this, brokers
            # stopped together (Ctrl-C on "headrace cluster") retried for a minute each.
            live = ({b.node_id for b in self.store.live_brokers()}
                    - set(self.store.controlled_shutdown_requests()))
            return sum(1 for p in self.replicas.partitions.values()
                       if p.leading and any(r != self.node_id and r in live
                                            for r in p.state.isr))

        n = leading()
        if not n:
            return
        if not getattr(self.store, "connected", True):
            # ZooKeeper is gone (stopped before this broker, say): no controller can be
            # asked, and each attempt would only time out (issue 26: a minute of retries)
            log.warning("controlled shutdown skipped: no ZooKeeper connection, so no "
                        "controller to move the leadership of %d partition(s); stopping", n)
            return
        log.info("controlled shutdown: moving the leadership of %d partition(s) away", n)
        # Kafka's bounds: max.retries attempts, each a request bounded by the request
        # timeout, then retry.backoff.ms for the leadership change to arrive
        retries = int(self.config["controlled.shutdown.max.retries"])
        request_s = min(max(int(self.config["request.timeout.ms"]) / 1000, 1.0), 10.0)
        backoff_s = max(int(self.config["controlled.shutdown.retry.backoff.ms"]) / 1000, 0.5)
        for attempt in range(retries + 1):
            controller = self.broker.controller
            try:
                if controller is not None and controller.is_active:
                    await asyncio.wait_for(controller.controlled_shutdown(self.node_id),
                                           request_s)
                else:
                    await asyncio.wait_for(asyncio.to_thread(
                        self.store.request_controlled_shutdown, self.node_id), request_s)
            except TimeoutError:  # str() of a TimeoutError is empty
                log.warning("controlled shutdown request failed: no answer from the "
                            "controller within %.0f s", request_s)
            except Exception as e:
                log.warning("controlled shutdown request failed: %s",
                            str(e) or type(e).__name__)
            if await self.wait_for(lambda: leading() == 0, backoff_s):
                log.info("controlled shutdown: leadership moved")
                return
            if attempt < retries:
                log.info("controlled shutdown: %d partition(s) still led; retrying", leading())
        log.warning("controlled shutdown: %d partition(s) still led; stopping anyway",
                    leading())

    async def stop(self) -> None:
        self._stopping = True
        await self.fetchers.stop()
        self.write_hw_checkpoint()

    async def wait_for(self, predicate: Any, timeout_s: float) -> bool:
        """Wait (bounded) until ``predicate()`` holds, re-checked after every reconcile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not predicate():
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.1))
        return True

    # ------------------------------------------------------------------ reconcile
    async def _reconcile(self, names: set[str]) -> None:
        for name in sorted(names):
            topic = self.store.topic(name)
            hosted = [tp for tp in self.replicas.partitions if tp.topic == name]
            if topic is None:
                if hosted:
                    self._forget_topic(name, hosted)
                # counted here while it led a partition of it (perhaps moved away since)
                self.broker.metrics.topic_deleted(name)
                continue
            await self._reconcile_topic(topic, hosted)
            await asyncio.sleep(0)
        self._log_transitions()
        self._changed.set()

    def _forget_topic(self, name: str, hosted: list[TopicPartition]) -> None:
        for tp in hosted:
            p = self.replicas.get(tp)
            if p is not None:
                p.become_follower()
            self.fetchers.remove(tp)
            self.broker.groups.partition_unloaded(tp)
            self.broker.txns.partition_unloaded(tp)
            self.broker.share_coordinator.partition_unloaded(tp)
        self.replicas.delete_topic(name)
        self._configs.pop(name, None)
        log.info("deleted the local replicas of topic %s", name)

    async def _reconcile_topic(self, topic: TopicState, hosted: list[TopicPartition]) -> None:
        mine = [i for i, st in enumerate(topic.partitions) if self.node_id in st.replicas]
        # replicas moved away from this broker (reassignment) or partitions that vanished
        for tp in hosted:
            if tp.partition >= len(topic.partitions) or tp.partition not in mine:
                self._remove_replica(tp)
        missing = [i for i in mine
                   if TopicPartition(topic.name, i) not in self.replicas.partitions]
        if missing:
            try:
                logs = await asyncio.to_thread(self.replicas.open_logs, topic, missing)
            except Exception as e:
                log.error("cannot open the logs of %s partitions %s: %s", topic.name,
                          missing[:10], e)
                raise
            # the topic may have changed while the logs opened: install what still fits
            current = self.store.topic(topic.name)
            if current is None or current.topic_id != topic.topic_id:
                for plog in logs.values():
                    plog.close()
                return
            topic = current
            self.replicas.install(topic, logs)
        configs = dict(topic.configs)
        if self._configs.get(topic.name) != configs:
            if topic.name in self._configs:
                self.replicas.update_topic_config(topic)
            self._configs[topic.name] = configs
        for i in mine:
            tp = TopicPartition(topic.name, i)
            p = self.replicas.get(tp)
            if p is not None and i < len(topic.partitions):
                self._transition(p, topic.partitions[i])

    def _remove_replica(self, tp: TopicPartition) -> None:
        p = self.replicas.partitions.pop(tp, None)
        self.fetchers.remove(tp)
        if p is None:
            return
        p.become_follower()
        self.broker.groups.partition_unloaded(tp)
        self.broker.txns.partition_unloaded(tp)
        self.broker.share_coordinator.partition_unloaded(tp)
        try:
            p.log.close()
        except Exception as e:
            log.warning("closing %s failed: %s", tp, e)
        self.replicas.remove_dirs([p.log.dir])  # in whichever log dir it lives
        log.info("removed replica %s (no longer assigned to this broker)", tp)

    def may_lead(self, tp: TopicPartition, leader_epoch: int) -> bool:
        """May this process lead ``tp`` at ``leader_epoch``? Yes if it led that epoch
        already or the epoch is newer than the state's before this process registered
        (the controller's decision after it saw the registration); no otherwise."""
        return (self._led_epochs.get(tp) == leader_epoch
                or leader_epoch > self._start_epochs.get(tp, -1))

    def _transition(self, p: Partition, state: PartitionState) -> None:
        old = p.state
        if (state.zk_version == old.zk_version and state.leader == old.leader
                and state.leader_epoch == old.leader_epoch and state.isr == old.isr
                and state.replicas == old.replicas and not self.fenced
                and ((state.leader == self.node_id and p.leading)
                     or (state.leader != self.node_id and not p.leading
                         and (state.leader < 0 or self.fetchers.fetching(p.tp) is not None)))):
            return  # nothing new (most partitions of a topic on each of its events)
        fresh = not p.leading and self.fetchers.fetching(p.tp) is None
        if state.leader_epoch < old.leader_epoch:
            return  # stale (the cache is behind what this broker acted on)
        if state.zk_version >= 0 and 0 <= state.zk_version < old.zk_version:
            return
        new_epoch = state.leader_epoch != old.leader_epoch
        if (old.leader == state.leader == self.node_id and old.isr != state.isr
                and (p.core is None or p.core.pending is None
                     or tuple(state.isr) != p.core.pending.isr)):
            # the controller changed the ISR of a partition led here (one written by this
            # broker is counted in _isr_applied)
            self.broker.metrics.isr_changed(len(old.isr), len(state.isr))
        fresh_state = state.copy()
        if self.fenced:
            p.state = fresh_state
            return
        now = self.broker.clock.wall_ms()
        if state.leader == self.node_id:
            if ((not p.leading or new_epoch) and not self.may_lead(p.tp, state.leader_epoch)):
                # (never while leading: what this process leads is newer than its start)
                p.state = fresh_state
                self.fetchers.remove(p.tp)
                if new_epoch or old.leader != state.leader:
                    self._waiting.append(f"{p.tp} epoch {state.leader_epoch}")
                return
            if not p.leading or new_epoch:
                self._led_epochs[p.tp] = state.leader_epoch
                p.state = fresh_state
                self.fetchers.remove(p.tp)
                if p.log.offline is None:
                    p.log.assign_epoch(state.leader_epoch, p.log.log_end_offset)
                p.become_leader(now)
                log.debug("leading %s at epoch %d (ISR %s, log end %d, high watermark %d)",
                          p.tp, state.leader_epoch, state.isr, p.log.log_end_offset,
                          p.log.high_watermark)
                self._became_leader.append(str(p.tp))
                self.broker.groups.partition_led(p.tp)
                self.broker.txns.partition_led(p.tp)
                self.broker.share_coordinator.partition_led(p.tp)
                self.replicas.wake(p.tp)
            else:  # the ISR or the replicas may have changed
                settled = p.update_state(fresh_state, now)
                if settled is not None:  # our change, seen before its write's answer
                    self._isr_applied(p, old.isr, settled.reason)
            return
        # a follower (or nobody leads)
        p.state = fresh_state
        if p.leading:
            p.become_follower()
            self.broker.groups.partition_unloaded(p.tp)
            self.broker.txns.partition_unloaded(p.tp)
            self.broker.share_coordinator.partition_unloaded(p.tp)
            log.debug("%s: broker %d leads now (epoch %d); following", p.tp, state.leader,
                      state.leader_epoch)
            self._became_follower.append(str(p.tp))
            self.replicas.wake(p.tp)
        if state.leader < 0:
            self.fetchers.remove(p.tp)
            return
        current = self.fetchers.fetching(p.tp)
        if fresh or new_epoch or current is None or current.leader != state.leader:
            self.fetchers.add(p.tp, state.leader, state.leader_epoch)

    # ------------------------------------------------------------------ ISR changes
    def follower_fetched(self, p: Partition, replica_id: int) -> None:
        """After a follower's fetch (leader side): maybe it rejoins the ISR."""
        if self.fenced:
            return
        # KIP-841: only a registered broker not shutting down is taken back
        eligible = (self.store.broker(replica_id) is not None
                    and replica_id not in self.store.controlled_shutdown_requests())
        change = p.maybe_expand_isr(replica_id, eligible)
        if change is not None:
            self._spawn_isr_change(p, change)

    def _shrink_isrs(self) -> None:
        if self.fenced:
            return
        now = self.broker.clock.wall_ms()
        for p in list(self.replicas.partitions.values()):
            if p.leading and len(p.state.isr) > 1:
                change = p.maybe_shrink_isr(now, self.lag_ms)
                if change is not None:
                    self._spawn_isr_change(p, change)

    def _spawn_isr_change(self, p: Partition, change: IsrChange) -> None:
        """Queue ``change`` (pending in the partition's core, so the high watermark counts
        a joiner already) for the ISR writer: Kafka's ``AlterPartitionManager``, which sends
        every change queued while its previous request was in flight in the next one. After
        a failover a new leader may change thousands of ISRs at once; one ZooKeeper
        transaction each took minutes at 10,000 partitions."""
        self._isr_queue.append((p, change, p.state, p.core))
        if self._isr_writer is None or self._isr_writer.done():
            self._isr_writer = asyncio.get_running_loop().create_task(self._write_isrs())
            self.broker.track(self._isr_writer)

    async def _write_isrs(self) -> None:
        """Write the queued changes, each conditionally on the state it was decided on
        (``ZkMetadataStore.update_isrs``: many to a transaction); each takes effect only
        once written. A lost race drops it (the cache brings what was decided); a write
        without an answer may have been applied, so it stays pending until a newer state
        settles it (``Partition.update_state``) or the session's loss fences this leader."""
        while self._isr_queue:
            batch, self._isr_queue = self._isr_queue, []
            items = [(p.tp.topic, p.tp.partition, replace(acted, isr=list(change.isr)))
                     for p, change, acted, _ in batch]
            try:
                versions = await asyncio.to_thread(self.store.update_isrs, items)
            except Exception as e:
                # the outcome of those without an answer is unknown (the store retried
                # within the session): they stay pending, so the high watermark keeps
                # counting a joiner that ZooKeeper may already list, until the session's
                # loss fences this leader or a new state (through the cache) settles it
                log.warning("ISR change of %d partition(s) (%s: %s) has no answer: %s",
                            len(batch), batch[0][0].tp, batch[0][1].reason,
                            f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
                continue
            for (p, change, acted, core), (_, _, new), version in zip(
                    batch, items, versions, strict=True):
                if not self._isr_written(p, change, acted, core, new, version) and core:
                    core.isr_failed(change)

    def _isr_written(self, p: Partition, change: IsrChange, acted: PartitionState,
                     core: Any, new: PartitionState, version: int | None) -> bool:
        """Apply one written change; False if it is dropped (the core forgets it)."""
        if core is not None and core.pending is not change:
            return True  # settled meanwhile (by a newer state, or a new leadership)
        if version is None:
            log.debug("ISR change of %s lost a race (the state changed); re-reading", p.tp)
            return False
        if (self.replicas.partitions.get(p.tp) is not p or not p.leading
                or p.core is not core or p.state.leader_epoch != acted.leader_epoch
                or p.state.zk_version > version):
            return False
        p.isr_committed(change, replace(new, zk_version=version), self.broker.clock.wall_ms())
        self._isr_applied(p, acted.isr, change.reason)
        return True

    def _isr_applied(self, p: Partition, before: list[int], reason: str) -> None:
        """This leader's ISR change took effect (its write answered, or the state came
        back through the metadata first, whichever is seen first; the other then finds
        nothing pending): counted and logged once."""
        self.broker.metrics.isr_changed(len(before), len(p.state.isr))
        log.debug("ISR of %s: %s -> %s (%s)", p.tp, before, p.state.isr, reason)
        self._isr_changes.append(f"{p.tp}: {before} -> {p.state.isr} ({reason})")
        if len(self._isr_changes) == 1:
            asyncio.get_running_loop().call_later(0.5, self._log_isr_changes)
