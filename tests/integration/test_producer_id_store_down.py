"""InitProducerId while no producer id block can be reserved (ZooKeeper unreachable, the
metadata database unwritable): COORDINATOR_LOAD_IN_PROGRESS, which clients retry, on the
same connection, with one log line and no error; ids again once the store answers (as a
KRaft broker answers while its block is not there yet). Before, the store's exception
escaped the handler and closed the connection (an ERROR line in
``test_network_partitions``' ZooKeeper blip)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from headrace.metadata.store import MetadataWriteError
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient


def test_init_producer_id_answers_retriable_while_no_block_can_be_reserved(
        tmp_path: Path) -> None:
    broker = InProcessBroker(tmp_path / "data").start()
    try:
        def break_store(b: Any) -> None:
            store = b.producer_ids._store
            real = store.allocate_producer_ids
            calls = {"n": 0}

            def failing(count: int) -> int:
                calls["n"] += 1
                if calls["n"] <= 2:
                    raise MetadataWriteError("ZooKeeper unreachable (test)")
                return int(real(count))

            store.allocate_producer_ids = failing
            b.producer_ids._next = b.producer_ids._end  # the next id needs a new block

        broker.call(break_store)
        body = {"transactional_id": None, "transaction_timeout": 60000,
                "producer_id": -1, "producer_epoch": -1}
        with WireClient.to(broker.bootstrap) as c:
            first = c.request(22, 4, body)
            assert first.error_code == ErrorCode.coordinator_load_in_progress
            assert (first.producer_id, first.producer_epoch) == (-1, -1)
            again = c.request(22, 4, body)  # the same connection: still open
            assert again.error_code == ErrorCode.coordinator_load_in_progress
            ok = c.request(22, 4, body)
            assert ok.error_code == ErrorCode.none and ok.producer_id >= 0
        warnings = [line for line in broker.stderr_lines
                    if "COORDINATOR_LOAD_IN_PROGRESS" in line]
        assert len(warnings) == 1  # one line, not one per retry
        assert not [line for line in broker.stderr_lines if "level=ERROR" in line]
    finally:
        broker.stop()
