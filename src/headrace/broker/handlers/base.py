"""The handler table: one module per API key registers itself here.

ApiVersions is derived from this table (intersected with the versions kio knows), so a
version is advertised exactly when a handler accepts it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headrace.protocol.codec import RequestHeaderInfo, response_class
from headrace.protocol.entities import build
from headrace.security.principal import ANONYMOUS, Principal

if TYPE_CHECKING:
    from headrace.broker.server import Broker


@dataclass(frozen=True, slots=True)
class RequestContext:
    header: RequestHeaderInfo
    peer: str
    # who sent it (issue 12): the connection's authenticated principal (User:ANONYMOUS on
    # an unauthenticated listener) and the listener it came in on
    principal: Principal = ANONYMOUS
    listener: str = "PLAINTEXT"

    @property
    def host(self) -> str:
        """The client's address without the port (ACLs match hosts)."""
        return self.peer.rsplit(":", 1)[0] if ":" in self.peer else self.peer

    @property
    def api_version(self) -> int:
        return self.header.api_version

    def response(self, data: dict[str, Any]) -> Any:
        """Build this request's response entity (the negotiated version) from ``data``."""
        cls = response_class(self.header.api_key, self.header.api_version)
        return build(cls, data)


HandlerFn = Callable[["Broker", RequestContext, Any], Awaitable[Any | None]]


@dataclass(frozen=True, slots=True)
class Handler:
    api_key: int
    name: str
    min_version: int
    max_version: int
    fn: HandlerFn


HANDLERS: dict[int, Handler] = {}


def handler(api_key: int, name: str, min_version: int, max_version: int) -> Callable[
    [HandlerFn], HandlerFn
]:
    def register(fn: HandlerFn) -> HandlerFn:
        if api_key in HANDLERS:
            raise RuntimeError(f"two handlers for api key {api_key}")
        HANDLERS[api_key] = Handler(api_key, name, min_version, max_version, fn)
        return fn

    return register


def ms(td: Any) -> int:
    """A kio timedelta field (or int) as integer milliseconds."""
    if isinstance(td, int):
        return td
    return int(td.total_seconds() * 1000)
