"""The transaction verifier's queue to a coordinator on another broker (issue 23; Kafka's
``AddPartitionsToTxnManager``), driven with a fake connection: one AddPartitionsToTxn v4
``verify_only`` request in flight per coordinator broker, what arrives meanwhile batched
into the next; a request of the same producer joins the queued one, a newer epoch fences
it; PRODUCER_FENCED is passed on as INVALID_PRODUCER_EPOCH; a failed connection answers
every waiter NETWORK_EXCEPTION."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from headrace.broker.txn_verification import TxnVerifier
from headrace.cluster.client import BrokerConnectionError

REMOTE = 2


class FakeConn:
    """Answers each request when the test releases it; records what was asked."""

    def __init__(self, known: dict[str, set[tuple[str, int]]]) -> None:
        self.known = known
        self.requests: list[list[Any]] = []
        self.release: asyncio.Queue[str] = asyncio.Queue()
        self.connected = True

    async def request(self, api_key: int, version: int, body: dict[str, Any],
                      timeout_s: float) -> Any:
        assert (api_key, version) == (24, 4)
        self.requests.append(body["transactions"])
        if await self.release.get() == "fail":
            raise BrokerConnectionError("connection reset")
        results = []
        for txn in body["transactions"]:
            assert txn["verify_only"] is True
            parts = self.known.get(txn["transactional_id"], set())
            code = (ErrorCode.producer_fenced if txn["producer_epoch"] != 0
                    else None)
            results.append(SimpleNamespace(
                transactional_id=txn["transactional_id"],
                topic_results=[SimpleNamespace(name=t["name"], results_by_partition=[
                    SimpleNamespace(partition_index=p, partition_error_code=(
                        code or (ErrorCode.none if (t["name"], p) in parts
                                 else ErrorCode.invalid_txn_state)))
                    for p in t["partitions"]]) for t in txn["topics"]]))
        return SimpleNamespace(error_code=ErrorCode.none, results_by_transaction=results)

    def close(self) -> None:
        self.connected = False


def verifier(conn: FakeConn) -> TxnVerifier:
    broker = SimpleNamespace(node_id=1, config={"request.timeout.ms": 30_000},
                             track=lambda task: None)
    txns = SimpleNamespace(broker=broker,
                           coordinator_node=lambda tid, create=True: REMOTE)
    v = TxnVerifier(txns)  # type: ignore[arg-type]

    async def connection(node: int) -> FakeConn:
        assert node == REMOTE
        return conn
    v._connection = connection  # type: ignore[assignment,method-assign]
    return v


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_one_request_in_flight_per_coordinator_the_rest_batched() -> None:
    async def scenario() -> None:
        conn = FakeConn({"a": {("t", 0)}, "b": {("t", 1)}})
        v = verifier(conn)
        first = asyncio.ensure_future(v.verify("a", 10, 0, [("t", 0), ("t", 5)]))
        await _settle()
        assert len(conn.requests) == 1  # in flight
        b1 = asyncio.ensure_future(v.verify("b", 11, 0, [("t", 1)]))
        b2 = asyncio.ensure_future(v.verify("b", 11, 0, [("t", 2)]))  # joins b1
        c_old = asyncio.ensure_future(v.verify("c", 12, 0, [("t", 3)]))
        c_new = asyncio.ensure_future(v.verify("c", 12, 1, [("t", 3)]))  # fences c_old
        c_older = asyncio.ensure_future(v.verify("c", 12, 0, [("t", 4)]))  # fenced at once
        await _settle()
        assert await c_old == {("t", 3): ErrorCode.invalid_producer_epoch}
        assert await c_older == {("t", 4): ErrorCode.invalid_producer_epoch}
        assert len(conn.requests) == 1
        conn.release.put_nowait("ok")
        assert await first == {("t", 5): ErrorCode.invalid_txn_state}
        await _settle()
        assert len(conn.requests) == 2  # everything queued meanwhile, in one request
        assert sorted((t["transactional_id"], t["producer_epoch"],
                       [(x["name"], p) for x in t["topics"] for p in x["partitions"]])
                      for t in conn.requests[1]) == [
            ("b", 0, [("t", 1), ("t", 2)]), ("c", 1, [("t", 3)])]
        conn.release.put_nowait("ok")
        assert await b1 == {}
        assert await b2 == {("t", 2): ErrorCode.invalid_txn_state}
        # the coordinator's PRODUCER_FENCED, as Kafka's manager passes it on
        assert await c_new == {("t", 3): ErrorCode.invalid_producer_epoch}

    asyncio.run(scenario())


def test_a_failed_connection_answers_every_waiter() -> None:
    async def scenario() -> None:
        conn = FakeConn({"a": {("t", 0)}})
        v = verifier(conn)
        a = asyncio.ensure_future(v.verify("a", 10, 0, [("t", 0)]))
        await _settle()
        b = asyncio.ensure_future(v.verify("b", 11, 0, [("t", 1)]))
        conn.release.put_nowait("fail")
        assert await a == {("t", 0): ErrorCode.network_exception}
        conn.release.put_nowait("ok")  # the next request goes out and is answered
        assert await b == {("t", 1): ErrorCode.invalid_txn_state}
        v.close()

    asyncio.run(scenario())
