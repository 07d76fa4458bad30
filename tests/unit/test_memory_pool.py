"""The broker's resource accounting (R-NF-3): memory pool, connection quotas, log pacing."""

from __future__ import annotations

import pytest

from headrace.broker.memory_pool import (
    ConnectionQuotas,
    LogPacer,
    MemoryPool,
    UnreceivedBudget,
    idle_connections,
    parse_per_ip_overrides,
)


def test_reservations_up_to_the_capacity_then_waiters_in_order() -> None:
    """R-NF-3: queued.max.request.bytes bounds what all connections hold; large frames
    that do not fit wait in arrival order and are granted as memory comes back."""
    pool = MemoryPool(800, small_frame_bytes=10, headroom=100)
    assert pool.max_single == 700
    assert pool.try_reserve(400, "a")
    assert pool.try_reserve(300, "b")
    assert not pool.try_reserve(200, "c")  # only 100 left, and that is headroom
    assert not pool.try_reserve(50, "d")  # queued behind c, in order
    assert pool.waiting == 2
    assert pool.release(300) == ["c", "d"]  # 500 free: c (200) and d (50) both fit
    assert pool.try_reserve(200, "c") and pool.try_reserve(50, "d")
    assert pool.used == 650


def test_a_large_waiter_is_not_overtaken_by_later_large_frames() -> None:
    pool = MemoryPool(1000, small_frame_bytes=10, headroom=100)
    assert pool.try_reserve(600, "a")
    assert not pool.try_reserve(500, "big")
    assert not pool.try_reserve(200, "late")  # would fit, but "big" came first
    assert pool.release(600) == ["big", "late"]


def test_small_frames_use_the_headroom_that_large_frames_cannot() -> None:
    """Connections parked mid-way through large frames never stall small requests."""
    pool = MemoryPool(1000, small_frame_bytes=50, headroom=100)
    assert pool.try_reserve(900, "hostile")
    assert not pool.try_reserve(60, "large")
    for i in range(2):  # small frames get past the queued large one, from the headroom
        assert pool.try_reserve(50, f"small{i}")
    assert not pool.try_reserve(50, "small3")  # the pool is really full now
    assert pool.release(50) == ["small3"]


def test_a_frame_larger_than_any_grant_is_refused_outright() -> None:
    pool = MemoryPool(1000, headroom=100, small_frame_bytes=10)
    with pytest.raises(ValueError):
        pool.try_reserve(901, "x")


def test_cancel_forgets_a_waiter_and_returns_a_grant() -> None:
    """A connection that closes while waiting (or after being granted) leaks nothing."""
    pool = MemoryPool(100, small_frame_bytes=1, headroom=0)
    assert pool.try_reserve(100, "a")
    assert not pool.try_reserve(60, "b")
    assert not pool.try_reserve(40, "c")
    pool.cancel("b")
    assert pool.release(100) == ["c"]
    assert pool.used == 40
    pool.cancel("c")  # granted but never taken
    assert pool.used == 0


def test_a_granted_reservation_of_another_size_is_returned() -> None:
    pool = MemoryPool(100, small_frame_bytes=1, headroom=0)
    assert pool.try_reserve(100, "a")
    assert not pool.try_reserve(50, "b")
    assert pool.release(100) == ["b"]
    assert pool.try_reserve(30, "b") and pool.used == 30


def test_unlimited_pool() -> None:
    pool = MemoryPool(-1)
    assert pool.try_reserve(10**12, "a") and pool.release(10**12) == []


def test_release_more_than_reserved_is_a_bug() -> None:
    pool = MemoryPool(100)
    with pytest.raises(AssertionError):
        pool.release(1)


def test_connection_quotas_total_and_per_ip() -> None:
    """max.connections and max.connections.per.ip; a closed connection frees its slot."""
    q = ConnectionQuotas(max_connections=3, max_per_ip=2)
    assert q.admit("1.1.1.1") is None and q.admit("1.1.1.1") is None
    assert "per.ip" in (q.admit("1.1.1.1") or "")
    assert q.admit("2.2.2.2") is None
    assert "max.connections=3" in (q.admit("3.3.3.3") or "")
    q.release("1.1.1.1")
    assert q.admit("3.3.3.3") is None
    q.release("9.9.9.9")  # never admitted: ignored
    assert q.total == 3


def test_log_pacer_one_line_per_interval_with_the_count_held_back() -> None:
    p = LogPacer(10.0)
    assert p.ready(0.0) == 0
    assert all(p.ready(t) is None for t in (1.0, 2.0, 9.9))
    assert p.ready(10.0) == 3
    assert p.ready(10.5) is None


def test_idle_connections() -> None:
    assert idle_connections(100.0, {"a": 0.0, "b": 95.0, "c": 90.0}, 10.0) == ["a", "c"]


def test_unreceived_budget_caps_one_address_but_never_a_lone_frame() -> None:
    """Issue 23 item 2: queued.max.unreceived.bytes.per.ip bounds what one address holds
    reserved for bytes not yet arrived; a frame over the cap passes when its address holds
    nothing else; other addresses are not affected."""
    b = UnreceivedBudget(100)
    assert b.fits("a", 60)
    b.change("a", 60)
    assert b.fits("a", 40) and not b.fits("a", 41)
    assert b.fits("a", 0)  # a frame already in hand is never held back
    assert b.fits("b", 100)
    b.change("a", -60)
    assert b.per_ip == {} and b.fits("a", 10_000)  # alone: over the cap is let through
    b.change("b", 5)
    assert b.top() == ("b", 5)
    with pytest.raises(AssertionError):
        b.change("c", -1)
    assert UnreceivedBudget(-1).fits("a", 10**12)


def test_per_ip_overrides_and_the_protected_listener() -> None:
    """Issue 23 item 4: max.connections.per.ip.overrides (host:count, IPv6 too); the
    inter-broker listener (of several) is not refused by max.connections (KIP-402), while
    max.connections.per.ip still applies to it."""
    assert parse_per_ip_overrides("10.0.0.1:5, ::1:7,[fe80::1]:2,") == {
        "10.0.0.1": 5, "::1": 7, "fe80::1": 2}
    for bad in ("10.0.0.1", "10.0.0.1:x", ":5"):
        with pytest.raises(ValueError):
            parse_per_ip_overrides(bad)
    q = ConnectionQuotas(max_connections=2, max_per_ip=1, per_ip_overrides={"9.9.9.9": 3})
    assert q.admit("9.9.9.9") is None and q.admit("9.9.9.9") is None
    assert "max.connections=2" in (q.admit("1.1.1.1") or "")
    assert q.admit("1.1.1.1", protected=True) is None  # over max.connections: accepted
    assert "per.ip=1" in (q.admit("1.1.1.1", protected=True) or "")
    assert q.limit_for("9.9.9.9") == 3 and q.limit_for("1.1.1.1") == 1
