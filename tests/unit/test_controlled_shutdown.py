"""A broker's controlled shutdown (``ClusterNode.controlled_shutdown``) when the whole
cluster stops (issue 26 defect 5: Ctrl-C on ``headrace cluster`` took about a minute of
retries "failed: " with an empty reason). Run on a stand-in node: its store, partitions and
controller are plain objects; the slow twin stops a real ``headrace cluster``
(tests/cluster/test_cluster_command.py)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace as NS
from typing import Any

import pytest

from headrace.broker.cluster_node import ClusterNode


class Controller:
    is_active = True

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.asked = 0

    async def controlled_shutdown(self, broker_id: int) -> None:
        self.asked += 1
        if not self.answer:
            await asyncio.sleep(10)  # never answers within the request timeout


def _node(shutting_down: list[int], controller: Controller, connected: bool = True) -> Any:
    partition = NS(leading=True, state=NS(isr=[1, 2, 3]))
    node = NS(
        node_id=1, fenced=False,
        config={"controlled.shutdown.enable": True, "controlled.shutdown.max.retries": 1,
                "request.timeout.ms": 1000, "controlled.shutdown.retry.backoff.ms": 500},
        store=NS(connected=connected, live_brokers=lambda: [NS(node_id=i) for i in (1, 2, 3)],
                 controlled_shutdown_requests=lambda: list(shutting_down),
                 request_controlled_shutdown=lambda broker_id: None),
        replicas=NS(partitions={("t", 0): partition}),
        broker=NS(controller=controller))

    async def wait_for(predicate: Any, timeout_s: float) -> bool:
        await asyncio.sleep(0)
        return bool(predicate())

    node.wait_for = wait_for
    return node


def test_nothing_to_move_when_every_other_replica_is_shutting_down_too() -> None:
    """Brokers 2 and 3 stop too (their requests are in ZooKeeper): the controller would
    elect neither, so broker 1 stops at once instead of retrying (Kafka's
    shuttingDownBrokerIds are no candidates either)."""
    controller = Controller(answer=True)
    asyncio.run(ClusterNode.controlled_shutdown(_node([2, 3], controller)))
    assert controller.asked == 0


def test_a_request_that_times_out_says_so(caplog: pytest.LogCaptureFixture) -> None:
    controller = Controller(answer=False)
    with caplog.at_level(logging.INFO, logger="headrace.cluster"):
        asyncio.run(ClusterNode.controlled_shutdown(_node([], controller)))
    assert controller.asked == 2  # max.retries 1: two attempts
    failed = [r.getMessage() for r in caplog.records if "request failed" in r.getMessage()]
    assert failed == ["controlled shutdown request failed: no answer from the controller "
                      "within 1 s"] * 2


def test_no_zookeeper_no_retries(caplog: pytest.LogCaptureFixture) -> None:
    """ZooKeeper stopped first (a broker started by hand beside ``headrace cluster``): one
    line and a stop at once, not four requests that each time out."""
    controller = Controller(answer=False)
    with caplog.at_level(logging.INFO, logger="headrace.cluster"):
        asyncio.run(ClusterNode.controlled_shutdown(_node([], controller, connected=False)))
    assert controller.asked == 0
    assert [r.getMessage() for r in caplog.records] == [
        "controlled shutdown skipped: no ZooKeeper connection, so no controller to move the "
        "leadership of 1 partition(s); stopping"]
