"""DescribeAcls (29): SECURITY_DISABLED, as Kafka answers while no authorizer is configured.

headrace has no authorizer (no ACLs, every client may do everything). Kafka's answer then
(``AclApis.handleDescribeAcls``): top-level SECURITY_DISABLED (54) with the message "No
Authorizer is configured on the broker" and no resources. kio has no v0 schema (Kafka 4
dropped v0 too, KIP-896), so v1-v3 are served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler

if TYPE_CHECKING:
    from headrace.broker.server import Broker

NO_AUTHORIZER = "No Authorizer is configured on the broker"


@handler(29, "DescribeAcls", 1, 3)
async def handle_describe_acls(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    return ctx.response({"throttle_time": 0, "error_code": ErrorCode.security_disabled,
                         "error_message": NO_AUTHORIZER, "resources": []})
