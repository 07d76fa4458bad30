"""The leader's view of one partition: follower states, the ISR, the high watermark. PURE.

Kafka's ``Partition`` (leader side) and ``Replica``, as a plain object driven by method
calls with the time passed in (no asyncio, no I/O). The shell (``broker.replica_manager.
Partition``) owns the log; it tells this object the leader's log end offset (LEO) with
every call and applies what it returns: a new high watermark, an ISR change to write.

Everything that decides the ISR and the high watermark lives here:

1. **Follower state comes only from a served read** (Kafka's
   ``updateFollowerFetchState``). ``follower_fetched`` is called after the leader read the
   follower's fetch offset from its log without error and without a diverging epoch; an
   offset past the leader's LEO is a caller bug and raises. A fetch at or past the leader's
   LEO catches the follower up now; a fetch at or past the leader's LEO *as of the
   follower's previous fetch* catches it up as of that previous fetch.
2. **High watermark** (R-REP-4, Kafka's ``maybeIncrementLeaderHW``): the smallest LEO over
   the leader and every follower of the *maximal* ISR, the committed ISR together with a
   pending addition (KIP-497): while a follower's entry is being written it already counts,
   so the high watermark cannot pass it and it never joins below the high watermark. A
   pending removal still counts the removed follower until the removal is committed. A
   follower whose LEO is unknown (-1, not yet fetched under this leader) holds it back. The
   high watermark never moves back.
3. **ISR expansion** (R-REP-3, ``isFollowerInSync``): a replica outside the ISR whose LEO
   reached the high watermark and the start offset of the leader's epoch, while no change
   is in flight, is proposed for the ISR — if its broker is eligible (registered, not
   shutting down: KIP-841's ``isReplicaIsrEligible``).
4. **ISR shrink** (``getOutOfSyncReplicas``): an ISR follower whose LEO is not the leader's
   and that has not been caught up for ``lag_ms`` is proposed for removal. The leader
   never removes itself.
5. **One change in flight.** A proposal is pending until ``isr_committed`` (the state
   store took it: the committed ISR becomes it) or ``isr_failed`` (someone else decided:
   nothing changes). Proposals are refused while one is pending. An ISR set from outside
   (the controller) replaces the committed ISR at once.
6. **acks=all** (``acks_all``, Kafka's ``checkEnoughReplicasReachOffset``): an append
   ending before ``required_offset`` is complete once the high watermark reaches it; it
   succeeded if the committed ISR has at least ``min.insync.replicas`` members, else it is
   answered NOT_ENOUGH_REPLICAS_AFTER_APPEND.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from headrace.replication.epochs import diverging_epoch

UNKNOWN_OFFSET = -1


class NotAReplicaError(ValueError):
    """A fetch was counted for a broker that is not a follower of the partition (our
    misuse: the shell answers such a fetch NOT_LEADER_OR_FOLLOWER before it gets here)."""


class FetchPastEndError(ValueError):
    """A follower fetch offset past the leader's log end offset was counted (our misuse:
    such a read fails with OFFSET_OUT_OF_RANGE and must not reach the follower state)."""


class IsrChangeInFlightError(RuntimeError):
    """A second ISR change was proposed while one is pending (our misuse)."""


@dataclass(slots=True)
class FollowerState:
    """A follower as the leader knows it (Kafka's ``ReplicaState``)."""

    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_ms: int = 0
    last_fetch_leader_leo: int = UNKNOWN_OFFSET
    last_fetch_ms: int = 0


class IsrChangeKind(enum.Enum):
    EXPAND = "expand"
    SHRINK = "shrink"


@dataclass(frozen=True, slots=True)
class IsrChange:
    """An ISR to write (conditionally on the state the leader acted on)."""

    kind: IsrChangeKind
    isr: tuple[int, ...]
    replicas: tuple[int, ...]  # the followers added or removed
    reason: str


class AcksAll(enum.Enum):
    WAIT = "wait"                    # the high watermark has not reached the offset
    DONE = "done"                    # replicated to the ISR, which is large enough
    NOT_ENOUGH_REPLICAS = "not_enough_replicas_after_append"


class PartitionLeader:
    """One partition led by ``local_id`` at ``leader_epoch``.

    ``epoch_start_offset`` is where the leader's epoch starts in its log (its LEO when it
    became leader); ``high_watermark`` the one it had then. ``now_ms`` starts every ISR
    follower's caught-up clock, as Kafka's ``makeLeader`` does: each has
    ``replica.lag.time.max.ms`` from now to fetch.
    """

    def __init__(self, local_id: int, leader_epoch: int, replicas: Iterable[int],
                 isr: Iterable[int], epoch_start_offset: int, high_watermark: int,
                 now_ms: int) -> None:
        self.local_id = local_id
        self.leader_epoch = leader_epoch
        self.replicas: tuple[int, ...] = tuple(replicas)
        self.isr: tuple[int, ...] = tuple(isr)
        self.epoch_start_offset = epoch_start_offset
        self.high_watermark = high_watermark
        self.pending: IsrChange | None = None
        self.followers: dict[int, FollowerState] = {}
        for r in self.replicas:
            if r != local_id:
                self.followers[r] = (
                    FollowerState(UNKNOWN_OFFSET, now_ms, epoch_start_offset, now_ms)
                    if r in self.isr else FollowerState())

    # ------------------------------------------------------------------ views
    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The committed ISR plus a pending addition (a pending removal still counts)."""
        if self.pending is not None and self.pending.kind is IsrChangeKind.EXPAND:
            return (*self.isr, *(r for r in self.pending.isr if r not in self.isr))
        return self.isr

    def follower_log_end_offset(self, replica: int) -> int:
        f = self.followers.get(replica)
        return UNKNOWN_OFFSET if f is None else f.log_end_offset

    def is_follower(self, replica: int) -> bool:
        return replica in self.followers

    # ------------------------------------------------------------------ high watermark
    def high_watermark_candidate(self, log_end_offset: int) -> int:
        """The smallest LEO over the leader and the maximal ISR's followers (rule 2)."""
        hw = log_end_offset
        for r in self.maximal_isr:
            if r != self.local_id:
                f = self.followers.get(r)
                leo = UNKNOWN_OFFSET if f is None else f.log_end_offset
                hw = min(hw, leo)
        return hw

    def maybe_increment_high_watermark(self, log_end_offset: int) -> bool:
        """Move the high watermark up to the candidate; True if it moved."""
        new = self.high_watermark_candidate(log_end_offset)
        if new > self.high_watermark:
            self.high_watermark = new
            return True
        return False

    # ------------------------------------------------------------------ followers
    def follower_fetched(self, replica: int, fetch_offset: int, log_end_offset: int,
                         now_ms: int) -> bool:
        """A follower's fetch at ``fetch_offset`` (its LEO) was served from the log whose
        LEO is ``log_end_offset`` (rule 1). Returns whether the high watermark moved."""
        f = self.followers.get(replica)
        if f is None:
            raise NotAReplicaError(f"broker {replica} is not a follower of this partition "
                                   f"(replicas {list(self.replicas)}, leader {self.local_id})")
        if fetch_offset > log_end_offset:
            raise FetchPastEndError(f"broker {replica} fetched at {fetch_offset}, past the "
                                    f"leader's log end offset {log_end_offset}")
        if fetch_offset >= log_end_offset:
            f.last_caught_up_ms = max(f.last_caught_up_ms, now_ms)
        elif f.last_fetch_leader_leo >= 0 and fetch_offset >= f.last_fetch_leader_leo:
            f.last_caught_up_ms = max(f.last_caught_up_ms, f.last_fetch_ms)
        f.log_end_offset = fetch_offset
        f.last_fetch_leader_leo = log_end_offset
        f.last_fetch_ms = now_ms
        return self.maybe_increment_high_watermark(log_end_offset)

    def follower_caught_up(self, replica: int, now_ms: int) -> None:
        """An idle follower at the leader's LEO (a session fetch with nothing new, its
        fetch offset already counted) stays caught up."""
        f = self.followers.get(replica)
        if f is not None and f.log_end_offset >= f.last_fetch_leader_leo >= 0:
            f.last_caught_up_ms = max(f.last_caught_up_ms, now_ms)

    def is_follower_in_sync(self, replica: int) -> bool:
        """Rule 3's test: its LEO reached the high watermark and the epoch's start."""
        f = self.followers.get(replica)
        return (f is not None and f.log_end_offset >= 0
                and f.log_end_offset >= self.high_watermark
                and f.log_end_offset >= self.epoch_start_offset)

    def out_of_sync(self, log_end_offset: int, now_ms: int, lag_ms: int) -> list[int]:
        """ISR followers not caught up for ``lag_ms`` (rule 4), and at once an ISR member
        that is no longer a replica: a reassignment removed it, and it never fetches
        again (a leader whose assignment was still the old one took it back in just after
        the controller's completion took it out; it held the high watermark still)."""
        out = []
        for r in self.isr:
            if r != self.local_id and r not in self.replicas:
                out.append(r)
                continue
            f = self.followers.get(r)
            if r == self.local_id or f is None:
                continue
            if f.log_end_offset != log_end_offset and now_ms - f.last_caught_up_ms > lag_ms:
                out.append(r)
        return out

    # ------------------------------------------------------------------ ISR changes
    def maybe_expand_isr(self, replica: int, eligible: bool = True) -> IsrChange | None:
        """Propose ``replica`` for the ISR if rule 3 allows it (it becomes pending).
        ``eligible``: its broker is registered and not shutting down (KIP-841); one that is
        not is never added back, or the leader would fight the controller that took it
        out."""
        if (not eligible or self.pending is not None or replica in self.isr
                or replica not in self.followers or not self.is_follower_in_sync(replica)):
            return None
        isr = tuple(r for r in self.replicas if r in self.isr or r == replica)
        isr += tuple(r for r in self.isr if r not in isr)  # an ISR member not in replicas
        change = IsrChange(IsrChangeKind.EXPAND, isr, (replica,), f"broker {replica} caught up")
        self.pending = change
        return change

    def maybe_shrink_isr(self, log_end_offset: int, now_ms: int, lag_ms: int
                         ) -> IsrChange | None:
        """Propose removing the followers out of sync (rule 4; it becomes pending)."""
        if self.pending is not None:
            return None
        out = self.out_of_sync(log_end_offset, now_ms, lag_ms)
        if not out:
            return None
        isr = tuple(r for r in self.isr if r not in out)
        change = IsrChange(IsrChangeKind.SHRINK, isr, tuple(out),
                           f"broker(s) {out} not caught up for {lag_ms} ms")
        self.pending = change
        return change

    def isr_committed(self, change: IsrChange, log_end_offset: int, now_ms: int) -> bool:
        """The state store took ``change``: it is the committed ISR now (rule 5). A
        follower added counts as caught up now. Returns whether the high watermark moved."""
        if self.pending is not change:
            raise IsrChangeInFlightError(f"{change} is not the pending ISR change "
                                         f"({self.pending})")
        self.pending = None
        self.isr = change.isr
        if change.kind is IsrChangeKind.EXPAND:
            for r in change.replicas:
                f = self.followers.get(r)
                if f is not None:
                    f.last_caught_up_ms = max(f.last_caught_up_ms, now_ms)
        return self.maybe_increment_high_watermark(log_end_offset)

    def isr_failed(self, change: IsrChange) -> None:
        """The state store refused ``change`` (a lost race: someone else decided): nothing
        changes. Never for a write without an answer — it may have been applied; it stays
        pending until a newer state settles it."""
        if self.pending is change:
            self.pending = None

    def set_isr(self, isr: Iterable[int], log_end_offset: int, now_ms: int) -> bool:
        """The controller set the ISR (same leader and epoch). A follower it adds is
        caught up as of now. Returns whether the high watermark moved."""
        isr = tuple(isr)
        for r in isr:
            f = self.followers.get(r)
            if r not in self.isr and f is not None:
                f.last_caught_up_ms = max(f.last_caught_up_ms, now_ms)
        self.isr = isr
        return self.maybe_increment_high_watermark(log_end_offset)

    def set_replicas(self, replicas: Iterable[int]) -> None:
        """A reassignment changed the replica set: followers added start unknown."""
        self.replicas = tuple(replicas)
        for r in self.replicas:
            if r != self.local_id and r not in self.followers:
                self.followers[r] = FollowerState()
        for r in list(self.followers):
            if r not in self.replicas:
                del self.followers[r]

    # ------------------------------------------------------------------ acks=all
    def acks_all(self, required_offset: int, min_insync_replicas: int) -> AcksAll:
        """Rule 6 for an append whose last offset is ``required_offset - 1``."""
        if self.high_watermark < required_offset:
            return AcksAll.WAIT
        if len(self.isr) < min_insync_replicas:
            return AcksAll.NOT_ENOUGH_REPLICAS
        return AcksAll.DONE


# ---------------------------------------------------------------------- follower fetches
class FollowerFetchCheck(enum.Enum):
    READ = "read"                      # read from fetch_offset, then count the fetch
    DIVERGING = "diverging"            # answer the diverging epoch, count nothing
    OUT_OF_RANGE = "out_of_range"      # OFFSET_OUT_OF_RANGE, count nothing


@dataclass(frozen=True, slots=True)
class FollowerFetch:
    check: FollowerFetchCheck
    diverging: tuple[int, int] | None = None  # (epoch, end offset) when DIVERGING


def check_follower_fetch(epochs: Sequence[tuple[int, int]], log_start_offset: int,
                         log_end_offset: int, last_fetched_epoch: int,
                         fetch_offset: int) -> FollowerFetch:
    """What the leader does with a follower's fetch before it reads (Kafka's
    ``Partition.fetchRecords`` / ``UnifiedLog.read``): a follower whose last fetched epoch
    diverges from this log gets the diverging epoch (it truncates; rule 1: the fetch is not
    counted); an offset outside [log start, LEO] is out of range (not counted either);
    anything else is read, and only a read that succeeded is counted with
    ``PartitionLeader.follower_fetched``."""
    div = diverging_epoch(epochs, log_end_offset, last_fetched_epoch, fetch_offset)
    if div is not None:
        return FollowerFetch(FollowerFetchCheck.DIVERGING, div)
    if not log_start_offset <= fetch_offset <= log_end_offset:
        return FollowerFetch(FollowerFetchCheck.OUT_OF_RANGE)
    return FollowerFetch(FollowerFetchCheck.READ)
