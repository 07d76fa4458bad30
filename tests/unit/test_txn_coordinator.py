"""The transaction coordinator's pure core (issue 10; R-PROD-2, R-PROTO-7):
``__transaction_state`` records in Kafka's formats and Kafka's state machine."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from headrace.txn.coordinator import MAX_EPOCH, Markers, TxnCoordinator, TxnWrite
from headrace.txn.records import (
    TxnLogValue,
    TxnRecordError,
    TxnState,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)

# ---------------------------------------------------------------------- records


def test_key_is_version_0_and_a_string() -> None:
    assert encode_key("tx-1") == b"\x00\x00\x00\x04tx-1"
    assert decode_key(encode_key("tx-1")) == "tx-1"
    with pytest.raises(TxnRecordError):
        decode_key(b"\x00\x01\x00\x01a")  # unknown version
    with pytest.raises(TxnRecordError):
        decode_key(b"\x00\x00\x00\x05ab")  # truncated


def test_value_v0_bytes_as_kafka_writes_them() -> None:
    """Field by field per TransactionLogValue.json v0 (non-flexible)."""
    v = TxnLogValue(producer_id=1000, producer_epoch=3, timeout_ms=60_000,
                    state=TxnState.ONGOING, partitions={"out": (0, 2)},
                    last_update_ms=1_700_000_000_123, start_ms=1_700_000_000_000)
    expected = (struct.pack(">hqhib", 0, 1000, 3, 60_000, 1)
                + struct.pack(">i", 1) + struct.pack(">h", 3) + b"out"
                + struct.pack(">iii", 2, 0, 2)
                + struct.pack(">qq", 1_700_000_000_123, 1_700_000_000_000))
    assert encode_value(v, version=0) == expected
    assert decode_value(expected) == v


def test_value_v1_flexible_with_tagged_fields() -> None:
    v = TxnLogValue(7, 1, 900, TxnState.EMPTY, None, 5, -1, previous_producer_id=6)
    data = encode_value(v, version=1)
    assert data is not None
    # version, pid, epoch, timeout, status, null compact array, two int64s,
    # then one tagged field: tag 0, size 8, previousProducerId
    assert data == (struct.pack(">hqhib", 1, 7, 1, 900, 0) + b"\x00"
                    + struct.pack(">qq", 5, -1) + b"\x01\x00\x08" + struct.pack(">q", 6))
    assert decode_value(data) == v
    # an unknown tag is skipped; the known ones still read
    with_extra = data[:-11] + b"\x02\x00\x08" + struct.pack(">q", 6) + b"\x09\x01\xff"
    assert decode_value(with_extra) == v


def test_empty_state_has_no_partitions_and_tombstones_are_none() -> None:
    with pytest.raises(ValueError):
        encode_value(TxnLogValue(1, 0, 1, TxnState.EMPTY, {"t": (0,)}, 0, 0))
    assert encode_value(None) is None and decode_value(None) is None


values = st.builds(
    TxnLogValue,
    producer_id=st.integers(-1, 2**63 - 1), producer_epoch=st.integers(-1, MAX_EPOCH),
    timeout_ms=st.integers(1, 2**31 - 1),
    state=st.sampled_from([s for s in TxnState if s != TxnState.EMPTY]),
    partitions=st.dictionaries(st.text(min_size=1, max_size=20),
                               st.lists(st.integers(0, 2**31 - 1), unique=True, max_size=5)
                               .map(lambda ps: tuple(sorted(ps))), max_size=4),
    last_update_ms=st.integers(-1, 2**62), start_ms=st.integers(-1, 2**62),
    previous_producer_id=st.integers(-1, 2**62), next_producer_id=st.integers(-1, 2**62),
    client_transaction_version=st.integers(0, 2),
)


@given(v=values, version=st.sampled_from([0, 1]))
def test_values_round_trip(v: TxnLogValue, version: int) -> None:
    data = encode_value(v, version)
    assert data is not None
    got = decode_value(data)
    assert got is not None
    if version == 0:  # no tagged fields in v0
        v = TxnLogValue(v.producer_id, v.producer_epoch, v.timeout_ms, v.state,
                        v.partitions, v.last_update_ms, v.start_ms)
    assert got == v


@given(v=values, version=st.sampled_from([0, 1]), data=st.data())
def test_every_truncation_is_a_record_error(v: TxnLogValue, version: int,
                                            data: st.DataObject) -> None:
    raw = encode_value(v, version)
    assert raw is not None
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(TxnRecordError):
        decode_value(raw[:cut])


# ---------------------------------------------------------------------- state machine


def coordinator(max_timeout_ms: int = 900_000) -> TxnCoordinator:
    ids = itertools.count(1000)
    return TxnCoordinator(lambda: next(ids), max_timeout_ms)


def apply(c: TxnCoordinator, out: TxnWrite | None, now: int = 0,
          log: list[TxnWrite] | None = None) -> Markers | None:
    """What the shell does: append the write (recorded in ``log``), then ``written``."""
    assert out is not None
    if log is not None:
        log.append(out)
    return c.written(out.transactional_id, True, now)


def begin(c: TxnCoordinator, tid: str = "tx", timeout: int = 60_000) -> tuple[int, int]:
    r = c.init_producer_id(tid, timeout, 0)
    assert r.error == ErrorCode.none
    apply(c, r.write)
    return r.producer_id, r.producer_epoch


def test_commit_path_prepare_markers_complete() -> None:
    c = coordinator()
    pid, epoch = begin(c)
    assert (pid, epoch) == (1000, 0) and c.txns["tx"].state == TxnState.EMPTY
    r = c.add_partitions("tx", pid, epoch, [("out", 0), ("out", 1)], 10)
    assert r.error == ErrorCode.none and r.write is not None
    assert r.write.value is not None and r.write.value.state == TxnState.ONGOING
    # while the record is being written, the id is busy
    assert c.end_txn("tx", pid, epoch, True, 11).error == ErrorCode.concurrent_transactions
    apply(c, r.write, 11)
    # adding what is already in: nothing to write
    again = c.add_partitions("tx", pid, epoch, [("out", 1)], 12)
    assert again.error == ErrorCode.none and again.write is None
    off = c.add_offsets("tx", pid, epoch, 7, 13)
    apply(c, off.write, 13)
    end = c.end_txn("tx", pid, epoch, True, 20)
    assert end.write is not None and end.write.value is not None
    assert end.write.value.state == TxnState.PREPARE_COMMIT
    markers = apply(c, end.write, 20)
    assert markers == Markers("tx", pid, epoch, True, frozenset(
        {("out", 0), ("out", 1), ("__consumer_offsets", 7)}))
    # a retried EndTxn while markers go out
    assert c.end_txn("tx", pid, epoch, True, 21).error == ErrorCode.concurrent_transactions
    assert c.end_txn("tx", pid, epoch, False, 21).error == ErrorCode.invalid_txn_state
    done = c.markers_done("tx", 30)
    assert done is not None and done.value is not None
    assert done.value.state == TxnState.COMPLETE_COMMIT and done.value.partitions == {}
    assert apply(c, done, 30) is None
    m = c.txns["tx"]
    assert m.state == TxnState.COMPLETE_COMMIT and not m.partitions
    assert c.end_txn("tx", pid, epoch, True, 31).error == ErrorCode.none  # retry: fine
    assert c.end_txn("tx", pid, epoch, False, 31).error == ErrorCode.invalid_txn_state
    # the next transaction starts afresh
    nxt = c.add_partitions("tx", pid, epoch, [("other", 3)], 40)
    apply(c, nxt.write, 40)
    assert c.txns["tx"].partitions == {("other", 3)} and c.txns["tx"].start_ms == 40


def test_verify_partitions_answers_as_kafkas_coordinator_and_changes_nothing() -> None:
    """KIP-890 (issue 23): a leader's verify_only question, every case of Kafka's
    ``handleVerifyPartitionsInTransaction``; the state is never touched."""
    c = coordinator()
    pid, epoch = begin(c)
    out0, out1 = ("out", 0), ("out", 1)
    v = c.verify_partitions
    assert v("", pid, epoch, [out0]) == {out0: ErrorCode.invalid_request}
    assert v("ghost", 42, 0, [out0]) == {out0: ErrorCode.invalid_producer_id_mapping}
    assert v("tx", pid + 1, epoch, [out0]) == {out0: ErrorCode.invalid_producer_id_mapping}
    assert v("tx", pid, epoch + 1, [out0]) == {out0: ErrorCode.producer_fenced}
    # Empty: no partition is in a transaction
    assert v("tx", pid, epoch, [out0]) == {out0: ErrorCode.invalid_txn_state}
    r = c.add_partitions("tx", pid, epoch, [out1], 10)
    # its record not yet written: not in the transaction yet
    assert v("tx", pid, epoch, [out1]) == {out1: ErrorCode.invalid_txn_state}
    apply(c, r.write, 10)
    before = c.txns["tx"].copy()
    assert v("tx", pid, epoch, [out0, out1]) == {out0: ErrorCode.invalid_txn_state,
                                                 out1: ErrorCode.none}
    assert c.txns["tx"] == before and c.txns["tx"].pending is None
    end = c.end_txn("tx", pid, epoch, False, 20)
    apply(c, end.write, 20)  # PrepareAbort: markers on their way
    assert v("tx", pid, epoch, [out1]) == {out1: ErrorCode.concurrent_transactions}
    apply(c, c.markers_done("tx", 30), 30)  # CompleteAbort: the partitions are gone
    assert v("tx", pid, epoch, [out1]) == {out1: ErrorCode.invalid_txn_state}


def test_errors_of_requests_naming_the_wrong_producer() -> None:
    c = coordinator()
    pid, epoch = begin(c)
    assert c.add_partitions("nope", pid, epoch, [("t", 0)], 1).error == \
        ErrorCode.invalid_producer_id_mapping
    assert c.add_partitions("tx", pid + 1, epoch, [("t", 0)], 1).error == \
        ErrorCode.invalid_producer_id_mapping
    assert c.add_partitions("tx", pid, epoch + 1, [("t", 0)], 1).error == \
        ErrorCode.producer_fenced
    assert c.end_txn("tx", pid, epoch, True, 1).error == ErrorCode.invalid_txn_state
    assert c.init_producer_id("", 1000, 0).error == ErrorCode.invalid_request
    assert c.init_producer_id("x", 0, 0).error == ErrorCode.invalid_transaction_timeout
    assert c.init_producer_id("x", 900_001, 0).error == ErrorCode.invalid_transaction_timeout


def test_a_second_producer_fences_the_first_and_aborts_its_transaction() -> None:
    """Zombie fencing: InitProducerId for an id with an Ongoing transaction bumps the
    epoch, aborts the transaction at the new epoch (markers to its partitions) and
    answers CONCURRENT_TRANSACTIONS; the retry gets the next epoch; the old producer is
    fenced."""
    c = coordinator()
    pid, e0 = begin(c)
    apply(c, c.add_partitions("tx", pid, e0, [("out", 0)], 5).write, 5)
    r = c.init_producer_id("tx", 60_000, 6)
    assert r.error == ErrorCode.concurrent_transactions and r.write is not None
    assert r.write.value is not None and r.write.value.state == TxnState.PREPARE_ABORT
    markers = apply(c, r.write, 6)
    assert markers == Markers("tx", pid, e0 + 1, False, frozenset({("out", 0)}))
    assert c.init_producer_id("tx", 60_000, 7).error == ErrorCode.concurrent_transactions
    apply(c, c.markers_done("tx", 8), 8)
    r2 = c.init_producer_id("tx", 60_000, 9)
    assert r2.error == ErrorCode.none and (r2.producer_id, r2.producer_epoch) == (pid, e0 + 2)
    apply(c, r2.write, 9)
    assert c.add_partitions("tx", pid, e0, [("out", 0)], 10).error == ErrorCode.producer_fenced
    assert c.end_txn("tx", pid, e0, True, 10).error == ErrorCode.producer_fenced


def test_kip360_init_with_a_stale_producer_is_fenced() -> None:
    c = coordinator()
    pid, e0 = begin(c)
    r = c.init_producer_id("tx", 60_000, 1, expected=(pid, e0))
    apply(c, r.write, 1)
    assert r.producer_epoch == e0 + 1
    # the previous (pid, epoch) may still ask (a retry); anything older is fenced
    assert c.init_producer_id("tx", 60_000, 2, expected=(pid, e0 + 5)).error == \
        ErrorCode.producer_fenced


def test_epoch_exhaustion_takes_a_new_producer_id() -> None:
    c = coordinator()
    begin(c)
    c.txns["tx"].producer_epoch = MAX_EPOCH - 1
    r = c.init_producer_id("tx", 60_000, 1)
    assert r.producer_id != 1000 and r.producer_epoch == 0
    apply(c, r.write, 1)
    assert c.txns["tx"].last_producer_id == 1000


def test_timed_out_transactions_are_aborted_with_the_producer_fenced() -> None:
    c = coordinator()
    pid, e0 = begin(c, timeout=1_000)
    apply(c, c.add_partitions("tx", pid, e0, [("out", 0)], 100).write, 100)
    assert c.timed_out(1_100) == []  # exactly at the timeout: not yet
    (w,) = c.timed_out(1_101)
    assert w.value is not None and w.value.state == TxnState.PREPARE_ABORT
    assert w.value.producer_epoch == e0 + 1
    markers = apply(c, w, 1_101)
    assert markers is not None and not markers.commit
    assert c.end_txn("tx", pid, e0, True, 1_102).error == ErrorCode.producer_fenced
    apply(c, c.markers_done("tx", 1_103), 1_103)
    assert c.txns["tx"].state == TxnState.COMPLETE_ABORT


def test_idle_ids_expire_as_tombstones() -> None:
    c = coordinator()
    begin(c)
    assert c.expired(999, 1_000) == []
    (w,) = c.expired(1_000, 1_000)
    assert w == TxnWrite("tx", None)
    assert c.init_producer_id("tx", 1_000, 1_000).error == ErrorCode.concurrent_transactions
    c.written("tx", True, 1_000)
    assert "tx" not in c.txns


def test_a_failed_write_changes_nothing() -> None:
    c = coordinator()
    pid, e0 = begin(c)
    r = c.add_partitions("tx", pid, e0, [("out", 0)], 1)
    assert c.written("tx", False, 1) is None
    assert c.txns["tx"].state == TxnState.EMPTY and c.txns["tx"].pending is None
    fresh = c.init_producer_id("new", 1_000, 2)
    assert fresh.write is not None
    c.written("new", False, 2)
    assert "new" not in c.txns
    assert r.write is not None


OPS = st.lists(st.tuples(
    st.sampled_from(["init", "add", "commit", "abort", "markers", "timeout", "expire",
                     "zombie"]),
    st.sampled_from(["a", "b"]), st.integers(0, 3)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=OPS)
def test_random_histories_keep_kafkas_invariants_and_the_log_rebuilds_them(
        ops: list[tuple[str, str, int]]) -> None:
    """Over random request histories (writes failing at random): epochs never go back;
    partitions are held only while Ongoing or preparing; and replaying the records that
    were appended into a fresh coordinator (a new leader loading the partition) gives the
    same state for every id, with the same markers still owed."""
    c = coordinator(max_timeout_ms=10_000)
    log: list[TxnWrite] = []
    producers: dict[str, tuple[int, int]] = {}
    epochs: dict[str, tuple[int, int]] = {}
    now = 0
    for op, tid, n in ops:
        now += 100 * (n + 1)
        out: TxnWrite | None = None
        granted: tuple[int, int] | None = None
        if op == "init":
            r = c.init_producer_id(tid, 1_000 * (n + 1), now)
            out = r.write
            if r.error == ErrorCode.none:
                granted = (r.producer_id, r.producer_epoch)  # once written
        elif op in ("add", "commit", "abort") and tid in producers:
            pid, epoch = producers[tid]
            r = (c.add_partitions(tid, pid, epoch, [(f"t{n}", n)], now) if op == "add"
                 else c.end_txn(tid, pid, epoch, op == "commit", now))
            out = r.write
        elif op == "zombie" and tid in producers:  # an old epoch keeps trying
            pid, epoch = producers[tid]
            r = c.add_partitions(tid, pid, epoch - 1, [("z", 0)], now)
            assert r.error in (ErrorCode.producer_fenced, ErrorCode.concurrent_transactions,
                               ErrorCode.invalid_producer_id_mapping)
        elif op == "markers":
            out = c.markers_done(tid, now)
        elif op == "timeout":
            for w in c.timed_out(now):
                c.written(w.transactional_id, True, now)
                log.append(w)
        elif op == "expire":
            for w in c.expired(now, 5_000):
                c.written(w.transactional_id, True, now)
                log.append(w)
                producers.pop(w.transactional_id, None)
        if out is not None:
            ok = n != 3  # one write in four fails
            if ok:
                log.append(out)
                if granted is not None:
                    producers[tid] = granted
            c.written(out.transactional_id, ok, now)
        for t, m in c.txns.items():
            assert m.pending is None
            key = (m.producer_id, m.producer_epoch)
            if t in epochs and epochs[t][0] == key[0]:
                assert key[1] >= epochs[t][1]
            epochs[t] = key
            holds = m.state in (TxnState.ONGOING, TxnState.PREPARE_COMMIT,
                                TxnState.PREPARE_ABORT)
            assert bool(m.partitions) == holds
    rebuilt = coordinator()
    for w in log:
        rebuilt.replay(w.transactional_id, w.value)
    assert set(rebuilt.txns) == set(c.txns)
    for t, m in c.txns.items():
        r = rebuilt.txns[t]
        assert (r.producer_id, r.producer_epoch, r.state, r.partitions, r.timeout_ms) == (
            m.producer_id, m.producer_epoch, m.state, m.partitions, m.timeout_ms)
    assert sorted(rebuilt.unfinished(), key=repr) == sorted(c.unfinished(), key=repr)


def test_describe_transactions_v0_decoded_by_hand_as_kio_writes_it() -> None:
    """``headrace transactions describe`` reads the response itself (kio's reader refuses
    the -1 start time of a transaction not begun): same result as kio on what kio reads,
    and -1 where kio cannot."""
    import datetime
    import io

    from kio.index import load_response_schema
    from kio.serial import entity_writer

    from headrace.protocol.entities import build
    from headrace.txn.describe import DescribedTxn, decode_describe_transactions_v0

    cls = load_response_schema(65, 0)
    body = {"throttle_time": 0, "transaction_states": [
        {"error_code": 0, "transactional_id": "t", "transaction_state": "Ongoing",
         "transaction_timeout": 60_000,
         "transaction_start_time": datetime.datetime.fromtimestamp(1.5, tz=datetime.UTC),
         "producer_id": 7, "producer_epoch": 2,
         "topics": [{"topic": "a", "partitions": [0, 3]}, {"topic": "b", "partitions": [1]}]},
        {"error_code": 105, "transactional_id": "u", "transaction_state": "",
         "transaction_timeout": 0,
         "transaction_start_time": datetime.datetime.fromtimestamp(-0.001, tz=datetime.UTC),
         "producer_id": 0, "producer_epoch": 0, "topics": []}]}
    buf = io.BytesIO()
    entity_writer(cls)(buf, build(cls, body))
    got = decode_describe_transactions_v0(buf.getvalue())
    assert got == [
        DescribedTxn(0, "t", "Ongoing", 60_000, 1500, 7, 2, (("a", 0), ("a", 3), ("b", 1))),
        DescribedTxn(105, "u", "", 0, -1, 0, 0, ())]
    with pytest.raises(ValueError):
        decode_describe_transactions_v0(buf.getvalue()[:-3])
