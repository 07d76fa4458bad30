"""The controller's shell (``cluster.controller_service``) around the pure
``replication.controller.Controller``, over an in-memory store: one snapshot when it wins,
then the store's notifications as events, each handled for its own partitions only; the
elections written before the ISR-only changes; a refused write re-reads that partition
only (R-REP-5, issue 21 defect 5)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

from headrace.cluster.controller_service import ControllerService
from headrace.metadata.store import BrokerInfo, PartitionState, TopicState

Update = tuple[str, int, PartitionState]


class Store:
    """What the shell uses of ``ZkMetadataStore``: the cache (topics, brokers, their
    epochs), notifications by hand, and conditional writes that succeed unless told."""

    def __init__(self, topics: dict[str, TopicState], epochs: dict[int, int]) -> None:
        self._topics = topics
        self.epochs = epochs
        self.batches: list[list[Update]] = []
        self.refuse: dict[tuple[str, int], PartitionState] = {}  # someone wrote this first
        self.reads: list[list[tuple[str, int]]] = []
        self.changed_partitions: dict[str, set[int] | None] = {}
        self.listener: Any = None
        self.log: list[tuple[str, Any]] = []  # every write, in order
        self.deletions: list[str] = []  # /admin/delete_topics
        self._reassignments: dict[str, tuple[dict[int, list[int]], dict[int, list[int]]]] = {}

    def add_listener(self, listener: Any) -> None: self.listener = listener
    def topics(self) -> dict[str, TopicState]: return self._topics
    def topic(self, name: str) -> TopicState | None: return self._topics.get(name)
    def live_brokers(self) -> list[BrokerInfo]:
        return [BrokerInfo(b, "h", 1) for b in sorted(self.epochs)]
    def broker_epochs(self) -> dict[int, int]: return self.epochs
    def state_mzxid(self, topic: str, partition: int) -> int: return 5
    def controlled_shutdown_requests(self) -> list[int]: return []
    def pending_deletions(self) -> list[str]: return list(self.deletions)
    def reassignments(self) -> dict[str, tuple[dict[int, list[int]], dict[int, list[int]]]]:
        return self._reassignments

    def write_topic_assignment(self, name: str, assignment: dict[int, list[int]],
                               adding: dict[int, list[int]], removing: dict[int, list[int]],
                               epoch_zk_version: int) -> None:
        self.log.append(("assignment", (name, assignment, adding, removing)))
        t = self._topics[name]
        for p, replicas in assignment.items():  # the cache's replicas are the assignment's
            t.partitions[p] = replace(t.partitions[p], replicas=list(replicas))
        self._reassignments[name] = (adding, removing)

    def delete_topic_znodes(self, name: str, epoch_zk_version: int) -> None:
        self.log.append(("delete", name))
        del self._topics[name]
        self.deletions.remove(name)

    def delete_admin_node(self, path: str) -> None:
        self.log.append(("admin", path))
    def preferred_election_requests(self) -> list[tuple[str, int]]: return []
    def controller_id(self) -> int: return -1
    def elect_controller(self, broker_id: int) -> tuple[int, int]: return 5, 4

    def write_partition_states(self, updates: list[Update], epoch: int, version: int
                               ) -> list[int | None]:
        self.batches.append(list(updates))
        self.log.append(("states", [(n, p, st.replicas) for n, p, st in updates]))
        out: list[int | None] = []
        for name, p, st in updates:
            now = self._topics[name].partitions[p]
            if (name, p) in self.refuse:
                self._topics[name].partitions[p] = self.refuse.pop((name, p))
                out.append(None)
                continue
            assert st.zk_version == now.zk_version, "a write not conditional on the snapshot"
            self._topics[name].partitions[p] = replace(st, zk_version=st.zk_version + 1)
            out.append(st.zk_version + 1)
        return out

    def read_partition_states(self, tps: list[tuple[str, int]]
                              ) -> list[PartitionState | None]:
        self.reads.append(list(tps))
        return [replace(self._topics[n].partitions[p], replicas=[]) for n, p in tps]


def spread(n: int, brokers: list[int], version: int = 0) -> list[PartitionState]:
    """``n`` partitions, RF 3 over ``brokers``, led by their first replica."""
    out = []
    for i in range(n):
        r = [brokers[(i + k) % len(brokers)] for k in range(3)]
        out.append(PartitionState(r, r[0], 0, list(r), 0, 1, version))
    return out


def service(store: Store) -> ControllerService:
    cfg = {"unclean.leader.election.enable": False}
    return ControllerService(2, store, cfg, None)  # type: ignore[arg-type]


async def won(svc: ControllerService) -> None:
    await svc._campaign()
    await svc._reconcile()


def test_elections_are_written_before_isr_only_changes() -> None:
    """When a broker dies, the partitions it led get their new leaders in a first write
    batch and the ISR-only changes (it followed elsewhere) come after, as Kafka's
    onBrokerFailure orders them: a broker leading 1,000 of 3,000 partitions no longer
    queues its new leaders behind 2,000 ISR writes."""
    store = Store({"t": TopicState("t", uuid.uuid4(), spread(30, [1, 2, 3]))},
                  {1: 1, 2: 2, 3: 3})
    svc = service(store)

    async def run() -> None:
        await won(svc)
        assert store.batches == []  # a healthy cluster: the snapshot decides nothing
        store.epochs = {2: 2, 3: 3}  # broker 1 died
        svc.brokers_changed()
        await svc._reconcile()

    before = list(store.topics()["t"].partitions)
    asyncio.run(run())
    assert [len(b) for b in store.batches] == [10, 20]
    led_by_1 = {i for i, st in enumerate(before) if st.leader == 1}
    assert {p for _, p, _ in store.batches[0]} == led_by_1
    assert all(st.leader in (2, 3) and 1 not in st.isr for _, _, st in store.batches[0])
    assert all(st.leader == before[p].leader and st.isr == [r for r in before[p].isr if r != 1]
               for _, p, st in store.batches[1])


def test_a_broker_failure_touches_only_its_partitions() -> None:
    """10 partitions on broker 1, 3,000 elsewhere: its failure writes (and decides) the 10
    only; the snapshot was read once, when the controller won, never again."""
    mine = spread(10, [1, 2, 3])
    others = spread(3000, [2, 3, 4])
    store = Store({"a": TopicState("a", uuid.uuid4(), mine),
                   "b": TopicState("b", uuid.uuid4(), others)}, {1: 1, 2: 2, 3: 3, 4: 4})
    svc = service(store)
    reads = 0
    topics = store.topics

    def counted() -> dict[str, TopicState]:
        nonlocal reads
        reads += 1
        return topics()

    store.topics = counted  # type: ignore[method-assign]

    async def run() -> None:
        await won(svc)
        assert reads == 1
        store.epochs = {2: 2, 3: 3, 4: 4}
        svc.brokers_changed()
        await svc._reconcile()

    asyncio.run(run())
    assert reads == 1  # no rescan of the cache
    assert sorted({(n, p) for b in store.batches for n, p, _ in b}) == [
        ("a", i) for i in range(10)]


def test_a_refused_write_rereads_that_partition_only() -> None:
    """A leader wrote partition 1's ISR first (BadVersion): the controller re-reads that
    znode alone and decides again on it, conditionally on the version it read."""
    store = Store({"t": TopicState("t", uuid.uuid4(), spread(6, [1, 2, 3]))},
                  {1: 1, 2: 2, 3: 3})
    svc = service(store)
    t = store.topics()["t"]

    async def run() -> None:
        await won(svc)
        store.refuse[("t", 1)] = replace(t.partitions[1], isr=[2, 3], zk_version=7)
        store.epochs = {1: 1, 3: 3}  # broker 2 died
        svc.brokers_changed()
        await svc._reconcile()

    asyncio.run(run())
    assert store.reads == [[("t", 1)]]
    last = [(p, st) for b in store.batches for n, p, st in b if p == 1]
    assert [st.zk_version for _, st in last] == [0, 7]  # first refused, then on the re-read
    assert t.partitions[1].isr == [3] and t.partitions[1].leader == 3


def test_a_refused_election_is_decided_again_before_the_isr_only_batch() -> None:
    """Broker 2 dies; partition 1 (it led) had its state changed meanwhile, so its
    election is refused: it is re-read and elected again before the ISR removals of the
    partitions broker 2 followed are written (at 30,000 partitions they took seconds, and
    the refused partitions stayed leaderless behind them)."""
    store = Store({"t": TopicState("t", uuid.uuid4(), spread(6, [1, 2, 3]))},
                  {1: 1, 2: 2, 3: 3})
    svc = service(store)
    t = store.topics()["t"]

    async def run() -> None:
        await won(svc)
        store.refuse[("t", 1)] = replace(t.partitions[1], isr=[2, 3], zk_version=7)
        store.epochs = {1: 1, 3: 3}
        svc.brokers_changed()
        await svc._reconcile()

    asyncio.run(run())
    batches = [sorted(p for _, p, _ in b) for b in store.batches]
    led_by_2 = [1, 4]
    assert batches[0] == led_by_2  # the elections (1 refused)
    assert batches[1] == [1]  # 1 again, on the re-read, before...
    assert batches[2] == [0, 2, 3, 5]  # ...the ISR-only changes
    assert t.partitions[1].leader == 3
    assert all(2 not in t.partitions[p].isr for p in range(6))


def test_a_notified_state_is_an_isr_change_of_one_partition() -> None:
    """A leader's ISR write reaches the controller as a notification of one partition: a
    dead broker it still lists is taken out; nothing else is decided."""
    store = Store({"t": TopicState("t", uuid.uuid4(), spread(6, [1, 2, 3]))},
                  {1: 1, 2: 2})
    svc = service(store)
    t = store.topics()["t"]

    async def run() -> None:
        await won(svc)  # broker 3 was already dead: the snapshot took it out
        store.batches.clear()
        t.partitions[4] = replace(t.partitions[4], isr=[1, 2, 3],
                                  zk_version=t.partitions[4].zk_version + 1)
        store.changed_partitions = {"t": {4}}
        svc.topic_changed("t")
        await svc._reconcile()

    asyncio.run(run())
    assert [[(p, st.isr) for _, p, st in b] for b in store.batches] == [
        [(4, [1, 2])]]


def test_a_new_topic_gets_its_states_and_a_deleted_one_nothing() -> None:
    store = Store({}, {1: 1, 2: 2, 3: 3})
    svc = service(store)

    async def run() -> None:
        await won(svc)
        store._topics["n"] = TopicState("n", uuid.uuid4(), [
            PartitionState([1, 2, 3], -1, -1, [], 0, -1, -1),
            PartitionState([2, 3, 1], -1, -1, [], 0, -1, -1)])
        svc.topic_changed("n")
        await svc._reconcile()
        assert [(p, st.leader, st.zk_version) for _, p, st in store.batches[0]] == [
            (0, 1, -1), (1, 2, -1)]
        del store._topics["n"]
        svc.topic_deleted("n")
        store.epochs = {2: 2, 3: 3}
        svc.brokers_changed()
        await svc._reconcile()

    asyncio.run(run())
    assert len(store.batches) == 1
    assert svc.ctl is not None and not any(tp[0] == "n" for tp in svc.ctl.states)
    assert all(("n", 0) not in s for s in svc.ctl.hosted.values())


def test_elect_leaders_and_the_auto_rebalance_are_decided_by_the_pure_controller() -> None:
    """ElectLeaders (preferred) answers per partition from the pure controller's outcomes:
    elected (written conditionally on the snapshot), not needed, not available, unknown; a
    write someone else made first answers not available. The auto rebalance then writes
    only what is away from its preferred leader and can go back."""
    parts = spread(6, [1, 2, 3])
    # partitions 0 and 3 (preferred 1) led by 2 after an old failover; 3's ISR lacks 1;
    # 4 (preferred 2) led by 3
    parts[0] = replace(parts[0], leader=2, leader_epoch=1)
    parts[3] = replace(parts[3], leader=2, leader_epoch=1, isr=[2, 3])
    parts[4] = replace(parts[4], leader=3, leader_epoch=1)
    store = Store({"t": TopicState("t", uuid.uuid4(), parts)}, {1: 1, 2: 2, 3: 3})
    svc = service(store)
    svc.config = {"unclean.leader.election.enable": False,  # type: ignore[assignment]
                  "leader.imbalance.per.broker.percentage": 10}
    out: dict[object, str] = {}

    async def run() -> None:
        await won(svc)
        out.update(await svc.elect_leaders(0, [("t", 0), ("t", 1), ("t", 3), ("u", 0)]))
        # 4: someone else wrote first (1 leads at epoch 5): refused, re-read, not available
        store.refuse[("t", 4)] = replace(parts[4], leader=1, leader_epoch=5, zk_version=9)
        out["4"] = (await svc.elect_leaders(0, [("t", 4)]))[("t", 4)]
        store.batches.clear()
        # broker 1 leads 0 (its share) and not 3 (out of sync); broker 2 leads 1, not 4
        await svc._rebalance()

    asyncio.run(run())
    assert out == {("t", 0): "elected", ("t", 1): "not needed", ("t", 3): "not available",
                   ("u", 0): "unknown", "4": "not available"}
    assert store.reads == [[("t", 4)]]
    assert [[(p, st.leader, st.leader_epoch, st.zk_version) for _, p, st in b]
            for b in store.batches] == [[(4, 2, 6, 9)]]


def test_a_reassignment_is_decided_by_the_pure_controller_assignment_first() -> None:
    """AlterPartitionReassignments through the shell: the topic's assignment written
    before the partition's state; ListPartitionReassignments answers from the controller;
    when the leader's ISR write brings the new replica in, the state moves to the target
    and then the assignment drops the reassignment. Deleting the topic deletes its znodes
    once, even when asked again meanwhile."""
    store = Store({"t": TopicState("t", uuid.uuid4(), spread(3, [1, 2, 3]))},
                  {1: 1, 2: 2, 3: 3, 4: 4})
    svc = service(store)
    t = store.topics()["t"]
    answers: dict[object, object] = {}

    async def run() -> None:
        await won(svc)
        answers.update(await svc.alter_reassignments([("t", 0, [2, 3, 4]), ("t", 1, None),
                                                      ("x", 0, [1, 2])]))
        answers["listed"] = svc.list_reassignments(None)
        # the leader's ISR write: 4 caught up
        t.partitions[0] = replace(t.partitions[0], isr=[1, 2, 3, 4],
                                  zk_version=t.partitions[0].zk_version + 1)
        store.changed_partitions = {"t": {0}}
        svc.topic_changed("t")
        await svc._reconcile()
        answers["after"] = svc.list_reassignments(None)
        store.deletions.append("t")
        await svc._reconcile()
        await svc._reconcile()  # the notification has not come yet: not deleted again
        svc.topic_deleted("t")
        await svc._reconcile()

    asyncio.run(run())
    assert answers[("t", 0)] == ("none", None)
    assert answers[("t", 1)] == ("no_reassignment_in_progress", None)
    assert answers[("x", 0)] == ("unknown_topic_or_partition", None)
    assert answers["listed"] == {("t", 0): ([2, 3, 4, 1], [4], [1])}
    assert answers["after"] == {}
    assert store.log == [
        ("assignment", ("t", {0: [2, 3, 4, 1], 1: [2, 3, 1], 2: [3, 1, 2]}, {0: [4]},
                        {0: [1]})),
        ("states", [("t", 0, [2, 3, 4, 1])]),
        ("states", [("t", 0, [2, 3, 4])]),
        ("assignment", ("t", {0: [2, 3, 4], 1: [2, 3, 1], 2: [3, 1, 2]}, {}, {})),
        ("delete", "t")]
