"""Issue 13, item 4: every command in the README is run by a test.

Every fenced block a user can copy (shell, Python, properties files) is named with a
``<!-- test: NAME -->`` line, and some test under ``tests/`` asks for it by that name
(``readme_block("NAME")``, ``commands("NAME")``; see ``tests/readme.py``). A command written
inline (``.venv/bin/...``, ``bash scripts/...``, ``curl ...``) must be one of the named blocks'
lines, so it is run too. The Benchmarks section is the exception: its inline commands say how
each published number was measured, take minutes to hours, and are documented in
``bench/README.md``."""

from __future__ import annotations

import re
from pathlib import Path

from tests.readme import README, ROOT, readme_blocks

RUNNABLE = {"sh", "bash", "python", "properties"}
COMMAND_PREFIXES = (".venv/bin/", "bash scripts/", "python ", "python3 ", "pip ", "curl ",
                    "kcat ", ". scripts/")
# synopses in the command reference: a command's shape, not a line to paste
SYNOPSIS = re.compile(r"[|\[]|\.\.\.|\b[A-Z]{2,}\b")


def _test_sources() -> str:
    here = Path(__file__).resolve()
    return "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py") if p != here)


def test_every_runnable_block_is_named_once() -> None:
    blocks = readme_blocks()
    unnamed = [f"README.md:{b.line} ({b.lang})" for b in blocks
               if b.lang in RUNNABLE and b.name is None]
    assert not unnamed, f"blocks without a <!-- test: NAME --> line: {unnamed}"
    names = [b.name for b in blocks if b.name]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert len(names) >= 15


def test_every_named_block_is_asked_for_by_a_test() -> None:
    sources = _test_sources()
    unused = [b.name for b in readme_blocks()
              if b.name and f'"{b.name}"' not in sources and f"'{b.name}'" not in sources]
    assert not unused, f"README blocks no test runs: {unused}"


def test_inline_commands_are_in_named_blocks() -> None:
    text = README.read_text()
    bench = text.index("\n## Benchmarks")
    body = text[:bench] + text[text.index("\n## ", bench + 5):] if "\n## " in text[bench + 5:] \
        else text[:bench]
    body = re.sub(r"^```.*?^```", "", body, flags=re.S | re.M)  # fenced blocks
    in_blocks = "\n".join(b.text for b in readme_blocks() if b.name)
    loose = []
    for span in re.findall(r"`([^`\n]+)`", body):
        if not span.startswith(COMMAND_PREFIXES) or SYNOPSIS.search(span):
            continue
        if span not in in_blocks:
            loose.append(span)
    assert not loose, f"inline commands that no named block (and so no test) runs: {loose}"


def test_the_checks_catch_an_unnamed_block_and_a_loose_command(tmp_path: Path) -> None:
    """The checks above can fail: a README with an unnamed block and a named one."""
    readme = tmp_path / "README.md"
    readme.write_text("x\n```sh\necho hi\n```\n<!-- test: one -->\n```python\nprint(1)\n```\n")
    blocks = readme_blocks(readme)
    assert [(b.name, b.lang, b.text, b.line) for b in blocks] == [
        (None, "sh", "echo hi\n", 2), ("one", "python", "print(1)\n", 6)]


def test_the_protocol_table_says_what_the_broker_serves() -> None:
    """Issue 26 defect 7: the README's protocol table listed the client-quota APIs (48, 49)
    as not served although they are. Every row's headrace column is the handler table's
    range (what ApiVersions advertises), "—" for a key without a handler."""
    import headrace.broker.server  # noqa: F401 - registers every handler
    from headrace.broker.handlers import HANDLERS

    rows = re.findall(r"^\| (\d+) \| (\w+) \| ([^|]+) \|", README.read_text(), re.M)
    assert len(rows) > 50
    for key, name, served in rows:
        h = HANDLERS.get(int(key))
        want = "—" if h is None else (
            f"{h.min_version}" if h.min_version == h.max_version
            else f"{h.min_version}\N{EN DASH}{h.max_version}")
        assert served.strip() == want, (key, name, served, want)


def test_gitignore_covers_what_the_commands_write() -> None:
    """Issue 26 defect 7: ``headrace cluster``'s default data directory was not ignored."""
    from headrace.cli import main

    cluster = main.commands["cluster"]  # type: ignore[attr-defined]
    default = next(p.default for p in cluster.params if p.name == "data_dir")
    assert f"/{default}/" in (ROOT / ".gitignore").read_text().splitlines()
