"""scripts/setup.sh re-runs pip only when something changed (issue 26 item 7: ``run.sh
broker|cluster`` spent 10-16 s in pip on every start). Run on a copy with a stand-in venv
whose python records each call instead of installing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/usr/bin/env bash
if [ "${1:-}" = "--version" ]; then echo "Python 3.11.9"; exit 0; fi
echo "$*" >> "$(dirname "$0")/../calls"
"""


def _setup(root: Path, *extras: str) -> list[str]:
    calls = root / ".venv" / "calls"
    calls.unlink(missing_ok=True)
    r = subprocess.run(["bash", "scripts/setup.sh", *extras], cwd=root, capture_output=True,
                       text=True, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    return calls.read_text().splitlines() if calls.exists() else []


def test_setup_runs_pip_only_when_something_changed(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "headrace"):
        (bin_dir / name).write_text(FAKE_PYTHON)
        (bin_dir / name).chmod(0o755)
    first = _setup(tmp_path)
    assert first[-1] == "-m pip install -q -e ." and len(first) == 2
    assert _setup(tmp_path) == []  # nothing changed: no pip at all
    assert _setup(tmp_path, "spark")[-1] == "-m pip install -q -e .[spark]"
    assert _setup(tmp_path, "spark") == []
    with (tmp_path / "pyproject.toml").open("a") as f:
        f.write("\n# a changed dependency\n")
    assert _setup(tmp_path)[-1] == "-m pip install -q -e ."
