"""TxnOffsetCommit (28) v0-4: offsets committed as part of a transaction (issue 10;
``send_offsets_to_transaction``).

The group's coordinator checks the group as OffsetCommit does when the request names a
generation (v3+: KIP-447 fencing by generation, member and instance id), then appends
the offsets as a transactional batch of the producer to the group's
``__consumer_offsets`` partition (acks=all). They stay pending, invisible to OffsetFetch,
until the transaction's marker reaches that partition: COMMIT makes them the group's
offsets, ABORT drops them. A fenced producer epoch is INVALID_PRODUCER_EPOCH at every
version, as Kafka passes on the log's error (its clients and librdkafka take it as fatal;
librdkafka would take PRODUCER_FENCED as abortable). v0-v1 hear COORDINATOR_NOT_AVAILABLE
for COORDINATOR_LOAD_IN_PROGRESS, which clients before Kafka 2.0 crash on (KAFKA-7296,
Kafka's ``handleTxnOffsetCommitRequest``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.offset_commit import commit_entries
from headrace.broker.security import GROUP, READ, TOPIC, TRANSACTIONAL_ID, WRITE
from headrace.group.coordinator import OffsetWrite

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(28, "TxnOffsetCommit", 0, 4)
async def handle_txn_offset_commit(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    group_id = str(req.group_id)
    groups = broker.groups
    errors: dict[tuple[str, int], ErrorCode] = {}
    # Kafka: WRITE on the transactional id, READ on the group (each refusing every
    # partition), READ on each topic (TOPIC_AUTHORIZATION_FAILED)
    security = broker.security
    readable: set[str] | None = security.allowed_names(
        ctx, READ, TOPIC, (str(t.name) for t in req.topics))
    if not security.allowed(ctx, WRITE, TRANSACTIONAL_ID, str(req.transactional_id)):
        err, readable = ErrorCode.transactional_id_authorization_failed, None
    elif not security.allowed(ctx, READ, GROUP, group_id):
        err, readable = ErrorCode.group_authorization_failed, None
    else:
        err = groups.check_coordinator(group_id)
    generation = int(getattr(req, "generation_id", -1))
    if err is ErrorCode.none and generation >= 0:
        err = groups.coordinator.validate_commit(
            group_id, str(getattr(req, "member_id", "")), generation,
            getattr(req, "group_instance_id", None), groups.now_ms())
        groups.flush()
    entries = commit_entries(broker, req.topics, err, errors, readable)
    if entries:
        plain, entry_errors = groups.coordinator.commit_write(group_id, entries,
                                                              groups.now_ms())
        write = OffsetWrite(group_id, plain.records, plain.commits,
                            producer_id=int(req.producer_id),
                            producer_epoch=int(req.producer_epoch))
        write_err = await groups.write(write) if write.records else ErrorCode.none
        if write_err in (ErrorCode.not_enough_replicas, ErrorCode.not_leader_or_follower):
            write_err = ErrorCode.coordinator_not_available
        for e, code in zip(entries, entry_errors, strict=True):
            errors[(e.topic, e.partition)] = code if code is not ErrorCode.none else write_err
    if ctx.api_version < 2:
        errors = {tp: (ErrorCode.coordinator_not_available
                       if code is ErrorCode.coordinator_load_in_progress else code)
                  for tp, code in errors.items()}
    return ctx.response({"throttle_time": 0, "topics": [
        {"name": t.name, "partitions": [
            {"partition_index": p.partition_index,
             "error_code": errors[(str(t.name), int(p.partition_index))]}
            for p in t.partitions]} for t in req.topics]})
