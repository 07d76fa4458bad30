"""Consumer-group benchmark: rebalance times and offset-commit rates, headrace and Tansu.

    .venv/bin/python bench/groups.py [--broker headrace|tansu|both] [--repeats 3]

Starts each broker as a subprocess (bench/harness/brokers.py; headrace a second time with
``-o group.initial.rebalance.delay.ms=0``) and measures, with confluent-kafka consumers
(classic protocol, range assignor, session.timeout.ms=6000, heartbeat.interval.ms=500), each
member its own process (bench/harness/group_member.py):

- join: 5 members subscribe to a 10-partition topic; time from the first subscribe() until
  all 5 hold a non-empty assignment and together cover all 10 partitions;
- kill: one member of the stable group is SIGKILLed (no LeaveGroup); time until the other
  4 hold new assignments covering all partitions (the broker must wait out its session);
- rejoin: a fresh member joins the 4 (group not empty, so no initial delay): until the 5
  cover all partitions again;
- leave: one member close()s (LeaveGroup); until the other 4 cover all partitions;
- commits: one assign()-mode consumer commits one partition's offset at a time for 5 s,
  synchronously, then asynchronously with at most 16 commits in flight; then the same
  with the C load generator (``bench/build/loadgen -O``, built by ``bench/setup.sh``),
  ``--repeats`` runs of 20,000 synchronous and 50,000 asynchronous commits (median and
  spread, broker CPU per commit): confluent-kafka's Python calls add to each round trip.

Each group timing is repeated (default 3, each with a fresh group) and the median reported.
Every wait is capped (default 20 s); a measurement that fails once is not repeated and is
reported with the reason. Markdown goes to stdout, progress to stderr. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition
from harness import workloads
from harness.brokers import (
    BROKER_NAMES,
    QUIET_LOGGER,
    BrokerProcess,
    BrokerStartError,
    broker_version,
    start_broker,
)
from harness.group_member import HEARTBEAT_INTERVAL_MS, SESSION_TIMEOUT_MS

MEMBER_SCRIPT = Path(__file__).resolve().parent / "harness" / "group_member.py"
GROUP_SIZE = 5
PARTITIONS = 10
READY_TIMEOUT_S = 30.0  # member processes started, connected, topic known
CLOSE_TIMEOUT_S = 10.0
DELAY_KEY = "group.initial.rebalance.delay.ms"

# Rows of the table, in order: key -> label.
ROWS: dict[str, str] = {
    "join": f"{GROUP_SIZE} members join → stable, s",
    "join0": f"… with {DELAY_KEY}=0, s",
    "kill": "1 of 5 SIGKILLed (session 6 s) → 4 stable, s",
    "rejoin": "new member joins the 4 → 5 stable, s",
    "leave": "1 of 5 closes (LeaveGroup) → 4 stable, s",
    "sync": "offset commits, synchronous, /s",
    "async": "offset commits, async ≤{inflight} in flight, /s",
    "c_sync": "offset commits, synchronous, C client (loadgen -O), /s",
    "c_async": "offset commits, async ≤{inflight} in flight, C client, /s",
}
LOADGEN = Path(__file__).resolve().parent / "build" / "loadgen"
C_COMMITS = {"c_sync": 20_000, "c_async": 50_000}

TANSU_JOIN_NOTE = (f"tansu has no {DELAY_KEY} (nor any other group setting); instead, at every "
                   "rebalance, it waits a fixed 3 s before answering a JoinGroup from any member "
                   "but the leader (PAUSE_MS in its group coordinator's source), which accounts "
                   "for most of its times here")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _describe(e: BaseException) -> str:
    if os.environ.get("BENCH_TRACEBACK"):
        traceback.print_exception(e)
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text}" if not isinstance(e, MeasureError) else text


class MeasureError(RuntimeError):
    """A measurement could not be made (timed out, refused by the broker, ...)."""


# -- results ------------------------------------------------------------------------------------


@dataclass
class Measurement:
    """Samples of one row for one broker; ``note`` explains a failure or a caveat."""

    samples: list[float] = field(default_factory=list)
    failure: str | None = None
    note: str | None = None

    @property
    def failed(self) -> bool:
        return self.failure is not None


@dataclass
class BrokerResult:
    name: str
    version: str
    rows: dict[str, Measurement] = field(default_factory=dict)
    error: str | None = None  # could not start / died

    def row(self, key: str) -> Measurement:
        return self.rows.setdefault(key, Measurement())


# -- the member processes -----------------------------------------------------------------------


class Member:
    """One group_member.py process and what it last reported."""

    def __init__(self, index: int, process: subprocess.Popen[str], stderr_path: Path) -> None:
        self.index = index
        self.process = process
        self.stderr_path = stderr_path
        self.ready = False
        self.subscribed_ns: int | None = None
        self.assignment: frozenset[int] = frozenset()
        self.assigned_ns = 0  # when the current assignment arrived (0: none since revoke)
        self.closing_ns: int | None = None
        self.exited = False
        self.errors: list[str] = []

    def send(self, command: str) -> None:
        stdin = self.process.stdin
        if stdin is None or self.exited:
            return
        with contextlib.suppress(OSError, ValueError):
            stdin.write(command + "\n")
            stdin.flush()


class Group:
    """Consumer-group members, each a subprocess, and the condition they are watched with."""

    def __init__(self, bootstrap: str, topic: str, group_id: str, workdir: Path) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.group_id = group_id
        self.workdir = workdir
        self.members: list[Member] = []
        self.cond = threading.Condition()
        self.all_partitions = frozenset(range(PARTITIONS))

    # process management
    def spawn(self, count: int) -> list[Member]:
        new: list[Member] = []
        for _ in range(count):
            index = len(self.members)
            stderr_path = self.workdir / f"{self.group_id}-member{index}.stderr"
            with stderr_path.open("w") as stderr:
                process = subprocess.Popen(
                    [sys.executable, str(MEMBER_SCRIPT), self.bootstrap, self.group_id,
                     self.topic, f"bench-member-{index}"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                    bufsize=1)
            member = Member(index, process, stderr_path)
            self.members.append(member)
            new.append(member)
            threading.Thread(target=self._read, args=(member,), daemon=True,
                             name=f"member-{index}").start()
        if not self.wait(lambda: all(m.ready or m.exited for m in new), READY_TIMEOUT_S):
            raise MeasureError(f"members not ready after {READY_TIMEOUT_S:g} s")
        dead = [m for m in new if m.exited]
        if dead:
            raise MeasureError(f"a member process exited at start: {self.stderr_tail(dead[0])}")
        return new

    def _read(self, member: Member) -> None:
        stdout = member.process.stdout
        assert stdout is not None
        for line in stdout:
            kind, _, rest = line.strip().partition(" ")
            stamp, _, detail = rest.partition(" ")
            with self.cond:
                if kind == "ready":
                    member.ready = True
                elif kind == "subscribed":
                    member.subscribed_ns = int(stamp)
                elif kind == "assigned":
                    member.assignment = frozenset(
                        int(p) for p in detail.split(",") if p not in ("", "-"))
                    member.assigned_ns = int(stamp)
                elif kind in ("revoked", "lost"):
                    member.assignment = frozenset()
                    member.assigned_ns = 0
                elif kind == "closing":
                    member.closing_ns = int(stamp)
                elif kind == "error" and len(member.errors) < 5:
                    member.errors.append(detail)
                self.cond.notify_all()
        member.process.wait()
        with self.cond:
            member.exited = True
            self.cond.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def stderr_tail(self, member: Member) -> str:
        try:
            lines = member.stderr_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "?"
        return lines[-1] if lines else f"exit code {member.process.returncode}"

    # the measured steps
    def subscribe(self, members: Sequence[Member]) -> int:
        """Tell ``members`` to subscribe; the earliest subscribe() time (monotonic ns)."""
        for m in members:
            m.send("go")
        if not self.wait(lambda: all(m.subscribed_ns is not None or m.exited for m in members),
                         READY_TIMEOUT_S):
            raise MeasureError("members did not subscribe")
        return min(m.subscribed_ns or 0 for m in members)

    def stable_since(self, members: Sequence[Member], since_ns: int) -> int | None:
        """When ``members`` last got assignments, if all got non-empty ones after ``since_ns``
        that together cover every partition; else None. Call with ``cond`` held."""
        if any(m.exited or not m.assignment or m.assigned_ns <= since_ns for m in members):
            return None
        if frozenset().union(*(m.assignment for m in members)) != self.all_partitions:
            return None
        return max(m.assigned_ns for m in members)

    def wait_stable(self, members: Sequence[Member], since_ns: int, cap: float) -> float:
        """Seconds from ``since_ns`` until ``members`` are stable (see ``stable_since``)."""
        done: list[int] = []

        def check() -> bool:
            at = self.stable_since(members, since_ns)
            if at is not None:
                done.append(at)
            return at is not None

        if not self.wait(check, cap):
            raise MeasureError(f"not stable after {cap:g} s{self._state(members)}")
        return (done[0] - since_ns) / 1e9

    def _state(self, members: Sequence[Member]) -> str:
        with self.cond:
            sizes = [len(m.assignment) for m in members]
            errors = sorted({e for m in members for e in m.errors})
        text = f" (partitions held per member: {sizes}"
        if errors:
            text += f"; client errors: {'; '.join(errors[:2])}"
        return text + ")"

    def kill(self, member: Member) -> int:
        """SIGKILL ``member`` (a process this benchmark started); the time just before."""
        at = time.monotonic_ns()
        with contextlib.suppress(ProcessLookupError):
            os.kill(member.process.pid, signal.SIGKILL)
        member.process.wait(CLOSE_TIMEOUT_S)
        return at

    def leave(self, member: Member) -> int:
        """Ask ``member`` to close() (LeaveGroup); when it started closing."""
        member.send("close")
        if not self.wait(lambda: member.closing_ns is not None or member.exited,
                         CLOSE_TIMEOUT_S) or member.closing_ns is None:
            raise MeasureError("the leaving member did not start closing")
        return member.closing_ns

    def shutdown(self) -> None:
        live = [m for m in self.members if m.process.poll() is None]
        for m in live:
            m.send("close")
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for m in live:
            try:
                m.process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    m.process.kill()
                m.process.wait(CLOSE_TIMEOUT_S)
        for m in self.members:
            for stream in (m.process.stdin, m.process.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


# -- group rebalance timings --------------------------------------------------------------------


def group_timings(broker: BrokerProcess, result: BrokerResult, *, repeats: int, cap: float,
                  join_key: str, full: bool, workdir: Path) -> None:
    """``repeats`` fresh groups: join, then (``full``) kill, rejoin, leave, each timed."""
    topic = workloads.unique_topic("bench-groups")
    workloads.create_topic(broker.bootstrap, topic, PARTITIONS)
    keys = [join_key, *(("kill", "rejoin", "leave") if full else ())]
    try:
        for rep in range(repeats):
            if result.row(join_key).failed or not broker.alive:
                break
            group = Group(broker.bootstrap, topic, workloads.unique_topic("bench-group"),
                          workdir)
            try:
                _one_cycle(group, result, rep, cap, join_key, full)
            except MeasureError as e:  # spawning the members failed: nothing to time
                for key in keys:
                    if not result.row(key).failed:
                        result.row(key).failure = str(e)
            finally:
                group.shutdown()
    finally:
        workloads.delete_topics(broker.bootstrap, [topic])


def _one_cycle(group: Group, result: BrokerResult, rep: int, cap: float, join_key: str,
               full: bool) -> None:
    name = result.name if join_key == "join" else f"{result.name} ({DELAY_KEY}=0)"

    def timed(key: str, step: Callable[[], float]) -> bool:
        row = result.row(key)
        if row.failed:
            return False
        try:
            seconds = step()
        except MeasureError as e:
            row.failure = str(e)
            log(f"[{name}] {key} #{rep + 1}: failed: {e}")
            return False
        row.samples.append(seconds)
        log(f"[{name}] {key} #{rep + 1}: {seconds:.2f} s")
        return True

    members = group.spawn(GROUP_SIZE)
    if not timed(join_key, lambda: group.wait_stable(members, group.subscribe(members), cap)):
        return
    if not full:
        return
    # kill, rejoin (back to 5), leave; a step that failed in an earlier round is skipped, and
    # a step failing now ends the round (the group is not known to be stable).
    live = list(members)
    if not result.row("kill").failed:
        victim = live.pop()
        if not timed("kill", lambda: group.wait_stable(live, group.kill(victim), cap)):
            return

        def rejoin() -> float:
            newcomer = group.spawn(1)
            live.extend(newcomer)
            return group.wait_stable(live, group.subscribe(newcomer), cap)

        if not result.row("rejoin").failed and not timed("rejoin", rejoin):
            return
    leaver = live.pop()
    if timed("leave", lambda: group.wait_stable(live, group.leave(leaver), cap)) \
            and len(live) != GROUP_SIZE - 1:
        result.row("leave").note = f"from {len(live) + 1} members (rejoin had failed)"


# -- offset commits -----------------------------------------------------------------------------


class _Served(Exception):
    """Raised from on_commit so that poll() returns as soon as a commit result is served."""


def commit_rates(broker: BrokerProcess, result: BrokerResult, *, seconds: float,
                 inflight: int, repeats: int = 3) -> None:
    topic = workloads.unique_topic("bench-commits")
    workloads.create_topic(broker.bootstrap, topic, PARTITIONS)
    try:
        for key, runner in (("sync", _sync_commits), ("async", _async_commits)):
            row = result.row(key)
            try:
                rate, note = runner(broker, topic, seconds, inflight)
                row.samples.append(rate)
                row.note = note
                log(f"[{result.name}] {key} commits: {rate:,.0f}/s{f' ({note})' if note else ''}")
            except (MeasureError, KafkaException) as e:
                row.failure = _describe(e)
                log(f"[{result.name}] {key} commits: failed: {row.failure}")
        for key, count in C_COMMITS.items():
            row = result.row(key)
            if not LOADGEN.is_file():
                row.failure = "no bench/build/loadgen (bash bench/setup.sh)"
                continue
            cpu_per: list[float] = []
            for _ in range(repeats):
                cpu0 = broker.cpu_seconds() or 0.0
                argv = [str(LOADGEN), "-O", "-b", broker.bootstrap, "-t", topic,
                        "-p", str(PARTITIONS), "-n", str(count), "-T", "120"]
                if key == "c_async":
                    argv += ["-a", str(inflight)]
                out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
                lines = out.stdout.strip().splitlines()
                r = json.loads(lines[-1]) if lines else {}
                if out.returncode != 0 or not r:
                    row.failure = (f"loadgen: {r.get('answered', 0)} of {count} answered, "
                                   f"{r.get('failed', '?')} failed: {out.stderr.strip()[-120:]}")
                    break
                row.samples.append(float(r["commits_per_s"]))
                cpu_per.append(((broker.cpu_seconds() or 0.0) - cpu0) / count * 1e6)
            if cpu_per:
                row.note = f"broker CPU {statistics.median(cpu_per):.0f} µs per commit"
                log(f"[{result.name}] {key}: {statistics.median(row.samples):,.0f}/s "
                    f"({row.note})")
    finally:
        workloads.delete_topics(broker.bootstrap, [topic])


def _commit_consumer(bootstrap: str, topic: str, extra: dict[str, Any]) -> Consumer:
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": workloads.unique_topic("bench-commit"),
        "group.protocol": "classic",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "logger": QUIET_LOGGER,
        **extra,
    })
    # assign() mode: no group membership; commits carry generation -1 and no member id.
    # OFFSET_END: fetch from the (empty) end, so nothing reads the committed offsets back.
    consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(PARTITIONS)])
    return consumer


def _offsets(n: int, topic: str) -> list[TopicPartition]:
    """The n-th commit: one partition, round-robin, at an ever larger offset."""
    return [TopicPartition(topic, n % PARTITIONS, 1 + n // PARTITIONS)]


def _warm_up(consumer: Consumer, topic: str) -> None:
    """One synchronous commit before the clock: finds the coordinator, or says why not."""
    deadline = time.monotonic() + 15.0
    while True:
        try:
            parts = consumer.commit(offsets=_offsets(0, topic), asynchronous=False)
            errors = [p.error for p in parts or [] if p.error is not None]
            if not errors:
                return
            problem = str(errors[0])
        except KafkaException as e:
            problem = str(e.args[0])
        if time.monotonic() > deadline:
            raise MeasureError(f"unsupported: the first commit failed: {problem}")
        time.sleep(0.2)


def _sync_commits(broker: BrokerProcess, topic: str, seconds: float,
                  _inflight: int) -> tuple[float, str | None]:
    consumer = _commit_consumer(broker.bootstrap, topic, {})
    try:
        _warm_up(consumer, topic)
        ok = failed = 0
        first_error: str | None = None
        start = time.perf_counter()
        stop_at = start + seconds
        n = 1
        while time.perf_counter() < stop_at:
            try:
                parts = consumer.commit(offsets=_offsets(n, topic), asynchronous=False)
                error = next((p.error for p in parts or [] if p.error is not None), None)
            except KafkaException as e:
                error = e.args[0]
            if error is None:
                ok += 1
            else:
                failed += 1
                first_error = first_error or str(error)
            n += 1
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    return ok / elapsed, _failures(failed, ok, first_error)


@dataclass
class _AsyncState:
    ok: int = 0
    failed: int = 0
    first_error: str | None = None
    raise_when_served: bool = False

    @property
    def done(self) -> int:
        return self.ok + self.failed


def _async_commits(broker: BrokerProcess, topic: str, seconds: float,
                   inflight: int) -> tuple[float, str | None]:
    state = _AsyncState()

    def on_commit(err: KafkaError | None, parts: list[TopicPartition]) -> None:
        error = err or next((p.error for p in parts if p.error is not None), None)
        if error is None:
            state.ok += 1
        else:
            state.failed += 1
            state.first_error = state.first_error or str(error)
        if state.raise_when_served:
            # poll() keeps waiting out its timeout after serving callbacks; an exception from
            # the callback makes librdkafka yield, so the loop can issue the next commit now.
            raise _Served

    consumer = _commit_consumer(broker.bootstrap, topic, {"on_commit": on_commit})
    try:
        _warm_up(consumer, topic)
        consumer.poll(0)
        state.ok = state.failed = 0
        state.raise_when_served = True
        issued = 0
        start = time.perf_counter()
        stop_at = start + seconds
        while (now := time.perf_counter()) < stop_at:
            if issued - state.done < inflight:
                consumer.commit(offsets=_offsets(issued + 1, topic), asynchronous=True)
                issued += 1
                continue
            with contextlib.suppress(_Served):
                consumer.poll(min(0.1, max(stop_at - now, 0.001)))
        elapsed = time.perf_counter() - start
        ok, failed = state.ok, state.failed  # completed within the window
        state.raise_when_served = False
        drain_until = time.monotonic() + 5.0
        while state.done < issued and time.monotonic() < drain_until:
            consumer.poll(0.05)
    finally:
        state.raise_when_served = False
        consumer.close()
    return ok / elapsed, _failures(failed, ok, state.first_error)


def _failures(failed: int, ok: int, first: str | None) -> str | None:
    return f"{failed:,} of {failed + ok:,} failed: {first}" if failed else None


# -- brokers ------------------------------------------------------------------------------------


def run_broker(name: str, args: argparse.Namespace, workdir: Path) -> BrokerResult:
    result = BrokerResult(name, broker_version(name))
    configs: list[tuple[str, dict[str, str]]] = [("join", {})]
    if name == "headrace":
        configs.append(("join0", {DELAY_KEY: "0"}))
    for join_key, overrides in configs:
        label = name + (f" ({DELAY_KEY}=0)" if overrides else "")
        log(f"[{label}] starting {result.version}")
        try:
            broker = start_broker(name, args.data_root, overrides)
        except (BrokerStartError, OSError) as e:
            result.error = f"{label} could not start: {e}"
            log(f"[{label}] could not start: {e}")
            return result
        try:
            full = not overrides
            group_timings(broker, result, repeats=args.repeats, cap=args.cap,
                          join_key=join_key, full=full, workdir=workdir)
            if full and broker.alive:
                commit_rates(broker, result, seconds=args.commit_seconds,
                             inflight=args.inflight, repeats=args.repeats)
            if not broker.alive:
                result.error = (f"{label} exited with code {broker.process.returncode} during "
                                f"the run; log ends:\n{broker.log_tail()}")
        except Exception as e:  # topic creation and the like: report, keep the other broker
            result.error = f"{label}: {_describe(e)}"
            log(f"[{label}] failed: {result.error}")
        finally:
            broker.stop()
    return result


# -- report -------------------------------------------------------------------------------------


def _cell(m: Measurement | None, key: str, notes: list[str], who: str) -> str:
    if m is None:
        return "—"
    rate = key in ("sync", "async", "c_sync", "c_async")
    text = "—"
    if m.samples:
        median = statistics.median(m.samples)
        if rate:
            text = f"{median:,.0f}"
            if len(m.samples) > 1:
                text += f" ({min(m.samples):,.0f}-{max(m.samples):,.0f})"
        else:
            text = f"{median:.2f}"
            if len(m.samples) > 1:
                text += f" ({min(m.samples):.2f}-{max(m.samples):.2f})"
    if m.failure is not None:
        notes.append(f"{who}, {ROWS[key].split(',')[0]}: {m.failure}")
        mark = f"[{len(notes)}]"
        if m.samples:
            text += f" {mark} ({len(m.samples)} run{'s' if len(m.samples) > 1 else ''})"
        else:
            failure = m.failure
            word = "unsupported" if failure.startswith("unsupported") else (
                "no rebalance" if failure.startswith("not stable") else "failed")
            text = f"{word} {mark}"
    elif m.note:
        notes.append(f"{who}, {ROWS[key].split(',')[0]}: {m.note}")
        text += f" [{len(notes)}]"
    return text


def markdown(results: Sequence[BrokerResult], args: argparse.Namespace) -> str:
    env = {
        "cores": os.cpu_count(), "python": platform.python_version(),
        "confluent-kafka": importlib.metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "repeats": f"{args.repeats} (median, min-max)", "wait cap": f"{args.cap:g} s",
        "members": f"classic protocol, range assignor, session.timeout.ms={SESSION_TIMEOUT_MS}, "
                   f"heartbeat.interval.ms={HEARTBEAT_INTERVAL_MS}",
    }
    parts = ["## headrace consumer-group benchmark", "",
             ", ".join(f"{k}: {v}" for k, v in env.items()),
             "; ".join(r.version for r in results), ""]
    for r in results:
        if r.error:
            first = r.error.strip().splitlines()[0]
            parts += [f"**{r.name} failed:** {first} (full message on stderr)", ""]
    header = ["measurement", *(r.name for r in results)]
    lines = ["| " + " | ".join(header) + " |",
             "| --- |" + " ---: |" * len(results)]
    notes: list[str] = []
    for key, label in ROWS.items():
        label = label.format(inflight=args.inflight)
        cells = []
        for r in results:
            if key == "join0" and r.name == "tansu" and r.rows:
                notes.append(TANSU_JOIN_NOTE)
                cells.append(f"no such setting [{len(notes)}]")
            else:
                cells.append(_cell(r.rows.get(key), key, notes, r.name))
        lines.append("| " + " | ".join([label, *cells]) + " |")
    parts += lines
    if notes:
        parts += [""] + [f"- [{i}] {n}" for i, n in enumerate(notes, 1)]
    parts.append("")
    return "\n".join(parts)


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=[*BROKER_NAMES, "both"], default="both",
                        help="which broker(s) to run against (default: both)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="fresh groups per timing; the median is reported (default 3)")
    parser.add_argument("--cap", type=float, default=20.0,
                        help="longest wait for a group to become stable, s (default 20)")
    parser.add_argument("--commit-seconds", type=float, default=5.0,
                        help="length of each offset-commit phase (default 5)")
    parser.add_argument("--inflight", type=int, default=16,
                        help="most asynchronous commits in flight (default 16)")
    parser.add_argument("--data-root", type=Path, default=None,
                        help="where headrace's temp data dir goes (default: the temp dir)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = list(BROKER_NAMES) if args.broker == "both" else [args.broker]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-groups-") as tmp:
        results = [run_broker(name, args, Path(tmp)) for name in names]
    print(markdown(results, args))
    for r in results:
        if r.error and "\n" in r.error:
            log(r.error)
    log(f"total {time.monotonic() - started:.0f} s")
    return 0 if all(r.error is None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
