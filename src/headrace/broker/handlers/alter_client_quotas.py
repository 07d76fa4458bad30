"""AlterClientQuotas (49), v0-1: set and remove quotas of user, client-id, user+client-id
and ip entities, as Kafka's ``ZkAdminManager.alterClientQuotas`` does (KIP-546).

ALTER_CONFIGS on the cluster is needed (else CLUSTER_AUTHORIZATION_FAILED for every
entry). Each entry is checked and applied on its own; INVALID_REQUEST with Kafka's words:
"Invalid empty client quota entity", "Empty <type> not supported" (an empty name; null is
the default), "Unhandled client quota entity type: <t>", "Invalid quota entity
combination, IP entity should not be combined with User or ClientId", "<ip> is not a
valid IP or resolvable host." (an address is required: no name lookup), "Invalid
configuration key <k>", "Configuration <k> must be a LONG value". A type named twice keeps
the last name (Kafka reads the entity into a map). ``validate_only``: checked, not stored.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler
from headrace.broker.security import ALTER_CONFIGS
from headrace.metadata.store import MetadataError
from headrace.security.quotas import (
    CLIENT_ID,
    DEFAULT,
    IP,
    USER,
    Name,
    QuotaEntity,
    QuotaError,
    check_values,
)

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def parse_entity(components: list[tuple[str, str | None]]) -> QuotaEntity:
    """Kafka's ``entityToSanitizedUserClientId``: QuotaError for what it refuses."""
    if not components:
        raise QuotaError("Invalid empty client quota entity")
    names: dict[str, Name] = {}
    for kind, name in components:
        if kind not in (USER, CLIENT_ID, IP):
            raise QuotaError(f"Unhandled client quota entity type: {kind}")
        if name is not None and not name:
            raise QuotaError(f"Empty {kind} not supported")
        names[kind] = DEFAULT if name is None else name
    ip = names.get(IP)
    if isinstance(ip, str):
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise QuotaError(f"{ip} is not a valid IP or resolvable host.") from None
    return QuotaEntity(user=names.get(USER), client_id=names.get(CLIENT_ID), ip=names.get(IP))


@handler(49, "AlterClientQuotas", 0, 1)
async def handle_alter_client_quotas(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    def result(entry: Any, code: ErrorCode, message: str | None) -> dict[str, Any]:
        return {"error_code": code, "error_message": message,
                "entity": [{"entity_type": e.entity_type, "entity_name": e.entity_name}
                           for e in entry.entity]}

    if not broker.security.cluster_allowed(ctx, ALTER_CONFIGS):
        return ctx.response({"throttle_time": 0, "entries": [
            result(e, ErrorCode.cluster_authorization_failed, None) for e in req.entries]})
    results = []
    for entry in req.entries:
        try:
            entity = parse_entity([(str(e.entity_type), e.entity_name) for e in entry.entity])
            upsert = check_values(entity, {str(op.key): float(op.value)
                                           for op in entry.ops if not op.remove})
            remove = {str(op.key) for op in entry.ops if op.remove}
        except QuotaError as e:
            results.append(result(entry, ErrorCode.invalid_request, str(e)))
            continue
        if not req.validate_only:
            try:
                await broker.client_quotas.change(entity, upsert, remove - set(upsert))
            except MetadataError as e:
                results.append(result(entry, ErrorCode.unknown_server_error,
                                      f"Failed to alter client quotas: {e}"))
                continue
        results.append(result(entry, ErrorCode.none, None))
    return ctx.response({"throttle_time": 0, "entries": results})
