"""ElectLeaders (43): preferred (0) or unclean (1) leader elections on request.

Answered by the active controller (NOT_CONTROLLER elsewhere, as Kafka; clients send it to
the controller named in Metadata). Per partition: ELECTION_NOT_NEEDED (the preferred
replica leads already, or an unclean election for a partition that has a leader),
PREFERRED_LEADER_NOT_AVAILABLE / ELIGIBLE_LEADERS_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION.
A single node has nothing to elect: ELECTION_NOT_NEEDED for every existing partition.

Authorization (Kafka's ``handleElectLeaders``): ALTER on the cluster, else
CLUSTER_AUTHORIZATION_FAILED at the top and for every requested partition (none when all
partitions were asked for), with a null message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import ALTER

if TYPE_CHECKING:
    from headrace.broker.server import Broker

_CODES = {
    "elected": ErrorCode.none,
    "not needed": ErrorCode.election_not_needed,
    "unknown": ErrorCode.unknown_topic_or_partition,
}


@handler(43, "ElectLeaders", 0, 2)
async def handle_elect_leaders(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    election_type = int(getattr(req, "election_type", 0))
    wanted = (None if req.topic_partitions is None else
              [(str(t.topic), int(p)) for t in req.topic_partitions for p in t.partitions])
    top_error = ErrorCode.none
    results: dict[tuple[str, int], str] = {}
    controller = broker.controller
    if not broker.security.cluster_allowed(ctx, ALTER):
        denied: dict[str, list[dict[str, Any]]] = {}
        for name, p in dict.fromkeys(wanted or ()):
            denied.setdefault(name, []).append({
                "partition_id": p, "error_code": ErrorCode.cluster_authorization_failed,
                "error_message": None})
        return ctx.response({
            "throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
            "replica_election_results": [{"topic": n, "partition_result": ps}
                                         for n, ps in denied.items()],
        })
    if broker.cluster is None:
        names = broker.metadata.topics()
        for name, p in wanted if wanted is not None else [
                (n, i) for n, t in names.items() for i in range(len(t.partitions))]:
            t = names.get(name)
            results[(name, p)] = ("not needed" if t is not None and 0 <= p < len(t.partitions)
                                  else "unknown")
    elif controller is None or not controller.is_active:
        top_error = ErrorCode.not_controller
    else:
        results = await controller.elect_leaders(election_type, wanted)
    not_available = (ErrorCode.preferred_leader_not_available if election_type == 0
                     else ErrorCode.eligible_leaders_not_available)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (name, p), outcome in results.items():
        code = _CODES.get(outcome, not_available)
        by_topic.setdefault(name, []).append({
            "partition_id": p, "error_code": code,
            "error_message": None if code == ErrorCode.none else outcome})
    return ctx.response({
        "throttle_time": 0, "error_code": top_error,
        "replica_election_results": [{"topic": n, "partition_result": ps}
                                     for n, ps in by_topic.items()],
    })
