"""ApiVersions (18): the versions this broker accepts, derived from the handler table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace.broker.handlers.base import HANDLERS, RequestContext, handler
from headrace.protocol.codec import supported_versions

if TYPE_CHECKING:
    from headrace.broker.server import Broker


def advertised_versions() -> list[tuple[int, int, int]]:
    """(api_key, min, max) for every handler, within what kio can decode and encode."""
    out = []
    for key, h in sorted(HANDLERS.items()):
        known = supported_versions(key)
        if known is None:
            continue
        lo, hi = max(h.min_version, known[0]), min(h.max_version, known[1])
        if lo <= hi:
            out.append((key, lo, hi))
    return out


@handler(18, "ApiVersions", 0, 4)
async def handle_api_versions(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    return ctx.response(
        {
            "error_code": 0,
            "api_keys": [
                {"api_key": k, "min_version": lo, "max_version": hi}
                for k, lo, hi in advertised_versions()
            ],
            "throttle_time": 0,
        }
    )
