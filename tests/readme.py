"""The README's code blocks, for the tests that run them (issue 13, item 4: every command
in the README is run by a test).

Each fenced block a user may copy carries a name on the line before its fence::

    <!-- test: quickstart-broker -->
    ```sh
    ...
    ```

``readme_block(name)`` gives a block's text to the test that runs it;
``tests/unit/test_readme_blocks.py`` fails when a runnable block has no name, when a name is
used twice, or when no test asks for a name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

_MARK = re.compile(r"^<!-- test: ([a-z0-9-]+) -->$")
_FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    name: str | None
    lang: str
    text: str
    line: int  # 1-based line of the opening fence


def readme_blocks(path: Path = README) -> list[Block]:
    """Every fenced block of the file, in order, with the name its marker gives it."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        name = None
        if i > 0:
            mark = _MARK.match(lines[i - 1].strip())
            name = mark.group(1) if mark else None
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if end == len(lines):
            raise ValueError(f"{path.name}:{i + 1}: unclosed code fence")
        blocks.append(Block(name, m.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 1))
        i = end + 1
    return blocks


def readme_block(name: str) -> str:
    """The text of the block named ``name`` (a KeyError names the missing block)."""
    for block in readme_blocks():
        if block.name == name:
            return block.text
    raise KeyError(f"README.md has no block marked <!-- test: {name} -->")


def commands(name: str) -> list[str]:
    """The command lines of a shell block: comments and blank lines dropped, a trailing
    ``# ...`` comment cut, ``\\`` continuations joined."""
    out: list[str] = []
    pending = ""
    for raw in readme_block(name).splitlines():
        line = raw.rstrip()
        if pending:
            line = pending + " " + line.strip()
            pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        stripped = _strip_comment(line).strip()
        if stripped:
            out.append(stripped)
    assert not pending, f"block {name}: a continuation line ends it"
    return out


def _strip_comment(line: str) -> str:
    """``line`` without a shell comment that starts outside quotes."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line
