"""CreateAcls (30): store ACL bindings (Kafka's ``AclApis.handleCreateAcls``).

ALTER on the cluster is needed, else CLUSTER_AUTHORIZATION_FAILED for every creation.
No authorizer configured: SECURITY_DISABLED for every creation ("No Authorizer is
configured."), nothing stored. With one, each binding is checked as Kafka checks it
(a CLUSTER resource must be named kafka-cluster, a name must not be empty, no UNKNOWN,
ANY or MATCH elements, a principal is TYPE:NAME): INVALID_REQUEST with the reason for a
bad one, the others are stored (one write per resource pattern). v1-v3 (kio has no v0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import ALTER
from headrace.metadata.store import MetadataError
from headrace.security.acl import AccessControlEntry, AclError, ResourcePattern, binding

if TYPE_CHECKING:
    from headrace.broker.server import Broker

NO_AUTHORIZER = "No Authorizer is configured."


@handler(30, "CreateAcls", 1, 3)
async def handle_create_acls(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    def all_failed(code: ErrorCode, message: str | None) -> Any:
        result = {"error_code": code, "error_message": message}
        return ctx.response({"throttle_time": 0, "results": [result for _ in req.creations]})

    if not broker.security.cluster_allowed(ctx, ALTER):
        return all_failed(ErrorCode.cluster_authorization_failed, None)
    if not broker.security.enabled:
        return all_failed(ErrorCode.security_disabled, NO_AUTHORIZER)
    results: list[dict[str, Any]] = []
    by_pattern: dict[ResourcePattern, tuple[set[AccessControlEntry], list[int]]] = {}
    for i, c in enumerate(req.creations):
        results.append({"error_code": ErrorCode.none, "error_message": None})
        try:
            b = binding(c.resource_type, c.resource_name, c.resource_pattern_type,
                        c.principal, c.host, c.operation, c.permission_type)
        except AclError as e:
            results[i] = {"error_code": ErrorCode.invalid_request, "error_message": str(e)}
            continue
        entries, indexes = by_pattern.setdefault(b.pattern, (set(), []))
        entries.add(b.entry)
        indexes.append(i)
    for pattern, (entries, indexes) in by_pattern.items():
        try:
            await broker.security.change_acls(pattern, frozenset(entries), frozenset())
        except (MetadataError, ValueError) as e:
            for i in indexes:
                results[i] = {"error_code": ErrorCode.unknown_server_error,
                              "error_message": f"Failed to create ACL: {e}"}
    return ctx.response({"throttle_time": 0, "results": results})
