"""PURE: the keys and values of ``__transaction_state`` records, in Kafka's own formats.

Kafka's transaction coordinator keeps one record per transactional id in the compacted
``__transaction_state`` topic (R-PROD-2, issue 10): the latest value is the id's state,
a null value (tombstone) means the id expired. We write what Kafka writes, so tools that
read the topic decode it, and read both versions Kafka has written
(``transaction-coordinator/src/main/resources/common/message/TransactionLog{Key,Value}
.json``)::

    TransactionLogKey v0 (the record key)
      int16   version (0)
      string  transactionalId

    TransactionLogValue (the record value)     v0                  v1 (flexible)
      int16   version                          x                   x
      int64   producerId                       x                   x
      int16   producerEpoch                    x                   x
      int32   transactionTimeoutMs             x                   x
      int8    transactionStatus                x                   x
      nullable array transactionPartitions     int32 count (-1)    uvarint count+1 (0)
        string topic                           int16 length        uvarint length+1
        array  partitionIds (int32)            int32 count         uvarint count+1
        tagged fields                                              x
      int64   transactionLastUpdateTimestampMs x                   x
      int64   transactionStartTimestampMs      x                   x
      tagged fields                                                tag 0 previousProducerId
                                                                   tag 1 nextProducerId
                                                                   tag 2 clientTransactionVersion

A tagged field is written only when it differs from its default (-1, -1, 0), as Kafka's
generated writers do. The partition list is null in the Empty state and grouped by topic
otherwise (Kafka's ``TransactionLog.valueToBytes``). Every read is bounds-checked
(``TxnRecordError``); unknown tags are skipped.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from headrace.group.records import (
    _INT8,
    _INT16,
    _INT32,
    _INT64,
    _compact_array,
    _compact_string,
    _Reader,
    _string,
)
from headrace.protocol.records import encode_uvarint

KEY_VERSION = 0
VALUE_VERSIONS = (0, 1)


class TxnRecordError(ValueError):
    """A ``__transaction_state`` key or value that cannot be decoded."""


class TxnState(enum.IntEnum):
    """Kafka's ``TransactionState`` ids, as stored in ``transactionStatus``."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7


@dataclass(frozen=True, slots=True)
class TxnLogValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    # topic -> sorted partition ids; None only in the Empty state
    partitions: dict[str, tuple[int, ...]] | None
    last_update_ms: int
    start_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0
    extra_tags: tuple[tuple[int, bytes], ...] = field(default=(), compare=False)


def encode_key(transactional_id: str) -> bytes:
    return _INT16.pack(KEY_VERSION) + _string(transactional_id)


def decode_key(data: bytes) -> str:
    r = _reader(data, False)
    try:
        version = r.int16()
        if version != KEY_VERSION:
            raise TxnRecordError(f"unknown TransactionLogKey version {version}")
        tid = r.string()
    except TxnRecordError:
        raise
    except ValueError as e:  # the shared reader's GroupRecordError
        raise TxnRecordError(str(e)) from None
    if r.pos != len(data):
        raise TxnRecordError(f"{len(data) - r.pos} byte(s) after the TransactionLogKey")
    return tid


def encode_value(value: TxnLogValue | None, version: int = 1) -> bytes | None:
    """The record value (None: a tombstone). Version 1 is what Kafka 3.8+ writes once the
    transaction version feature allows flexible records; 0 what older brokers wrote."""
    if value is None:
        return None
    if version not in VALUE_VERSIONS:
        raise ValueError(f"TransactionLogValue version {version}")
    if value.state == TxnState.EMPTY and value.partitions:
        raise ValueError("the Empty state holds no partitions")
    flexible = version == 1
    out = bytearray(_INT16.pack(version))
    out += _INT64.pack(value.producer_id) + _INT16.pack(value.producer_epoch)
    out += _INT32.pack(value.timeout_ms) + _INT8.pack(int(value.state))
    parts = None if value.state == TxnState.EMPTY else (value.partitions or {})
    if flexible:
        if parts is None:
            out += b"\x00"
        else:
            out += _compact_array([
                _compact_string(topic)
                + _compact_array([_INT32.pack(p) for p in ids]) + b"\x00"
                for topic, ids in sorted(parts.items())])
    elif parts is None:
        out += _INT32.pack(-1)
    else:
        out += _INT32.pack(len(parts))
        for topic, ids in sorted(parts.items()):
            out += _string(topic) + _INT32.pack(len(ids))
            out += b"".join(_INT32.pack(p) for p in ids)
    out += _INT64.pack(value.last_update_ms) + _INT64.pack(value.start_ms)
    if flexible:
        tags = []
        if value.previous_producer_id != -1:
            tags.append((0, _INT64.pack(value.previous_producer_id)))
        if value.next_producer_id != -1:
            tags.append((1, _INT64.pack(value.next_producer_id)))
        if value.client_transaction_version != 0:
            tags.append((2, _INT16.pack(value.client_transaction_version)))
        out += encode_uvarint(len(tags))
        for tag, data in tags:
            out += encode_uvarint(tag) + encode_uvarint(len(data)) + data
    return bytes(out)


def decode_value(data: bytes | None) -> TxnLogValue | None:
    """A record value; None for a tombstone."""
    if data is None:
        return None
    if len(data) < 2:
        raise TxnRecordError(f"a TransactionLogValue of {len(data)} byte(s)")
    version = _reader(data, False).int16()
    if version not in VALUE_VERSIONS:
        raise TxnRecordError(f"unknown TransactionLogValue version {version}")
    r = _reader(data, version == 1)
    r.pos = 2
    try:
        producer_id, epoch, timeout = r.int64(), r.int16(), r.int32()
        raw_state = r.int8()
        try:
            state = TxnState(raw_state)
        except ValueError:
            raise TxnRecordError(f"unknown transaction status {raw_state}") from None
        count = r._length(True)
        parts: dict[str, tuple[int, ...]] | None
        if count < -1:
            raise TxnRecordError(f"bad partition count {count}")
        if count == -1:
            parts = None
        else:
            parts = {}
            for _ in range(count):
                topic = r.string()
                ids = tuple(r.int32() for _ in range(r.array_count()))
                r.tagged_fields()
                parts[topic] = tuple(sorted(set(parts.get(topic, ())) | set(ids)))
        last_update, start = r.int64(), r.int64()
        prev, nxt, ctv = -1, -1, 0
        extra: list[tuple[int, bytes]] = []
        if version == 1:
            for _ in range(r.uvarint()):
                tag, size = r.uvarint(), r.uvarint()
                raw = r._take(size)
                sub = _reader(raw, False)
                if tag == 0 and size == 8:
                    prev = sub.int64()
                elif tag == 1 and size == 8:
                    nxt = sub.int64()
                elif tag == 2 and size == 2:
                    ctv = sub.int16()
                else:
                    extra.append((tag, raw))
    except TxnRecordError:
        raise
    except ValueError as e:  # the shared reader's GroupRecordError
        raise TxnRecordError(str(e)) from None
    if r.pos != len(data):
        raise TxnRecordError(f"{len(data) - r.pos} byte(s) after the TransactionLogValue")
    return TxnLogValue(producer_id, epoch, timeout, state, parts, last_update, start,
                       prev, nxt, ctv, tuple(extra))


def _reader(data: bytes, flexible: bool) -> _Reader:
    return _Reader(bytes(data), flexible)
