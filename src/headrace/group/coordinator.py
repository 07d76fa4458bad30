"""PURE: the group coordinator — every group this broker coordinates and their offsets.

``GroupCoordinator.groups: dict[str, Group]`` is the registry shared by both protocols:
classic groups (``ClassicGroup``, made here by JoinGroup, by an assign()-mode commit, or by
loading) and KIP-848 consumer groups (``ConsumerGroup``, put here by the
ConsumerGroupHeartbeat handler). Every object satisfies ``headrace.group.base.Group``.

Committed offsets are kept here, per group: ``offsets[group][(topic, partition)] ->
OffsetCommitValue``. They and the groups' state live in ``__consumer_offsets`` in Kafka's
own key/value schemas (``headrace.group.records``, R-GRP-6): ``load`` replays a partition's
records in offset order (a later record for a key wins; a null value is a tombstone) and
rebuilds offsets, classic groups (GroupMetadata) and KIP-848 consumer groups (the
ConsumerGroup* records: epochs, members, target and current assignments, R-GRP-7), whose
sessions restart at the load time. A group that has only offsets comes back as an empty
classic group. When both kinds were written for one group id, the later kind wins (an
empty group changing protocol writes tombstones for the other kind first, as Kafka does).

Effects, never I/O:

- a state change that Kafka persists queues records, taken by ``take_group_records()`` as
  ``(group_id, (key, value))``; the shell appends each group's records as one batch to the
  group's partition. Classic groups: a ``GroupMetadataKey`` record (after a completed
  rebalance, a leave that empties it, ...). Consumer groups: whatever
  ``ConsumerGroup.take_records()`` returns, collected after a heartbeat
  (``collect_consumer_group``, ``add_consumer_group``) and after every ``tick``; if an
  append fails the shell calls ``records_failed(group_id)`` so the group is rewritten whole
  next time;
- commits, OffsetDelete and DeleteGroups return an ``OffsetWrite``: the shell appends its
  records (acks=all) and only then calls ``apply(write)`` so memory never runs ahead of the
  log;
- parked JoinGroup/SyncGroup answers come out of ``take_completions()`` by ticket.

Tickets are unique per group only, so the coordinator hands out ``(group_id, ticket)``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from headrace.group.base import Group
from headrace.group.classic import (
    ClassicGroup,
    Completion,
    GroupState,
    GroupTimeouts,
    JoinRequest,
    JoinResult,
    Member,
    Parked,
    SyncResult,
)
from headrace.group.consumer_group import ConsumerGroup, ConsumerGroupSnapshot
from headrace.group.records import (
    ConsumerGroupMetadataKey,
    GroupMetadataKey,
    GroupMetadataValue,
    GroupRecordError,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from headrace.share import group as share_records
from headrace.share.group import ShareGroup, ShareGroupSnapshot

TopicPartitionKey = tuple[str, int]
KeyValue = tuple[bytes, bytes | None]
OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes


@dataclass(frozen=True, slots=True)
class CommitEntry:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None


@dataclass(frozen=True, slots=True)
class OffsetWrite:
    """Records to append for ``group_id``, then what ``apply`` changes in memory. A
    transactional commit (TxnOffsetCommit) names its producer: its records are appended as
    a transactional batch of that producer, and its offsets stay pending until the
    transaction's marker reaches the partition (``complete_txn``)."""

    group_id: str
    records: tuple[KeyValue, ...]
    commits: tuple[tuple[TopicPartitionKey, OffsetCommitValue], ...] = ()
    deletions: tuple[TopicPartitionKey, ...] = ()
    delete_group: bool = False
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class TxnMarkerEvent:
    """A transaction marker in a ``__consumer_offsets`` partition (``load``)."""

    producer_id: int
    commit: bool


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    error: ErrorCode = ErrorCode.none


NO_OFFSET = FetchedOffset(-1, -1, "")
# require_stable and a pending transactional offset: no offset, UNSTABLE_OFFSET_COMMIT
UNSTABLE = FetchedOffset(-1, -1, "", ErrorCode.unstable_offset_commit)


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str
    group_type: str


@dataclass
class GroupCoordinator:
    timeouts: GroupTimeouts = field(default_factory=GroupTimeouts)
    member_id_factory: Callable[[str], str] | None = None
    # makes an empty KIP-848 group with the broker's group.consumer.* configs (loading)
    consumer_group_factory: Callable[[str], ConsumerGroup] = ConsumerGroup
    # makes an empty share group with the broker's group.share.* configs (KIP-932)
    share_group_factory: Callable[[str], ShareGroup] = ShareGroup
    groups: dict[str, Group] = field(default_factory=dict)
    offsets: dict[str, dict[TopicPartitionKey, OffsetCommitValue]] = field(default_factory=dict)
    _group_records: list[tuple[str, KeyValue]] = field(default_factory=list)
    _completions: list[tuple[str, Completion]] = field(default_factory=list)
    corrupt_records: int = 0
    # transactional offsets not yet committed: producer id -> group -> partition -> value
    pending_txn: dict[int, dict[str, dict[TopicPartitionKey, OffsetCommitValue]]] = field(
        default_factory=dict)

    # ------------------------------------------------------------------ loading
    def load(self, records: Iterable[tuple[bytes | None, bytes | None]
                                     | tuple[bytes | None, bytes | None, int]
                                     | TxnMarkerEvent], now_ms: int) -> None:
        """Replay one ``__consumer_offsets`` partition's (key, value) records in order; a
        record of a transactional batch comes with its producer id, and its transaction's
        marker as a ``TxnMarkerEvent``."""
        metadata: dict[str, GroupMetadataValue | None] = {}
        snapshots: dict[str, ConsumerGroupSnapshot] = {}
        deleted: set[str] = set()  # consumer groups whose epoch record was tombstoned
        shares: dict[str, ShareGroupSnapshot] = {}
        shares_deleted: set[str] = set()
        for item in records:
            if isinstance(item, TxnMarkerEvent):
                self.complete_txn(item.producer_id, item.commit)
                continue
            raw_key, raw_value = item[0], item[1]
            if raw_key is None:
                continue
            if len(item) == 3:  # transactional: an offset commit pending its marker
                try:
                    tkey = decode_key(raw_key)
                    tvalue = decode_value(tkey, raw_value) if tkey is not None else None
                except GroupRecordError:
                    self.corrupt_records += 1
                    continue
                if isinstance(tkey, OffsetCommitKey) and isinstance(tvalue, OffsetCommitValue):
                    pid = item[2]
                    self.pending_txn.setdefault(pid, {}).setdefault(tkey.group, {})[
                        (tkey.topic, tkey.partition)] = tvalue
                continue
            if len(raw_key) >= 2 and raw_key[0] == 0 and 10 <= raw_key[1] <= 15:
                # a share group's record (KIP-932, types 10-15)
                try:
                    skey = share_records.decode_key(raw_key)
                    if skey is None:
                        continue
                    svalue = share_records.decode_value(skey, raw_value)
                except share_records.ShareGroupRecordError:
                    self.corrupt_records += 1
                    continue
                if isinstance(skey, share_records.ShareGroupMetadataKey) and svalue is None:
                    shares.pop(skey.group, None)
                    shares_deleted.add(skey.group)
                    continue
                shares.setdefault(skey.group, ShareGroupSnapshot()).replay(skey, svalue)
                shares_deleted.discard(skey.group)
                continue
            try:
                key = decode_key(raw_key)
                if key is None:
                    continue
                value = decode_value(key, raw_value)
            except GroupRecordError:
                self.corrupt_records += 1
                continue
            if isinstance(key, OffsetCommitKey):
                tp = (key.topic, key.partition)
                if isinstance(value, OffsetCommitValue):
                    self.offsets.setdefault(key.group, {})[tp] = value
                else:
                    group_offsets = self.offsets.get(key.group)
                    if group_offsets is not None:
                        group_offsets.pop(tp, None)
                        if not group_offsets:
                            del self.offsets[key.group]
            elif isinstance(key, GroupMetadataKey):
                if isinstance(value, GroupMetadataValue):
                    metadata[key.group] = value
                    snapshots.pop(key.group, None)  # a classic group replaced it
                else:
                    metadata[key.group] = None
            elif isinstance(key, ConsumerGroupMetadataKey) and value is None:
                snapshots.pop(key.group, None)
                deleted.add(key.group)
            else:
                if value is not None and metadata.get(key.group) is not None:
                    metadata[key.group] = None  # a consumer group replaced the classic one
                assert not isinstance(value, (OffsetCommitValue, GroupMetadataValue))
                snapshots.setdefault(key.group, ConsumerGroupSnapshot()).replay(key, value)
                deleted.discard(key.group)
        for group_id, gm in metadata.items():
            if gm is None:
                if isinstance(self.groups.get(group_id), ClassicGroup):
                    del self.groups[group_id]
                continue
            self.groups[group_id] = self._group_from_metadata(group_id, gm, now_ms)
        for group_id in deleted:
            if isinstance(self.groups.get(group_id), ConsumerGroup):
                del self.groups[group_id]
        for group_id, snapshot in snapshots.items():
            if snapshot.is_empty():
                continue
            cg = self.consumer_group_factory(group_id)
            cg.restore(snapshot, now_ms)
            self.groups[group_id] = cg
        for group_id in shares_deleted:
            if isinstance(self.groups.get(group_id), ShareGroup):
                del self.groups[group_id]
        for group_id, share_snapshot in shares.items():
            if share_snapshot.is_empty():
                continue
            sg = self.share_group_factory(group_id)
            sg.restore(share_snapshot, now_ms)
            self.groups[group_id] = sg
        for group_id in self.offsets:
            if group_id not in self.groups:
                self.groups[group_id] = self._new_classic(group_id)

    def _new_classic(self, group_id: str) -> ClassicGroup:
        if self.member_id_factory is not None:
            return ClassicGroup(group_id, self.timeouts, self.member_id_factory)
        return ClassicGroup(group_id, self.timeouts)

    def _group_from_metadata(
        self, group_id: str, gm: GroupMetadataValue, now_ms: int
    ) -> ClassicGroup:
        g = self._new_classic(group_id)
        g.generation = gm.generation
        g.protocol_type_ = gm.protocol_type or None
        g.protocol_name = gm.protocol
        g.leader = gm.leader
        g.state_timestamp_ms = gm.current_state_timestamp
        for m in gm.members:
            protocols = ((gm.protocol, m.subscription),) if gm.protocol else ()
            g.members[m.member_id] = Member(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.session_timeout, m.rebalance_timeout, gm.protocol_type, protocols,
                now_ms + m.session_timeout, m.assignment,
            )
            if m.group_instance_id is not None:
                g.static_members[m.group_instance_id] = m.member_id
        g.state = GroupState.STABLE if g.members else GroupState.EMPTY
        if g.leader not in g.members:
            g.leader = next(iter(g.members), None)
        return g

    @staticmethod
    def group_metadata_value(g: ClassicGroup, now_ms: int) -> GroupMetadataValue:
        return GroupMetadataValue(
            protocol_type=g.protocol_type,
            generation=g.generation,
            protocol=g.protocol_name,
            leader=g.leader if g.members else None,
            current_state_timestamp=g.state_timestamp_ms if g.state_timestamp_ms >= 0
            else now_ms,
            members=tuple(
                MemberMetadata(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                               m.rebalance_timeout_ms, m.session_timeout_ms,
                               m.metadata(g.protocol_name), m.assignment)
                for m in g.members.values()
            ),
        )

    # ------------------------------------------------------------------ effects
    def take_completions(self) -> list[tuple[str, Completion]]:
        out, self._completions = self._completions, []
        return out

    def take_group_records(self) -> list[tuple[str, KeyValue]]:
        out, self._group_records = self._group_records, []
        return out

    def _collect(self, g: ClassicGroup, now_ms: int) -> None:
        for c in g.take_completions():
            self._completions.append((g.group_id, c))
        if g.metadata_dirty:
            g.metadata_dirty = False
            if g.state is not GroupState.DEAD:
                self._group_records.append((g.group_id, (
                    encode_key(GroupMetadataKey(g.group_id)),
                    encode_value(self.group_metadata_value(g, now_ms)),
                )))

    def tick(self, now_ms: int) -> bool:
        changed = False
        for group in list(self.groups.values()):
            if isinstance(group, ShareGroup):
                result = group.tick(now_ms)
                changed = changed or bool(result.expired)
                self.queue_records(group.group_id, result.records)
                continue
            if group.tick(now_ms):
                changed = True
            if isinstance(group, ClassicGroup):
                self._collect(group, now_ms)
            elif isinstance(group, ConsumerGroup):
                self.collect_consumer_group(group)
        return changed

    # ------------------------------------------------------------------ consumer groups
    def collect_consumer_group(self, group: ConsumerGroup) -> None:
        """Queue the records of what changed in ``group`` (after a heartbeat)."""
        for kv in group.take_records():
            self._group_records.append((group.group_id, kv))

    def add_consumer_group(self, group: ConsumerGroup) -> None:
        """Register a group just created by a successful join and queue its records; an
        empty classic group it replaces gets a GroupMetadata tombstone first (Kafka's
        ``maybeDeleteEmptyClassicGroup``); its committed offsets stay."""
        if isinstance(self.groups.get(group.group_id), ClassicGroup):
            self._group_records.append(
                (group.group_id, (encode_key(GroupMetadataKey(group.group_id)), None)))
        self.groups[group.group_id] = group
        self.collect_consumer_group(group)

    def add_share_group(self, group: ShareGroup) -> None:
        """Register a share group just made by a join; an empty group of another type
        under its id goes, its records tombstoned first (its committed offsets stay)."""
        old = self.groups.get(group.group_id)
        if isinstance(old, ClassicGroup):
            self._group_records.append(
                (group.group_id, (encode_key(GroupMetadataKey(group.group_id)), None)))
        elif isinstance(old, ConsumerGroup):
            self.queue_records(group.group_id, old.tombstone_records())
        self.groups[group.group_id] = group

    def queue_records(self, group_id: str, records: Iterable[KeyValue]) -> None:
        """Queue records a share group returned (heartbeat, initialization, tick)."""
        for kv in records:
            self._group_records.append((group_id, kv))

    def records_failed(self, group_id: str) -> None:
        """Appending ``group_id``'s queued records failed: a consumer group rewrites its
        whole state with its next records (a classic group's next metadata record is
        complete anyway)."""
        g = self.groups.get(group_id)
        if isinstance(g, (ConsumerGroup, ShareGroup)):
            g.forget_written()

    # ------------------------------------------------------------------ classic protocol
    def _classic(self, group_id: str) -> ClassicGroup | None:
        g = self.groups.get(group_id)
        return g if isinstance(g, ClassicGroup) else None

    def join_group(self, group_id: str, req: JoinRequest, now_ms: int) -> JoinResult | Parked:
        if not group_id:
            return JoinResult(0, ErrorCode.invalid_group_id, req.member_id)
        if not (self.timeouts.min_session_timeout_ms <= req.session_timeout_ms
                <= self.timeouts.max_session_timeout_ms):
            return JoinResult(0, ErrorCode.invalid_session_timeout, req.member_id)
        existing = self.groups.get(group_id)
        if existing is not None and not isinstance(existing, ClassicGroup):
            if isinstance(existing, ShareGroup):
                # Kafka's classicGroupJoin: a share group of this id answers
                # INCONSISTENT_GROUP_PROTOCOL with the unknown (empty) member id
                return JoinResult(0, ErrorCode.inconsistent_group_protocol, "")
            if not existing.is_empty():
                return JoinResult(0, ErrorCode.inconsistent_group_protocol, req.member_id)
            # an empty KIP-848 group turns classic, as Kafka converts it: tombstones first
            if isinstance(existing, ConsumerGroup):
                for kv in existing.tombstone_records():
                    self._group_records.append((group_id, kv))
            existing = None
        if existing is None:
            if req.member_id:
                return JoinResult(0, ErrorCode.unknown_member_id, req.member_id)
            existing = self._new_classic(group_id)
            self.groups[group_id] = existing
        result = existing.join(req, now_ms)
        self._collect(existing, now_ms)
        return result

    def sync_group(
        self, group_id: str, member_id: str, generation: int, group_instance_id: str | None,
        protocol_type: str | None, protocol_name: str | None, assignments: dict[str, bytes],
        now_ms: int,
    ) -> SyncResult | Parked:
        if not group_id:
            return SyncResult(0, ErrorCode.invalid_group_id)
        g = self._classic(group_id)
        if g is None:
            return SyncResult(0, ErrorCode.unknown_member_id)
        result = g.sync(member_id, generation, group_instance_id, protocol_type, protocol_name,
                        assignments, now_ms)
        self._collect(g, now_ms)
        return result

    def heartbeat(
        self, group_id: str, member_id: str, generation: int, group_instance_id: str | None,
        now_ms: int,
    ) -> ErrorCode:
        if not group_id:
            return ErrorCode.invalid_group_id
        g = self._classic(group_id)
        if g is None:
            return ErrorCode.unknown_member_id
        err = g.heartbeat(member_id, generation, group_instance_id, now_ms)
        self._collect(g, now_ms)
        return err

    def leave_group(
        self, group_id: str, members: list[tuple[str, str | None]], now_ms: int
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """(top-level error, one error per member)."""
        if not group_id:
            return ErrorCode.invalid_group_id, [ErrorCode.invalid_group_id for _ in members]
        g = self._classic(group_id)
        if g is None:
            return ErrorCode.none, [ErrorCode.unknown_member_id for _ in members]
        if g.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available, []
        errors = [g.leave(member_id, instance, now_ms) for member_id, instance in members]
        self._collect(g, now_ms)
        return ErrorCode.none, errors

    # ------------------------------------------------------------------ offsets
    def validate_commit(
        self, group_id: str, member_id: str, generation_or_epoch: int,
        group_instance_id: str | None, now_ms: int, api_version: int = 9,
    ) -> ErrorCode:
        """Kafka's group-level checks of an OffsetCommit; an assign()-mode commit
        (generation -1) to an unknown group makes an Empty classic group (R-GRP-7)."""
        g = self.groups.get(group_id)
        if g is None:
            if generation_or_epoch >= 0:
                return (ErrorCode.group_id_not_found if api_version >= 9
                        else ErrorCode.illegal_generation)
            g = self._new_classic(group_id)
            self.groups[group_id] = g
        if (isinstance(g, ConsumerGroup) and api_version < 9 and generation_or_epoch >= 0
                and member_id in g.members):
            # Kafka's ConsumerGroup.validateOffsetCommit: a KIP-848 member commits with v9+
            # (STALE_MEMBER_EPOCH came with v9; an older client would not know it)
            return ErrorCode.unsupported_version
        err = g.validate_offset_commit(member_id, generation_or_epoch, group_instance_id,
                                       now_ms)
        if isinstance(g, ClassicGroup):
            self._collect(g, now_ms)
        return err

    def commit_write(
        self, group_id: str, entries: list[CommitEntry], now_ms: int
    ) -> tuple[OffsetWrite, list[ErrorCode]]:
        """The records of an accepted commit, and each entry's error (metadata too large)."""
        records: list[KeyValue] = []
        commits: list[tuple[TopicPartitionKey, OffsetCommitValue]] = []
        errors: list[ErrorCode] = []
        for e in entries:
            metadata = e.metadata or ""
            if len(metadata.encode("utf-8")) > OFFSET_METADATA_MAX_BYTES:
                errors.append(ErrorCode.offset_metadata_too_large)
                continue
            value = OffsetCommitValue(e.offset, e.leader_epoch, metadata, now_ms)
            records.append((encode_key(OffsetCommitKey(group_id, e.topic, e.partition)),
                            encode_value(value)))
            commits.append(((e.topic, e.partition), value))
            errors.append(ErrorCode.none)
        return OffsetWrite(group_id, tuple(records), tuple(commits)), errors

    def complete_txn(self, producer_id: int, commit: bool) -> list[str]:
        """A transaction marker for ``producer_id`` reached this partition: its pending
        offsets become the committed ones (COMMIT) or are dropped (ABORT). The groups it
        touched."""
        pending = self.pending_txn.pop(producer_id, {})
        if commit:
            for group_id, offsets in pending.items():
                self.offsets.setdefault(group_id, {}).update(offsets)
                if group_id not in self.groups:
                    self.groups[group_id] = self._new_classic(group_id)
        return sorted(pending)

    def forget_partition_txns(self, groups: set[str]) -> None:
        """Pending transactional offsets of unloaded groups."""
        for pid in list(self.pending_txn):
            byg = self.pending_txn[pid]
            for g in groups:
                byg.pop(g, None)
            if not byg:
                del self.pending_txn[pid]

    def apply(self, write: OffsetWrite) -> None:
        """The write's records are in the log: make memory match."""
        if write.producer_id >= 0:  # transactional: pending until the marker
            pending = self.pending_txn.setdefault(write.producer_id, {}).setdefault(
                write.group_id, {})
            for tp, value in write.commits:
                pending[tp] = value
            return
        group_offsets = self.offsets.setdefault(write.group_id, {})
        for tp, value in write.commits:
            group_offsets[tp] = value
        for tp in write.deletions:
            group_offsets.pop(tp, None)
        if not group_offsets or write.delete_group:
            self.offsets.pop(write.group_id, None)
        if write.delete_group:
            g = self.groups.get(write.group_id)
            if isinstance(g, ConsumerGroup) and not g.is_empty():
                # a member joined while the tombstones were written: keep the group and
                # write it again whole after them
                g.forget_written()
                self.collect_consumer_group(g)
                return
            self.groups.pop(write.group_id, None)
            if isinstance(g, ClassicGroup) and g.state is not GroupState.DEAD:
                g.mark_dead(0)
                self._collect(g, 0)
            elif isinstance(g, ConsumerGroup) and g.state_name != "Dead":
                g.mark_dead()

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartitionKey] | None,
        require_stable: bool = False,
    ) -> dict[TopicPartitionKey, FetchedOffset]:
        """Committed offsets of ``partitions`` (None: every committed partition). With
        ``require_stable`` (KIP-447) a partition with a pending transactional offset of the
        group is UNSTABLE (Kafka's ``OffsetMetadataManager.fetchOffsets`` /
        ``fetchAllOffsets``: a pending-only partition is not listed among "all")."""
        committed = self.offsets.get(group_id, {})
        if partitions is None:
            partitions = sorted(committed)
        pending = self.pending_txn_partitions(group_id) if require_stable else set()
        out: dict[TopicPartitionKey, FetchedOffset] = {}
        for tp in partitions:
            v = committed.get(tp)
            if tp in pending:
                out[tp] = UNSTABLE
            else:
                out[tp] = NO_OFFSET if v is None else FetchedOffset(v.offset, v.leader_epoch,
                                                                    v.metadata)
        return out

    def pending_txn_partitions(self, group_id: str) -> set[TopicPartitionKey]:
        """The partitions with a transactional offset of ``group_id`` not yet committed or
        aborted (TxnOffsetCommit written, its transaction's marker not yet here)."""
        out: set[TopicPartitionKey] = set()
        for by_group in self.pending_txn.values():
            out.update(by_group.get(group_id, ()))
        return out

    def delete_offsets(
        self, group_id: str, partitions: list[TopicPartitionKey]
    ) -> tuple[ErrorCode, list[ErrorCode], OffsetWrite | None]:
        """OffsetDelete: (group error, per-partition errors, write)."""
        g = self.groups.get(group_id)
        if g is None or g.state_name == "Dead" or isinstance(g, ShareGroup):
            # a share group: Kafka's ShareGroup.validateOffsetDelete (not a consumer group)
            return ErrorCode.group_id_not_found, [], None
        subscribed: set[str] = set()
        if not g.is_empty():
            if isinstance(g, ClassicGroup):
                if g.protocol_type != "consumer":
                    return ErrorCode.non_empty_group, [], None
                for m in g.members.values():
                    subscribed |= subscribed_topics(m.metadata(g.protocol_name))
            else:
                subscribed = set(getattr(g, "subscribed_topic_names", lambda: set())())
        errors: list[ErrorCode] = []
        records: list[KeyValue] = []
        deletions: list[TopicPartitionKey] = []
        committed = self.offsets.get(group_id, {})
        for topic, partition in partitions:
            if topic in subscribed:
                errors.append(ErrorCode.group_subscribed_to_topic)
                continue
            errors.append(ErrorCode.none)
            if (topic, partition) in committed:
                records.append((encode_key(OffsetCommitKey(group_id, topic, partition)), None))
                deletions.append((topic, partition))
        return ErrorCode.none, errors, OffsetWrite(group_id, tuple(records),
                                                   deletions=tuple(deletions))

    def delete_group(self, group_id: str) -> tuple[ErrorCode, OffsetWrite | None]:
        """DeleteGroups for one group: tombstones for its offsets and metadata (a
        consumer group's: every ConsumerGroup* record)."""
        g = self.groups.get(group_id)
        if g is None or g.state_name == "Dead":
            return ErrorCode.group_id_not_found, None
        if not g.is_empty():
            return ErrorCode.non_empty_group, None
        records: list[KeyValue] = [
            (encode_key(OffsetCommitKey(group_id, t, p)), None)
            for t, p in sorted(self.offsets.get(group_id, {}))
        ]
        if isinstance(g, (ConsumerGroup, ShareGroup)):
            records += g.tombstone_records()
        else:
            records.append((encode_key(GroupMetadataKey(group_id)), None))
        return ErrorCode.none, OffsetWrite(group_id, tuple(records), delete_group=True)

    # ------------------------------------------------------------------ admin
    def list_groups(
        self, states: set[str] | None = None, types: set[str] | None = None
    ) -> list[GroupListing]:
        out = []
        for gid, g in sorted(self.groups.items()):
            if g.state_name == "Dead":
                continue
            if states and g.state_name.lower() not in {s.lower() for s in states}:
                continue
            if types and g.group_type.lower() not in {t.lower() for t in types}:
                continue
            out.append(GroupListing(gid, g.protocol_type, g.state_name, g.group_type))
        return out


def subscribed_topics(subscription: bytes) -> set[str]:
    """Topic names of a ConsumerProtocolSubscription (int16 version, then an int32 count
    of int16-length strings); an unreadable one yields no topics."""
    topics: set[str] = set()
    try:
        (count,) = struct.unpack_from(">i", subscription, 2)
        pos = 6
        for _ in range(max(count, 0)):
            (n,) = struct.unpack_from(">h", subscription, pos)
            pos += 2
            topics.add(subscription[pos:pos + n].decode("utf-8"))
            pos += n
    except (struct.error, UnicodeDecodeError):
        return set()
    return topics
