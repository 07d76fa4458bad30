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
    client: ``list_offsets`` drops its cached one to refresh metadata); with
    ``as_invalid_offset``, no error but offset -1001 (librdkafka's "invalid"), as seen while
    a killed leader's partition moved."""

    calls: list[set[tuple[str, int]]] = []

    def __init__(self, leaderless: set[int], rounds_without_leader: int,
                 as_invalid_offset: bool = False,
                 code: int = KafkaError.LEADER_NOT_AVAILABLE) -> None:
        self.leaderless = leaderless
        self.rounds = rounds_without_leader
        self.as_invalid_offset = as_invalid_offset
        self.code = code

    def list_offsets(self, request: dict[Any, Any], request_timeout: float) -> dict[Any, Any]:
        asked = {(ktp.topic, ktp.partition) for ktp in request}
        LeaderlessAdmin.calls.append(asked)
        out: dict[Any, Future[Any]] = {}
        for ktp in request:
            fut: Future[Any] = Future()
            if ktp.partition in self.leaderless and len(LeaderlessAdmin.calls) <= self.rounds:
                if self.as_invalid_offset:
                    fut.set_result(type("Info", (), {"offset": -1001})())
                else:
                    fut.set_exception(KafkaException(KafkaError(self.code)))
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


@pytest.mark.parametrize("as_invalid_offset", [False, True])
def test_first_offsets_wait_for_a_partition_without_a_leader(
        monkeypatch: pytest.MonkeyPatch, as_invalid_offset: bool) -> None:
    """Partition 1 answers only on the third round: the initial offset has both partitions
    (a KeyError in ``resolve`` before the retry, or offset -1001 taken as an answer)."""
    reader = stream_reader(monkeypatch, LeaderlessAdmin({1}, rounds_without_leader=2,
                                                        as_invalid_offset=as_invalid_offset))
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


@pytest.mark.parametrize("as_invalid_offset", [False, True])
def test_a_micro_batch_leaves_a_leaderless_partition_for_the_next(
        monkeypatch: pytest.MonkeyPatch, as_invalid_offset: bool) -> None:
    """While a leader moves, a micro-batch does not wait for it: the partition keeps its
    offset and the next batch asks again (an offset of -1001 was reported as data loss,
    "latest offset -1001 is below the offset already read", by the cluster demo)."""
    reader = stream_reader(monkeypatch, LeaderlessAdmin({1}, rounds_without_leader=10**6,
                                                        as_invalid_offset=as_invalid_offset))
    start = {TOPIC: {"0": 0, "1": 3}}
    monkeypatch.setattr(reader, "_commit_to_group", lambda _start: None)
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end[TOPIC] == {"0": 5, "1": 3}
    assert len(LeaderlessAdmin.calls) == 1


@pytest.mark.parametrize("code", [
    KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError._TRANSPORT])
def test_what_a_moving_leader_answers_is_asked_again(monkeypatch: pytest.MonkeyPatch,
                                                     code: int) -> None:
    """The --cluster demo kills a leader mid-run: a ListOffsets to it times out, the new
    one may not know its epoch or high watermark yet; each is asked again (Kafka's clients
    retry them), not a failed query."""
    reader = stream_reader(monkeypatch, LeaderlessAdmin({1}, rounds_without_leader=2,
                                                        code=code))
    assert reader.initialOffset()[TOPIC] == {"0": 5, "1": 15}


def test_an_error_that_is_not_a_moving_leader_fails_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reader = stream_reader(monkeypatch, LeaderlessAdmin(
        {1}, rounds_without_leader=2, code=KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaException):
        reader.initialOffset()
