"""The Fetch response's diverging epoch (KIP-320, v12+) is written exactly as kio writes
it, and read back by the follower's decoder."""

from __future__ import annotations

import pytest
from kio.serial import entity_reader

from headrace.protocol.codec import (
    FetchPartition,
    encode_fetch_body,
    encode_response,
    encode_response_chunks,
    response_class,
)
from headrace.protocol.entities import build


def _partition(diverging: tuple[int, int] | None) -> FetchPartition:
    p = FetchPartition(0, 0, None)
    p.high_watermark, p.last_stable_offset, p.log_start_offset = 10, 10, 0
    p.diverging_epoch = diverging
    return p


@pytest.mark.parametrize("version", [12])
def test_diverging_epoch_matches_kio_and_decodes(version: int) -> None:
    body = encode_fetch_body(version, 0, 0, 7, [("t", [_partition((3, 42)), _partition(None)])])
    ours = b"".join(encode_response_chunks(1, version, 99, body))
    partition = {"partition_index": 0, "error_code": 0, "high_watermark": 10,
                 "last_stable_offset": 10, "log_start_offset": 0,
                 "aborted_transactions": None, "records": b""}
    entity = build(response_class(1, version), {
        "throttle_time": 0, "error_code": 0, "session_id": 7,
        "responses": [{"topic": "t", "partitions": [
            {**partition, "diverging_epoch": {"epoch": 3, "end_offset": 42}}, partition]}],
    })
    assert ours == encode_response(1, version, 99, entity)
    rcls = response_class(1, version)
    frame = ours[4:]
    _, n = entity_reader(rcls.__header_schema__)(frame, 0)
    decoded, _ = entity_reader(rcls)(frame, n)  # as the follower's client reads it
    first, second = decoded.responses[0].partitions
    assert (first.diverging_epoch.epoch, first.diverging_epoch.end_offset) == (3, 42)
    assert (second.diverging_epoch.epoch, second.diverging_epoch.end_offset) == (-1, -1)
