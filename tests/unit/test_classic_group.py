"""The classic group state machine, driven directly with a manual clock (R-GRP-3/4)."""

from __future__ import annotations

import itertools

import pytest
from kio.schema.errors import ErrorCode as E

from headrace.group.classic import (
    TRANSITIONS,
    ClassicGroup,
    GroupState,
    GroupTimeouts,
    IllegalTransitionError,
    JoinRequest,
    JoinResult,
    Parked,
    SyncResult,
)

S = GroupState
SESSION = 10_000
REBALANCE = 30_000


def new_group(delay: int = 1) -> ClassicGroup:
    ids = itertools.count()
    return ClassicGroup("g", GroupTimeouts(initial_rebalance_delay_ms=delay),
                        member_id_factory=lambda client: f"{client}-{next(ids)}")


def req(member_id: str = "", client: str = "c", protocols: tuple[tuple[str, bytes], ...] = (
        ("range", b"m"),), instance: str | None = None, known: bool = True,
        ptype: str = "consumer", skip: bool = False) -> JoinRequest:
    return JoinRequest(member_id, instance, client, "/127.0.0.1", SESSION, REBALANCE, ptype,
                       protocols, require_known_member_id=known, supports_skip_assignment=skip)


def completions(g: ClassicGroup) -> dict[int, JoinResult | SyncResult]:
    return {c.ticket: c for c in g.take_completions()}


def join_new(g: ClassicGroup, now: int, client: str = "c", **kw: object) -> tuple[str, int]:
    """KIP-394 round trip; returns (member id, ticket of the parked join)."""
    first = g.join(req(client=client, **kw), now)  # type: ignore[arg-type]
    assert isinstance(first, JoinResult) and first.error == E.member_id_required
    assert first.member_id.startswith(f"{client}-")
    parked = g.join(req(first.member_id, client=client, **kw), now)  # type: ignore[arg-type]
    assert isinstance(parked, Parked)
    return first.member_id, parked.ticket


def stable_pair(g: ClassicGroup) -> tuple[str, str]:
    """Two members, generation 1, Stable; a is the leader."""
    a, ta = join_new(g, 0, "a")
    b, tb = join_new(g, 0, "b")
    got = completions(g)
    assert got == {} and g.state is S.PREPARING_REBALANCE  # the initial delay (1 ms)
    g.tick(1)  # b arrived during the delay: Kafka waits one more delay
    assert g.state is S.PREPARING_REBALANCE
    g.tick(2)
    got = completions(g)
    assert {ta, tb} <= set(got)
    ra, rb = got[ta], got[tb]
    assert isinstance(ra, JoinResult) and ra.leader == a and len(ra.members) == 2
    assert isinstance(rb, JoinResult) and rb.members == () and rb.generation == 1
    sb = g.sync(b, 1, None, None, None, {}, 1)
    assert isinstance(sb, Parked)
    sa = g.sync(a, 1, None, None, None, {a: b"A", b: b"B"}, 1)
    assert isinstance(sa, Parked)
    got = completions(g)
    assert got[sa.ticket].assignment == b"A" and got[sb.ticket].assignment == b"B"
    assert g.state is S.STABLE and g.metadata_dirty
    g.metadata_dirty = False
    return a, b


def test_transitions_table_illegal_moves_raise_and_change_nothing() -> None:
    for src, dst in itertools.product(S, S):
        g = new_group()
        g.state = src
        if dst in TRANSITIONS[src]:
            g.transition(dst, 5)
            assert g.state is dst
        else:
            with pytest.raises(IllegalTransitionError):
                g.transition(dst, 5)
            assert g.state is src and g.state_timestamp_ms == -1


def test_kip394_round_trip_and_first_rebalance() -> None:
    g = new_group()
    a, _b = stable_pair(g)
    assert g.generation == 1 and g.leader == a and g.protocol_name == "range"


def test_unknown_member_and_pending_expiry() -> None:
    g = new_group()
    r = g.join(req("nobody"), 0)
    assert isinstance(r, JoinResult) and r.error == E.unknown_member_id
    first = g.join(req(), 0)
    assert isinstance(first, JoinResult) and first.member_id in g.pending_members
    g.tick(SESSION)
    assert not g.pending_members
    r = g.join(req(first.member_id), SESSION)
    assert isinstance(r, JoinResult) and r.error == E.unknown_member_id


def test_initial_rebalance_delay_extends_while_members_arrive() -> None:
    g = new_group(delay=3000)
    _a, ta = join_new(g, 0, "a")
    g.tick(2000)
    _b, tb = join_new(g, 2000, "b")
    g.tick(3000)  # a new member arrived during the delay: wait another delay
    assert g.state is S.PREPARING_REBALANCE and not g.has_completions()
    g.tick(6000)
    assert g.state is S.COMPLETING_REBALANCE and g.generation == 1
    assert set(completions(g)) == {ta, tb}


def test_protocol_selection_by_vote_and_inconsistent_protocols() -> None:
    g = new_group()
    both = (("roundrobin", b"r"), ("range", b"m"))
    _a, _ = join_new(g, 0, "a", protocols=(("range", b"m"), ("roundrobin", b"r")))
    _b, _ = join_new(g, 0, "b", protocols=both)
    _c, _ = join_new(g, 0, "c", protocols=both)
    g.tick(1)
    g.tick(2)
    assert g.protocol_name == "roundrobin"  # two votes to one
    bad = g.join(req(client="d", protocols=(("sticky", b""),)), 0)
    assert isinstance(bad, JoinResult) and bad.error == E.inconsistent_group_protocol
    bad = g.join(req(client="d", ptype="connect", protocols=both), 0)
    assert isinstance(bad, JoinResult) and bad.error == E.inconsistent_group_protocol
    empty = new_group()
    r = empty.join(req(ptype=""), 0)
    assert isinstance(r, JoinResult) and r.error == E.inconsistent_group_protocol


def test_heartbeat_in_every_state() -> None:
    g = new_group()
    assert g.heartbeat("x", 0, None, 0) == E.unknown_member_id  # Empty
    a, b = stable_pair(g)
    assert g.heartbeat(a, 1, None, 2) == E.none
    assert g.heartbeat(a, 0, None, 2) == E.illegal_generation
    assert g.heartbeat("x", 1, None, 2) == E.unknown_member_id
    _c, _ = join_new(g, 3, "c")  # a join starts a rebalance
    assert g.state is S.PREPARING_REBALANCE
    assert g.heartbeat(a, 1, None, 4) == E.rebalance_in_progress
    g.join(req(a), 5)
    g.join(req(b), 5)
    assert g.state is S.COMPLETING_REBALANCE
    assert g.heartbeat(a, 2, None, 6) == E.none
    g.mark_dead(7)
    assert g.heartbeat(a, 2, None, 8) == E.coordinator_not_available


def test_sync_errors_and_rebalance_during_completing() -> None:
    g = new_group()
    a, b = stable_pair(g)
    r = g.sync(a, 1, None, None, None, {}, 2)
    assert isinstance(r, SyncResult) and r.assignment == b"A"  # Stable: current assignment
    assert g.sync(a, 0, None, None, None, {}, 2) == SyncResult(0, E.illegal_generation)
    assert g.sync("x", 1, None, None, None, {}, 2) == SyncResult(0, E.unknown_member_id)
    assert g.sync(a, 1, None, "connect", None, {}, 2) == \
        SyncResult(0, E.inconsistent_group_protocol)
    g.join(req(a), 3)  # the leader rejoins: rebalance
    assert g.sync(b, 1, None, None, None, {}, 3) == SyncResult(0, E.rebalance_in_progress)
    g.join(req(b), 4)
    completions(g)
    parked = g.sync(b, 2, None, None, None, {}, 5)
    assert isinstance(parked, Parked)
    _c, _ = join_new(g, 6, "c")  # a new member while followers wait for the leader
    got = completions(g)
    assert got[parked.ticket] == SyncResult(parked.ticket, E.rebalance_in_progress)


def test_follower_rejoin_with_same_metadata_gets_current_answer() -> None:
    g = new_group()
    _a, b = stable_pair(g)
    r = g.join(req(b), 2)
    assert isinstance(r, JoinResult) and r.error == E.none and r.generation == 1
    assert g.state is S.STABLE
    r2 = g.join(req(b, protocols=(("range", b"changed"),)), 3)
    assert isinstance(r2, Parked) and g.state is S.PREPARING_REBALANCE


def test_session_timeout_removes_member_and_rebalances() -> None:
    g = new_group()
    a, b = stable_pair(g)
    g.heartbeat(a, 1, None, SESSION)
    g.tick(SESSION)
    assert b in g.members  # refreshed when the leader's sync completed at 1
    g.tick(SESSION + 5)  # b's session expired
    assert b not in g.members and g.state is S.PREPARING_REBALANCE
    g.tick(SESSION + 6)
    assert g.state is S.PREPARING_REBALANCE  # a has not rejoined yet
    r = g.join(req(a), SESSION + 7)
    assert isinstance(r, Parked) and g.state is S.COMPLETING_REBALANCE and g.generation == 2


def test_rebalance_timeout_drops_members_that_did_not_rejoin() -> None:
    g = new_group()
    a, b = stable_pair(g)
    g.join(req(a), 10)
    for t in range(1000, REBALANCE, 1000):
        assert g.heartbeat(b, 1, None, t) == E.rebalance_in_progress
        g.tick(t)
    g.tick(10 + REBALANCE)
    assert list(g.members) == [a] and g.generation == 2
    assert g.state is S.COMPLETING_REBALANCE


def test_leave_group_batched_and_last_member_empties_group() -> None:
    g = new_group()
    a, b = stable_pair(g)
    assert g.leave("x", None, 2) == E.unknown_member_id
    assert g.leave(b, None, 2) == E.none
    assert g.state is S.PREPARING_REBALANCE
    assert g.leave(a, None, 3) == E.none
    assert g.state is S.EMPTY and g.generation == 2 and g.metadata_dirty
    pending = g.join(req(client="p"), 4)
    assert isinstance(pending, JoinResult)
    assert g.leave(pending.member_id, None, 5) == E.none and not g.pending_members


def test_static_member_rejoin_without_rebalance_and_old_id_fenced() -> None:
    g = new_group()
    r1 = g.join(req(client="s", instance="i1"), 0)  # static: no MEMBER_ID_REQUIRED
    assert isinstance(r1, Parked)
    g.tick(1)
    old = g.leader
    assert old is not None
    g.sync(old, 1, "i1", None, None, {old: b"A"}, 1)
    completions(g)
    g.metadata_dirty = False
    r = g.join(req(client="s", instance="i1"), 2)
    assert isinstance(r, JoinResult) and r.error == E.none
    assert r.generation == 1 and r.member_id != old and r.leader == old  # KIP-345
    assert g.state is S.STABLE and g.metadata_dirty
    s = g.sync(r.member_id, 1, "i1", None, None, {}, 3)
    assert isinstance(s, SyncResult) and s.assignment == b"A"
    assert g.heartbeat(old, 1, "i1", 3) == E.fenced_instance_id
    assert g.validate_offset_commit(old, 1, "i1", 3) == E.fenced_instance_id
    assert g.leave("", "i1", 4) == E.none and not g.members


def test_static_member_with_changed_protocol_rebalances() -> None:
    g = new_group()
    g.join(req(client="s", instance="i1"), 0)
    g.tick(1)
    leader = g.leader
    assert leader is not None
    g.sync(leader, 1, "i1", None, None, {}, 1)
    r = g.join(req(client="s", instance="i1",
                   protocols=(("roundrobin", b""), ("range", b"m"))), 2)
    assert isinstance(r, Parked)
    g.tick(2)
    assert g.generation == 2 and g.protocol_name == "roundrobin"


def test_offset_commit_validation() -> None:
    g = new_group()
    assert g.validate_offset_commit("", -1, None, 0) == E.none  # assign() mode, R-GRP-7
    a, b = stable_pair(g)
    assert g.validate_offset_commit("", -1, None, 2) == E.unknown_member_id
    assert g.validate_offset_commit(a, 1, None, 2) == E.none
    assert g.validate_offset_commit(a, 0, None, 2) == E.illegal_generation
    assert g.validate_offset_commit("x", 1, None, 2) == E.unknown_member_id
    g.join(req(a), 3)
    assert g.validate_offset_commit(b, 1, None, 3) == E.none  # commit while rebalancing
    g.join(req(b), 3)
    assert g.validate_offset_commit(b, 2, None, 3) == E.rebalance_in_progress
    g.mark_dead(4)
    assert g.validate_offset_commit(b, 2, None, 4) == E.coordinator_not_available
