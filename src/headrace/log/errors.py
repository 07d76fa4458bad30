"""Errors of the partition log, each carrying the Kafka error code a request gets.

``LogError`` is a request the log cannot serve (an offset out of range, a producer fenced by
a newer epoch); the handler answers it with ``error_code``. ``CorruptLogError`` is the disk's
fault: data the log cannot recover from on its own (it is raised, never silently served).
Invalid bytes in a produce request raise ``headrace.protocol.records.InvalidRecordError``.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode


class LogError(Exception):
    """A log operation refused; ``error_code`` is the Kafka error to answer with."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class OffsetOutOfRangeError(LogError):
    """A read below the log start offset or above the log end offset."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            ErrorCode.offset_out_of_range,
            f"offset {offset} is outside [{log_start_offset}, {log_end_offset}]",
        )
        self.offset = offset


class CorruptLogError(LogError):
    """On-disk data that recovery cannot repair (e.g. a segment file that is unreadable)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.kafka_storage_error, message)
