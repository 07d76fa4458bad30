"""The pure coordinator: commits → __consumer_offsets records → load (R-GRP-6/7)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode as E

from headrace.group.classic import ClassicGroup, GroupState, GroupTimeouts, JoinRequest
from headrace.group.coordinator import CommitEntry, GroupCoordinator, subscribed_topics
from headrace.group.records import (
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
