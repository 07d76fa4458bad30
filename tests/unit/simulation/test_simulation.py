"""The deterministic cluster simulation (``headrace simulate``, issue 21): seeds are clean on
the real cores, a seed replays byte for byte (also in another process with another
PYTHONHASHSEED), and each checker catches a one-line change to the rules at a recorded
seed (the README's table)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from tests.sim_mutations import MUTATIONS

from headrace.simulation.command import simulate_command
from headrace.simulation.faults import Fault
from headrace.simulation.run import check_seed, run_seed

# mutation -> (the first seed from 0 that catches it, the property it violates)
CAUGHT = {
    "rejoin_without_catching_up": (46, "log matching"),
    "never_truncate": (3, "liveness"),
    "hw_ignores_followers": (0, "no acknowledged record lost"),
    "count_fetch_past_end": (3, "log matching"),
    "election_keeps_epoch": (2, "one leader per epoch"),
    "hw_follows_candidate": (8, "high watermark monotonic"),
    "consumer_reads_past_hw": (0, "consumer read committed"),
    "no_duplicate_detection": (0, "no duplicate"),
    # transactions
    "aborted_lookup_by_first_offset": (0, "read_committed returns committed transactions only"),
    "lso_is_high_watermark": (0, "read_committed returns committed transactions only"),
    "markers_not_retried_at_new_leader": (26, "no hanging transaction"),
    "abort_keeps_producer_epoch": (29, "read_committed returns committed transactions only"),
    "coordinator_epoch_unchecked": (1545, "read_committed returns committed transactions only"),
}


def simulate(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(simulate_command, list(args))
    return r.exit_code, r.output


def test_seeds_are_clean() -> None:
    code, out = simulate("--seeds", "20")
    assert code == 0, out
    assert out.splitlines()[-1].startswith("20 seed(s) from 0 clean:")
    assert " 0 records acknowledged" not in out


def test_every_fault_kind_appears_and_stays_clean() -> None:
    from headrace.simulation.faults import KINDS

    for i, kind in enumerate(KINDS):
        faults = [Fault(kind, i % 3, 700, 900 if kind not in ("expire", "ctlloss") else 0),
                  Fault("leadercrash", (i + 1) % 2, 1900, 400)]
        r = run_seed(1000 + i, faults=faults)
        assert r.ok, (kind, r.violation)
        assert r.acks > 50


def test_same_seed_same_lines_in_process_and_across_hash_seeds() -> None:
    args = ["--seed", "2", "--trace"]
    code, first = simulate(*args)
    assert code == 0 and "FAULT" in first and "leads" in first
    assert simulate(*args)[1] == first
    for hash_seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run([sys.executable, "-m", "headrace.cli", "simulate", *args],
                             env=env, capture_output=True, text=True, check=True).stdout
        assert out == first


@pytest.mark.parametrize("mutation", sorted(CAUGHT))
def test_each_mutation_is_caught_at_its_seed(mutation: str) -> None:
    seed, prop = CAUGHT[mutation]
    assert run_seed(seed).ok  # the real rules pass this seed
    with MUTATIONS[mutation]():
        code, out = simulate("--seed", str(seed))
    lines = out.splitlines()
    assert code == 1, out
    assert lines[0].startswith(f"seed {seed}: FAILED {prop}:"), out
    assert lines[2].startswith(f"seed {seed}: shrunk to (")
    assert lines[3].startswith(f"seed {seed}: replay: headrace simulate --seed {seed}")


def test_shrunk_schedule_replays_the_same_failure() -> None:
    seed, prop = CAUGHT["markers_not_retried_at_new_leader"]
    with MUTATIONS["markers_not_retried_at_new_leader"]():
        res, shrunk = check_seed(seed)
        assert res.violation is not None and shrunk is not None
        assert 0 < len(shrunk) < len(res.faults)
        sched = ",".join(f.describe() for f in shrunk)
        code, out = simulate("--seed", str(seed), "--faults", sched)
        again = simulate("--seed", str(seed), "--faults", sched)
    assert code == 1 and f"FAILED {prop}" in out
    assert again == (code, out)
    assert f"shrunk to ({len(shrunk)}): {sched}" in out


def test_fault_text_round_trips_and_rejects_unknown_kinds() -> None:
    f = Fault("minority", 2, 1143, 187)
    assert Fault.parse(f.describe()) == f
    with pytest.raises(ValueError, match="unknown fault kind"):
        Fault.parse("meteor:1@5+5")


def test_an_isr_write_without_answer_dropped_loses_acknowledged_records() -> None:
    """Found by the simulation (seed 500): a leader whose ISR expansion got no answer (the
    write was applied in ZooKeeper, the answer lost in a network cut) and that drops it
    with ``isr_failed`` — as ``cluster_node._change_isr`` does on an exception — stops
    counting the joiner while ZooKeeper has it in the ISR; the joiner is elected later
    without the records acknowledged meanwhile. Kept pending until a re-read tells, the
    seed is clean."""
    from headrace.simulation.world import Params

    assert run_seed(500, params=Params(transactions=False)).ok
    r = run_seed(500, params=Params(isr_error_drops_change=True, transactions=False))
    assert r.violation is not None and r.violation.prop == "log matching", r.violation


def test_a_restarted_broker_leading_from_a_reread_moves_the_hw_back() -> None:
    """Found by the simulation (seed 27, shrunk to one fault ``leadercrash:1@852+79``): the
    leader of a partition restarts; once its old session expired it registers and re-reads
    the state znode, which still names it leader at epoch 0 (the controller has not handled
    the bounce yet). Leading from that re-read — as ``cluster_node._transition`` does — it
    serves a high watermark from its checkpoint, below the one it served before in the same
    epoch. Waiting for the controller's LeaderAndIsr (a new epoch first), it is clean."""
    from headrace.simulation.world import Params

    schedule = [Fault.parse("leadercrash:1@852+79")]
    assert run_seed(27, params=Params(hw_checkpoint_ms=60, transactions=False),
                    faults=schedule).ok
    r = run_seed(27, params=Params(hw_checkpoint_ms=60, reread_leads=True, transactions=False),
                 faults=schedule)
    assert r.violation is not None and r.violation.prop == "high watermark monotonic"


def test_a_leader_takes_the_controllers_isr_when_its_own_change_is_settled_otherwise() -> None:
    """Found by the long run (seed 24946 of 20,000-24,999, three faults): a leader's ISR
    expansion is written but its answer lost; the controller, meanwhile, removes another
    replica from the ISR it read (which includes the joiner). The simulated broker then
    failed its pending change and kept its old ISR instead of the controller's, so the
    high watermark moved past the joiner's log end while ZooKeeper listed the joiner in
    sync; the joiner was elected and an acknowledged record was lost. The real
    ``Partition.update_state`` takes the newer state's ISR; the simulation's shell now
    does too."""
    from headrace.simulation.world import Params

    schedule = [Fault.parse(f) for f in
                ("leadercrash:2@915+524", "zkcut:2@1142+892", "crash:1@2024+1298")]
    r = run_seed(24946, params=Params(transactions=False), faults=schedule)
    assert r.ok, r.violation


@pytest.mark.parametrize(("seed", "faults"), [
    (20233, ("slowdisk:2@2422+859",)),
    (17649, ("crash:0@1949+890", "slowdisk:0@2549+607", "crash:2@2779+918")),
])
def test_a_late_answer_to_a_marker_never_counts_for_the_next_transaction(
        seed: int, faults: tuple[str, ...]) -> None:
    """Found by the long run with transactions: a marker written twice (the first answer
    late), and the late answer arrived while the next transaction's markers (same producer
    id and epoch: an abort does not bump it) were pending; the coordinator's shell matched
    answers by (producer id, epoch) only and took it for the new marker, so that
    transaction's marker was never written at that partition and a read_committed consumer
    later returned its aborted record. An answer is bound to its request (Kafka's
    correlation id): a marker job's number travels with the marker and back. The seeds
    were found with the sender of the time (a copy resent while one was in flight), which
    ``marker_resend_in_flight`` replays; with the number both are clean, also under
    today's sender."""
    from headrace.simulation.world import Params

    schedule = [Fault.parse(f) for f in faults]
    r = run_seed(seed, faults=schedule, params=Params(marker_resend_in_flight=True))
    assert r.ok, r.violation
    r = run_seed(seed, faults=schedule)
    assert r.ok, r.violation


def test_a_marker_is_not_resent_while_a_copy_is_in_flight() -> None:
    """Found by the long run (seed 5351 of 5,000-9,999): transaction 6's abort marker at
    partition 1 waited at the leader for the high watermark past its request timeout; the
    coordinator sent it again on its own timer, and again after the leader's timeout answer,
    so two copies were in flight. One answered ok, the transaction completed, the next one
    began writing at partition 1 — and the other copy arrived there, same producer id and
    epoch (an abort does not bump it), and aborted the committed transaction 7's record.
    Kafka's marker sender keeps one request in flight per broker and re-enqueues a marker
    only after an error or a disconnect; so does the simulation's now."""
    from headrace.simulation.world import Params

    schedule = [Fault.parse(f) for f in
                ("zkcut:0@1455+1311", "pause:0@1986+56", "zkcut:0@2708+293")]
    r = run_seed(5351, faults=schedule, params=Params(marker_resend_in_flight=True))
    assert r.violation is not None and r.violation.prop == "transaction atomicity", r.violation
    r = run_seed(5351, faults=schedule)
    assert r.ok, r.violation


def test_transactions_commit_abort_time_out_and_resume_after_coordinator_failover() -> None:
    """Seed 2's transactional workload covers the coordinator's paths: commits and aborts,
    transactions aborted by their timeout, and a new coordinator (the controller lost)
    sending the markers of a transaction its predecessor had prepared; every transaction
    checker stays clean."""
    r = run_seed(2, tracing=True)
    assert r.ok, r.violation
    assert r.committed > 0 and r.aborted > 0
    trace = "\n".join(r.trace)
    assert "timed out: abort" in trace
    assert "resumes markers" in trace
    assert " marker commit at " in trace and " marker abort at " in trace


def test_read_committed_drops_an_aborted_transaction_from_a_fetch_starting_inside_it() -> None:
    """The consumer's filter over the real ``TxnTracker``: a transaction at offsets 1-3,
    aborted at 4, then a committed one at 5-6 (marker 7); reads from any offset return the
    plain and committed records only."""
    from headrace.log.transactions import TxnTracker
    from headrace.simulation import txn as sx

    pid = 1000
    log = [(0, 100, 0, -1, sx.DATA, -1)]
    log += [(0, pid, s, 0, sx.DATA, -1) for s in range(3)]
    log += [(0, pid, -5, 0, sx.ABORT_MARKER, 1)]
    log += [(0, pid, s, 0, sx.DATA, -1) for s in range(3, 5)]
    log += [(0, pid, -8, 0, sx.COMMIT_MARKER, 1)]
    tracker = TxnTracker()
    for o, rec in enumerate(log):
        sx.track(tracker, o, rec)
    assert tracker.last_stable_offset(6) == 5  # the second transaction is not stable yet
    assert tracker.last_stable_offset(len(log)) == len(log)
    for start in range(len(log)):
        aborted = [(a.producer_id, a.first_offset) for a in tracker.aborted_in(start, len(log))]
        kept = [o for o, _ in sx.read_committed(log[start:], start, aborted)]
        assert kept == [o for o in (0, 5, 6) if o >= start], start
