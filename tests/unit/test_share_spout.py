"""ShareSpout (share_spout.py): every rule of its docstring, driven directly (no I/O,
time as an argument)."""

from __future__ import annotations

import pytest

from headrace.reliable import (
    Acknowledge,
    AckType,
    DeadLetter,
    ReliableConfigError,
    ReliableUsageError,
    ShareSpout,
    ShareSpoutConfig,
    TopicPartition,
)
from headrace.reliable.spout import FAILED

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
ACCEPT, RELEASE, REJECT = AckType.ACCEPT, AckType.RELEASE, AckType.REJECT


def acks(effects: list[object]) -> list[tuple[TopicPartition, tuple[int, ...], AckType]]:
    return [(e.tp, e.offsets, e.ack_type) for e in effects if isinstance(e, Acknowledge)]


def test_ack_types_are_kafkas_acknowledge_types() -> None:
    assert (int(ACCEPT), int(RELEASE), int(REJECT)) == (1, 2, 3)


def test_a_completed_batch_is_accepted_once_and_the_spout_is_settled() -> None:
    spout = ShareSpout()
    batch = spout.on_batch(TP, [3, 7, 9], [1, 1, 2], 0, payloads=["a", "b", "c"])
    assert batch is not None and len(batch) == 3
    assert spout.num_held == 3 and not spout.is_settled()
    assert spout.tick(1) == []  # nothing decided yet
    spout.ack_batch(batch, 1)
    assert spout.num_pending_roots == 0 and spout.num_held == 0
    assert not spout.is_settled()  # the acknowledgement is not handed out yet
    assert acks(spout.tick(2)) == [(TP, (3, 7, 9), ACCEPT)]
    assert spout.is_settled()
    assert spout.tick(3) == []


def test_roots_acked_one_by_one_are_accepted_one_by_one() -> None:
    spout = ShareSpout()
    batch = spout.on_batch(TP, [0, 1], [1, 1], 0)
    assert batch is not None
    spout.ack(batch.item(1), 0)
    assert acks(spout.tick(0)) == [(TP, (1,), ACCEPT)]
    assert spout.is_held(TP, 0) and not spout.is_held(TP, 1)
    spout.ack(batch.item(0), 0)
    assert acks(spout.tick(0)) == [(TP, (0,), ACCEPT)]
    assert spout.is_settled()


def test_a_failure_releases_the_record_without_max_retries() -> None:
    spout = ShareSpout()
    batch = spout.on_batch(TP, [5], [40], 0)  # any delivery count: released for ever
    assert batch is not None
    spout.fail(batch.item(0), 0, "boom")
    assert acks(spout.tick(0)) == [(TP, (5,), RELEASE)]
    assert spout.is_settled()


def test_a_batch_with_failed_records_accepts_the_rest_and_releases_those() -> None:
    spout = ShareSpout(ShareSpoutConfig(max_retries=3))
    batch = spout.on_batch(TP, [0, 1, 2, 3], [1, 1, 1, 1], 0)
    assert batch is not None
    spout.ack_batch(batch, 0, failed={1: "x", 3: "y"})
    effects = acks(spout.tick(0))
    assert sorted(effects) == sorted([(TP, (1,), RELEASE), (TP, (3,), RELEASE),
                                      (TP, (0, 2), ACCEPT)])
    assert spout.is_settled()


@pytest.mark.parametrize("max_retries", [0, 1, 2])
def test_max_retries_counts_deliveries_then_dead_letter_then_reject(max_retries: int) -> None:
    """Delivery d failing is failure d: released while d <= max_retries, then dead-lettered
    (the record stays held), and REJECTed only once the dead letter is produced."""
    spout = ShareSpout(ShareSpoutConfig(max_retries=max_retries))
    for d in range(1, max_retries + 1):
        batch = spout.on_record(TP, 4, d, 0, payload=f"p{d}")
        assert batch is not None
        spout.fail(batch.item(0), 0, "bad")
        assert acks(spout.tick(0)) == [(TP, (4,), RELEASE)]
    last = max_retries + 1
    batch = spout.on_record(TP, 4, last, 0, payload="last")
    assert batch is not None
    spout.fail(batch.item(0), 0, "bad")
    effects = spout.tick(0)
    assert effects == [DeadLetter(TP, 4, "last", "bad", last)]
    assert spout.is_held(TP, 4) and spout.num_held == 1 and not spout.is_settled()
    assert spout.on_record(TP, 4, last + 1, 0) is None  # held: the dead letter settles it
    spout.dead_lettered(TP, 4)
    assert acks(spout.tick(0)) == [(TP, (4,), REJECT)]
    assert spout.is_settled()
    spout.dead_lettered(TP, 4)  # a duplicate report is ignored
    assert spout.tick(0) == [] and spout.is_settled()


def test_a_record_delivered_more_often_than_max_retries_is_dead_lettered_at_its_first_failure(
        ) -> None:
    spout = ShareSpout(ShareSpoutConfig(max_retries=1))
    batch = spout.on_record(TP, 0, 3, 0, payload="r")  # deliveries lost to crashes count
    assert batch is not None
    spout.fail(batch.item(0), 0, "e")
    assert spout.tick(0) == [DeadLetter(TP, 0, "r", "e", 3)]


def test_a_failed_dead_letter_releases_the_record_and_its_next_failure_dead_letters_again(
        ) -> None:
    spout = ShareSpout(ShareSpoutConfig(max_retries=0))
    batch = spout.on_record(TP, 2, 1, 0)
    assert batch is not None
    spout.fail(batch.item(0), 0, "e")
    assert isinstance(spout.tick(0)[0], DeadLetter)
    spout.dead_letter_failed(TP, 2, 0)
    assert acks(spout.tick(0)) == [(TP, (2,), RELEASE)]
    assert spout.is_settled()
    again = spout.on_record(TP, 2, 2, 0)
    assert again is not None
    spout.fail(again.item(0), 0, "e")
    assert spout.tick(0) == [DeadLetter(TP, 2, None, "e", 2)]
    spout.dead_letter_failed(TP1, 2, 0)  # not ours: ignored
    assert spout.tick(0) == [] and spout.num_held == 1


def test_the_message_timeout_releases_the_record_and_late_acks_are_ignored() -> None:
    spout = ShareSpout(ShareSpoutConfig(message_timeout_ms=1000))
    batch = spout.on_batch(TP, [0, 1], [1, 1], 0)
    assert batch is not None
    kid = spout.emit(("k",), [batch.item(1)])  # root 1's tree reaches the acker
    assert spout.tick(999) == []
    effects = acks(spout.tick(1000))
    assert sorted(effects) == [(TP, (0,), RELEASE), (TP, (1,), RELEASE)]
    assert spout.is_settled()
    spout.ack(kid, 1001)
    spout.ack_batch(batch, 1001)
    assert spout.tick(1002) == [] and spout.is_settled()


def test_a_tree_is_accepted_only_when_its_last_item_is_acked() -> None:
    spout = ShareSpout()
    batch = spout.on_batch(TP, [10], [1], 0)
    assert batch is not None
    root = batch.item(0)
    kids = spout.tracker.emit_many([("a",), ("b",)], root)
    grandkid = spout.emit(("c",), [kids[0]])
    spout.ack(root, 0)
    spout.ack(kids[0], 0)
    spout.ack(kids[1], 0)
    assert spout.tick(0) == [] and spout.num_pending_roots == 1
    spout.ack(grandkid, 0)
    assert acks(spout.tick(0)) == [(TP, (10,), ACCEPT)]


def test_a_failed_child_releases_its_root_and_the_other_children_do_not_count() -> None:
    spout = ShareSpout()
    batch = spout.on_batch(TP, [10], [1], 0)
    assert batch is not None
    a, b = spout.tracker.emit_many([("a",), ("b",)], batch.item(0))
    spout.ack(batch.item(0), 0)
    spout.fail(a, 0, "child failed")
    assert acks(spout.tick(0)) == [(TP, (10,), RELEASE)]
    assert not spout.is_live(b)
    spout.ack(b, 0)
    assert spout.tick(0) == []


def test_a_held_record_delivered_again_is_skipped_the_rest_of_the_batch_kept() -> None:
    spout = ShareSpout()
    first = spout.on_batch(TP, [1, 2], [1, 1], 0)
    assert first is not None
    again = spout.on_batch(TP, [2, 3], [2, 1], 0, payloads=["two", "three"])
    assert again is not None and list(again.offsets) == [3]
    assert list(again.payloads) == ["three"] and list(again.delivery_counts) == [1]
    assert spout.on_batch(TP, [1, 2], [2, 2], 0) is None
    assert spout.on_batch(TP1, [1], [1], 0) is not None  # another partition's offset 1
    assert spout.num_held == 4


def test_bad_input_from_the_shell_raises_and_changes_nothing() -> None:
    spout = ShareSpout()
    with pytest.raises(ReliableUsageError):
        spout.on_batch(TP, [0, 1], [1, 0], 0)
    with pytest.raises(ReliableUsageError):
        spout.on_batch(TP, [0, 1], [1], 0)
    with pytest.raises(ReliableUsageError):
        spout.on_batch(TP, [0, 1], [1, 1], 0, payloads=["x"])
    with pytest.raises(ReliableUsageError):
        spout.on_batch(TP, [4, 4], [1, 1], 0)
    assert spout.num_held == 0 and spout.num_pending_roots == 0 and spout.is_settled()
    assert spout.on_batch(TP, [], [], 0) is None


def test_untracked_records_are_accepted_at_once() -> None:
    spout = ShareSpout()
    batch = spout.on_batch(TP, [0, 1], [1, 1], 0, tracked=False)
    assert batch is not None and batch.pending == 0
    assert spout.num_held == 0
    assert acks(spout.tick(0)) == [(TP, (0, 1), ACCEPT)]
    off = ShareSpout(ShareSpoutConfig(num_ackers=0))
    assert off.on_batch(TP, [0], [1], 0) is not None
    assert acks(off.tick(0)) == [(TP, (0,), ACCEPT)]


def test_release_all_releases_pending_roots_and_keeps_dead_letters_held() -> None:
    spout = ShareSpout(ShareSpoutConfig(max_retries=0))
    batch = spout.on_batch(TP, [0, 1, 2], [1, 1, 1], 0)
    assert batch is not None
    kid = spout.emit(("k",), [batch.item(2)])
    spout.ack(batch.item(0), 0)
    spout.fail(batch.item(1), 0, "dlq")
    effects = spout.tick(0)
    assert acks(effects) == [(TP, (0,), ACCEPT)]
    assert [type(e) for e in effects] == [Acknowledge, DeadLetter]
    spout.release_all()
    assert acks(spout.tick(0)) == [(TP, (2,), RELEASE)]
    assert batch.states[2] == FAILED  # a lane that has not run it yet skips it
    assert spout.num_pending_roots == 0 and spout.num_held == 1  # the dead letter
    assert not spout.is_batch_live(batch) and not spout.is_live(kid)
    spout.ack(kid, 0)  # late: ignored
    spout.ack_batch(batch, 0)
    assert spout.tick(0) == []
    spout.dead_lettered(TP, 1)
    assert acks(spout.tick(0)) == [(TP, (1,), REJECT)]
    assert spout.is_settled()


def test_config_is_validated() -> None:
    with pytest.raises(ReliableConfigError):
        ShareSpoutConfig(max_retries=-1)
    with pytest.raises(ReliableConfigError):
        ShareSpoutConfig(num_ackers=-1)
    with pytest.raises(ReliableConfigError):
        ShareSpout(ShareSpoutConfig(message_timeout_ms=1))  # the acker's own bound


class _FakeMessage:
    """What ``_share_runs`` reads of a confluent-kafka ``Message``."""

    def __init__(self, partition: int | None, offset: int | None, count: object,
                 error: object = None) -> None:
        self._p, self._o, self._c, self._e = partition, offset, count, error

    def error(self) -> object:
        return self._e

    def topic(self) -> str:
        return "t"

    def partition(self) -> int | None:
        return self._p

    def offset(self) -> int | None:
        return self._o

    def delivery_count(self) -> object:
        return self._c


def test_the_shell_groups_a_share_poll_by_partition_and_validates_what_the_broker_sent(
        ) -> None:
    """Errors and records without coordinates are dropped; a delivery count that is not a
    positive int is taken as 1 (processed, never dropped; the spout refuses below 1)."""
    from confluent_kafka import KafkaError

    from headrace.reliable.consumer import _share_runs

    msgs = [_FakeMessage(0, 4, 2), _FakeMessage(1, 9, None), _FakeMessage(0, 5, -3),
            _FakeMessage(0, 6, "x"), _FakeMessage(None, 1, 1), _FakeMessage(0, -1, 1),
            _FakeMessage(0, 7, 1, KafkaError(KafkaError._PARTITION_EOF))]
    runs = _share_runs(msgs)  # type: ignore[arg-type]
    assert [(tp, offsets, counts) for tp, _m, offsets, counts in runs] == [
        (TP, [4, 5, 6], [2, 1, 1]), (TP1, [9], [1])]
