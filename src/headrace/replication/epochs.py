"""Leader epochs: where an epoch ends, whether a follower diverged, where it truncates. PURE.

A replica's leader epoch cache is a list of ``(epoch, start_offset)`` pairs, increasing in
both (Kafka's ``LeaderEpochFileCache``; ``PartitionLog.leader_epochs`` holds it): epoch ``e``
covers the offsets from its start to the next entry's start, the latest epoch up to the log
end offset. Three rules use it (KIP-101, KIP-279, KIP-320/KAFKA-10554):

1. **End of an epoch** (``end_offset_for_epoch``, the answer to OffsetForLeaderEpoch): the
   largest epoch at or below the one asked and the offset where it ends.
2. **Divergence, leader side** (``diverging_epoch``, a Fetch v12+ with ``last_fetched_epoch``):
   a follower whose last fetched epoch the leader does not have, or whose fetch offset is
   past that epoch's end on the leader, has diverged; the leader answers the epoch and end
   offset instead of records, and does not count the fetch (R-REP-3).
3. **Truncation, follower side** (``truncation``, Kafka's
   ``AbstractFetcherThread.getOffsetTruncationState``): given the leader's (epoch, end
   offset) for the follower's latest epoch — from OffsetForLeaderEpoch or a diverging epoch
   — the offset the follower truncates its log to, and whether that settles it (or it must
   ask again for an older epoch).

No I/O; every function takes the cache as a sequence and returns numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1

Epochs = Sequence[tuple[int, int]]  # (leader epoch, start offset), increasing


def latest_epoch(epochs: Epochs) -> int:
    """The newest epoch in the cache, or -1 (what a follower sends as last_fetched_epoch)."""
    return epochs[-1][0] if epochs else UNDEFINED_EPOCH


def epoch_start_offset(epochs: Epochs, epoch: int) -> int:
    """Where ``epoch`` starts in this cache, or -1 if the cache does not have it."""
    for e, start in reversed(epochs):
        if e == epoch:
            return start
        if e < epoch:
            break
    return UNDEFINED_OFFSET


def end_offset_for_epoch(epochs: Epochs, epoch: int, log_end_offset: int) -> tuple[int, int]:
    """Kafka's ``LeaderEpochFileCache.endOffsetFor``: (the largest epoch at or below
    ``epoch``, where it ends: the start of the next larger epoch, or the log end offset for
    the latest one); (-1, -1) if ``epoch`` is undefined or above every epoch (nothing is
    known); (``epoch``, the first epoch's start) if it is below the first."""
    if epoch < 0 or not epochs:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if epoch == epochs[-1][0]:
        return epoch, log_end_offset
    higher = next((i for i, (e, _) in enumerate(epochs) if e > epoch), None)
    if higher is None:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if higher == 0:
        return epoch, epochs[0][1]
    return epochs[higher - 1][0], epochs[higher][1]


def diverging_epoch(epochs: Epochs, log_end_offset: int, last_fetched_epoch: int,
                    fetch_offset: int) -> tuple[int, int] | None:
    """Leader side of Fetch v12+ (Kafka's ``Partition.fetchRecords``): None if a follower
    whose last batch has ``last_fetched_epoch`` and that fetches at ``fetch_offset`` is
    consistent with this log; else the (epoch, end offset) it must truncate to — the
    largest epoch at or below its last one that this log has, and where it ends here.
    A ``last_fetched_epoch`` of -1 (an empty follower, or an old one) is never checked."""
    if last_fetched_epoch < 0:
        return None
    epoch, end = end_offset_for_epoch(epochs, last_fetched_epoch, log_end_offset)
    if epoch < last_fetched_epoch or end < fetch_offset:
        return epoch, end
    return None


@dataclass(frozen=True, slots=True)
class Truncation:
    """Where a follower truncates (``offset``: its new log end offset, never above its
    current one) and whether that is final (``complete``) or it must ask the leader again
    about the older epoch it now ends with."""

    offset: int
    complete: bool


def truncation(epochs: Epochs, log_end_offset: int, high_watermark: int,
               leader_epoch: int, leader_end_offset: int) -> Truncation:
    """Kafka's ``AbstractFetcherThread.getOffsetTruncationState``: the leader says its
    largest epoch at or below the follower's latest is ``leader_epoch`` and ends at
    ``leader_end_offset`` (OffsetForLeaderEpoch, or a Fetch's diverging epoch).

    - The leader knows nothing (end offset -1): truncate to the high watermark, the only
      offset known to be committed.
    - The follower has no epoch at or below the leader's: truncate to the leader's end.
    - The follower's largest epoch at or below it is another (older) one: truncate to where
      that ends here and ask again (not complete).
    - Same epoch: truncate to where it ends on whichever replica ends it first.
    """
    if leader_end_offset < 0:
        return Truncation(min(high_watermark, log_end_offset), True)
    if leader_epoch < 0:  # an old leader answered only an offset
        return Truncation(min(leader_end_offset, log_end_offset), True)
    own_epoch, own_end = end_offset_for_epoch(epochs, leader_epoch, log_end_offset)
    if own_epoch < 0:
        return Truncation(min(leader_end_offset, log_end_offset), True)
    if own_epoch != leader_epoch:
        return Truncation(min(own_end, log_end_offset), False)
    return Truncation(min(leader_end_offset, own_end, log_end_offset), True)
