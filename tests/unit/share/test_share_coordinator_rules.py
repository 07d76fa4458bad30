"""The share coordinator shell's pure rules: FindCoordinator key type 2's key as Kafka's
``SharePartitionKey.validate`` / ``getInstance`` read it (``state.parse_coordinator_key``),
and the persister's backoff between retries, Kafka's ``ExponentialBackoff`` as
``PersisterStateManager`` configures it (``share_coordinator.backoff_s``)."""

from __future__ import annotations

import base64
import uuid

import pytest

from headrace.broker.share_coordinator import (
    JITTER,
    MAX_ATTEMPTS,
    REQUEST_BACKOFF_MAX_S,
    REQUEST_BACKOFF_S,
    RETRIABLE,
    backoff_s,
    operation_error,
)
from headrace.share.state import coordinator_key, parse_coordinator_key, partition_for

TID = uuid.UUID("5f0e4d0c-6a1b-4c8e-9d2f-0123456789ab")
B64 = base64.urlsafe_b64encode(TID.bytes).decode().rstrip("=")


def test_a_key_round_trips_through_kafkas_format() -> None:
    key = coordinator_key("g", TID, 3)
    assert key == f"g:{B64}:3"
    assert parse_coordinator_key(key) == ("g", TID, 3)


@pytest.mark.parametrize("key,expected", [
    (f"g:{B64}==:0", ("g", TID, 0)),  # Java's URL decoder takes the padding too
    (f"  g \t:{B64}:0", ("g", TID, 0)),  # String.trim on the group id
    (f"g:{B64}:-1", ("g", TID, -1)),  # Integer.parseInt: a sign is fine
    (f"g:{B64}:+7", ("g", TID, 7)),
    (f"g:{B64}:2147483647", ("g", TID, 2147483647)),
    (f"g:{B64}:0:", ("g", TID, 0)),  # Java's split drops trailing empty fields
    (f"g:{B64}:0::", ("g", TID, 0)),
    ("g:eHh4eHh4eHh4eHh4eHh4eA==:0", ("g", uuid.UUID(bytes=b"x" * 16), 0)),  # 24 chars
])
def test_keys_kafka_accepts(key: str, expected: tuple[str, uuid.UUID, int]) -> None:
    assert parse_coordinator_key(key) == expected


@pytest.mark.parametrize("key,message", [
    ("", "cannot be empty"),
    ("g", "Invalid key format"),
    (f"g:{B64}", "Invalid key format"),
    (f"a:b:{B64}:0", "Invalid key format"),  # a group id with a colon: 4 fields
    (f":{B64}:0", "GroupId must be"),
    (f" \t:{B64}:0", "GroupId must be"),
    ("g:not-a-uuid:0", "Invalid topic ID"),
    (f"g:{B64[:-1]}:0", "Invalid topic ID"),  # 21 characters
    (f"g:{B64}=:0", "Invalid topic ID"),  # bad padding
    (f"g:{B64[:-1]}!:0", "Invalid topic ID"),  # outside the URL-safe alphabet
    ("g::0", "Invalid topic ID"),
    (f"g:{B64}:x", "Invalid partition"),
    (f"g:{B64}: 1", "Invalid partition"),  # parseInt takes no blanks
    (f"g:{B64}:1_0", "Invalid partition"),  # nor Python's underscores
    (f"g:{B64}:2147483648", "Invalid partition"),  # beyond int32
    (f"g:{B64}:-2147483649", "Invalid partition"),
])
def test_keys_kafka_refuses(key: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_coordinator_key(key)


def test_the_partition_of_a_parsed_key_is_the_coordinators() -> None:
    group, tid, p = parse_coordinator_key(f" grp :{B64}:5")
    assert partition_for(group, tid, p) == partition_for("grp", TID, 5)


def test_backoff_doubles_from_one_second_to_thirty() -> None:
    # ExponentialBackoff(1000, 2, 30000, 0.2).backoff(n), jitter at its middle (rand 0.5)
    assert [backoff_s(n, 0.5) for n in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_backoff_jitter_is_twenty_percent() -> None:
    assert backoff_s(2, 0.0) == pytest.approx(4.0 * (1 - JITTER))
    assert backoff_s(2, 0.999999) == pytest.approx(4.0 * (1 + JITTER), rel=1e-5)
    assert backoff_s(9, 0.999999) == REQUEST_BACKOFF_MAX_S  # capped after the jitter


def test_backoff_without_room_to_grow_is_the_initial_interval() -> None:
    assert backoff_s(3, 0.9, initial_s=0.5, max_s=0.5) == 0.5
    assert backoff_s(3, 0.5, initial_s=0.01, max_s=0.04) == pytest.approx(0.04)


def test_persister_constants_are_kafkas() -> None:
    # PersisterStateManager: REQUEST_BACKOFF_MS, REQUEST_BACKOFF_MAX_MS,
    # MAX_FIND_COORD_ATTEMPTS, and the errors its handlers retry
    assert (REQUEST_BACKOFF_S, REQUEST_BACKOFF_MAX_S, MAX_ATTEMPTS) == (1.0, 30.0, 5)
    assert {e.name for e in RETRIABLE} == {
        "coordinator_not_available", "coordinator_load_in_progress", "not_coordinator",
        "unknown_topic_or_partition"}


def test_share_coordinator_configs_are_kafkas() -> None:
    """ShareCoordinatorConfig's names, defaults and ranges (records per snapshot 0-500)."""
    from headrace.config import BrokerConfig, ConfigError

    cfg = BrokerConfig.from_mapping({})
    assert [cfg[f"share.coordinator.{n}"] for n in (
        "state.topic.num.partitions", "state.topic.replication.factor",
        "state.topic.min.isr", "state.topic.segment.bytes",
        "snapshot.update.records.per.snapshot")] == [50, 3, 2, 104857600, 500]
    name = "share.coordinator.snapshot.update.records.per.snapshot"
    assert BrokerConfig.from_mapping({name: "0"})[name] == 0
    for bad in ("501", "-1", "x"):
        with pytest.raises(ConfigError):
            BrokerConfig.from_mapping({name: bad})
    with pytest.raises(ConfigError):
        BrokerConfig.from_mapping({"share.coordinator.state.topic.num.partitions": "0"})


def test_merging_many_overlapping_batches_is_not_quadratic() -> None:
    """One WriteShareGroupState of 16,000 overlapping state batches (about 400 KB) kept
    the event loop for about 100 s when the merge re-sorted a list per resolved pair; the
    heap takes well under a second. The bound is loose (a busy CI machine)."""
    import itertools
    import time

    from headrace.share.state import StateBatch, combine_state_batches

    batches = [StateBatch(i, i + 5, i % 4, i % 3) for i in range(16_000)]
    started = time.monotonic()
    merged = combine_state_batches((), batches, -1)
    assert time.monotonic() - started < 15.0
    assert all(a.last_offset < b.first_offset for a, b in itertools.pairwise(merged))
    assert (merged[0].first_offset, merged[-1].last_offset) == (0, 16_004)


def test_a_failed_write_answers_as_kafkas_handle_operation_exception() -> None:
    from kio.schema.errors import ErrorCode as E

    assert {c: operation_error(c) for c in (
        E.unknown_topic_or_partition, E.not_enough_replicas, E.request_timed_out,
        E.not_leader_or_follower, E.kafka_storage_error, E.message_too_large,
        E.record_list_too_large, E.invalid_fetch_size, E.network_exception,
        E.invalid_record)} == {
        E.unknown_topic_or_partition: E.coordinator_not_available,
        E.not_enough_replicas: E.coordinator_not_available,
        E.request_timed_out: E.coordinator_not_available,
        E.not_leader_or_follower: E.not_coordinator,
        E.kafka_storage_error: E.not_coordinator,
        E.message_too_large: E.unknown_server_error,
        E.record_list_too_large: E.unknown_server_error,
        E.invalid_fetch_size: E.unknown_server_error,
        E.network_exception: E.coordinator_load_in_progress,
        E.invalid_record: E.invalid_record,
    }
