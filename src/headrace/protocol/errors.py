"""Protocol errors, by whose fault they are (STYLE rule 4).

``ProtocolError``: the peer sent bytes that are not a valid Kafka request (a bad size
prefix, a truncated body, an API key or version nobody knows). The broker answers what
Kafka answers, or closes that one connection; it never crashes. Anything else escaping the
decoder is our bug.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """The peer's bytes are not a valid request."""


class FrameTooLargeError(ProtocolError):
    """A size prefix beyond ``socket.request.max.bytes`` (or negative)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"frame of {size} bytes exceeds socket.request.max.bytes={limit}"
            if size >= 0 else f"negative frame size {size}"
        )
        self.size = size
        self.limit = limit
        self.frames: list[bytes | memoryview] = []  # completed before it in the same feed


class UnknownApiError(ProtocolError):
    """An API key or version that no schema describes; the header could still be read."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"unknown API key {api_key} version {api_version}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class UnsupportedVersionError(UnknownApiError):
    """A version advertised only so that old clients negotiate well (Produce v0-v2,
    KAFKA-18659), refused as Kafka 4.0 refuses it: UNSUPPORTED_VERSION, connection closed."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(api_key, api_version, correlation_id)
        self.args = (f"UNSUPPORTED_VERSION: API key {api_key} version {api_version} is "
                     "advertised for old clients' sake (KAFKA-18659) but not served",)
