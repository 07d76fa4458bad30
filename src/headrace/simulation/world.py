"""The simulated cluster: ZooKeeper, network, disks, clock, brokers and clients.

Everything happens on one event heap ordered by (simulated ms, sequence number); every
random choice comes from the world's ``random.Random``. The brokers' replication decisions
are the real pure cores; what is simulated is only what carries messages in and out.

**ZooKeeper** (``SimZk``): znodes with versions, ephemeral znodes owned by a session,
conditional writes (expected version), one-shot watches fired on change (delivered to the
watcher over its link; held while the link is cut, dropped with the session), sessions that
expire ``session_timeout_ms`` after their last heartbeat (the ensemble deletes their
ephemerals and fires the watches). A broker learns that its session expired only when it
reaches ZooKeeper again (kazoo's LOST after SUSPENDED), then stops leading and fetching at
once, opens a new session, registers again (once the old registration is gone), re-reads
the state of every partition it hosts and re-arms its watches. Reads, registrations and the
controller's writes are synchronous calls that need the link up; a leader's ISR write goes
over the network (it is in flight while appends continue: issue 21's defect 1).

**Controller**: the broker holding the ephemeral ``/controller`` znode runs the pure
``replication.controller.Controller``: ``Startup`` from a full read when it wins,
``BrokerChange`` from its watch on ``/brokers/ids``, ``IsrChange`` from its watch on each
partition state znode. Its writes are fenced by the controller epoch (a deposed controller's
write is refused) and by the znode version. LeaderAndIsr goes to brokers over a reliable
channel (resent until delivered while the sender is still the controller, as Kafka's
``ControllerChannelManager``). Brokers watch only ``/controller``.

**Network**: per-connection FIFO with a random delay, reordering between connections,
random loss of requests and responses (the RPC times out and is retried), and cuts between
any two nodes (the faults cut brokers from brokers and from ZooKeeper; clients are never cut).

**Disks**: a replica's log is a list of (leader epoch, producer id, sequence) records with an
fsynced prefix. A crash keeps only the fsynced prefix (and the leader-epoch entries below
it); the high watermark comes back from its checkpoint, never above the log end. By default
(``flush_ms=0``) every append is fsynced before it counts (Kafka's ``flush.messages=1``) and
the high watermark is checkpointed with every change (``hw_checkpoint_ms=0``), so a crash
loses nothing acknowledged and the checkers need no exclusion. With ``flush_ms > 0`` the
disk flushes on an interval (Kafka's default policy: the OS flushes, acks=all relies on
replication, not fsync): a crash of every replica holding a record within one interval
loses it although it was acknowledged; such records go to ``lost`` and only the
lost-record and consumer checks skip them. A slow-disk fault makes a follower's writes
take ten ticks (and the flush interval ten times longer).

**Shell rules the simulation found necessary** (each has a ``Params`` switch that restores
the current ``cluster_node`` behaviour, and a test showing the seed it fails):
an ISR write without an answer (applied or not) stays pending until a re-read of the state
znode says which (``isr_error_drops_change``); a broker acts on a re-read naming it leader
only at an epoch this process already led or one newer than the state it read when it
started — after a restart only the controller's LeaderAndIsr, sent once it has seen the
new registration (a changed broker epoch: a failure, then a startup, as Kafka's
``bouncedBrokerIds``), makes it lead, at a new epoch (``reread_leads``). The real broker
has the same rule (``ClusterNode.may_lead``; the controller's half is
``cluster/controller.on_brokers_bounced``): it has no LeaderAndIsr, only state znodes, so
it tells the controller's decision by its zxid — a state written after the broker's
registration (its mzxid above the registration's czxid) may be led, one written before
holds the epoch it must not lead at.

**Followers** truncate before fetching with OffsetForLeaderEpoch (as the real shell) or,
chosen at random each time they start following, rely on the fetch's diverging epoch alone
(as Kafka 2.7+ followers); the leader checks every fetch with ``check_follower_fetch``.

**Clients**: one idempotent acks=all producer per partition (one request in flight,
retried with the same sequence number until acknowledged; duplicates are detected at the
leader from the log), one read_committed consumer per partition reading up to the last
stable offset and dropping aborted transactions, and one transactional producer with its
coordinator on the controller (``simulation.txn``; ``Params.transactions=False`` leaves it
out and replays the random stream of the runs before it). Clients find leaders and the
coordinator from ZooKeeper (a metadata shortcut).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from headrace.log import producer_state as ps
from headrace.log.transactions import TxnTracker
from headrace.metadata.store import PartitionState
from headrace.replication import controller as ctl
from headrace.replication import epochs as ep
from headrace.replication import leader as ld
from headrace.simulation import txn as sx
from headrace.simulation.txn import TOPIC, TXN_CLIENT, Rec

ZK = -1
CLIENT_BASE = 100


class Violation(Exception):
    def __init__(self, prop: str, detail: str) -> None:
        super().__init__(f"{prop}: {detail}")
        self.prop = prop
        self.detail = detail


@dataclass
class Params:
    brokers: int = 3
    partitions: int = 2
    rf: int = 3
    min_isr: int = 2
    tick_ms: int = 10
    session_timeout_ms: int = 600
    lag_ms: int = 300
    flush_ms: int = 0  # 0: fsync every append (flush.messages=1); else the flush interval
    hw_checkpoint_ms: int = 0  # 0: the high watermark is checkpointed with every change
    delay_ms: tuple[int, int] = (1, 8)
    loss: float = 0.01
    request_timeout_ms: int = 250
    isr_write_timeout_ms: int = 400
    fetch_batch: int = 2
    # the old cluster_node._change_isr: an ISR write that raised (no answer: applied
    # or not) is dropped with isr_failed; False: it stays pending until a re-read says
    isr_error_drops_change: bool = False
    # the current cluster_node._transition: a state re-read (after a restart or a new
    # session) naming this broker leader makes it lead at that epoch, even one this
    # process never led; False: only a LeaderAndIsr does (the controller bumps the epoch
    # of a bounced broker's partitions first)
    reread_leads: bool = False
    # the transactional client and its coordinator (see simulation.txn)
    transactions: bool = True
    txn_timeout_ms: int = 1000
    txn_last_begin_ms: int = 1000  # no transaction begins later than this after the heal
    # the coordinator's marker sender before seed 5351: a marker resent on a timer while an
    # earlier copy was still pending at the leader; False: one request per partition in
    # flight, the next only after its answer or after twice the request timeout (Kafka's
    # TransactionMarkerChannelManager: one in-flight request per broker, re-enqueued on an
    # error or a disconnect)
    marker_resend_in_flight: bool = False


# ---------------------------------------------------------------------- ZooKeeper
@dataclass
class Znode:
    data: Any
    version: int = 0
    owner: int = 0  # the session of an ephemeral znode, else 0


@dataclass
class Session:
    sid: int
    broker: int
    last_heard: int
    alive: bool = True


class SimZk:
    def __init__(self, world: World) -> None:
        self.w = world
        self.nodes: dict[str, Znode] = {}
        self.sessions: dict[int, Session] = {}
        self.live: dict[int, Session] = {}  # the sessions not expired yet
        self.watches: dict[str, list[int]] = {}
        self.next_sid = 1

    def open_session(self, broker: int) -> int:
        sid = self.next_sid
        self.next_sid += 1
        self.sessions[sid] = self.live[sid] = Session(sid, broker, self.w.now)
        return sid

    def alive(self, sid: int) -> bool:
        s = self.sessions.get(sid)
        return s is not None and s.alive

    def heartbeat(self, sid: int) -> None:
        s = self.sessions.get(sid)
        if s is not None and s.alive:
            s.last_heard = self.w.now

    def expire_due(self) -> None:
        deadline = self.w.now - self.w.p.session_timeout_ms
        for sid, s in list(self.live.items()):  # in session order
            if s.last_heard < deadline:
                self.expire(sid)

    def expire(self, sid: int) -> None:
        s = self.sessions[sid]
        if not s.alive:
            return
        s.alive = False
        del self.live[sid]
        for path in sorted(p for p, n in self.nodes.items() if n.owner == sid):
            del self.nodes[path]
            self._fire(path)
        for path in sorted(self.watches):
            self.watches[path] = [x for x in self.watches[path] if x != sid]

    def _fire(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0]
        for p in (path, parent + "/"):
            for sid in self.watches.pop(p, []):
                s = self.sessions.get(sid)
                if s is not None and s.alive:
                    self.w.deliver_watch(s.broker, sid, p)

    def watch(self, path: str, sid: int) -> None:
        lst = self.watches.setdefault(path, [])
        if sid not in lst:
            lst.append(sid)

    def get(self, path: str, sid: int = 0, watch: bool = False) -> Znode | None:
        if watch:
            self.watch(path, sid)
        return self.nodes.get(path)

    def children(self, prefix: str, sid: int = 0, watch: bool = False) -> list[str]:
        if watch:
            self.watch(prefix, sid)
        return sorted(p for p in self.nodes if p.startswith(prefix))

    def create(self, path: str, data: Any, owner: int = 0) -> bool:
        if path in self.nodes:
            return False
        self.nodes[path] = Znode(data, 0, owner)
        self._fire(path)
        return True

    def set(self, path: str, data: Any, expected: int) -> int | None:
        n = self.nodes.get(path)
        if n is None or n.version != expected:
            return None
        n.data = data
        n.version += 1
        self._fire(path)
        return n.version

    def partition_state(self, p: int) -> PartitionState | None:
        n = self.nodes.get(state_path(p))
        return None if n is None else replace(n.data, zk_version=n.version,
                                              replicas=list(n.data.replicas),
                                              isr=list(n.data.isr))


TOPICS = "/brokers/topics/"


def state_path(p: int) -> str:
    return f"/brokers/topics/{TOPIC}/partitions/{p}/state"


def part_of(path: str) -> int:
    return int(path.split("/")[5])


# ---------------------------------------------------------------------- replicas
@dataclass
class Replica:
    p: int
    log: list[Rec] = field(default_factory=list)  # see simulation.txn.Rec
    epochs: list[tuple[int, int]] = field(default_factory=list)
    hw: int = 0
    flushed: int = 0
    flushed_epochs: list[tuple[int, int]] = field(default_factory=list)
    hw_checkpoint: int = 0
    ids: dict[tuple[int, int], int] = field(default_factory=dict)  # (pid, seq) -> offset
    state: PartitionState | None = None
    core: ld.PartitionLeader | None = None
    leader: int = -1
    leader_epoch: int = -1
    truncated: bool = False
    fetch_due: int = 0  # no fetch in flight before (or until it times out)
    checked: int = 0    # log matching verified below this offset
    isr_deadline: int = 0
    led_epoch: int = -1  # the epoch this process last led at
    # the leader epoch of the state this process read first (None: not read yet)
    start_epoch: int | None = -1
    # transactions: the real tracker of the partition log, and the producer and
    # coordinator epochs of its transactional producers (from their records and markers)
    txns: TxnTracker = field(default_factory=TxnTracker)
    pepochs: dict[int, int] = field(default_factory=dict)
    cepochs: dict[int, int] = field(default_factory=dict)

    @property
    def leo(self) -> int:
        return len(self.log)

    def append(self, rec: Rec) -> int:
        o = len(self.log)
        if not self.epochs or rec[0] > self.epochs[-1][0]:
            self.epochs.append((rec[0], o))
        self.log.append(rec)
        self.ids[(rec[1], rec[2])] = o
        if rec[3] >= 0:
            self.track(o, rec)
        return o

    def track(self, o: int, rec: Rec) -> None:
        sx.track(self.txns, o, rec)
        self.pepochs[rec[1]] = rec[3]
        if rec[4] != sx.DATA:
            self.cepochs[rec[1]] = rec[5]

    def rebuild_txns(self) -> None:
        """The transaction state from the log (``PartitionLog``'s recovery)."""
        self.txns = TxnTracker()
        self.pepochs = {}
        self.cepochs = {}
        for o, rec in enumerate(self.log):
            if rec[3] >= 0:
                self.track(o, rec)

    def truncate_to(self, offset: int) -> None:
        """Kafka's ``UnifiedLog.truncateTo``: at or past the log end only the epoch cache
        loses entries starting at the log end (an epoch led here without a record)."""
        if offset >= len(self.log):
            self.epochs = [e for e in self.epochs if e[1] < len(self.log)]
            return
        for rec in self.log[offset:]:
            self.ids.pop((rec[1], rec[2]), None)
        del self.log[offset:]
        self.epochs = [e for e in self.epochs if e[1] < offset]
        self.hw = min(self.hw, offset)
        self.flushed = min(self.flushed, offset)
        self.checked = min(self.checked, offset)
        if self.pepochs:
            self.rebuild_txns()

    def assign_epoch(self, epoch: int) -> None:
        """Kafka's ``LeaderEpochFileCache.assign`` at the log end."""
        start = self.leo
        while self.epochs and (self.epochs[-1][1] >= start or self.epochs[-1][0] >= epoch):
            if self.epochs[-1][0] >= epoch:
                return
            self.epochs.pop()
        self.epochs.append((epoch, start))


# ---------------------------------------------------------------------- brokers
@dataclass
class Purgatory:
    p: int
    required: int
    client: int
    pid: int
    seq: int
    deadline: int
    pepoch: int = -1
    marker: bool = False  # a transaction marker (the client is the coordinator broker)


class Broker:
    def __init__(self, w: World, bid: int) -> None:
        self.w = w
        self.id = bid
        self.up = True
        self.paused_until = -1
        self.slow_until = -1
        self.sid = w.zk.open_session(bid)
        self.registered = False
        self.controller: ctl.Controller | None = None
        self.controller_epoch_seen = -1
        self.campaign = True
        self.replicas: dict[int, Replica] = {
            p: Replica(p) for p in range(w.p.partitions) if bid in w.assignment[p]}
        self.purgatory: list[Purgatory] = []
        self.next_flush = 0
        self.reread: set[int] = set()
        self.controller_resync = False
        self.incarnation = 0  # bumped by a crash: the process behind its connections
        self.txn: sx.TxnShell | None = None  # the transaction coordinator (on the controller)

    # ------------------------------------------------------------------ ZooKeeper link
    def zk_link(self) -> bool:
        return self.up and self.w.net.linked(self.id, ZK)

    def zk_ok(self) -> bool:
        return self.zk_link() and self.w.zk.alive(self.sid)

    def session_check(self) -> None:
        if not self.zk_link():
            return
        if self.w.zk.alive(self.sid):
            self.w.zk.heartbeat(self.sid)
            return
        self.session_lost()
        self.sid = self.w.zk.open_session(self.id)
        self.registered = False
        self.campaign = True
        self.w.zk.get("/controller", self.sid, watch=True)
        self.reread = set(self.replicas)

    def session_lost(self) -> None:
        """Fencing: stop leading and fetching at once."""
        self.w.trace(f"b{self.id} session lost")
        for r in self.replicas.values():
            self.stop_leading(r)
            r.leader = -1
        self.controller = None
        self.fail_purgatory()

    def stop_leading(self, r: Replica) -> None:
        r.core = None

    def fail_purgatory(self, p: int | None = None) -> None:
        keep = []
        for e in self.purgatory:
            if p is None or e.p == p:
                self.reply(e, "not_leader", -1)
            else:
                keep.append(e)
        self.purgatory = keep

    # ------------------------------------------------------------------ tick
    def tick(self) -> None:
        w = self.w
        self.session_check()
        if self.zk_ok():
            if not self.registered:
                self.registered = w.zk.create(f"/brokers/ids/{self.id}", self.sid, self.sid)
            if self.campaign and w.zk.get("/controller", self.sid, watch=True) is None:
                self.campaign = False
                self.try_become_controller()
            if self.registered:
                for p in sorted(self.reread):
                    st = w.zk.partition_state(p)
                    if self.replicas[p].start_epoch is None:
                        self.replicas[p].start_epoch = -1 if st is None else st.leader_epoch
                    if st is not None:
                        self.resolve_isr_change(self.replicas[p], st)
                        self.apply_state(p, st)
                self.reread.clear()
            if self.controller is not None and self.controller_resync:
                self.controller_startup()
        if w.p.transactions:
            self.txn_tick()
        now = w.now
        for r in self.replicas.values():  # built in partition order
            p = r.p
            if r.core is not None:
                if r.core.pending is not None and now >= r.isr_deadline:
                    # no answer: the write may have been applied or not
                    if w.p.isr_error_drops_change:
                        r.core.isr_failed(r.core.pending)
                    r.isr_deadline = now + w.p.isr_write_timeout_ms
                    self.reread.add(p)
                change = r.core.maybe_shrink_isr(r.leo, now, w.p.lag_ms)
                if change is not None:
                    self.send_isr_change(r, change)
            elif r.leader >= 0 and now >= r.fetch_due:
                self.send_fetch(r)
        if self.purgatory:
            self.check_purgatory()
        if now >= self.next_flush:
            for r in self.replicas.values():
                if w.p.flush_ms:
                    r.flushed = r.leo
                    r.flushed_epochs = list(r.epochs)
                r.hw_checkpoint = min(r.hw, r.flushed if w.p.flush_ms else r.leo)
            interval = w.p.flush_ms or w.p.hw_checkpoint_ms or 60
            self.next_flush = now + interval * (10 if now < self.slow_until else 1)

    # ------------------------------------------------------------------ coordinator
    def txn_tick(self) -> None:
        """The transaction coordinator runs on the controller, at its epoch."""
        c = self.controller
        if c is None:
            self.txn = None
            return
        if self.txn is None or self.txn.epoch != c.epoch:
            if not self.zk_ok():
                return
            self.txn = sx.TxnShell(self, c.epoch)
        self.txn.tick()
        if self.txn is not None and self.txn.deposed:
            self.controller = None  # ControllerMovedException
            self.txn = None

    # ------------------------------------------------------------------ controller
    def try_become_controller(self) -> None:
        zk = self.w.zk
        if not zk.create("/controller", self.id, self.sid):
            return
        n = zk.get("/controller_epoch")
        assert n is not None
        epoch = n.data + 1
        zk.set("/controller_epoch", epoch, n.version)
        self.controller = ctl.Controller(epoch)
        self.w.trace(f"b{self.id} controller epoch {epoch}")
        self.controller_startup()

    def controller_startup(self) -> None:
        assert self.controller is not None
        self.controller_resync = False
        zk = self.w.zk
        states: dict[ctl.TP, PartitionState] = {}
        zk.children(TOPICS, self.sid, watch=True)
        if zk.get(TOPICS + TOPIC) is not None:
            for p in range(self.w.p.partitions):
                st = zk.partition_state(p)
                zk.watch(state_path(p), self.sid)
                states[(TOPIC, p)] = st if st is not None else PartitionState(
                    list(self.w.assignment[p]), -1, -1, [], -1, -1, -1)
        c = ctl.Controller(self.controller.epoch)
        self.controller = c
        c.enqueue(ctl.Startup(states, self.live_brokers()))
        self.run_controller()

    def live_brokers(self) -> dict[int, int]:
        zk = self.w.zk
        out = {}
        for path in zk.children("/brokers/ids/", self.sid, watch=True):
            n = zk.nodes[path]
            out[int(path.rsplit("/", 1)[1])] = n.owner
        return out

    def controller_event(self, path: str) -> None:
        c = self.controller
        if c is None:
            return
        if not self.zk_ok():
            self.controller_resync = True
            return
        if path == "/brokers/ids/":
            c.enqueue(ctl.BrokerChange(self.live_brokers()))
        elif path == TOPICS:
            self.w.zk.children(TOPICS, self.sid, watch=True)
            n = self.w.zk.get(TOPICS + TOPIC)
            if n is not None and (TOPIC, 0) not in c.states:
                for p in range(self.w.p.partitions):
                    self.w.zk.watch(state_path(p), self.sid)
                c.enqueue(ctl.TopicCreated(TOPIC, n.data))
        elif path.endswith("/state"):
            p = part_of(path)
            self.w.zk.watch(path, self.sid)
            st = self.w.zk.partition_state(p)
            if st is not None:
                c.enqueue(ctl.IsrChange((TOPIC, p), st))
        self.run_controller()

    def run_controller(self) -> None:
        c = self.controller
        zk = self.w.zk
        while c is not None and c.queue:
            for eff in c.run():
                if isinstance(eff, ctl.LeaderAndIsr):
                    self.w.send_reliable(self.id, eff.broker, c.epoch, c.live[eff.broker],
                                         ("leader_and_isr", eff.tp[1], eff.state, c.epoch))
                    continue
                if not isinstance(eff, ctl.WriteState):  # the model has one fixed topic
                    raise AssertionError(f"not simulated (reassignment, deletion): {eff}")
                if not self.zk_ok():
                    self.controller_resync = True
                    return
                p = eff.tp[1]
                epoch_node = zk.get("/controller_epoch")
                if epoch_node is None or epoch_node.data != eff.controller_epoch:
                    self.controller = None  # deposed: ControllerMovedException
                    return
                path = state_path(p)
                if eff.expected_version < 0:
                    ok = zk.create(path, replace(eff.state, zk_version=-1))
                    version = 0 if ok else None
                else:
                    version = zk.set(path, replace(eff.state, zk_version=-1),
                                     eff.expected_version)
                zk.watch(path, self.sid)
                if version is None:
                    c.enqueue(ctl.WriteRefused(eff.tp, zk.partition_state(p)))
                else:
                    self.w.trace(f"b{self.id} ctl wrote p{p} {eff.why}: leader "
                                 f"{eff.state.leader} epoch {eff.state.leader_epoch} "
                                 f"isr {eff.state.isr}")
                    c.enqueue(ctl.StateWritten(eff.tp, replace(eff.state, zk_version=version)))

    def watch_fired(self, sid: int, path: str) -> None:
        if sid != self.sid:
            return
        if path == "/controller":
            n = self.w.zk.get("/controller", self.sid, watch=True) if self.zk_ok() else None
            if n is None:
                if self.controller is not None and self.zk_ok():
                    self.controller = None
                self.campaign = True
            return
        self.controller_event(path)

    # ------------------------------------------------------------------ partition state
    def apply_state(self, p: int, st: PartitionState, controller_epoch: int = -1) -> None:
        """LeaderAndIsr (or a re-read): become leader or follower at a newer epoch, or take
        a newer ISR at the same epoch."""
        if p not in self.replicas:
            return
        if controller_epoch >= 0:
            if controller_epoch < self.controller_epoch_seen:
                return  # a deposed controller's request
            self.controller_epoch_seen = controller_epoch
        r = self.replicas[p]
        if (controller_epoch < 0 and st.leader == self.id and r.led_epoch != st.leader_epoch
                and st.leader_epoch <= (r.start_epoch if r.start_epoch is not None else -1)
                and not self.w.p.reread_leads):
            # a re-read naming this broker leader at an epoch this process never led and
            # not newer than the state it read when it started (an earlier process of
            # this broker may have led it; its log may be shorter): only the controller,
            # once it has seen this broker's new registration, makes it lead (at a new
            # epoch). The rule of the real ClusterNode.may_lead
            return
        old = r.state
        leading = r.core is not None
        if old is not None:
            if st.leader_epoch < old.leader_epoch:
                return
            acting = ((st.leader == self.id and leading)
                      or (st.leader != self.id and not leading
                          and (st.leader < 0 or r.leader == st.leader)))
            if st.leader_epoch == old.leader_epoch and st.zk_version <= old.zk_version \
                    and acting:
                return
        new_epoch = old is None or st.leader_epoch != old.leader_epoch
        r.state = st
        now = self.w.now
        if st.leader == self.id:
            if not leading or new_epoch:
                r.assign_epoch(st.leader_epoch)
                r.core = ld.PartitionLeader(self.id, st.leader_epoch, st.replicas, st.isr,
                                            r.leo, r.hw, now)
                r.led_epoch = st.leader_epoch
                self.w.became_leader(self.id, p, st.leader_epoch)
                r.leader = -1
                r.core.maybe_increment_high_watermark(r.leo)
                self.w.observe_hw(self, r)
            elif r.core is not None:
                # a newer state at this epoch settles a pending ISR change (ours if it lists
                # that ISR: its answer may be lost), else the state's ISR is taken (the
                # controller decided): Partition.update_state's rule
                core = r.core
                change = core.pending
                if change is not None and tuple(st.isr) == change.isr:
                    core.isr_committed(change, r.leo, now)
                    self.w.trace(f"b{self.id} p{p} isr -> {list(change.isr)} (found applied)")
                else:
                    if change is not None:
                        core.isr_failed(change)
                    if tuple(st.isr) != core.isr:
                        core.set_isr(st.isr, r.leo, now)
                self.w.observe_hw(self, r)
                self.check_purgatory()
            return
        if leading:
            self.stop_leading(r)
            self.fail_purgatory(p)
        if st.leader < 0:
            r.leader = -1
            return
        if new_epoch or r.leader != st.leader:
            r.leader = st.leader
            r.leader_epoch = st.leader_epoch
            # Half the time the follower truncates first with OffsetForLeaderEpoch (the
            # real shell, KIP-101/279), else it relies on the fetch's diverging epoch alone
            # (Kafka 2.7+ followers, KIP-320 / KAFKA-10554): both must be safe.
            r.truncated = self.w.rng.random() < 0.5
            r.fetch_due = now

    # ------------------------------------------------------------------ leader side
    def send_isr_change(self, r: Replica, change: ld.IsrChange) -> None:
        assert r.state is not None
        r.isr_deadline = self.w.now + self.w.p.isr_write_timeout_ms
        new = replace(r.state, isr=list(change.isr), replicas=list(r.state.replicas))
        self.w.send(self.id, ZK, ("isr_write", r.p, new, r.state.zk_version, self.sid,
                                  change))

    def resolve_isr_change(self, r: Replica, st: PartitionState) -> None:
        """An ISR write whose answer never came: the re-read state says whether it was
        applied (the same leader epoch with exactly its ISR, at a newer version) or not.
        Until then the change stays pending: the joiner keeps counting in the high
        watermark (it may be in the ISR in ZooKeeper already)."""
        core = r.core
        if core is None or core.pending is None or r.state is None:
            return
        change = core.pending
        if (st.leader == self.id and st.leader_epoch == core.leader_epoch
                and st.zk_version > r.state.zk_version and list(st.isr) == list(change.isr)):
            r.state = st
            core.isr_committed(change, r.leo, self.w.now)
            self.w.trace(f"b{self.id} p{r.p} isr -> {list(change.isr)} (found applied)")
            self.w.observe_hw(self, r)
            self.check_purgatory()
        else:
            core.isr_failed(change)

    def isr_write_resp(self, p: int, version: int | None, change: ld.IsrChange) -> None:
        r = self.replicas[p]
        core = r.core
        if core is None or core.pending is not change:
            return
        if version is None:
            core.isr_failed(change)
            self.reread.add(p)
            return
        assert r.state is not None
        r.state = replace(r.state, isr=list(change.isr), zk_version=version)
        core.isr_committed(change, r.leo, self.w.now)
        self.w.trace(f"b{self.id} p{p} isr -> {list(change.isr)} ({change.reason})")
        self.w.observe_hw(self, r)
        self.check_purgatory()

    def leads(self, p: int, epoch: int) -> Replica | None:
        r = self.replicas.get(p)
        if r is None or r.core is None:
            return None
        if epoch >= 0 and r.core.leader_epoch != epoch:
            return None
        return r

    def handle(self, src: int, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        w = self.w
        if kind == "leader_and_isr":
            self.apply_state(msg[1], msg[2], msg[3])
        elif kind == "isr_write_resp":
            self.isr_write_resp(msg[1], msg[2], msg[3])
        elif kind == "ofle":
            _, p, cur_epoch, epoch = msg
            r = self.leads(p, cur_epoch)
            ans = None if r is None else ep.end_offset_for_epoch(r.epochs, epoch, r.leo)
            w.send(self.id, src, ("ofle_resp", p, cur_epoch, epoch, ans))
        elif kind == "ofle_resp":
            self.ofle_resp(src, msg[1], msg[2], msg[3], msg[4])
        elif kind == "fetch":
            self.serve_fetch(src, *msg[1:])
        elif kind == "fetch_resp":
            self.fetch_resp(src, *msg[1:])
        elif kind == "produce":
            self.produce(src, *msg[1:])
        elif kind == "consume":
            _, p, offset = msg
            r = self.leads(p, -1)
            if r is None:
                w.send(self.id, src, ("consume_resp", p, offset, None, []))
            else:
                end = min(self.fetch_end(r), offset + 4)
                aborted = [(a.producer_id, a.first_offset)
                           for a in r.txns.aborted_in(offset, end)] if end > offset else []
                w.send(self.id, src, ("consume_resp", p, offset, r.log[offset:end], aborted))
        elif kind == "txn_marker":
            self.write_marker(src, *msg[1:])
        elif kind == "marker_resp":
            if self.txn is not None:
                self.txn.marker_resp(*msg[1:])
        elif kind == "txn_req":
            if self.txn is None:
                w.send(self.id, src, ("txn_resp", msg[1], "not_coordinator", -1, -1))
            else:
                self.txn.request(src, *msg[1:])

    def fetch_end(self, r: Replica) -> int:
        """Where a read_committed consumer's read ends: the last stable offset."""
        return self.w.observe_lso(self, r)

    def write_marker(self, src: int, p: int, pid: int, pepoch: int, commit: bool,
                     coordinator_epoch: int, nonce: int) -> None:
        """WriteTxnMarkers at the leader: Kafka's ``appendEndTxnMarker`` checks (an older
        producer epoch or coordinator epoch is fenced), then an acks=all append."""
        w = self.w
        r = self.leads(p, -1)
        if r is None or r.core is None:
            w.send(self.id, src, ("marker_resp", p, pid, pepoch, "not_leader", nonce))
            return
        if ps.marker_refusal(r.pepochs.get(pid, -1), r.cepochs.get(pid, -1), pepoch,
                             coordinator_epoch) is not None:  # the broker's own rule
            w.send(self.id, src, ("marker_resp", p, pid, pepoch, "fenced", nonce))
            return
        if len(r.core.isr) < w.p.min_isr:
            w.send(self.id, src, ("marker_resp", p, pid, pepoch, "not_enough_replicas",
                                  nonce))
            return
        ctrl = sx.COMMIT_MARKER if commit else sx.ABORT_MARKER
        o = r.append((r.core.leader_epoch, pid, -1 - r.leo, pepoch, ctrl, coordinator_epoch))
        w.trace(f"b{self.id} p{p} marker {'commit' if commit else 'abort'} at {o}")
        if r.core.maybe_increment_high_watermark(r.leo):
            w.observe_hw(self, r)
        # a marker's entry carries its job's nonce where a produce carries its sequence
        self.purgatory.append(Purgatory(p, o + 1, src, pid, nonce,
                                        w.now + w.p.request_timeout_ms, pepoch, True))
        self.check_purgatory()

    def reply(self, e: Purgatory, code: str, offset: int) -> None:
        if e.marker:
            self.w.send(self.id, e.client, ("marker_resp", e.p, e.pid, e.pepoch, code, e.seq))
        else:
            self.w.send(self.id, e.client, ("produce_resp", e.p, e.pid, e.seq, code, offset))

    def serve_fetch(self, src: int, p: int, cur_epoch: int, fetch_offset: int,
                    last_epoch: int) -> None:
        w = self.w
        r = self.leads(p, cur_epoch)
        if r is None or r.core is None:
            w.send(self.id, src, ("fetch_resp", p, cur_epoch, fetch_offset, "fenced", None, 0))
            return
        check = ld.check_follower_fetch(r.epochs, 0, r.leo, last_epoch, fetch_offset)
        if check.check is ld.FollowerFetchCheck.DIVERGING:
            w.send(self.id, src, ("fetch_resp", p, cur_epoch, fetch_offset, "diverging",
                                  check.diverging, r.core.high_watermark))
            return
        if check.check is ld.FollowerFetchCheck.OUT_OF_RANGE:
            w.send(self.id, src, ("fetch_resp", p, cur_epoch, fetch_offset, "out_of_range",
                                  None, r.core.high_watermark))
            return
        records = r.log[fetch_offset:fetch_offset + w.p.fetch_batch]
        moved = r.core.follower_fetched(src, fetch_offset, r.leo, w.now)
        if moved:
            w.observe_hw(self, r)
            self.check_purgatory()
        eligible = w.zk.get(f"/brokers/ids/{src}") is not None if self.zk_ok() else False
        change = r.core.maybe_expand_isr(src, eligible)
        if change is not None:
            self.send_isr_change(r, change)
        w.send(self.id, src, ("fetch_resp", p, cur_epoch, fetch_offset, "ok", records,
                              r.core.high_watermark))

    def produce(self, src: int, p: int, pid: int, seq: int, pepoch: int = -1) -> None:
        w = self.w
        r = self.leads(p, -1)
        if r is None or r.core is None:
            w.send(self.id, src, ("produce_resp", p, pid, seq, "not_leader", -1))
            return
        if pepoch >= 0 and pepoch < r.pepochs.get(pid, -1):
            w.send(self.id, src, ("produce_resp", p, pid, seq, "fenced", -1))
            return
        o = r.ids.get((pid, seq))
        if o is None:
            if len(r.core.isr) < w.p.min_isr:
                w.send(self.id, src, ("produce_resp", p, pid, seq, "not_enough_replicas", -1))
                return
            o = r.append((r.core.leader_epoch, pid, seq, pepoch, sx.DATA, -1))
            if r.core.maybe_increment_high_watermark(r.leo):
                w.observe_hw(self, r)
        self.purgatory.append(Purgatory(p, o + 1, src, pid, seq,
                                        w.now + w.p.request_timeout_ms, pepoch))
        self.check_purgatory()

    def check_purgatory(self) -> None:
        keep = []
        for e in self.purgatory:
            r = self.leads(e.p, -1)
            if r is None or r.core is None:
                self.reply(e, "not_leader", -1)
                continue
            res = r.core.acks_all(e.required, self.w.p.min_isr)
            if res is ld.AcksAll.DONE:
                if not e.marker:
                    self.w.acked(self.id, e.p, e.pid, e.seq, e.required - 1)
                self.reply(e, "ok", e.required - 1)
            elif res is ld.AcksAll.NOT_ENOUGH_REPLICAS:
                self.reply(e, "not_enough_replicas_after_append", -1)
            elif self.w.now >= e.deadline:
                self.reply(e, "timeout", -1)
            else:
                keep.append(e)
        self.purgatory = keep

    # ------------------------------------------------------------------ follower side
    def send_fetch(self, r: Replica) -> None:
        w = self.w
        r.fetch_due = w.now + w.p.request_timeout_ms
        if not r.truncated:
            latest = ep.latest_epoch(r.epochs)
            if latest < 0:
                r.truncated = True
            else:
                w.send(self.id, r.leader, ("ofle", r.p, r.leader_epoch, latest))
                return
        w.send(self.id, r.leader, ("fetch", r.p, r.leader_epoch, r.leo,
                                   ep.latest_epoch(r.epochs)))

    def _following(self, p: int, src: int, epoch: int) -> Replica | None:
        r = self.replicas.get(p)
        if r is None or r.core is not None or r.leader != src or r.leader_epoch != epoch:
            return None
        return r

    def ofle_resp(self, src: int, p: int, cur_epoch: int, asked: int, ans: tuple[int, int] | None
                  ) -> None:
        r = self._following(p, src, cur_epoch)
        if r is None or r.truncated:
            return
        w = self.w
        if ans is None:
            r.fetch_due = w.now + 5 * w.p.tick_ms
            return
        if ep.latest_epoch(r.epochs) != asked:
            r.fetch_due = w.now
            return
        t = ep.truncation(r.epochs, r.leo, r.hw, ans[0], ans[1])
        self.truncate(r, t.offset, f"OffsetForLeaderEpoch {ans}")
        r.truncated = t.complete
        r.fetch_due = w.now

    def truncate(self, r: Replica, offset: int, why: str) -> None:
        if offset < r.leo:
            self.w.trace(f"b{self.id} p{r.p} truncate {r.leo} -> {offset} ({why})")
        r.truncate_to(offset)

    def fetch_resp(self, src: int, p: int, cur_epoch: int, fetch_offset: int, code: str,
                   payload: Any, hw: int) -> None:
        r = self._following(p, src, cur_epoch)
        w = self.w
        if r is None:
            return
        if code == "fenced" or code == "out_of_range":
            r.fetch_due = w.now + 5 * w.p.tick_ms
            return
        if r.leo != fetch_offset:
            r.fetch_due = w.now
            return
        if code == "diverging":
            t = ep.truncation(r.epochs, r.leo, r.hw, payload[0], payload[1])
            self.truncate(r, t.offset, f"diverging epoch {payload}")
            r.truncated = t.complete
            r.fetch_due = w.now
            return
        for rec in payload:
            r.append(rec)
        new_hw = min(hw, r.leo)
        if new_hw > r.hw:
            r.hw = new_hw
            w.check_replica(self, r)
        r.fetch_due = w.now if payload else w.now + w.p.tick_ms
        if payload and w.now < self.slow_until:
            r.fetch_due = w.now + 10 * w.p.tick_ms  # a slow disk: the write takes long

    # ------------------------------------------------------------------ crash
    def crash(self) -> None:
        """Lose what was not fsynced; forget every role (a new process)."""
        self.up = False
        self.incarnation += 1
        self.controller = None
        self.txn = None
        self.purgatory = []
        for r in self.replicas.values():
            if self.w.p.flush_ms == 0:
                r.flushed, r.flushed_epochs = r.leo, list(r.epochs)
            if self.w.p.hw_checkpoint_ms == 0:
                r.hw_checkpoint = r.hw
            lost = r.log[r.flushed:]
            r.truncate_to(r.flushed)
            r.rebuild_txns()  # recovery: the transaction index from the log
            r.epochs = [e for e in r.flushed_epochs if e[1] < r.leo]
            r.hw = min(r.hw_checkpoint, r.leo)
            r.checked = min(r.checked, r.hw)
            r.core = None
            r.state = None
            r.leader = -1
            r.led_epoch = -1
            r.start_epoch = None
            self.w.lost_in_crash(r.p, lost)

    def restart(self) -> None:
        self.up = True
        self.sid = self.w.zk.open_session(self.id)
        self.registered = False
        self.campaign = True
        self.controller_resync = False
        self.reread = set(self.replicas)
        self.next_flush = self.w.now


# ---------------------------------------------------------------------- network
class Network:
    """Cuts between pairs of nodes (counted: overlapping faults heal independently) and
    the last delivery time per connection (FIFO within a connection)."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.cuts: dict[tuple[int, int], int] = {}
        self.last: dict[tuple[int, int], int] = {}

    def linked(self, a: int, b: int) -> bool:
        if not self.cuts:
            return True
        return (min(a, b), max(a, b)) not in self.cuts

    def cut(self, a: int, b: int, delta: int) -> None:
        k = (min(a, b), max(a, b))
        n = self.cuts.get(k, 0) + delta
        if n:
            self.cuts[k] = n
        else:
            del self.cuts[k]  # only cut links are kept


# ---------------------------------------------------------------------- clients
@dataclass
class Producer:
    pid: int
    p: int
    seq: int = 0
    due: int = 0
    acked_at: list[int] = field(default_factory=list)


@dataclass
class Consumer:
    p: int
    offset: int = 0
    due: int = 0


# ---------------------------------------------------------------------- the world
class World:
    def __init__(self, seed: int, params: Params, faults: list[Any],
                 tracing: bool = False) -> None:
        self.p = params
        self.rng = random.Random(seed)
        self.now = 0
        self.heap: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self.seq = 0
        self.tracing = tracing
        self.log_lines: list[str] = []
        self.zk = SimZk(self)
        self.zk.nodes["/controller_epoch"] = Znode(0)
        self.zk.nodes[sx.PRODUCER_ID_BLOCK] = Znode(sx.FIRST_PRODUCER_ID)
        self.net = Network(self)
        n = params.brokers
        self.assignment = [[(p + j) % n for j in range(params.rf)]
                           for p in range(params.partitions)]
        self.brokers = [Broker(self, b) for b in range(n)]
        self.producers = [Producer(CLIENT_BASE + p, p) for p in range(params.partitions)]
        self.consumers = [Consumer(p) for p in range(params.partitions)]
        self.txn_client = sx.TxnClient(self) if params.transactions else None
        # checker state
        self.committed: list[list[Rec]] = [[] for _ in range(params.partitions)]
        self.committed_ids: list[dict[tuple[int, int], int]] = [
            {} for _ in range(params.partitions)]
        self.acks: list[tuple[int, int, int, int]] = []  # (p, pid, seq, offset)
        self.acked_ids: set[tuple[int, int, int]] = set()
        self.seen: list[tuple[int, int, Rec]] = []
        self.lost: set[tuple[int, int, int]] = set()  # (p, pid, seq) lost by crashes
        self.epoch_leaders: dict[tuple[int, int], int] = {}
        self.epoch_hw: dict[tuple[int, int], int] = {}
        self.faults = faults
        self.heal_ms = 0
        self.steps = 0
        self.isr_full_at: dict[int, int] = {}
        # transactions (ghost state): record -> transaction, the open one per
        # transactional id, each decided transaction's outcome (True: commit)
        self.txn_of: dict[tuple[int, int, int], int] = {}  # (p, pid, seq) -> transaction
        self.txn_records: list[list[tuple[int, int, int]]] = []  # transaction -> records
        self.marker_jobs = 0  # marker jobs numbered (their responses carry the number)
        self.txn_open: dict[str, int] = {}
        self.txn_outcome: dict[int, bool] = {}
        self.epoch_lso: dict[tuple[int, int], int] = {}
        for b in self.brokers:
            self.at(0, self.broker_tick, b)
        self.at(100, self.create_topic)
        self.at(200, self.client_tick)
        for f in faults:
            self.at(f.at_ms, self.inject, f)
            self.heal_ms = max(self.heal_ms, f.at_ms + f.duration_ms)

    # ------------------------------------------------------------------ events
    def at(self, t: int, fn: Callable[..., None], *args: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn, args))

    def trace(self, line: str) -> None:
        if self.tracing:
            self.log_lines.append(f"{self.now:6d} {line}")

    def run_until(self, t_end: int) -> None:
        while self.heap and self.heap[0][0] <= t_end:
            t, _, fn, args = heapq.heappop(self.heap)
            self.now = t
            fn(*args)
            self.steps += 1
        self.now = t_end

    def broker_tick(self, b: Broker) -> None:
        self.zk.expire_due()
        if b.up and self.now >= b.paused_until:
            b.tick()
        jitter = self.rng.randrange(3)
        self.at(self.now + self.p.tick_ms + jitter, self.broker_tick, b)

    # ------------------------------------------------------------------ network
    def send(self, src: int, dst: int, msg: tuple[Any, ...]) -> None:
        if not self.net.linked(src, dst) or self.rng.random() < self.p.loss:
            return
        lo, hi = self.p.delay_ms
        t = max(self.now + self.rng.randint(lo, hi), self.net.last.get((src, dst), 0))
        self.net.last[(src, dst)] = t
        self.at(t, self.deliver, src, dst, msg, self.incarnations(src, dst))

    def incarnations(self, src: int, dst: int) -> tuple[int, int]:
        """The processes at both ends of a connection: a message in flight when either
        end crashed is lost with its TCP connection (no answer reaches the next process)."""
        n = len(self.brokers)
        return (self.brokers[src].incarnation if 0 <= src < n else 0,
                self.brokers[dst].incarnation if 0 <= dst < n else 0)

    def send_reliable(self, src: int, dst: int, ctl_epoch: int, dst_sid: int,
                      msg: tuple[Any, ...]) -> None:
        """The controller's channel: resent until delivered while ``src`` still controls
        at ``ctl_epoch`` and ``dst`` is still the process registered with session
        ``dst_sid`` (its broker epoch: a restarted broker rejects a request meant for its
        previous life, KIP-380)."""
        b = self.brokers[src]
        if not b.up or b.controller is None or b.controller.epoch != ctl_epoch:
            return
        if self.brokers[dst].sid != dst_sid:
            return
        if not self.net.linked(src, dst) or not self.brokers[dst].up:
            self.at(self.now + 50, self.send_reliable, src, dst, ctl_epoch, dst_sid, msg)
            return
        lo, hi = self.p.delay_ms
        t = max(self.now + self.rng.randint(lo, hi), self.net.last.get((src, dst), 0))
        self.net.last[(src, dst)] = t
        self.at(t, self.deliver_reliable, src, dst, dst_sid, msg)

    def deliver_reliable(self, src: int, dst: int, dst_sid: int, msg: tuple[Any, ...]) -> None:
        if self.brokers[dst].sid != dst_sid:
            return
        if not self.net.linked(src, dst):  # cut in flight: the send thread retries
            self.send_reliable(src, dst, msg[3], dst_sid, msg)
            return
        b = self.brokers[dst]
        if b.up and self.now < b.paused_until:  # read once it runs again (or retried)
            self.at(b.paused_until, self.deliver_reliable, src, dst, dst_sid, msg)
            return
        self.deliver(src, dst, msg, self.incarnations(src, dst))

    def deliver(self, src: int, dst: int, msg: tuple[Any, ...], incs: tuple[int, int]
                ) -> None:
        if not self.net.linked(src, dst) or incs != self.incarnations(src, dst):
            return
        if dst == ZK:
            self.zk_request(src, msg)
        elif dst >= CLIENT_BASE:
            if dst == TXN_CLIENT:
                self.txn_client_msg(msg)
            else:
                self.client_msg(msg)
        else:
            b = self.brokers[dst]
            if not b.up:
                return
            if self.now < b.paused_until:
                self.at(b.paused_until, self.deliver, src, dst, msg, incs)
                return
            b.handle(src, msg)

    def deliver_watch(self, broker: int, sid: int, path: str) -> None:
        self.at(self.now + self.rng.randint(*self.p.delay_ms), self._watch, broker, sid, path)

    def _watch(self, broker: int, sid: int, path: str) -> None:
        b = self.brokers[broker]
        if not self.zk.alive(sid) or b.sid != sid or not b.up:
            return
        if not self.net.linked(broker, ZK) or self.now < b.paused_until:
            self.at(self.now + 20, self._watch, broker, sid, path)  # held until reconnect
            return
        b.watch_fired(sid, path)

    def zk_request(self, src: int, msg: tuple[Any, ...]) -> None:
        _, p, new, expected, sid, change = msg
        version = None
        if self.zk.alive(sid):
            version = self.zk.set(state_path(p), replace(new, zk_version=-1), expected)
        self.send(ZK, src, ("isr_write_resp", p, version, change))

    def create_topic(self) -> None:
        """The admin's write of the assignment znode (the controller's watch takes it)."""
        self.zk.create(TOPICS + TOPIC, tuple(tuple(a) for a in self.assignment))

    # ------------------------------------------------------------------ clients
    def leader_of(self, p: int) -> int:
        n = self.zk.nodes.get(state_path(p))  # read only: no copy of the state
        return -1 if n is None else int(n.data.leader)

    def client_tick(self) -> None:
        if self.now > self.heal_ms:
            for p in range(self.p.partitions):
                if p not in self.isr_full_at:
                    st = self.zk.partition_state(p)
                    b = self.brokers[st.leader] if st is not None and st.leader >= 0 else None
                    core = b.replicas[p].core if b is not None and b.up else None
                    if core is not None and len(core.isr) == len(self.assignment[p]):
                        self.isr_full_at[p] = self.now
        for pr in self.producers:
            if self.now >= pr.due:
                leader = self.leader_of(pr.p)
                pr.due = self.now + self.p.request_timeout_ms + 50
                if leader >= 0:
                    self.send(pr.pid, leader, ("produce", pr.p, pr.pid, pr.seq))
        if self.txn_client is not None:
            self.txn_client.tick()
        for c in self.consumers:
            if self.now >= c.due:
                leader = self.leader_of(c.p)
                c.due = self.now + self.p.request_timeout_ms
                if leader >= 0:
                    self.send(CLIENT_BASE + 50 + c.p, leader, ("consume", c.p, c.offset))
        self.at(self.now + self.p.tick_ms, self.client_tick)

    def client_msg(self, msg: tuple[Any, ...]) -> None:
        if msg[0] == "produce_resp":
            _, p, _pid, seq, code, _offset = msg
            pr = self.producers[p]
            if seq != pr.seq:
                return
            if code == "ok":
                pr.seq += 1
                pr.acked_at.append(self.now)
                pr.due = self.now + self.rng.randint(0, 3 * self.p.tick_ms)
            else:
                pr.due = self.now + self.p.tick_ms * 3
        elif msg[0] == "consume_resp":
            _, p, offset, records, aborted = msg
            c = self.consumers[p]
            if records is None or offset != c.offset:
                c.due = self.now + self.p.tick_ms * 3
                return
            sx.consume_response(self, p, offset, records, aborted)
            c.offset += len(records)
            c.due = self.now + (0 if records else self.p.tick_ms * 3)

    def txn_client_msg(self, msg: tuple[Any, ...]) -> None:
        tc = self.txn_client
        assert tc is not None
        if msg[0] == "produce_resp":
            tc.produce_resp(msg[1], msg[3], msg[4])
        elif msg[0] == "txn_resp":
            tc.txn_resp(*msg[1:])

    # ------------------------------------------------------------------ transactions
    def new_marker_job(self) -> int:
        """A number for a coordinator's marker job, unique in this world."""
        self.marker_jobs += 1
        return self.marker_jobs

    def new_txn(self) -> int:
        self.txn_records.append([])
        return len(self.txn_records) - 1

    def txn_record(self, k: int, p: int, pid: int, seq: int) -> None:
        key = (p, pid, seq)
        if key not in self.txn_of:
            self.txn_of[key] = k
            self.txn_records[k].append(key)

    def txn_opened(self, tid: str, k: int) -> None:
        self.trace(f"txn {k} open")
        self.txn_open[tid] = k

    def txn_decided(self, tid: str, commit: bool) -> None:
        k = self.txn_open.pop(tid, None)
        if k is not None:
            self.trace(f"txn {k} {'commit' if commit else 'abort'}")
            self.txn_outcome[k] = commit

    def returned_txn_record(self, p: int, offset: int, rec: Rec) -> None:
        k = self.txn_of.get((p, rec[1], rec[2]))
        outcome = None if k is None else self.txn_outcome.get(k)
        if outcome is not True:
            what = "an aborted" if outcome is False else "an open transaction's"
            raise Violation("read_committed returns committed transactions only",
                            f"a read_committed consumer returned {what} record {rec} "
                            f"(transaction {k}) at partition {p} offset {offset}")

    def observe_lso(self, b: Broker, r: Replica) -> int:
        """The leader's last stable offset: never above the high watermark, never back
        within a leader epoch."""
        core = r.core
        assert core is not None
        lso = r.txns.last_stable_offset(core.high_watermark)
        if lso > core.high_watermark:
            raise Violation("last stable offset below the high watermark",
                            f"partition {r.p}: broker {b.id}'s last stable offset {lso} > "
                            f"its high watermark {core.high_watermark}")
        key = (r.p, core.leader_epoch)
        prev = self.epoch_lso.get(key, -1)
        if lso < prev:
            raise Violation("last stable offset monotonic",
                            f"partition {r.p} epoch {core.leader_epoch}: broker {b.id}'s "
                            f"last stable offset {lso} < {prev}")
        self.epoch_lso[key] = lso
        return lso

    # ------------------------------------------------------------------ faults
    def inject(self, f: Any) -> None:
        self.trace(f"FAULT {f.describe()}")
        f.apply(self)

    # ------------------------------------------------------------------ checkers
    def became_leader(self, b: int, p: int, epoch: int) -> None:
        self.trace(f"b{b} leads p{p} epoch {epoch}")
        other = self.epoch_leaders.setdefault((p, epoch), b)
        if other != b:
            raise Violation("one leader per epoch",
                            f"partition {p} epoch {epoch} led by brokers {other} and {b}")

    def observe_hw(self, b: Broker, r: Replica) -> None:
        core = r.core
        assert core is not None
        r.hw = max(r.hw, core.high_watermark)
        key = (r.p, core.leader_epoch)
        prev = self.epoch_hw.get(key, -1)
        if core.high_watermark < prev:
            raise Violation("high watermark monotonic",
                            f"partition {r.p} epoch {core.leader_epoch}: broker {b.id}'s high "
                            f"watermark {core.high_watermark} < {prev}")
        self.epoch_hw[key] = core.high_watermark
        self.check_replica(b, r)

    def check_replica(self, b: Broker, r: Replica) -> None:
        """Log matching: every replica's records below its high watermark are the
        committed ones (the first replica to commit an offset defines it)."""
        com = self.committed[r.p]
        top = min(r.hw, r.leo)
        for o in range(r.checked, top):
            rec = r.log[o]
            if o < len(com):
                if com[o] != rec:
                    old = com[o]
                    if (r.p, old[1], old[2]) in self.lost:
                        com[o] = rec
                        self.committed_ids[r.p].pop((old[1], old[2]), None)
                        self.committed_ids[r.p][(rec[1], rec[2])] = o
                        continue
                    raise Violation("log matching",
                                    f"partition {r.p} offset {o}: broker {b.id} has {rec} "
                                    f"below its high watermark {r.hw}, committed was {old}")
            else:
                key = (rec[1], rec[2])
                if key in self.committed_ids[r.p]:
                    raise Violation("no duplicate", f"partition {r.p}: producer {rec[1]} "
                                    f"sequence {rec[2]} committed twice (offset {o} and "
                                    f"{self.committed_ids[r.p][key]})")
                self.committed_ids[r.p][key] = o
                com.append(rec)
        r.checked = max(r.checked, top)

    def acked(self, b: int, p: int, pid: int, seq: int, offset: int) -> None:
        com = self.committed[p]
        rec = com[offset] if offset < len(com) else None
        if rec is None or (rec[1], rec[2]) != (pid, seq):
            raise Violation("acknowledged record committed",
                            f"broker {b} acknowledged ({pid},{seq}) at partition {p} offset "
                            f"{offset}, but the committed record there is {rec}")
        if (p, pid, seq) not in self.acked_ids:
            self.acked_ids.add((p, pid, seq))
            self.acks.append((p, pid, seq, offset))

    def consumed(self, p: int, offset: int, rec: Rec) -> None:
        com = self.committed[p]
        if offset >= len(com) or com[offset] != rec:
            there = com[offset] if offset < len(com) else None
            raise Violation("consumer read committed",
                            f"a consumer read {rec} at partition {p} offset {offset}, the "
                            f"committed record there is {there}")
        self.seen.append((p, offset, rec))

    def lost_in_crash(self, p: int, lost: list[Rec]) -> None:
        for rec in lost:
            if not any(b.up and p in b.replicas and (rec[1], rec[2]) in b.replicas[p].ids
                       for b in self.brokers):
                self.lost.add((p, rec[1], rec[2]))

    def final_check(self) -> None:
        settle = self.p.session_timeout_ms + 2500
        for pr in self.producers:
            after = [t for t in pr.acked_at if t > self.heal_ms]
            if not after or after[0] > self.heal_ms + settle:
                raise Violation("liveness",
                                f"partition {pr.p} not writable within {settle} ms of the "
                                f"last fault healing at {self.heal_ms} ms "
                                f"(first ack after: {after[0] if after else None})")
        for p in range(self.p.partitions):
            leaders = [b for b in self.brokers if b.up and p in b.replicas
                       and b.replicas[p].core is not None]
            st = self.zk.partition_state(p)
            if st is None or len(leaders) != 1 or leaders[0].id != st.leader:
                raise Violation("liveness", f"partition {p}: no single leader at the end "
                                f"(state {st}, leading {[b.id for b in leaders]})")
            lr = leaders[0].replicas[p]
            core = lr.core
            assert core is not None
            full = self.isr_full_at.get(p)
            if full is None or full > self.heal_ms + settle:
                raise Violation("liveness", f"partition {p}: ISR not full within {settle} ms "
                                f"of the heal at {self.heal_ms} ms (full at {full}; ISR now "
                                f"{list(core.isr)})")
            for (pp, pid, seq, offset) in self.acks:
                if pp != p or (p, pid, seq) in self.lost:
                    continue
                for bid in core.isr:
                    rr = self.brokers[bid].replicas[p]
                    if offset >= core.high_watermark or offset >= rr.leo or \
                            (rr.log[offset][1], rr.log[offset][2]) != (pid, seq):
                        raise Violation("no acknowledged record lost",
                                        f"({pid},{seq}) acknowledged at partition {p} offset "
                                        f"{offset} is not there on ISR broker {bid}")
            for (pp, offset, rec) in self.seen:
                if pp == p and (p, rec[1], rec[2]) not in self.lost and \
                        (offset >= lr.leo or lr.log[offset] != rec):
                    raise Violation("consumed record stays",
                                    f"{rec} read at partition {p} offset {offset} is gone")
            if self.txn_client is not None:
                self.final_txn_check(leaders[0], lr)
        if self.txn_client is not None:
            for k, records in enumerate(self.txn_records):
                if records and k not in self.txn_outcome:
                    raise Violation("no hanging transaction",
                                    f"transaction {k} with records {records[:4]} was never "
                                    f"committed or aborted")

    def final_txn_check(self, b: Broker, lr: Replica) -> None:
        """After healing: no hanging transaction (the last stable offset is back at the high
        watermark, the last transaction having begun ``txn_last_begin_ms`` after the heal)
        and atomicity (a read_committed read of the whole log returns every record of each
        committed transaction and none of an aborted one)."""
        p = lr.p
        lso = self.observe_lso(b, lr)
        core = lr.core
        assert core is not None
        if lso != core.high_watermark:
            raise Violation("no hanging transaction",
                            f"partition {p}: last stable offset {lso} below the high "
                            f"watermark {core.high_watermark} at the end (ongoing "
                            f"{dict(sorted(lr.txns.ongoing.items()))})")
        aborted = [(a.producer_id, a.first_offset) for a in lr.txns.aborted_in(0, lso)]
        returned = {(rec[1], rec[2]) for _, rec in sx.read_committed(lr.log[:lso], 0, aborted)
                    if rec[3] >= 0}
        for k, outcome in sorted(self.txn_outcome.items()):
            for (pp, pid, seq) in self.txn_records[k]:
                if pp == p and outcome != ((pid, seq) in returned) and \
                        (p, pid, seq) not in self.lost:
                    raise Violation("transaction atomicity",
                                    f"transaction {k} ({'committed' if outcome else 'aborted'}"
                                    f"): its record ({pid},{seq}) at partition {p} is "
                                    f"{'not ' if outcome else ''}returned by read_committed")
