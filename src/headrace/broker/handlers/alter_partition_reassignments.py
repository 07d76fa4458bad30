"""AlterPartitionReassignments (45) and ListPartitionReassignments (46): move partitions
to other brokers (KIP-455), so that a new broker can take load.

Answered by the active controller (NOT_CONTROLLER elsewhere, as Kafka). A reassignment
adds the target's new replicas, which catch up by fetching; once the whole target is in
the ISR the controller drops the replicas that are not in it (and moves the leadership
into the target if needed). ``replicas`` null cancels an ongoing reassignment
(NO_REASSIGNMENT_IN_PROGRESS if there is none). A single node has nothing to move to:
INVALID_REPLICA_ASSIGNMENT unless the target is what it already is.

Authorization (Kafka's ``authorizeClusterOperation``, whose ClusterAuthorizationException
becomes the request's ``getErrorResponse``): Alter needs ALTER on the cluster, List
DESCRIBE; otherwise CLUSTER_AUTHORIZATION_FAILED at the top (and, for Alter, for every
requested partition) with the exception's message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import ALTER, DESCRIBE

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def _not_authorized(ctx: RequestContext) -> str:
    # Kafka: s"Request $request is not authorized." (the request's own description)
    h = ctx.header
    return (f"Request {h.api_key} v{h.api_version} (correlation id {h.correlation_id}, "
            f"principal {ctx.principal}) is not authorized.")


def _controller(broker: Broker) -> Any:
    c = broker.controller
    return c if c is not None and c.is_active else None


@handler(45, "AlterPartitionReassignments", 0, 0)
async def handle_alter(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    items = [(str(t.name), int(p.partition_index),
              None if p.replicas is None else [int(r) for r in p.replicas])
             for t in req.topics for p in t.partitions]
    if not broker.security.cluster_allowed(ctx, ALTER):
        denied_message = _not_authorized(ctx)
        denied = ErrorCode.cluster_authorization_failed
        return ctx.response({
            "throttle_time": 0, "error_code": denied, "error_message": denied_message,
            "responses": [{"name": t.name, "partitions": [
                {"partition_index": p.partition_index, "error_code": denied,
                 "error_message": denied_message} for p in t.partitions]}
                          for t in req.topics],
        })
    controller = _controller(broker)
    top = ErrorCode.none
    results: dict[tuple[str, int], tuple[str, str | None]] = {}
    if broker.cluster is None:
        for name, p, target in items:
            t = broker.metadata.topic(name)
            if t is None or not 0 <= p < len(t.partitions):
                results[(name, p)] = ("unknown_topic_or_partition", None)
            elif target is None:
                results[(name, p)] = ("no_reassignment_in_progress", None)
            elif target == t.partitions[p].replicas:
                results[(name, p)] = ("none", None)
            else:
                results[(name, p)] = ("invalid_replica_assignment",
                                      f"Invalid replica assignment {target}")
    elif controller is None:
        top = ErrorCode.not_controller
    else:
        results = await controller.alter_reassignments(items)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for name, p, _ in items:
        code, message = results.get((name, p), ("none", None))
        by_topic.setdefault(name, []).append({
            "partition_index": p, "error_code": ErrorCode[code], "error_message": message})
    return ctx.response({
        "throttle_time": 0, "error_code": top,
        "error_message": "This is not the controller" if top else None,
        "responses": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
    })


@handler(46, "ListPartitionReassignments", 0, 0)
async def handle_list(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    wanted = (None if req.topics is None else
              [(str(t.name), int(p)) for t in req.topics for p in t.partition_indexes])
    if not broker.security.cluster_allowed(ctx, DESCRIBE):
        return ctx.response({"throttle_time": 0,
                             "error_code": ErrorCode.cluster_authorization_failed,
                             "error_message": _not_authorized(ctx), "topics": []})
    controller = _controller(broker)
    if broker.cluster is not None and controller is None:
        return ctx.response({"throttle_time": 0, "error_code": ErrorCode.not_controller,
                             "error_message": "This is not the controller", "topics": []})
    ongoing = controller.list_reassignments(wanted) if controller is not None else {}
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (name, p), (replicas, adding, removing) in sorted(ongoing.items()):
        by_topic.setdefault(name, []).append({
            "partition_index": p, "replicas": replicas, "adding_replicas": adding,
            "removing_replicas": removing})
    return ctx.response({"throttle_time": 0, "error_code": ErrorCode.none,
                         "error_message": None,
                         "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()]})
