"""Share groups' start offsets for administrators (KIP-932): DescribeShareGroupOffsets
(90), AlterShareGroupOffsets (91) and DeleteShareGroupOffsets (92), served by the group's
coordinator through the share coordinator (``broker.share_persister``), as Kafka 4.2's
``GroupCoordinatorService`` does. Also DeleteGroups' part for share groups.

An empty group id is INVALID_GROUP_ID (Kafka's ``isGroupIdNotEmpty``).

- **Describe** (DESCRIBE on the group; DESCRIBE on each topic, else
  TOPIC_AUTHORIZATION_FAILED for its partitions): per partition the share-partition start
  offset and the leader epoch (ReadShareGroupStateSummary); a topic the broker does not know
  is UNKNOWN_TOPIC_OR_PARTITION, a partition never initialized for the group start offset
  -1. No topics (null) means every initialized share-partition of the group. Without a
  share coordinator (``broker.share_persister`` None) a group with initialized
  share-partitions to read is COORDINATOR_NOT_AVAILABLE. v1's lag is the
  high watermark minus the start offset minus the records acknowledged or archived past it
  (the high watermark asked of the partition's leader when it is another broker; -1 if it
  does not answer).
- **Alter** (READ on the group and the topics): the group must have no members
  (NON_EMPTY_GROUP); an unknown group is created empty, as Kafka does. Each partition's state
  is initialized anew at the given start offset (a new state epoch fences the old leaders'
  writes) and the group records it as initialized.
- **Delete** (DELETE on the group, READ on the topics, as Kafka's
  ``handleDeleteShareGroupOffsetsRequest``): the group must exist
  (GROUP_ID_NOT_FOUND) and have no members; the whole topics' share-partition state is
  deleted and the group forgets them.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.replica_manager import TopicPartition
from headrace.broker.security import DELETE, DESCRIBE, GROUP, READ, TOPIC
from headrace.broker.share_persister import InitializeEntry, StateKey
from headrace.share.group import ShareGroup

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def _group(broker: Broker, group_id: str) -> tuple[ErrorCode, ShareGroup | None]:
    err = broker.groups.check_coordinator(group_id)
    if err is not ErrorCode.none:
        return err, None
    g = broker.groups.coordinator.groups.get(group_id)
    if g is None or g.state_name == "Dead":
        return ErrorCode.group_id_not_found, None
    if not isinstance(g, ShareGroup):
        return ErrorCode.group_id_not_found, None
    return ErrorCode.none, g


def _lag(highs: dict[tuple[str, int], int], name: str, index: int, start: int,
         done: int) -> int:
    high = highs.get((name, index), -1)
    if start < 0 or high < 0:
        return -1
    return max(0, high - start - max(done, 0))


async def _high_watermarks(broker: Broker, tps: list[tuple[str, int]]
                           ) -> dict[tuple[str, int], int]:
    """The high watermark of each partition: this broker's own where it leads, else asked
    of the leader (ListOffsets v4, latest) over the inter-broker connection; a partition
    whose leader does not answer is left out (its lag -1)."""
    from headrace.broker.share_coordinator import CoordinatorPersister

    out: dict[tuple[str, int], int] = {}
    remote: dict[int, list[tuple[str, int]]] = {}
    for name, index in tps:
        partition = broker.replicas.get(TopicPartition(name, index))
        if partition is not None and partition.is_leader(broker.node_id):
            out[(name, index)] = partition.log.high_watermark
            continue
        meta = broker.metadata.topic(name)
        if meta is not None and 0 <= index < len(meta.partitions) \
                and meta.partitions[index].leader >= 0:
            remote.setdefault(meta.partitions[index].leader, []).append((name, index))
    persister = broker.share_persister
    if not isinstance(persister, CoordinatorPersister):
        return out
    for node, parts in remote.items():
        by_topic: dict[str, list[int]] = {}
        for name, index in parts:
            by_topic.setdefault(name, []).append(index)
        try:
            resp = await persister._remote(node, 2, 4, {
                "replica_id": -1, "isolation_level": 0, "topics": [
                    {"name": t, "partitions": [{"partition_index": i, "current_leader_epoch": -1,
                                                "timestamp": -1} for i in ps]}
                    for t, ps in by_topic.items()]})
        except Exception:  # the leader did not answer: those lags stay unknown
            continue
        for t in resp.topics:
            for rp in t.partitions:
                if rp.error_code == 0:
                    out[(str(t.name), int(rp.partition_index))] = int(rp.offset)
    return out


async def _describe_group(broker: Broker, ctx: RequestContext, g: Any) -> dict[str, Any]:
    group_id = str(g.group_id)
    if not group_id:  # Kafka: isGroupIdNotEmpty
        return {"group_id": group_id, "error_code": ErrorCode.invalid_group_id, "topics": []}
    if not broker.security.allowed(ctx, DESCRIBE, GROUP, group_id):
        return {"group_id": group_id, "error_code": ErrorCode.group_authorization_failed,
                "topics": []}
    err, group = _group(broker, group_id)
    if err is not ErrorCode.none or group is None:
        return {"group_id": group_id, "error_code": err, "topics": []}
    metadata = broker.metadata
    asked: list[tuple[str, list[int]]] = []
    if g.topics is None:
        for tid, held in sorted(group.initialized_partitions().items(), key=str):
            t = metadata.topic_by_id(tid)
            if t is not None:
                asked.append((t.name, sorted(held)))
    else:
        asked = [(str(t.topic_name), [int(p) for p in t.partitions]) for t in g.topics]
    allowed = broker.security.allowed_names(ctx, DESCRIBE, TOPIC, {n for n, _ in asked})
    keys = []
    for name, parts in asked:
        t = metadata.topic(name)
        if t is not None and name in allowed:
            keys += [StateKey(group_id, t.topic_id, p) for p in parts
                     if 0 <= p < len(t.partitions)]
    initialized = group.initialized_partitions()
    wanted = [k for k in keys if k.partition in initialized.get(k.topic_id, ())]
    persister = broker.share_persister
    if persister is None and wanted:  # no share coordinator to ask
        return {"group_id": group_id, "error_code": ErrorCode.coordinator_not_available,
                "topics": []}
    summaries = {} if persister is None or not wanted else \
        await persister.read_state_summary(wanted)
    highs = await _high_watermarks(broker, [
        (n, k.partition) for k in wanted
        if (n := getattr(metadata.topic_by_id(k.topic_id), "name", None)) is not None])
    topics = []
    for name, parts in asked:
        t = metadata.topic(name)
        out = []
        for p in parts:
            row: dict[str, Any] = {"partition_index": p, "start_offset": -1,
                                   "leader_epoch": -1, "lag": -1,
                                   "error_code": ErrorCode.none, "error_message": None}
            if name not in allowed:
                row["error_code"] = ErrorCode.topic_authorization_failed
            elif t is None or not 0 <= p < len(t.partitions):
                row["error_code"] = ErrorCode.unknown_topic_or_partition
            else:
                s = summaries.get(StateKey(group_id, t.topic_id, p))
                if s is not None and s.error is not ErrorCode.none:
                    row["error_code"] = s.error
                    row["error_message"] = s.error_message
                elif s is not None:
                    row.update(start_offset=s.start_offset, leader_epoch=s.leader_epoch,
                               lag=_lag(highs, name, p, s.start_offset,
                                        s.delivery_complete_count))
            out.append(row)
        topics.append({"topic_name": name, "topic_id": t.topic_id if t else None,
                       "partitions": out})
    return {"group_id": group_id, "error_code": ErrorCode.none, "topics": topics}


@handler(90, "DescribeShareGroupOffsets", 0, 1)
async def handle_describe_share_group_offsets(broker: Broker, ctx: RequestContext,
                                              req: Any) -> Any:
    return ctx.response({"throttle_time": 0, "groups": [
        await _describe_group(broker, ctx, g) for g in req.groups]})


def _alter_error(ctx: RequestContext, code: ErrorCode, message: str | None = None) -> Any:
    return ctx.response({"throttle_time": 0, "error_code": code, "error_message": message,
                         "responses": []})


@handler(91, "AlterShareGroupOffsets", 0, 0)
async def handle_alter_share_group_offsets(broker: Broker, ctx: RequestContext,
                                           req: Any) -> Any:
    group_id = str(req.group_id)
    if not group_id:  # Kafka: isGroupIdNotEmpty
        return _alter_error(ctx, ErrorCode.invalid_group_id)
    if not broker.security.allowed(ctx, READ, GROUP, group_id):
        return _alter_error(ctx, ErrorCode.group_authorization_failed)
    err = broker.groups.check_coordinator(group_id)
    if err is not ErrorCode.none:
        return _alter_error(ctx, err)
    coordinator = broker.groups.coordinator
    existing = coordinator.groups.get(group_id)
    if existing is not None and not isinstance(existing, ShareGroup) \
            and existing.state_name != "Dead":
        return _alter_error(ctx, ErrorCode.group_id_not_found,
                            f"Group {group_id} is not a share group.")
    if isinstance(existing, ShareGroup) and not existing.is_empty():
        return _alter_error(ctx, ErrorCode.non_empty_group,
                            "The group is not empty: stop its members first.")
    persister = broker.share_persister
    if persister is None:
        return _alter_error(ctx, ErrorCode.coordinator_not_available)
    group = existing if isinstance(existing, ShareGroup) and existing.state_name != "Dead" \
        else broker.groups.new_share_group(group_id)
    names = {str(t.topic_name) for t in req.topics}
    allowed = broker.security.allowed_names(ctx, READ, TOPIC, names)
    entries: list[InitializeEntry] = []
    results: dict[str, list[dict[str, Any]]] = {}
    ids: dict[str, uuid.UUID | None] = {}
    epoch = group.group_epoch + 1
    for t in req.topics:
        name = str(t.topic_name)
        meta = broker.metadata.topic(name)
        ids[name] = meta.topic_id if meta is not None else None
        for p in t.partitions:
            index = int(p.partition_index)
            code = ErrorCode.none
            if name not in allowed:
                code = ErrorCode.topic_authorization_failed
            elif meta is None or not 0 <= index < len(meta.partitions):
                code = ErrorCode.unknown_topic_or_partition
            elif int(p.start_offset) < 0:
                code = ErrorCode.invalid_request
            else:
                entries.append(InitializeEntry(StateKey(group_id, meta.topic_id, index),
                                               epoch, int(p.start_offset)))
            results.setdefault(name, []).append({"partition_index": index,
                                                 "error_code": code, "error_message": None})
    done = await persister.initialize_state(entries) if entries else None
    ok: dict[uuid.UUID, list[int]] = {}
    for e in entries:
        code = done.errors.get(e.key, ErrorCode.none) if done is not None else ErrorCode.none
        meta = broker.metadata.topic_by_id(e.key.topic_id)
        if meta is None:
            continue
        for row in results[meta.name]:
            if row["partition_index"] == e.key.partition:
                row["error_code"] = code
        if code is ErrorCode.none:
            ok.setdefault(e.key.topic_id, []).append(e.key.partition)
    if ok:
        if coordinator.groups.get(group_id) is not group:
            coordinator.add_share_group(group)
        topic_names = {tid: m.name for tid in ok
                       if (m := broker.metadata.topic_by_id(tid)) is not None}
        coordinator.queue_records(group_id, group.state_initialized(
            ok, broker.groups.now_ms(), topic_names))
        err = await broker.groups.flush_and_wait(group_id)
        if err is not ErrorCode.none:
            return _alter_error(ctx, err)
        for tid in ok:  # a leader caching the old state reads the new one
            for p in ok[tid]:
                broker.share_partitions.drop((group_id, tid, p))
    return ctx.response({"throttle_time": 0, "error_code": ErrorCode.none,
                         "error_message": None, "responses": [
        {"topic_name": name, "topic_id": ids.get(name), "partitions": rows}
        for name, rows in results.items()]})


@handler(92, "DeleteShareGroupOffsets", 0, 0)
async def handle_delete_share_group_offsets(broker: Broker, ctx: RequestContext,
                                            req: Any) -> Any:
    group_id = str(req.group_id)
    if not group_id:  # Kafka: isGroupIdNotEmpty
        return _alter_error(ctx, ErrorCode.invalid_group_id)
    if not broker.security.allowed(ctx, DELETE, GROUP, group_id):
        return _alter_error(ctx, ErrorCode.group_authorization_failed)
    err, group = _group(broker, group_id)
    if err is not ErrorCode.none or group is None:
        return _alter_error(ctx, err)
    if not group.is_empty():
        return _alter_error(ctx, ErrorCode.non_empty_group,
                            "The group is not empty: stop its members first.")
    persister = broker.share_persister
    if persister is None:
        return _alter_error(ctx, ErrorCode.coordinator_not_available)
    names = [str(t.topic_name) for t in req.topics]
    allowed = broker.security.allowed_names(ctx, READ, TOPIC, set(names))
    initialized = group.initialized_partitions()
    responses = []
    deleted: list[uuid.UUID] = []
    for name in names:
        meta = broker.metadata.topic(name)
        row: dict[str, Any] = {"topic_name": name, "topic_id": None,
                               "error_code": ErrorCode.none, "error_message": None}
        if name not in allowed:
            row["error_code"] = ErrorCode.topic_authorization_failed
        elif meta is None:
            row["error_code"] = ErrorCode.unknown_topic_or_partition
        else:
            row["topic_id"] = meta.topic_id
            keys = [StateKey(group_id, meta.topic_id, p)
                    for p in sorted(initialized.get(meta.topic_id, ()))]
            result = await persister.delete_state(keys) if keys else None
            codes = set(result.errors.values()) if result is not None else set()
            if codes:
                row["error_code"] = sorted(codes, key=int)[0]
            else:
                deleted.append(meta.topic_id)
                for k in keys:
                    broker.share_partitions.drop((group_id, k.topic_id, k.partition))
        responses.append(row)
    if deleted:
        broker.groups.coordinator.queue_records(group_id, group.state_deleted(deleted))
        err = await broker.groups.flush_and_wait(group_id)
        if err is not ErrorCode.none:
            return _alter_error(ctx, err)
    return ctx.response({"throttle_time": 0, "error_code": ErrorCode.none,
                         "error_message": None, "responses": responses})


async def delete_share_group_state(broker: Broker, group: ShareGroup) -> ErrorCode:
    """DeleteGroups of a share group: its share-partitions' state goes first (Kafka's
    ``deleteShareGroups``), then the share-partitions cached on this broker."""
    keys = [StateKey(group.group_id, t, p)
            for t, ps in (*group.initialized_partitions().items(),
                          *((t, e.partitions) for t, e in group.initializing.items()))
            for p in sorted(ps)]
    persister = broker.share_persister
    if keys and persister is not None:
        result = await persister.delete_state(keys)
        if result.errors:
            return sorted(set(result.errors.values()), key=int)[0]
    if broker.share_listener is not None:
        broker.share_listener.on_group_delete(group.group_id)
    return ErrorCode.none
