"""A partition's transactions (issue 10; R-PROD-2): transactional batches, markers, the
last stable offset and aborted transactions, through ``PartitionLog`` on real files."""

from __future__ import annotations

from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from tests.batches import simple_batch

from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log.partition_log import PartitionLog
from headrace.log.transactions import ABORT, COMMIT, AbortedTxn, control_batch, marker_type
from headrace.protocol.records import InvalidRecordError, read_header

T0 = 1_700_000_000_000


def open_log(path: Path) -> PartitionLog:
    return PartitionLog.open(path, LogConfig(segment_bytes=2_000, index_interval_bytes=200),
                             ManualClock(wall_ms=T0))


def txn_batch(n: int, pid: int, epoch: int, seq: int) -> bytes:
    return simple_batch(n, ts=T0, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                        transactional=True)


def plain(n: int) -> bytes:
    return simple_batch(n, ts=T0)


def caught_up(log: PartitionLog) -> None:
    log.high_watermark = log.log_end_offset


def test_markers_are_control_batches_kafka_reads() -> None:
    b = control_batch(7, 3, True, 5, T0)
    h = read_header(b, 0)
    assert h.is_control and h.is_transactional and (h.producer_id, h.producer_epoch) == (7, 3)
    assert h.base_sequence == -1 and h.records_count == 1
    assert marker_type(b) == COMMIT and marker_type(control_batch(7, 3, False, 5, T0)) == ABORT


def test_lso_holds_at_the_first_undecided_transaction(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(plain(2), 0)                       # 0-1
    first = log.append_as_leader(txn_batch(3, 7, 0, 0), 0)  # 2-4, producer 7
    log.append_as_leader(plain(2), 0)                       # 5-6
    log.append_as_leader(txn_batch(1, 8, 0, 0), 0)          # 7, producer 8
    caught_up(log)
    assert first.first_offset == 2
    assert log.last_stable_offset == 2  # held back by producer 7
    m = log.append_marker(7, 0, True, 0, 0)                 # 8: commit of 7
    assert log.last_stable_offset == 2  # the marker is not below the HW yet
    caught_up(log)
    assert log.last_stable_offset == 7  # now producer 8's transaction holds it
    log.append_marker(8, 0, False, 0, 0)                    # 9: abort of 8
    caught_up(log)
    assert log.last_stable_offset == log.log_end_offset == 10
    assert m.first_offset == 8
    assert log.aborted_transactions(0, 10) == [AbortedTxn(8, 7, 9, 10)]
    assert log.aborted_transactions(10, 20) == []   # wholly before the fetch
    assert log.aborted_transactions(0, 7) == []     # starts at or after the end
    log.close()
    # the log is the truth: a reopen rebuilds the same state from the batches
    again = open_log(tmp_path / "t-0")
    caught_up(again)
    assert again.aborted_transactions(0, 10) == [AbortedTxn(8, 7, 9, 10)]
    assert again.last_stable_offset == 10
    again.close()


def test_reopen_keeps_an_ongoing_transaction_open(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(plain(1), 0)
    log.append_as_leader(txn_batch(2, 7, 0, 0), 0)
    log.close()
    again = open_log(tmp_path / "t-0")
    caught_up(again)
    assert again.last_stable_offset == 1
    again.append_marker(7, 0, False, 0, 0)
    caught_up(again)
    assert again.last_stable_offset == again.log_end_offset
    assert again.aborted_transactions(0, 100) == [AbortedTxn(7, 1, 3, 4)]
    again.close()


def test_truncating_a_marker_reopens_its_transaction(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(txn_batch(2, 7, 0, 0), 0)   # 0-1
    log.append_marker(7, 0, False, 0, 0)             # 2
    log.truncate_to(2)
    caught_up(log)
    assert log.last_stable_offset == 0 and log.aborted_transactions(0, 10) == []
    log.close()


def test_fencing_and_refusals(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(txn_batch(2, 7, 0, 0), 0)
    # the coordinator fences producer 7 (epoch 1) and aborts its transaction
    log.append_marker(7, 1, False, 0, 0)
    with pytest.raises(InvalidRecordError) as e:
        log.append_as_leader(txn_batch(1, 7, 0, 2), 0)   # the zombie
    assert e.value.error_code == ErrorCode.invalid_producer_epoch
    with pytest.raises(InvalidRecordError) as e:
        log.append_marker(7, 0, True, 0, 0)              # a stale marker
    assert e.value.error_code == ErrorCode.invalid_producer_epoch
    with pytest.raises(InvalidRecordError) as e:        # clients write no control batch
        log.append_as_leader(control_batch(7, 1, True, 0, T0), 0)
    assert e.value.error_code == ErrorCode.invalid_record
    with pytest.raises(InvalidRecordError) as e:
        log.append_as_leader(simple_batch(1, ts=T0, transactional=True), 0)
    assert e.value.error_code == ErrorCode.invalid_record
    # the producer's next epoch starts at sequence 0 and opens a new transaction
    nxt = log.append_as_leader(txn_batch(1, 7, 1, 0), 0)
    caught_up(log)
    assert log.last_stable_offset == nxt.first_offset
    log.close()


def test_a_follower_tracks_the_leaders_transactions(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "l-0")
    follower = open_log(tmp_path / "f-0")
    leader.append_as_leader(txn_batch(2, 7, 0, 0), 0)
    leader.append_as_leader(plain(1), 0)
    leader.append_marker(7, 0, False, 3, 0)
    leader.append_as_leader(txn_batch(1, 9, 0, 0), 0)
    caught_up(leader)
    data = leader.read(0, 1 << 20, max_offset=leader.log_end_offset, min_one_batch=True)
    follower.append_as_follower(data)
    caught_up(follower)
    assert follower.aborted_transactions(0, 100) == leader.aborted_transactions(0, 100)
    assert follower.last_stable_offset == leader.last_stable_offset == 4
    leader.close()
    follower.close()


def test_idle_producers_expire_but_not_one_with_an_open_transaction(tmp_path: Path) -> None:
    """producer.id.expiration.ms (Kafka's removeExpiredProducers): a producer whose last
    batch is that old is forgotten, unless its transaction here is still open; a
    forgotten producer's next batch is accepted at any sequence."""
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(simple_batch(1, ts=T0, producer_id=5, producer_epoch=0,
                                      base_sequence=0), 0)
    log.append_as_leader(txn_batch(1, 7, 0, 0), 0)
    assert log.expire_producers(T0 + 999, 1000) == 0
    assert log.expire_producers(T0 + 1000, 1000) == 1
    assert 5 not in log.producer_state.producers and 7 in log.producer_state.producers
    log.append_as_leader(simple_batch(1, ts=T0, producer_id=5, producer_epoch=0,
                                      base_sequence=9), 0)
    log.append_marker(7, 0, True, 0, 0)
    assert log.expire_producers(T0 + 1000, 1000) == 2  # the marker closed 7's transaction
    log.close()


def test_a_deposed_coordinators_marker_is_fenced_everywhere(tmp_path: Path) -> None:
    """Kafka's appendEndTxnMarker: a marker whose coordinator epoch is older than the
    newest of the producer's markers is TRANSACTION_COORDINATOR_FENCED. The case: the new
    coordinator (epoch 5, after a failover) committed producer 7's transaction, which then
    began another at the same producer epoch; the old coordinator's (epoch 4) late COMMIT
    would end that one. The epoch survives a reopen (from the snapshot, and from the log
    alone), an epoch bump, and reaches a follower from the replicated marker."""
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(txn_batch(2, 7, 0, 0), 0)
    log.append_marker(7, 0, True, 5, 0)                  # the new coordinator's commit
    nxt = log.append_as_leader(txn_batch(1, 7, 0, 2), 0)  # the next transaction
    with pytest.raises(InvalidRecordError) as e:
        log.append_marker(7, 0, True, 4, 0)              # the old coordinator's, late
    assert e.value.error_code == ErrorCode.transaction_coordinator_fenced
    caught_up(log)
    assert log.last_stable_offset == nxt.first_offset    # still open
    log.append_marker(7, 0, False, 5, 0)                 # the same epoch: fine
    data = log.read(0, 1 << 20, max_offset=log.log_end_offset, min_one_batch=True)
    log.close()
    for reopened in (open_log(tmp_path / "t-0"),):
        with pytest.raises(InvalidRecordError) as e:
            reopened.append_marker(7, 0, True, 4, 0)
        assert e.value.error_code == ErrorCode.transaction_coordinator_fenced
        reopened.close()
    for snap in (tmp_path / "t-0").glob("*.snapshot"):  # the log alone
        snap.unlink()
    again = open_log(tmp_path / "t-0")
    with pytest.raises(InvalidRecordError) as e:
        again.append_marker(7, 0, True, 4, 0)
    assert e.value.error_code == ErrorCode.transaction_coordinator_fenced
    again.append_as_leader(txn_batch(1, 7, 1, 0), 0)      # a new producer epoch
    with pytest.raises(InvalidRecordError) as e:
        again.append_marker(7, 1, False, 4, 0)
    assert e.value.error_code == ErrorCode.transaction_coordinator_fenced
    again.close()
    follower = open_log(tmp_path / "f-0")
    follower.append_as_follower(data)
    with pytest.raises(InvalidRecordError) as e:
        follower.append_marker(7, 0, True, 4, 0)         # the follower, leader now
    assert e.value.error_code == ErrorCode.transaction_coordinator_fenced
    follower.close()


def test_a_transactions_first_batch_needs_a_current_verification_guard(tmp_path: Path) -> None:
    """KIP-890 (issue 23): with verification on, a transactional batch of a producer with
    no ongoing transaction here is appended only with the guard of its verification,
    still current; the next batches of the open transaction need none; a guard outlived
    by a marker (the transaction aborted while the coordinator was asked: Kafka's ABA
    case) is refused, and so is one from another producer."""
    log = open_log(tmp_path / "t-0")
    refused = ErrorCode.invalid_txn_state
    with pytest.raises(InvalidRecordError) as e:
        log.append_as_leader(txn_batch(1, 7, 0, 0), 0, verify_txn=True)
    assert e.value.error_code == refused and log.log_end_offset == 0
    other = log.start_txn_verification(8)
    assert other is not None
    with pytest.raises(InvalidRecordError) as e:
        log.append_as_leader(txn_batch(1, 7, 0, 0), 0, verify_txn=True, guard=other)
    assert e.value.error_code == refused
    guard = log.start_txn_verification(7)
    assert guard is not None and log.start_txn_verification(7) is guard  # shared
    log.append_as_leader(txn_batch(1, 7, 0, 0), 0, verify_txn=True, guard=guard)  # 0
    assert log.start_txn_verification(7) is None  # ongoing: nothing to verify
    log.append_as_leader(txn_batch(2, 7, 0, 1), 0, verify_txn=True)  # 1-2
    # the guard was spent by the append
    assert not log.producer_state.is_verified(7, guard)
    log.append_marker(7, 0, False, 0, 0)  # 3: aborted
    stale = log.start_txn_verification(7)
    log.append_marker(7, 0, False, 0, 0)  # 4: a marker lands while the coordinator is asked
    with pytest.raises(InvalidRecordError) as e:
        log.append_as_leader(txn_batch(1, 7, 0, 3), 0, verify_txn=True, guard=stale)
    assert e.value.error_code == refused and log.log_end_offset == 5
    # verification off (transaction.partition.verification.enable=false): as before
    log.append_as_leader(txn_batch(1, 9, 0, 0), 0)
    assert log.txns.ongoing == {9: 5}
