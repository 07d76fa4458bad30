"""Property test (R-REL-4..6): random delays, failures, lost acks, commit failures, crashes.

A simulated log and consumer drive the pure ``ReliableSpout`` the way the shell does: a
fetch returns records from the position of every unpaused partition and moves the position
past them; ``Seek`` moves it back; a crash drops the spout and everything in flight and
restarts every partition at its committed offset. Records are processed as random trees
(fan-out, multi-anchoring across records, failures, lost acks). Invariants:

- after every commit, no record below a committed offset is unprocessed: each one's tree was
  fully acked in some attempt, or it was dead-lettered (poison records only); after every
  step, the same holds for the offsets the spout would commit next (``committable()``);
- at the end every record was processed at least once and every partition committed to its
  end;
- the same holds when records are fetched as batches (``on_batch``) and settled with
  ``ack_batch``: partial batch acks (some roots of a batch processed one by one, the rest
  settled together, ``indices=``), batch failures (roots failed in the settle), roots whose
  tree grew before the settle (one child, or a fan-out by ``emit_many``, or several roots'
  fan-out in one ``emit_each``: a ``ChildRun`` acked whole, lost, or read child by child),
  and batches never settled (their roots time out);
- fan-outs by ``emit_many`` and bulk acks by ``ack_many`` (several pending items of any
  kind, roots and children of different trees, in one call) keep all of the above;
- with the exactly-once helpers the output holds each record exactly once:
  ``IdempotentSqliteSink`` (keyed by topic/partition/offset) and ``SqliteOffsetStore``
  (a plain append table written in the processed-mark's transaction).
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.reliable import (
    Commit,
    DeadLetter,
    IdempotentSqliteSink,
    Item,
    ItemState,
    Pause,
    ReliableSpout,
    Resume,
    RootBatch,
    Seek,
    SpoutConfig,
    SqliteOffsetStore,
    TopicPartition,
    idempotent_key,
)

TOPIC = "t"
Rec = tuple[TopicPartition, int]


@dataclass
class Attempt:
    record: Rec
    outstanding: int = 1
    bad: bool = False


@dataclass
class World:
    logs: dict[TopicPartition, list[int]]
    poison: set[Rec]
    rng: random.Random
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    processed: set[Rec] = field(default_factory=set)
    dead: set[Rec] = field(default_factory=set)
    now: int = 0
    crashes: int = 0


class Sim:
    def __init__(self, world: World, batches: bool = False) -> None:
        self.w = world
        self.use_batches = batches
        self.sink = IdempotentSqliteSink(sqlite3.connect(":memory:"))
        self.store = SqliteOffsetStore(":memory:", "g")
        with self.store.transaction("x", 0, -1) as conn:  # create the append table
            assert conn is not None
            conn.execute("CREATE TABLE appended (k TEXT)")
        self.start()

    def start(self) -> None:
        w = self.w
        self.spout = ReliableSpout(SpoutConfig(
            max_uncommitted_offsets=6, offset_commit_period_ms=20, max_retries=2,
            retry_backoff_ms=5, retry_backoff_max_ms=40, message_timeout_ms=200,
            num_ackers=2), now_ms=w.now, id_source=lambda: w.rng.getrandbits(64) or 1)
        self.position: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()
        self.pending: list[Item] = []
        self.batches: list[tuple[RootBatch, list[int]]] = []  # roots settled by ack_batch
        # fan-outs of several roots by emit_each, acked whole by ack_many(run): the run and,
        # per root, its attempts
        self.runs: list[tuple[Sequence[Item], list[list[Attempt]]]] = []
        self.attempts: dict[int, list[Attempt]] = {}  # id(item) -> its trees' attempts
        for tp, log in w.logs.items():
            start = w.committed.get(tp)
            self.spout.assigned(tp, start)
            self.position[tp] = log[0] if start is None else start

    def crash(self) -> None:
        self.w.crashes += 1
        self.start()

    def fetch(self, max_records: int) -> None:
        w = self.w
        for tp, log in w.logs.items():
            if tp in self.paused:
                continue
            batch = [o for o in log if o >= self.position[tp]][:max_records]
            if self.use_batches and batch:
                self.fetch_batch(tp, batch)
                continue
            for offset in batch:
                self.position[tp] = offset + 1
                item = self.spout.on_record(tp, offset, w.now, payload=(tp, offset))
                if item is not None:
                    self.pending.append(item)
                    self.attempts[id(item)] = [Attempt((tp, offset))]

    def fetch_batch(self, tp: TopicPartition, offsets: list[int]) -> None:
        rng = self.w.rng
        self.position[tp] = offsets[-1] + 1
        rb = self.spout.on_batch(tp, offsets, self.w.now, payloads=[(tp, o) for o in offsets])
        if rb is None:
            return
        owned = []
        for i in range(len(rb)):
            item = rb.item(i)
            self.attempts[id(item)] = [Attempt((tp, rb.offsets[i]))]
            if rng.random() < 0.4:
                self.pending.append(item)  # processed one by one: a partial batch ack
            else:
                owned.append(i)
        self.batches.append((rb, owned))

    def settle_batch(self, fail_p: float, lose_p: float) -> None:
        w, rng = self.w, self.w.rng
        if not self.batches:
            return
        rb, owned = self.batches.pop(rng.randrange(len(self.batches)))
        if rng.random() < lose_p:
            for i in owned:
                for a in self.attempts.pop(id(rb.item(i)), []):
                    a.bad = True  # the lane died: the batch's roots must time out
            return
        failures: dict[int, str] = {}
        acked: list[list[Attempt]] = []
        together: list[tuple[Item, list[Attempt]]] = []  # their trees grow in one emit_each
        for i in owned:
            item = rb.item(i)
            attempts = self.attempts.pop(id(item))
            record = attempts[0].record
            if record in w.poison or rng.random() < fail_p:
                failures[i] = "boom"  # a batch failure of this record
                for a in attempts:
                    a.bad = True
                continue
            tp, offset = record
            self.sink.write(idempotent_key(TOPIC, tp.partition, offset), b"x")
            with self.store.transaction(TOPIC, tp.partition, offset) as conn:
                if conn is not None:
                    conn.execute("INSERT INTO appended VALUES (?)",
                                 (idempotent_key(TOPIC, tp.partition, offset),))
            if rng.random() < 0.3:
                together.append((item, attempts))
            elif rng.random() < 0.3:  # the tree grows before the batch is settled
                kids = ([self.spout.emit(("c",), [item])] if rng.random() < 0.5 else
                        self.spout.tracker.emit_many([("c",)] * rng.randrange(1, 4), item))
                for child in kids:
                    for a in attempts:
                        a.outstanding += 1
                    self.attempts[id(child)] = attempts
                    self.pending.append(child)
            acked.append(attempts)
        if together:  # a batch bolt's fan-out over several of its roots (issue 14)
            k = rng.randrange(1, 4)
            run = self.spout.tracker.emit_each([("c",)] * k, [it for it, _ in together])
            for _, attempts in together:
                for a in attempts:
                    a.outstanding += k
            if rng.random() < 0.5:  # kept whole: acked by ack_many(run) (or lost)
                self.runs.append((run, [attempts for _, attempts in together]))
                if rng.random() < 0.5:  # one child read and anchored to before that
                    j = rng.randrange(len(run))
                    grandchild = self.spout.emit(("c", "g"), [run[j]])
                    for a in together[j // k][1]:
                        a.outstanding += 1
                    self.attempts[id(grandchild)] = list(together[j // k][1])
                    self.pending.append(grandchild)
            else:  # its children read one by one: each an item of its own
                for j, child in enumerate(run):
                    self.attempts[id(child)] = together[j // k][1]
                    self.pending.append(child)
        self.spout.ack_batch(rb, w.now, failures, owned)
        for attempts in acked:
            for a in attempts:
                a.outstanding -= 1
                if a.outstanding == 0 and not a.bad:
                    w.processed.add(a.record)

    def process_one(self, fail_p: float, lose_p: float) -> None:
        w, rng = self.w, self.w.rng
        if not self.pending:
            return
        item = self.pending.pop(rng.randrange(len(self.pending)))
        attempts = self.attempts.pop(id(item))
        is_root = item.values == ()
        record = attempts[0].record
        roll = rng.random()
        if record in w.poison or roll < fail_p:
            for a in attempts:
                a.bad = True
            self.spout.fail(item, w.now, "boom")
            return
        if roll < fail_p + lose_p:
            for a in attempts:
                a.bad = True  # handler died: the ack is lost, the root must time out
            return
        if is_root:  # the record's effect on the outside world
            tp, offset = record
            self.sink.write(idempotent_key(TOPIC, tp.partition, offset), b"x")
            with self.store.transaction(TOPIC, tp.partition, offset) as conn:
                if conn is not None:
                    conn.execute("INSERT INTO appended VALUES (?)",
                                 (idempotent_key(TOPIC, tp.partition, offset),))
        depth = len(item.values)
        children = rng.randrange(3) if depth < 2 else 0
        if children and rng.random() < 0.4:  # a fan-out in one call (issue 14)
            kids = self.spout.tracker.emit_many([(*item.values, "c")] * children, item)
            for child in kids:
                for a in attempts:
                    a.outstanding += 1
                self.attempts[id(child)] = list(attempts)
                self.pending.append(child)
            children = 0
        for _ in range(children):
            anchors = [item]
            other = [p for p in self.pending if p.state is ItemState.PENDING]
            if other and rng.random() < 0.2:
                anchors.append(rng.choice(other))  # multi-anchoring across trees
            child = self.spout.emit((*item.values, "c"), anchors)
            child_attempts: list[Attempt] = []
            for anchor in anchors:
                for a in self.attempts.get(id(anchor), attempts if anchor is item else []):
                    if not any(a is b for b in child_attempts):
                        child_attempts.append(a)
            for a in child_attempts:
                a.outstanding += 1
            self.attempts[id(child)] = child_attempts
            self.pending.append(child)
        self.spout.ack(item, w.now)
        for a in attempts:
            a.outstanding -= 1
            if a.outstanding == 0 and not a.bad:
                w.processed.add(a.record)

    def ack_bulk(self, max_items: int) -> None:
        """Several pending items acked in one ``ack_many`` (no failures), some after a
        fan-out of their own (``emit_many``: their ack carries the new edges)."""
        w, rng = self.w, self.w.rng
        chosen: list[Item] = []
        while self.pending and len(chosen) < max_items:
            item = self.pending.pop(rng.randrange(len(self.pending)))
            if self.attempts[id(item)][0].record in w.poison:
                self.pending.append(item)
                break
            chosen.append(item)
        all_attempts = [self.attempts.pop(id(item)) for item in chosen]
        for item, attempts in zip(chosen, all_attempts, strict=True):
            if item.values == ():
                tp, offset = attempts[0].record
                self.sink.write(idempotent_key(TOPIC, tp.partition, offset), b"x")
                with self.store.transaction(TOPIC, tp.partition, offset) as conn:
                    if conn is not None:
                        conn.execute("INSERT INTO appended VALUES (?)",
                                     (idempotent_key(TOPIC, tp.partition, offset),))
            if len(item.values) < 2 and rng.random() < 0.4:
                kids = self.spout.tracker.emit_many([(*item.values, "b")] * rng.randrange(1, 4),
                                                    item)
                for child in kids:
                    for a in attempts:
                        a.outstanding += 1
                    self.attempts[id(child)] = list(attempts)
                    self.pending.append(child)
        self.spout.ack_many(chosen, w.now)
        for attempts in all_attempts:
            for a in attempts:
                a.outstanding -= 1
                if a.outstanding == 0 and not a.bad:
                    w.processed.add(a.record)

    def settle_run(self, lose_p: float) -> None:
        """A ``ChildRun`` acked as a whole (one acker update per root), or lost (its roots
        time out)."""
        w, rng = self.w, self.w.rng
        if not self.runs:
            return
        run, per_root = self.runs.pop(rng.randrange(len(self.runs)))
        k = len(run) // len(per_root)
        if rng.random() < lose_p:
            for attempts in per_root:
                for a in attempts:
                    a.bad = True
            return
        self.spout.ack_many(run, w.now)
        for attempts in per_root:
            for a in attempts:
                a.outstanding -= k
                if a.outstanding == 0 and not a.bad:
                    w.processed.add(a.record)

    def tick(self, commit_fail_p: float) -> None:
        w = self.w
        for effect in self.spout.tick(w.now):
            if isinstance(effect, Seek):
                self.position[effect.tp] = effect.offset
            elif isinstance(effect, Pause):
                self.paused.add(effect.tp)
            elif isinstance(effect, Resume):
                self.paused.discard(effect.tp)
            elif isinstance(effect, DeadLetter):
                assert effect.payload in w.poison, "only poison records are dead-lettered"
                w.dead.add(effect.payload)
                self.spout.dead_lettered(effect.tp, effect.offset)
            elif isinstance(effect, Commit):
                if w.rng.random() < commit_fail_p:
                    continue  # the commit request failed: nothing changes
                for tp, offset in effect.offsets.items():
                    assert offset >= w.committed.get(tp, 0), "commit went backwards"
                    w.committed[tp] = offset
                self.check_committed()
                self.spout.committed(effect.offsets)

    def check_committed(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        w = self.w
        for tp, c in (w.committed if offsets is None else offsets).items():
            for offset in w.logs[tp]:
                if offset >= c:
                    break
                rec = (tp, offset)
                assert rec in w.processed or rec in w.dead, (
                    f"committed {c} on {tp} passes {offset}, which was not fully processed")


@st.composite
def worlds(draw: st.DrawFn) -> World:
    logs: dict[TopicPartition, list[int]] = {}
    for p in range(draw(st.integers(1, 3))):
        gaps = draw(st.lists(st.integers(1, 3), min_size=1, max_size=25))
        offsets, o = [], draw(st.integers(0, 5))
        for g in gaps:
            offsets.append(o)
            o += g  # gaps as in compacted logs and transaction markers
        logs[TopicPartition(TOPIC, p)] = offsets
    all_recs = [(tp, o) for tp, offs in logs.items() for o in offs]
    poison = set(draw(st.lists(st.sampled_from(all_recs), max_size=2)))
    return World(logs, poison, random.Random(draw(st.integers(0, 2**32))))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds(), data=st.data(), batches=st.booleans())
def test_committed_offsets_never_pass_unprocessed_records(world: World,
                                                          data: st.DataObject,
                                                          batches: bool) -> None:
    sim = Sim(world, batches)
    steps = data.draw(st.lists(st.sampled_from(
        ["fetch", "process", "process", "process", "settle", "bulk", "bulk", "time",
         "tick", "crash"]),
        max_size=120))
    for step in steps:
        if step == "fetch":
            sim.fetch(world.rng.randrange(1, 5))
        elif step == "settle":
            sim.settle_batch(fail_p=0.15, lose_p=0.05)
        elif step == "process":
            sim.process_one(fail_p=0.15, lose_p=0.05)
        elif step == "bulk":
            sim.ack_bulk(world.rng.randrange(1, 5))
            sim.settle_run(lose_p=0.05)
        elif step == "time":
            world.now += world.rng.choice([1, 5, 30, 250])
        elif step == "tick":
            sim.tick(commit_fail_p=0.2)
        elif step == "crash" and world.rng.random() < 0.3:
            sim.crash()
        sim.check_committed(sim.spout.committable())  # what the next commit would say
    # the rest of the run: no random failures any more (poison records still fail)
    for _ in range(3_000):
        if all(world.committed.get(tp) == log[-1] + 1 for tp, log in world.logs.items()):
            break
        sim.fetch(4)
        while sim.pending or sim.batches or sim.runs:
            sim.settle_batch(fail_p=0.0, lose_p=0.0)
            sim.settle_run(lose_p=0.0)
            sim.process_one(fail_p=0.0, lose_p=0.0)
            sim.ack_bulk(3)
            sim.check_committed(sim.spout.committable())
        world.now += 10
        sim.tick(commit_fail_p=0.0)
    for tp, log in world.logs.items():
        assert world.committed.get(tp) == log[-1] + 1, (tp, world.committed, log)
    every = {(tp, o) for tp, log in world.logs.items() for o in log}
    assert every - world.poison <= world.processed, "a record was never fully processed"
    assert world.dead == world.poison
    good = every - world.poison
    keys = {idempotent_key(TOPIC, tp.partition, o) for tp, o in good}
    assert sim.sink.count() == len(good)
    rows = [r[0] for r in sim.store.conn.execute("SELECT k FROM appended")]
    assert sorted(rows) == sorted(keys), "exactly-once output: each record once"


def test_offset_store_start_offset_is_the_contiguous_processed_prefix() -> None:
    """Seek-on-assign: out-of-order marks never move the start past an unprocessed record."""
    store = SqliteOffsetStore(":memory:", "g")
    for offset in (10, 11, 13, 14):
        with store.transaction("t", 0, offset) as conn:
            assert conn is not None
    assert store.start_offset("t", 0, base_offset=10) == 12  # 12 still unprocessed
    assert store.start_offset("t", 0, base_offset=5) == 5  # 5..9 unknown: start there
    with store.transaction("t", 0, 11) as conn:
        assert conn is None  # processed before: the replay writes nothing
    store.compact("t", 0, base_offset=10)
    assert store.is_processed("t", 0, 10) and not store.is_processed("t", 0, 12)
    with store.transaction("t", 0, 12) as conn:
        assert conn is not None
    assert store.start_offset("t", 0, base_offset=0) == 15
    with pytest.raises(RuntimeError, match="handler failed"), store.transaction("t", 0, 15):
        raise RuntimeError("handler failed")
    assert not store.is_processed("t", 0, 15)  # rolled back with the results
