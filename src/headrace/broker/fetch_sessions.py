"""KIP-227 incremental fetch sessions, leader side (Kafka's ``FetchSessionCache``).

A follower fetching hundreds of partitions from one leader would otherwise send all of
them in every Fetch and get all of them back, even when one partition changed: in Python
that per-partition encoding and decoding, on both brokers, is most of a replication round
trip. With a session the leader remembers the partitions and their fetch positions; an
incremental request names only partitions that were added or whose fetch offset changed
(and the ones to forget), and the response carries only partitions with records, an
error, or a changed high watermark / last stable offset / log start offset.

Protocol (as Kafka): ``session_id`` 0 with epoch 0 asks for a new session (a full fetch;
the response's ``session_id`` names it, or is 0 when the broker keeps none); ``session_id``
0 with epoch -1 is a sessionless full fetch; a known id with the expected epoch is an
incremental fetch (the epoch then moves on, wrapping to 1); an unknown id answers
FETCH_SESSION_ID_NOT_FOUND, a wrong epoch INVALID_FETCH_SESSION_EPOCH, and epoch -1 with
an id closes that session. Sessions are kept for replica fetchers only (clients get 0 and
stay on full fetches, which Kafka also allows); at most ``slots`` sessions, the least
recently used evicted first. Pure: time is passed in.

A round costs what changed, not the session's size (a follower of 15,000 partitions
would otherwise cost the leader a pass over all of them on every fetch, and twice per
long poll: at 30,000 partitions that idle work kept the brokers at 0.4 core each). The
session keeps ``dirty``: the partitions the leader woke (an append, a high watermark, a
leadership or ISR change: ``ReplicaManager.wake``) since they were last looked at, and
those found with something to send. An incremental fetch looks at those and at the ones
it names; every ``full_pass_ms`` it looks at all of them (``full_pass_due``), which both
renews the caught-up time of the quiet ones (``replica.lag.time.max.ms`` is measured from
it) and catches a change nothing woke (a retention that moved the log start).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_EPOCH = 2**31 - 1
DEFAULT_SLOTS = 1000  # Kafka's max.incremental.fetch.session.cache.slots


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= MAX_EPOCH else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """A session's partition: what the follower last asked, and what it was last told.
    Shaped like a request's FetchPartition so the fetch handler can read it as one."""

    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int
    log_start_offset: int
    last_fetched_epoch: int = -1  # a follower's (KIP-320), checked for divergence
    # what the last response carrying this partition said (-1: never sent)
    high_watermark: int = -1
    last_stable_offset: int = -1
    leader_log_start: int = -1

    def must_respond(self, error_code: int, records_size: int, high_watermark: int,
                     last_stable_offset: int, log_start_offset: int) -> bool:
        """Kafka's ``maybeUpdateResponseData``: whether an incremental response carries
        this partition; what it carries becomes what the follower was last told."""
        changed = (records_size > 0 or error_code != 0
                   or high_watermark != self.high_watermark
                   or last_stable_offset != self.last_stable_offset
                   or log_start_offset != self.leader_log_start)
        if changed:
            self.high_watermark = high_watermark
            self.last_stable_offset = last_stable_offset
            self.leader_log_start = log_start_offset
        return changed


@dataclass(eq=False)  # identity: held in the replica manager's weak sets
class FetchSession:
    id: int
    owner: int  # the replica id that created it
    epoch: int  # the epoch the next incremental request must carry
    last_used_ms: int
    # (topic, partition) -> cached state, in the order partitions were added
    partitions: dict[tuple[str, int], CachedPartition] = field(default_factory=dict)
    # partitions to look at in the next round besides those the request names (see above)
    dirty: set[tuple[str, int]] = field(default_factory=set)
    last_full_ms: int = -(2**62)  # the last round that looked at every partition
    waiter: Any = None  # the shell's: what wakes a fetch parked on this session

    def full_pass_due(self, now_ms: int, full_pass_ms: int) -> bool:
        return now_ms - self.last_full_ms >= full_pass_ms

    def update(self, topics: Any, forgotten: Any) -> tuple[list[tuple[str, int]],
                                                           list[tuple[str, int]]]:
        """An incremental request: partitions named are added or updated, forgotten ones
        dropped. Returns (added, dropped) keys."""
        added: list[tuple[str, int]] = []
        dropped: list[tuple[str, int]] = []
        for t in topics or ():
            for p in t.partitions or ():
                key = (str(t.topic), int(p.partition))
                cached = self.partitions.get(key)
                if cached is None:
                    self.partitions[key] = _cached(p)
                    added.append(key)
                else:
                    cached.fetch_offset = int(p.fetch_offset)
                    cached.partition_max_bytes = int(p.partition_max_bytes)
                    cached.current_leader_epoch = int(getattr(p, "current_leader_epoch", -1))
                    cached.log_start_offset = int(getattr(p, "log_start_offset", -1))
                    cached.last_fetched_epoch = int(getattr(p, "last_fetched_epoch", -1))
        for t in forgotten or ():
            for index in t.partitions or ():
                key = (str(t.topic), int(index))
                if self.partitions.pop(key, None) is not None:
                    dropped.append(key)
                    self.dirty.discard(key)
        return added, dropped

    def by_topic(self) -> list[tuple[str, list[CachedPartition]]]:
        out: dict[str, list[CachedPartition]] = {}
        for (topic, _), cached in self.partitions.items():
            out.setdefault(topic, []).append(cached)
        return list(out.items())


def _cached(p: Any) -> CachedPartition:
    return CachedPartition(int(p.partition), int(p.fetch_offset), int(p.partition_max_bytes),
                           int(getattr(p, "current_leader_epoch", -1)),
                           int(getattr(p, "log_start_offset", -1)),
                           int(getattr(p, "last_fetched_epoch", -1)))


class FetchSessionCache:
    def __init__(self, slots: int = DEFAULT_SLOTS, rng: random.Random | None = None) -> None:
        self.slots = slots
        self._rng = rng or random.Random()
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, owner: int, topics: Any, now_ms: int) -> FetchSession | None:
        """A new session holding the partitions of a full request (None: no slots)."""
        if self.slots <= 0:
            return None
        while len(self._sessions) >= self.slots:
            self._sessions.popitem(last=False)  # least recently used
        sid = 0
        while sid == 0 or sid in self._sessions:
            sid = self._rng.randrange(1, 2**31)
        session = FetchSession(sid, owner, next_epoch(INITIAL_EPOCH), now_ms)
        session.update(topics, ())
        self._sessions[sid] = session
        return session

    def get(self, session_id: int, now_ms: int) -> FetchSession | None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.last_used_ms = now_ms
            self._sessions.move_to_end(session_id)
        return session

    def remove(self, session_id: int) -> None:
        self._sessions.pop(session_id, None)

    def remove_owned_by(self, owner: int) -> None:
        for sid in [s for s, v in self._sessions.items() if v.owner == owner]:
            del self._sessions[sid]
