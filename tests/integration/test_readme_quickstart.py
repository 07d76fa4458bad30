"""The README's quickstart, run as a user runs it (issue 13: "start a broker, produce,
consume, watch a group's lag, open the console, scrape metrics — each step a command that a
test runs").

Each block's lines are run with bash in a fresh directory, in order, as written; what
changes is only what must be free on a shared machine: the broker's port comes from
``HEADRACE_PORT`` and the clients' from ``HEADRACE_BOOTSTRAP`` (both documented), and the
literal ports 9092, 9404 and 8080 are replaced by free ones. The expected answers come from
a confluent-kafka client, not from the commands under test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.brokerproc import wait_until
from tests.conftest import require_tool
from tests.ports import reserve_port
from tests.readme import ROOT, commands, readme_block

pytestmark = pytest.mark.timeout(240)

VENV = Path(sys.executable).parent.parent  # the venv running the tests


def free_port() -> int:
    return reserve_port()  # outside the ephemeral range (tests/ports.py)


class Shell:
    """Runs README lines in one directory with the venv activated, ports made free."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.ports = {"9092": free_port(), "9404": free_port(), "8080": free_port()}
        self.bootstrap = f"127.0.0.1:{self.ports['9092']}"
        self.env = {**os.environ, "HEADRACE_PORT": str(self.ports["9092"]),
                    "HEADRACE_BOOTSTRAP": self.bootstrap}
        for name in ("HEADRACE_DATA_DIR", "HEADRACE_COMMAND_CONFIG", "HEADRACE_VERBOSE"):
            self.env.pop(name, None)
        self.background: list[tuple[subprocess.Popen[bytes], Path]] = []

    def line(self, text: str) -> str:
        for literal, port in self.ports.items():
            text = re.sub(rf"\b{literal}\b", str(port), text)
        return text

    def script(self, line: str) -> str:
        # `. .venv/bin/activate` as the README says, with the venv that runs these tests
        return f"set -o pipefail; . {VENV}/bin/activate; {self.line(line)}"

    def run(self, line: str, timeout_s: float = 60) -> str:
        r = subprocess.run(["bash", "-c", self.script(line)], cwd=self.cwd, env=self.env,
                           capture_output=True, text=True, timeout=timeout_s, check=False)
        assert r.returncode == 0, f"{line!r}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert "Traceback" not in r.stderr, r.stderr
        return r.stdout

    def start(self, line: str) -> tuple[subprocess.Popen[bytes], Path]:
        assert line.endswith("&"), line
        log = self.cwd / f"background-{len(self.background)}.log"
        with log.open("wb") as out:
            # `CMD &` in the user's shell: here the same command, its output kept
            proc = subprocess.Popen(
                ["bash", "-c", f". {VENV}/bin/activate; exec {self.line(line[:-1])}"],
                cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.background.append((proc, log))
        return proc, log

    def stop(self) -> None:
        for proc, log in reversed(self.background):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            text = log.read_text(errors="replace")
            assert "Traceback" not in text, text


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    sh = Shell(tmp_path_factory.mktemp("quickstart"))
    yield sh
    sh.stop()


def _http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except OSError:
        return 0, ""


def test_1_start_a_broker(shell: Shell) -> None:
    setup, activate, start = commands("quickstart-broker")
    assert setup == "bash scripts/setup.sh"
    assert activate == ". .venv/bin/activate"
    if VENV.resolve() == (ROOT / ".venv").resolve():
        # the set-up line as written, in the clone (a second run only checks the install)
        r = subprocess.run(["bash", "-c", setup], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, check=False)
        assert r.returncode == 0, r.stderr
        assert "setup: done" in r.stderr
    proc, log = shell.start(start)

    def listening() -> bool:
        assert proc.poll() is None, log.read_text()
        return f"listening on {shell.bootstrap}" in log.read_text()

    wait_until(listening, 30, 0.05, "the quickstart's broker")
    assert (shell.cwd / "data").is_dir()  # ./data, relative to where it was started


def test_2_produce_and_consume_as_a_group(shell: Shell) -> None:
    create, produce, consume = commands("quickstart-produce-consume")
    shell.run(create)
    shell.run(produce)
    out = shell.run(consume)
    # what a plain client reads from the topic, from the beginning
    c = Consumer({"bootstrap.servers": shell.bootstrap, "group.id": f"check-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        parts = c.list_topics("greetings", timeout=10).topics["greetings"].partitions
        assert len(parts) == 3
        c.assign([TopicPartition("greetings", p, 0) for p in parts])
        seen: list[str] = []
        wait_until(lambda: _poll_into(c, seen) and len(seen) >= 3, 20, 0, "3 records")
    finally:
        c.close()
    assert sorted(out.splitlines()) == sorted(seen)
    assert sorted(seen) == ["alice hello", "bob hi", "carol hey"]


def _poll_into(c: Consumer, seen: list[str]) -> bool:
    m = c.poll(0.5)
    if m is not None and m.error() is None:
        seen.append(f"{m.key().decode()} {m.value().decode()}")
    return True


def test_3_watch_the_groups_lag(shell: Shell) -> None:
    produce, lag = commands("quickstart-lag")
    shell.run(produce)
    out = shell.run(lag)
    # the expected lag from the client's view: high watermark - committed, per partition
    c = Consumer({"bootstrap.servers": shell.bootstrap, "group.id": "readers"})
    try:
        parts = [TopicPartition("greetings", p)
                 for p in range(3)]
        committed = c.committed(parts, timeout=10)
        want = {}
        for tp in committed:
            if tp.offset < 0:
                continue  # a partition the group never read (no key landed there)
            _, high = c.get_watermark_offsets(TopicPartition("greetings", tp.partition),
                                              timeout=10)
            want[tp.partition] = high - tp.offset
    finally:
        c.close()
    assert sum(want.values()) == 1
    rows = {}
    for row in out.splitlines():
        cells = row.split()
        if cells[:2] == ["readers", "greetings"] and cells[-1].isdigit():
            rows[int(cells[2])] = int(cells[-1])
    assert rows == want, out
    assert "TOTAL-LAG 1" in out


def test_4_console_and_metrics(shell: Shell) -> None:
    console, scrape = commands("quickstart-console-metrics")
    proc, log = shell.start(console)
    url = f"http://127.0.0.1:{shell.ports['8080']}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        return _http_get(url + "/")[0] == 200

    wait_until(up, 30, 0.1, "the web console")
    status, page = _http_get(url + "/")
    assert "headrace" in page.lower()
    status, topics = _http_get(url + "/api/topics")
    assert status == 200 and "greetings" in topics
    out = shell.run(scrape)
    counts = dict(re.findall(
        r'^kafka_server_brokertopicmetrics_messagesin_total\{topic="([^"]+)"\} (\S+)$',
        out, re.M))
    assert float(counts["greetings"]) == 4.0, out


def test_5_any_kafka_tool(shell: Shell) -> None:
    require_tool("kcat")
    produce, consume = commands("quickstart-kcat")
    shell.run(produce)
    assert shell.run(consume) == "hello\n"


def test_6_embedded(tmp_path: Path) -> None:
    code = readme_block("embedded-broker").replace('"/tmp/hr"', repr(str(tmp_path / "hr")))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"127\.0\.0\.1:\d+\n", r.stdout), r.stdout
    assert (tmp_path / "hr").is_dir()


def _paste(shell: Shell, name: str, timeout_s: float = 90) -> str:
    """A README Python block pasted into `.venv/bin/python` (stdin), the broker's port made
    this test's."""
    r = subprocess.run([sys.executable, "-"], input=shell.line(readme_block(name)),
                       cwd=shell.cwd, capture_output=True, text=True, timeout=timeout_s,
                       check=False)
    assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    return r.stdout


def _greetings(shell: Shell) -> list[tuple[int, int, bytes, bytes]]:
    """(partition, offset, key, value) of every record in greetings, read by a plain client."""
    c = Consumer({"bootstrap.servers": shell.bootstrap, "group.id": f"check-{uuid.uuid4()}",
                  "enable.partition.eof": True})
    try:
        c.assign([TopicPartition("greetings", p, 0) for p in range(3)])
        out: list[tuple[int, int, bytes, bytes]] = []
        eof: set[int] = set()

        def drained() -> bool:
            for m in c.consume(100, 0.5):
                if m.error() is None:
                    out.append((m.partition(), m.offset(), m.key(), m.value()))
                else:
                    eof.add(m.partition())
            return len(eof) == 3

        wait_until(drained, 20, 0, "the end of greetings")
        return out
    finally:
        c.close()


def test_7_reliable_consumer_example(shell: Shell) -> None:
    """The guaranteed-processing example on the quickstart's topic: it prints every record
    once, and its group's commits reach the end of every partition."""
    records = _greetings(shell)
    out = _paste(shell, "reliable-example")
    assert sorted(out.splitlines()) == sorted(f"{p} {o} {k!r} {v!r}" for p, o, k, v in records)
    c = Consumer({"bootstrap.servers": shell.bootstrap, "group.id": "reliable-readers"})
    try:
        for tp in c.committed([TopicPartition("greetings", p) for p in range(3)], timeout=10):
            _, high = c.get_watermark_offsets(tp, timeout=10)
            assert tp.offset == high or (high == 0 and tp.offset < 0), tp
    finally:
        c.close()


def test_8_transactions_example_twice(shell: Shell) -> None:
    """The consume-transform-produce example, run twice: the output, read with
    read_committed, holds every greeting upper-cased exactly once."""
    records = _greetings(shell)
    first = _paste(shell, "transactions-ctp")
    assert sum(int(n) for n in re.findall(r"^(\d+) records transformed$", first, re.M)) \
        == len(records)
    assert _paste(shell, "transactions-ctp") == ""  # nothing new: the offsets committed
    c = Consumer({"bootstrap.servers": shell.bootstrap, "group.id": f"check-{uuid.uuid4()}",
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        parts = c.list_topics("greetings-upper", timeout=10).topics["greetings-upper"]
        c.assign([TopicPartition("greetings-upper", p, 0) for p in parts.partitions])
        got: list[tuple[bytes, bytes]] = []
        eof: set[int] = set()

        def drained() -> bool:
            for m in c.consume(100, 0.5):
                if m.error() is None:
                    got.append((m.key(), m.value()))
                else:
                    eof.add(m.partition())
            return len(eof) == len(parts.partitions)

        wait_until(drained, 20, 0, "the end of greetings-upper")
    finally:
        c.close()
    assert sorted(got) == sorted((k, v.upper()) for _, _, k, v in records)
