"""KIP-227 fetch sessions, leader side (``headrace.broker.fetch_sessions``): pure logic."""

from __future__ import annotations

import random
from types import SimpleNamespace as NS

from headrace.broker.fetch_sessions import (
    INITIAL_EPOCH,
    MAX_EPOCH,
    CachedPartition,
    FetchSessionCache,
    next_epoch,
)


def part(i: int, offset: int) -> NS:
    return NS(partition=i, fetch_offset=offset, partition_max_bytes=1 << 20,
              current_leader_epoch=3, log_start_offset=0)


def topics(*entries: tuple[str, list[NS]]) -> list[NS]:
    return [NS(topic=t, partitions=ps) for t, ps in entries]


def test_create_update_forget_keep_the_session_exactly_as_the_requests_say() -> None:
    cache = FetchSessionCache(rng=random.Random(7))
    s = cache.create(2, topics(("a", [part(0, 10), part(1, 20)]), ("b", [part(0, 5)])), 0)
    assert s is not None and s.id != 0
    assert s.epoch == next_epoch(INITIAL_EPOCH) == 1
    assert set(s.partitions) == {("a", 0), ("a", 1), ("b", 0)}
    # incremental: a changed offset, a new partition, one forgotten
    s.update(topics(("a", [part(1, 25)]), ("c", [part(4, 0)])),
             [NS(topic="b", partitions=[0])])
    assert set(s.partitions) == {("a", 0), ("a", 1), ("c", 4)}
    assert s.partitions[("a", 1)].fetch_offset == 25
    assert s.partitions[("a", 0)].fetch_offset == 10  # not named: kept as it was
    assert [(t, [c.partition for c in cs]) for t, cs in s.by_topic()] == [
        ("a", [0, 1]), ("c", [4])]
    assert cache.get(s.id, 5) is s
    cache.remove(s.id)
    assert cache.get(s.id, 6) is None


def test_responses_carry_a_partition_only_when_something_changed() -> None:
    c = CachedPartition(0, 10, 1 << 20, 3, 0)
    assert c.must_respond(0, 0, 10, 10, 0)  # never sent: the first answer carries it
    assert not c.must_respond(0, 0, 10, 10, 0)  # nothing new
    assert c.must_respond(0, 100, 10, 10, 0)  # records
    assert c.must_respond(0, 0, 11, 10, 0)  # high watermark moved
    assert not c.must_respond(0, 0, 11, 10, 0)
    assert c.must_respond(0, 0, 11, 11, 0)  # last stable offset moved
    assert c.must_respond(0, 0, 11, 11, 4)  # log start moved
    assert c.must_respond(6, 0, 11, 11, 4)  # an error always goes back
    assert (c.high_watermark, c.last_stable_offset, c.leader_log_start) == (11, 11, 4)


def test_the_cache_is_bounded_and_evicts_the_least_recently_used() -> None:
    cache = FetchSessionCache(slots=3, rng=random.Random(1))
    ids = [cache.create(i, topics(("t", [part(0, 0)])), i) for i in range(3)]
    assert all(s is not None for s in ids)
    first = ids[0]
    assert first is not None
    cache.get(first.id, 10)  # used: the second becomes the oldest
    extra = cache.create(9, topics(("t", [part(0, 0)])), 11)
    assert extra is not None and len(cache) == 3
    assert cache.get(first.id, 12) is first
    second = ids[1]
    assert second is not None and cache.get(second.id, 12) is None
    assert FetchSessionCache(slots=0).create(1, [], 0) is None  # no slots: sessionless


def test_epochs_wrap_to_one_and_owners_can_be_dropped() -> None:
    assert next_epoch(MAX_EPOCH) == 1 and next_epoch(5) == 6
    cache = FetchSessionCache(rng=random.Random(3))
    for owner in (1, 1, 2):
        cache.create(owner, [], 0)
    cache.remove_owned_by(1)
    assert len(cache) == 1
