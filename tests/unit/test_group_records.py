"""``__consumer_offsets`` keys and values in Kafka's formats (R-GRP-6).

Golden bytes are built here with ``struct`` straight from Kafka's JSON schemas
(OffsetCommitKey/Value, GroupMetadataKey/Value, and the KIP-848 ConsumerGroup*Key/Value of
Kafka 4.0's ``group-coordinator/src/main/resources/common/message``), independently of the
module under test.
"""

from __future__ import annotations

import contextlib
import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.group.records import (
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupCurrentMemberAssignmentValue,
    ConsumerGroupMemberMetadataKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    ConsumerGroupPartitionMetadataKey,
    ConsumerGroupPartitionMetadataValue,
    ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupTargetAssignmentMemberValue,
    ConsumerGroupTargetAssignmentMetadataKey,
    ConsumerGroupTargetAssignmentMetadataValue,
    GroupKey,
    GroupMetadataKey,
    GroupMetadataValue,
    GroupRecordError,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    TopicMetadata,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)


def s16(s: str | None) -> bytes:
    """int16-length-prefixed (nullable) string."""
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def b32(b: bytes) -> bytes:
    return struct.pack(">i", len(b)) + b


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def compact(b: bytes | None) -> bytes:
    return b"\x00" if b is None else uvarint(len(b) + 1) + b


# ---------------------------------------------------------------------- golden bytes

def test_offset_commit_key_golden() -> None:
    key = OffsetCommitKey("my-group", "events", 7)
    golden = struct.pack(">h", 1) + s16("my-group") + s16("events") + struct.pack(">i", 7)
    assert encode_key(key) == golden
    assert decode_key(golden) == key
    # version 0 has the same layout
    assert decode_key(struct.pack(">h", 0) + golden[2:]) == key


def test_group_metadata_key_golden() -> None:
    golden = struct.pack(">h", 2) + s16("g")
    assert encode_key(GroupMetadataKey("g")) == golden
    assert decode_key(golden) == GroupMetadataKey("g")


def test_offset_commit_value_v3_golden() -> None:
    value = OffsetCommitValue(offset=42, leader_epoch=5, metadata="meta", commit_timestamp=1000)
    golden = struct.pack(">hqi", 3, 42, 5) + s16("meta") + struct.pack(">q", 1000)
    assert encode_value(value) == golden
    key = OffsetCommitKey("g", "t", 0)
    assert decode_value(key, golden) == value


def test_offset_commit_value_old_versions() -> None:
    key = OffsetCommitKey("g", "t", 0)
    v0 = struct.pack(">hq", 0, 9) + s16("") + struct.pack(">q", 77)
    assert decode_value(key, v0) == OffsetCommitValue(9, -1, "", 77)
    v1 = struct.pack(">hq", 1, 9) + s16("m") + struct.pack(">qq", 77, 88)
    assert decode_value(key, v1) == OffsetCommitValue(9, -1, "m", 77)
    v2 = struct.pack(">hq", 2, 9) + s16("m") + struct.pack(">q", 77)
    assert decode_value(key, v2) == OffsetCommitValue(9, -1, "m", 77)


def test_offset_commit_value_v4_flexible_with_tagged_fields() -> None:
    key = OffsetCommitKey("g", "t", 0)
    # one unknown tagged field (tag 0, 16 bytes, e.g. a topic id) must be skipped
    tagged = uvarint(1) + uvarint(0) + uvarint(16) + bytes(range(16))
    v4 = struct.pack(">hqi", 4, 123, 2) + compact(b"hello") + struct.pack(">q", 5) + tagged
    assert decode_value(key, v4) == OffsetCommitValue(123, 2, "hello", 5)


MEMBER = MemberMetadata(
    member_id="rdkafka-1", group_instance_id="static-1", client_id="rdkafka",
    client_host="/127.0.0.1", rebalance_timeout=300000, session_timeout=45000,
    subscription=b"\x00\x01sub", assignment=b"\x00\x02asg",
)


def member_v3(m: MemberMetadata) -> bytes:
    return (s16(m.member_id) + s16(m.group_instance_id) + s16(m.client_id) + s16(m.client_host)
            + struct.pack(">ii", m.rebalance_timeout, m.session_timeout)
            + b32(m.subscription) + b32(m.assignment))


def test_group_metadata_value_v3_golden() -> None:
    value = GroupMetadataValue("consumer", 3, "range", "rdkafka-1", 1234, (MEMBER,))
    golden = (struct.pack(">h", 3) + s16("consumer") + struct.pack(">i", 3) + s16("range")
              + s16("rdkafka-1") + struct.pack(">qi", 1234, 1) + member_v3(MEMBER))
    assert encode_value(value) == golden
    assert decode_value(GroupMetadataKey("g"), golden) == value


def test_empty_group_metadata_value_has_null_protocol_and_leader() -> None:
    value = GroupMetadataValue("consumer", 0, None, None, -1, ())
    golden = (struct.pack(">h", 3) + s16("consumer") + struct.pack(">i", 0) + s16(None)
              + s16(None) + struct.pack(">qi", -1, 0))
    assert encode_value(value) == golden
    assert decode_value(GroupMetadataKey("g"), golden) == value


def test_group_metadata_value_old_versions() -> None:
    key = GroupMetadataKey("g")
    m0 = (s16("m") + s16("c") + s16("h") + struct.pack(">i", 10000) + b32(b"s") + b32(b"a"))
    v0 = (struct.pack(">h", 0) + s16("consumer") + struct.pack(">i", 1) + s16("range")
          + s16("m") + struct.pack(">i", 1) + m0)
    assert decode_value(key, v0) == GroupMetadataValue(
        "consumer", 1, "range", "m", -1,
        (MemberMetadata("m", None, "c", "h", 10000, 10000, b"s", b"a"),))
    m1 = (s16("m") + s16("c") + s16("h") + struct.pack(">ii", 60000, 10000) + b32(b"s")
          + b32(b""))
    v1 = (struct.pack(">h", 1) + s16("consumer") + struct.pack(">i", 1) + s16("range")
          + s16("m") + struct.pack(">i", 1) + m1)
    assert decode_value(key, v1) == GroupMetadataValue(
        "consumer", 1, "range", "m", -1,
        (MemberMetadata("m", None, "c", "h", 60000, 10000, b"s", b""),))
    v2 = (struct.pack(">h", 2) + s16("consumer") + struct.pack(">i", 1) + s16("range")
          + s16("m") + struct.pack(">qi", 99, 1) + m1)
    decoded = decode_value(key, v2)
    assert isinstance(decoded, GroupMetadataValue)
    assert decoded.current_state_timestamp == 99


def test_group_metadata_value_v4_flexible() -> None:
    key = GroupMetadataKey("g")
    no_tags = uvarint(0)
    member = (compact(b"m") + compact(None) + compact(b"c") + compact(b"h")
              + struct.pack(">ii", 60000, 10000) + compact(b"s") + compact(b"a") + no_tags)
    v4 = (struct.pack(">h", 4) + compact(b"consumer") + struct.pack(">i", 2) + compact(b"range")
          + compact(None) + struct.pack(">q", 7) + uvarint(2) + member + no_tags)
    assert decode_value(key, v4) == GroupMetadataValue(
        "consumer", 2, "range", None, 7,
        (MemberMetadata("m", None, "c", "h", 60000, 10000, b"s", b"a"),))


def test_tombstones_and_ignored_keys() -> None:
    assert encode_value(None) is None
    assert decode_value(OffsetCommitKey("g", "t", 0), None) is None
    assert decode_value(GroupMetadataKey("g"), None) is None
    # KIP-848 keys (versions 3..8) are decoded (below); later record kinds (share groups,
    # streams groups, ...) are ignored
    assert decode_key(struct.pack(">h", 3) + s16("g")) == ConsumerGroupMetadataKey("g")
    assert decode_key(struct.pack(">h", 9) + s16("g")) is None
    assert decode_key(struct.pack(">h", 11) + s16("g")) is None
    for key in (ConsumerGroupMetadataKey("g"), ConsumerGroupMemberMetadataKey("g", "m"),
                ConsumerGroupCurrentMemberAssignmentKey("g", "m")):
        assert decode_value(key, None) is None


@pytest.mark.parametrize("data", [
    b"", b"\x00", b"\x00\x01\x00\x05ab", b"\x00\x02\xff\xff", b"\xff\xff",
])
def test_malformed_keys_raise_group_record_error(data: bytes) -> None:
    with pytest.raises(GroupRecordError):
        decode_key(data)


def test_malformed_values_raise_group_record_error() -> None:
    key = OffsetCommitKey("g", "t", 0)
    with pytest.raises(GroupRecordError):
        decode_value(key, struct.pack(">h", 9) + bytes(20))
    with pytest.raises(GroupRecordError):
        decode_value(key, struct.pack(">hq", 3, 1))
    with pytest.raises(GroupRecordError):
        decode_value(key, struct.pack(">hqi", 3, 1, 0) + b"\x00\x02\xff\xfe" + bytes(8))


# ---------------------------------------------------------------------- round trips

text = st.text(max_size=40)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
members = st.builds(MemberMetadata, text, st.none() | text, text, text, int32, int32,
                    st.binary(max_size=60), st.binary(max_size=60))


@given(st.builds(OffsetCommitKey, text, text, int32) | st.builds(GroupMetadataKey, text))
def test_key_round_trip(key: OffsetCommitKey | GroupMetadataKey) -> None:
    assert decode_key(encode_key(key)) == key


@given(st.builds(OffsetCommitValue, int64, int32, text, int64))
def test_offset_commit_value_round_trip(value: OffsetCommitValue) -> None:
    assert decode_value(OffsetCommitKey("g", "t", 1), encode_value(value)) == value


@given(st.builds(GroupMetadataValue, text, int32, st.none() | text, st.none() | text, int64,
                 st.lists(members, max_size=4).map(tuple)))
def test_group_metadata_value_round_trip(value: GroupMetadataValue) -> None:
    assert decode_value(GroupMetadataKey("g"), encode_value(value)) == value


@given(st.binary(max_size=80))
def test_decoding_garbage_raises_only_group_record_error(data: bytes) -> None:
    try:
        key = decode_key(data)
    except GroupRecordError:
        return
    for k in (key, OffsetCommitKey("g", "t", 0), GroupMetadataKey("g"), *CG_KEYS):
        if k is not None:
            with contextlib.suppress(GroupRecordError):
                decode_value(k, data)


# ---------------------------------------------------------------------- KIP-848 records

T1 = uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
T2 = uuid.UUID(int=7)
NO_TAGS = b"\x00"
CG_KEYS: tuple[GroupKey, ...] = (
    ConsumerGroupMetadataKey("g"), ConsumerGroupPartitionMetadataKey("g"),
    ConsumerGroupMemberMetadataKey("g", "m"), ConsumerGroupTargetAssignmentMetadataKey("g"),
    ConsumerGroupTargetAssignmentMemberKey("g", "m"),
    ConsumerGroupCurrentMemberAssignmentKey("g", "m"),
)


def carray(items: list[bytes]) -> bytes:
    """A compact array: uvarint(count + 1), then the elements."""
    return uvarint(len(items) + 1) + b"".join(items)


def cstr(s: str | None) -> bytes:
    return compact(None if s is None else s.encode())


@pytest.mark.parametrize(("key", "golden"), [
    (ConsumerGroupMetadataKey("grp"), struct.pack(">h", 3) + s16("grp")),
    (ConsumerGroupPartitionMetadataKey("grp"), struct.pack(">h", 4) + s16("grp")),
    (ConsumerGroupMemberMetadataKey("grp", "m-1"), struct.pack(">h", 5) + s16("grp") + s16("m-1")),
    (ConsumerGroupTargetAssignmentMetadataKey("grp"), struct.pack(">h", 6) + s16("grp")),
    (ConsumerGroupTargetAssignmentMemberKey("grp", "m-1"),
     struct.pack(">h", 7) + s16("grp") + s16("m-1")),
    (ConsumerGroupCurrentMemberAssignmentKey("grp", "m-1"),
     struct.pack(">h", 8) + s16("grp") + s16("m-1")),
])
def test_consumer_group_keys_golden(key: GroupKey, golden: bytes) -> None:
    assert encode_key(key) == golden
    assert decode_key(golden) == key


def test_consumer_group_metadata_value_golden_and_tagged_metadata_hash() -> None:
    key = ConsumerGroupMetadataKey("g")
    golden = struct.pack(">hi", 0, 12) + NO_TAGS
    assert encode_value(ConsumerGroupMetadataValue(12)) == golden
    # Kafka 4.1+ adds MetadataHash as tagged field 0 (int64): skipped
    with_hash = struct.pack(">hi", 0, 12) + uvarint(1) + uvarint(0) + uvarint(8) \
        + struct.pack(">q", -5)
    assert decode_value(key, with_hash) == ConsumerGroupMetadataValue(12)


def test_current_member_assignment_value_golden() -> None:
    """Built field by field from ConsumerGroupCurrentMemberAssignmentValue.json (v0,
    flexible): int32 MemberEpoch, int32 PreviousMemberEpoch, int8 State, then two compact
    arrays of TopicPartitions {uuid TopicId, []int32 Partitions, tagged fields}, then the
    value's tagged fields."""
    golden = (struct.pack(">hiib", 0, 7, 6, 1)
              + carray([T1.bytes + carray([struct.pack(">i", 0), struct.pack(">i", 2)])
                        + NO_TAGS])
              + carray([T2.bytes + carray([struct.pack(">i", 5)]) + NO_TAGS])
              + NO_TAGS)
    value = ConsumerGroupCurrentMemberAssignmentValue(7, 6, 1, ((T1, (0, 2)),), ((T2, (5,)),))
    key = ConsumerGroupCurrentMemberAssignmentKey("g", "m")
    assert decode_value(key, golden) == value
    assert encode_value(value) == golden
    # a newer writer's AssignmentEpochs (tagged field 0 of TopicPartitions) is skipped
    epochs = carray([struct.pack(">i", 3), struct.pack(">i", 4)])
    tagged = (struct.pack(">hiib", 0, 7, 6, 1)
              + carray([T1.bytes + carray([struct.pack(">i", 0), struct.pack(">i", 2)])
                        + uvarint(1) + uvarint(0) + uvarint(len(epochs)) + epochs])
              + carray([]) + NO_TAGS)
    assert decode_value(key, tagged) == ConsumerGroupCurrentMemberAssignmentValue(
        7, 6, 1, ((T1, (0, 2)),), ())


def test_member_metadata_value_golden() -> None:
    value = ConsumerGroupMemberMetadataValue(
        instance_id=None, rack_id="r1", client_id="rdkafka", client_host="/127.0.0.1",
        subscribed_topic_names=("a", "b"), subscribed_topic_regex=None,
        rebalance_timeout_ms=300000, server_assignor="uniform")
    golden = (struct.pack(">h", 0) + cstr(None) + cstr("r1") + cstr("rdkafka")
              + cstr("/127.0.0.1") + carray([cstr("a"), cstr("b")]) + cstr(None)
              + struct.pack(">i", 300000) + cstr("uniform") + NO_TAGS)
    assert encode_value(value) == golden
    assert decode_value(ConsumerGroupMemberMetadataKey("g", "m"), golden) == value
    # ClassicMemberMetadata (tagged field 0) written by a Kafka with classic members
    classic = carray([])  # SupportedProtocols, tagged struct's own fields
    with_tag = golden[:-1] + uvarint(1) + uvarint(0) + uvarint(5 + len(classic)) \
        + struct.pack(">i", 45000) + classic + NO_TAGS
    assert decode_value(ConsumerGroupMemberMetadataKey("g", "m"), with_tag) == value


def test_partition_and_target_values_golden() -> None:
    pm = ConsumerGroupPartitionMetadataValue((TopicMetadata(T1, "events", 3),))
    golden = (struct.pack(">h", 0) + carray([T1.bytes + cstr("events") + struct.pack(">i", 3)
                                             + carray([]) + NO_TAGS]) + NO_TAGS)
    assert encode_value(pm) == golden
    assert decode_value(ConsumerGroupPartitionMetadataKey("g"), golden) == pm
    tm = ConsumerGroupTargetAssignmentMemberValue(((T1, (1,)),))
    golden = (struct.pack(">h", 0) + carray([T1.bytes + carray([struct.pack(">i", 1)])
                                             + NO_TAGS]) + NO_TAGS)
    assert encode_value(tm) == golden
    assert decode_value(ConsumerGroupTargetAssignmentMemberKey("g", "m"), golden) == tm
    golden = struct.pack(">hi", 0, 9) + NO_TAGS
    assert encode_value(ConsumerGroupTargetAssignmentMetadataValue(9)) == golden
    assert decode_value(ConsumerGroupTargetAssignmentMetadataKey("g"), golden) \
        == ConsumerGroupTargetAssignmentMetadataValue(9)


def test_malformed_consumer_group_values_raise_group_record_error() -> None:
    with pytest.raises(GroupRecordError):  # an unknown value version
        decode_value(ConsumerGroupMetadataKey("g"), struct.pack(">hi", 1, 12) + NO_TAGS)
    with pytest.raises(GroupRecordError):  # truncated uuid
        decode_value(ConsumerGroupTargetAssignmentMemberKey("g", "m"),
                     struct.pack(">h", 0) + carray([T1.bytes[:5]]))
    with pytest.raises(GroupRecordError):  # null client id
        decode_value(ConsumerGroupMemberMetadataKey("g", "m"),
                     struct.pack(">h", 0) + cstr(None) + cstr(None) + cstr(None))


uuids = st.uuids()
tps = st.lists(st.tuples(uuids, st.lists(int32, max_size=5).map(tuple)), max_size=4).map(tuple)
strings = st.lists(text, max_size=4).map(tuple)
int8 = st.integers(-128, 127)


@given(st.one_of(
    st.builds(ConsumerGroupMetadataValue, int32),
    st.builds(ConsumerGroupTargetAssignmentMetadataValue, int32),
    st.builds(ConsumerGroupPartitionMetadataValue, st.lists(st.builds(
        TopicMetadata, uuids, text, int32,
        st.lists(st.tuples(int32, strings), max_size=3).map(tuple)), max_size=3).map(tuple)),
    st.builds(ConsumerGroupMemberMetadataValue, st.none() | text, st.none() | text, text, text,
              strings, st.none() | text, int32, st.none() | text),
    st.builds(ConsumerGroupTargetAssignmentMemberValue, tps),
    st.builds(ConsumerGroupCurrentMemberAssignmentValue, int32, int32, int8, tps, tps),
))
def test_consumer_group_value_round_trip(value: object) -> None:
    key = {
        ConsumerGroupMetadataValue: ConsumerGroupMetadataKey("g"),
        ConsumerGroupTargetAssignmentMetadataValue: ConsumerGroupTargetAssignmentMetadataKey("g"),
        ConsumerGroupPartitionMetadataValue: ConsumerGroupPartitionMetadataKey("g"),
        ConsumerGroupMemberMetadataValue: ConsumerGroupMemberMetadataKey("g", "m"),
        ConsumerGroupTargetAssignmentMemberValue: ConsumerGroupTargetAssignmentMemberKey("g", "m"),
        ConsumerGroupCurrentMemberAssignmentValue:
            ConsumerGroupCurrentMemberAssignmentKey("g", "m"),
    }[type(value)]
    encoded = encode_value(value)  # type: ignore[arg-type]
    assert encoded is not None and encoded[:2] == b"\x00\x00"
    assert decode_value(key, encoded) == value


@given(st.sampled_from(CG_KEYS).flatmap(
    lambda k: st.builds(type(k), text) if not hasattr(k, "member_id")
    else st.builds(type(k), text, text)))
def test_consumer_group_key_round_trip(key: GroupKey) -> None:
    assert decode_key(encode_key(key)) == key
