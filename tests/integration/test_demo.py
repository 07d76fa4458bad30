"""The README's main job and what it promises, read from one run (issue 22).

``bash scripts/run.sh`` (``headrace demo`` with its defaults: 30 s at 200 events/s, a new
work directory under ``$TMPDIR``) runs once per test run, in the session fixture
``shared_demo`` (``tests/demo_run.py``); every test here reads what that run left: its
output, its summary and audit, its warehouse and its broker's data (copied before anything
is written to it). R-SPARK-3 (the demo), R-SPARK-4 (its audit), issue 10 item 4 (the result
topics, written in the sink's transactional mode, hold exactly their tables' rows), issue 13
items 4 and 5 (the set-up command as written; a summary a person can read).

The demo runs that need something else are elsewhere, each its own run: killed with -9 and
rerun (``test_spark_demo_kill.py``), Ctrl-C and a broker other programs used
(``test_spark_demo.py``), on a cluster with a broker
killed (``tests/cluster/test_demo_cluster.py``). Under pytest-xdist this module is one
``xdist_group``, so that its readers share one worker and one run.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from confluent_kafka import Producer

from tests.brokerproc import BrokerProcess
from tests.clients import read_to_end
from tests.demo_run import QUERIES, RESULT_TOPICS, TABLES, DemoRun, Summary, read_summary

# the shared run's first reader waits for it (about a minute idle, several loaded)
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("demo")]

WORD_RESULTS, ACTIVITY_RESULTS = "headrace-demo-word-counts", "headrace-demo-activity-counts"


def _passed(run: DemoRun) -> Summary:
    assert run.returncode == 0, f"{run.command} exited {run.returncode}:\n{run.text[-4000:]}"
    return read_summary(run.stdout)


def test_main_job_as_written(shared_demo: DemoRun) -> None:
    """`bash scripts/run.sh`, as the README's set-up block writes it, from the clone with
    its own .venv: exit 0 (nothing lost, nothing duplicated, on the warehouse and on the
    result topics), no traceback. Where the tests run with another clone's venv (a git
    worktree) the script would build a second .venv: the shared run is then `headrace demo`,
    what the script execs, and this one check skips."""
    if not shared_demo.as_written:
        pytest.skip(f"tests run with {sys.executable}, not this clone's .venv: the script "
                    "would install a second one")
    assert shared_demo.returncode == 0, shared_demo.stderr[-4000:]
    assert "Traceback" not in shared_demo.text, shared_demo.text[-4000:]
    summary = read_summary(shared_demo.stdout)
    assert summary.warehouse.is_relative_to(shared_demo.tmpdir) and summary.warehouse.is_dir()
    assert all((t.lost, t.duplicated) == (0, 0) for t in summary.topics.values()), \
        summary.topics


def test_defaults_and_a_work_directory_kept_under_tmpdir(shared_demo: DemoRun) -> None:
    """The README: the default run is 30 s at 200 events/s; WORKDIR defaults to a new
    temporary directory ($TMPDIR/headrace-demo-*), kept after the run and printed at its
    start (`workdir:`) and end (its warehouse)."""
    summary = _passed(shared_demo)
    assert re.search(r"^producing ~200 events/s for 30 s ", shared_demo.stdout, re.M), \
        shared_demo.stdout[:3000]
    work = shared_demo.workdir
    assert work.parent == shared_demo.tmpdir and work.name.startswith("headrace-demo-")
    assert re.search(rf"^workdir: {re.escape(str(work))} \(.*kept after the run",
                     shared_demo.stdout, re.M), shared_demo.stdout[:3000]
    assert summary.warehouse == work / "warehouse"
    assert all((work / d).is_dir() for d in ("warehouse", "checkpoints", "broker"))


def test_demo_runs_end_to_end_and_its_audit_finds_no_loss_or_duplicates(
        shared_demo: DemoRun) -> None:
    """R-SPARK-3, R-SPARK-4: every produced record landed once (the audit against
    `__audit`'s announced counts), and the result topics, read with read_committed, hold
    exactly their warehouse tables' rows (issue 10 item 4); the consumer groups caught up."""
    s = _passed(shared_demo)
    assert s.produced > 0
    assert (s.lost, s.duplicated) == (0, 0)
    assert s.consumed == s.produced == s.tables["landing"][0]
    for topic, table in RESULT_TOPICS.items():
        t = s.topics[topic]
        assert (t.lost, t.duplicated) == (0, 0), (topic, t)
        assert t.records == s.tables[table][0] > 0, (topic, t, s.tables)
    assert s.group_lag == dict.fromkeys(QUERIES, 0)
    assert s.skipped == 0
    # the demo closes its clients before its broker: librdkafka has nothing to reconnect to
    assert "Connection refused" not in shared_demo.text, shared_demo.text[-3000:]


def test_the_summary_is_readable_and_its_pandas_lines_run(shared_demo: DemoRun) -> None:
    """Issue 13 item 5: progress says what is happening, the summary is a table of where
    every result is (no Python reprs), says the update-mode tables hold one row per key per
    batch, prints latest-per-key results, and ends with the warehouse's location; the pandas
    one-liners it prints run as written."""
    s = _passed(shared_demo)
    text = shared_demo.stdout
    assert "spark: starting (first start takes ~20 s)" in text, text[:3000]
    for line in text.splitlines():  # `landed 0` while Spark starts says so
        if re.search(r"landed\s+0\s", line):
            assert "Spark is starting" in line, line
    assert not [ln for ln in s.lines if re.search(r"[{(]'|\[\(", ln)], s.lines
    wh = s.warehouse
    assert {t: d for t, (_, d) in s.tables.items()} == {t: wh / t for t in TABLES}
    assert "one row per key per batch" in text
    assert s.top_words, s.lines
    assert [ln for ln in s.lines if ln.strip()][-2] == f"warehouse: {wh}", s.lines
    assert s.spark_start_s > 0
    hints = [ln.strip() for ln in s.lines if " -c 'import pandas as pd; " in ln]
    assert len(hints) == 3, s.lines
    for hint in hints:
        assert Path(shlex.split(hint)[0]).name.startswith("python"), hint
        r = subprocess.run(hint, shell=True, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip(), (hint, r.stderr[-2000:])
    words = subprocess.run(hints[0], shell=True, capture_output=True, text=True, timeout=60)
    word, count = s.top_words[0]
    assert re.search(rf"^{re.escape(word)}\s+{count}$", words.stdout, re.M), words.stdout


def test_audit_command_checks_the_result_topics_from_before_the_first_run(
        shared_demo: DemoRun, tmp_path: Path) -> None:
    """Issue 10 item 4: `headrace audit --warehouse` checks the result topics too, from
    where they stood before the work directory's first run (`results-start.json`): against
    the demo's broker data (a copy), reopened by a broker process, with one committed result
    record duplicated by hand, it finds that duplicate, nothing else, and exits 1."""
    s = _passed(shared_demo)
    work = shared_demo.workdir
    assert (work / "results-start.json").is_file()
    shutil.copytree(work / "broker", tmp_path / "broker")
    with BrokerProcess(tmp_path / "broker") as b:
        words = read_to_end(b.bootstrap, WORD_RESULTS, 1, "read_committed", 30)
        assert len(words) == s.topics[WORD_RESULTS].records
        p = Producer({"bootstrap.servers": b.bootstrap})
        p.produce(WORD_RESULTS, words[0], partition=0)
        assert p.flush(30) == 0
        audit = subprocess.run(
            [sys.executable, "-m", "headrace.cli", "audit", "--bootstrap", b.bootstrap,
             "--warehouse", str(work / "warehouse"), "--json"],
            capture_output=True, text=True, timeout=300)
    assert "Traceback" not in audit.stderr, audit.stderr[-3000:]
    doc = json.loads(audit.stdout.strip().splitlines()[-1])
    assert (doc["produced"], doc["lost"], doc["duplicated"]) == (s.produced, 0, 0)
    results = doc["results_audit"]
    assert (results[WORD_RESULTS]["lost"], results[WORD_RESULTS]["duplicated"]) == (0, 1)
    assert (results[ACTIVITY_RESULTS]["lost"], results[ACTIVITY_RESULTS]["duplicated"]) \
        == (0, 0)
    assert audit.returncode == 1, audit.stderr[-3000:]
