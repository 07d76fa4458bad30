"""Idempotent-producer state, pure (R-PROTO-7)."""

from __future__ import annotations

import dataclasses

import pytest
from kio.schema.errors import ErrorCode
from tests.batches import simple_batch

from headrace.log.producer_state import Duplicate, ProducerStateManager
from headrace.protocol.records import BatchHeader, InvalidRecordError, read_header


def header(pid: int, epoch: int, seq: int, n: int = 2, base_offset: int = 0) -> BatchHeader:
    h = read_header(simple_batch(n, producer_id=pid, producer_epoch=epoch, base_sequence=seq))
    return dataclasses.replace(h, base_offset=base_offset)


def code(fn: object, *args: object) -> ErrorCode:
    with pytest.raises(InvalidRecordError) as e:
        fn(*args)  # type: ignore[operator]
    return e.value.error_code


def test_in_sequence_batches_and_duplicates() -> None:
    """R-PROTO-7: a retry of any of the last five batches returns its original offsets."""
    s = ProducerStateManager()
    offset = 0
    for seq in range(0, 14, 2):
        h = header(1, 0, seq, base_offset=offset)
        assert s.check_append([h]) is None
        s.update(h)
        offset += 2
    # batches with seq 4..12 are remembered; seq 2 is too old to recognise
    assert s.check_append([header(1, 0, 12)]) == Duplicate(12, 13, 1001)
    assert s.check_append([header(1, 0, 4)]) == Duplicate(4, 5, 1001)
    assert code(s.check_append, [header(1, 0, 2)]) == ErrorCode.out_of_order_sequence_number
    assert code(s.check_append, [header(1, 0, 16)]) == ErrorCode.out_of_order_sequence_number
    assert s.check_append([header(1, 0, 14)]) is None


def test_epochs() -> None:
    """R-PROTO-7: an older epoch is fenced; a newer one must restart at sequence 0."""
    s = ProducerStateManager()
    s.update(header(1, 3, 0))
    assert code(s.check_append, [header(1, 2, 2)]) == ErrorCode.invalid_producer_epoch
    assert code(s.check_append, [header(1, 4, 5)]) == ErrorCode.out_of_order_sequence_number
    assert s.check_append([header(1, 4, 0)]) is None


def test_unknown_producer_must_start_at_zero() -> None:
    """R-PROTO-7: strict by default; Kafka 2.5+'s lenient rule is available."""
    assert code(ProducerStateManager().check_append, [header(9, 0, 7)]) == (
        ErrorCode.out_of_order_sequence_number
    )
    assert ProducerStateManager(strict_new_producers=False).check_append([header(9, 0, 7)]) is None


def test_batches_of_one_request_are_checked_in_order() -> None:
    """R-PROTO-7: later batches of a request see the earlier ones; a mix of duplicates and
    new batches is refused; non-idempotent batches are not checked."""
    s = ProducerStateManager()
    assert s.check_append([header(1, 0, 0), header(1, 0, 2), header(-1, -1, -1)]) is None
    assert code(s.check_append, [header(1, 0, 0), header(1, 0, 5)]) == (
        ErrorCode.out_of_order_sequence_number
    )
    s.update(header(1, 0, 0))
    assert code(s.check_append, [header(1, 0, 0), header(1, 0, 2)]) == ErrorCode.invalid_record
    assert s.check_append([header(1, 0, 0)]) is not None


def test_sequence_wraps_to_zero() -> None:
    s = ProducerStateManager()
    s.update(header(1, 0, 2**31 - 2, n=1))
    s.update(header(1, 0, 2**31 - 1, n=1, base_offset=1))
    assert s.check_append([header(1, 0, 0, base_offset=2)]) is None


def test_state_rebuilds_from_headers_and_truncates() -> None:
    s = ProducerStateManager()
    hs = [header(1, 0, 0, base_offset=0), header(1, 0, 2, base_offset=2)]
    s.load(hs)
    assert s.check_append([header(1, 0, 2)]) == Duplicate(2, 3, 1001)
    s.truncate_to(2)
    assert s.check_append([header(1, 0, 2)]) is None
