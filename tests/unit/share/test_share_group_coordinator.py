"""Share groups in the pure group coordinator (KIP-932, issue 25 item 1): one group id
namespace with classic and consumer groups, as Kafka 4.2's GroupMetadataManager answers a
group of another type; records 10-15 replayed on load; session expiry on the tick; the
request validation that runs before the group is looked up; and the share group configs'
broker-level bounds (ShareGroupConfig / GroupCoordinatorConfig, Range.between)."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode as E

from headrace.config import BrokerConfig, ConfigError, GroupConfigError, validate_group_configs
from headrace.group.assignors import TopicInfo
from headrace.group.classic import JoinRequest
from headrace.group.coordinator import GroupCoordinator
from headrace.share.group import ShareGroup, invalid_heartbeat

T0 = 1_700_000_000_000
TOPIC = uuid.UUID(int=7)
TOPICS = {"t": TopicInfo(TOPIC, 2)}


def share_group_with_member(c: GroupCoordinator, group_id: str = "sg",
                            member: str = "m1") -> ShareGroup:
    g = ShareGroup(group_id, session_timeout_ms=1000)
    r = g.heartbeat(member_id=member, member_epoch=0, topics=TOPICS, now_ms=T0,
                    subscribed_topic_names=["t"])
    assert r.error_code == E.none
    c.add_share_group(g)
    c.queue_records(group_id, r.records)
    return g


def test_a_share_group_is_replayed_from_its_records() -> None:
    c = GroupCoordinator()
    g = share_group_with_member(c)
    records = [kv for _, kv in c.take_group_records()]
    assert records and all(k[0] == 0 and 10 <= k[1] <= 15 for k, _ in records)
    loaded = GroupCoordinator()
    loaded.load(records, T0)
    again = loaded.groups["sg"]
    assert isinstance(again, ShareGroup)
    assert set(again.members) == {"m1"} and again.group_epoch == g.group_epoch
    assert [(x.group_id, x.group_type, x.state) for x in loaded.list_groups(types={"SHARE"})] \
        == [("sg", "share", "Stable")]
    assert loaded.list_groups(types={"classic", "consumer"}) == []


def test_the_tick_expires_a_silent_member_and_writes_it() -> None:
    c = GroupCoordinator()
    g = share_group_with_member(c)
    c.take_group_records()
    c.tick(T0 + 999)
    assert set(g.members) == {"m1"} and c.take_group_records() == []
    c.tick(T0 + 1000)
    assert g.members == {} and g.state_name == "Empty"
    assert c.take_group_records()  # the member's tombstones and the new epoch


def test_other_group_apis_on_a_share_group() -> None:
    c = GroupCoordinator()
    share_group_with_member(c)
    join = JoinRequest("m", None, "cl", "/h", 10_000, 20_000, "consumer", (("range", b""),))
    r = c.join_group("sg", join, T0)
    # Kafka's classicGroupJoin: INCONSISTENT_GROUP_PROTOCOL, the member id unknown ("")
    assert (r.error, r.member_id) == (E.inconsistent_group_protocol, "")  # type: ignore[union-attr]
    assert c.validate_commit("sg", "", -1, None, T0) == E.group_id_not_found
    assert c.delete_offsets("sg", [("t", 0)])[0] == E.group_id_not_found
    assert c.delete_group("sg")[0] == E.non_empty_group
    # still a share group, untouched
    assert isinstance(c.groups["sg"], ShareGroup) and c.groups["sg"].members


def test_deleting_an_empty_share_group_tombstones_it() -> None:
    c = GroupCoordinator()
    g = share_group_with_member(c)
    log = [kv for _, kv in c.take_group_records()]
    r = g.heartbeat(member_id="m1", member_epoch=-1, topics=TOPICS, now_ms=T0)
    log += r.records
    err, write = c.delete_group("sg")
    assert err == E.none and write is not None
    log += write.records
    loaded = GroupCoordinator()
    loaded.load(log, T0)
    assert "sg" not in loaded.groups


@pytest.mark.parametrize(("group", "member", "epoch", "rack", "names", "message"), [
    ("g", "", 1, None, None, "MemberId can't be empty."),
    ("", "", 1, None, None, "MemberId can't be empty."),   # the member id is checked first
    ("", "m", 1, None, None, "GroupId can't be empty."),
    (" ", "m", 1, None, None, "GroupId can't be empty."),
    ("g", "m", 1, "", None, "RackId can't be empty."),
    ("g", "m", 0, None, None, "SubscribedTopicNames must be set in first request."),
    ("g", "m", -2, None, None, "MemberEpoch is invalid."),
])
def test_invalid_heartbeats_before_any_group(group: str, member: str, epoch: int,
                                             rack: str | None, names: list[str] | None,
                                             message: str) -> None:
    r = invalid_heartbeat(group, member, epoch, rack, names)
    assert r is not None and (r.error_code, r.error_message) == (E.invalid_request, message)


def test_valid_heartbeats_pass() -> None:
    assert invalid_heartbeat("g", "m", 0, None, ["t"]) is None
    assert invalid_heartbeat("g", "m", -1, None, None) is None
    assert invalid_heartbeat("g", "m", 5, "rack", None) is None


# ------------------------------------------------------------------ configs


@pytest.mark.parametrize(("name", "value"), [
    ("group.share.delivery.count.limit", "1"),
    ("group.share.delivery.count.limit", "11"),
    ("group.share.partition.max.record.locks", "99"),
    ("group.share.partition.max.record.locks", "10001"),
    ("group.share.max.size", "1001"),
    ("group.share.max.size", "0"),
    ("group.share.record.lock.duration.ms", "3600001"),
    ("group.share.min.record.lock.duration.ms", "30001"),
    ("group.share.max.record.lock.duration.ms", "29999"),
    ("group.share.max.share.sessions", "0"),
    ("group.share.assignors", "uniform"),
])
def test_broker_share_configs_outside_kafkas_range_are_refused(name: str, value: str) -> None:
    with pytest.raises(ConfigError):
        BrokerConfig.from_mapping({name: value})


def test_broker_share_configs_at_their_bounds_are_accepted() -> None:
    c = BrokerConfig.from_mapping({"group.share.delivery.count.limit": "10",
                                   "group.share.partition.max.record.locks": "100",
                                   "group.share.max.size": "1000"})
    assert (c["group.share.delivery.count.limit"], c["group.share.partition.max.record.locks"],
            c["group.share.max.size"], c["group.share.assignors"]) == (10, 100, 1000, "simple")
    assert BrokerConfig.from_mapping({})["group.share.delivery.count.limit"] == 5


@pytest.mark.parametrize(("overrides", "message"), [
    ({"share.session.timeout.ms": "44999"},
     "share.session.timeout.ms must be greater than or equal to "
     "group.share.min.session.timeout.ms"),
    ({"share.heartbeat.interval.ms": "15001"},
     "share.heartbeat.interval.ms must be less than or equal to "
     "group.share.max.heartbeat.interval.ms"),
    ({"share.record.lock.duration.ms": "14999"},
     "share.record.lock.duration.ms must be greater than or equal to "
     "group.share.min.record.lock.duration.ms"),
    ({"share.delivery.count.limit": "3"}, "Unknown group config name"),  # Kafka 4.3's
])
def test_share_group_configs_are_bounded_by_the_broker(overrides: dict[str, str],
                                                       message: str) -> None:
    with pytest.raises(GroupConfigError, match=message):
        validate_group_configs(BrokerConfig.from_mapping({}), overrides)
