"""CreateAcls (30): SECURITY_DISABLED for every creation, as Kafka answers while no
authorizer is configured (``AclApis.handleCreateAcls`` -> ``CreateAclsRequest
.getErrorResponse``: one result per requested ACL, error 54, "No Authorizer is
configured."). Nothing is stored. v1-v3 (kio has no v0 schema)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler

if TYPE_CHECKING:
    from headrace.broker.server import Broker

NO_AUTHORIZER = "No Authorizer is configured."


@handler(30, "CreateAcls", 1, 3)
async def handle_create_acls(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    result = {"error_code": ErrorCode.security_disabled, "error_message": NO_AUTHORIZER}
    return ctx.response({"throttle_time": 0, "results": [result for _ in req.creations]})
