"""Reading an offset range over the Kafka protocol directly (``reader=wire``, the default).

Fetch v12 from the partition's leader (:mod:`headrace.spark.wire`), record batches decoded in
bulk into Arrow (:mod:`headrace.spark.batch_decode`): no per-record Python objects, against
~0.9 µs per record through confluent-kafka's ``consume()`` and ``Message`` methods. The
semantics are those of the confluent-kafka reader (``kafka_io.read_range``): records of the
range in offset order; records removed by retention are data loss (``failOnDataLoss``);
leader changes and broker restarts are retried until ``kafkaConsumer.pollTimeoutMs``.

Plaintext only: with ``security.protocol`` or SASL options the source uses the
confluent-kafka reader.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa  # type: ignore[import-untyped]
from kio.schema.errors import ErrorCode

from headrace.protocol.records import InvalidRecordError
from headrace.spark import wire
from headrace.spark.batch_decode import decode_fetched
from headrace.spark.offsets import OffsetRange

if TYPE_CHECKING:
    from headrace.spark.kafka_io import ReadSettings

log = logging.getLogger("headrace.spark")

FETCH_MAX_BYTES = 8 * 1024 * 1024
FETCH_MAX_WAIT_MS = 500

_RETRIABLE = {
    int(ErrorCode.not_leader_or_follower), int(ErrorCode.unknown_topic_or_partition),
    int(ErrorCode.leader_not_available), int(ErrorCode.fenced_leader_epoch),
    int(ErrorCode.unknown_leader_epoch), int(ErrorCode.kafka_storage_error),
    int(ErrorCode.replica_not_available), int(ErrorCode.request_timed_out),
    int(ErrorCode.not_coordinator), int(ErrorCode.offset_not_available),
}

_UNSUPPORTED_CONFIG = ("security.protocol", "sasl.mechanism", "sasl.mechanisms",
                       "ssl.ca.location")


def supports(config: dict[str, str]) -> bool:
    """Whether the wire reader can talk to the cluster ``config`` describes (plaintext)."""
    proto = config.get("security.protocol", "plaintext").lower()
    return proto == "plaintext" and not any(
        k in config for k in _UNSUPPORTED_CONFIG if k != "security.protocol"
    )


def read_range(r: OffsetRange, settings: ReadSettings) -> Iterator[pa.RecordBatch]:
    from headrace.spark.kafka_io import DataLossError, _gc_paused, arrow_schema

    config = dict(settings.config)
    timeout_s = max(float(config.get("socket.timeout.ms", "30000")) / 1000, 1.0)
    fetcher = wire.PartitionFetcher(config["bootstrap.servers"], r.topic, r.partition,
                                    timeout_s)
    schema = arrow_schema(settings.include_headers)
    next_offset = r.from_offset
    idle_since = time.monotonic()
    high = -1
    while next_offset < r.until_offset:
        waited_ms = (time.monotonic() - idle_since) * 1000
        if waited_ms > settings.poll_timeout_ms:
            raise TimeoutError(
                f"no records from {r.topic}-{r.partition} at offset {next_offset} for "
                f"{settings.poll_timeout_ms} ms (range ends at {r.until_offset}, "
                f"broker high watermark {high})"
            )
        try:
            res = fetcher.fetch(next_offset, FETCH_MAX_WAIT_MS, FETCH_MAX_BYTES)
        except (OSError, ConnectionError, LookupError, ValueError) as e:
            log.warning("fetching %s-%d: %s; retrying", r.topic, r.partition, e)
            time.sleep(0.2)
            continue
        high = res.high_watermark
        if res.error_code == int(ErrorCode.offset_out_of_range):
            low = res.log_start_offset
            if low < 0 or next_offset >= low:
                # Transient (e.g. the broker restarting): try again from the same offset.
                time.sleep(0.1)
                continue
            msg = (
                f"data loss in {r.topic}-{r.partition}: offsets [{next_offset}, "
                f"{min(low, r.until_offset)}) are gone from the broker (log start offset "
                f"{low}, high watermark {high}); set failOnDataLoss=false to skip them"
            )
            if settings.fail_on_data_loss:
                raise DataLossError(msg)
            log.warning("%s: skipping them (failOnDataLoss=false)", msg.split("; set")[0])
            next_offset = min(low, r.until_offset)
            idle_since = time.monotonic()
            continue
        if res.error_code in _RETRIABLE:
            log.info("fetching %s-%d: error %d; retrying", r.topic, r.partition, res.error_code)
            fetcher.forget_leader()
            time.sleep(0.1)
            continue
        if res.error_code:
            raise RuntimeError(f"fetching {r.topic}-{r.partition} at offset {next_offset}: "
                               f"{ErrorCode(res.error_code).name} ({res.error_code})")
        with _gc_paused():
            try:
                batch, after = decode_fetched(res.records, next_offset, r.until_offset,
                                              r.topic, r.partition, schema,
                                              settings.include_headers)
            except InvalidRecordError as e:
                raise RuntimeError(f"{r.topic}-{r.partition} at offset {next_offset}: "
                                   f"corrupt record batch from the broker: {e}") from e
        del res
        progressed = after > next_offset
        if progressed:
            next_offset = after
            idle_since = time.monotonic()
        if batch is not None:
            yield batch
            continue
        if progressed:
            continue  # through control batches only
        if high >= 0 and high >= r.until_offset and waited_ms > 1000:
            # Nothing at next_offset although the log goes past the range's end: the rest of
            # the range holds no records (control records, compaction).
            log.info("%s-%d: no records in [%d, %d); range done", r.topic, r.partition,
                     next_offset, r.until_offset)
            return
        if high >= 0 and high > next_offset:
            time.sleep(0.05)  # the broker answers at once: do not spin
