"""AlterUserScramCredentials (51): upsert and delete users' SCRAM credentials (Kafka's
``ZkAdminManager.alterUserScramCredentials``).

ALTER on the cluster is needed (else CLUSTER_AUTHORIZATION_FAILED for every user named).
Kafka's checks, each failing the whole user: an empty name is UNACCEPTABLE_CREDENTIAL
("Username must not be empty"), an unknown mechanism UNSUPPORTED_SASL_MECHANISM,
iterations outside [4096, 16384] UNACCEPTABLE_CREDENTIAL, an empty salt or salted
password UNACCEPTABLE_CREDENTIAL, the same (user, mechanism) twice in the request
DUPLICATE_RESOURCE, deleting a credential the user does not have RESOURCE_NOT_FOUND.
The server keeps StoredKey/ServerKey derived from the salted password, never the
password. One result per user: those that failed validation first, then the others. v0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import ALTER
from headrace.metadata.store import MetadataError
from headrace.security.scram import (
    MAX_ITERATIONS,
    MECHANISM_TYPES,
    MIN_ITERATIONS,
    ScramCredential,
    from_salted_password,
)

if TYPE_CHECKING:
    from headrace.broker.server import Broker

MECHANISM_NAMES = {code: name for name, code in MECHANISM_TYPES.items()}


def _upsertion_error(u: Any) -> tuple[ErrorCode, str] | None:
    if not u.name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if u.mechanism not in MECHANISM_NAMES:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    if u.iterations < MIN_ITERATIONS:
        return ErrorCode.unacceptable_credential, "Too few iterations"
    if u.iterations > MAX_ITERATIONS:
        return ErrorCode.unacceptable_credential, "Too many iterations"
    if not u.salt or not u.salted_password:
        return ErrorCode.unacceptable_credential, "Salt and salted password must not be empty"
    return None


def _deletion_error(d: Any) -> tuple[ErrorCode, str] | None:
    if not d.name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if d.mechanism not in MECHANISM_NAMES:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


@handler(51, "AlterUserScramCredentials", 0, 0)
async def handle_alter_user_scram_credentials(broker: Broker, ctx: RequestContext,
                                              req: Any) -> Any:
    names = list(dict.fromkeys([d.name for d in req.deletions]
                               + [u.name for u in req.upsertions]))
    if not broker.security.cluster_allowed(ctx, ALTER):
        return ctx.response({"throttle_time": 0, "results": [
            {"user": n, "error_code": ErrorCode.cluster_authorization_failed,
             "error_message": None} for n in names]})
    failed: dict[str, tuple[ErrorCode, str]] = {}
    for u in req.upsertions:
        err = _upsertion_error(u)
        if err is not None:
            failed.setdefault(u.name, err)
    for d in req.deletions:
        err = _deletion_error(d)
        if err is not None:
            failed.setdefault(d.name, err)
    pairs = [(x.name, x.mechanism) for x in (*req.upsertions, *req.deletions)]
    for pair in pairs:
        if pairs.count(pair) > 1 and pair[0] not in failed:
            failed[pair[0]] = (ErrorCode.duplicate_resource,
                               "A user credential cannot be altered twice in the same request")
    results = [{"user": n, "error_code": failed[n][0], "error_message": failed[n][1]}
               for n in names if n in failed]
    current = broker.security.user_credentials()
    for name in names:
        if name in failed:
            continue
        deletes = {MECHANISM_NAMES[d.mechanism] for d in req.deletions if d.name == name}
        missing = [m for m in deletes if m not in current.get(name, {})]
        if missing:
            results.append({"user": name, "error_code": ErrorCode.resource_not_found,
                            "error_message": "Attempt to delete a user credential that "
                                             "does not exist"})
            continue
        upserts: dict[str, ScramCredential] = {}
        for u in req.upsertions:
            if u.name == name:
                mechanism = MECHANISM_NAMES[u.mechanism]
                upserts[mechanism] = from_salted_password(mechanism, u.salt, u.salted_password,
                                                          u.iterations)
        try:
            await broker.security.change_credentials(name, upserts, deletes)
        except (MetadataError, ValueError) as e:
            results.append({"user": name, "error_code": ErrorCode.unknown_server_error,
                            "error_message": f"Failed to alter credentials: {e}"})
            continue
        results.append({"user": name, "error_code": ErrorCode.none, "error_message": None})
    return ctx.response({"throttle_time": 0, "results": results})
