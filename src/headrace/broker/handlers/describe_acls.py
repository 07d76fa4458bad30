"""DescribeAcls (29): the ACLs a filter matches, grouped by resource pattern (Kafka's
``AclApis.handleDescribeAcls``).

No authorizer configured (``authorizer.class.name`` unset): top-level SECURITY_DISABLED
(54), "No Authorizer is configured on the broker", no resources, as Kafka answers. With
one: DESCRIBE on the cluster is needed (else CLUSTER_AUTHORIZATION_FAILED); a filter with
UNKNOWN elements is INVALID_REQUEST. kio has no v0 schema (Kafka 4 dropped v0 too,
KIP-896), so v1-v3 are served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DESCRIBE
from headrace.security.acl import AclBinding, AclError, ResourcePattern, binding_filter

if TYPE_CHECKING:
    from headrace.broker.server import Broker

NO_AUTHORIZER = "No Authorizer is configured on the broker"


def _error(ctx: RequestContext, code: ErrorCode, message: str | None) -> Any:
    return ctx.response({"throttle_time": 0, "error_code": code, "error_message": message,
                         "resources": []})


@handler(29, "DescribeAcls", 1, 3)
async def handle_describe_acls(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    security = broker.security
    if not security.cluster_allowed(ctx, DESCRIBE):
        return _error(ctx, ErrorCode.cluster_authorization_failed, None)
    if not security.enabled:
        return _error(ctx, ErrorCode.security_disabled, NO_AUTHORIZER)
    try:
        flt = binding_filter(req.resource_type_filter, req.resource_name_filter,
                             req.pattern_type_filter, req.principal_filter, req.host_filter,
                             req.operation, req.permission_type)
    except AclError as e:
        return _error(ctx, ErrorCode.invalid_request, str(e))
    grouped: dict[ResourcePattern, list[AclBinding]] = {}
    for b in broker.metadata.acl_index.bindings(flt):
        grouped.setdefault(b.pattern, []).append(b)
    return ctx.response({"throttle_time": 0, "error_code": ErrorCode.none,
                         "error_message": None, "resources": [
        {"resource_type": int(p.resource_type), "resource_name": p.name,
         "pattern_type": int(p.pattern_type),
         "acls": [{"principal": b.entry.principal, "host": b.entry.host,
                   "operation": int(b.entry.operation),
                   "permission_type": int(b.entry.permission_type)} for b in bs]}
        for p, bs in grouped.items()]})
