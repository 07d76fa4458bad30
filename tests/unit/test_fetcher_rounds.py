"""A follower's round costs what changed (``cluster/replica_fetcher.py``; issue 21 item 5,
R-REP-3): after the session's full fetch, an incremental Fetch names only the partitions
whose position moved (an append, a truncation) or that were added again with a new state,
and forgets the removed ones; an answer for a partition replaced while the request was
out is not applied to the new one."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace as NS
from typing import Any

from headrace.broker.replica_manager import TopicPartition
from headrace.cluster.client import BrokerConnection
from headrace.cluster.replica_fetcher import Fetcher, FetchState
from headrace.protocol.codec import (
    FetchPartition,
    decode_request,
    encode_fetch_body,
    encode_response_chunks,
)

LEADER, ME = 1, 2


class FakeLog:
    def __init__(self, leo: int) -> None:
        self.log_end_offset = leo
        self.log_start_offset = 0
        self.high_watermark = leo
        self.leader_epochs = [(3, 0)]
        self.offline = None
        self.appended: list[bytes] = []

    def append_as_follower(self, records: bytes) -> None:
        self.appended.append(records)
        self.log_end_offset += 1

    def latest_epoch(self) -> int:
        return 3


class FakeConnection:
    """Answers every Fetch with the session id 7 and the ``answer`` partitions (records),
    over the wire's bytes: the request as the broker decodes it, the answer as the broker
    encodes it."""

    client_id = "follower"
    read_response = BrokerConnection.read_response  # kio's reader, as the real connection

    def close(self) -> None:
        pass

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answer: list[tuple[str, int]] = []
        self._correlation = 0

    def next_correlation_id(self) -> int:
        self._correlation += 1
        return self._correlation

    async def request(self, api_key: int, version: int, body: dict[str, Any],
                      timeout_s: float) -> Any:
        raise AssertionError(f"unexpected request (API key {api_key})")

    async def exchange(self, frame: bytes, timeout_s: float) -> bytes:
        req = decode_request(frame[4:])
        assert req.header.api_key == 1 and req.header.api_version == 12
        b = req.body
        self.requests.append({
            "session_epoch": int(b.session_epoch),
            "topics": [{"topic": str(t.topic), "partitions": [
                {"partition": int(p.partition), "fetch_offset": int(p.fetch_offset)}
                for p in t.partitions]} for t in b.topics],
            "forgotten_topics_data": [{"topic": str(t.topic), "partitions": [
                int(i) for i in t.partitions]} for t in b.forgotten_topics_data]})
        by_topic: dict[str, list[FetchPartition]] = {}
        for topic, index in self.answer:
            p = FetchPartition(index, 0, None)
            p.high_watermark = p.last_stable_offset = p.log_start_offset = 0
            p.records, p.records_size = [b"batch"], 5
            by_topic.setdefault(topic, []).append(p)
        self.answer = []
        body = encode_fetch_body(12, 0, 0, 7, list(by_topic.items()))
        return b"".join(encode_response_chunks(1, 12, req.header.correlation_id, body))[4:]


def named(body: dict[str, Any]) -> set[tuple[str, int]]:
    return {(t["topic"], p["partition"]) for t in body["topics"] for p in t["partitions"]}


def forgotten(body: dict[str, Any]) -> set[tuple[str, int]]:
    return {(t["topic"], i) for t in body["forgotten_topics_data"] for i in t["partitions"]}


def make(n: int) -> tuple[Fetcher, dict[TopicPartition, Any]]:
    parts = {TopicPartition("t", i): NS(tp=TopicPartition("t", i), leading=False,
                                        log=FakeLog(10)) for i in range(n)}
    config = {"replica.fetch.wait.max.ms": "500", "replica.fetch.min.bytes": "1",
              "replica.fetch.max.bytes": "1048576",
              "replica.fetch.response.max.bytes": "10485760",
              "replica.fetch.backoff.ms": "1000", "request.timeout.ms": "30000",
              "num.replica.fetchers": "1"}
    manager = NS(node_id=ME, config=config, replicas=NS(get=parts.get))
    f = Fetcher(manager, LEADER, 0)  # type: ignore[arg-type]
    for tp in parts:
        f.add(tp, FetchState(LEADER, 3))
    return f, parts


def test_incremental_rounds_name_only_what_moved() -> None:
    async def run() -> None:
        f, parts = make(500)
        conn = FakeConnection()
        await f._truncate(conn)  # type: ignore[arg-type]
        await f._fetch(conn)  # type: ignore[arg-type]
        assert len(named(conn.requests[-1])) == 500  # the session's full fetch
        assert conn.requests[-1]["session_epoch"] == 0
        await f._fetch(conn)  # type: ignore[arg-type]
        assert named(conn.requests[-1]) == set() and forgotten(conn.requests[-1]) == set()
        # the leader sends records for partition 4: its position moves, and only it is named
        conn.answer = [("t", 4)]
        await f._fetch(conn)  # type: ignore[arg-type]
        assert parts[TopicPartition("t", 4)].log.appended == [b"batch"]
        await f._fetch(conn)  # type: ignore[arg-type]
        body = conn.requests[-1]
        assert named(body) == {("t", 4)}
        assert body["topics"][0]["partitions"][0]["fetch_offset"] == 11
        # removed: forgotten; added again with a new state at the same position: named
        f.remove(TopicPartition("t", 9))
        await f._fetch(conn)  # type: ignore[arg-type]
        assert forgotten(conn.requests[-1]) == {("t", 9)}
        f.add(TopicPartition("t", 9), FetchState(LEADER, 3))
        await f._truncate(conn)  # type: ignore[arg-type]
        await f._fetch(conn)  # type: ignore[arg-type]
        assert named(conn.requests[-1]) == {("t", 9)}
        # replaced while its request was out: the answer is not applied to the new state
        conn.answer = [("t", 9)]
        old_exchange = conn.exchange

        async def replaced_meanwhile(*args: Any) -> Any:
            resp = await old_exchange(*args)
            f.remove(TopicPartition("t", 9))
            f.add(TopicPartition("t", 9), FetchState(LEADER, 4))
            return resp

        conn.exchange = replaced_meanwhile  # type: ignore[method-assign]
        f._unsent.add(TopicPartition("t", 9))
        f._sent.pop(TopicPartition("t", 9))
        await f._fetch(conn)  # type: ignore[arg-type]
        assert parts[TopicPartition("t", 9)].log.appended == []

    asyncio.run(run())


def test_a_failed_request_names_its_partitions_again() -> None:
    async def run() -> None:
        f, parts = make(5)
        conn = FakeConnection()
        await f._truncate(conn)  # type: ignore[arg-type]
        await f._fetch(conn)  # type: ignore[arg-type]
        parts[TopicPartition("t", 2)].log.log_end_offset = 12
        f._stale.add(TopicPartition("t", 2))

        async def fail(*args: Any) -> Any:
            raise OSError("connection reset")

        ok = conn.exchange
        conn.exchange = fail  # type: ignore[method-assign]
        with contextlib.suppress(OSError):
            await f._fetch(conn)  # type: ignore[arg-type]
        conn.exchange = ok  # type: ignore[method-assign]
        await f._fetch(conn)  # type: ignore[arg-type]
        assert named(conn.requests[-1]) == {("t", 2)}

    asyncio.run(run())
