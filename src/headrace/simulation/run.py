"""Run one seed, shrink a failing schedule, run many seeds.

A seed drives everything through one ``random.Random(seed)``: its first draw seeds the fault
schedule, its second the world (delays, losses, jitter). Replaying a seed with a given
schedule (``faults``) keeps the world's seed, so shrinking changes only the faults.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from headrace.simulation.faults import Fault, schedule
from headrace.simulation.world import Params, Violation, World


@dataclass
class Result:
    seed: int
    faults: list[Fault]
    violation: Violation | None
    steps: int
    acks: int
    end_ms: int
    trace: list[str]
    committed: int = 0  # transactions committed
    aborted: int = 0    # transactions aborted

    @property
    def ok(self) -> bool:
        return self.violation is None


def seeds_of(seed: int) -> tuple[random.Random, int]:
    master = random.Random(seed)
    return random.Random(master.getrandbits(64)), master.getrandbits(64)


def run_seed(seed: int, steps: int = 300, params: Params | None = None,
             faults: list[Fault] | None = None, tracing: bool = False) -> Result:
    """Simulate ``steps`` ticks with faults, then heal and settle; check at the end."""
    params = params or Params()
    fault_rng, world_seed = seeds_of(seed)
    if faults is None:
        faults = schedule(fault_rng, params.brokers, steps * params.tick_ms,
                          params.session_timeout_ms)
    w = World(world_seed, params, faults, tracing)
    w.heal_ms = max(w.heal_ms, 400)
    end = w.heal_ms + params.session_timeout_ms + 3000
    violation = None
    try:
        w.run_until(end)
        w.final_check()
    except Violation as v:
        violation = v
    except Exception as e:  # a pure core raised: its own misuse error is a bug found
        violation = Violation("core raised", f"{type(e).__name__}: {e}")
    committed = sum(w.txn_outcome.values())
    return Result(seed, faults, violation, w.steps, len(w.acks), w.now, w.log_lines,
                  committed, len(w.txn_outcome) - committed)


def shrink(seed: int, faults: list[Fault], still_fails: Callable[[list[Fault]], bool]
           ) -> list[Fault]:
    """Delta debugging (ddmin) over the fault list: the shortest sub-schedule found that
    still fails, every other random choice replayed from the same seed."""
    current = list(faults)
    n = 2
    while len(current) >= 2:
        chunk = max(1, len(current) // n)
        subsets = [current[i:i + chunk] for i in range(0, len(current), chunk)]
        reduced = False
        for i in range(len(subsets)):
            complement = [f for j, s in enumerate(subsets) if j != i for f in s]
            if still_fails(complement):
                current, n, reduced = complement, max(n - 1, 2), True
                break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), n * 2)
    if len(current) == 1 and still_fails([]):
        return []
    return current


def check_seed(seed: int, steps: int = 300, params: Params | None = None,
               faults: list[Fault] | None = None) -> tuple[Result, list[Fault] | None]:
    """Run ``seed``; if it fails, the shrunk schedule (failing with the same property)."""
    res = run_seed(seed, steps, params, faults)
    if res.ok:
        return res, None
    assert res.violation is not None
    prop = res.violation.prop

    def still_fails(sub: list[Fault]) -> bool:
        r = run_seed(seed, steps, params, sub)
        return r.violation is not None and r.violation.prop == prop

    return res, shrink(seed, res.faults, still_fails)
