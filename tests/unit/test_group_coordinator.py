"""The pure coordinator: commits and group state → __consumer_offsets records → load
(R-GRP-6/7), for classic and KIP-848 consumer groups."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode as E

from headrace.group.assignors import TopicInfo
from headrace.group.classic import ClassicGroup, GroupState, GroupTimeouts, JoinRequest
from headrace.group.consumer_group import ConsumerGroup, HeartbeatResult
from headrace.group.coordinator import CommitEntry, GroupCoordinator, subscribed_topics
from headrace.group.records import (
    ConsumerGroupMetadataKey,
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    decode_key,
    decode_value,
)

T0 = 1_700_000_000_000


def replay(log: list[tuple[bytes, bytes | None]]) -> GroupCoordinator:
    c = GroupCoordinator()
    c.load(log, T0)
    return c


def commit(c: GroupCoordinator, log: list[tuple[bytes, bytes | None]], group: str,
           entries: list[CommitEntry]) -> None:
    assert c.validate_commit(group, "", -1, None, T0) == E.none
    write, errors = c.commit_write(group, entries, T0)
    assert all(e == E.none for e in errors)
    log.extend(write.records)
    c.apply(write)


def test_assign_mode_commit_round_trips_through_records() -> None:
    c = GroupCoordinator()
    log: list[tuple[bytes, bytes | None]] = []
    commit(c, log, "g", [CommitEntry("t", 0, 5, 3, "meta"), CommitEntry("t", 1, 9, -1, None)])
    commit(c, log, "g", [CommitEntry("t", 0, 7, 3, "later")])
    assert isinstance(c.groups["g"], ClassicGroup)  # R-GRP-7: a simple group appears
    key = decode_key(log[0][0])
    assert key == OffsetCommitKey("g", "t", 0)
    loaded = replay(log)
    got = loaded.fetch_offsets("g", [("t", 0), ("t", 1), ("t", 2)])
    assert (got[("t", 0)].offset, got[("t", 0)].metadata, got[("t", 0)].leader_epoch) == \
        (7, "later", 3)
    assert got[("t", 1)].offset == 9 and got[("t", 2)].offset == -1
    assert loaded.groups["g"].state_name == "Empty"


def test_commit_to_unknown_group_with_generation() -> None:
    c = GroupCoordinator()
    assert c.validate_commit("g", "m", 3, None, T0, api_version=9) == E.group_id_not_found
    assert c.validate_commit("g", "m", 3, None, T0, api_version=8) == E.illegal_generation


def test_metadata_too_large() -> None:
    c = GroupCoordinator()
    _, errors = c.commit_write("g", [CommitEntry("t", 0, 1, -1, "x" * 5000)], T0)
    assert errors == [E.offset_metadata_too_large]


def test_offset_delete_and_delete_group_write_tombstones() -> None:
    c = GroupCoordinator()
    log: list[tuple[bytes, bytes | None]] = []
    commit(c, log, "g", [CommitEntry("t", 0, 5, -1, ""), CommitEntry("u", 0, 1, -1, "")])
    err, errors, write = c.delete_offsets("g", [("t", 0)])
    assert err == E.none and errors == [E.none] and write is not None
    assert write.records == ((log[0][0], None),)
    log.extend(write.records)
    c.apply(write)
    assert replay(log).fetch_offsets("g", [("t", 0)])[("t", 0)].offset == -1
    err, gwrite = c.delete_group("g")
    assert err == E.none and gwrite is not None
    log.extend(gwrite.records)
    c.apply(gwrite)
    assert "g" not in c.groups and c.fetch_offsets("g", None) == {}
    loaded = replay(log)
    assert "g" not in loaded.groups and loaded.offsets == {}
    assert c.delete_group("g") == (E.group_id_not_found, None)


def _joined_group(c: GroupCoordinator) -> str:
    sub = b"\x00\x01" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\x00\x00\x00\x00"
    req = JoinRequest("", None, "cl", "/h", 10_000, 20_000, "consumer", (("range", sub),),
                      require_known_member_id=False)
    parked = c.join_group("g", req, T0)
    assert not isinstance(parked, type(None))
    c.tick(T0 + 3000)
    g = c.groups["g"]
    assert isinstance(g, ClassicGroup) and g.state is GroupState.COMPLETING_REBALANCE
    member = next(iter(g.members))
    c.sync_group("g", member, 1, None, None, None, {member: b"assign"}, T0 + 3001)
    return member


def test_group_metadata_record_written_and_loaded() -> None:
    c = GroupCoordinator(GroupTimeouts(initial_rebalance_delay_ms=3000))
    member = _joined_group(c)
    assert len(c.take_completions()) == 2  # the join and the sync
    records = c.take_group_records()
    assert [gid for gid, _ in records] == ["g"]
    key, value = records[0][1]
    assert decode_key(key) == GroupMetadataKey("g")
    gm = decode_value(GroupMetadataKey("g"), value)
    assert isinstance(gm, GroupMetadataValue) and gm.generation == 1 and gm.leader == member
    assert gm.members[0].assignment == b"assign" and gm.protocol == "range"
    loaded = replay([kv for _, kv in records])
    g = loaded.groups["g"]
    assert isinstance(g, ClassicGroup) and g.state is GroupState.STABLE
    assert g.members[member].assignment == b"assign" and g.generation == 1
    assert loaded.heartbeat("g", member, 1, None, T0) == E.none
    assert c.delete_group("g")[0] == E.non_empty_group
    _err, errors, _ = c.delete_offsets("g", [("t", 0), ("u", 0)])
    assert errors == [E.group_subscribed_to_topic, E.none]


def test_join_validation_and_listing() -> None:
    c = GroupCoordinator()
    req = JoinRequest("", None, "cl", "/h", 10, 20_000, "consumer", (("range", b""),))
    assert c.join_group("", req, T0).error == E.invalid_group_id  # type: ignore[union-attr]
    assert c.join_group("g", req, T0).error == E.invalid_session_timeout  # type: ignore[union-attr]
    assert c.heartbeat("nope", "m", 1, None, T0) == E.unknown_member_id
    assert c.leave_group("nope", [("m", None)], T0) == (E.none, [E.unknown_member_id])
    _joined_group(c)
    assert [g.group_id for g in c.list_groups({"stable"}, {"classic"})] == ["g"]
    assert c.list_groups({"Empty"}) == []


def test_undecodable_records_are_skipped() -> None:
    c = GroupCoordinator()
    c.load([(b"\xff", b"x"), (None, b"y")], T0)
    assert c.corrupt_records == 1 and c.groups == {}


def test_subscribed_topics() -> None:
    sub = b"\x00\x00" + b"\x00\x00\x00\x02" + b"\x00\x01a" + b"\x00\x02bc"
    assert subscribed_topics(sub) == {"a", "bc"}
    assert subscribed_topics(b"\x00") == set()



# ---------------------------------------------------------------------- KIP-848 groups

TOPIC_ID = uuid.UUID(int=0x7)
MD = {"t": TopicInfo(TOPIC_ID, 4)}
Log = list[tuple[bytes, bytes | None]]


def cg_heartbeat(c: GroupCoordinator, log: Log, group_id: str, member_id: str, epoch: int,
                 now_ms: int, owned: list[int] | None = None, **kw: Any) -> HeartbeatResult:
    """What the ConsumerGroupHeartbeat handler does with the pure coordinator: find or
    make the group, heartbeat, queue the group's records; the shell's append is ``log``."""
    existing = c.groups.get(group_id)
    group = existing if isinstance(existing, ConsumerGroup) else c.consumer_group_factory(
        group_id)
    if epoch == 0:
        kw = {"rebalance_timeout_ms": 10_000, "subscribed_topic_names": ["t"], **kw}
    r = group.heartbeat(member_id=member_id, member_epoch=epoch, topics=MD, now_ms=now_ms,
                        topic_partitions=[] if epoch == 0 else [(TOPIC_ID, owned or [])],
                        **kw)
    if r.error_code is E.none:
        if group is existing:
            c.collect_consumer_group(group)
        else:
            c.add_consumer_group(group)
    log.extend(kv for gid, kv in c.take_group_records() if gid == group_id)
    return r


def consumer_state(g: Any) -> tuple[Any, ...]:
    assert isinstance(g, ConsumerGroup)
    return (g.group_epoch, g.assignment_epoch, g.state_name, g.assignor_name,
            g.subscribed_topics,
            {mid: (m.member_epoch, m.previous_member_epoch, m.state, m.assigned,
                   m.pending_revocation, m.subscribed_topic_names, m.client_id)
             for mid, m in g.members.items()},
            {mid: t for mid, t in g.target.items()})


def stable_pair(c: GroupCoordinator, log: Log) -> dict[str, tuple[int, list[int]]]:
    """Two members settled over four partitions: member id → (epoch, partitions)."""
    state: dict[str, tuple[int, list[int]]] = {}
    for m in ("m1", "m2"):
        r = cg_heartbeat(c, log, "cg", m, 0, T0, client_id=m)
        state[m] = (r.member_epoch, sorted(p for _, ps in r.assignment or () for p in ps))
    for _ in range(4):
        for m, (epoch, owned) in list(state.items()):
            r = cg_heartbeat(c, log, "cg", m, epoch, T0 + 1, owned)
            assert r.error_code is E.none
            got = owned if r.assignment is None else sorted(
                p for _, ps in r.assignment for p in ps)
            state[m] = (r.member_epoch, got)
    assert c.groups["cg"].state_name == "Stable"
    return state


def test_consumer_group_is_rebuilt_from_its_records() -> None:
    c = GroupCoordinator()
    log: Log = []
    state = stable_pair(c, log)
    commit_log: Log = []
    assert c.validate_commit("cg", "m1", state["m1"][0], None, T0) == E.none
    write, _ = c.commit_write("cg", [CommitEntry("t", 0, 3, -1, "")], T0)
    commit_log.extend(write.records)
    c.apply(write)
    made: list[str] = []

    def factory(group_id: str) -> ConsumerGroup:
        made.append(group_id)
        return ConsumerGroup(group_id, session_timeout_ms=7_000)

    loaded = GroupCoordinator(consumer_group_factory=factory)
    loaded.load(log + commit_log, T0 + 100_000)
    assert made == ["cg"]  # the broker's configs apply to loaded groups
    g = loaded.groups["cg"]
    assert consumer_state(g) == consumer_state(c.groups["cg"])
    assert isinstance(g, ConsumerGroup)
    assert {m.session_deadline_ms for m in g.members.values()} == {T0 + 107_000}
    assert loaded.fetch_offsets("cg", [("t", 0)])[("t", 0)].offset == 3
    assert [(x.group_id, x.state, x.group_type) for x in loaded.list_groups()] == [
        ("cg", "Stable", "consumer")]
    # the members carry on with their old ids and epochs: no rebalance, nothing written
    for m, (epoch, owned) in state.items():
        r = cg_heartbeat(loaded, log, "cg", m, epoch, T0 + 100_001, owned)
        assert (r.error_code, r.member_epoch) == (E.none, epoch)
        assert loaded.validate_commit("cg", m, epoch, None, T0) == E.none
    assert loaded.take_group_records() == [] and g.group_epoch == c.groups["cg"].group_epoch
    # members that never come back expire; their tombstones come out of tick
    loaded.tick(T0 + 200_000)
    expired = loaded.take_group_records()
    assert {gid for gid, _ in expired} == {"cg"} and g.is_empty()
    again = GroupCoordinator()
    again.load(log + commit_log + [kv for _, kv in expired], T0)
    assert again.groups["cg"].state_name == "Empty"
    assert consumer_state(again.groups["cg"]) == consumer_state(g)


def test_deleted_consumer_group_stays_deleted() -> None:
    c = GroupCoordinator()
    log: Log = []
    state = stable_pair(c, log)
    for m in state:
        cg_heartbeat(c, log, "cg", m, -1, T0 + 2)
    write, _ = c.commit_write("cg", [CommitEntry("t", 1, 9, -1, "")], T0)
    log.extend(write.records)
    c.apply(write)
    err, gwrite = c.delete_group("cg")
    assert err == E.none and gwrite is not None
    keys = [decode_key(k) for k, v in gwrite.records if v is None]
    assert ConsumerGroupMetadataKey("cg") in keys and GroupMetadataKey("cg") not in keys
    log.extend(gwrite.records)
    c.apply(gwrite)
    assert "cg" not in c.groups
    loaded = replay(log)
    assert "cg" not in loaded.groups and loaded.offsets == {}


def test_empty_consumer_group_turning_classic_and_back() -> None:
    c = GroupCoordinator(GroupTimeouts(initial_rebalance_delay_ms=3000))
    log: Log = []
    r = cg_heartbeat(c, log, "g", "m1", 0, T0)
    cg_heartbeat(c, log, "g", "m1", -1, T0 + 1)
    assert r.error_code is E.none and c.groups["g"].is_empty()
    # a classic join converts the empty consumer group: its tombstones come first
    _joined_group(c)
    records = c.take_group_records()
    assert decode_key(records[-1][1][0]) == GroupMetadataKey("g")
    assert any(decode_key(k) == ConsumerGroupMetadataKey("g") and v is None
               for _, (k, v) in records)
    log.extend(kv for _, kv in records)
    assert isinstance(replay(log).groups["g"], ClassicGroup)
    # the classic group empties; a KIP-848 join replaces it (a GroupMetadata tombstone)
    g = c.groups["g"]
    assert isinstance(g, ClassicGroup)
    c.leave_group("g", [(next(iter(g.members)), None)], T0 + 5000)
    log.extend(kv for _, kv in c.take_group_records())
    assert isinstance(replay(log).groups["g"], ClassicGroup)
    r = cg_heartbeat(c, log, "g", "m2", 0, T0 + 6000)
    assert r.error_code is E.none
    loaded = replay(log)
    assert isinstance(loaded.groups["g"], ConsumerGroup)
    assert consumer_state(loaded.groups["g"]) == consumer_state(c.groups["g"])


def test_failed_append_makes_the_group_rewrite_itself() -> None:
    c = GroupCoordinator()
    log: Log = []
    state = stable_pair(c, log)
    cg_heartbeat(c, [], "cg", "m2", -1, T0 + 2)  # these records were lost
    c.records_failed("cg")
    epoch, owned = state["m1"]
    cg_heartbeat(c, log, "cg", "m1", epoch, T0 + 3, owned)
    loaded = replay(log)
    assert consumer_state(loaded.groups["cg"]) == consumer_state(c.groups["cg"])
    assert set(loaded.groups["cg"].members) == {"m1"}  # type: ignore[attr-defined]
