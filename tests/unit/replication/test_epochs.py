"""Leader-epoch rules (KIP-101, KIP-279, KIP-320): the end of an epoch, a follower's
divergence on the leader, and its truncation offset, in the manner of Kafka's
``AbstractFetcherThreadTest`` and ``LeaderEpochFileCacheTest``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.replication.epochs import (
    Truncation,
    diverging_epoch,
    end_offset_for_epoch,
    epoch_start_offset,
    latest_epoch,
    truncation,
)

EPOCHS = [(1, 0), (3, 4), (4, 7)]  # epoch 1 at 0-3, 3 at 4-6, 4 from 7; LEO 10


@pytest.mark.parametrize(("requested", "expected"), [
    (-1, (-1, -1)),
    (0, (0, 0)),    # below the first epoch: the first's start
    (1, (1, 4)),
    (2, (1, 4)),    # not an epoch of this log: the largest below, ending at 4
    (3, (3, 7)),
    (4, (4, 10)),   # the latest: the log end offset
    (9, (-1, -1)),  # above every epoch
])
def test_end_offset_for_epoch(requested: int, expected: tuple[int, int]) -> None:
    assert end_offset_for_epoch(EPOCHS, requested, 10) == expected


def test_latest_and_start() -> None:
    assert latest_epoch(EPOCHS) == 4 and latest_epoch([]) == -1
    assert epoch_start_offset(EPOCHS, 3) == 4 and epoch_start_offset(EPOCHS, 2) == -1


def test_diverging_epoch() -> None:
    assert diverging_epoch(EPOCHS, 10, -1, 99) is None
    assert diverging_epoch(EPOCHS, 10, 3, 7) is None
    assert diverging_epoch(EPOCHS, 10, 3, 8) == (3, 7)
    assert diverging_epoch(EPOCHS, 10, 2, 4) == (1, 4)  # epoch 2 is unknown here
    assert diverging_epoch(EPOCHS, 10, 5, 10) == (-1, -1)


@pytest.mark.parametrize(("leader", "follower", "follower_leo", "expected"), [
    # the leader knows nothing at or below the follower's epoch: its high watermark (5)
    ((-1, -1), [(1, 0), (2, 4)], 9, Truncation(5, True)),
    # same epoch, the leader's ends first
    ((2, 6), [(1, 0), (2, 4)], 9, Truncation(6, True)),
    # same epoch, the follower's ends first
    ((2, 12), [(1, 0), (2, 4)], 9, Truncation(9, True)),
    # the leader's largest epoch at or below 3 is 2; the follower has 2 ending at 7
    ((2, 6), [(1, 0), (2, 4), (3, 7)], 9, Truncation(6, True)),
    # the follower lacks the leader's epoch 2: to where its own 1 ends, then ask again
    ((2, 6), [(1, 0), (3, 4)], 9, Truncation(4, False)),
    # the follower has no epoch at or below 0: the leader's end
    ((0, 3), [(1, 5)], 9, Truncation(3, True)),
    # never past the follower's own log end
    ((2, 50), [(2, 0)], 9, Truncation(9, True)),
])
def test_truncation(leader: tuple[int, int], follower: list[tuple[int, int]],
                    follower_leo: int, expected: Truncation) -> None:
    assert truncation(follower, follower_leo, 5, *leader) == expected


@st.composite
def two_logs(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    """Two replicas' logs as the epoch of each offset: a common prefix, then each its own
    suffix with epochs increasing; epochs of one leader's term are unique to it (odd for
    the leader, even for the follower), as elections guarantee. The leader's cache ends
    with its current epoch, the largest of all (assigned at its log end when it became
    leader, as ``PartitionLog.assign_epoch`` does)."""
    common = sorted(draw(st.lists(st.integers(0, 4), max_size=8)))
    top = common[-1] if common else 0
    lead = sorted(draw(st.lists(st.integers(top + 1, top + 6).map(lambda e: 2 * e + 1),
                                max_size=6)))
    follow = sorted(draw(st.lists(st.integers(top + 1, top + 6).map(lambda e: 2 * e),
                                  max_size=6)))
    common = [2 * e for e in common]
    return common + lead, common + follow, len(common)


def _cache(offset_epochs: list[int]) -> list[tuple[int, int]]:
    cache: list[tuple[int, int]] = []
    for offset, e in enumerate(offset_epochs):
        if not cache or cache[-1][0] != e:
            cache.append((e, offset))
    return cache


@given(two_logs())
def test_repeated_truncation_reaches_the_common_prefix(
        logs: tuple[list[int], list[int], int]) -> None:
    """Log matching: asking the leader until the truncation is complete leaves the follower
    with exactly the prefix both logs share (never below the committed common prefix,
    never keeping a divergent offset)."""
    leader_log, follower_log, common = logs
    current = max([0, *leader_log, *follower_log]) + 1
    leader_cache = [*_cache(leader_log), (current, len(leader_log))]
    for _ in range(20):
        cache = _cache(follower_log)
        asked = latest_epoch(cache)
        if asked < 0:
            break
        le, end = end_offset_for_epoch(leader_cache, asked, len(leader_log))
        t = truncation(cache, len(follower_log), 0, le, end)
        follower_log = follower_log[:t.offset]
        if t.complete:
            break
    assert follower_log == leader_log[:len(follower_log)]
    assert len(follower_log) >= common
