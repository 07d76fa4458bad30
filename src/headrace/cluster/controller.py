"""The controller's decisions (R-REP-1, R-REP-5..8). PURE: no I/O; the shell
(``controller_service``) feeds it the metadata cache and writes what it decides.

Kafka's rules: replica assignment (``AdminUtils.assignReplicasToBrokers``, rack-aware
when every broker has a rack), leader elections (``PartitionLeaderElectionAlgorithms``:
offline, preferred, controlled shutdown) and the reaction to brokers leaving
(``KafkaController.onBrokerFailure``: new leaders for what they led, dead followers out of
the ISR, never emptying it: the last in-sync replica stays in the ISR so that it, and
only it, may lead again when unclean election is off).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from headrace.metadata.store import PartitionState, TopicState


class InvalidReplicationFactor(ValueError):
    pass


class InvalidReplicaAssignment(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Decision:
    topic: str
    partition: int
    state: PartitionState
    why: str
    unclean: bool = False


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def assign_replicas(brokers: Sequence[tuple[int, str | None]], partitions: int, rf: int, *,
                    start_partition: int = 0, fixed_start_index: int = -1,
                    start_shift: int = -1, rng: random.Random | None = None
                    ) -> list[list[int]]:
    """Kafka's assignment: leaders spread round-robin from a random start, followers
    shifted so replicas of consecutive partitions differ; rack-aware when every broker
    has a rack (a partition's replicas on as many racks as possible)."""
    n = len(brokers)
    if rf <= 0:
        raise InvalidReplicationFactor("Replication factor must be larger than 0.")
    if rf > n:
        raise InvalidReplicationFactor(
            f"Replication factor: {rf} larger than available brokers: {n}.")
    racks = [r for _, r in brokers]
    if any(racks) and not all(racks):
        raise InvalidReplicaAssignment("Not all brokers have rack information.")
    rng = rng or random.Random()
    if all(racks):
        return _assign_rack_aware(brokers, partitions, rf, start_partition, fixed_start_index,
                                  start_shift, rng)
    ids = sorted(b for b, _ in brokers)
    start = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    shift = start_shift if start_shift >= 0 else rng.randrange(n)
    out = []
    pid = max(0, start_partition)
    for _ in range(partitions):
        if pid > 0 and pid % n == 0:
            shift += 1
        first = (pid + start) % n
        out.append([ids[first]] + [ids[_replica_index(first, shift, j, n)]
                                   for j in range(rf - 1)])
        pid += 1
    return out


def _assign_rack_aware(brokers: Sequence[tuple[int, str | None]], partitions: int, rf: int,
                       start_partition: int, fixed_start_index: int, start_shift: int,
                       rng: random.Random) -> list[list[int]]:
    rack_of = {b: str(r) for b, r in brokers}
    by_rack: dict[str, list[int]] = {}
    for b in sorted(rack_of):
        by_rack.setdefault(rack_of[b], []).append(b)
    # Kafka's rack-alternated broker list: one broker of each rack in turn
    ordered: list[int] = []
    racks = sorted(by_rack)
    while len(ordered) < len(rack_of):
        for r in racks:
            if by_rack[r]:
                ordered.append(by_rack[r].pop(0))
    n, num_racks = len(ordered), len(racks)
    start = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    shift = start_shift if start_shift >= 0 else rng.randrange(n)
    out = []
    pid = max(0, start_partition)
    for _ in range(partitions):
        if pid > 0 and pid % n == 0:
            shift += 1
        first = (pid + start) % n
        leader = ordered[first]
        replicas = [leader]
        racks_with = {rack_of[leader]}
        brokers_with = {leader}
        k = 0
        for _ in range(rf - 1):
            while True:
                b = ordered[_replica_index(first, shift * num_racks, k, n)]
                k += 1
                if ((rack_of[b] not in racks_with or len(racks_with) == num_racks)
                        and (b not in brokers_with or len(brokers_with) == n)):
                    replicas.append(b)
                    racks_with.add(rack_of[b])
                    brokers_with.add(b)
                    break
        out.append(replicas)
        pid += 1
    return out


def elected(st: PartitionState, leader: int, isr: list[int]) -> PartitionState:
    """``st`` with a new leader and ISR: the next leader epoch (and partition epoch)."""
    out = st.copy()  # (``dataclasses.replace`` costs several times as much)
    out.leader, out.leader_epoch, out.isr = leader, st.leader_epoch + 1, list(isr)
    out.partition_epoch = st.partition_epoch + 1
    return out


def offline_election(st: PartitionState, live: set[int], unclean: bool
                     ) -> tuple[int, list[int], bool] | None:
    """The first live ISR replica in assignment order; else, if unclean election is
    allowed, the first live replica (ISR = it alone). None: nobody can lead."""
    for r in st.replicas:
        if r in live and r in st.isr:
            return r, [x for x in st.isr if x in live], False
    if unclean:
        for r in st.replicas:
            if r in live:
                return r, [r], True
    return None


def initial_state(replicas: list[int], live: set[int]) -> PartitionState | None:
    alive = [r for r in replicas if r in live]
    if not alive:
        return None
    return PartitionState(list(replicas), alive[0], 0, alive, 0, -1, -1)


def is_new(st: PartitionState) -> bool:
    return st.zk_version < 0 and st.leader_epoch < 0


def partition_decision(name: str, i: int, st: PartitionState, live: set[int],
                       unclean: bool) -> Decision | None:
    """The decision for one partition given the live brokers (None: nothing to write)."""
    if is_new(st):
        init = initial_state(st.replicas, live)
        return None if init is None else Decision(name, i, init, "new partition")
    if st.leader in live:
        dead = [r for r in st.isr if r not in live and r != st.leader]
        if dead:
            isr = [r for r in st.isr if r not in dead]
            return Decision(name, i, replace(st, isr=isr, replicas=list(st.replicas)),
                            f"broker(s) {dead} left the ISR")
        return None
    choice = offline_election(st, live, unclean)
    if choice is None:
        if st.leader != -1:
            # nobody may lead: offline; the last in-sync replica(s) stay in the ISR
            isr = [r for r in st.isr if r in live] or list(st.isr)
            return Decision(name, i, elected(st, -1, isr),
                            f"leader {st.leader} gone and no in-sync replica is live: offline")
        return None
    leader, isr, was_unclean = choice
    return Decision(name, i, elected(st, leader, isr), f"leader {st.leader} gone",
                    unclean=was_unclean)


def on_brokers_changed(topics: Mapping[str, TopicState], live: set[int],
                       unclean: Callable[[str], bool]) -> list[Decision]:
    """What the controller writes when the set of live brokers (or the topics) changed."""
    out: list[Decision] = []
    for name, t in topics.items():
        for i, st in enumerate(t.partitions):
            d = partition_decision(name, i, st, live, unclean(name))
            if d is not None:
                out.append(d)
    return out


def bounced_replicas(st: PartitionState, bounced: set[int], broker_epochs: Mapping[int, int],
                     state_zxid: int) -> set[int]:
    """The leader and ISR members of ``st`` that registered again since ``st`` was decided
    (Kafka's ``bouncedBrokerIds``): a broker the controller saw re-register (``bounced``:
    its broker epoch, the registration's czxid, changed), or one whose registration is
    newer than the state's last write (``state_zxid``, -1: unknown), which a controller
    that started after the bounce cannot have seen change."""
    members = set(st.isr) | ({st.leader} if st.leader >= 0 else set())
    return {r for r in members
            if r in bounced or (state_zxid >= 0 and broker_epochs.get(r, -1) > state_zxid)}


def on_brokers_bounced(topics: Mapping[str, TopicState], live: set[int], bounced: set[int],
                       broker_epochs: Mapping[int, int],
                       state_zxid: Callable[[str, int], int]) -> list[Decision]:
    """A bounced broker is a failure followed by a startup (``KafkaController.
    processBrokerChange``): here its failure, for every partition it leads or is in the
    ISR of: it leaves the ISR, and what it led gets a new leader epoch (another in-sync
    replica, or offline until the startup's election makes it lead again, at a newer
    epoch). A restarted broker's log and high watermark come from disk: it must never
    lead again at an epoch its earlier process led (``ClusterNode`` waits for the new one)."""
    out: list[Decision] = []
    for name, t in topics.items():
        for i, st in enumerate(t.partitions):
            if is_new(st):
                continue
            gone = bounced_replicas(st, bounced, broker_epochs, state_zxid(name, i))
            if not gone:
                continue
            # never unclean here: the bounced replica is back and may lead again
            d = partition_decision(name, i, st, live - gone, False)
            if d is not None:
                out.append(replace(d, why=f"broker(s) {sorted(gone)} registered again: "
                                          f"{d.why}"))
    return out


def controlled_shutdown(topics: Mapping[str, TopicState], broker: int, live: set[int]
                        ) -> list[Decision]:
    """Move leadership off ``broker`` (to the first other live ISR replica) and take it
    out of the ISRs where it follows (never emptying an ISR)."""
    out: list[Decision] = []
    others = live - {broker}
    for name, t in topics.items():
        for i, st in enumerate(t.partitions):
            if broker not in st.replicas or is_new(st):
                continue
            if st.leader == broker:
                for r in st.replicas:
                    if r in others and r in st.isr:
                        isr = [x for x in st.isr if x != broker]
                        out.append(Decision(name, i, elected(st, r, isr),
                                            f"controlled shutdown of broker {broker}"))
                        break
            elif broker in st.isr and len(st.isr) > 1:
                out.append(Decision(name, i, replace(st, isr=[x for x in st.isr if x != broker],
                                                     replicas=list(st.replicas)),
                                    f"controlled shutdown of broker {broker}"))
    return out


def leads(topics: Mapping[str, TopicState], broker: int) -> int:
    """Partitions with other replicas that ``broker`` still leads."""
    return sum(1 for t in topics.values() for st in t.partitions
               if st.leader == broker and len(st.replicas) > 1)


def preferred_election(st: PartitionState, live: set[int]) -> PartitionState | None:
    """Leadership back to the first replica, if it is live and in sync and not leading."""
    if not st.replicas:
        return None
    preferred = st.replicas[0]
    if st.leader == preferred or preferred not in live or preferred not in st.isr:
        return None
    return elected(st, preferred, st.isr)


# ---------------------------------------------------------------- reassignment (KIP-455)
@dataclass(frozen=True, slots=True)
class Reassignment:
    """Phase 1 of moving a partition to ``target``: the assignment becomes RS = target +
    the old replicas not in it (adding / removing recorded in the topic znode), and the
    leader epoch moves so every replica acts on it; new replicas start fetching."""

    replicas: list[int]
    adding: list[int]
    removing: list[int]
    state: PartitionState


def start_reassignment(st: PartitionState, target: list[int]) -> Reassignment:
    if not target or len(set(target)) != len(target):
        raise InvalidReplicaAssignment(f"Invalid replica assignment {target}")
    current = [r for r in st.replicas]
    rs = list(dict.fromkeys([*target, *current]))
    adding = [r for r in target if r not in current]
    removing = [r for r in current if r not in target]
    return Reassignment(rs, adding, removing, replace(
        st, replicas=rs, leader_epoch=st.leader_epoch + 1,
        partition_epoch=st.partition_epoch + 1, isr=list(st.isr)))


def reassignment_target(st: PartitionState, removing: list[int]) -> list[int]:
    return [r for r in st.replicas if r not in removing]


def finish_reassignment(st: PartitionState, target: list[int], live: set[int]
                        ) -> PartitionState | None:
    """Phase 2, once every target replica is in the ISR: the assignment becomes the
    target, the ISR keeps only target replicas, and the leader moves into the target if it
    is not there. None while the target is not all in sync (or nobody can lead)."""
    if not all(r in st.isr for r in target):
        return None
    isr = [r for r in st.isr if r in target]
    leader = st.leader if st.leader in target and st.leader in live else next(
        (r for r in target if r in isr and r in live), -1)
    if leader < 0:
        return None
    return replace(st, replicas=list(target), leader=leader, isr=isr,
                   leader_epoch=st.leader_epoch + 1, partition_epoch=st.partition_epoch + 1)


def cancel_reassignment(st: PartitionState, removing: list[int], adding: list[int],
                        live: set[int]) -> PartitionState:
    """Back to the original replicas (RS minus adding); leadership stays if it can."""
    original = [r for r in st.replicas if r not in adding]
    isr = [r for r in st.isr if r in original] or [r for r in original if r in live][:1]
    leader = st.leader if st.leader in original else next(
        (r for r in original if r in isr and r in live), -1)
    return replace(st, replicas=original, leader=leader, isr=isr,
                   leader_epoch=st.leader_epoch + 1, partition_epoch=st.partition_epoch + 1)
