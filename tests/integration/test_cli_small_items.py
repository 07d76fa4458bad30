"""Issue 26 item 7, the CLI's smaller defects, against an in-process broker: a reader that
goes away ends a command quietly with exit 0 (``groups describe | head``), one spelling for
"does not exist", ``quotas describe`` says when there are none, and a keyless record refused
by a compacted topic gets a hint."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

from headrace.cli import main
from tests.inproc import InProcessBroker


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("small-items"), {"num.partitions": "1"}) as b:
        yield b


def run(*args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin,
                              env={"HEADRACE_BOOTSTRAP": None, "HEADRACE_COMMAND_CONFIG": None})


def test_a_reader_that_goes_away_ends_the_command_with_exit_0(
        broker: InProcessBroker, capfd: pytest.CaptureFixture[str]) -> None:
    """``headrace topics list | head -0``: stdout's pipe closed before the command writes;
    exit 0 and nothing on stderr (no ``headrace: BrokenPipeError``, exit 1)."""
    for i in range(3):
        assert run("topics", "create", "-b", broker.bootstrap, "--topic",
                   f"pipe-{i}-{uuid.uuid4().hex[:4]}").exit_code == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone
    saved_fd, saved_stdout = os.dup(1), sys.stdout
    os.dup2(write_end, 1)
    os.close(write_end)
    sys.stdout = os.fdopen(os.dup(1), "w")
    code: object = None
    try:
        main.main(["topics", "list", "-b", broker.bootstrap], prog_name="headrace")
    except SystemExit as e:
        code = e.code
    finally:
        with contextlib.suppress(OSError):
            sys.stdout.close()
        sys.stdout = saved_stdout
        os.dup2(saved_fd, 1)
        os.close(saved_fd)
    assert code == 0
    assert "BrokenPipe" not in capfd.readouterr().err


def test_not_found_is_spelled_one_way(broker: InProcessBroker) -> None:
    bs = ("-b", broker.bootstrap)
    for argv, what in ((("topics", "describe", "--topic", "nope"), "topic 'nope'"),
                       (("transactions", "find-hanging", "--topic", "nope"),
                        "topic 'nope'"),
                       (("groups", "describe", "nope"), "consumer group 'nope'"),
                       (("consume", "nope", "-e"), "topic 'nope'")):
        r = run(*argv, *bs, stdin=b"x\n")
        assert r.exit_code == 1, (argv, r.stderr)
        assert r.stderr.strip() == f"headrace: {what} does not exist", (argv, r.stderr)


def test_quotas_describe_says_when_there_are_none(broker: InProcessBroker) -> None:
    r = run("quotas", "describe", "-b", broker.bootstrap)
    assert r.exit_code == 0 and r.stdout == ""
    assert r.stderr == "headrace: no client quotas are set\n"
    r = run("quotas", "describe", "-b", broker.bootstrap, "--user", "alice")
    assert r.exit_code == 0 and r.stderr == "headrace: no client quotas match\n"


def test_a_keyless_record_to_a_compacted_topic_gets_a_hint(broker: InProcessBroker) -> None:
    t = f"compacted-{uuid.uuid4().hex[:6]}"
    assert run("topics", "create", "-b", broker.bootstrap, "--topic", t, "--config",
               "cleanup.policy=compact").exit_code == 0
    r = run("produce", t, "-b", broker.bootstrap, stdin=b"hello\n")
    assert r.exit_code == 1
    assert "1 failed" in r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"headrace: hint: {t} is a compacted topic (cleanup.policy=compact): it takes only "
        "records with a key; give each line a key and name the separator, e.g. "
        "'user-1:hello' with -K :")
    r = run("produce", t, "-b", broker.bootstrap, "-K", ":", stdin=b"user-1:hello\n")
    assert r.exit_code == 0 and "hint" not in r.stderr
