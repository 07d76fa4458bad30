"""One ``headrace demo`` run for the whole test run (issue 22), and a reader of its summary.

The demo takes a minute (a Spark JVM, an embedded broker, 30 s of producing), so the tests
that only read what a run leaves behind (its summary, its audit, its warehouse and result
topics) share one run: ``run_shared_demo`` runs it once, from the session-scoped
``shared_demo`` fixture in ``tests/integration/conftest.py``. The run is the README's main
job as written: ``bash scripts/run.sh`` from this clone, with its defaults (30 s at 200
events/s, a new work directory under ``$TMPDIR``, the summary on stdout); where the tests run
with another clone's venv (a git worktree), ``bash scripts/run.sh`` would build a second
``.venv``, so the run is what that script execs, ``headrace demo`` with the same defaults.

Readers must not change what the run left (copy the broker's data before writing to it):
the next reader sees the same run. Runs that need something else (a kill -9, a Ctrl-C, a
broker prepared beforehand, a cluster) start a demo of their own.

``read_summary`` parses the summary a person reads (``format_summary`` and the audit report
in ``headrace.demo``); it fails, naming the line, when a line the README promises is missing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.readme import ROOT, commands

VENV = Path(sys.executable).parent.parent

# the demo's result topics and the warehouse table each one mirrors
RESULT_TOPICS = {"headrace-demo-activity-counts": "activity_counts",
                 "headrace-demo-word-counts": "word_counts"}
TABLES = ("landing", "activity_counts", "word_counts")
QUERIES = ("landing", "activity", "wordcount")


def in_clone() -> bool:
    """The tests run with this clone's own ``.venv`` (CI; ``bash scripts/test.sh``)."""
    return VENV.resolve() == (ROOT / ".venv").resolve()


@dataclass(frozen=True)
class DemoRun:
    """What one ``headrace demo`` run left: its exit status and output, and where its
    default work directory went."""

    as_written: bool  # the README's `bash scripts/run.sh` (else `headrace demo`)
    command: str
    returncode: int
    stdout: str  # progress and summary: text mode prints them here
    stderr: str
    tmpdir: Path  # $TMPDIR for the run: its default work directory lands in it
    elapsed_s: float

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    @property
    def workdir(self) -> Path:
        """The work directory the run printed first (``workdir: DIR (...)``)."""
        m = re.search(r"^workdir: (\S+) \(", self.stdout, re.M)
        assert m, f"no `workdir:` line in the demo's output:\n{self.stdout[:3000]}"
        return Path(m.group(1))


def run_shared_demo(tmpdir: Path, timeout_s: float = 420) -> DemoRun:
    """The README's main job as written (or the command it execs, outside the clone), with
    ``TMPDIR`` in ``tmpdir`` so that its default work directory lands there."""
    as_written = in_clone()
    if as_written:
        run, _ = commands("setup-commands")
        args = ["bash", "-c", run]
    else:
        args = [sys.executable, "-m", "headrace.cli", "demo"]
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    env.pop("HEADRACE_DEMO_FAILPOINT_BATCH", None)
    t0 = time.monotonic()
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout_s, check=False)
    return DemoRun(as_written, " ".join(args), r.returncode, r.stdout, r.stderr, tmpdir,
                   time.monotonic() - t0)


@dataclass(frozen=True)
class ResultTopic:
    records: int
    lost: int
    duplicated: int


@dataclass(frozen=True)
class Summary:
    """The numbers of the demo's text summary and audit report."""

    produced: int
    consumed: int
    lost: int
    duplicated: int
    records_in: int
    skipped: int
    spark_start_s: float
    group_lag: dict[str, int]
    tables: dict[str, tuple[int, Path]]  # table -> (rows, directory)
    topics: dict[str, ResultTopic]
    top_words: list[tuple[str, int]]
    warehouse: Path
    lines: list[str] = field(repr=False)  # from the line `summary` to the end


def _one(pattern: str, text: str, what: str) -> re.Match[str]:
    found = list(re.finditer(pattern, text, re.M))
    assert len(found) == 1, f"{len(found)} {what} line(s) in the demo's output:\n{text[-4000:]}"
    return found[0]


def read_summary(text: str) -> Summary:
    """Parse the demo's closing audit report and summary (text mode's stdout, or a
    ``--json`` run's stderr)."""
    audit = _one(r"^audit: produced (\d+), consumed (\d+), lost (\d+), duplicated (\d+) -> ",
                 text, "audit verdict")
    lines = text.splitlines()
    assert "summary" in lines, f"no summary in the demo's output:\n{text[-4000:]}"
    tail = lines[lines.index("summary"):]
    body = "\n".join(tail)
    lag = _one(r"^  consumer lag {6}(.*)$", body, "consumer lag").group(1)
    group_lag = {}
    for part in lag.split(", "):
        name, n = part.rsplit(" ", 1)
        group_lag[name.removeprefix("headrace-demo-")] = int(n)  # `?`: unknown, fails here
    tables = {m.group(1): (int(m.group(2)), Path(m.group(3))) for m in re.finditer(
        r"^  table (\S+) +(\d+)  (\S+)  \(", body, re.M)}
    topics = {m.group(1): ResultTopic(int(m.group(2)), int(m.group(3)), int(m.group(4)))
              for m in re.finditer(r"^  topic (\S+) +(\d+)  read_committed: lost (\d+), "
                                   r"duplicated (\d+) against its table$", body, re.M)}
    assert set(tables) == set(TABLES) and set(topics) == set(RESULT_TOPICS), body
    words = _one(r"^  top words \(latest count per word\): (.*)$", body, "top words").group(1)
    return Summary(
        produced=int(audit.group(1)), consumed=int(audit.group(2)), lost=int(audit.group(3)),
        duplicated=int(audit.group(4)),
        records_in=int(_one(r"^  records in +(\d+)  ", body, "records in").group(1)),
        skipped=int(_one(r"^  skipped +(\d+)  ", body, "skipped").group(1)),
        spark_start_s=float(_one(r"its start-up, ([\d.]+) s, excluded\)$", body,
                                 "throughput").group(1)),
        group_lag=group_lag, tables=tables, topics=topics,
        top_words=[(w, int(n)) for w, n in (p.rsplit(" ", 1) for p in words.split(", ") if p)],
        warehouse=Path(_one(r"^warehouse: (\S+)$", body, "warehouse").group(1)),
        lines=tail)


# the line the demo prints once, when Spark's first micro-batch landed rows
# (`spark: first micro-batch landed 1800 rows after 12.3 s`)
FIRST_BATCH_LANDED = re.compile(r"^spark: first micro-batch landed [1-9]\d* rows after ", re.M)


class OutputLines:
    """A running process's output, read line by line on a thread (the pipe never fills),
    with a wait for a line: the events a test acts on, instead of sleeps."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._ended = False
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        """The first line matching ``pattern``; fails when the output ends without one, or
        at the deadline."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    m = pattern.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                assert not self._ended, f"output ended before {pattern.pattern!r}:\n{self.text()}"
                assert left > 0, f"no {pattern.pattern!r} in {timeout_s} s:\n{self.text()}"
                self._changed.wait(left)

    def text(self) -> str:
        return "".join(self.lines)

    def join(self, timeout_s: float) -> str:
        """All of the output, once it ended (the process exited)."""
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the output did not end"
        return self.text()


def written_not_checkpointed(
    work: Path, queries: tuple[tuple[str, str], ...] = (("activity", "activity_counts"),
                                                          ("wordcount", "word_counts")),
) -> list[tuple[str, int]]:
    """(table, batch id) of batches committed to their warehouse table (``batch_id=N``)
    whose query's checkpoint has no commit for them (``commits/N``); by default the result
    queries'."""
    out = []
    for query, table in queries:
        commits = work / "checkpoints" / query / "commits"
        for batch in (work / "warehouse" / table).glob("batch_id=*"):
            n = int(batch.name.removeprefix("batch_id="))
            if not (commits / str(n)).exists():
                out.append((table, n))
    return out
