"""KIP-848 reconciliation (Kafka's ``CurrentAssignmentBuilder``) over random histories
(issue 11 item 5).

The rule under test, per member, on each heartbeat:

- a member asked to revoke partitions holds current ∩ target and nothing new until it
  acknowledges the revocation (an owned list without them), even when partitions of its
  target are free (UNREVOKED_PARTITIONS);
- a partition still owned by another member (assigned, or pending its revocation) is not
  given out until that member releases it (UNRELEASED_PARTITIONS);
- once everybody heartbeats well, every member converges to its target (STABLE at the
  assignment epoch).

The clients here behave as real ones do: a client takes what a response assigns at once,
gives up what it no longer lists either at once (``beat``) or on a later heartbeat
(``slow``: it keeps reporting the revoked partitions until then, as a consumer whose
rebalance callback is still running does), switches subscriptions, leaves, or goes quiet
until its session or rebalance timeout removes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from headrace.group.assignors import TopicInfo
from headrace.group.consumer_group import ConsumerGroup, HeartbeatResult, MemberState

A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)
SESSION = 10_000
REBALANCE = 3_000
TP = tuple[uuid.UUID, int]
SUBSCRIPTIONS = (("a",), ("b",), ("a", "b"))


def _tps(parts: object) -> set[TP]:
    assert isinstance(parts, dict)
    return {(t, p) for t, ps in parts.items() for p in ps}


class Client:
    """One consumer. ``held``: what the application holds (given by a response, kept
    until it is acknowledged as released)."""

    def __init__(self, group: ConsumerGroup, member_id: str, names: Sequence[str]) -> None:
        self.group = group
        self.member_id = member_id
        self.names = list(names)
        self.epoch = 0
        self.held: set[TP] = set()
        self.given: set[TP] = set()  # the last assignment received
        self.names_changed = True

    def owned_list(self) -> list[tuple[uuid.UUID, list[int]]]:
        out: dict[uuid.UUID, list[int]] = {}
        for t, p in sorted(self.held, key=lambda tp: (str(tp[0]), tp[1])):
            out.setdefault(t, []).append(p)
        return list(out.items())

    def heartbeat(self, topics: dict[str, TopicInfo], now_ms: int,
                  release: bool) -> HeartbeatResult:
        """``release``: let go of what the last assignment no longer lists before sending
        (a prompt client); otherwise report it still owned (a slow one)."""
        if release:
            self.held &= self.given
        if self.epoch == 0:
            self.held = set()
            r = self.group.heartbeat(member_id=self.member_id, member_epoch=0, topics=topics,
                                     now_ms=now_ms, rebalance_timeout_ms=REBALANCE,
                                     subscribed_topic_names=self.names, topic_partitions=[])
        else:
            r = self.group.heartbeat(
                member_id=self.member_id, member_epoch=self.epoch, topics=topics,
                now_ms=now_ms, topic_partitions=self.owned_list(),
                subscribed_topic_names=self.names if self.names_changed else None)
        if r.error_code is ErrorCode.none:
            self.names_changed = False
            self.epoch = r.member_epoch
            if r.assignment is not None:
                self.given = {(t, p) for t, ps in r.assignment for p in ps}
                self.held |= self.given  # new partitions are taken at once
        elif r.error_code in (ErrorCode.fenced_member_epoch, ErrorCode.unknown_member_id):
            self.epoch, self.held, self.given = 0, set(), set()
        return r


class World:
    def __init__(self, assignor: str) -> None:
        self.group = ConsumerGroup("g", assignors=assignor, session_timeout_ms=SESSION)
        self.topics = {"a": TopicInfo(A, 4), "b": TopicInfo(B, 3)}
        self.clients: dict[int, Client] = {}
        self.now = 0

    def beat(self, c: Client, release: bool) -> None:
        g = self.group
        before = g.members.get(c.member_id)
        assigned_before = _tps(before.assigned) if before is not None else set()
        was_revoking = before is not None and before.state is MemberState.UNREVOKED_PARTITIONS
        r = c.heartbeat(self.topics, self.now, release)
        assert r.error_code in (ErrorCode.none, ErrorCode.fenced_member_epoch,
                                ErrorCode.unknown_member_id), r
        m = g.members.get(c.member_id)
        if r.error_code is not ErrorCode.none or m is None:
            return
        target = _tps(g.target.get(c.member_id, {}))
        if m.state is MemberState.UNREVOKED_PARTITIONS:
            # a member revoking holds current ∩ target: nothing new, nothing it must give up
            assert _tps(m.assigned) <= assigned_before
            if not was_revoking:
                assert _tps(m.assigned) == assigned_before & target
            assert not (_tps(m.assigned) & _tps(m.pending_revocation))
            assert _tps(m.pending_revocation).isdisjoint(target) or was_revoking
            assert m.member_epoch == c.epoch
            assert r.assignment is None or c.given == _tps(m.assigned)

    def step(self, op: str, i: int, arg: int) -> None:
        g = self.group
        self.now += 100
        c = self.clients.get(i)
        if op == "join" and c is None:
            c = self.clients[i] = Client(g, f"m{i}", SUBSCRIPTIONS[arg % 3])
            self.beat(c, release=True)
        elif c is None:
            return
        elif op == "beat":
            self.beat(c, release=True)
        elif op == "slow":
            self.beat(c, release=False)
        elif op == "switch":
            c.names = list(SUBSCRIPTIONS[arg % 3])
            c.names_changed = True
            self.beat(c, release=arg % 2 == 0)
        elif op == "leave":
            r = g.heartbeat(member_id=c.member_id, member_epoch=-1, topics=self.topics,
                            now_ms=self.now)
            assert r.error_code in (ErrorCode.none, ErrorCode.unknown_member_id)
            del self.clients[i]  # the client closed: it holds nothing any more
        elif op == "quiet":
            # time passes without this client: the others' sessions are kept alive, its
            # rebalance timeout (or session) may remove it
            self.now += REBALANCE + 1
            for other in self.clients.values():
                if other is not c and other.epoch:
                    self.beat(other, release=True)
            g.tick(self.now)
            if c.member_id not in g.members:
                # removed: it learns on its next heartbeat; a real consumer stops fetching
                # once its rebalance timeout has passed, so it holds nothing now
                c.epoch, c.held, c.given = 0, set(), set()
        elif op == "grow":
            name = "a" if arg % 2 == 0 else "b"
            info = self.topics[name]
            self.topics[name] = TopicInfo(info.topic_id, info.num_partitions + 1)

    def check_ownership(self) -> None:
        g = self.group
        seen: dict[TP, str] = {}
        for c in self.clients.values():
            for tp in c.held:
                assert tp not in seen, f"{tp} held by {seen[tp]} and {c.member_id}"
                seen[tp] = c.member_id
            m = g.members.get(c.member_id)
            if m is not None and c.epoch:
                # what a client holds, its member owns in the coordinator's view
                assert c.held <= _tps(m.assigned) | _tps(m.pending_revocation)
        server: dict[TP, str] = {}
        for m in g.members.values():
            for tp in _tps(m.assigned) | _tps(m.pending_revocation):
                assert tp not in server, f"{tp} owned by {server[tp]} and {m.member_id}"
                server[tp] = m.member_id

    def settle(self) -> None:
        g = self.group
        for _ in range(12):
            for c in self.clients.values():
                self.beat(c, release=True)
                self.check_ownership()
        if not self.clients:
            return
        assert g.state_name == "Stable"
        wanted: set[TP] = set()
        for c in self.clients.values():
            m = g.members[c.member_id]
            target = _tps(g.target.get(c.member_id, {}))
            assert m.state is MemberState.STABLE and m.member_epoch == g.assignment_epoch
            assert _tps(m.assigned) == target == c.held
            for name in c.names:
                info = self.topics[name]
                wanted |= {(info.topic_id, p) for p in range(info.num_partitions)}
        held = [c.held for c in self.clients.values()]
        assert set().union(*held) == wanted and sum(map(len, held)) == len(wanted)


OPS = st.tuples(st.sampled_from(["join", "beat", "slow", "switch", "leave", "quiet", "grow"]),
                st.integers(0, 3), st.integers(0, 5))


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=50), st.sampled_from(["uniform", "range"]))
# m1 revoking a's partitions acknowledges late, while m0's join moved b's target again: it
# must get a fresh rebalance timeout for the new revocation (b2), not be fenced by the old
# one while its client still holds b's partitions (which m0 would then be given too)
@example(ops=[("join", 1, 2), ("switch", 1, 1), ("join", 0, 1), ("quiet", 0, 0),
              ("beat", 0, 0)], assignor="uniform")
def test_reconciliation_over_random_histories(ops: list[tuple[str, int, int]],
                                              assignor: str) -> None:
    w = World(assignor)
    for op, i, arg in ops:
        w.step(op, i, arg)
        w.check_ownership()
    w.settle()


def test_member_revoking_gets_no_free_partition_until_it_acknowledges() -> None:
    """The case behind librdkafka holding partitions after unsubscribe(): a member switches
    from topic a to topic b; b's partitions are free, a's must be revoked first."""
    w = World("uniform")
    c = w.clients[0] = Client(w.group, "m0", ["a"])
    w.beat(c, release=True)
    assert c.held == {(A, p) for p in range(4)}
    c.names, c.names_changed = ["b"], True
    w.beat(c, release=False)  # the switch; its owned list still has a's partitions
    m = w.group.members["m0"]
    assert m.state is MemberState.UNREVOKED_PARTITIONS
    assert (m.assigned, c.given) == ({}, set())  # a's to revoke, b's not yet
    assert _tps(m.pending_revocation) == {(A, p) for p in range(4)}
    epoch = c.epoch
    w.beat(c, release=False)  # still revoking: no progress
    assert (m.state, c.epoch, c.given) == (MemberState.UNREVOKED_PARTITIONS, epoch, set())
    w.beat(c, release=True)  # acknowledged: now b's partitions, at the new epoch
    assert m.state is MemberState.STABLE and c.epoch == w.group.assignment_epoch > epoch
    assert c.held == c.given == {(B, p) for p in range(3)}


def test_new_revocation_restarts_the_rebalance_timeout() -> None:
    """Kafka reschedules a member's rebalance timeout whenever reconciliation moves it to
    UNREVOKED_PARTITIONS (``GroupMetadataManager.maybeReconcile``). A member that
    acknowledges a revocation after the target moved again is asked to revoke more, at a
    new epoch: the timeout of the first revocation must not fence it."""
    w = World("uniform")
    c1 = w.clients[1] = Client(w.group, "m1", ["a", "b"])
    w.beat(c1, release=True)
    c1.names, c1.names_changed = ["b"], True
    w.now = 100
    w.beat(c1, release=False)  # a's partitions to revoke; deadline 100 + REBALANCE
    m1 = w.group.members["m1"]
    assert m1.state is MemberState.UNREVOKED_PARTITIONS
    assert m1.revocation_deadline_ms == 100 + REBALANCE
    c0 = w.clients[0] = Client(w.group, "m0", ["b"])
    w.now = 200
    w.beat(c0, release=True)  # b is split: m1 will have to give up some of it too
    w.now = 100 + REBALANCE + 1  # past the first deadline, before any tick
    w.beat(c1, release=True)  # acknowledges a's; asked to revoke part of b
    assert m1.state is MemberState.UNREVOKED_PARTITIONS and m1.pending_revocation
    assert m1.member_epoch == c1.epoch == 2
    assert m1.revocation_deadline_ms == w.now + REBALANCE
    w.group.tick(w.now)
    assert "m1" in w.group.members
    w.check_ownership()
    w.beat(c0, release=True)  # m1 still owns what m0 is waiting for
    w.check_ownership()
    assert c0.held.isdisjoint(c1.held)
    w.settle()
