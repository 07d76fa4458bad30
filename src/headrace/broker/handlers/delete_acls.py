"""DeleteAcls (31): remove the ACLs each filter matches and list them (Kafka's
``AclApis.handleDeleteAcls``).

ALTER on the cluster is needed, else CLUSTER_AUTHORIZATION_FAILED for every filter. No
authorizer configured: SECURITY_DISABLED for every filter ("No Authorizer is
configured."), no matching ACLs. A filter with UNKNOWN elements is INVALID_REQUEST; an
ACL matched by several filters is listed under each. v1-v3 (kio has no v0 schema).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import ALTER
from headrace.metadata.store import MetadataError
from headrace.security.acl import AccessControlEntry, AclBinding, AclError, ResourcePattern
from headrace.security.acl import binding_filter as make_filter

if TYPE_CHECKING:
    from headrace.broker.server import Broker

NO_AUTHORIZER = "No Authorizer is configured."


def _matching(b: AclBinding) -> dict[str, Any]:
    return {"error_code": ErrorCode.none, "error_message": None,
            "resource_type": int(b.pattern.resource_type), "resource_name": b.pattern.name,
            "pattern_type": int(b.pattern.pattern_type), "principal": b.entry.principal,
            "host": b.entry.host, "operation": int(b.entry.operation),
            "permission_type": int(b.entry.permission_type)}


@handler(31, "DeleteAcls", 1, 3)
async def handle_delete_acls(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    def all_failed(code: ErrorCode, message: str | None) -> Any:
        result: dict[str, Any] = {"error_code": code, "error_message": message,
                                  "matching_acls": []}
        return ctx.response({"throttle_time": 0,
                             "filter_results": [result for _ in req.filters]})

    if not broker.security.cluster_allowed(ctx, ALTER):
        return all_failed(ErrorCode.cluster_authorization_failed, None)
    if not broker.security.enabled:
        return all_failed(ErrorCode.security_disabled, NO_AUTHORIZER)
    index = broker.metadata.acl_index
    results: list[dict[str, Any]] = []
    doomed: dict[ResourcePattern, set[AccessControlEntry]] = {}
    for f in req.filters:
        try:
            flt = make_filter(f.resource_type_filter, f.resource_name_filter,
                              f.pattern_type_filter, f.principal_filter, f.host_filter,
                              f.operation, f.permission_type)
        except AclError as e:
            results.append({"error_code": ErrorCode.invalid_request, "error_message": str(e),
                            "matching_acls": []})
            continue
        found = list(index.bindings(flt))
        for b in found:
            doomed.setdefault(b.pattern, set()).add(b.entry)
        results.append({"error_code": ErrorCode.none, "error_message": None,
                        "matching_acls": [_matching(b) for b in found]})
    failed: dict[ResourcePattern, str] = {}
    for pattern, entries in doomed.items():
        try:
            await broker.security.change_acls(pattern, frozenset(), frozenset(entries))
        except (MetadataError, ValueError) as e:
            failed[pattern] = f"Failed to delete ACL: {e}"
    if failed:
        for r in results:
            for m in r["matching_acls"]:
                message = failed.get(ResourcePattern(*_pattern_key(m)))
                if message is not None:
                    m["error_code"] = ErrorCode.unknown_server_error
                    m["error_message"] = message
    return ctx.response({"throttle_time": 0, "filter_results": results})


def _pattern_key(m: dict[str, Any]) -> tuple[Any, ...]:
    from headrace.security.acl import PatternType, ResourceType

    return (ResourceType(m["resource_type"]), m["resource_name"],
            PatternType(m["pattern_type"]))
