"""Client quotas, the pure core (issue 12): entities and their ZooKeeper paths, Kafka's
precedence and rate sharing, the sampled rate, KIP-219 throttle times, connection rates,
the checks of AlterClientQuotas values, and the SQLite store's round trip. A Hypothesis
property: a client that waits out every throttle stays within its quota."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.cluster import zk_layout as L
from headrace.metadata.store import BrokerInfo, LocalMetadataStore
from headrace.security.quotas import (
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ConnectionRateLimiter,
    QuotaEntity,
    QuotaError,
    QuotaManager,
    QuotaTable,
    Rate,
    check_values,
    format_value,
    stored_quotas,
)

P = PRODUCER_BYTE_RATE


def table(entries: dict[QuotaEntity, dict[str, float]]) -> QuotaTable:
    t = QuotaTable()
    for e, v in entries.items():
        t.set(e, v)
    return t


# ---------------------------------------------------------------- entities
@pytest.mark.parametrize(("entity", "path"), [
    (QuotaEntity(user="alice"), "users/alice"),
    (QuotaEntity(user=DEFAULT), "users/<default>"),
    (QuotaEntity(client_id="app"), "clients/app"),
    (QuotaEntity(client_id=DEFAULT), "clients/<default>"),
    (QuotaEntity(user="alice", client_id=DEFAULT), "users/alice/clients/<default>"),
    (QuotaEntity(user=DEFAULT, client_id="a/b c"), "users/<default>/clients/a%2Fb%20c"),
    (QuotaEntity(user="<default>"), "users/%3Cdefault%3E"),  # a user so named is not the default
    (QuotaEntity(ip="10.0.0.1"), "ips/10.0.0.1"),
])
def test_entity_paths_are_kafkas_and_round_trip(entity: QuotaEntity, path: str) -> None:
    assert entity.path == path
    assert QuotaEntity.from_path(path) == entity


@pytest.mark.parametrize("path", ["users", "users/", "topics/t", "users/a/clients",
                                  "users/a/x/b", "clients/a/b"])
def test_other_paths_are_not_entities(path: str) -> None:
    with pytest.raises(QuotaError):
        QuotaEntity.from_path(path)


def test_illegal_entities_raise() -> None:
    with pytest.raises(QuotaError, match="empty"):
        QuotaEntity()
    with pytest.raises(QuotaError, match="IP entity should not be combined"):
        QuotaEntity(user="a", ip="10.0.0.1")


def test_components_carry_null_for_the_default() -> None:
    assert QuotaEntity(user=DEFAULT, client_id="c").components() == [
        ("user", None), ("client-id", "c")]


# ---------------------------------------------------------------- values
def test_check_values_follows_kafkas_types() -> None:
    e = QuotaEntity(client_id="c")
    assert check_values(e, {P: 1048576.0, REQUEST_PERCENTAGE: 12.5}) == {
        P: 1048576.0, REQUEST_PERCENTAGE: 12.5}
    with pytest.raises(QuotaError, match="Invalid configuration key foo"):
        check_values(e, {"foo": 1.0})
    with pytest.raises(QuotaError, match="must be a LONG value"):
        check_values(e, {P: 1.5})
    with pytest.raises(QuotaError, match="Invalid configuration key"):
        check_values(e, {CONNECTION_CREATION_RATE: 5.0})
    assert check_values(QuotaEntity(ip="1.2.3.4"), {CONNECTION_CREATION_RATE: 5.0}) == {
        CONNECTION_CREATION_RATE: 5.0}
    with pytest.raises(QuotaError, match="positive"):
        check_values(e, {CONSUMER_BYTE_RATE: 0.0})
    with pytest.raises(QuotaError, match="finite"):
        check_values(e, {REQUEST_PERCENTAGE: float("inf")})


def test_stored_form_is_kafkas_and_skips_other_keys() -> None:
    e = QuotaEntity(user="alice")
    assert format_value(e, P, 1048576.0) == "1048576"
    assert format_value(e, REQUEST_PERCENTAGE, 50.0) == "50.0"
    config = {P: "1048576", "SCRAM-SHA-512": "salt=...,iterations=4096",
              REQUEST_PERCENTAGE: "50.0", CONSUMER_BYTE_RATE: "junk"}
    assert stored_quotas(e, config) == {P: 1048576.0, REQUEST_PERCENTAGE: 50.0}


# ---------------------------------------------------------------- precedence
LEVELS = [
    (QuotaEntity(user="u", client_id="c"), ("u", "c")),
    (QuotaEntity(user="u", client_id=DEFAULT), ("u", "c")),
    (QuotaEntity(user="u"), ("u", "")),
    (QuotaEntity(user=DEFAULT, client_id="c"), ("u", "c")),
    (QuotaEntity(user=DEFAULT, client_id=DEFAULT), ("u", "c")),
    (QuotaEntity(user=DEFAULT), ("u", "")),
    (QuotaEntity(client_id="c"), ("", "c")),
    (QuotaEntity(client_id=DEFAULT), ("", "c")),
]


@pytest.mark.parametrize("level", range(len(LEVELS)))
def test_precedence_each_level_beats_every_lower_one(level: int) -> None:
    entries = {e: {P: float(100 + i)} for i, (e, _) in enumerate(LEVELS) if i >= level}
    tags, bound = table(entries).resolve(P, "u", "c")
    assert bound == 100 + level
    assert tags == LEVELS[level][1]


def test_precedence_is_per_key_and_no_quota_is_none() -> None:
    t = table({QuotaEntity(user="u"): {CONSUMER_BYTE_RATE: 5.0},
               QuotaEntity(client_id="c"): {P: 7.0}})
    assert t.resolve(P, "u", "c") == (("", "c"), 7.0)
    assert t.resolve(CONSUMER_BYTE_RATE, "u", "c") == (("u", ""), 5.0)
    assert t.resolve(REQUEST_PERCENTAGE, "u", "c") == (("", "c"), None)
    assert t.resolve(P, "other", "d") == (("", "d"), None)


def test_resolution_follows_changes() -> None:
    t = table({QuotaEntity(client_id=DEFAULT): {P: 10.0}})
    assert t.resolve(P, "u", "c")[1] == 10.0
    t.set(QuotaEntity(user="u"), {P: 20.0})
    assert t.resolve(P, "u", "c") == (("u", ""), 20.0)
    t.set(QuotaEntity(user="u"), {})
    assert t.resolve(P, "u", "c")[1] == 10.0


def test_a_user_quota_is_shared_by_its_clients_a_default_one_is_not() -> None:
    m = QuotaManager(table({QuotaEntity(user="u"): {P: 1000.0}}), P, 11, 1000)
    assert m.record("u", "a", 5000, 0) == 0  # within (11 windows: 5000/11 s < 1000/s)
    assert m.record("u", "b", 10_000, 0) > 0  # the same rate: u's clients share it
    d = QuotaManager(table({QuotaEntity(client_id=DEFAULT): {P: 1000.0}}), P, 11, 1000)
    assert d.record("u", "a", 10_000, 0) == 0
    assert d.record("u", "b", 10_000, 0) == 0  # one rate per client id


# ---------------------------------------------------------------- rate and throttle
def test_rate_counts_at_least_samples_minus_one_windows() -> None:
    r = Rate(11, 1000)
    r.record(10_000, 0)
    assert r.window_size_ms(0) == 10_000
    assert r.measure(0) == pytest.approx(1000.0)
    assert r.window_size_ms(15_000) == 10_000  # old samples purged: the minimum again
    assert r.total(15_000) == 0


def test_rate_spans_the_oldest_sample_when_longer() -> None:
    r = Rate(3, 1000)
    for t in (0, 1000, 2000):
        r.record(100, t)
    assert r.window_size_ms(2500) == 2500
    assert r.measure(2500) == pytest.approx(300 / 2.5)
    r.record(100, 3000)  # the oldest sample (0) is reused
    assert r.total(3000) == 300
    assert r.window_size_ms(3000) == 2000


def test_throttle_time_is_kip219s() -> None:
    """The sampled rate's throttle (request_percentage; uncapped here)."""
    m = QuotaManager(table({QuotaEntity(client_id="c"): {REQUEST_PERCENTAGE: 1000.0}}),
                     REQUEST_PERCENTAGE, 11, 1000)
    assert m.record("", "c", 10_000, 0) == 0  # exactly the quota over 10 s
    # 20,000 over 10 s = 2000/s: (2000 - 1000) / 1000 * 10,000 ms
    assert m.record("", "c", 10_000, 0) == 10_000


def test_byte_rates_use_a_token_bucket() -> None:
    """Byte rates: a burst of samples * window of quota, then throttled for exactly the
    refill time of the deficit."""
    m = QuotaManager(table({QuotaEntity(client_id="c"): {P: 1000.0}}), P, 11, 1000)
    assert m.record("", "c", 11_000, 0) == 0  # the initial credit
    assert m.record("", "c", 500, 0) == 500  # 500 short: 0.5 s at 1000/s
    assert m.record("", "c", 500, 1000) == 0  # refilled 1000 meanwhile: even
    assert m.record("", "c", 2000, 1000) == 2000


def test_a_client_ignoring_throttles_gets_the_quota_steadily() -> None:
    """What the sampled rate could not do (it bursts ten windows of quota when its oldest
    sample expires): over every 20 s window after the first burst, a client sending 1 MB
    requests whenever it is not throttled gets the quota within 2%."""
    q = 1_048_576
    m = QuotaManager(table({QuotaEntity(client_id="c"): {P: float(q)}}), P, 11, 1000)
    per_s = [0] * 120
    t = 0
    while t < 120_000:
        per_s[t // 1000] += 1_000_000
        t += max(m.record("", "c", 1_000_000, t), 20)
    for start in range(15, 100, 5):
        assert abs(sum(per_s[start:start + 20]) / 20 / q - 1) < 0.02, (start, per_s)


def test_request_quota_throttle_is_capped_at_one_window() -> None:
    m = QuotaManager(table({QuotaEntity(client_id="c"): {REQUEST_PERCENTAGE: 1.0}}),
                     REQUEST_PERCENTAGE, 11, 1000, max_throttle_ms=1000)
    assert m.record("", "c", 500.0, 0) == 1000


def test_unrecord_and_quota_window_cap() -> None:
    m = QuotaManager(table({QuotaEntity(client_id="c"): {CONSUMER_BYTE_RATE: 1000.0}}),
                     CONSUMER_BYTE_RATE, 11, 1000)
    assert m.record("", "c", 20_000, 0) > 0
    m.unrecord("", "c", 20_000, 0)
    assert m.record("", "c", 1, 0) == 0
    assert m.max_value_in_window("", "c") == 10_000
    assert m.max_value_in_window("", "other") is None


def test_no_quota_records_nothing() -> None:
    m = QuotaManager(QuotaTable(), P, 11, 1000)
    assert not m.enabled
    assert m.record("u", "c", 1e12, 0) == 0


def test_connection_rates() -> None:
    t = table({QuotaEntity(ip="10.0.0.1"): {CONNECTION_CREATION_RATE: 1.0}})
    c = ConnectionRateLimiter(t, 2**31 - 1, 11, 1000)
    accepted = sum(c.admit_ip("10.0.0.1", 0) == 0 for _ in range(20))
    assert accepted == 10  # 10 connections over the minimum 10 s window = 1/s
    assert c.admit_ip("10.0.0.2", 0) == 0  # no quota for that address
    t.set(QuotaEntity(ip=DEFAULT), {CONNECTION_CREATION_RATE: 1.0})
    assert sum(c.admit_ip("10.0.0.2", 0) == 0 for _ in range(20)) == 10
    b = ConnectionRateLimiter(QuotaTable(), 5, 11, 1000)
    delays = [b.broker_delay(0) for _ in range(60)]
    assert delays[:50] == [0] * 50 and all(d > 0 for d in delays[50:])


# ---------------------------------------------------------------- the property
@settings(max_examples=80, deadline=None)
@given(quota=st.integers(1_000, 5_000_000),
       fractions=st.lists(st.floats(0.001, 0.5), min_size=50, max_size=400),
       gaps=st.lists(st.integers(0, 50), min_size=1, max_size=50))
def test_a_client_that_waits_out_throttles_stays_within_its_quota(
        quota: int, fractions: list[float], gaps: list[int]) -> None:
    """Each request (up to half a second's worth of the quota) is recorded; the client
    sends its next one no earlier than the throttle time it was given (as a KIP-219
    client, or as a muted connection makes it). Kafka's rates forget samples older than
    11 s, so a client gets at most one window span of credit again after each full span:
    at every point, what went through is within 10% of the quota over the time passed,
    plus two spans of credit and the last request."""
    m = QuotaManager(table({QuotaEntity(client_id="c"): {P: float(quota)}}), P, 11, 1000)
    now = 0
    sent = 0
    for i, fraction in enumerate(fractions):
        size = max(1, int(quota * fraction))
        delay = m.record("", "c", size, now)
        assert delay >= 0
        sent += size
        now += delay + gaps[i % len(gaps)]
        assert sent <= quota * (1.1 * now + 22_000) / 1000 + size


def test_a_greedy_client_converges_on_its_quota() -> None:
    """Back to back 64 KiB requests against 1 MiB/s for 10 simulated minutes."""
    quota = 1_048_576
    m = QuotaManager(table({QuotaEntity(client_id="c"): {P: float(quota)}}), P, 11, 1000)
    now = sent = 0
    while now < 600_000:
        sent += 65_536
        now += m.record("", "c", 65_536, now) + 1
    assert sent / (now / 1000) == pytest.approx(quota, rel=0.05)


# ---------------------------------------------------------------- storage
def test_sqlite_quotas_survive_a_reopen(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path, BrokerInfo(0, "127.0.0.1", 9092))
    e = QuotaEntity(user="alice", client_id=DEFAULT)
    assert store.change_client_quotas(e, {P: 1024.0, REQUEST_PERCENTAGE: 5.0}, set()) == {
        P: 1024.0, REQUEST_PERCENTAGE: 5.0}
    store.change_client_quotas(QuotaEntity(client_id="x"), {CONSUMER_BYTE_RATE: 9.0}, set())
    store.change_client_quotas(e, {}, {REQUEST_PERCENTAGE})
    store.change_client_quotas(QuotaEntity(client_id="x"), {}, {CONSUMER_BYTE_RATE})
    store.close()
    again = LocalMetadataStore(tmp_path, BrokerInfo(0, "127.0.0.1", 9092))
    assert dict(again.quota_table.items()) == {e: {P: 1024.0}}
    assert again.quota_table.resolve(P, "alice", "any") == (("alice", "any"), 1024.0)
    again.close()


def test_zk_change_notifications_name_entity_paths() -> None:
    data = L.encode_entity_change("users/alice/clients/%3Cdefault%3E")
    assert L.decode_config_change(data) == "users/alice/clients/%3Cdefault%3E"
    assert L.decode_user_change(data) is None
    assert L.decode_user_change(L.encode_entity_change("users/bob")) == "bob"
    assert L.decode_config(L.quota_path("users/x"), b"") == {}
