"""The hand-written Fetch response encoder writes exactly kio's bytes, every version."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from headrace.protocol.codec import (
    EncodedBody,
    FetchPartition,
    encode_fetch_body,
    encode_response,
    encode_response_chunks,
    response_class,
)
from headrace.protocol.entities import build

TOPIC_ID = uuid.UUID("0123456789abcdef0123456789abcdef")


def _partition(index: int, code: int, aborted: list[tuple[int, int]] | None,
               records: Sequence[bytes]) -> FetchPartition:
    p = FetchPartition(index, code, aborted)
    p.high_watermark, p.last_stable_offset, p.log_start_offset = 1000 + index, 999, 3
    p.records = list(records)
    p.records_size = sum(len(r) for r in records)
    return p


def _cases() -> list[list[tuple[str, list[FetchPartition]]]]:
    big = [b"x" * 300, b"y" * 70000]
    return [
        [],
        [("t", [_partition(0, 0, None, [])])],
        [("topic-ä", [_partition(0, 0, [], [b"abc"]), _partition(1, 6, [], []),
                      _partition(2, 0, [(7, 8), (9, 10)], big)]),
         ("other", [_partition(5, 0, None, [b"z" * 200])])],
        [("x" * 200, [_partition(i, 0, [], [bytes([i]) * i]) for i in range(150)])],
    ]


def _as_dicts(topics: list[tuple[str, list[FetchPartition]]], by_id: bool) -> list[Any]:
    return [
        {"topic": name, "topic_id": TOPIC_ID, "partitions": [
            {"partition_index": p.index, "error_code": p.error_code,
             "high_watermark": p.high_watermark, "last_stable_offset": p.last_stable_offset,
             "log_start_offset": p.log_start_offset,
             "aborted_transactions": None if p.aborted_transactions is None else [
                 {"producer_id": a, "first_offset": b} for a, b in p.aborted_transactions],
             "records": b"".join(p.records)}
            for p in parts]}
        for name, parts in topics
    ]


@pytest.mark.parametrize("version", range(4, 17))
@pytest.mark.parametrize("case", range(len(_cases())))
def test_fetch_body_matches_kio(version: int, case: int) -> None:
    topics = _cases()[case]
    by_id = version >= 13
    ours_topics: list[tuple[Any, list[FetchPartition]]] = [
        (TOPIC_ID if by_id else name, parts) for name, parts in topics
    ]
    body = encode_fetch_body(version, 5, 0, 0, ours_topics)
    assert body.size == sum(len(c) for c in body.chunks)
    ours = b"".join(encode_response_chunks(1, version, 4242, body))
    entity = build(response_class(1, version), {
        "throttle_time": 5, "error_code": 0, "session_id": 0,
        "responses": _as_dicts(topics, by_id),
    })
    assert ours == encode_response(1, version, 4242, entity)


def test_records_are_not_copied() -> None:
    rec = b"r" * 100_000
    body = encode_fetch_body(16, 0, 0, 0, [(TOPIC_ID, [_partition(0, 0, [], [rec])])])
    assert any(c is rec for c in body.chunks)


def test_other_bodies_are_encoded_by_kio() -> None:
    cls = response_class(18, 3)
    entity = build(cls, {"error_code": 0, "api_keys": []})
    assert encode_response_chunks(18, 3, 1, entity) == [encode_response(18, 3, 1, entity)]
    assert not isinstance(entity, EncodedBody)
