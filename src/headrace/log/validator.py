"""PURE: Kafka's LogValidator for produced batches: what a leader checks before it stores.

``validate_batches`` runs after ``split_batches`` has checked each batch's header, length and
CRC, and before offsets are assigned; it raises ``InvalidRecordError`` and then nothing of
the request is appended.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from headrace.config import LogConfig
from headrace.protocol.records import BatchHeader, InvalidRecordError, decode_records


def validate_batches(
    records: bytes | memoryview, headers: list[BatchHeader], config: LogConfig, now_ms: int
) -> None:
    """Check the records inside ``headers``' batches against the topic's rules."""
    if config.compact:
        _reject_keyless(records, headers)


def _reject_keyless(records: bytes | memoryview, headers: list[BatchHeader]) -> None:
    """A compacted topic refuses records without a key (Kafka's LogValidator: INVALID_RECORD),
    since the cleaner could only drop them. Decodes the records: compacted topics only."""
    view = memoryview(records)
    for h in headers:
        for rec in decode_records(view[h.position:h.position + h.size]):
            if rec.key is None:
                raise InvalidRecordError(
                    ErrorCode.invalid_record,
                    "Compacted topic cannot accept message without key "
                    f"(record at offset delta {rec.offset - h.base_offset})",
                )
