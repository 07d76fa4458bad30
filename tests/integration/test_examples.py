"""The README's examples run as users run them (R-REL-1..6).

``examples/wordcount_reliable.py`` (seed 001's sentences -> split -> count, exactly-once
counts in SQLite) is run with the venv's python against a ``headrace broker`` process; its
printed counts and its SQLite table must be exactly the sentences' word counts times the
number of copies sent.
"""

from __future__ import annotations

import collections
import re
import shlex
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokerproc import BrokerProcess
from tests.readme import commands

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "wordcount_reliable.py"

pytestmark = pytest.mark.timeout(120)

# seed 001's sentences, as the example sends them (kept here: the test must not take its
# expected answer from the code under test)
SENTENCES = [
    "the cow jumped over the moon",
    "an apple a day keeps the doctor away",
    "four score and seven years ago",
    "snow white and the seven dwarfs",
    "i am at two with nature",
]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("examples")
    with BrokerProcess(data, {"group.initial.rebalance.delay.ms": "0"}) as b:
        yield b


def test_wordcount_reliable_counts_every_word_exactly_once(broker: BrokerProcess,
                                                           tmp_path: Path) -> None:
    """R-REL-6: the example's topology over a real broker prints, and stores in SQLite,
    each word's count exactly ``repeat`` times its count in the sentences, and exits 0."""
    repeat = 7
    topic = f"sentences-{uuid.uuid4().hex[:6]}"
    db = tmp_path / "words.sqlite"
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--bootstrap", broker.bootstrap, "--topic", topic,
         "--repeat", str(repeat), "--db", str(db), "--timeout", "60"],
        cwd=ROOT, capture_output=True, text=True, timeout=100, check=False)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr

    want = collections.Counter(w for s in SENTENCES for w in s.split())
    want = collections.Counter({w: n * repeat for w, n in want.items()})
    printed = {m.group(1): int(m.group(2))
               for m in re.finditer(r"^(\S+)\s+(\d+)$", r.stdout, re.M)}
    assert printed == dict(want), r.stdout
    assert "all words counted exactly once" in r.stdout

    with sqlite3.connect(db) as conn:
        stored = dict(conn.execute("SELECT value, count(*) FROM words GROUP BY value"))
        keys = [k for (k,) in conn.execute("SELECT key FROM words")]
    assert stored == dict(want)
    # one row per (partition, offset, word index) of the topic: every sentence's every word
    assert len(keys) == len(set(keys)) == sum(want.values())
    assert all(k.startswith(f"{topic}/") for k in keys)
    assert not [line for line in broker.stderr_lines if "Traceback" in line], \
        "".join(broker.stderr_lines)


def test_wordcount_reliable_runs_twice_on_the_default_topic(broker: BrokerProcess) -> None:
    """Issue 13 items 3 and 4: the README's command as written (the default topic
    ``sentences``, 20 copies), its address made this broker's, run twice on one broker: the
    second run counts only its own sentences and passes too."""
    (line,) = commands("reliable-wordcount")
    argv = shlex.split(line.replace("127.0.0.1:9092", broker.bootstrap))
    assert argv[:2] == [".venv/bin/python", "examples/wordcount_reliable.py"]
    want = collections.Counter(w for s in SENTENCES for w in s.split())
    for run in (1, 2):
        r = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True,
                           text=True, timeout=100, check=False)
        assert r.returncode == 0, f"run {run}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert "all words counted exactly once" in r.stdout, r.stdout
        printed = {m.group(1): int(m.group(2))
                   for m in re.finditer(r"^(\S+)\s+(\d+)$", r.stdout, re.M)}
        assert printed == {w: n * 20 for w, n in want.items()}, (run, r.stdout)
