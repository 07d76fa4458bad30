"""The share coordinator's durable state, ``__share_group_state`` (KIP-932).

Kafka classes these tests follow: ``ShareCoordinatorShard`` (and its
``ShareCoordinatorShardTest``), ``PersisterStateBatchCombiner``,
``ShareCoordinatorRecordSerde`` / ``ShareCoordinatorRecordHelpers``,
``ShareCoordinatorService.partitionFor`` / ``shareGroupStateTopicConfigs`` and
``SharePartitionKey.asCoordinatorKey``. Golden bytes are built here with ``struct`` from the
ShareSnapshotKey/Value and ShareUpdateKey/Value JSON schemas, independently of the module.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.delete_share_group_state.v0 import request as delete_req
from kio.schema.errors import ErrorCode
from kio.schema.initialize_share_group_state.v0 import request as init_req
from kio.schema.read_share_group_state.v0 import request as read_req
from kio.schema.read_share_group_state_summary.v0 import request as summary_req_v0
from kio.schema.read_share_group_state_summary.v1 import request as summary_req_v1
from kio.schema.write_share_group_state.v0 import request as write_req_v0
from kio.schema.write_share_group_state.v1 import request as write_req_v1
from kio.static.primitive import i8, i16, i32, i64

from headrace.share.state import (
    NEGATIVE_PARTITION_ID,
    NULL_TOPIC_ID,
    READ_UNINITIALIZED_SHARE_PARTITION,
    SHARE_GROUP_STATE_TOPIC,
    WRITE_UNINITIALIZED_SHARE_PARTITION,
    KeyStatus,
    ShareCoordinatorConfig,
    ShareCoordinatorShard,
    ShareSnapshotKey,
    ShareSnapshotValue,
    ShareStateRecord,
    ShareStateRecordError,
    ShareUpdateKey,
    ShareUpdateValue,
    StateBatch,
    combine_state_batches,
    coordinator_key,
    decode_key,
    decode_record,
    decode_value,
    encode_key,
    encode_value,
    kafka_uuid_string,
    partition_for,
    state_topic_configs,
)

GROUP = "group1"
TOPIC = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
OTHER_TOPIC = uuid.UUID("00000000-0000-0000-0000-000000000001")
NOW = 1_700_000_000_000


# ---------------------------------------------------------------------- request builders


def init(partition: int = 0, state_epoch: int = 0, start_offset: int = 0,
         topic: uuid.UUID | None = TOPIC, group: str = GROUP,
         ) -> init_req.InitializeShareGroupStateRequest:
    return init_req.InitializeShareGroupStateRequest(group_id=group, topics=(
        init_req.InitializeStateData(topic_id=topic, partitions=(init_req.PartitionData(
            partition=i32(partition), state_epoch=i32(state_epoch),
            start_offset=i64(start_offset)),)),))


def batch(first: int, last: int, state: int = 0, count: int = 1) -> StateBatch:
    return StateBatch(first_offset=first, last_offset=last, delivery_count=count,
                      delivery_state=state)


def write(batches: tuple[StateBatch, ...] = (), *, partition: int = 0, state_epoch: int = 0,
          leader_epoch: int = 0, start_offset: int = -1, dcc: int | None = None,
          topic: uuid.UUID | None = TOPIC, group: str = GROUP,
          ) -> write_req_v0.WriteShareGroupStateRequest | write_req_v1.WriteShareGroupStateRequest:
    if dcc is None:
        return write_req_v0.WriteShareGroupStateRequest(group_id=group, topics=(
            write_req_v0.WriteStateData(topic_id=topic, partitions=(write_req_v0.PartitionData(
                partition=i32(partition), state_epoch=i32(state_epoch),
                leader_epoch=i32(leader_epoch), start_offset=i64(start_offset),
                state_batches=tuple(write_req_v0.StateBatch(
                    first_offset=i64(b.first_offset), last_offset=i64(b.last_offset),
                    delivery_state=i8(b.delivery_state), delivery_count=i16(b.delivery_count))
                    for b in batches)),)),))
    return write_req_v1.WriteShareGroupStateRequest(group_id=group, topics=(
        write_req_v1.WriteStateData(topic_id=topic, partitions=(write_req_v1.PartitionData(
            partition=i32(partition), state_epoch=i32(state_epoch),
            leader_epoch=i32(leader_epoch), start_offset=i64(start_offset),
            delivery_complete_count=i32(dcc),
            state_batches=tuple(write_req_v1.StateBatch(
                first_offset=i64(b.first_offset), last_offset=i64(b.last_offset),
                delivery_state=i8(b.delivery_state), delivery_count=i16(b.delivery_count))
                for b in batches)),)),))


def read(leader_epoch: int = 0, partition: int = 0, topic: uuid.UUID | None = TOPIC,
         ) -> read_req.ReadShareGroupStateRequest:
    return read_req.ReadShareGroupStateRequest(group_id=GROUP, topics=(read_req.ReadStateData(
        topic_id=topic, partitions=(read_req.PartitionData(
            partition=i32(partition), leader_epoch=i32(leader_epoch)),)),))


def summary(v1: bool = True, partition: int = 0,
            ) -> (summary_req_v0.ReadShareGroupStateSummaryRequest
                  | summary_req_v1.ReadShareGroupStateSummaryRequest):
    if v1:
        return summary_req_v1.ReadShareGroupStateSummaryRequest(group_id=GROUP, topics=(
            summary_req_v1.ReadStateSummaryData(topic_id=TOPIC, partitions=(
                summary_req_v1.PartitionData(partition=i32(partition), leader_epoch=i32(0)),)),))
    return summary_req_v0.ReadShareGroupStateSummaryRequest(group_id=GROUP, topics=(
        summary_req_v0.ReadStateSummaryData(topic_id=TOPIC, partitions=(
            summary_req_v0.PartitionData(partition=i32(partition), leader_epoch=i32(0)),)),))


def delete(partition: int = 0, topic: uuid.UUID | None = TOPIC,
           ) -> delete_req.DeleteShareGroupStateRequest:
    return delete_req.DeleteShareGroupStateRequest(group_id=GROUP, topics=(
        delete_req.DeleteStateData(topic_id=topic, partitions=(
            delete_req.PartitionData(partition=i32(partition)),)),))


def shard(per_snapshot: int = 500) -> ShareCoordinatorShard:
    return ShareCoordinatorShard(
        ShareCoordinatorConfig(snapshot_update_records_per_snapshot=per_snapshot),
        topics={TOPIC: 4, OTHER_TOPIC: 2})


def apply(s: ShareCoordinatorShard, result_records: tuple[ShareStateRecord, ...]) -> None:
    """What the shell does: append, then replay each record (here via its bytes)."""
    for r in result_records:
        s.replay_bytes(encode_key(r.key), encode_value(r.value))


def initialized(per_snapshot: int = 500, **kw: int) -> ShareCoordinatorShard:
    s = shard(per_snapshot)
    res = s.initialize_state(init(**kw), NOW)
    apply(s, res.records)
    return s


def part_error(response: object) -> tuple[ErrorCode, str | None]:
    p = response.results[0].partitions[0]  # type: ignore[attr-defined]
    return p.error_code, p.error_message


# ---------------------------------------------------------------------- golden bytes


def s16(s: str) -> bytes:
    return struct.pack(">h", len(s.encode())) + s.encode()


def test_keys_are_type_prefixed_as_kafkas_coordinator_serde() -> None:
    """ShareSnapshotKey (apiKey 0) / ShareUpdateKey (apiKey 1): int16 type, string GroupId,
    uuid TopicId, int32 Partition (MessageUtil.toCoordinatorTypePrefixedBytes)."""
    body = s16("g") + TOPIC.bytes + struct.pack(">i", 7)
    assert encode_key(ShareSnapshotKey("g", TOPIC, 7)) == struct.pack(">h", 0) + body
    assert encode_key(ShareUpdateKey("g", TOPIC, 7)) == struct.pack(">h", 1) + body


def test_snapshot_value_bytes() -> None:
    """ShareSnapshotValue v0: version, uint16 SnapshotEpoch, StateEpoch, LeaderEpoch,
    StartOffset, CreateTimestamp, WriteTimestamp, compact []StateBatch, then tagged fields
    with DeliveryCompleteCount as tag 0 when not -1."""
    v = ShareSnapshotValue(snapshot_epoch=40000, state_epoch=3, leader_epoch=5, start_offset=100,
                           create_timestamp=NOW, write_timestamp=NOW + 1,
                           state_batches=(batch(100, 109, 2, 1), batch(110, 119, 0, 3)),
                           delivery_complete_count=10)
    expected = (struct.pack(">hHiiqqq", 0, 40000, 3, 5, 100, NOW, NOW + 1)
                + b"\x03"
                + struct.pack(">qqbh", 100, 109, 2, 1) + b"\x00"
                + struct.pack(">qqbh", 110, 119, 0, 3) + b"\x00"
                + b"\x01" + b"\x00" + b"\x04" + struct.pack(">i", 10))
    assert encode_value(v) == expected
    no_count = ShareSnapshotValue(0, 0, -1, -1, 0, 0)
    assert encode_value(no_count) == struct.pack(">hHiiqqq", 0, 0, 0, -1, -1, 0, 0) + b"\x01\x00"


def test_update_value_bytes() -> None:
    """ShareUpdateValue v0: version, uint16 SnapshotEpoch, LeaderEpoch, StartOffset,
    compact []StateBatch, tagged fields."""
    v = ShareUpdateValue(snapshot_epoch=2, leader_epoch=1, start_offset=-1,
                         state_batches=(batch(0, 9, 4, 5),))
    assert encode_value(v) == (struct.pack(">hHiq", 0, 2, 1, -1) + b"\x02"
                               + struct.pack(">qqbh", 0, 9, 4, 5) + b"\x00" + b"\x00")
    assert encode_value(None) is None


# ---------------------------------------------------------------------- round trips

batches_st = st.lists(st.builds(
    StateBatch, st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**15), 2**15 - 1), st.integers(-128, 127)), max_size=5).map(tuple)
i32_st = st.integers(-(2**31), 2**31 - 1)
i64_st = st.integers(-(2**63), 2**63 - 1)


@given(st.text(max_size=30), st.uuids(), i32_st, st.booleans())
def test_key_round_trip(group: str, topic: uuid.UUID, partition: int, snapshot: bool) -> None:
    """Both key types decode to what was encoded (ShareCoordinatorRecordSerde)."""
    key = (ShareSnapshotKey if snapshot else ShareUpdateKey)(group, topic, partition)
    assert decode_key(encode_key(key)) == key


@given(st.integers(0, 65535), i32_st, i32_st, i64_st, i64_st, i64_st, batches_st, i32_st)
def test_snapshot_value_round_trip(se: int, state: int, leader: int, start: int, ct: int,
                                   wt: int, batches: tuple[StateBatch, ...], dcc: int) -> None:
    value = ShareSnapshotValue(se, state, leader, start, ct, wt, batches, dcc)
    key = ShareSnapshotKey("g", TOPIC, 0)
    assert decode_value(key, encode_value(value)) == value


@given(st.integers(0, 65535), i32_st, i64_st, batches_st, i32_st)
def test_update_value_round_trip(se: int, leader: int, start: int,
                                 batches: tuple[StateBatch, ...], dcc: int) -> None:
    value = ShareUpdateValue(se, leader, start, batches, dcc)
    key = ShareUpdateKey("g", TOPIC, 0)
    assert decode_value(key, encode_value(value)) == value


def test_tombstone_round_trip() -> None:
    """A tombstone is a ShareSnapshot key with a null value (newShareStateTombstoneRecord)."""
    rec = ShareStateRecord(ShareSnapshotKey("g", TOPIC, 1), None)
    assert decode_record(rec.key_bytes(), rec.value_bytes()) == rec


def test_record_type_and_value_must_match() -> None:
    with pytest.raises(ValueError):
        ShareStateRecord(ShareUpdateKey("g", TOPIC, 0), ShareSnapshotValue(0, 0, 0, 0, 0, 0))
    with pytest.raises(ValueError):  # uint16 SnapshotEpoch out of range: our misuse
        encode_value(ShareUpdateValue(65536, 0, 0))


def test_decoder_rejects_bad_versions_and_types() -> None:
    with pytest.raises(ShareStateRecordError):
        decode_key(struct.pack(">h", 2) + s16("g") + TOPIC.bytes + b"\0\0\0\0")
    with pytest.raises(ShareStateRecordError):
        decode_value(ShareSnapshotKey("g", TOPIC, 0), struct.pack(">h", 1) + b"\0" * 40)
    with pytest.raises(ShareStateRecordError):  # tag 0 must be 4 bytes
        good = encode_value(ShareUpdateValue(0, 0, 0, (), 5))
        assert good is not None
        decode_value(ShareUpdateKey("g", TOPIC, 0), good[:-5] + b"\x03" + b"\0\0\0")


@settings(max_examples=400)
@given(st.binary(max_size=120), st.booleans())
def test_decoder_fuzz_raises_only_its_own_error(data: bytes, snapshot: bool) -> None:
    """Bad bytes raise ShareStateRecordError and nothing else (the h11 fuzz invariant)."""
    key: ShareSnapshotKey | ShareUpdateKey = (
        ShareSnapshotKey("g", TOPIC, 0) if snapshot else ShareUpdateKey("g", TOPIC, 0))
    for fn in (lambda: decode_key(data), lambda: decode_value(key, data)):
        with contextlib.suppress(ShareStateRecordError):
            fn()


@settings(max_examples=300)
@given(st.integers(0, 65535), i64_st, batches_st, i32_st, st.data())
def test_decoder_fuzz_on_mutated_good_values(se: int, start: int, batches: tuple[StateBatch, ...],
                                             dcc: int, data: st.DataObject) -> None:
    """Truncated or bit-flipped good values also raise only ShareStateRecordError."""
    good = encode_value(ShareSnapshotValue(se, 1, 2, start, 3, 4, batches, dcc))
    assert good is not None
    cut = data.draw(st.integers(0, len(good)))
    flip = data.draw(st.integers(0, len(good) - 1))
    mutated = bytearray(good[:cut] if data.draw(st.booleans()) else good)
    if flip < len(mutated):
        mutated[flip] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(ShareStateRecordError):
        decode_value(ShareSnapshotKey("g", TOPIC, 0), bytes(mutated))


# ---------------------------------------------------------------------- placement, topic


def java_hash(s: str) -> int:
    h = 0
    for ch in s:  # ASCII in these tests: one UTF-16 unit per char
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def test_uuid_string_is_kafkas_base64() -> None:
    """Kafka's Uuid.toString is URL-safe base64 without padding (22 characters)."""
    assert kafka_uuid_string(OTHER_TOPIC) == "AAAAAAAAAAAAAAAAAAAAAQ"
    assert kafka_uuid_string(uuid.UUID(bytes=b"\xfb" * 16)) == "-_v7-_v7-_v7-_v7-_v7-w"


def test_partition_for_hashes_the_coordinator_key() -> None:
    """ShareCoordinatorService.partitionFor: Utils.abs("g:topicId:p".hashCode()) % n, with
    SharePartitionKey.asCoordinatorKey's topic id in Kafka's Uuid.toString form."""
    key = "group1:AAAAAAAAAAAAAAAAAAAAAQ:3"
    assert coordinator_key("group1", OTHER_TOPIC, 3) == key
    assert java_hash("hello") == 99162322  # the well-known Java value
    assert partition_for("group1", OTHER_TOPIC, 3) == (java_hash(key) & 0x7FFFFFFF) % 50
    assert partition_for("group1", OTHER_TOPIC, 3, 7) == (java_hash(key) & 0x7FFFFFFF) % 7
    spread = {partition_for(f"g{i}", TOPIC, i % 8) for i in range(500)}
    assert len(spread) == 50


def test_state_topic_configs() -> None:
    """shareGroupStateTopicConfigs: delete (pruned by the coordinator, KIP-932), not compact;
    RF 3 and min ISR 2 by default."""
    configs = state_topic_configs()
    assert SHARE_GROUP_STATE_TOPIC == "__share_group_state"
    assert configs["cleanup.policy"] == "delete"
    assert configs["min.insync.replicas"] == "2"
    assert configs["segment.bytes"] == str(100 * 1024 * 1024)
    assert ShareCoordinatorConfig().state_topic_replication_factor == 3
    assert ShareCoordinatorConfig().state_topic_num_partitions == 50
    assert ShareCoordinatorConfig().snapshot_update_records_per_snapshot == 500
    cfg = ShareCoordinatorConfig.from_properties({
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.snapshot.update.records.per.snapshot": "3"})
    assert state_topic_configs(cfg)["min.insync.replicas"] == "1"
    assert cfg.snapshot_update_records_per_snapshot == 3
    with pytest.raises(ValueError):
        ShareCoordinatorConfig(snapshot_update_records_per_snapshot=501)


# ---------------------------------------------------------------------- combineStateBatches


def test_combine_kafka_examples() -> None:
    """PersisterStateBatchCombinerTest-style cases: same-state merge, higher delivery info
    wins an overlap, start offset cuts and drops."""
    # contiguous, same state -> one batch
    assert combine_state_batches([batch(0, 9)], [batch(10, 19)], -1) == (batch(0, 19),)
    # contiguous, different state -> kept apart
    assert combine_state_batches([batch(0, 9)], [batch(10, 19, 2)], -1) == (
        batch(0, 9), batch(10, 19, 2))
    # candidate with higher count swallowed by prev: split in three
    assert combine_state_batches([batch(0, 19, 0, 1)], [batch(5, 9, 0, 2)], -1) == (
        batch(0, 4, 0, 1), batch(5, 9, 0, 2), batch(10, 19, 0, 1))
    # lower priority inside a higher one: the higher one stays whole
    assert combine_state_batches([batch(0, 19, 2, 3)], [batch(5, 9, 0, 1)], -1) == (
        batch(0, 19, 2, 3),)
    # start offset drops a batch below it and cuts one across it
    assert combine_state_batches([batch(0, 9), batch(10, 19, 2)], [], 15) == (batch(15, 19, 2),)
    # Kafka's combiner leaves these two contiguous same-state batches apart (the first
    # was final before the split that produced the second)
    assert combine_state_batches([batch(20, 28, 1, 0), batch(21, 29, 0, 0)],
                                 [batch(29, 29, 1, 0)], -1) == (
        batch(20, 28, 1, 0), batch(29, 29, 1, 0))
    # the non-sequential scenario of ShareCoordinatorShardTest.testNonSequentialBatchUpdates
    so_far = [batch(100, 109, 2, 1), batch(110, 119, 1, 2), batch(120, 129, 1, 0)]
    assert combine_state_batches(so_far, [batch(120, 129, 2, 1)], 110) == (
        batch(110, 119, 1, 2), batch(120, 129, 2, 1))


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 8), st.integers(0, 2),
                          st.integers(0, 2)), max_size=7),
       st.sampled_from([-1, 0, 5, 12]))
def test_combine_each_offset_keeps_its_highest_delivery_info(
        raw: list[tuple[int, int, int, int]], start: int) -> None:
    """combineStateBatches: the result is sorted and non-overlapping, covers exactly the
    input offsets at or above the start offset, and each offset carries the highest
    (delivery count, delivery state) of the batches that covered it."""
    batches = [batch(f, f + n, s, c) for f, n, s, c in raw]
    out = combine_state_batches(batches[:3], batches[3:], start)
    for a, b in itertools.pairwise(out):
        assert a.last_offset < b.first_offset
        # (contiguous same-state batches are usually but not always merged: Kafka's
        # combiner moves a batch to its final list before a later split can join it)
    got = {o: (b.delivery_count, b.delivery_state) for b in out
           for o in range(b.first_offset, b.last_offset + 1)}
    want: dict[int, tuple[int, int]] = {}
    for b in batches:
        for o in range(max(b.first_offset, start), b.last_offset + 1):
            want[o] = max(want.get(o, (-1, -1)), (b.delivery_count, b.delivery_state))
    assert got == want


# ---------------------------------------------------------------------- the shard: rules


def test_initialize_writes_a_snapshot() -> None:
    """R2: initializeState -> a ShareSnapshot (epoch 0, leader epoch -1, create = write =
    now); after replay the partition is initialized and readable."""
    s = shard()
    res = s.initialize_state(init(state_epoch=5, start_offset=10), NOW)
    assert part_error(res.response) == (ErrorCode.none, None)
    assert res.records == (ShareStateRecord(
        ShareSnapshotKey(GROUP, TOPIC, 0),
        ShareSnapshotValue(0, 5, -1, 10, NOW, NOW)),)
    assert s.status(GROUP, TOPIC, 0) is KeyStatus.UNINITIALIZED  # nothing until replayed
    apply(s, res.records)
    assert s.status(GROUP, TOPIC, 0) is KeyStatus.INITIALIZED
    p = s.read_state_and_maybe_update_leader_epoch(read(-1), NOW).response.results[0].partitions[0]
    assert (p.error_code, p.state_epoch, p.start_offset, p.state_batches) == (
        ErrorCode.none, 5, 10, ())
    again = s.initialize_state(init(state_epoch=5, start_offset=20), NOW + 1)
    assert again.records[0].value == ShareSnapshotValue(1, 5, -1, 20, NOW + 1, NOW + 1)


def test_initialize_fenced_by_a_higher_state_epoch() -> None:
    """R2: a stored state epoch above the request's is FENCED_STATE_EPOCH, no record."""
    s = initialized(state_epoch=5)
    res = s.initialize_state(init(state_epoch=4), NOW)
    assert part_error(res.response)[0] == ErrorCode.fenced_state_epoch
    assert res.records == ()


def test_write_and_read_need_an_initialized_partition() -> None:
    """R3: WRITE_/READ_UNINITIALIZED_SHARE_PARTITION as INVALID_REQUEST."""
    s = shard()
    w = s.write_state(write((batch(0, 9),)), NOW)
    assert part_error(w.response) == (ErrorCode.invalid_request,
                                      WRITE_UNINITIALIZED_SHARE_PARTITION)
    assert w.records == ()
    r = s.read_state_and_maybe_update_leader_epoch(read(1), NOW)
    assert part_error(r.response) == (ErrorCode.invalid_request, READ_UNINITIALIZED_SHARE_PARTITION)
    assert r.records == ()
    assert part_error(s.read_state_summary(summary()).response)[0] == ErrorCode.invalid_request


@pytest.mark.parametrize("request_fn", [
    lambda t, p: init(partition=p, topic=t),
    lambda t, p: write(partition=p, topic=t),
    lambda t, p: read(partition=p, topic=t),
    lambda t, p: delete(partition=p, topic=t),
])
def test_null_topic_negative_partition_unknown_partition(request_fn) -> None:  # type: ignore[no-untyped-def]
    """R9: null topic id, negative partition -> INVALID_REQUEST; a partition the metadata
    does not have -> UNKNOWN_TOPIC_OR_PARTITION; no metadata at all -> the same."""
    s = initialized()
    apply(s, s.initialize_state(init(partition=3), NOW).records)

    def call(req):  # type: ignore[no-untyped-def]
        if isinstance(req, init_req.InitializeShareGroupStateRequest):
            return s.initialize_state(req, NOW)
        if isinstance(req, read_req.ReadShareGroupStateRequest):
            return s.read_state_and_maybe_update_leader_epoch(req, NOW)
        if isinstance(req, delete_req.DeleteShareGroupStateRequest):
            return s.delete_state(req)
        return s.write_state(req, NOW)

    assert part_error(call(request_fn(None, 0)).response) == (
        ErrorCode.invalid_request, NULL_TOPIC_ID)
    assert part_error(call(request_fn(TOPIC, -1)).response) == (
        ErrorCode.invalid_request, NEGATIVE_PARTITION_ID)
    s.on_metadata_update({TOPIC: 3})  # partition 3 is gone
    res = call(request_fn(TOPIC, 3))
    assert part_error(res.response)[0] == ErrorCode.unknown_topic_or_partition
    assert res.records == ()
    s.on_metadata_update(None)
    assert part_error(call(request_fn(TOPIC, 0)).response)[0] == (
        ErrorCode.unknown_topic_or_partition)


def test_write_fenced_by_leader_epoch() -> None:
    """R4: a write below the recorded leader epoch is FENCED_LEADER_EPOCH and changes
    nothing; -1 is never fenced (ShareCoordinatorShardTest.testWriteStateFencedLeaderEpochError)."""
    s = initialized()
    apply(s, s.write_state(write(leader_epoch=1), NOW).records)
    before = s.snapshot()
    res = s.write_state(write((batch(0, 9),), leader_epoch=0), NOW)
    assert part_error(res.response) == (ErrorCode.fenced_leader_epoch,
                                        "The leader epoch in the request is older than the "
                                        "epoch on the broker.")
    assert res.records == () and s.snapshot() == before
    assert part_error(s.write_state(write(leader_epoch=-1), NOW).response)[0] == ErrorCode.none


def test_write_fenced_by_state_epoch() -> None:
    """R4: a write below the recorded state epoch is FENCED_STATE_EPOCH
    (testWriteStateFencedStateEpochError)."""
    s = initialized(state_epoch=1)
    res = s.write_state(write((batch(11, 20),), state_epoch=0, leader_epoch=5), NOW)
    assert part_error(res.response)[0] == ErrorCode.fenced_state_epoch
    assert res.records == ()
    assert s.key_state(GROUP, TOPIC, 0).leader_epoch == -1  # type: ignore[union-attr]
    assert part_error(s.write_state(write(state_epoch=-1), NOW).response)[0] == ErrorCode.none
    assert part_error(s.write_state(write(state_epoch=2), NOW).response)[0] == ErrorCode.none


def test_read_fenced_by_leader_epoch_and_updates_a_newer_one() -> None:
    """R4, R6: a read below the recorded leader epoch is fenced; a newer one appends a
    ShareUpdate carrying it (testReadStateLeaderEpochUpdateSuccess); -1 or the same epoch
    appends nothing."""
    s = initialized()
    res = s.read_state_and_maybe_update_leader_epoch(read(2), NOW)
    assert part_error(res.response)[0] == ErrorCode.none
    assert res.records == (ShareStateRecord(
        ShareUpdateKey(GROUP, TOPIC, 0), ShareUpdateValue(0, 2, 0, (), -1)),)
    apply(s, res.records)
    assert s.read_state_and_maybe_update_leader_epoch(read(2), NOW).records == ()
    assert s.read_state_and_maybe_update_leader_epoch(read(-1), NOW).records == ()
    fenced = s.read_state_and_maybe_update_leader_epoch(read(1), NOW)
    assert part_error(fenced.response)[0] == ErrorCode.fenced_leader_epoch
    assert fenced.records == ()


def test_write_then_read_returns_the_combined_batches() -> None:
    """R5, R10: updates merge into the state (two same-state writes combine to one batch,
    testSubsequentWriteStateSnapshotEpochUpdatesSuccessfully)."""
    s = initialized()
    for b in (batch(0, 10), batch(11, 20)):
        res = s.write_state(write((b,), start_offset=0, dcc=11), NOW)
        assert isinstance(res.records[0].value, ShareUpdateValue)
        apply(s, res.records)
    p = s.read_state_and_maybe_update_leader_epoch(read(-1), NOW).response.results[0].partitions[0]
    assert [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
            for b in p.state_batches] == [(0, 20, 0, 1)]
    summ = s.read_state_summary(summary()).response.results[0].partitions[0]
    assert (summ.error_code, summ.start_offset, summ.leader_epoch, summ.state_epoch,
            summ.delivery_complete_count) == (ErrorCode.none, 0, 0, 0, 11)
    v0 = s.read_state_summary(summary(v1=False)).response
    assert v0.__version__ == 0 and v0.results[0].partitions[0].start_offset == 0


def test_snapshot_cadence() -> None:
    """R5, R10: a snapshot after records.per.snapshot updates, then the count restarts
    (ShareCoordinatorShard.generateShareStateRecord/handleShareSnapshot: the first cycle
    after initialization takes N+1 updates, the next ones N)."""
    n = 3
    s = initialized(per_snapshot=n)
    kinds = []
    for i in range(12):
        res = s.write_state(write((batch(i, i, 2),), start_offset=0), NOW + i)
        kinds.append("S" if isinstance(res.records[0].value, ShareSnapshotValue) else "u")
        apply(s, res.records)
    assert "".join(kinds) == "uuuuSuuuSuuu"
    state = s.key_state(GROUP, TOPIC, 0)
    assert state is not None and state.offset.snapshot_epoch == 2
    assert state.offset.state_batches == (batch(0, 11, 2),)
    zero = initialized(per_snapshot=0)
    res = zero.write_state(write((batch(0, 0),)), NOW)
    assert isinstance(res.records[0].value, ShareSnapshotValue)


def test_non_sequential_updates_keep_the_middle_batch() -> None:
    """ShareCoordinatorShardTest.testNonSequentialBatchUpdates with records.per.snapshot 0:
    acking b1, then moving the start offset past it while acking b3, keeps b2."""
    s = initialized(per_snapshot=0)
    steps = [
        write((batch(100, 109, 1, 1), batch(110, 119, 1, 2), batch(120, 129, 1, 0)),
              start_offset=100, dcc=0),
        write((batch(100, 109, 2, 1),), start_offset=-1, dcc=10),
        write((batch(120, 129, 2, 1),), start_offset=110, dcc=10),
    ]
    for i, req in enumerate(steps):
        res = s.write_state(req, NOW + i)
        apply(s, res.records)
    last = res.records[0].value
    assert isinstance(last, ShareSnapshotValue)
    assert (last.snapshot_epoch, last.start_offset, last.delivery_complete_count) == (3, 110, 10)
    assert last.state_batches == (batch(110, 119, 1, 2), batch(120, 129, 2, 1))
    assert last.create_timestamp == NOW and last.write_timestamp == NOW + 2


def test_delete_appends_a_tombstone_and_forgets_the_key() -> None:
    """R8: deleteState -> tombstone; an unknown key -> success and no record
    (testDeleteStateSuccess, testDeleteStateUninitializedRecord)."""
    s = initialized()
    res = s.delete_state(delete())
    assert part_error(res.response) == (ErrorCode.none, None)
    assert res.records == (ShareStateRecord(ShareSnapshotKey(GROUP, TOPIC, 0), None),)
    apply(s, res.records)
    assert s.key_state(GROUP, TOPIC, 0) is None
    again = s.delete_state(delete())
    assert part_error(again.response)[0] == ErrorCode.none and again.records == ()


def test_request_partitions_see_earlier_partitions_records() -> None:
    """A request naming the same key twice is handled as Kafka's service does, one key
    after the other: the second write sees the first one's record."""
    s = initialized(per_snapshot=0)
    req = write_req_v0.WriteShareGroupStateRequest(group_id=GROUP, topics=(
        write_req_v0.WriteStateData(topic_id=TOPIC, partitions=tuple(
            write_req_v0.PartitionData(
                partition=i32(0), state_epoch=i32(0), leader_epoch=i32(0),
                start_offset=i64(-1), state_batches=(write_req_v0.StateBatch(
                    first_offset=i64(o), last_offset=i64(o), delivery_state=i8(2),
                    delivery_count=i16(1)),))
            for o in (0, 1))),))
    res = s.write_state(req, NOW)
    epochs = [r.value.snapshot_epoch for r in res.records]  # type: ignore[union-attr]
    assert epochs == [1, 2]
    assert res.records[1].value.state_batches == (batch(0, 1, 2),)  # type: ignore[union-attr]


# ---------------------------------------------------------------------- replay


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 4))
def test_replay_of_the_topic_rebuilds_the_same_state(seed: int, per_snapshot: int) -> None:
    """R10: random initialize/write/read/delete on a few keys; a coordinator that replays
    every appended record (its bytes, in order) on another broker ends with exactly the
    same state, including fencing epochs and snapshot counters."""
    rng = random.Random(seed)
    live = shard(per_snapshot)
    log: list[tuple[bytes, bytes | None]] = []
    keys = [(TOPIC, 0), (TOPIC, 1), (OTHER_TOPIC, 0)]
    for step in range(80):
        topic, part = rng.choice(keys)
        op = rng.random()
        if op < 0.15:
            res = live.initialize_state(init(partition=part, topic=topic,
                                             state_epoch=rng.randint(0, 3),
                                             start_offset=rng.randint(0, 50)), NOW + step)
        elif op < 0.75:
            first = rng.randint(0, 60)
            bs = tuple(batch(f, f + rng.randint(0, 5), rng.choice((0, 2, 4)), rng.randint(1, 4))
                       for f in (first, first + rng.randint(0, 8)))
            res = live.write_state(write(bs, partition=part, topic=topic,
                                         leader_epoch=rng.randint(-1, 3),
                                         state_epoch=rng.randint(-1, 3),
                                         start_offset=rng.choice((-1, rng.randint(0, 40))),
                                         dcc=rng.randint(-1, 9)), NOW + step)
        elif op < 0.92:
            res = live.read_state_and_maybe_update_leader_epoch(
                read(rng.randint(-1, 4), partition=part, topic=topic), NOW + step)
        else:
            res = live.delete_state(delete(partition=part, topic=topic))
        for r in res.records:
            log.append((encode_key(r.key), encode_value(r.value)))
            live.replay(r)
    moved = shard(per_snapshot)
    for k, v in log:
        moved.replay_bytes(k, v)
    assert moved.snapshot() == live.snapshot()


def test_replay_of_bad_bytes_changes_nothing() -> None:
    s = initialized()
    before = s.snapshot()
    with pytest.raises(ShareStateRecordError):
        s.replay_bytes(b"\x00\x01\x00", b"\x00")
    assert s.snapshot() == before


def test_reinitializing_keeps_the_highest_leader_epoch_for_fencing() -> None:
    """R10: a replayed ShareSnapshot only raises the recorded leader epoch
    (ShareCoordinatorShard.maybeUpdateLeaderEpochMap): re-initializing writes leader epoch -1,
    yet a stale leader is still fenced afterwards."""
    s = initialized()
    apply(s, s.read_state_and_maybe_update_leader_epoch(read(3), NOW).records)
    apply(s, s.initialize_state(init(state_epoch=1, start_offset=7), NOW).records)
    state = s.key_state(GROUP, TOPIC, 0)
    assert state is not None and state.offset.leader_epoch == -1 and state.leader_epoch == 3
    res = s.read_state_and_maybe_update_leader_epoch(read(2), NOW)
    assert part_error(res.response)[0] == ErrorCode.fenced_leader_epoch
