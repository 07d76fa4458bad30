"""The property tests' budget in the fast tier (``tests/unit/conftest.py`` applies it).

Each Hypothesis test under ``tests/unit`` states its own budget (``@settings(max_examples=300)``,
or Hypothesis's default of 100), and the full suite runs it. ``PROPERTY_FRACTION`` (a number
in (0, 1], set by ``scripts/test.sh --fast``) runs that fraction of it, at least
``MIN_EXAMPLES``, as the fuzzers run a quarter of their budget there (``FUZZ_*``): a
fast-tier run is a sample, the full suite the proof. Unset, nothing changes.
"""

from __future__ import annotations

import os

MIN_EXAMPLES = 10


def property_fraction(environ: dict[str, str] | None = None) -> float | None:
    """``PROPERTY_FRACTION`` as a number, None when unset; ValueError outside (0, 1]."""
    raw = (os.environ if environ is None else environ).get("PROPERTY_FRACTION", "").strip()
    if not raw:
        return None
    fraction = float(raw)
    if not 0 < fraction <= 1:
        raise ValueError(f"PROPERTY_FRACTION={raw}: a fraction in (0, 1] is expected")
    return fraction


def scaled_examples(max_examples: int, fraction: float) -> int:
    """A test's examples at ``fraction`` of its budget: at least ``MIN_EXAMPLES``, never
    more than the budget itself."""
    return min(max_examples, max(MIN_EXAMPLES, round(max_examples * fraction)))
