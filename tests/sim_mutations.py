"""One-line changes to the replication rules that the simulation must catch (issue 21).

Each mutation is a context manager patching the pure core the way the one-line change
would; ``first_failing_seed`` runs seeds until the simulation reports a violation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from headrace.replication import epochs as ep
from headrace.replication import leader as ld
from headrace.simulation.run import Result, run_seed


@contextlib.contextmanager
def _patch(obj: object, name: str, value: object) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def rejoin_without_catching_up() -> contextlib.AbstractContextManager[None]:
    """``is_follower_in_sync`` always True: a follower rejoins the ISR without catching up."""
    return _patch(ld.PartitionLeader, "is_follower_in_sync", lambda self, replica: True)


def never_truncate() -> contextlib.AbstractContextManager[None]:
    """``truncation`` returns the log end: a returning follower never truncates."""
    return _patch(ep, "truncation",
                  lambda epochs, log_end_offset, *a: ep.Truncation(log_end_offset, True))


def hw_ignores_followers() -> contextlib.AbstractContextManager[None]:
    """``high_watermark_candidate`` is the leader's log end offset."""
    return _patch(ld.PartitionLeader, "high_watermark_candidate",
                  lambda self, log_end_offset: log_end_offset)


@contextlib.contextmanager
def count_fetch_past_end() -> Iterator[None]:
    """``check_follower_fetch`` reads (and counts) every fetch, a diverged one past the
    leader's log end included (issue 21's defect 2), and ``follower_fetched`` takes the
    fetch offset as the follower's log end as the old handler did."""
    real = ld.PartitionLeader.follower_fetched

    def counted(self: ld.PartitionLeader, replica: int, fetch_offset: int,
                log_end_offset: int, now_ms: int) -> bool:
        if fetch_offset > log_end_offset:  # the old handler: no guard
            f = self.followers[replica]
            f.log_end_offset = fetch_offset
            f.last_caught_up_ms = now_ms
            f.last_fetch_leader_leo = log_end_offset
            f.last_fetch_ms = now_ms
            return self.maybe_increment_high_watermark(log_end_offset)
        return real(self, replica, fetch_offset, log_end_offset, now_ms)

    with _patch(ld, "check_follower_fetch",
                lambda *a: ld.FollowerFetch(ld.FollowerFetchCheck.READ)), \
            _patch(ld.PartitionLeader, "follower_fetched", counted):
        yield


MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "rejoin_without_catching_up": rejoin_without_catching_up,
    "never_truncate": never_truncate,
    "hw_ignores_followers": hw_ignores_followers,
    "count_fetch_past_end": count_fetch_past_end,
}


def first_failing_seed(mutation: str, seeds: range) -> Result | None:
    with MUTATIONS[mutation]():
        for s in seeds:
            r = run_seed(s)
            if not r.ok:
                return r
    return None


def election_keeps_epoch() -> contextlib.AbstractContextManager[None]:
    """The controller's election does not move the leader epoch (two leaders, one epoch)."""
    from dataclasses import replace

    from headrace.replication import controller as ctl

    def elected(st, leader, isr):  # type: ignore[no-untyped-def]
        return replace(st, leader=leader, isr=list(isr), replicas=list(st.replicas))

    return _patch(ctl, "elected", elected)


def hw_follows_candidate() -> contextlib.AbstractContextManager[None]:
    """``maybe_increment_high_watermark`` takes the candidate even when it is lower."""
    def move(self: ld.PartitionLeader, log_end_offset: int) -> bool:
        new = self.high_watermark_candidate(log_end_offset)
        moved = new != self.high_watermark
        self.high_watermark = new
        return moved

    return _patch(ld.PartitionLeader, "maybe_increment_high_watermark", move)


MUTATIONS["election_keeps_epoch"] = election_keeps_epoch
MUTATIONS["hw_follows_candidate"] = hw_follows_candidate


def consumer_reads_past_hw() -> contextlib.AbstractContextManager[None]:
    """A consumer's fetch is served up to the log end, not the high watermark."""
    from headrace.simulation.world import Broker

    return _patch(Broker, "fetch_end", lambda self, r: r.leo)


MUTATIONS["consumer_reads_past_hw"] = consumer_reads_past_hw


def no_duplicate_detection() -> contextlib.AbstractContextManager[None]:
    """The leader forgets the producer state: every retry is appended again."""
    from headrace.simulation.world import Replica

    real = Replica.append

    def append(self: Replica, rec: tuple[int, int, int]) -> int:
        o = real(self, rec)
        self.ids.pop((rec[1], rec[2]), None)
        return o

    return _patch(Replica, "append", append)


MUTATIONS["no_duplicate_detection"] = no_duplicate_detection


def aborted_lookup_by_first_offset() -> contextlib.AbstractContextManager[None]:
    """``TxnTracker.aborted_in`` keyed on the first offset instead of the marker's (issue
    21's fourth one-line change): a fetch starting inside an aborted transaction does not
    name it."""
    import bisect

    from headrace.log.transactions import AbortedTxn, TxnTracker

    def aborted_in(self: TxnTracker, start: int, end: int) -> list[AbortedTxn]:
        i = bisect.bisect_left(self.aborted, start, key=lambda a: a.first_offset)
        return [a for a in self.aborted[i:] if a.first_offset < end]

    return _patch(TxnTracker, "aborted_in", aborted_in)


def markers_not_retried_at_new_leader() -> contextlib.AbstractContextManager[None]:
    """The coordinator resends a transaction marker to the leader it first sent it to, not
    to the partition's leader now."""
    from headrace.simulation.txn import MarkerJob, TxnShell

    def marker_target(self: TxnShell, job: MarkerJob, p: int) -> int:
        return job.sent_to.get(p, self.w.leader_of(p))

    return _patch(TxnShell, "marker_target", marker_target)


def lso_is_high_watermark() -> contextlib.AbstractContextManager[None]:
    """The last stable offset is the high watermark (open transactions ignored)."""
    from headrace.log.transactions import TxnTracker

    return _patch(TxnTracker, "last_stable_offset", lambda self, high_watermark: high_watermark)


MUTATIONS["aborted_lookup_by_first_offset"] = aborted_lookup_by_first_offset
MUTATIONS["markers_not_retried_at_new_leader"] = markers_not_retried_at_new_leader
MUTATIONS["lso_is_high_watermark"] = lso_is_high_watermark


def abort_keeps_producer_epoch() -> contextlib.AbstractContextManager[None]:
    """The coordinator aborts a timed-out (or fenced) transaction without bumping the
    producer epoch: the old producer's late records are not fenced."""
    from headrace.txn.coordinator import TxnCoordinator, TxnMetadata, TxnState, TxnWrite

    def abort(self: TxnCoordinator, m: TxnMetadata, now_ms: int) -> TxnWrite:
        return self._begin(m, m.copy(state=TxnState.PREPARE_ABORT, last_update_ms=now_ms))

    return _patch(TxnCoordinator, "_abort_fenced", abort)


MUTATIONS["abort_keeps_producer_epoch"] = abort_keeps_producer_epoch


def coordinator_epoch_unchecked() -> contextlib.AbstractContextManager[None]:
    """``marker_refusal`` checks the producer epoch only: a deposed coordinator's late
    marker is written (the broker's rule, used by the simulation's leaders too)."""
    from kio.schema.errors import ErrorCode

    from headrace.log import producer_state as ps

    def refusal(current_epoch: int, current_coordinator_epoch: int, epoch: int,
                coordinator_epoch: int) -> ErrorCode | None:
        return ErrorCode.invalid_producer_epoch if epoch < current_epoch else None

    return _patch(ps, "marker_refusal", refusal)


MUTATIONS["coordinator_epoch_unchecked"] = coordinator_epoch_unchecked
