"""The broker process's collector policy (``headrace/gc_policy.py``; issue 21 item 5: full
collections over 30,000 partitions' objects stalled a broker for 1.0-1.6 s each, dozens of
times a failover): the survivors of a long full collection are frozen, so the next full
collection does not scan them; the first full collection THAW_S after the last thaw looks
at everything again, so garbage cycles among them are reclaimed. Driven by the collector's
callback: a manual clock, explicit collections, the automatic ones off."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from headrace.gc_policy import GcPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Iterator[Clock]:
    gc.collect()
    gc.unfreeze()
    gc.disable()  # only the test's own collections
    try:
        yield Clock()
    finally:
        gc.enable()
        gc.unfreeze()


def _policy(clock: Clock, freeze_pause_s: float = 0.0) -> GcPolicy:
    p = GcPolicy(thaw_s=100.0, freeze_pause_s=freeze_pause_s, clock=clock)
    gc.callbacks.append(p._callback)
    return p


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_survivors_of_a_long_full_collection_are_frozen_and_not_scanned_again(
        clock: Clock) -> None:
    p = _policy(clock)
    try:
        long_lived = [Node() for _ in range(20_000)]
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert p.full_collections == 1 and p.freezes == 1
        frozen = gc.get_freeze_count()
        assert frozen >= 20_000
        # the next full collection scans only what is newer: the frozen are not in it
        assert len(gc.get_objects(2)) < frozen // 10
        assert long_lived[0].me is long_lived[0]
    finally:
        p.uninstall()


def test_the_first_full_collection_after_thaw_s_reclaims_frozen_cycles(
        clock: Clock) -> None:
    p = _policy(clock)
    try:
        node = Node()
        ref = weakref.ref(node)
        gc.collect()  # frozen with its survivors
        assert gc.get_freeze_count() > 0
        del node  # garbage now, but in a cycle among frozen objects
        clock.now = 99.0
        gc.collect()
        assert ref() is not None and p.thaws == 0
        clock.now = 100.0  # THAW_S after the first full collection
        gc.collect()
        assert p.thaws == 1 and ref() is None
        assert gc.get_freeze_count() > 0  # that collection's survivors, frozen again
    finally:
        p.uninstall()


def test_short_full_collections_freeze_nothing(clock: Clock) -> None:
    """A broker whose full collections stay short (few partitions) keeps the default
    collector: nothing frozen, so no cycle waits for a thaw."""
    p = _policy(clock, freeze_pause_s=60.0)
    try:
        gc.collect()
        assert p.full_collections == 1 and p.freezes == 0
        assert gc.get_freeze_count() == 0
        assert p.pause_s[2] > 0 and p.max_pause_s[2] > 0
    finally:
        p.uninstall()
