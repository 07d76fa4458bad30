"""The ``headrace`` command starts without importing what only some subcommands use.

Every ``headrace`` invocation (``topics list``, ``produce``, ``--help``) imports
``headrace.cli``; the simulation imported there pulled in the protocol types, numpy and
(through kio) Hypothesis: 0.7 s of every command's 1.1 s start. Each subcommand imports its
heavy modules when it runs.
"""

from __future__ import annotations

import subprocess
import sys

# packages that no command needs merely to start (each subcommand imports its own)
HEAVY = ("kio", "numpy", "hypothesis", "pyspark", "confluent_kafka", "kazoo",
         "headrace.protocol", "headrace.simulation.world", "headrace.broker")


def test_importing_the_cli_imports_no_subcommands_machinery() -> None:
    code = ("import sys, headrace.cli\n"
            "print('\\n'.join(sorted(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, check=True)
    loaded = set(r.stdout.split())
    assert "headrace.simulation.command" in loaded  # the command itself is registered
    heavy = sorted(m for m in loaded
                   if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], heavy


def test_the_simulate_command_still_runs_a_seed() -> None:
    from click.testing import CliRunner

    from headrace.cli import main

    r = CliRunner().invoke(main, ["simulate", "--seed", "3", "--steps", "50"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("seed 3: clean ("), r.output
    bad = CliRunner().invoke(main, ["simulate", "--faults", "nonsense"])
    assert bad.exit_code == 2, bad.output  # a usage error: one line, exit 2
    assert "Invalid value for --faults" in bad.output, bad.output
