"""Fetch (1): read committed batches, long-polling until enough data (R-PROTO-4).

Per partition: up to ``partition_max_bytes``; per response: up to ``max_bytes`` capped at the
broker's ``fetch.max.bytes`` (as Kafka's ``KafkaApis.handleFetchRequest``), except that
the first batch of the first partition with data is returned whole (KIP-74) so a consumer
can always make progress. Consumers see data below the high watermark (read_uncommitted) or
the last stable offset (read_committed). If fewer than ``min_bytes`` are available the request
is parked until an append wakes it or ``max_wait`` ends. Fetch sessions (KIP-227,
``fetch_sessions.py``) are kept for replica fetchers: their incremental requests and
responses carry only what changed; clients are answered ``session_id`` 0 and stay on full
fetches.

Hot path: each partition's batches are one ``os.pread`` per segment (``read_chunks``), and the
response is encoded by hand around them (``codec.encode_fetch_body``) and written with
``writev`` by the connection, so record bytes are never copied in user space after the read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    CachedPartition,
    FetchSession,
    next_epoch,
)
from headrace.broker.handlers.base import RequestContext, handler, ms
from headrace.broker.replica_manager import Partition, TopicPartition
from headrace.broker.security import CLUSTER_ACTION, READ, TOPIC
from headrace.log.errors import LogError
from headrace.log.segment import FileRegion
from headrace.protocol.codec import FetchPartition, encode_fetch_body
from headrace.protocol.records import records_in_batches
from headrace.replication.leader import FollowerFetchCheck

if TYPE_CHECKING:
    from headrace.broker.server import Broker

READ_COMMITTED = 1


def _epoch_error(current_leader_epoch: int, leader_epoch: int) -> ErrorCode | None:
    if current_leader_epoch < 0 or current_leader_epoch == leader_epoch:
        return None
    if current_leader_epoch > leader_epoch:
        return ErrorCode.unknown_leader_epoch
    return ErrorCode.fenced_leader_epoch


def _not_led_here(broker: Broker, tp: TopicPartition, not_hosted: bool) -> ErrorCode:
    """Kafka's ``ReplicaManager.getPartitionOrException`` for a partition this broker does
    not lead: one the metadata no longer has (its topic deleted, e.g. while the fetch was
    parked: the delete wakes it) is UNKNOWN_TOPIC_OR_PARTITION; one that exists but is led
    or hosted elsewhere NOT_LEADER_OR_FOLLOWER."""
    if not_hosted:
        state = broker.metadata.topic(tp.topic)
        if state is None or tp.partition >= len(state.partitions):
            return ErrorCode.unknown_topic_or_partition
    return ErrorCode.not_leader_or_follower


class _SessionTopic:
    """A fetch session's topic, shaped like a request's FetchTopic (v7-v12: by name)."""

    __slots__ = ("partitions", "topic", "topic_id")

    def __init__(self, topic: str, partitions: list[CachedPartition]) -> None:
        self.topic = topic
        self.topic_id = None
        self.partitions = partitions


class _Plan:
    """The request resolved once: (topic key, name, tp or error, fetch partition)."""

    def __init__(self, broker: Broker, topics: Any, by_id: bool,
                 readable: Callable[[str], bool] | None = None) -> None:
        self.entries: list[tuple[Any, list[tuple[TopicPartition | None, Any, ErrorCode]]]] = []
        for t in topics:
            if by_id:
                # the all-zero id reads as None: no topic has it (Kafka: UNKNOWN_TOPIC_ID)
                topic = broker.metadata.topic_by_id(t.topic_id) if t.topic_id else None
                name = topic.name if topic is not None else None
                missing = ErrorCode.unknown_topic_id
            else:
                name = t.topic
                missing = ErrorCode.unknown_topic_or_partition
            parts: list[tuple[TopicPartition | None, Any, ErrorCode]] = []
            state = broker.metadata.topic(name) if name is not None else None
            count = len(state.partitions) if state is not None else 0
            refused = name is not None and readable is not None and not readable(name)
            for p in t.partitions:
                if refused:  # Kafka: before the topic's existence
                    parts.append((None, p, ErrorCode.topic_authorization_failed))
                elif state is None or name is None:
                    parts.append((None, p, missing))
                elif not 0 <= p.partition < count:  # Kafka: UNKNOWN_TOPIC_OR_PARTITION
                    parts.append((None, p, ErrorCode.unknown_topic_or_partition))
                else:
                    parts.append((TopicPartition(name, int(p.partition)), p, ErrorCode.none))
            self.entries.append((t, parts))

    def tps(self) -> list[TopicPartition]:
        return [tp for _, parts in self.entries for tp, _, _ in parts if tp is not None]


def _read_all(
    broker: Broker, plan: _Plan, max_bytes: int, isolation: int, by_id: bool,
    replica_id: int = -1, first: bool = True, regions: bool = False,
) -> tuple[list[tuple[Any, list[FetchPartition]]], int, bool, bool]:
    """One pass over the partitions: (topic responses, bytes available, any error, whether
    some records are ``FileRegion``s: only with ``regions``, see ``read_chunks``).

    Bytes available count, as Kafka's ``DelayedFetch`` does, a partition whose read was cut
    short by its byte limit as that limit: a backlog larger than ``min_bytes`` completes the
    fetch even though whole batches never add up to exactly ``partition_max_bytes``.
    """
    remaining = max_bytes
    total = 0
    available = 0
    any_error = False
    any_region = False
    topics: list[tuple[Any, list[FetchPartition]]] = []
    read_committed = isolation == READ_COMMITTED
    for t, parts in plan.entries:
        out: list[FetchPartition] = []
        for tp, p, code in parts:
            entry = FetchPartition(int(p.partition), int(code), [] if read_committed else None)
            out.append(entry)
            if tp is None:
                any_error = True
                continue
            partition = broker.replicas.get(tp)
            # Kafka's order (Partition.getLocalLog): the epoch first, then leadership, so a
            # follower that learnt of a new leader epoch before the new leader did hears
            # UNKNOWN_LEADER_EPOCH (retry at once), not NOT_LEADER_OR_FOLLOWER (wait)
            epoch_error = None if partition is None else _epoch_error(
                int(getattr(p, "current_leader_epoch", -1)), partition.leader_epoch)
            if epoch_error is not None:
                entry.error_code = int(epoch_error)
                any_error = True
                continue
            if partition is None or not partition.is_leader(broker.node_id):
                entry.error_code = int(_not_led_here(broker, tp, partition is None))
                any_error = True
                continue
            plog = partition.log
            entry.high_watermark = plog.high_watermark
            entry.last_stable_offset = plog.last_stable_offset
            entry.log_start_offset = plog.log_start_offset
            follower = False
            if replica_id >= 0:
                # a follower (R-REP-3): it reads up to the log end offset. Only a replica of
                # the partition may: anything else claiming a replica id could move the high
                # watermark (Kafka answers the same). A follower whose last fetched epoch
                # diverges from this log gets the diverging epoch instead of records
                # (KIP-320, Fetch v12+) and truncates; one out of range gets the error.
                # Neither is counted: follower state changes only after a successful read.
                if replica_id not in partition.state.replicas or replica_id == broker.node_id:
                    entry.error_code = int(ErrorCode.not_leader_or_follower)
                    any_error = True
                    continue
                check = partition.check_follower_fetch(
                    int(getattr(p, "last_fetched_epoch", -1)), int(p.fetch_offset))
                if check.check is FollowerFetchCheck.DIVERGING and check.diverging == (-1, -1):
                    # this log knows no epoch at or below the follower's: the wire cannot say
                    # so (a diverging epoch of -1 reads as none), so answer out of range and
                    # the follower asks with OffsetForLeaderEpoch (and truncates to its high
                    # watermark), as it would have before truncation on fetch
                    entry.error_code = int(ErrorCode.offset_out_of_range)
                    any_error = True
                    continue
                if check.check is FollowerFetchCheck.DIVERGING:
                    entry.diverging_epoch = check.diverging
                    any_error = True  # answer at once: the follower must truncate
                    continue
                if check.check is FollowerFetchCheck.OUT_OF_RANGE:
                    entry.error_code = int(ErrorCode.offset_out_of_range)
                    any_error = True
                    continue
                follower = first  # counted once per request, not per long-poll pass
                max_offset = plog.log_end_offset
            else:
                # a consumer (Fetch v12+) names the epoch of the last record it read: one whose
                # position lies past where that epoch ends here (an unclean election cut it
                # off) gets the diverging epoch and no records, as Kafka's readRecords does
                # for every fetch; it truncates to it (KIP-320) instead of seeing
                # OFFSET_OUT_OF_RANGE and resetting. At the latest epoch nothing diverges.
                last_fetched = int(getattr(p, "last_fetched_epoch", -1))
                if last_fetched >= 0:
                    epochs = plog.leader_epochs
                    if not epochs or epochs[-1][0] != last_fetched:
                        check = partition.check_follower_fetch(last_fetched, int(p.fetch_offset))
                        div = check.diverging
                        if div is not None and div[0] >= 0 and div[1] >= 0:
                            entry.diverging_epoch = div
                            any_error = True
                            continue
                max_offset = plog.last_stable_offset if read_committed else plog.high_watermark
            partition_max = int(p.partition_max_bytes)
            limit = min(partition_max, remaining)
            if limit <= 0 and total > 0:
                continue
            try:
                chunks, size, cut = plog.read_chunks(
                    int(p.fetch_offset), limit, max_offset=max_offset, min_one_batch=total == 0,
                    regions=regions,
                )
            except LogError as e:
                entry.error_code = int(e.error_code)
                any_error = True
                continue
            if regions and not any_region:
                any_region = any(c.__class__ is FileRegion for c in chunks)
            entry.records = chunks
            entry.records_size = size
            if follower:  # its fetch offset is its log end offset
                broker.follower_fetched(partition, replica_id, int(p.fetch_offset))
                entry.high_watermark = plog.high_watermark
            if read_committed and size and plog.txns.aborted:
                # the aborted transactions overlapping what was read (up to the LSO): the
                # consumer drops their records (Kafka's fetchAbortedTransactions)
                entry.aborted_transactions = [
                    (a.producer_id, a.first_offset)
                    for a in plog.aborted_transactions(int(p.fetch_offset), max_offset)]
            total += size
            remaining -= size
            available += max(size, partition_max) if cut else size
        topics.append((t.topic_id if by_id else t.topic, out))
    return topics, available, any_error, any_region


def _session_plan(broker: Broker, session: FetchSession, named: set[tuple[str, int]],
                  replica_id: int, by_id: bool, first: bool,
                  candidates: Iterable[tuple[str, int]] | None = None) -> _Plan:
    """The session partitions an incremental fetch must read: those the request named and
    those with anything new for the follower, among ``candidates`` (None: every partition
    of the session, its full pass; see fetch_sessions.py). A quiet one (the follower is at
    the log end offset and HW, LSO and log start are as last sent) is only noted as caught
    up, as a read would (``first`` pass): so a follower of many partitions costs the leader
    a few dict lookups per idle partition, not a read and a response entry. A quiet
    partition whose follower is out of the ISR goes through the whole follower
    bookkeeping, so that it rejoins: a caught-up follower taken out by the controller (its
    ZooKeeper session expired) has no new offset to name, and would otherwise stay out
    until new records arrive (a parked fetch's re-read, not ``first``, leaves it dirty for
    the next round's bookkeeping). A partition that is not quiet stays in the session's
    ``dirty`` set, so the next round looks at it again (a read cut short by the response's
    byte limit, an error) even if nothing wakes it."""
    # This loop runs over every partition of the session on every fetch (thousands: a
    # follower of 10,000 partitions); its checks go cheapest first and skip what cannot
    # differ (bench/cluster_bench.py --scale measured it at 42% of a leader's samples).
    # The session's keys are (topic, partition) tuples, equal and hashing equal to the
    # TopicPartition keys of ``partitions``, so no TopicPartition is built per partition.
    now_ms = broker.clock.wall_ms()
    partitions: Mapping[Any, Partition] = broker.replicas.partitions
    active: dict[str, list[CachedPartition]] = {}
    cache = session.partitions
    if candidates is None:
        items: Iterable[tuple[tuple[str, int], CachedPartition]] = cache.items()
    else:
        items = [(key, c) for key in candidates if (c := cache.get(key)) is not None]
    dirty = session.dirty
    for key, cached in items:
        if key not in named:
            part = partitions.get(key)
            if part is not None and part.leading:
                plog = part.log
                fetch_offset = cached.fetch_offset
                last_fetched = cached.last_fetched_epoch
                epochs = plog.leader_epochs
                if (plog.log_end_offset == fetch_offset
                        and plog.high_watermark == cached.high_watermark
                        and plog.last_stable_offset == cached.last_stable_offset
                        and plog.log_start_offset == cached.leader_log_start
                        and cached.current_leader_epoch in (-1, part.leader_epoch)
                        and replica_id in part.state.replicas
                        # at the log end with the latest epoch (or none): nothing diverges
                        # (what check_follower_fetch answers then, without its search)
                        and ((last_fetched < 0 or (epochs and epochs[-1][0] == last_fetched))
                             or part.check_follower_fetch(last_fetched, fetch_offset).check
                             is FollowerFetchCheck.READ)):
                    if first:
                        if replica_id not in part.state.isr:
                            broker.follower_fetched(part, replica_id, cached.fetch_offset)
                        else:
                            part.follower_caught_up(replica_id, now_ms)
                    elif replica_id not in part.state.isr:
                        # a parked fetch's re-read (an ISR change woke it): the next
                        # round's bookkeeping proposes the follower again
                        dirty.add(key)
                    continue
        dirty.add(key)
        active.setdefault(key[0], []).append(cached)
    return _Plan(broker, [_SessionTopic(name, parts) for name, parts in active.items()],
                 by_id)


def _full_pass_ms(broker: Broker) -> int:
    """How often a session's round looks at all of its partitions: a quarter of
    ``replica.lag.time.max.ms`` (so a quiet follower's caught-up time is never older than
    that, far from the limit), at most 5 s, at least 0.1 s."""
    return max(100, min(int(broker.config["replica.lag.time.max.ms"]) // 4, 5000))


def _replica_id(ctx: RequestContext, req: Any) -> int:
    """The fetching follower's broker id (v15+ carry it in ``replica_state``), or -1."""
    if ctx.api_version >= 15:
        state = getattr(req, "replica_state", None)
        return int(state.replica_id) if state is not None else -1
    return int(getattr(req, "replica_id", -1))


@handler(1, "Fetch", 4, 16)
async def handle_fetch(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    by_id = ctx.api_version >= 13
    isolation = int(getattr(req, "isolation_level", 0))
    # Kafka: min(request max_bytes, fetch.max.bytes); the first batch still goes whole (KIP-74)
    max_bytes = min(int(getattr(req, "max_bytes", 2**31 - 1)),
                    int(broker.config["fetch.max.bytes"]))
    min_bytes = int(req.min_bytes)
    max_wait_ms = ms(req.max_wait)
    replica_id = _replica_id(ctx, req)
    if replica_id >= 0 and broker.cluster is None:
        replica_id = -1  # no replication on a single node: an ordinary read
    session: FetchSession | None = None
    incremental = False
    security = broker.security
    # Kafka: a follower needs CLUSTER_ACTION on the cluster (else every partition is
    # TOPIC_AUTHORIZATION_FAILED), a consumer READ on each topic
    if security.enabled and replica_id >= 0 and not security.cluster_allowed(
            ctx, CLUSTER_ACTION):
        plan = _Plan(broker, req.topics, by_id, lambda name: False)
        topics, _, _, _ = _read_all(broker, plan, max_bytes, isolation, by_id)
        return encode_fetch_body(ctx.api_version, 0, 0, 0, topics)
    readable: Callable[[str], bool] | None = None
    if security.enabled and replica_id < 0:
        names = {str(t.topic) for t in req.topics or () if getattr(t, "topic", None)}
        if by_id:
            names = {found.name for t in req.topics or ()
                     if (found := broker.metadata.topic_by_id(t.topic_id)) is not None}
        readable = security.allowed_names(ctx, READ, TOPIC, names).__contains__
    if ctx.api_version >= 7:  # KIP-227 fetch sessions (see fetch_sessions.py)
        session_id, session_epoch = int(req.session_id), int(req.session_epoch)
        sessions = broker.fetch_sessions
        now_ms = broker.clock.wall_ms()
        if session_id != 0 and session_epoch == FINAL_EPOCH:
            sessions.remove(session_id)  # closed: this one is a sessionless full fetch
        elif session_id != 0:
            session = sessions.get(session_id, now_ms)
            if session is None:
                return encode_fetch_body(ctx.api_version, 0,
                                         int(ErrorCode.fetch_session_id_not_found), 0, [])
            if session.epoch != session_epoch:
                return encode_fetch_body(ctx.api_version, 0,
                                         int(ErrorCode.invalid_fetch_session_epoch), 0, [])
            added, dropped = session.update(req.topics, req.forgotten_topics_data)
            if added:
                broker.replicas.subscribe_session(session, added)
            if dropped:
                broker.replicas.unsubscribe_session(session, dropped)
            session.epoch = next_epoch(session.epoch)
            incremental = True
        elif session_epoch == INITIAL_EPOCH and replica_id >= 0 and not by_id:
            session = sessions.create(replica_id, req.topics, now_ms)
            if session is not None:
                session.last_full_ms = now_ms  # this full fetch reads every partition
                broker.replicas.subscribe_session(session, session.partitions)
    watched: list[TopicPartition] = []
    if incremental:
        assert session is not None
        named = {(str(t.topic), int(p.partition)) for t in req.topics or ()
                 for p in t.partitions or ()}
        now_ms = broker.clock.wall_ms()
        candidates: set[tuple[str, int]] | None = None
        if not session.full_pass_due(now_ms, _full_pass_ms(broker)):
            candidates = named | session.dirty
        else:
            session.last_full_ms = now_ms
        session.dirty = set()  # what is still not quiet goes back in (_session_plan)
        plan = _session_plan(broker, session, named, replica_id, by_id, True, candidates)
    else:
        plan = _Plan(broker, req.topics, by_id, readable)
        watched = plan.tps()

    # records sent with sendfile unless the broker must look at them: a consumer's records
    # are counted (records_in_batches) when record counts are exported
    regions = replica_id >= 0 or not broker.metrics.counting_records_out
    topics, total, any_error, any_region = _read_all(broker, plan, max_bytes, isolation,
                                                     by_id, replica_id, regions=regions)
    if total < min_bytes and max_wait_ms > 0 and not any_error and (
            watched or (incremental and session is not None and session.partitions)):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        tps = watched
        while total < min_bytes and not any_error:
            left = deadline - loop.time()
            if left <= 0 or broker.stopping:
                break
            if incremental:
                # parked on the session: a wake of any of its partitions marks it dirty and
                # completes the waiter (ReplicaManager.wake); then those are read, with
                # the ones already found not quiet (read with nothing to send yet: a high
                # watermark alone does not complete a fetch)
                assert session is not None
                carry, session.dirty = session.dirty, set()
                fut: asyncio.Future[None] = loop.create_future()
                session.waiter = fut
                try:
                    await asyncio.wait_for(fut, left)
                except TimeoutError:
                    pass
                finally:
                    if session.waiter is fut:
                        session.waiter = None
                woken, session.dirty = session.dirty, set()
                plan = _session_plan(broker, session, set(), replica_id, by_id, False,
                                     woken | carry)
            else:
                fut = broker.replicas.watch(tps)
                try:
                    await asyncio.wait_for(fut, left)
                except TimeoutError:
                    pass
                finally:
                    broker.replicas.unwatch(tps, fut)
            topics, total, any_error, any_region = _read_all(
                broker, plan, max_bytes, isolation, by_id, replica_id, first=False,
                regions=regions)
    if replica_id < 0:  # BytesOutPerSec and records out: consumers' reads, per topic
        count_records = broker.metrics.counting_records_out
        for (_, asked), (_, out) in zip(plan.entries, topics, strict=True):
            size = sum(fp.records_size for fp in out)
            if not size:
                continue
            name = next(tp.topic for tp, _, _ in asked if tp is not None)
            records = sum(records_in_batches(c) for fp in out for c in fp.records) \
                if count_records else 0  # three field reads per batch
            broker.metrics.fetched(name, size, records)
    if session is None:
        body = encode_fetch_body(ctx.api_version, 0, 0, 0, topics)
        body.regions = any_region
        return body
    # what this response tells the follower becomes the session's memory; an incremental
    # response carries only the partitions with something new
    kept: list[tuple[Any, list[FetchPartition]]] = []
    for name, parts in topics:
        news = []
        for fp in parts:
            cached = session.partitions.get((name, fp.index))
            if cached is None or cached.must_respond(
                    fp.error_code, fp.records_size, fp.high_watermark,
                    fp.last_stable_offset, fp.log_start_offset) or not incremental \
                    or fp.diverging_epoch is not None:
                news.append(fp)
        if news:
            kept.append((name, news))
    body = encode_fetch_body(ctx.api_version, 0, 0, session.id, kept)
    body.regions = any_region
    return body
