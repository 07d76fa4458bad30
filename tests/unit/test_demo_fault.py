"""``headrace demo --cluster``'s broker fault on events (``headrace.demo.BrokerFault``): the
kill waits for Spark's first micro-batch, the restart for a micro-batch of every query
after the kill, and the producers' hold (``done``) is set only once the broker is back.
Fast twin of tests/cluster/test_demo_cluster.py's order of events; no broker, no Spark: a
fake cluster records kills and restarts, and the test feeds the queries' input rows as the
demo's main loop does."""

from __future__ import annotations

import threading

from headrace.demo import BrokerFault, EventProducer


class FakeBroker:
    def __init__(self, cluster: FakeCluster, broker_id: int) -> None:
        self.cluster, self.broker_id = cluster, broker_id

    def kill(self) -> None:
        self.cluster.events.append(f"kill {self.broker_id}")
        self.cluster.killed.set()


class FakeCluster:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.brokers = {i: FakeBroker(self, i) for i in (1, 2, 3)}
        self.killed = threading.Event()

    def restart(self, broker_id: int) -> None:
        self.events.append(f"restart {broker_id}")


class Fault(BrokerFault):
    def leader(self) -> int:
        return 2


def start(timeout_s: float = 30.0) -> tuple[Fault, FakeCluster, list[str]]:
    cluster = FakeCluster()
    said: list[str] = []
    fault = Fault(cluster, "unused:0", said.append, timeout_s=timeout_s)
    fault.start()
    return fault, cluster, said


def test_kill_after_the_first_micro_batch_restart_after_every_query_read_again() -> None:
    fault, cluster, said = start()
    try:
        fault.observe({"landing": 0, "activity": 0, "wordcount": 0})
        assert not fault.done.wait(0.3) and cluster.events == []  # Spark still starting
        fault.observe({"landing": 100, "activity": 90, "wordcount": 10})
        assert cluster.killed.wait(10) and cluster.events == ["kill 2"]
        # two of three queries read since the kill: the broker stays down
        fault.observe({"landing": 250, "activity": 220, "wordcount": 10})
        assert not fault.done.wait(0.3) and cluster.events == ["kill 2"]
        fault.observe({"landing": 260, "activity": 230, "wordcount": 12})
        assert fault.done.wait(10)
        assert cluster.events == ["kill 2", "restart 2"]
        assert fault.killed == 2 and fault.error is None
        assert [s.split(":")[0] for s in said] == ["  fault", "  fault"]
    finally:
        fault.stop()
        fault.join(10)


def test_a_fault_that_never_sees_a_micro_batch_gives_up_and_releases_the_producers() -> None:
    fault, cluster, _ = start(timeout_s=0.5)
    fault.join(10)
    assert fault.done.is_set() and cluster.events == []
    assert fault.error is not None and "first micro-batch" in fault.error, fault.error


def test_stop_ends_the_wait_without_a_kill() -> None:
    fault, cluster, _ = start()
    fault.stop()
    fault.join(10)
    assert not fault.is_alive() and cluster.events == [] and fault.error is None


def test_the_producer_runs_past_its_duration_until_the_hold_is_set() -> None:
    hold = threading.Event()
    p = EventProducer("unused:0", rate=1, duration_s=0.0, hold=hold)
    # the producing loop's stop rule (``_run``), 5 s past a 0 s duration
    assert not p.done_producing(5.0)
    hold.set()
    assert p.done_producing(5.0)
    assert EventProducer("unused:0", rate=1, duration_s=1.0).done_producing(1.0)
    assert not EventProducer("unused:0", rate=1, duration_s=1.0).done_producing(0.5)
