"""Metadata's per-topic entry cache (issue 21 item 5): an entry is reused only while the
topic's partition states, the live brokers and the offline logs are what it was computed
from; any change of one of them shows at once."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from headrace.broker.handlers.metadata import topic_entry
from headrace.log import partition_log
from headrace.metadata.store import PartitionState, TopicState


@dataclass
class _Broker:
    live: list[int]
    node_id: int = 1
    hosted: dict[Any, Any] = field(default_factory=dict)

    @property
    def metadata(self) -> Any:
        outer = self

        class _Store:
            def live_brokers(self) -> list[Any]:
                return [type("B", (), {"node_id": n})() for n in outer.live]
        return _Store()

    @property
    def replicas(self) -> Any:
        return type("R", (), {"partitions": self.hosted})()

    __hash__ = object.__hash__  # weak-keyed by identity


def _topic() -> TopicState:
    return TopicState("t", uuid.uuid4(), [PartitionState([1, 2, 3], 1, 5, [1, 2, 3])
                                          for _ in range(3)])


def test_an_unchanged_topic_is_served_from_the_cache() -> None:
    b, t = _Broker([1, 2, 3]), _topic()
    first = topic_entry(b, t)
    assert topic_entry(b, t) is first


def test_a_changed_partition_state_is_seen_at_once() -> None:
    b, t = _Broker([1, 2, 3]), _topic()
    topic_entry(b, t)
    t.partitions[1] = PartitionState([1, 2, 3], 2, 6, [2, 3])  # as the stores replace it
    e = topic_entry(b, t)
    assert (e.partitions[1].leader_id, e.partitions[1].leader_epoch) == (2, 6)
    assert e.partitions[1].isr_nodes == (2, 3)
    assert e.partitions[0].leader_id == 1


def test_a_dead_broker_and_an_offline_log_are_seen_at_once() -> None:
    b, t = _Broker([1, 2, 3]), _topic()
    topic_entry(b, t)
    b.live = [2, 3]  # broker 1, the leader, is gone
    e = topic_entry(b, t)
    assert all(p.leader_id == -1 and p.offline_replicas == (1,) for p in e.partitions)
    b.live = [1, 2, 3]
    assert topic_entry(b, t).partitions[0].leader_id == 1
    hosted = type("P", (), {"log": type("L", (), {"offline": "disk"})()})()
    b.hosted[("t", 2)] = hosted
    partition_log._note_offline()  # what a log going offline does
    e = topic_entry(b, t)
    assert e.partitions[2].leader_id == -1 and e.partitions[2].offline_replicas == (1,)
    assert e.partitions[0].leader_id == 1
