"""SaslHandshake (17) and SaslAuthenticate (36) (issue 12).

On a SASL listener the connection runs the exchange itself (``Connection._sasl`` in
``headrace.broker.server``: handshake, tokens, principal, KIP-368 re-authentication). These
handlers answer only where SASL is not in use, as Kafka does there: ILLEGAL_SASL_STATE
(``KafkaApis.handleSaslHandshakeRequest`` / ``handleSaslAuthenticateRequest``). After a
SaslHandshake v0 the tokens come as bare frames (Kafka's original form, which librdkafka
2.0 still requires the broker to advertise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.handlers.base import RequestContext, handler

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@handler(17, "SaslHandshake", 0, 1)
async def handle_sasl_handshake(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    return ctx.response({"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []})


@handler(36, "SaslAuthenticate", 0, 2)
async def handle_sasl_authenticate(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    return ctx.response({
        "error_code": ErrorCode.illegal_sasl_state,
        "error_message": "SaslAuthenticate request received after successful "
                         "authentication",
        "auth_bytes": b"", "session_lifetime": 0})
