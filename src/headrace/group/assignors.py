"""PURE: server-side partition assignors of the KIP-848 consumer group protocol.

With ``group.protocol=consumer`` the group coordinator, not a consumer leader, computes each
member's *target assignment* (``group.consumer.assignors``, the first one is the default; a
member may ask for another by name with ``server_assignor``). Two assignors, as in Kafka
(``org.apache.kafka.coordinator.group.assignor``):

``uniform`` (Kafka's ``UniformAssignor``)
    Balanced and sticky, for members with equal or different subscriptions:

    1. keep every partition a member currently owns if the member still subscribes to its
       topic and the partition still exists (a partition claimed twice goes to the first
       claimant in member-id order);
    2. give each remaining partition, most constrained first (fewest subscribed members),
       to the eligible member with the fewest partitions (ties: member id);
    3. while some member owns a partition that a member with at least two fewer partitions
       also subscribes to, move one such partition from the fullest donor to the emptiest
       receiver.

    With equal subscriptions the result is balanced within one partition and only the
    excess of over-full members moves: adding a member moves exactly the partitions the new
    member receives, removing one moves only its partitions.

``range`` (Kafka's server-side ``RangeAssignor``)
    Per topic: the subscribed members sorted by member id, the partitions split into
    contiguous ranges of ``n // m``, the first ``n % m`` members get one more. Seed 004:
    7 partitions, 5 members → p0-p1, p2-p3, p4, p5, p6. Not sticky (as Kafka's).

Rack awareness is not implemented: ``TopicInfo`` carries no partition racks.

Every assignor is a function of its arguments only; the result names every member (with an
empty mapping when it gets nothing) and assigns each subscribed partition exactly once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

Assignment = dict[str, dict[uuid.UUID, frozenset[int]]]
CurrentAssignment = Mapping[str, Mapping[uuid.UUID, frozenset[int]]]


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    topics: frozenset[str]
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class TopicInfo:
    topic_id: uuid.UUID
    num_partitions: int


AssignFn = Callable[
    [Mapping[str, MemberSubscription], Mapping[str, TopicInfo], CurrentAssignment], Assignment
]

TopicPartition = tuple[uuid.UUID, int]


def _freeze(members: Mapping[str, MemberSubscription],
            owned: Mapping[str, set[TopicPartition]]) -> Assignment:
    out: Assignment = {}
    for member_id in members:
        per_topic: dict[uuid.UUID, set[int]] = {}
        for topic_id, partition in owned.get(member_id, set()):
            per_topic.setdefault(topic_id, set()).add(partition)
        out[member_id] = {t: frozenset(ps) for t, ps in per_topic.items()}
    return out


def range_assign(members: Mapping[str, MemberSubscription], topics: Mapping[str, TopicInfo],
                 current: CurrentAssignment) -> Assignment:
    """Kafka's server-side RangeAssignor (see the module docstring); ``current`` is unused."""
    owned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    for name in sorted(topics):
        info = topics[name]
        subscribers = sorted(m for m, s in members.items() if name in s.topics)
        if not subscribers or info.num_partitions <= 0:
            continue
        quota, extra = divmod(info.num_partitions, len(subscribers))
        start = 0
        for i, member_id in enumerate(subscribers):
            length = quota + (1 if i < extra else 0)
            owned[member_id].update((info.topic_id, p) for p in range(start, start + length))
            start += length
    return _freeze(members, owned)


def uniform_assign(members: Mapping[str, MemberSubscription], topics: Mapping[str, TopicInfo],
                   current: CurrentAssignment) -> Assignment:
    """Kafka's UniformAssignor: balanced and sticky (see the module docstring)."""
    # Which members may own each subscribed partition.
    eligible: dict[TopicPartition, list[str]] = {}
    topic_subscribers: dict[uuid.UUID, frozenset[str]] = {}
    for name, info in topics.items():
        subscribers = sorted(m for m, s in members.items() if name in s.topics)
        if not subscribers:
            continue
        topic_subscribers[info.topic_id] = frozenset(subscribers)
        for p in range(info.num_partitions):
            eligible[(info.topic_id, p)] = subscribers

    owned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    owner: dict[TopicPartition, str] = {}

    # 1. Stickiness: keep what is still valid.
    for member_id in sorted(members):
        for topic_id, partitions in current.get(member_id, {}).items():
            if member_id not in topic_subscribers.get(topic_id, frozenset()):
                continue
            for p in partitions:
                tp = (topic_id, p)
                if tp in eligible and tp not in owner:
                    owner[tp] = member_id
                    owned[member_id].add(tp)

    # 2. Unowned partitions, most constrained first, to the least loaded eligible member.
    unowned = sorted((tp for tp in eligible if tp not in owner),
                     key=lambda tp: (len(eligible[tp]), str(tp[0]), tp[1]))
    for tp in unowned:
        member_id = min(eligible[tp], key=lambda m: (len(owned[m]), m))
        owner[tp] = member_id
        owned[member_id].add(tp)

    # 3. Balance: move single partitions from full members to members two or more behind.
    while True:
        move = _best_move(owned, topic_subscribers)
        if move is None:
            break
        tp, donor, receiver = move
        owned[donor].discard(tp)
        owned[receiver].add(tp)
    return _freeze(members, owned)


def _best_move(owned: Mapping[str, set[TopicPartition]],
               topic_subscribers: Mapping[uuid.UUID, frozenset[str]],
               ) -> tuple[TopicPartition, str, str] | None:
    """The move (partition, donor, receiver) from the fullest possible donor to the emptiest
    eligible receiver with at least two fewer partitions, or None when balanced."""
    by_load = sorted(owned, key=lambda m: (-len(owned[m]), m))
    receivers = sorted(owned, key=lambda m: (len(owned[m]), m))
    for donor in by_load:
        load = len(owned[donor])
        for receiver in receivers:
            if len(owned[receiver]) + 1 >= load:
                break
            candidates = sorted(
                (tp for tp in owned[donor] if receiver in topic_subscribers[tp[0]]),
                key=lambda tp: (str(tp[0]), -tp[1]),
            )
            if candidates:
                return candidates[0], donor, receiver
    return None


@dataclass(frozen=True, slots=True)
class Assignor:
    """A named server-side assignor: ``assign(members, topics, current)``."""

    name: str
    assign: AssignFn


UNIFORM = Assignor("uniform", uniform_assign)
RANGE = Assignor("range", range_assign)
ASSIGNORS: dict[str, Assignor] = {a.name: a for a in (UNIFORM, RANGE)}
DEFAULT_ASSIGNORS = "uniform,range"


def assignors_from_config(value: str) -> tuple[Assignor, ...]:
    """``group.consumer.assignors`` (comma-separated names; the first is the default).
    Raises ValueError for an unknown name or an empty list."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise ValueError("group.consumer.assignors: at least one assignor is required")
    unknown = [n for n in names if n not in ASSIGNORS]
    if unknown:
        raise ValueError(f"group.consumer.assignors: unknown assignor(s) {', '.join(unknown)}"
                         f" (known: {', '.join(ASSIGNORS)})")
    return tuple(ASSIGNORS[n] for n in names)
