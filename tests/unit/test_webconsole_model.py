"""The web console's pure parts (``headrace.webconsole.model``): request validation, lag,
rates from high-watermark samples, bounded series; and the sampler's handling of a cluster
that stops answering (``server.Console`` with a fake source)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from headrace.webconsole import model
from headrace.webconsole.model import (
    AppendRate,
    BadRequest,
    Samples,
    Series,
    Unavailable,
    is_stale,
    message_query,
    new_topic_request,
    partition_lag,
    topic_name,
    total_lag,
)

# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("name", ["a", "orders.v1", "A_b-9", "x" * 249, "..."])
def test_valid_topic_names(name: str) -> None:
    assert topic_name(name) == name


@pytest.mark.parametrize(("name", "words"), [
    ("", "required"), (None, "required"), (5, "required"), (".", "cannot be named"),
    ("..", "cannot be named"), ("x" * 250, "at most 249"), ("a b", "may contain only"),
    ("a/b", "may contain only"), ("é", "may contain only"), ("a\n", "may contain only"),
])
def test_invalid_topic_names_say_why(name: Any, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        topic_name(name)


def test_group_ids() -> None:
    assert model.group_id("g 1/é") == "g 1/é"
    for bad in ("", "x" * 256, "a\x00b", None):
        with pytest.raises(BadRequest):
            model.group_id(bad)


@pytest.mark.parametrize(("value", "ok"), [
    ("5", 5), (5, 5), (5.0, 5), (" 7 ", 7), ("+3", 3), ("0", 0),
    ("-1", None), ("501", None), (True, None), (5.5, None), ("1e3", None), ("", None),
    ("9" * 30, None), (None, None), ([1], None),
])
def test_int_values(value: Any, ok: int | None) -> None:
    if ok is None:
        with pytest.raises(BadRequest):
            model.int_value(value, "n", 0, 500)
    else:
        assert model.int_value(value, "n", 0, 500) == ok


def test_message_query_defaults_and_modes() -> None:
    q = message_query({"topic": "t"})
    assert (q.partition, q.limit, q.offset, q.timestamp_ms) == (0, 50, None, None)
    q = message_query({"topic": "t", "partition": "2", "offset": "10", "limit": "500"})
    assert (q.partition, q.offset, q.limit) == (2, 10, 500)
    assert message_query({"topic": "t", "timestamp": "1700000000000"}).timestamp_ms == (
        1700000000000)
    assert message_query({"topic": "t", "offset": ""}).offset is None  # an empty field
    for bad in ({"topic": "t", "offset": "1", "timestamp": "2"}, {"topic": "t", "limit": "0"},
                {"topic": "t", "limit": "501"}, {"topic": "t", "offset": "-5"},
                {"topic": "t", "partition": "10000"}, {"partition": "0"}):
        with pytest.raises(BadRequest):
            message_query(bad)


def test_new_topic_request() -> None:
    req = new_topic_request({"name": "t", "partitions": 3, "replication_factor": "1",
                             "configs": {"retention.ms": 1000, "cleanup.policy": "compact"}})
    assert req == model.NewTopicRequest("t", 3, 1, {"retention.ms": "1000",
                                                    "cleanup.policy": "compact"})
    assert new_topic_request({"name": "t"}) == model.NewTopicRequest("t", None, None, {})
    for bad, words in (([], "JSON object"), ({"name": "t", "x": 1}, "unknown field"),
                       ({"name": "t", "partitions": 0}, "partitions"),
                       ({"name": "t", "partitions": 10_001}, "partitions"),
                       ({"name": "t", "replication_factor": 33}, "replication_factor"),
                       ({"name": "t", "configs": []}, "configs"),
                       ({"name": "t", "configs": {"A": "1"}}, "config name"),
                       ({"name": "t", "configs": {"a": None}}, "string or an integer"),
                       ({"name": "t", "configs": {"a": True}}, "string or an integer"),
                       ({"name": "t", "configs": {f"k{i}": "v" for i in range(101)}},
                        "at most 100"),
                       ({"name": "a b"}, "may contain only")):
        with pytest.raises(BadRequest, match=words):
            new_topic_request(bad)


# ------------------------------------------------------------------ lag


def test_lag() -> None:
    assert partition_lag(5, 12) == 7
    assert partition_lag(12, 12) == 0
    assert partition_lag(15, 12) == 0  # a commit past the end (log truncated): no lag
    assert partition_lag(-1001, 12) is None  # nothing committed
    committed = {("t", 0): 5, ("t", 1): -1001, ("u", 0): 3}
    assert total_lag(committed, {("t", 0): 12, ("t", 1): 40}) == 7  # u-0: no watermark


# ------------------------------------------------------------------ series


def test_series_is_a_bounded_ring_moving_forward() -> None:
    s = Series(3)
    for t in (1000, 2000, 2000, 1500, 3000, 4000):
        s.append(t, t / 1000)
    assert s.doc() == {"t": [2000, 3000, 4000], "v": [2.0, 3.0, 4.0]}
    with pytest.raises(ValueError):
        Series(0)


def test_append_rate_from_high_watermark_samples() -> None:
    r = AppendRate(10)
    assert r.sample(1000, {0: 100}) is None  # the first sample: no rate yet
    assert r.sample(3000, {0: 500}) == 200.0  # 400 offsets in 2 s
    assert r.sample(3000, {0: 900}) is None  # the same time again: ignored
    assert r.sample(2000, {0: 0}) is None  # a sample from the past changes nothing
    assert r.sample(4000, {0: 500}) == 0.0
    assert r.sample(5000, {0: 500, 1: 40}) == 0.0  # a new partition: counted from now
    assert r.sample(5500, {0: 550, 1: 40}) == 100.0
    assert r.series.doc() == {"t": [3000, 4000, 5000, 5500], "v": [200.0, 0.0, 0.0, 100.0]}


def test_no_phantom_throughput_across_a_leader_change() -> None:
    """Issue 26: after a leader change the console plotted 512 records/s while nothing
    was produced. Partitions without a leader drop out of a sample and come back; a new
    leader's high watermark can be behind the old one's for a moment: neither is an
    append."""
    r = AppendRate(10)
    r.sample(1000, {0: 256, 1: 256, 2: 100})
    assert r.sample(2000, {2: 100}) == 0.0  # 0 and 1 have no leader (their broker died)
    assert r.sample(3000, {0: 250, 1: 256, 2: 100}) == 0.0  # back; 0's new leader lags
    assert r.sample(4000, {0: 256, 1: 256, 2: 100}) == 0.0  # 0's high watermark catches up
    assert r.sample(5000, {0: 266, 1: 256, 2: 100}) == 10.0  # records really produced
    assert max(r.series.doc()["v"]) == 10.0


def test_stale_counts() -> None:
    assert not is_stale(10_000, None, 2.0)  # nothing sampled yet: nothing shown
    assert not is_stale(10_000, 5_000, 2.0)  # a sample in progress
    assert is_stale(10_000, 4_999, 2.0)  # more than two intervals and a second
    assert is_stale(40_000, 10_000, 2.0)  # the 25-30 s


def test_samples_follow_topics_and_groups_and_stay_bounded() -> None:
    s = Samples(capacity=5, max_series=2)
    s.record(1000, {"a": {0: 0}, "b": {0: 0}, "c": {0: 0}}, {"g": 4})
    s.record(2000, {"a": {0: 10}, "b": {0: 20}, "c": {0: 30}}, {"g": 6, "h": 1})
    assert set(s.throughput) == {"a", "b"}  # at most two series: the first by name
    assert s.throughput_doc()["b"] == {"t": [2000], "v": [20.0]}
    assert s.lag_doc("g") == {"t": [1000, 2000], "v": [4, 6]}
    s.record(3000, {"b": {0: 40}, "c": {0: 60}}, {"h": 2})  # a and g are gone: their series
    assert set(s.throughput) == {"b", "c"}
    assert s.throughput_doc()["c"] == {"t": [], "v": []}  # c's first sample
    assert s.lag_doc("g") is None
    s.record(3500, {"b": {0: 40}, "c": {0: 60}}, {"h": None})  # h's lag unknown this time
    assert s.lag_doc("h") == {"t": [2000, 3000], "v": [1, 2]}  # kept, no point added
    for i in range(10):
        s.record(4000 + i * 1000, {"b": {0: 40 + i}}, {"h": 2})
    assert len(s.throughput["b"].series) == 5


# ------------------------------------------------------------------ the sampler


class FakeSource:
    """A cluster that answers, then does not, then answers again; then breaks."""

    bootstrap = "127.0.0.1:9"
    timeout_s = 1.0

    def __init__(self) -> None:
        self.answers: list[Any] = []
        self.calls = 0

    def snapshot(self) -> dict[str, Any]:
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else self.answers_default()
        if isinstance(answer, BaseException):
            raise answer
        return dict(answer)

    def answers_default(self) -> Any:
        return RuntimeError("a bug")


def _snap(t: int, offsets: int, lag: int) -> dict[str, Any]:
    return {"time_ms": t, "cluster": {}, "topics": [
        {"name": "t", "internal": False, "high_watermark_sum": offsets},
        {"name": "__consumer_offsets", "internal": True, "high_watermark_sum": 1}],
        "groups": [{"group": "g", "lag": lag}], "high_watermarks": {"t": {0: offsets}}}


async def test_sampler_keeps_the_last_snapshot_and_dies_on_a_bug(
        caplog: pytest.LogCaptureFixture) -> None:
    from headrace.webconsole.server import Console

    source = FakeSource()
    source.answers = [_snap(1000, 0, 3), Unavailable("no broker answered"),
                      Unavailable("no broker answered"), _snap(3000, 400, 5)]
    console = Console(source, interval_s=0.01)  # type: ignore[arg-type]
    with (caplog.at_level("INFO", logger="headrace.console"),
          pytest.raises(RuntimeError, match="a bug")):
        await asyncio.wait_for(console.sample_forever(), 5)
    assert source.calls == 5
    assert console.snapshot is not None and console.snapshot["time_ms"] == 3000
    assert console.error is None  # answered again before the bug
    assert console.samples.throughput_doc() == {"t": {"t": [3000], "v": [200.0]}}
    assert console.samples.lag_doc("g") == {"t": [1000, 3000], "v": [3, 5]}
    # one line when it stopped answering, one when it came back
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["sampling failed: no broker answered",
                     "the cluster answers again (127.0.0.1:9)"]
    console.pool.shutdown()


# ------------------------------------------------------------------ groups by coordinator


def test_an_outage_shows_on_the_groups_it_concerns_only() -> None:
    """Issue 26: one group coordinator that did not answer stalled every page. A sample is
    each broker's answer about the groups it coordinates; a silent one marks its groups
    only, keeps their last doc and the outage's start; another coordinator taking a group
    over (a new leader of its __consumer_offsets partition) ends its outage."""
    from headrace.webconsole.model import merge_group_answers

    def doc(g: str, lag: int) -> dict[str, Any]:
        return {"group": g, "state": "STABLE", "members": 1, "lag": lag}

    first = merge_group_answers({1: [doc("a", 5)], 2: [doc("b", 7), doc("c", 1)]}, {}, 1000)
    assert [(g["group"], g["coordinator"], g["lag"], g["error"]) for g in first.values()] \
        == [("a", 1, 5, None), ("b", 2, 7, None), ("c", 2, 1, None)]
    second = merge_group_answers({1: [doc("a", 6)], 2: "timed out"}, first, 2000)
    assert second["a"]["lag"] == 6 and second["a"]["error"] is None
    assert second["b"]["lag"] is None and second["b"]["members"] == 1
    assert second["b"]["error"] == "its coordinator (broker 2) does not answer: timed out"
    assert second["b"]["error_since_ms"] == 2000
    third = merge_group_answers({1: [doc("a", 6), doc("c", 0)]}, second, 3000)  # 2 is gone
    assert third["b"]["error"] == "its coordinator (broker 2) is not in the cluster"
    assert third["b"]["error_since_ms"] == 2000  # since the outage began
    assert third["c"]["coordinator"] == 1 and third["c"]["error"] is None  # taken over
    fourth = merge_group_answers({1: [doc("a", 6)], 2: [doc("b", 3)]}, third, 4000)
    assert set(fourth) == {"a", "b"}  # c: its coordinator answered without it (deleted)
    assert fourth["b"] == {**doc("b", 3), "coordinator": 2, "error": None,
                           "error_since_ms": None}
