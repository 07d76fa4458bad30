"""OffsetCommit (8) v2-9: committed offsets into ``__consumer_offsets`` (R-GRP-6/7).

The group decides whether the committer may commit (``Group.validate_offset_commit``: stale
generation → ILLEGAL_GENERATION, unknown member, fenced static member, rebalance in progress;
generation -1 from an assign()-mode consumer on an empty or unknown group is accepted).
Accepted offsets are appended in Kafka's key/value schemas with acks=all and become visible
to OffsetFetch only after that. Metadata is round-tripped (at most 4096 bytes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import GROUP, READ, TOPIC
from headrace.group.coordinator import CommitEntry
from headrace.protocol.codec import encode_offset_commit_body

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def commit_entries(broker: Broker, topics: Any, err: ErrorCode,
                   errors: dict[tuple[str, int], ErrorCode],
                   readable: set[str] | None = None) -> list[CommitEntry]:
    """The partitions of an OffsetCommit or TxnOffsetCommit request to write; the others
    get TOPIC_AUTHORIZATION_FAILED (a topic not in ``readable``, when given), ``err``
    (the group's refusal) or UNKNOWN_TOPIC_OR_PARTITION in ``errors``."""
    entries: list[CommitEntry] = []
    for t in topics:
        topic = broker.metadata.topic(str(t.name))
        for p in t.partitions:
            key = (str(t.name), int(p.partition_index))
            if readable is not None and key[0] not in readable:
                errors[key] = ErrorCode.topic_authorization_failed
            elif err is not ErrorCode.none:
                errors[key] = err
            elif topic is None or not 0 <= key[1] < len(topic.partitions):
                errors[key] = ErrorCode.unknown_topic_or_partition
            else:
                entries.append(CommitEntry(key[0], key[1], int(p.committed_offset),
                                           int(getattr(p, "committed_leader_epoch", -1)),
                                           p.committed_metadata))
    return entries


@handler(8, "OffsetCommit", 2, 9)
async def handle_offset_commit(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    group_id = str(req.group_id)
    generation = int(req.generation_id_or_member_epoch)
    groups = broker.groups
    errors: dict[tuple[str, int], ErrorCode] = {}
    # Kafka: READ on the group (else every partition GROUP_AUTHORIZATION_FAILED), then
    # READ on each topic (TOPIC_AUTHORIZATION_FAILED)
    readable: set[str] | None = broker.security.allowed_names(
        ctx, READ, TOPIC, (str(t.name) for t in req.topics))
    if not broker.security.allowed(ctx, READ, GROUP, group_id):
        err, readable = ErrorCode.group_authorization_failed, None
    else:
        err = groups.check_coordinator(group_id)
    if err is ErrorCode.none:
        err = groups.coordinator.validate_commit(
            group_id, str(req.member_id), generation, getattr(req, "group_instance_id", None),
            groups.now_ms(), ctx.api_version,
        )
        groups.flush()
    entries = commit_entries(broker, req.topics, err, errors, readable)
    if entries:
        write, entry_errors = groups.coordinator.commit_write(group_id, entries,
                                                              groups.now_ms())
        write_err = await groups.write(write) if write.records else ErrorCode.none
        if write_err in (ErrorCode.not_enough_replicas, ErrorCode.not_leader_or_follower):
            write_err = ErrorCode.coordinator_not_available
        for e, code in zip(entries, entry_errors, strict=True):
            errors[(e.topic, e.partition)] = code if code is not ErrorCode.none else write_err
    # encoded by hand: this is every commit's hot path
    return encode_offset_commit_body(ctx.api_version, [
        (str(t.name), [(int(p.partition_index),
                        int(errors[(str(t.name), int(p.partition_index))]))
                       for p in t.partitions])
        for t in req.topics])
