"""The controller's asyncio shell: campaign, events, fenced writes (docs/cluster.md).

Every broker runs one. It campaigns for the ephemeral ``/controller`` znode whenever the
cache shows none; the winner increments ``/controller_epoch`` and from then on every write
it makes is fenced by that znode's version (``ControllerMovedError``: it resigns and
campaigns again). While active, each event (brokers, topics, admin requests) triggers a
reconcile: the pure decisions of ``controller`` on the cache, written in a worker thread
(``write_partition_states``, pipelined), never on the event loop's time. Decisions are
idempotent against the cache: a write lost to a race (BadVersion) is simply decided again
when the cache shows the new state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from headrace.cluster import controller as decide
from headrace.cluster import zk_layout as L
from headrace.cluster.zk_store import ControllerMovedError
from headrace.config import TOPIC_CONFIGS, BrokerConfig
from headrace.metadata.store import PartitionState, TopicState

if TYPE_CHECKING:
    from headrace.clock import Clock
    from headrace.cluster.zk_store import ZkMetadataStore

log = logging.getLogger("headrace.controller")

RETRY_S = 0.5


def _snapshot(topics: Mapping[str, TopicState]) -> dict[str, TopicState]:
    """The cache as it is now: the store replaces a topic's partition states in place as
    notifications arrive, so decisions that span awaits take their own copy."""
    return {name: replace(t, partitions=list(t.partitions)) for name, t in topics.items()}


def _leader(topics: Mapping[str, TopicState], d: decide.Decision) -> int:
    """The leader a decision's partition had before it (-2: a partition not yet known)."""
    t = topics.get(d.topic)
    return t.partitions[d.partition].leader if t is not None and d.partition < len(
        t.partitions) else -2


class ControllerService:
    def __init__(self, node_id: int, store: ZkMetadataStore, config: BrokerConfig,
                 clock: Clock) -> None:
        self.node_id = node_id
        self.store = store
        self.config = config
        self.clock = clock
        self.is_active = False
        self.epoch = -1
        self._epoch_zk_version = -1
        self._kick = asyncio.Event()
        self._lock = asyncio.Lock()
        self._stopping = False
        self._shutting_down: set[int] = set()
        self._broker_epochs: dict[int, int] = {}  # as last handled (Kafka's broker epochs)
        store.add_listener(self)

    # ------------------------------------------------------------------ events
    def topic_changed(self, name: str) -> None:
        self._kick.set()

    def topic_deleted(self, name: str) -> None:
        self._kick.set()

    def brokers_changed(self) -> None:
        self._kick.set()

    def controller_changed(self, controller_id: int) -> None:
        if controller_id != self.node_id and self.is_active:
            log.warning("broker %d is the controller now; this broker stops controlling",
                        controller_id)
            self.is_active = False
        self._kick.set()

    def admin_changed(self, kind: str) -> None:
        self._kick.set()

    def session_lost(self) -> None:
        if self.is_active:
            log.warning("ZooKeeper session lost: no longer the controller")
        self.is_active = False
        self._kick.set()

    def session_restored(self) -> None:
        self._kick.set()

    # ------------------------------------------------------------------ loop
    async def run(self, stopped: asyncio.Event) -> None:
        interval = int(self.config["leader.imbalance.check.interval.seconds"])
        auto = bool(self.config["auto.leader.rebalance.enable"])
        loop = asyncio.get_running_loop()
        next_rebalance = loop.time() + interval
        try:
            while not stopped.is_set():
                self._kick.clear()
                try:
                    if not self.is_active and self.store.controller_id() == -1:
                        await self._campaign()
                    if self.is_active:
                        await self._reconcile()
                        if auto and loop.time() >= next_rebalance:
                            next_rebalance = loop.time() + interval
                            await self._rebalance()
                except ControllerMovedError:
                    log.warning("another controller took over (epoch moved); resigning")
                    self.is_active = False
                except Exception as e:
                    log.warning("controller step failed: %s; retrying", e)
                    await asyncio.sleep(RETRY_S)
                    self._kick.set()
                timeout = max(next_rebalance - loop.time(), 0.05) if self.is_active else 1.0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), timeout)
        finally:
            if self.is_active:
                self.is_active = False
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.store.resign_controller, self.node_id)

    async def _campaign(self) -> None:
        won = await asyncio.to_thread(self.store.elect_controller, self.node_id)
        if won is None:
            return
        self.epoch, self._epoch_zk_version = won
        # the broker epochs this controller has handled: none yet (a bounce before this
        # controller started shows as a registration newer than its leader's state)
        self._broker_epochs = {}
        self.is_active = True
        log.info("broker %d is the controller (epoch %d)", self.node_id, self.epoch)

    # ------------------------------------------------------------------ decisions
    def _unclean(self, topic: str) -> bool:
        t = self.store.topic(topic)
        raw = t.configs.get("unclean.leader.election.enable") if t is not None else None
        if raw is None:
            return bool(self.config["unclean.leader.election.enable"])
        return bool(TOPIC_CONFIGS["unclean.leader.election.enable"].parse(raw))

    def _live(self) -> set[int]:
        return {b.node_id for b in self.store.live_brokers()}

    async def _write(self, decisions: list[decide.Decision]) -> list[int | None]:
        if not decisions:
            return []
        updates = [(d.topic, d.partition, d.state) for d in decisions]
        results = await asyncio.to_thread(self.store.write_partition_states, updates,
                                          self.epoch, self._epoch_zk_version)
        written = [d for d, r in zip(decisions, results, strict=True) if r is not None]
        by_why: dict[str, int] = {}
        for d in written:
            by_why[d.why] = by_why.get(d.why, 0) + 1
            if d.unclean:
                log.warning("UNCLEAN election of %s-%d: broker %d leads (epoch %d) although it "
                            "was not in the ISR; records only the old leader had are lost",
                            d.topic, d.partition, d.state.leader, d.state.leader_epoch)
        for why, n in by_why.items():
            log.info("wrote %d partition state(s): %s", n, why)
        return results

    async def _reconcile(self) -> None:
        async with self._lock:
            topics = _snapshot(self.store.topics())
            live = self._live()
            shutting = set(self.store.controlled_shutdown_requests()) & live
            # bounced brokers first: a failure (this round) then a startup (the next
            # round, once their partitions' new states are read back)
            epochs = dict(self.store.broker_epochs())
            seen, self._broker_epochs = self._broker_epochs, epochs
            bounced = {b for b, e in epochs.items() if seen.get(b, e) != e}
            if bounced:
                log.info("broker(s) %s registered again (new broker epoch): handled as a "
                         "failure and a startup", sorted(bounced))
            bounces = decide.on_brokers_bounced(topics, live, bounced, epochs,
                                                self.store.state_mzxid)
            await self._write(bounces)
            done = {(d.topic, d.partition) for d in bounces}
            decisions = [d for d in decide.on_brokers_changed(topics, live, self._unclean)
                         if (d.topic, d.partition) not in done]
            # as Kafka's onBrokerFailure: the elections first (they make partitions
            # writable again), then the ISR-only changes (dead followers out), each its
            # own pipelined batch: a broker leading 1,000 of 3,000 partitions dies, and
            # the 1,000 new leaders are not queued behind 2,000 ISR writes
            moved = [d for d in decisions if d.state.leader != _leader(topics, d)]
            await self._write(moved)
            await self._write([d for d in decisions if d.state.leader == _leader(topics, d)])
            for b in sorted(shutting):
                await self._write(decide.controlled_shutdown(self.store.topics(), b,
                                                             live - shutting))
            for name in self.store.pending_deletions():
                if self.store.topic(name) is not None:
                    await asyncio.to_thread(self.store.delete_topic_znodes, name,
                                            self._epoch_zk_version)
                    log.info("deleted topic %s", name)
                else:
                    await asyncio.to_thread(self.store.delete_admin_node,
                                            f"{L.DELETE_TOPICS}/{name}")
            await self._progress_reassignments()
            requests = self.store.preferred_election_requests()
            if requests:
                await self._preferred(requests)
                await asyncio.to_thread(self.store.delete_admin_node, L.PREFERRED_ELECTION)

    async def _preferred(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """Preferred elections: per partition "elected", "not needed" or "not available"."""
        live = self._live()
        out: dict[tuple[str, int], str] = {}
        decisions = []
        for name, p in partitions:
            t = self.store.topic(name)
            if t is None or not 0 <= p < len(t.partitions):
                out[(name, p)] = "unknown"
                continue
            st = t.partitions[p]
            if st.replicas and st.leader == st.replicas[0]:
                out[(name, p)] = "not needed"
                continue
            new = decide.preferred_election(st, live)
            if new is None:
                out[(name, p)] = "not available"
                continue
            decisions.append(decide.Decision(name, p, new, "preferred leader election"))
            out[(name, p)] = "elected"
        results = await self._write(decisions)
        for d, r in zip(decisions, results, strict=True):
            if r is None:
                out[(d.topic, d.partition)] = "not available"
        return out

    async def _rebalance(self) -> None:
        pct = int(self.config["leader.imbalance.per.broker.percentage"])
        todo = decide.imbalanced(self.store.topics(), self._live(), pct)
        if todo:
            log.info("auto leader rebalance: %d partition(s) back to their preferred leader",
                     len(todo))
            async with self._lock:
                await self._preferred(todo)

    # ------------------------------------------------------------------ requests
    async def elect_leaders(self, election_type: int, partitions: list[tuple[str, int]] | None
                            ) -> dict[tuple[str, int], str]:
        """ElectLeaders (43): 0 preferred, 1 unclean (an offline partition elects any live
        replica). None: every partition."""
        if partitions is None:
            partitions = [(n, i) for n, t in self.store.topics().items()
                          for i in range(len(t.partitions))]
        if election_type == 0:
            async with self._lock:
                return await self._preferred(partitions)
        live = self._live()
        out: dict[tuple[str, int], str] = {}
        decisions = []
        for name, p in partitions:
            t = self.store.topic(name)
            if t is None or not 0 <= p < len(t.partitions):
                out[(name, p)] = "unknown"
                continue
            st: PartitionState = t.partitions[p]
            if st.leader in live:
                out[(name, p)] = "not needed"
                continue
            choice = decide.offline_election(st, live, True)
            if choice is None:
                out[(name, p)] = "not available"
                continue
            leader, isr, unclean = choice
            decisions.append(decide.Decision(name, p, decide.elected(st, leader, isr),
                                             "unclean election on request", unclean))
            out[(name, p)] = "elected"
        async with self._lock:
            await self._write(decisions)
        return out

    async def controlled_shutdown(self, broker_id: int) -> None:
        if broker_id == self.node_id:
            # announced as any broker's request is (``/admin/controlled_shutdown/<id>``,
            # ephemeral): the leaders read it and do not take this broker back into the
            # ISRs it is removed from below while it still fetches (KIP-841)
            await asyncio.to_thread(self.store.request_controlled_shutdown, broker_id)
        async with self._lock:
            live = self._live() - {broker_id}
            await self._write(decide.controlled_shutdown(self.store.topics(), broker_id, live))

    # ------------------------------------------------------------------ reassignment
    async def _write_assignment(self, name: str, assignment: dict[int, list[int]],
                                adding: dict[int, list[int]],
                                removing: dict[int, list[int]]) -> None:
        await asyncio.to_thread(self.store.write_topic_assignment, name, assignment, adding,
                                removing, self._epoch_zk_version)

    async def _progress_reassignments(self) -> None:
        """Phase 2 of every reassignment whose target replicas are all in sync."""
        live = self._live()
        for name, (adding, removing) in self.store.reassignments().items():
            t = self.store.topic(name)
            if t is None:
                continue
            parts = set(adding) | set(removing)
            done = []
            for p in sorted(parts):
                st = t.partitions[p]
                target = decide.reassignment_target(st, removing.get(p, []))
                new = decide.finish_reassignment(st, target, live)
                if new is not None:
                    done.append(decide.Decision(name, p, new, "reassignment completed"))
            if not done:
                continue
            assignment = {i: list(st.replicas) for i, st in enumerate(t.partitions)}
            for d in done:
                assignment[d.partition] = list(d.state.replicas)
            finished = {d.partition for d in done}
            await self._write_assignment(
                name, assignment, {p: r for p, r in adding.items() if p not in finished},
                {p: r for p, r in removing.items() if p not in finished})
            await self._write(done)
            for d in done:
                log.info("reassignment of %s-%d done: replicas %s", name, d.partition,
                         d.state.replicas)

    async def alter_reassignments(self, items: list[tuple[str, int, list[int] | None]]
                                  ) -> dict[tuple[str, int], tuple[str, str | None]]:
        """AlterPartitionReassignments: per partition ("none" | an error name, message)."""
        out: dict[tuple[str, int], tuple[str, str | None]] = {}
        async with self._lock:
            live = self._live()
            by_topic: dict[str, list[tuple[int, list[int] | None]]] = {}
            for name, p, target in items:
                t = self.store.topic(name)
                if t is None or not 0 <= p < len(t.partitions):
                    out[(name, p)] = ("unknown_topic_or_partition", None)
                    continue
                if target is not None and (not target or len(set(target)) != len(target)
                                           or not set(target) <= live):
                    out[(name, p)] = ("invalid_replica_assignment",
                                      f"Invalid replica assignment {target}: brokers must be "
                                      "distinct and registered")
                    continue
                by_topic.setdefault(name, []).append((p, target))
            for name, wanted in by_topic.items():
                t = self.store.topic(name)
                assert t is not None
                adding, removing = self.store.reassignments().get(name, ({}, {}))
                adding, removing = dict(adding), dict(removing)
                assignment = {i: list(st.replicas) for i, st in enumerate(t.partitions)}
                decisions = []
                for p, target in wanted:
                    st = t.partitions[p]
                    ongoing = p in adding or p in removing
                    if target is None:
                        if not ongoing:
                            out[(name, p)] = ("no_reassignment_in_progress", None)
                            continue
                        new = decide.cancel_reassignment(st, removing.get(p, []),
                                                         adding.get(p, []), live)
                        adding.pop(p, None)
                        removing.pop(p, None)
                        assignment[p] = list(new.replicas)
                        decisions.append(decide.Decision(name, p, new, "reassignment cancelled"))
                    else:
                        if ongoing:  # a new target replaces the old: start from the original
                            st = decide.cancel_reassignment(st, removing.get(p, []),
                                                            adding.get(p, []), live)
                        if list(target) == list(st.replicas):
                            adding.pop(p, None)
                            removing.pop(p, None)
                            assignment[p] = list(st.replicas)
                            out[(name, p)] = ("none", None)
                            continue
                        r = decide.start_reassignment(st, list(target))
                        assignment[p] = r.replicas
                        if r.adding:
                            adding[p] = r.adding
                        else:
                            adding.pop(p, None)
                        if r.removing:
                            removing[p] = r.removing
                        else:
                            removing.pop(p, None)
                        decisions.append(decide.Decision(name, p, r.state, "reassignment started"))
                    out[(name, p)] = ("none", None)
                if decisions or any(v == ("none", None) for k, v in out.items() if k[0] == name):
                    await self._write_assignment(name, assignment, adding, removing)
                    await self._write(decisions)
        self._kick.set()
        return out

    def list_reassignments(self, wanted: list[tuple[str, int]] | None
                           ) -> dict[tuple[str, int], tuple[list[int], list[int], list[int]]]:
        out = {}
        for name, (adding, removing) in self.store.reassignments().items():
            t = self.store.topic(name)
            if t is None:
                continue
            for p in sorted(set(adding) | set(removing)):
                if wanted is None or (name, p) in wanted:
                    out[(name, p)] = (list(t.partitions[p].replicas), adding.get(p, []),
                                      removing.get(p, []))
        return out

