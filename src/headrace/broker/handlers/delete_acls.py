"""DeleteAcls (31): SECURITY_DISABLED for every filter, as Kafka answers while no
authorizer is configured (``AclApis.handleDeleteAcls`` -> ``DeleteAclsRequest
.getErrorResponse``: one filter result per requested filter, error 54, "No Authorizer is
configured.", no matching ACLs). v1-v3 (kio has no v0 schema)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler

if TYPE_CHECKING:
    from headrace.broker.server import Broker

NO_AUTHORIZER = "No Authorizer is configured."


@handler(31, "DeleteAcls", 1, 3)
async def handle_delete_acls(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    result = {"error_code": ErrorCode.security_disabled, "error_message": NO_AUTHORIZER,
              "matching_acls": []}
    return ctx.response({"throttle_time": 0, "filter_results": [result for _ in req.filters]})
