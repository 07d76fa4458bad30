"""PURE: a DescribeTransactions v0 response body read by hand (``headrace transactions
describe``): kio's reader refuses the -1 start time Kafka sends for a transaction not
begun, which Kafka's own tools show as "none". Flexible encoding: compact strings and
arrays (unsigned varint length + 1), a tagged-field section after each struct."""

from __future__ import annotations

import struct
from dataclasses import dataclass

_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class DescribedTxn:
    error_code: int
    transactional_id: str
    state: str
    timeout_ms: int
    start_ms: int  # -1: no transaction begun
    producer_id: int
    producer_epoch: int
    partitions: tuple[tuple[str, int], ...]


class _R:
    def __init__(self, data: bytes | memoryview, pos: int) -> None:
        self.data, self.pos = bytes(data), pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(f"truncated DescribeTransactions response at {self.pos}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def fixed(self, s: struct.Struct) -> int:
        return int(s.unpack(self.take(s.size))[0])

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            b = self.take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ValueError("varint too long")

    def string(self) -> str:
        n = self.uvarint() - 1
        return "" if n < 0 else self.take(n).decode("utf-8")

    def count(self) -> int:
        return max(self.uvarint() - 1, 0)

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


def decode_describe_transactions_v0(data: bytes | memoryview, pos: int = 0
                                    ) -> list[DescribedTxn]:
    r = _R(data, pos)
    r.fixed(_I32)  # throttle time
    out = []
    for _ in range(r.count()):
        code = r.fixed(_I16)
        tid, state = r.string(), r.string()
        timeout, start = r.fixed(_I32), r.fixed(_I64)
        pid, epoch = r.fixed(_I64), r.fixed(_I16)
        parts: list[tuple[str, int]] = []
        for _ in range(r.count()):
            topic = r.string()
            parts += [(topic, r.fixed(_I32)) for _ in range(r.count())]
            r.tags()
        r.tags()
        out.append(DescribedTxn(code, tid, state, timeout, start, pid, epoch, tuple(parts)))
    r.tags()
    return out
