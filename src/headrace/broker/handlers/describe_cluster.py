"""DescribeCluster (60): cluster id, controller and brokers.

Authorization as Kafka's ``AuthHelper.computeDescribeClusterResponse``: nothing is refused;
``cluster_authorized_operations`` is filled only when asked for, with the principal's
cluster operations if it may DESCRIBE the cluster and 0 otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.handlers.metadata import UNKNOWN_AUTHORIZED_OPERATIONS
from headrace.broker.security import CLUSTER, CLUSTER_NAME, DESCRIBE

if TYPE_CHECKING:
    from headrace.broker.server import Broker

BROKERS_ENDPOINT = 1


@handler(60, "DescribeCluster", 0, 2)
async def handle_describe_cluster(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    endpoint_type = int(getattr(req, "endpoint_type", BROKERS_ENDPOINT))
    if endpoint_type != BROKERS_ENDPOINT:
        return ctx.response({"throttle_time": 0, "error_code": ErrorCode.unsupported_endpoint_type,
                             "error_message": "Only broker endpoints are supported",
                             "endpoint_type": endpoint_type, "cluster_id": "",
                             "controller_id": -1, "brokers": [],
                             "cluster_authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS})
    cluster_operations = UNKNOWN_AUTHORIZED_OPERATIONS
    if getattr(req, "include_cluster_authorized_operations", False):
        security = broker.security
        cluster_operations = (security.authorized_operations(ctx, CLUSTER, CLUSTER_NAME)
                              if security.cluster_allowed(ctx, DESCRIBE) else 0)
    return ctx.response(
        {
            "throttle_time": 0,
            "error_code": 0,
            "error_message": None,
            "endpoint_type": endpoint_type,
            "cluster_id": broker.metadata.cluster_id,
            "controller_id": await broker.known_controller(),
            "brokers": [
                {"broker_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack,
                 "is_fenced": False}
                for b in broker.advertised_brokers(ctx.listener)
            ],
            "cluster_authorized_operations": cluster_operations,
        }
    )
