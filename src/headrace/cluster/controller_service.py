"""The controller's asyncio shell: campaign, events, fenced writes (docs/cluster.md).

Every broker runs one. It campaigns for the ephemeral ``/controller`` znode whenever the
cache shows none; the winner increments ``/controller_epoch`` and from then on every write
it makes is fenced by that znode's version (``ControllerMovedError``: it resigns and
campaigns again).

The decisions are the pure ``replication.controller.Controller``'s, the simulation's own
(issue 21): the winner hands it one snapshot of the cache (``Startup``), and from then on
the store's notifications become its events, each handled incrementally:
``brokers_changed`` -> ``BrokerChange`` (only the partitions of the brokers that left,
came or bounced), ``topic_changed`` -> ``IsrChange`` per changed partition (or
``TopicChanged`` for a new or reassigned topic, a config change), ``topic_deleted`` ->
``TopicDeleted``, a controlled shutdown request -> ``ControlledShutdown``. No event
rescans the partitions. The effects (``WriteState``) are written in a worker thread
(``write_partition_states``, pipelined), the elections first and the ISR-only changes in a
second batch, as Kafka's ``onBrokerFailure``; each answer goes back as an event:
``StateWritten``, or ``WriteRefused`` with that one partition's znode re-read (someone
else decided: never overwrite). ``LeaderAndIsr`` effects are not sent: brokers learn
states from the state change notifications (``zk_store``).

Elections on request (ElectLeaders, preferred or unclean; the preferred-election admin
znode), the auto rebalance, reassignments (AlterPartitionReassignments) and topic deletion
(the ``/admin/delete_topics`` requests) are events too (``Elect``, ``Rebalance``,
``Reassign``, ``DeletionRequested``), decided over the same snapshot; the pure
controller's ``outcomes`` and ``reassign_outcomes`` answer the requests. A topic's
assignment (``WriteAssignment``) is written before the partition states of the same step,
fenced by the controller epoch and retried until written (or the controller is deposed);
a failed topic deletion (``DeleteTopic``) is requested again (``DeletionFailed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

from kazoo.exceptions import NoNodeError

from headrace.cluster import zk_layout as L
from headrace.cluster.zk_store import ControllerMovedError
from headrace.config import TOPIC_CONFIGS, BrokerConfig
from headrace.metadata.store import PartitionState, TopicState
from headrace.replication import controller as pure

if TYPE_CHECKING:
    from headrace.clock import Clock
    from headrace.cluster.zk_store import ZkMetadataStore

log = logging.getLogger("headrace.controller")

RETRY_S = 0.5


def _copy(st: PartitionState) -> PartitionState:
    """A state of the cache, for the pure controller to keep (never shared)."""
    # built directly: ``dataclasses.replace`` was most of the controller's share of the
    # event loop while it took back 30,000 states it had written (bench --scale)
    return st.copy()


def _versioned(st: PartitionState, zk_version: int,
               controller_epoch: int | None = None) -> PartitionState:
    """``st`` with another znode version (and controller epoch), as a copy."""
    out = st.copy()
    out.zk_version = zk_version
    if controller_epoch is not None:
        out.controller_epoch = controller_epoch
    return out


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
        # the pure controller while this broker is the active one
        self.ctl: pure.Controller | None = None
        self._topic_ids: dict[str, uuid.UUID] = {}  # as handed to ``ctl``
        self._reread: set[pure.TP] = set()  # written without an answer, or refused
        store.add_listener(self)

    # ------------------------------------------------------------------ events
    def _enqueue(self, event: pure.Event) -> None:
        if self.ctl is not None:
            self.ctl.enqueue(event)

    def _topic_unclean(self, t: TopicState) -> bool | None:
        raw = t.configs.get("unclean.leader.election.enable")
        return None if raw is None else bool(
            TOPIC_CONFIGS["unclean.leader.election.enable"].parse(raw))

    def _topic_event(self, t: TopicState) -> None:
        if self._topic_ids.get(t.name, t.topic_id) != t.topic_id:
            self._enqueue(pure.TopicDeleted(t.name))  # deleted and created again
        self._topic_ids[t.name] = t.topic_id
        self._enqueue(pure.TopicChanged(t.name, {i: _copy(st) for i, st in
                                                 enumerate(t.partitions)},
                                        self._topic_unclean(t)))

    def topic_changed(self, name: str) -> None:
        t = self.store.topic(name)
        if self.ctl is not None and t is not None:
            parts = self.store.changed_partitions.get(name)
            if parts is None or self._topic_ids.get(name) != t.topic_id:
                self._topic_event(t)
            else:
                known = self.ctl.states
                in_flight = self.ctl.in_flight
                for p in sorted(parts):
                    if 0 <= p < len(t.partitions):
                        st = t.partitions[p]
                        had = known.get((name, p))
                        if had is not None and st.zk_version <= had.zk_version:
                            continue  # not newer (mostly its own writes coming back): the
                            # pure controller would ignore it (``_isr_change``)
                        if (name, p) in in_flight:
                            continue  # its write's answer settles it: written, or refused
                            # and re-read (mostly that write itself, seen before its answer)
                        self._enqueue(pure.IsrChange((name, p), _copy(st)))
        self._kick.set()

    def topic_deleted(self, name: str) -> None:
        if self.ctl is not None:
            self._topic_ids.pop(name, None)
            self._enqueue(pure.TopicDeleted(name))
        self._kick.set()

    def brokers_changed(self) -> None:
        self._enqueue(pure.BrokerChange(dict(self.store.broker_epochs())))
        self._shutdown_requests()
        self._kick.set()

    def _shutdown_requests(self) -> None:
        ctl = self.ctl
        if ctl is None:
            return
        for b in self.store.controlled_shutdown_requests():
            if b in self.store.broker_epochs() and b not in ctl.shutting_down:
                ctl.enqueue(pure.ControlledShutdown(b))

    def controller_changed(self, controller_id: int) -> None:
        if controller_id != self.node_id and self.is_active:
            log.warning("broker %d is the controller now; this broker stops controlling",
                        controller_id)
            self._resign()
        self._kick.set()

    def admin_changed(self, kind: str) -> None:
        if kind == "controlled_shutdown":
            self._shutdown_requests()
        self._kick.set()

    def session_lost(self) -> None:
        if self.is_active:
            log.warning("ZooKeeper session lost: no longer the controller")
        self._resign()
        self._kick.set()

    def session_restored(self) -> None:
        self._kick.set()

    def _resign(self) -> None:
        self.is_active = False
        self.ctl = None
        self._reread.clear()

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
                    self._resign()
                except Exception as e:
                    log.warning("controller step failed: %s; retrying", e)
                    await asyncio.sleep(RETRY_S)
                    self._kick.set()
                if self.ctl is not None and (self.ctl.queue or self._reread):
                    continue  # events arrived while writing
                timeout = max(next_rebalance - loop.time(), 0.05) if self.is_active else 1.0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), timeout)
        finally:
            if self.is_active:
                self._resign()
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.store.resign_controller, self.node_id)

    async def _campaign(self) -> None:
        won = await asyncio.to_thread(self.store.elect_controller, self.node_id)
        if won is None:
            return
        self.epoch, self._epoch_zk_version = won
        # one snapshot of the cache (Kafka's onControllerFailover), then only events
        topics = self.store.topics()
        states: dict[pure.TP, PartitionState] = {}
        zxids: dict[pure.TP, int] = {}
        for name, t in topics.items():
            for i, st in enumerate(t.partitions):
                states[(name, i)] = _copy(st)
                zxids[(name, i)] = self.store.state_mzxid(name, i)
        self.ctl = pure.Controller(
            self.epoch, unclean=bool(self.config["unclean.leader.election.enable"]),
            leader_and_isr=False,  # not sent: brokers read the state notifications
            unclean_topics={n: u for n, t in topics.items()
                            if (u := self._topic_unclean(t)) is not None})
        self._topic_ids = {n: t.topic_id for n, t in topics.items()}
        self._reread = set()
        reassigning: dict[pure.TP, tuple[list[int], list[int]]] = {}
        for name, (adding, removing) in self.store.reassignments().items():
            for p in set(adding) | set(removing):
                reassigning[(name, p)] = (list(adding.get(p, [])), list(removing.get(p, [])))
        self.ctl.enqueue(pure.Startup(states, dict(self.store.broker_epochs()), zxids,
                                      reassigning))
        self._shutdown_requests()
        self.is_active = True
        log.info("broker %d is the controller (epoch %d): %d partition(s) loaded",
                 self.node_id, self.epoch, len(states))

    # ------------------------------------------------------------------ decisions
    async def _step(self) -> None:
        """Run the pure controller until its queue is empty: its writes, their answers
        back as events. The caller holds the lock."""
        ctl = self.ctl
        # ISR-only writes held back while refused elections are decided again (below)
        held: list[pure.WriteState] = []
        while ctl is not None and self.ctl is ctl and (ctl.queue or self._reread):
            if self._reread:
                await self._read_refused(ctl)
                if self._reread:
                    break  # the re-read failed: retried on the loop's next pass
            effects = ctl.run()
            # a topic's assignment before the states of the same step (a reassignment's
            # start); the newest of a topic's assignments has every decision before it
            assignments: dict[str, pure.WriteAssignment] = {}
            for e in effects:
                if isinstance(e, pure.WriteAssignment):
                    assignments[e.topic] = e
            for a in assignments.values():
                await self._write_assignment(ctl, a)
            for e in effects:
                if isinstance(e, pure.DeleteTopic) and self.ctl is ctl:
                    await self._delete_topic(ctl, e)
            writes = [e for e in effects if isinstance(e, pure.WriteState)]
            # as Kafka's onBrokerFailure: the elections first (they make partitions
            # writable again), then the ISR-only changes, each its own pipelined batch:
            # a broker leading 10,000 partitions dies, and the 10,000 new leaders are not
            # queued behind 20,000 ISR writes
            elections: list[pure.WriteState] = []
            isr_only: list[pure.WriteState] = []
            for w in writes:
                before = ctl.states.get(w.tp)
                (isr_only if before is not None and before.leader == w.state.leader
                 else elections).append(w)
            if elections and self.ctl is ctl:
                await self._write_effects(ctl, elections)
            held += isr_only
            if self._reread and self.ctl is ctl:
                # an election refused (its partition's state changed meanwhile) is re-read
                # and decided again before the ISR-only batch: its partition has no
                # leader until then, and the ISR removals of a failed broker following
                # 20,000 partitions take seconds (bench/cluster_bench.py --scale 30000:
                # 110 partitions led again only after them, 6 s late)
                continue
            if held and self.ctl is ctl:
                batch, held = held, []
                await self._write_effects(ctl, batch)
        if held and ctl is not None and self.ctl is ctl:
            # the re-read failed: the ISR changes go out anyway
            await self._write_effects(ctl, held)

    async def _write_assignment(self, ctl: pure.Controller, a: pure.WriteAssignment) -> None:
        """Write a topic's assignment; retried until written, the topic gone or the
        controller deposed (``ControllerMovedError``)."""
        while self.ctl is ctl:
            try:
                await asyncio.to_thread(self.store.write_topic_assignment, a.topic,
                                        a.assignment, a.adding, a.removing,
                                        self._epoch_zk_version)
            except ControllerMovedError:
                raise
            except NoNodeError:
                return  # deleted meanwhile: its TopicDeleted follows
            except Exception as e:
                log.warning("writing topic %s's assignment failed: %s; retrying", a.topic,
                            f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
                await asyncio.sleep(RETRY_S)
                continue
            moving = sorted(set(a.adding) | set(a.removing))
            log.info("wrote topic %s's assignment (%s): %s", a.topic, a.why,
                     f"partition(s) {moving} reassigning" if moving else
                     "no reassignment in progress")
            return

    async def _delete_topic(self, ctl: pure.Controller, d: pure.DeleteTopic) -> None:
        try:
            if d.known:
                await asyncio.to_thread(self.store.delete_topic_znodes, d.topic,
                                        self._epoch_zk_version)
                log.info("deleted topic %s", d.topic)
            else:
                await asyncio.to_thread(self.store.delete_admin_node,
                                        f"{L.DELETE_TOPICS}/{d.topic}")
        except ControllerMovedError:
            raise
        except Exception as e:
            log.warning("deleting topic %s failed: %s; retrying", d.topic,
                        f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
            ctl.enqueue(pure.DeletionFailed(d.topic))
            await asyncio.sleep(RETRY_S)
            self._kick.set()

    async def _write_effects(self, ctl: pure.Controller, batch: list[pure.WriteState]) -> None:
        updates = [(w.tp[0], w.tp[1], _versioned(w.state, w.expected_version))
                   for w in batch]
        try:
            results = await asyncio.to_thread(self.store.write_partition_states, updates,
                                              ctl.epoch, self._epoch_zk_version)
        except ControllerMovedError:
            raise
        except Exception as e:  # no answer: written or not, a re-read tells
            log.warning("writing %d partition state(s) failed: %s; re-reading them",
                        len(batch), f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
            self._reread |= {w.tp for w in batch}
            await asyncio.sleep(RETRY_S)
            return
        by_why: dict[str, int] = {}
        for w, r in zip(batch, results, strict=True):
            if r is None:
                self._reread.add(w.tp)
                continue
            ctl.enqueue(pure.StateWritten(w.tp, _versioned(w.state, r, w.controller_epoch)))
            why = w.why.split(" (UNCLEAN")[0]
            by_why[why] = by_why.get(why, 0) + 1
            if "UNCLEAN" in w.why:
                log.warning("UNCLEAN election of %s-%d: broker %d leads (epoch %d) although it "
                            "was not in the ISR; records only the old leader had are lost",
                            w.tp[0], w.tp[1], w.state.leader, w.state.leader_epoch)
        for why, n in by_why.items():
            log.info("wrote %d partition state(s): %s", n, why)
        refused = len(batch) - sum(by_why.values())
        if refused:
            log.info("%d partition state write(s) refused (changed meanwhile): re-reading "
                     "them", refused)

    async def _read_refused(self, ctl: pure.Controller) -> None:
        """Re-read exactly the partitions whose writes were refused or unanswered."""
        tps = sorted(self._reread)
        try:
            current = await asyncio.to_thread(self.store.read_partition_states, tps)
        except Exception as e:
            log.warning("re-reading %d partition state(s) failed: %s", len(tps), e)
            await asyncio.sleep(RETRY_S)
            return
        self._reread.clear()
        if any(st is None for st in current):
            await asyncio.sleep(RETRY_S)  # a create refused without a znode: not in a loop
        for tp, st in zip(tps, current, strict=True):
            if st is not None:
                t = self.store.topic(tp[0])
                known = ctl.states.get(tp)
                replicas = (t.partitions[tp[1]].replicas if t is not None and tp[1] < len(
                    t.partitions) else known.replicas if known is not None else [])
                st = replace(st, replicas=list(replicas))
            ctl.enqueue(pure.WriteRefused(tp, st))

    async def _reconcile(self) -> None:
        async with self._lock:
            await self._step()  # the snapshot has every topic the requests may name
            ctl = self.ctl
            if ctl is not None:
                for name in self.store.pending_deletions():
                    if name not in ctl.deleting:
                        ctl.enqueue(pure.DeletionRequested(name))
                await self._step()
            requests = self.store.preferred_election_requests()
            if requests:
                await self._preferred(requests)
                await asyncio.to_thread(self.store.delete_admin_node, L.PREFERRED_ELECTION)

    async def _elect(self, partitions: list[tuple[str, int]], preferred: bool
                     ) -> dict[tuple[str, int], str]:
        """Elections on request, decided by the pure controller (``Elect``): per partition
        "elected", "not needed", "not available" or "unknown". The caller holds the
        lock."""
        ctl = self.ctl
        if ctl is None:
            return {tp: "not available" for tp in partitions}
        await self._step()  # decide over a snapshot that has every event before
        for tp in partitions:
            ctl.outcomes.pop(tp, None)
        ctl.enqueue(pure.Elect(tuple(partitions), preferred))
        await self._step()
        return {tp: ctl.outcomes.pop(tp, "not available") for tp in partitions}

    async def _preferred(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """Preferred elections: per partition "elected", "not needed" or "not available"."""
        return await self._elect(partitions, True)

    async def _rebalance(self) -> None:
        pct = int(self.config["leader.imbalance.per.broker.percentage"])
        async with self._lock:
            if self.ctl is not None:
                self.ctl.enqueue(pure.Rebalance(pct))
                await self._step()

    # ------------------------------------------------------------------ requests
    async def elect_leaders(self, election_type: int, partitions: list[tuple[str, int]] | None
                            ) -> dict[tuple[str, int], str]:
        """ElectLeaders (43): 0 preferred, 1 unclean (an offline partition elects any live
        replica). None: every partition."""
        if partitions is None:
            partitions = [(n, i) for n, t in self.store.topics().items()
                          for i in range(len(t.partitions))]
        async with self._lock:
            return await self._elect(partitions, election_type == 0)

    async def controlled_shutdown(self, broker_id: int) -> None:
        if broker_id == self.node_id:
            # announced as any broker's request is (``/admin/controlled_shutdown/<id>``,
            # ephemeral): the leaders read it and do not take this broker back into the
            # ISRs it is removed from below while it still fetches (KIP-841)
            await asyncio.to_thread(self.store.request_controlled_shutdown, broker_id)
        async with self._lock:
            self._enqueue(pure.ControlledShutdown(broker_id))
            await self._step()

    # ------------------------------------------------------------------ reassignment
    async def alter_reassignments(self, items: list[tuple[str, int, list[int] | None]]
                                  ) -> dict[tuple[str, int], tuple[str, str | None]]:
        """AlterPartitionReassignments, decided by the pure controller (``Reassign``): per
        partition ("none" | an error name, message)."""
        keys = [(name, p) for name, p, _ in items]
        async with self._lock:
            ctl = self.ctl
            if ctl is None:
                return {k: ("not_controller", "This is not the controller") for k in keys}
            await self._step()  # decide over a snapshot that has every event before
            for k in keys:
                ctl.reassign_outcomes.pop(k, None)
            ctl.enqueue(pure.Reassign(tuple(
                ((name, p), None if target is None else tuple(target))
                for name, p, target in items)))
            await self._step()
            out = {k: ctl.reassign_outcomes.pop(k, ("not_controller",
                                                    "This is not the controller"))
                   for k in keys}
        self._kick.set()
        return out

    def list_reassignments(self, wanted: list[tuple[str, int]] | None
                           ) -> dict[tuple[str, int], tuple[list[int], list[int], list[int]]]:
        out = {}
        ctl = self.ctl
        if ctl is not None:  # the controller's own view: its decisions, written or writing
            for tp, (adds, removes) in sorted(ctl.reassigning.items()):
                st = ctl.writing.get(tp) or ctl.states.get(tp)
                if st is not None and (wanted is None or tp in wanted):
                    out[tp] = (list(st.replicas), list(adds), list(removes))
            return out
        for name, (adding, removing) in self.store.reassignments().items():
            t = self.store.topic(name)
            if t is None:
                continue
            for p in sorted(set(adding) | set(removing)):
                if wanted is None or (name, p) in wanted:
                    out[(name, p)] = (list(t.partitions[p].replicas), adding.get(p, []),
                                      removing.get(p, []))
        return out

