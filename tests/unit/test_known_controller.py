"""Metadata and DescribeCluster do not answer "no controller" (-1) while a cluster elects
one (``Broker.known_controller``; R-REP-1). librdkafka's admin client, told -1, waits for
a controller until something else makes it ask again: a CreateTopics sent right as a
3-broker cluster started waited 40 s, once in 10-25 starts (seen first as a
``bench/cluster_bench.py --scale 30000`` run that never created its topics). The broker
now waits for the election, bounded, and not while its own ZooKeeper session is lost or
it is stopping. Driven on a stand-in broker with a manual store."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace as NS
from typing import Any

import pytest

from headrace.broker import server
from headrace.broker.server import Broker


class Store:
    def __init__(self, cid: int) -> None:
        self.cid = cid
        self.asked = 0

    def controller_id(self) -> int:
        self.asked += 1
        return self.cid


def _broker(cid: int, cluster: bool = True, fenced: bool = False) -> Any:
    b: Any = Broker.__new__(Broker)
    b.metadata = Store(cid)
    b.cluster = NS(fenced=fenced) if cluster else None
    b.stopping = False
    return b


def test_a_known_controller_is_answered_at_once() -> None:
    b = _broker(2)
    assert asyncio.run(Broker.known_controller(b)) == 2
    assert b.metadata.asked == 1


def test_while_none_is_known_the_answer_waits_for_the_election() -> None:
    b = _broker(-1)

    async def run() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        loop.call_later(0.1, setattr, b.metadata, "cid", 3)  # the election's notification
        return await Broker.known_controller(b), loop.time() - t0

    cid, waited = asyncio.run(run())
    assert cid == 3
    assert 0.09 <= waited < 1.0


def test_the_wait_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "CONTROLLER_WAIT_S", 0.2)
    b = _broker(-1)

    async def run() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        return await Broker.known_controller(b), loop.time() - t0

    cid, waited = asyncio.run(run())
    assert cid == -1 and 0.19 <= waited < 1.0


@pytest.mark.parametrize("case", ["fenced", "stopping", "single node"])
def test_no_wait_when_no_controller_can_come(case: str) -> None:
    """Fenced (its session lost) it learns of no election until the session is back; a
    stopping broker answers at once; a single node is its own controller."""
    b = _broker(-1, cluster=case != "single node", fenced=case == "fenced")
    b.stopping = case == "stopping"

    async def run() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        return await Broker.known_controller(b), loop.time() - t0

    cid, waited = asyncio.run(run())
    assert cid == -1 and waited < 0.05
