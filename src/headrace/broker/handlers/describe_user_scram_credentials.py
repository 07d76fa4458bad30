"""DescribeUserScramCredentials (50): each user's SCRAM mechanisms and iteration counts
(never the keys), as Kafka's ``ZkAdminManager.describeUserScramCredentials`` answers.

DESCRIBE on the cluster is needed (else top-level CLUSTER_AUTHORIZATION_FAILED). No user
list (null or empty): every user with a credential, sorted. Named users: an empty name is
RESOURCE_NOT_FOUND, a name given twice DUPLICATE_RESOURCE (once), a user without
credentials RESOURCE_NOT_FOUND; one result per distinct name, in request order. v0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import DESCRIBE
from headrace.metadata.store import UserCredentials
from headrace.security.scram import MECHANISM_TYPES

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def _result(user: str, creds: UserCredentials) -> dict[str, Any]:
    return {"user": user, "error_code": ErrorCode.none, "error_message": None,
            "credential_infos": [
                {"mechanism": MECHANISM_TYPES[m], "iterations": creds[m].iterations}
                for m in MECHANISM_TYPES if m in creds]}


def _failed(user: str, code: ErrorCode, message: str) -> dict[str, Any]:
    return {"user": user, "error_code": code, "error_message": message,
            "credential_infos": []}


@handler(50, "DescribeUserScramCredentials", 0, 0)
async def handle_describe_user_scram_credentials(broker: Broker, ctx: RequestContext,
                                                 req: Any) -> Any:
    if not broker.security.cluster_allowed(ctx, DESCRIBE):
        return ctx.response({"throttle_time": 0,
                             "error_code": ErrorCode.cluster_authorization_failed,
                             "error_message": None, "results": []})
    users = broker.security.user_credentials()
    results: list[dict[str, Any]] = []
    if not req.users:
        results = [_result(u, users[u]) for u in sorted(users) if users[u]]
    else:
        names = [u.name for u in req.users]
        for name in dict.fromkeys(names):
            if not name:
                results.append(_failed(name, ErrorCode.resource_not_found,
                                       "Cannot describe SCRAM credentials for empty user name"))
            elif names.count(name) > 1:
                results.append(_failed(
                    name, ErrorCode.duplicate_resource, "Cannot describe SCRAM credentials "
                    f"for the same user twice in a single request: {name}"))
            elif users.get(name):
                results.append(_result(name, users[name]))
            else:
                results.append(_failed(
                    name, ErrorCode.resource_not_found,
                    f"Attempt to describe a user credential that does not exist: {name}"))
    return ctx.response({"throttle_time": 0, "error_code": ErrorCode.none,
                         "error_message": None, "results": results})
