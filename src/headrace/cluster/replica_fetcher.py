"""Followers fetch from leaders (R-REP-3): Kafka's ``ReplicaFetcherThread``, on asyncio.

``ReplicaFetcherManager`` keeps, per source broker, ``num.replica.fetchers`` fetcher tasks
(a partition goes to fetcher ``hash(tp) % n`` of its leader). A fetcher owns one
connection to its leader and loops:

1. **Truncation** (KIP-101, KIP-279, KIP-320). A partition just added (a new leader or
   epoch) is fetched at once with its last fetched epoch, and the leader answers a
   diverging epoch instead of records if the follower's log went past where that epoch ends
   on the leader: the follower truncates to it and fetches again (Kafka 2.7+'s truncation
   on fetch, ``isTruncationOnFetchSupported``: no round trip before the first fetch after
   a leader change). Where that does not settle it (the follower's largest epoch at or
   below the leader's answer is an older one, or the leader answered out of range) the
   follower asks with one OffsetForLeaderEpoch request (API 23, with this broker as
   ``replica_id``): where does my latest epoch end on you? If the leader knows that epoch,
   the follower truncates to min(its answer, own log end offset); if it answers an older
   epoch, to min(its answer, the follower's own end offset for that epoch); if it knows
   nothing (UNDEFINED), to the follower's high watermark. Then it fetches. So a returning
   replica drops exactly its divergent suffix.
2. **Fetch** v12 with ``replica_id`` = this broker and ``current_leader_epoch``: the leader
   answers batches up to its log end offset and its high watermark. The batches are
   appended byte for byte (``PartitionLog.append_as_follower``: offsets and leader epochs
   kept, CRC checked), and the follower's high watermark becomes min(leader's, own log
   end offset).

Errors: NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH / UNKNOWN_TOPIC_OR_PARTITION pause the
partition until the cluster node hands it a new leader or epoch (the metadata cache will
show it); UNKNOWN_LEADER_EPOCH (the leader has not seen the new epoch yet) retries soon;
OFFSET_OUT_OF_RANGE below the leader's log start restarts the log there, otherwise
re-truncates. A failed connection is retried after ``replica.fetch.backoff.ms``, with one
log line per failure streak.

A round costs what changed, not the number of partitions fetched (a follower of 15,000
partitions would otherwise rebuild every partition's fetch position on every round, and
at 30,000 partitions that idle work kept each broker busy): the fetcher keeps each
partition's position (``_want``: log end offset, log start, leader epoch, last fetched
epoch) and recomputes only the ones marked ``_stale`` (added, appended to, truncated,
paused or unpaused), plus all of them every ``FULL_RECOMPUTE_S`` in case the log changed
under it (a local retention moving the log start); the incremental request names the
positions that differ from what the session holds (``_unsent``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.fetch_sessions import INITIAL_EPOCH, next_epoch
from headrace.cluster.client import BrokerConnection, BrokerConnectionError
from headrace.log.errors import LogError
from headrace.metadata.store import BrokerInfo
from headrace.protocol.records import InvalidRecordError
from headrace.protocol.replica_fetch import (
    FETCH_KEY,
    FETCH_VERSION,
    PartitionRequest,
    encode_fetch_request,
)
from headrace.replication.epochs import latest_epoch, truncation

if TYPE_CHECKING:
    from headrace.broker.replica_manager import Partition, ReplicaManager, TopicPartition
    from headrace.config import BrokerConfig
from headrace.security.listeners import InterBrokerClient

log = logging.getLogger("headrace.replication")

OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_VERSION = 23, 3
CONNECT_TIMEOUT_S = 5.0
UNKNOWN_EPOCH_RETRY_S = 0.1
PAUSE_S = 1.0
FULL_RECOMPUTE_S = 5.0


@dataclass(slots=True)
class FetchState:
    leader: int
    epoch: int
    truncated: bool = False
    paused_until: float = 0.0
    # truncation on fetch did not settle it: ask with OffsetForLeaderEpoch
    ask_epochs: bool = False


class ReplicaFetcherManager:
    def __init__(self, node_id: int, config: BrokerConfig, replicas: ReplicaManager,
                 broker_info: Callable[[int], BrokerInfo | None],
                 security: InterBrokerClient | None = None) -> None:
        self.node_id = node_id
        self.config = config
        self.replicas = replicas
        self.broker_info = broker_info
        self.security = security  # the inter-broker listener's TLS / SASL (issue 12)
        self.fetchers: dict[tuple[int, int], Fetcher] = {}
        self.assigned: dict[TopicPartition, tuple[int, int]] = {}
        self.num_fetchers = int(config["num.replica.fetchers"])

    def add(self, tp: TopicPartition, leader: int, epoch: int) -> None:
        """Fetch ``tp`` from ``leader`` at ``epoch`` (truncating first)."""
        key = (leader, hash(tp) % self.num_fetchers)
        old = self.assigned.get(tp)
        if old is not None and old != key:
            self.fetchers[old].remove(tp)
        fetcher = self.fetchers.get(key)
        if fetcher is None:
            fetcher = self.fetchers[key] = Fetcher(self, leader, key[1])
            fetcher.start()
        fetcher.add(tp, FetchState(leader, epoch))
        self.assigned[tp] = key

    def resize(self, num_fetchers: int) -> None:
        """``num.replica.fetchers`` changed (a dynamic broker config): every partition moves
        to the fetcher its new key names (truncating again, which is always safe), and
        fetchers left with no partition stop."""
        if num_fetchers == self.num_fetchers or num_fetchers < 1:
            return
        self.num_fetchers = num_fetchers
        for tp, key in list(self.assigned.items()):
            state = self.fetchers[key].partitions.get(tp)
            if state is not None:
                self.add(tp, state.leader, state.epoch)
        for key, f in list(self.fetchers.items()):
            if not f.partitions:
                f.stop()
                del self.fetchers[key]

    def remove(self, tp: TopicPartition) -> None:
        key = self.assigned.pop(tp, None)
        if key is not None:
            self.fetchers[key].remove(tp)

    def fetching(self, tp: TopicPartition) -> FetchState | None:
        key = self.assigned.get(tp)
        return None if key is None else self.fetchers[key].partitions.get(tp)

    def remove_all(self) -> None:
        for tp in list(self.assigned):
            self.remove(tp)

    def leader_moved(self, broker_id: int) -> None:
        """A broker's address may have changed (it re-registered): reconnect to it."""
        for (leader, _), f in self.fetchers.items():
            if leader == broker_id:
                f.reconnect()

    async def stop(self) -> None:
        fetchers = list(self.fetchers.values())
        self.fetchers.clear()
        self.assigned.clear()
        for f in fetchers:
            f.stop()
        tasks = [f.task for f in fetchers if f.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=2.0)
            for t in pending:
                t.cancel()


class Fetcher:
    def __init__(self, manager: ReplicaFetcherManager, leader: int, index: int) -> None:
        self.manager = manager
        self.leader = leader
        self.index = index
        self.partitions: dict[TopicPartition, FetchState] = {}
        self.task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._stopped = False
        self._conn: BrokerConnection | None = None
        self._failing = False
        # KIP-227: the session with the leader and what it holds (offset, log start, epoch)
        self._session_id = 0
        self._session_epoch = INITIAL_EPOCH
        self._sent: dict[TopicPartition, tuple[int, int, int, int]] = {}
        self._sent_state: dict[TopicPartition, FetchState] = {}  # whose position was sent
        # incremental rounds (see the module's docstring)
        self._want: dict[TopicPartition, tuple[int, int, int, int]] = {}
        self._stale: set[TopicPartition] = set()
        self._unsent: set[TopicPartition] = set()  # _want differs from _sent, maybe
        self._untruncated: set[TopicPartition] = set()
        self._paused: dict[TopicPartition, float] = {}
        self._last_full = 0.0
        cfg = manager.config
        self.wait_ms = int(cfg["replica.fetch.wait.max.ms"])
        self.min_bytes = int(cfg["replica.fetch.min.bytes"])
        self.max_bytes = int(cfg["replica.fetch.max.bytes"])
        self.response_max_bytes = int(cfg["replica.fetch.response.max.bytes"])
        self.backoff_s = int(cfg["replica.fetch.backoff.ms"]) / 1000
        self.request_timeout_s = max(int(cfg["request.timeout.ms"]) / 1000,
                                     self.wait_ms / 1000 + 5)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"replica-fetcher-{self.leader}-{self.index}")

    def stop(self) -> None:
        self._stopped = True
        self._changed.set()
        if self._conn is not None:
            self._conn.close()

    def reconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def add(self, tp: TopicPartition, state: FetchState) -> None:
        self.partitions[tp] = state
        self._paused.pop(tp, None)
        self._untruncated.add(tp)
        self._stale.add(tp)
        self._changed.set()

    def remove(self, tp: TopicPartition) -> None:
        self.partitions.pop(tp, None)
        self._paused.pop(tp, None)
        self._untruncated.discard(tp)
        self._stale.add(tp)  # its position goes: forgotten at the next round

    # ------------------------------------------------------------------ loop
    async def _run(self) -> None:
        while not self._stopped:
            self._unpause()
            if len(self._paused) >= len(self.partitions):  # nothing to fetch now
                if not self.partitions and self._conn is not None:
                    self._conn.close()
                    self._conn = None
                self._changed.clear()
                wait = self._next_unpause()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), wait)
                continue
            try:
                conn = await self._connection()
                await self._truncate(conn)
                if self._stopped:
                    return
                await self._fetch(conn)
                if self._failing:
                    self._failing = False
                    log.info("replica fetcher %d-%d: fetching from broker %d again",
                             self.leader, self.index, self.leader)
            except BrokerConnectionError as e:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                if not self._failing:
                    self._failing = True
                    log.warning("replica fetcher %d-%d: %s; retrying every %.1f s",
                                self.leader, self.index, e, self.backoff_s)
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self.backoff_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("replica fetcher %d-%d failed; retrying", self.leader, self.index)
                await asyncio.sleep(self.backoff_s)
        if self._conn is not None:
            self._conn.close()

    def _unpause(self) -> None:
        """Partitions whose pause is over are fetched again."""
        if not self._paused:
            return
        now = time.monotonic()
        for tp, until in list(self._paused.items()):
            if until <= now:
                del self._paused[tp]
                self._stale.add(tp)

    def _next_unpause(self) -> float | None:
        if not self._paused:
            return None
        return max(min(self._paused.values()) - time.monotonic(), 0.01)

    async def _connection(self) -> BrokerConnection:
        if self._conn is not None and self._conn.connected:
            return self._conn
        info = self.manager.broker_info(self.leader)
        if info is None:
            raise BrokerConnectionError(f"broker {self.leader} is not registered")
        # a response is at most what was asked for, plus one whole batch (KIP-74) and
        # the framing of the partitions: a claimed size past that is refused unread
        cfg = self.manager.config
        cap = (self.response_max_bytes + int(cfg["message.max.bytes"])
               + 64 * 1024 * (1 + len(self.partitions)))
        conn = BrokerConnection(info.host, info.port,
                                f"headrace-replica-fetcher-{self.manager.node_id}", cap,
                                self.manager.security)
        await conn.connect(CONNECT_TIMEOUT_S)
        self._conn = conn
        self.reset_session()  # a new connection (maybe a restarted leader): start over
        return conn

    def _partition(self, tp: TopicPartition, state: FetchState) -> Partition | None:
        """The hosted partition if ``state`` is still what this fetcher should fetch."""
        if self.partitions.get(tp) is not state:
            return None
        p = self.manager.replicas.get(tp)
        if p is None or p.leading or p.log.offline is not None:
            return None
        return p

    def _pause(self, tp: TopicPartition, state: FetchState, seconds: float) -> None:
        state.paused_until = time.monotonic() + seconds
        if self.partitions.get(tp) is state:
            self._paused[tp] = state.paused_until
            self._stale.add(tp)

    def _recompute(self, tp: TopicPartition) -> None:
        """``tp``'s fetch position now (or none: not fetched now)."""
        state = self.partitions.get(tp)
        p = None if (state is None or not state.truncated or tp in self._paused) \
            else self._partition(tp, state)
        if p is None:
            if self._want.pop(tp, None) is not None or tp in self._sent:
                self._unsent.add(tp)
            return
        plog = p.log
        v = (plog.log_end_offset, plog.log_start_offset, state.epoch,  # type: ignore[union-attr]
             latest_epoch(plog.leader_epochs))
        if self._want.get(tp) != v or self._sent_state.get(tp) is not state:
            self._want[tp] = v
            self._unsent.add(tp)

    # ------------------------------------------------------------------ truncation
    async def _truncate(self, conn: BrokerConnection) -> None:
        todo: dict[TopicPartition, tuple[FetchState, int]] = {}
        for tp in list(self._untruncated):
            state = self.partitions.get(tp)
            if state is None or state.truncated:
                self._untruncated.discard(tp)
                continue
            if tp in self._paused:
                continue
            if not state.ask_epochs:  # truncation on fetch: the fetch's diverging epoch
                state.truncated = True
                self._untruncated.discard(tp)
                self._stale.add(tp)
                continue
            p = self._partition(tp, state)
            if p is None:
                continue
            latest = p.log.latest_epoch()
            if latest is None:  # nothing with an epoch: nothing can diverge
                state.truncated = True
                continue
            todo[tp] = (state, latest)
        if not todo:
            return
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, (state, latest) in todo.items():
            topics.setdefault(tp.topic, []).append({
                "partition": tp.partition, "current_leader_epoch": state.epoch,
                "leader_epoch": latest})
        resp = await conn.request(OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_VERSION, {
            "replica_id": self.manager.node_id,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
        }, self.request_timeout_s)
        from headrace.broker.replica_manager import TopicPartition as TP

        for t in resp.topics:
            for r in t.partitions:
                tp = TP(str(t.topic), int(r.partition))
                entry = todo.get(tp)
                if entry is None:
                    continue
                state, latest = entry
                p = self._partition(tp, state)
                if p is None:
                    continue
                code = ErrorCode(r.error_code)
                if code != ErrorCode.none:
                    self._on_error(tp, state, code, "OffsetForLeaderEpoch")
                    continue
                state.truncated = self._truncate_one(p, latest, int(r.leader_epoch),
                                                     int(r.end_offset))
                state.ask_epochs = not state.truncated
                self._stale.add(tp)
                if state.truncated:
                    self._untruncated.discard(tp)

    def _truncate_one(self, p: Partition, latest: int, leader_epoch: int,
                      end_offset: int) -> bool:
        """Truncate as the leader's (epoch, end offset) for our ``latest`` epoch says
        (``replication.epochs.truncation``); True if that settles it, False if we must ask
        again about the older epoch we end with now."""
        plog = p.log
        leo = plog.log_end_offset
        t = truncation(plog.leader_epochs, leo, plog.high_watermark, leader_epoch, end_offset)
        if t.offset < leo:
            log.warning("truncating %s from %d to %d (our epoch %d: the leader's largest "
                        "epoch at or below it is %d, ending at %d)", p.tp, leo, t.offset,
                        latest, leader_epoch, end_offset)
        plog.truncate_to(t.offset)  # at the log end: drops an epoch we never wrote in
        if plog.high_watermark > plog.log_end_offset:
            plog.high_watermark = plog.log_end_offset
        return t.complete

    # ------------------------------------------------------------------ fetch
    async def _fetch(self, conn: BrokerConnection) -> None:
        """One Fetch in this fetcher's KIP-227 session with the leader: the first is full
        (epoch 0, all partitions; the answer names the session), the next ones name only
        partitions added or whose fetch position changed, plus the ones to forget, and
        get back only partitions with something new. A session the leader lost (or none
        granted) falls back to a full fetch."""
        now = time.monotonic()
        if now - self._last_full >= FULL_RECOMPUTE_S:
            self._last_full = now
            self._stale.update(self.partitions)
            self._stale.update(self._want)
        if self._stale:
            stale, self._stale = self._stale, set()
            for tp in stale:
                self._recompute(tp)
        want = self._want
        if not want:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), PAUSE_S)
            return
        full = self._session_id == 0
        forgotten: dict[str, list[int]] = {}
        if full:
            send = dict(want)
            epoch = INITIAL_EPOCH
        else:
            send = {}
            for tp in self._unsent:
                v = want.get(tp)
                if v is None:
                    if tp in self._sent:
                        forgotten.setdefault(tp.topic, []).append(tp.partition)
                elif self._sent.get(tp) != v or self._sent_state.get(tp) is not \
                        self.partitions[tp]:  # a new state (epoch) names it again
                    send[tp] = v
            epoch = self._session_epoch
        unsent, self._unsent = self._unsent, set()
        # whose position each partition of this request is: a partition removed and added
        # again while the request is out (a new leader epoch) must not take its answer
        sent_state = {tp: self.partitions[tp] for tp in send}
        try:
            resp = await self._request(conn, send, forgotten, epoch)
        except BaseException:
            self._unsent |= unsent  # not sent, or not known to be: named again
            raise
        from headrace.broker.replica_manager import TopicPartition as TP

        code = int(resp.error_code)
        if code:
            self._unsent |= unsent  # not taken: named again (a full fetch names all)
        if code in (ErrorCode.fetch_session_id_not_found,
                    ErrorCode.invalid_fetch_session_epoch):
            log.debug("replica fetcher %d-%d: session %d answered %s; starting a new one",
                      self.leader, self.index, self._session_id, ErrorCode(code).name)
            self.reset_session()
            return
        if code:
            self.reset_session()
            raise BrokerConnectionError(f"fetch answered {ErrorCode(code).name}")
        if full:
            self._session_id = int(resp.session_id)
            self._session_epoch = next_epoch(INITIAL_EPOCH)
            self._sent = send if self._session_id else {}
            self._sent_state = sent_state if self._session_id else {}
            if not self._session_id:  # no session: every round is a full one
                self._unsent.update(want)
        else:
            self._session_epoch = next_epoch(self._session_epoch)
            self._sent.update(send)
            self._sent_state.update(sent_state)
            for t, ps in forgotten.items():
                for i in ps:
                    self._sent.pop(TP(t, i), None)
                    self._sent_state.pop(TP(t, i), None)
        for t in resp.responses:
            for r in t.partitions:
                tp = TP(str(t.topic), int(r.partition_index))
                fetched = sent_state.get(tp) or self._sent_state.get(tp)
                if fetched is None:
                    continue
                state = fetched
                p = self._partition(tp, state)
                if p is None:
                    continue
                code = ErrorCode(r.error_code)
                diverging = r.diverging_epoch
                if code == ErrorCode.none and (diverging.epoch >= 0
                                               or diverging.end_offset >= 0):
                    # KIP-320: our log diverged from the leader's; truncate now (and ask
                    # with OffsetForLeaderEpoch if an older epoch must be checked too)
                    latest = p.log.latest_epoch()
                    state.truncated = self._truncate_one(
                        p, -1 if latest is None else latest, int(diverging.epoch),
                        int(diverging.end_offset))
                    state.ask_epochs = not state.truncated
                    if not state.truncated:
                        self._untruncated.add(tp)
                    self._stale.add(tp)
                    self._sent.pop(tp, None)  # the fetch position changed: name it again
                    self._unsent.add(tp)
                elif code == ErrorCode.none:
                    self._append(p, state, r)
                elif code == ErrorCode.offset_out_of_range:
                    self._out_of_range(p, state, int(r.log_start_offset))
                else:
                    self._on_error(tp, state, code, "Fetch")

    async def _request(self, conn: BrokerConnection,
                       send: dict[TopicPartition, tuple[int, int, int, int]],
                       forgotten: dict[str, list[int]], epoch: int) -> Any:
        topics: dict[str, list[PartitionRequest]] = {}
        max_bytes = self.max_bytes
        for tp, (offset, log_start, leader_epoch, last_epoch) in send.items():
            topics.setdefault(tp.topic, []).append(
                (tp.partition, leader_epoch, offset, last_epoch, log_start, max_bytes))
        # encoded by hand (protocol/replica_fetch.py): kio's generic writer was most of a
        # follower's CPU per round; its native reader is quick
        correlation_id = conn.next_correlation_id()
        frame = await conn.exchange(encode_fetch_request(
            correlation_id, conn.client_id, self.manager.node_id, self.wait_ms,
            self.min_bytes, self.response_max_bytes, self._session_id, epoch,
            list(topics.items()), list(forgotten.items())), self.request_timeout_s)
        return conn.read_response(FETCH_KEY, FETCH_VERSION, frame, correlation_id)

    def reset_session(self) -> None:
        """The next Fetch is a full one that asks for a new session."""
        self._session_id = 0
        self._session_epoch = INITIAL_EPOCH
        self._sent = {}
        self._sent_state = {}

    def _append(self, p: Partition, state: FetchState, r: Any) -> None:
        plog = p.log
        records = r.records
        if records:
            self._stale.add(p.tp)  # its log end offset moves
            try:
                plog.append_as_follower(records)
            except (InvalidRecordError, LogError, ValueError) as e:
                log.error("cannot append what broker %d sent for %s: %s", self.leader, p.tp, e)
                self._pause(p.tp, state, PAUSE_S)
                return
        hw = min(int(r.high_watermark), plog.log_end_offset)
        if hw > plog.high_watermark:
            plog.high_watermark = hw
        # the leader's log start (DeleteRecords, retention) moves the follower's too, as
        # Kafka's maybeIncrementLogStartOffset: so a follower that becomes leader does not
        # serve what the leader had deleted
        start = min(int(r.log_start_offset), plog.high_watermark)
        if start > plog.log_start_offset:
            self._stale.add(p.tp)
            try:
                plog.increment_log_start_offset(start)
            except LogError as e:
                log.warning("%s: cannot follow the leader's log start %d: %s", p.tp, start, e)

    def _out_of_range(self, p: Partition, state: FetchState, leader_start: int) -> None:
        plog = p.log
        self._stale.add(p.tp)
        if leader_start > plog.log_end_offset:
            log.warning("%s: the leader's log starts at %d, past ours (%d): starting over "
                        "there", p.tp, leader_start, plog.log_end_offset)
            plog.truncate_fully_and_start_at(leader_start)
            plog.high_watermark = leader_start
        else:
            state.truncated = False  # ahead of the leader: truncate by epoch again
            state.ask_epochs = True
            self._untruncated.add(p.tp)

    def _on_error(self, tp: TopicPartition, state: FetchState, code: ErrorCode,
                  what: str) -> None:
        if code == ErrorCode.unknown_leader_epoch:
            self._pause(tp, state, UNKNOWN_EPOCH_RETRY_S)
            return
        log.debug("%s of %s from broker %d answered %s; waiting for new leadership",
                  what, tp, self.leader, code.name)
        self._pause(tp, state, PAUSE_S)
