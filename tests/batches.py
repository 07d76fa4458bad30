"""Build real RecordBatch v2 bytes for tests (shared helper).

An independent, straightforward encoder of the v2 format (varints, CRC-32C), checked
against aiokafka's builder in tests/unit/test_records.py so that tests do not only agree
with the code under test.
"""

from __future__ import annotations

import gzip
import struct
from typing import Any

import cramjam
import crc32c

Header = tuple[str, bytes | None]
Record = tuple[bytes | None, bytes | None, int, list[Header]]

_CODECS = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_HEADER = struct.Struct(">qiibIhiqqqhii")
_ATTRIBUTES_POS = struct.calcsize(">qiibI")
_CRC_POS = struct.calcsize(">qiib")


def varint(value: int) -> bytes:
    """Zigzag varint (64-bit)."""
    z = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = z & 0x7F
        z >>= 7
        if z:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def encode_record(
    offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None,
    headers: list[Header],
) -> bytes:
    body = bytearray(b"\x00")  # attributes
    body += varint(timestamp_delta) + varint(offset_delta)
    body += _bytes_field(key) + _bytes_field(value)
    body += varint(len(headers))
    for hkey, hvalue in headers:
        body += _bytes_field(hkey.encode()) + _bytes_field(hvalue)
    return varint(len(body)) + bytes(body)


def compress(codec: str | None, data: bytes) -> bytes:
    if codec is None:
        return data
    if codec == "gzip":
        return gzip.compress(data)
    if codec == "snappy":
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == "lz4":
        return bytes(cramjam.lz4.compress(data))
    if codec == "zstd":
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(codec)


def make_batch(
    records: list[Record],
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    compression: str | None = None,
    *,
    partition_leader_epoch: int = -1,
    transactional: bool = False,
    magic: int = 2,
) -> bytes:
    """One v2 batch of ``records`` (key, value, timestamp_ms, headers), offsets 0..n-1."""
    assert records, "a batch needs at least one record"
    base_ts = records[0][2]
    body = b"".join(
        encode_record(i, ts - base_ts, key, value, headers)
        for i, (key, value, ts, headers) in enumerate(records)
    )
    body = compress(compression, body)
    attributes = _CODECS[compression] | (0x10 if transactional else 0)
    buf = bytearray(_HEADER.size) + body
    _HEADER.pack_into(
        buf, 0, base_offset, len(buf) - 12, partition_leader_epoch, magic, 0, attributes,
        len(records) - 1, base_ts, max(r[2] for r in records), producer_id, producer_epoch,
        base_sequence, len(records),
    )
    struct.pack_into(">I", buf, _CRC_POS, crc32c.crc32c(bytes(buf[_ATTRIBUTES_POS:])))
    return bytes(buf)


def simple_batch(n: int, ts: int = 1_000, value_size: int = 10, **kwargs: Any) -> bytes:
    """A batch of ``n`` records with values b"v..." and timestamps ts, ts+1, ..."""
    records: list[Record] = [
        (None, (b"v%d-" % i).ljust(value_size, b"x"), ts + i, []) for i in range(n)
    ]
    return make_batch(records, **kwargs)
