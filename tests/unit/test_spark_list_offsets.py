"""The source's ListOffsets on a cluster whose new partitions have no leader yet (the
``--cluster`` demo's race): the first offsets of a stream wait for every partition, within
``fetchOffset.timeoutMs``, and then fail naming the partitions; never a KeyError."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from headrace.spark import kafka_io
from headrace.spark.source import HeadraceStreamReader, SourceOptions

TOPIC = "headrace-demo-sentences"


class LeaderlessAdmin:
    """An admin client whose ListOffsets answers "leader not available" for the partitions
    in ``leaderless`` for the first ``rounds_without_leader`` calls (each call is a fresh
    client: ``list_offsets`` drops its cached one to refresh metadata)."""

    calls: list[set[tuple[str, int]]] = []

    def __init__(self, leaderless: set[int], rounds_without_leader: int) -> None:
        self.leaderless = leaderless
        self.rounds = rounds_without_leader

    def list_offsets(self, request: dict[Any, Any], request_timeout: float) -> dict[Any, Any]:
        asked = {(ktp.topic, ktp.partition) for ktp in request}
        LeaderlessAdmin.calls.append(asked)
        out: dict[Any, Future[Any]] = {}
        for ktp in request:
            fut: Future[Any] = Future()
            if ktp.partition in self.leaderless and len(LeaderlessAdmin.calls) <= self.rounds:
                fut.set_exception(KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE)))
            else:
                fut.set_result(type("Info", (), {"offset": 10 * ktp.partition + 5})())
            out[ktp] = fut
        return out


def stream_reader(monkeypatch: pytest.MonkeyPatch, admin: LeaderlessAdmin,
                  timeout_ms: int = 30_000) -> HeadraceStreamReader:
    LeaderlessAdmin.calls = []
    monkeypatch.setattr(kafka_io, "admin", lambda _config: admin)
    monkeypatch.setattr(kafka_io, "topic_partitions", lambda _config, _t: {TOPIC: 2})
    return HeadraceStreamReader(SourceOptions.parse(
        {"kafka.bootstrap.servers": "localhost:1", "subscribe": TOPIC,
         "startingOffsets": "latest", "fetchOffset.timeoutMs": str(timeout_ms)}, "latest"))


def test_first_offsets_wait_for_a_partition_without_a_leader(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Partition 1 answers only on the third round: the initial offset has both partitions
    (a KeyError in ``resolve`` before the retry)."""
    reader = stream_reader(monkeypatch, LeaderlessAdmin({1}, rounds_without_leader=2))
    offsets = reader.initialOffset()
    assert offsets[TOPIC] == {"0": 5, "1": 15}
    # "earliest" (asked first) was asked three times for partition 1, once for partition 0
    assert LeaderlessAdmin.calls[:3] == [{(TOPIC, 0), (TOPIC, 1)}, {(TOPIC, 1)}, {(TOPIC, 1)}]


def test_a_partition_that_never_gets_a_leader_fails_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reader = stream_reader(monkeypatch, LeaderlessAdmin({1}, rounds_without_leader=10**6),
                           timeout_ms=1_000)
    with pytest.raises(kafka_io.OffsetsUnavailableError,
                       match=rf"no earliest offset for {TOPIC}-1 within 1 s"):
        reader.initialOffset()


def test_a_micro_batch_leaves_a_leaderless_partition_for_the_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While a leader moves, a micro-batch does not wait for it: the partition keeps its
    offset and the next batch asks again."""
    reader = stream_reader(monkeypatch, LeaderlessAdmin({1}, rounds_without_leader=10**6))
    start = {TOPIC: {"0": 0, "1": 3}}
    monkeypatch.setattr(reader, "_commit_to_group", lambda _start: None)
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end[TOPIC] == {"0": 5, "1": 3}
    assert len(LeaderlessAdmin.calls) == 1
