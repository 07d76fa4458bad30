"""Metadata's per-topic entry cache (issue 21 item 5): an entry is reused only while the
topic's partition states, the live brokers and the offline logs are what it was computed
from; any change of one of them shows at once. Encodings are kept with the entry, per API
version, and a changed topic re-encodes only its changed partitions: whatever the history
of changes, the bytes are those of encoding the topic afresh."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.broker.handlers.metadata import topic_bytes_of, topic_entry
from headrace.log import partition_log
from headrace.metadata.store import PartitionState, TopicState
from headrace.protocol.codec import encode_metadata_topic


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


def test_a_changed_topic_keeps_the_bytes_of_its_unchanged_partitions() -> None:
    b, t = _Broker([1, 2, 3]), _topic()
    e = topic_entry(b, t)
    topic_bytes_of(b, 12)(e)
    t.partitions[1] = PartitionState([1, 2, 3], 2, 6, [2, 3])
    e2 = topic_entry(b, t)
    assert e2.partitions[0] is e.partitions[0] and e2.partitions[1] is not e.partitions[1]
    assert topic_bytes_of(b, 12)(e2) == encode_metadata_topic(12, e2)


_STEPS = st.lists(st.one_of(
    st.tuples(st.just("state"), st.integers(0, 5), st.integers(1, 3), st.integers(0, 9)),
    st.tuples(st.just("live"), st.sets(st.integers(1, 3))),
    st.tuples(st.just("partitions"), st.integers(1, 6)),
    st.tuples(st.just("encode"), st.sampled_from([0, 1, 4, 5, 7, 8, 9, 10, 12]))),
    max_size=40)


@settings(max_examples=200, deadline=None)
@given(_STEPS)
def test_cached_bytes_are_always_a_fresh_encoding(steps: list[tuple[Any, ...]]) -> None:
    """Any history of state replacements, live broker changes, partitions added and
    encodings at any version: a topic's bytes are those of encoding its entry afresh, and
    its entry is the one built afresh."""
    b, t = _Broker([1, 2, 3]), _topic()
    for step in steps:
        if step[0] == "state":
            _, i, leader, epoch = step
            if i < len(t.partitions):
                t.partitions[i] = PartitionState([1, 2, 3], leader, epoch,
                                                 [leader] + [r for r in (1, 2, 3)
                                                             if r != leader and epoch % 2])
        elif step[0] == "live":
            b.live = sorted(step[1])
        elif step[0] == "partitions":
            while len(t.partitions) < step[1]:
                t.partitions.append(PartitionState([3, 1, 2], 3, 1, [3, 1]))
        else:
            v = step[1]
            e = topic_entry(b, t)
            fresh = topic_entry(_Broker(list(b.live)), t)
            assert e == fresh
            assert topic_bytes_of(b, v)(e) == encode_metadata_topic(v, fresh)
