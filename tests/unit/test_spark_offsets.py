"""Offset planning of the Spark source (pure): R-SPARK-1, R-SPARK-2."""

from __future__ import annotations

import pytest

from headrace.spark.audit import compare
from headrace.spark.offsets import (
    OffsetRange,
    OffsetSpec,
    OptionError,
    Subscription,
    from_json,
    lag,
    parse_offset_spec,
    parse_subscription,
    plan_end,
    plan_ranges,
    rate_limit,
    resolve,
    to_json,
)

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def test_json_round_trip_is_sparks_kafka_format() -> None:
    offsets = {A0: 5, A1: 7, B0: 0}
    assert to_json(offsets) == {"a": {"0": 5, "1": 7}, "b": {"0": 0}}
    assert from_json(to_json(offsets)) == offsets


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"subscribe": "a, b"}, Subscription("subscribe", topics=("a", "b"))),
        ({"subscribepattern": "a.*"}, Subscription("subscribePattern", pattern="a.*")),
        ({"assign": '{"a":[1,0]}'}, Subscription("assign", partitions=(A0, A1))),
    ],
)
def test_parse_subscription(options: dict[str, str], expected: Subscription) -> None:
    assert parse_subscription(options) == expected


@pytest.mark.parametrize(
    "options",
    [{}, {"subscribe": "a", "assign": '{"a":[0]}'}, {"subscribepattern": "("},
     {"assign": "[1]"}, {"subscribe": " , "}],
)
def test_bad_subscription_is_the_callers_error(options: dict[str, str]) -> None:
    with pytest.raises(OptionError):
        parse_subscription(options)


def test_subscription_selects_partitions_from_metadata() -> None:
    md = {"a": 2, "b": 1, "ab": 3, "__audit": 1}
    assert Subscription("subscribe", topics=("a", "missing")).select(md) == {A0, A1}
    assert Subscription("subscribePattern", pattern="a.*").select(md) == {
        A0, A1, ("ab", 0), ("ab", 1), ("ab", 2)}
    assert Subscription("subscribePattern", pattern=".*").select(md) >= {B0}
    assert ("__audit", 0) not in Subscription("subscribePattern", pattern=".*").select(md)
    assert Subscription("assign", partitions=(A1, ("a", 9))).select(md) == {A1}


def test_offset_spec_and_resolve() -> None:
    earliest, latest = {A0: 3, A1: 0}, {A0: 10, A1: 4}
    assert resolve(parse_offset_spec(None, "s", "earliest"), {A0, A1}, earliest, latest) == \
        earliest
    assert resolve(parse_offset_spec("latest", "s", "x"), {A0, A1}, earliest, latest) == latest
    spec = parse_offset_spec('{"a":{"0":-1,"1":2}}', "s", "latest")
    assert resolve(spec, {A0, A1}, earliest, latest) == {A0: 10, A1: 2}
    assert resolve(parse_offset_spec('{"a":{"0":-2}}', "s", "x"), {A0, A1}, earliest,
                   latest) == {A0: 3, A1: 0}  # unspecified partitions: earliest
    by_ts = resolve(OffsetSpec("timestamp", timestamp_ms=1), {A0, A1}, earliest, latest,
                    {A0: 7, A1: -1})
    assert by_ts == {A0: 7, A1: 4}  # no record at/after the timestamp: latest
    with pytest.raises(OptionError):
        parse_offset_spec("tomorrow", "startingOffsets", "latest")


def test_rate_limit_shares_in_proportion_to_backlog() -> None:
    start = {A0: 0, A1: 0, B0: 100}
    until = {A0: 900, A1: 100, B0: 100}
    assert rate_limit(start, until, 100) == {A0: 90, A1: 10, B0: 100}
    assert rate_limit(start, until, 10_000) == until
    # a share below one rounds up, so a small partition is never starved
    assert rate_limit({A0: 0, A1: 0}, {A0: 10_000, A1: 1}, 10) == {A0: 9, A1: 1}


def test_plan_end_caps_by_limit_and_available_now_target() -> None:
    start = {A0: 0, A1: 0}
    latest = {A0: 50, A1: 50}
    assert plan_end(start, {A0, A1}, {}, latest).end == latest
    assert plan_end(start, {A0, A1}, {}, latest, max_records=20).end == {A0: 10, A1: 10}
    assert plan_end(start, {A0, A1}, {}, latest, target={A0: 30, A1: 5}).end == {A0: 30, A1: 5}
    # a partition at its target stays there
    assert plan_end({A0: 30, A1: 5}, {A0, A1}, {}, latest, target={A0: 30, A1: 5}).end == \
        {A0: 30, A1: 5}


def test_new_partition_enters_at_earliest_with_an_empty_range() -> None:
    plan = plan_end({A0: 5}, {A0, A1}, {A1: 2}, {A0: 9, A1: 20})
    assert plan.end == {A0: 9, A1: 2}
    assert plan_ranges({A0: 5}, plan.end) == [OffsetRange("a", 0, 5, 9)]
    nxt = plan_end(plan.end, {A0, A1}, {}, {A0: 9, A1: 20})
    assert plan_ranges(plan.end, nxt.end) == [OffsetRange("a", 1, 2, 20)]
    # appearing after prepareForTriggerAvailableNow: not read in that run
    assert plan_end({A0: 5}, {A0, A1}, {A1: 0}, {A0: 9, A1: 3}, target={A0: 9}).end == {A0: 9}


def test_data_loss_is_reported_not_decided() -> None:
    gone = plan_end({A0: 5, B0: 3}, {A0}, {}, {A0: 9})
    assert gone.end == {A0: 9}
    assert [(d.topic, d.partition) for d in gone.data_loss] == [("b", 0)]
    recreated = plan_end({A0: 5}, {A0}, {}, {A0: 2})
    assert recreated.end == {A0: 2} and "below" in recreated.data_loss[0].message
    assert plan_ranges({A0: 5}, recreated.end) == []
    unanswered = plan_end({A0: 5, A1: 2}, {A0, A1}, {}, {A0: 9})  # no offset for A1 this time
    assert unanswered.end == {A0: 9, A1: 2} and not unanswered.data_loss


def test_plan_ranges_splits_for_min_partitions() -> None:
    ranges = plan_ranges({A0: 0, A1: 0}, {A0: 300, A1: 100}, min_partitions=4)
    assert sum(r.size for r in ranges) == 400
    assert len(ranges) == 4
    assert [r for r in ranges if r.partition == 0] == [
        OffsetRange("a", 0, 0, 100), OffsetRange("a", 0, 100, 200), OffsetRange("a", 0, 200, 300)]
    assert plan_ranges({A0: 0}, {A0: 2}, min_partitions=8) == [
        OffsetRange("a", 0, 0, 1), OffsetRange("a", 0, 1, 2)]
    assert plan_ranges({A0: 4}, {A0: 4}) == []


def test_lag() -> None:
    assert lag({A0: 5}, {A0: 9, A1: 3}) == 7


def test_audit_compare() -> None:
    w1, w2, w3 = ("t", "h", 1), ("t", "h", 2), ("t", "h", 3)
    report = compare({w1: 10, w2: 5}, {w1: (12, 10), w2: (4, 4), w3: (1, 1)})
    by = {(w.topic, w.host, w.minute): w for w in report.windows}
    assert (by[w1].lost, by[w1].duplicated, by[w1].unannounced) == (0, 2, 0)
    assert (by[w2].lost, by[w2].duplicated, by[w2].unannounced) == (1, 0, 0)
    # records that arrived once each but were never announced: not duplicates
    assert (by[w3].lost, by[w3].duplicated, by[w3].unannounced) == (0, 0, 1)
    assert (report.produced, report.consumed, report.lost, report.duplicated,
            report.unannounced) == (15, 17, 1, 2, 1)
    assert not report.ok and compare({w1: 3}, {w1: (3, 3)}).ok
    assert compare({w1: 3}, {w1: (5, 5)}).ok  # 2 acknowledged after the last announcement
    assert not compare({w1: 3}, {w1: (5, 4)}).ok  # one of them twice
