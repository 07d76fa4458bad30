"""``headrace simulate``: run seeds of the deterministic cluster simulation.

Every line printed depends only on the arguments (no wall-clock time, no hash order), so a
seed prints the same lines every time; a failing seed prints the violated property, its
fault schedule, the shrunk schedule and the command that replays it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from headrace.simulation.faults import Fault

# The simulation (and the protocol types it pulls in) is imported only when the command
# runs: importing it took 0.7 s of every ``headrace`` command's start.


def _faults(text: str | None) -> list[Fault] | None:
    from headrace.simulation.faults import Fault

    if text is None:
        return None
    try:
        return [Fault.parse(f.strip()) for f in text.split(",") if f.strip()]
    except ValueError as e:
        raise click.BadParameter(f"{text!r}: {e} (the form is kind:broker@at_ms+duration_ms, "
                                 "as a failing seed prints it)", param_hint="--faults") from None


@click.command("simulate")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="How many seeds to run (from --seed on).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="The first seed.")
@click.option("--steps", type=click.IntRange(min=1), default=300, show_default=True,
              help="Ticks (10 ms of simulated time each) during which faults start.")
@click.option("--brokers", type=click.IntRange(min=3), default=3, show_default=True)
@click.option("--faults", "faults_text", default=None, metavar="SCHEDULE",
              help="Replay this fault schedule instead of the seed's own "
                   "(kind:broker@at_ms+duration_ms, comma-separated; as printed).")
@click.option("--trace", is_flag=True, help="Print the simulation's event trace of each seed.")
def simulate_command(seeds: int, seed: int, steps: int, brokers: int, faults_text: str | None,
                     trace: bool) -> None:
    """Run the deterministic cluster simulation (issue 21) over SEEDS seeds.

    Exit 0 when every seed is clean; 1 with the seed, the violated property and the
    shrunk fault schedule otherwise."""
    from headrace.simulation.run import check_seed, run_seed
    from headrace.simulation.world import Params

    params = Params(brokers=brokers)
    faults = _faults(faults_text)
    steps_total = acks_total = committed = aborted = 0
    for s in range(seed, seed + seeds):
        if trace:
            res = run_seed(s, steps, params, faults, tracing=True)
            for line in res.trace:
                click.echo(f"seed {s} {line}")
            shrunk = None if res.ok else check_seed(s, steps, params, faults)[1]
        else:
            res, shrunk = check_seed(s, steps, params, faults)
        steps_total += res.steps
        acks_total += res.acks
        committed += res.committed
        aborted += res.aborted
        if res.violation is not None:
            v = res.violation
            click.echo(f"seed {s}: FAILED {v.prop}: {v.detail}")
            click.echo(f"seed {s}: fault schedule ({len(res.faults)}): "
                       f"{','.join(f.describe() for f in res.faults) or '(none)'}")
            assert shrunk is not None
            sched = ",".join(f.describe() for f in shrunk)
            click.echo(f"seed {s}: shrunk to ({len(shrunk)}): {sched or '(none)'}")
            click.echo(f"seed {s}: replay: headrace simulate --seed {s} --steps {steps} "
                       f"--brokers {brokers} --faults '{sched}' --trace")
            sys.exit(1)
        if seeds == 1:
            click.echo(f"seed {s}: clean ({res.steps} steps, {res.acks} records acknowledged, "
                       f"transactions {res.committed} committed {res.aborted} aborted, "
                       f"{len(res.faults)} faults: "
                       f"{','.join(f.describe() for f in res.faults) or '(none)'})")
    click.echo(f"{seeds} seed(s) from {seed} clean: {steps_total} steps, {acks_total} records "
               f"acknowledged, transactions {committed} committed {aborted} aborted")
