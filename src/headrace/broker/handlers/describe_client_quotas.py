"""DescribeClientQuotas (48), v0-1: the stored quotas of the entities a filter matches, as
Kafka's ``ZkAdminManager.describeClientQuotas`` answers (KIP-546).

DESCRIBE_CONFIGS on the cluster is needed (else CLUSTER_AUTHORIZATION_FAILED, no entries).
A filter has at most one component per entity type (user, client-id, ip); match type 0
(EXACT) names an entity, 1 (DEFAULT) the default one, 2 (SPECIFIED) any named entity,
the default included (Kafka's ZooKeeper reading). ``strict``: entities with a type the
filter does not name are left out. Errors (top-level, entries null): a type given twice
"Duplicate user filter component entity type", an empty type "Unexpected empty filter
component entity type", an IP component beside a user or client-id one INVALID_REQUEST;
another type UNSUPPORTED_VERSION "Custom entity type '<t>' not supported".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DESCRIBE_CONFIGS
from headrace.security.quotas import CLIENT_ID, DEFAULT, IP, USER, Name, QuotaEntity

if TYPE_CHECKING:
    from headrace.broker.server import Broker

EXACT, DEFAULT_MATCH, SPECIFIED = 0, 1, 2
_DUPLICATE = {USER: "user", CLIENT_ID: "client", IP: "ip"}


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _components(req: Any) -> dict[str, tuple[int, str | None]]:
    out: dict[str, tuple[int, str | None]] = {}
    for c in req.components:
        kind = str(c.entity_type)
        if kind in _DUPLICATE:
            if kind in out:
                raise _Refused(ErrorCode.invalid_request, f"Duplicate {_DUPLICATE[kind]} "
                                                          "filter component entity type")
        elif kind == "":
            raise _Refused(ErrorCode.invalid_request,
                           "Unexpected empty filter component entity type")
        else:
            raise _Refused(ErrorCode.unsupported_version,
                           f"Custom entity type '{kind}' not supported")
        match_type = int(c.match_type)
        if match_type not in (EXACT, DEFAULT_MATCH, SPECIFIED):
            raise _Refused(ErrorCode.invalid_request, f"Unexpected match type: {match_type}")
        if match_type == EXACT and c.match is None:
            raise _Refused(ErrorCode.invalid_request,
                           f"Exact match on {kind} needs a name")
        out[kind] = (match_type, c.match)
    if IP in out and (USER in out or CLIENT_ID in out):
        raise _Refused(ErrorCode.invalid_request, "Invalid entity filter component "
                       "combination, IP filter component should not be used with user or "
                       "clientId filter component.")
    return out


def _matches(component: tuple[int, str | None] | None, name: Name | None,
             strict: bool) -> bool:
    if component is None:
        return name is None or not strict
    match_type, match = component
    if match_type == SPECIFIED:
        return name is not None
    if match_type == DEFAULT_MATCH:
        return name is DEFAULT
    return name == match


@handler(48, "DescribeClientQuotas", 0, 1)
async def handle_describe_client_quotas(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    def failed(code: ErrorCode, message: str | None) -> Any:
        return ctx.response({"throttle_time": 0, "error_code": code, "error_message": message,
                             "entries": None})

    if not broker.security.cluster_allowed(ctx, DESCRIBE_CONFIGS):
        return failed(ErrorCode.cluster_authorization_failed, None)
    try:
        components = _components(req)
    except _Refused as e:
        return failed(e.code, str(e))
    strict = bool(req.strict)
    entries = []
    for entity, values in sorted(broker.metadata.quota_table.items(),
                                 key=lambda ev: ev[0].path):
        if not values:
            continue
        if IP in components or entity.ip is not None:
            # IP entities answer IP filters only (and a filter naming no type, not strict)
            if not (_matches(components.get(IP), entity.ip, strict)
                    and entity.ip is not None
                    and not (USER in components or CLIENT_ID in components)):
                continue
        elif not (_matches(components.get(USER), entity.user, strict)
                  and _matches(components.get(CLIENT_ID), entity.client_id, strict)):
            continue
        entries.append(_entry(entity, values))
    return ctx.response({"throttle_time": 0, "error_code": ErrorCode.none,
                         "error_message": None, "entries": entries})


def _entry(entity: QuotaEntity, values: dict[str, float]) -> dict[str, Any]:
    return {"entity": [{"entity_type": t, "entity_name": n} for t, n in entity.components()],
            "values": [{"key": k, "value": float(v)} for k, v in sorted(values.items())]}
