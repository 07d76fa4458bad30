"""The broker process's collector policy (``headrace/gc_policy.py``; issue 21 item 5: full
collections over 30,000 partitions' objects stalled a broker for 1.0-1.6 s each, dozens of
times a failover): the survivors of a full collection are frozen, so the next full
collection does not scan them; every THAW_S they are put back once, so garbage cycles among
them are reclaimed."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from headrace.gc_policy import GcPolicy


@pytest.fixture
def policy() -> Iterator[GcPolicy]:
    p = GcPolicy(thaw_s=100.0, freeze_pause_s=0.0)
    gc.callbacks.append(p._callback)
    gc.unfreeze()
    gc.disable()  # only the test's own collections
    try:
        yield p
    finally:
        gc.enable()
        p.uninstall()
        gc.unfreeze()


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_survivors_of_a_full_collection_are_frozen_and_not_scanned_again(
        policy: GcPolicy) -> None:
    long_lived = [Node() for _ in range(20_000)]
    assert policy.step(0.0) is None  # no full collection yet: nothing to freeze
    gc.collect()
    assert policy.full_collections >= 1
    assert policy.step(1.0) == "freeze"
    frozen = gc.get_freeze_count()
    assert frozen >= 20_000
    assert policy.step(2.0) is None  # nothing new since
    # a full collection now scans only what is newer: the long-lived objects are not in it
    tracked = len(gc.get_objects(2))
    assert tracked < frozen // 10
    assert long_lived[0].me is long_lived[0]


def test_a_thaw_lets_the_next_full_collection_reclaim_frozen_cycles(
        policy: GcPolicy) -> None:
    import weakref

    node = Node()
    ref = weakref.ref(node)
    assert policy.step(0.0) is None
    gc.collect()
    assert policy.step(1.0) == "freeze"
    del node  # garbage now, but in a cycle among frozen objects: not collected
    gc.collect()
    assert ref() is not None
    assert policy.step(100.0) == "thaw"  # THAW_S after the start
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None
    assert policy.step(101.0) == "freeze"  # the survivors of that collection


def test_collection_pauses_are_measured(policy: GcPolicy) -> None:
    gc.collect()
    assert policy.pause_s[2] > 0 and policy.max_pause_s[2] > 0


def test_short_full_collections_freeze_nothing() -> None:
    """A broker whose full collections stay short (few partitions) keeps the default
    collector: nothing frozen, so no cycle waits for a thaw."""
    p = GcPolicy(thaw_s=100.0, freeze_pause_s=60.0)
    gc.callbacks.append(p._callback)
    try:
        gc.collect()
        assert p.full_collections >= 1
        assert p.step(0.0) is None and p.step(1.0) is None
    finally:
        p.uninstall()
