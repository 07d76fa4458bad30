"""Transactions in the simulation: the coordinator's shell, the transactional client, the
partitions' transaction index and the read_committed consumer's filter.

**The coordinator** is the real pure ``txn.coordinator.TxnCoordinator``. It lives on the
controller broker and keeps its log in ZooKeeper: one znode per transactional id under
``/transaction_state/``, written only after a check of ``/controller_epoch`` (as the
controller's own writes), so a deposed coordinator's write is refused. Kafka keeps it in a
``__transaction_state`` partition led by the coordinator; the simulated ZooKeeper already
is the replicated, fenced store (conditional writes, an epoch, failover on session loss),
so the coordinator's durability and fencing come from it, and the partition's own
replication is what the rest of the simulation checks. A new coordinator (a new controller)
replays the znodes, sends the markers of every Prepare state again (``unfinished``) and
aborts transactions past their timeout (``timed_out``, checked on every tick).

**Markers** (WriteTxnMarkers) go to the current leader of each partition of the
transaction, carrying the producer epoch and the coordinator epoch (the controller epoch);
the leader appends a control record (acks=all: refused below ``min.insync.replicas``,
answered once the high watermark passes it) unless the producer epoch or the coordinator
epoch is older than the partition's (Kafka's ``appendEndTxnMarker`` checks). The coordinator
resends a marker to whoever leads the partition then until it is answered, then writes the
Complete state. One request per partition is in flight: the next copy goes only after an
error answer, or after twice the request timeout without one (the leader answers a pending
marker after one: the copy was lost); each request has its own number, which its answer
carries (Kafka's correlation id).

**Partitions** keep the real ``log.transactions.TxnTracker`` over their records (ongoing
transactions, markers not yet below the high watermark, aborted transactions), rebuilt from
the log after a truncation, as ``PartitionLog`` does on recovery: the last stable offset is
its ``last_stable_offset(high_watermark)``, read_committed fetches stop there and name the
aborted transactions overlapping what they return (``aborted_in``).

**The client** (Kafka's ``TransactionManager``, one transactional id): InitProducerId,
then transactions: AddPartitionsToTxn for a random non-empty set of partitions, one to
three records per partition (acks=all, idempotent, retried with the same sequence), then
EndTxn commit or abort (random). Sometimes it hangs (no EndTxn until the transaction timeout
has aborted it: its next request is fenced, it starts again with InitProducerId), sometimes
it restarts mid-transaction (InitProducerId fences and aborts the open one). Sequence
numbers go on across epochs: the simulated partitions detect duplicates by (producer id,
sequence).

**Ghost state for the checkers** (never read by a broker): which transaction each record
belongs to, and each transaction's outcome, taken when the coordinator's Prepare write
succeeds (the decision).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from headrace.log import transactions as tx
from headrace.protocol.records import CONTROL_BIT, TRANSACTIONAL_BIT, BatchHeader
from headrace.txn.coordinator import Markers, TxnCoordinator, TxnWrite
from headrace.txn.records import TxnState

if TYPE_CHECKING:
    from headrace.simulation.world import Broker, World

# a record: (leader epoch, producer id, sequence, producer epoch (-1: not transactional),
# control (DATA, or a COMMIT / ABORT marker), coordinator epoch of a marker (else -1))
Rec = tuple[int, int, int, int, int, int]
DATA, COMMIT_MARKER, ABORT_MARKER = 0, 1, 2

TOPIC = "t"
TID = "tx"
TXN_CLIENT = 140  # the transactional client's address (CLIENT_BASE + 40)
TXN_STATE = "/transaction_state/"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
FIRST_PRODUCER_ID = 1000
MAX_TIMEOUT_MS = 60_000


def header_of(offset: int, rec: Rec) -> BatchHeader:
    """The batch header ``TxnTracker`` reads, for a one-record batch at ``offset``."""
    attrs = TRANSACTIONAL_BIT | (CONTROL_BIT if rec[4] != DATA else 0)
    return BatchHeader(offset, 0, rec[0], 2, 0, attrs, 0, 0, 0, rec[1], rec[3], rec[2], 1)


def track(tracker: tx.TxnTracker, offset: int, rec: Rec) -> None:
    if rec[3] < 0:
        return
    kind = None if rec[4] == DATA else (tx.COMMIT if rec[4] == COMMIT_MARKER else tx.ABORT)
    tracker.on_batch(header_of(offset, rec), kind)


def read_committed(records: list[Rec], start: int, aborted: Iterable[tuple[int, int]]
                   ) -> list[tuple[int, Rec]]:
    """What a read_committed consumer keeps of ``records`` (at ``start``) given the fetch's
    aborted transactions (producer id, first offset): Kafka's ``Fetcher`` (consume the
    aborted transactions starting at or before each batch, skip a transactional batch of
    an aborted producer, an ABORT marker ends it; control records are never returned)."""
    pending = sorted(aborted, key=lambda a: a[1])
    i = 0
    aborted_pids: set[int] = set()
    out = []
    for j, rec in enumerate(records):
        o = start + j
        if rec[3] < 0:
            out.append((o, rec))
            continue
        while i < len(pending) and pending[i][1] <= o:
            aborted_pids.add(pending[i][0])
            i += 1
        if rec[4] != DATA:
            if rec[4] == ABORT_MARKER:
                aborted_pids.discard(rec[1])
            continue
        if rec[1] not in aborted_pids:
            out.append((o, rec))
    return out


# ---------------------------------------------------------------------- coordinator
@dataclass
class MarkerJob:
    markers: Markers
    remaining: set[int]
    due: dict[int, int] = field(default_factory=dict)
    sent_to: dict[int, int] = field(default_factory=dict)  # partition -> leader sent to
    # which job a response answers: a response is bound to its request (Kafka's correlation
    # id), never matched by (producer id, epoch) alone — a late answer to the previous
    # transaction's marker (same producer epoch) must not count for this one's
    nonce: int = 0
    # partition -> (request number, sent at): the one request in flight there; the next
    # copy goes only after its answer, or once twice the request timeout has passed (the
    # leader answers a pending marker after one request timeout: a copy still unanswered
    # then was lost on the way). Two copies in flight at once let a late one reach the
    # partition after the next transaction began there and end it (seed 5351).
    in_flight: dict[int, tuple[int, int]] = field(default_factory=dict)
    requests: set[int] = field(default_factory=set)  # every request number this job sent


class TxnShell:
    """The coordinator's shell on the controller broker (see the module docstring)."""

    def __init__(self, b: Broker, epoch: int) -> None:
        self.b = b
        self.w = b.w
        self.epoch = epoch
        self.deposed = False
        self.core = TxnCoordinator(self.allocate, MAX_TIMEOUT_MS)
        self.jobs: dict[str, MarkerJob] = {}
        zk = self.w.zk
        for path in zk.children(TXN_STATE):
            self.core.replay(path[len(TXN_STATE):], zk.nodes[path].data)
        for m in self.core.unfinished():
            self.w.trace(f"b{b.id} txn coordinator {epoch} resumes markers "
                         f"{'commit' if m.commit else 'abort'} epoch {m.producer_epoch}")
            self.start_markers(m)

    def allocate(self) -> int:
        zk = self.w.zk
        n = zk.nodes[PRODUCER_ID_BLOCK]
        zk.set(PRODUCER_ID_BLOCK, n.data + 1, n.version)
        return int(n.data)

    def write(self, tw: TxnWrite) -> bool:
        """Append to the coordinator's log: a znode write fenced by the controller epoch."""
        b, zk = self.b, self.w.zk
        if not b.zk_ok():
            return False
        epoch_node = zk.get("/controller_epoch")
        if epoch_node is None or epoch_node.data != self.epoch:
            self.deposed = True
            return False
        path = TXN_STATE + tw.transactional_id
        n = zk.nodes.get(path)
        if n is None:
            zk.create(path, tw.value)
        else:
            zk.set(path, tw.value, n.version)
        return True

    def apply(self, tw: TxnWrite, k: int | None = None) -> bool:
        """Write ``tw`` and tell the core; record the decision for the checkers."""
        tid = tw.transactional_id
        ok = self.write(tw)
        markers = self.core.written(tid, ok, self.w.now)
        if not ok:
            return False
        m = self.core.txns.get(tid)
        if m is not None:
            if m.state == TxnState.ONGOING and k is not None:
                self.w.txn_opened(tid, k)
            elif m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                self.w.txn_decided(tid, m.state == TxnState.PREPARE_COMMIT)
        if markers is not None:
            self.start_markers(markers)
        return True

    def request(self, src: int, op: str, pid: int, pepoch: int, parts: tuple[int, ...],
                commit: bool, k: int) -> None:
        w, core, now = self.w, self.core, self.w.now
        if not self.b.zk_ok():
            w.send(self.b.id, src, ("txn_resp", op, "not_coordinator", -1, -1))
            return
        opening = None
        if op == "init":
            out = core.init_producer_id(TID, w.p.txn_timeout_ms, now)
        elif op == "add":
            m = core.txns.get(TID)
            if m is None or m.state != TxnState.ONGOING:
                opening = k
            out = core.add_partitions(TID, pid, pepoch, [(TOPIC, p) for p in parts], now)
        else:
            out = core.end_txn(TID, pid, pepoch, commit, now)
        if out.write is not None and not self.apply(out.write, opening):
            w.send(self.b.id, src, ("txn_resp", op, "not_coordinator", -1, -1))
            return
        w.send(self.b.id, src, ("txn_resp", op, out.error.name, out.producer_id,
                                out.producer_epoch))

    def start_markers(self, m: Markers) -> None:
        self.jobs[m.transactional_id] = MarkerJob(m, {p for _, p in m.partitions},
                                                  nonce=self.w.new_marker_job())

    def marker_target(self, job: MarkerJob, p: int) -> int:
        """Whoever leads ``p`` now (a marker is retried at the new leader)."""
        return self.w.leader_of(p)

    def tick(self) -> None:
        w, now = self.w, self.w.now
        if self.b.zk_ok():
            for tw in self.core.timed_out(now):
                w.trace(f"b{self.b.id} txn {tw.transactional_id} timed out: abort")
                if not self.apply(tw) or self.deposed:
                    return
        for tid in sorted(self.jobs):
            job = self.jobs[tid]
            if not job.remaining:
                self.finish(tid)
                if self.deposed:
                    return
                continue
            m = job.markers
            for p in sorted(job.remaining):
                if now < job.due.get(p, 0):
                    continue
                if w.p.marker_resend_in_flight:
                    job.due[p] = now + w.p.request_timeout_ms
                    number = job.nonce
                else:
                    flight = job.in_flight.get(p)
                    if flight is not None and now < flight[1] + 2 * w.p.request_timeout_ms:
                        continue
                    number = w.new_marker_job()
                leader = self.marker_target(job, p)
                if leader >= 0:
                    job.sent_to.setdefault(p, leader)
                    if not w.p.marker_resend_in_flight:
                        job.in_flight[p] = (number, now)
                        job.requests.add(number)
                    w.send(self.b.id, leader, ("txn_marker", p, m.producer_id,
                                               m.producer_epoch, m.commit, self.epoch,
                                               number))
                elif not w.p.marker_resend_in_flight:
                    job.due[p] = now + 3 * w.p.tick_ms  # no leader now: look again soon

    def marker_resp(self, p: int, pid: int, pepoch: int, code: str, nonce: int) -> None:
        job = self.jobs.get(TID)
        if job is None or (job.markers.producer_id, job.markers.producer_epoch) != (pid, pepoch):
            return
        if self.w.p.marker_resend_in_flight:
            if job.nonce != nonce:
                return
        elif nonce not in job.requests:
            return  # another job's request (an earlier transaction's marker)
        if code == "ok":
            job.remaining.discard(p)
            job.in_flight.pop(p, None)
            if not job.remaining:
                self.finish(TID)
        elif self.w.p.marker_resend_in_flight or job.in_flight.get(p, (0, 0))[0] == nonce:
            job.in_flight.pop(p, None)  # that request failed: the next copy may go
            job.due[p] = self.w.now + 3 * self.w.p.tick_ms

    def finish(self, tid: str) -> None:
        tw = self.core.markers_done(tid, self.w.now)
        if tw is None:
            self.jobs.pop(tid, None)
            return
        if self.apply(tw):
            self.jobs.pop(tid, None)


# ---------------------------------------------------------------------- the client
@dataclass
class TxnClient:
    """The transactional producer (see the module docstring); address ``TXN_CLIENT``."""

    w: World
    state: str = "init"
    pid: int = -1
    pepoch: int = -1
    due: int = 0
    k: int = -1  # the current transaction (ghost)
    parts: tuple[int, ...] = ()
    commit: bool = True
    hang: bool = False
    restart: bool = False
    todo: dict[int, int] = field(default_factory=dict)  # partition -> records left
    inflight: dict[int, int] = field(default_factory=dict)  # partition -> request due
    seqs: dict[int, int] = field(default_factory=dict)
    transactions: int = 0

    def coordinator(self) -> int:
        n = self.w.zk.nodes.get("/controller")
        return -1 if n is None else int(n.data)

    def request(self, op: str) -> None:
        self.due = self.w.now + self.w.p.request_timeout_ms
        c = self.coordinator()
        if c >= 0:
            self.w.send(TXN_CLIENT, c, ("txn_req", op, self.pid, self.pepoch, self.parts,
                                        self.commit, self.k))

    def tick(self) -> None:
        w, now = self.w, self.w.now
        if self.state == "produce":
            self.send_records()
            return
        if now < self.due:
            return
        if self.state == "init":
            self.request("init")
        elif self.state == "idle":
            if now > w.heal_ms + w.p.txn_last_begin_ms:
                self.due = now + 10 * w.p.tick_ms
                return
            self.begin()
        elif self.state == "add":
            self.request("add")
        elif self.state == "end":
            self.request("end")

    def begin(self) -> None:
        rng, n = self.w.rng, self.w.p.partitions
        self.k = self.w.new_txn()
        parts = [p for p in range(n) if rng.random() < 0.6] or [rng.randrange(n)]
        self.parts = tuple(parts)
        self.todo = {p: rng.randint(1, 3) for p in parts}
        self.inflight = {}
        self.commit = rng.random() < 0.6
        roll = rng.random()
        self.hang, self.restart = roll < 0.08, 0.08 <= roll < 0.12
        self.state = "add"
        self.request("add")

    def send_records(self) -> None:
        w, now = self.w, self.w.now
        for p in sorted(self.todo):
            if self.todo[p] == 0 or now < self.inflight.get(p, 0):
                continue
            self.inflight[p] = now + w.p.request_timeout_ms + 50
            seq = self.seqs.get(p, 0)
            w.txn_record(self.k, p, self.pid, seq)
            leader = w.leader_of(p)
            if leader >= 0:
                w.send(TXN_CLIENT, leader, ("produce", p, self.pid, seq, self.pepoch))

    def produce_resp(self, p: int, seq: int, code: str) -> None:
        if self.state != "produce" or self.seqs.get(p, 0) != seq or self.todo.get(p, 0) == 0:
            return
        if code == "ok":
            self.seqs[p] = seq + 1
            self.todo[p] -= 1
            self.inflight[p] = self.w.now
            if not any(self.todo.values()):
                self.end()
        elif code == "fenced":
            self.fenced()
        else:
            self.inflight[p] = self.w.now + 3 * self.w.p.tick_ms

    def end(self) -> None:
        w = self.w
        if self.restart:  # a new producer instance: InitProducerId fences this one
            self.state, self.due = "init", w.now
            return
        self.state = "end"
        if self.hang:
            self.due = w.now + w.p.txn_timeout_ms + w.rng.randint(100, 400)
        else:
            self.request("end")

    def fenced(self) -> None:
        """A new producer instance: InitProducerId, and no sequence sent unacknowledged is
        used again (it may be in a log, aborted)."""
        for p, left in self.todo.items():
            if left:
                self.seqs[p] = self.seqs.get(p, 0) + 1
        self.todo = {}
        self.state, self.due = "init", self.w.now + self.w.p.tick_ms

    def txn_resp(self, op: str, code: str, pid: int, pepoch: int) -> None:
        if op != {"init": "init", "add": "add", "end": "end"}.get(self.state):
            return
        w = self.w
        if code == "none":
            if op == "init":
                self.pid, self.pepoch = pid, pepoch
                self.state, self.due = "idle", w.now
            elif op == "add":
                self.state = "produce"
                self.send_records()
            else:
                self.transactions += 1
                self.state, self.due = "idle", w.now + w.rng.randint(0, 3 * w.p.tick_ms)
        elif code in (ErrorCode.producer_fenced.name, ErrorCode.invalid_producer_id_mapping.name,
                      ErrorCode.invalid_txn_state.name):
            self.fenced()
        else:  # concurrent_transactions, not_coordinator: retry
            self.due = w.now + 3 * w.p.tick_ms


def consume_response(w: World, p: int, offset: int, records: list[Rec],
                     aborted: list[tuple[int, int]]) -> None:
    """A read_committed consumer's fetch: every record is checked as committed, and what
    the consumer returns must belong to no aborted and no open transaction."""
    for i, rec in enumerate(records):
        w.consumed(p, offset + i, rec)
    for o, rec in read_committed(records, offset, aborted):
        if rec[3] >= 0:
            w.returned_txn_record(p, o, rec)
