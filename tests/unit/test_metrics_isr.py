"""The ISR change counters a leader's /metrics shows (issue 13; fast twin of
tests/cluster/test_metrics_cluster.py's killed follower): a shrink and an expansion are
counted once each, a write that keeps the ISR's size counts nothing. The exposition of these
counters and of under-replicated partitions is tests/unit/test_metrics.py's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from headrace.broker.metrics import BrokerMetrics


def test_isr_shrinks_and_expansions_are_counted_once_each() -> None:
    broker: Any = SimpleNamespace()
    m = BrokerMetrics(broker)
    m.isr_changed(3, 2)  # the killed follower removed
    assert (m.isr_shrinks, m.isr_expands) == (1, 0)
    m.isr_changed(2, 2)  # a leader change that keeps the ISR
    assert (m.isr_shrinks, m.isr_expands) == (1, 0)
    m.isr_changed(2, 3)  # back in
    m.isr_changed(3, 1)
    assert (m.isr_shrinks, m.isr_expands) == (2, 1)
