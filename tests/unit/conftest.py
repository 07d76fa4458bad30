"""The property tests' budget in the fast tier.

Each Hypothesis test under ``tests/unit`` states its own budget (``@settings(max_examples=300)``,
or Hypothesis's default of 100). The full suite runs that budget. ``PROPERTY_FRACTION`` (a
number in (0, 1], set by ``scripts/test.sh --fast``) runs that fraction of it, at least
``MIN_EXAMPLES``, the way the fuzzers run a quarter of their budget there (``FUZZ_*``): a
fast-tier run is a sample, the full suite the proof. Unset, nothing changes.

A test's settings are looked up on the test function when it is called, so the scaled
settings replace them at collection; ``_hypothesis_internal_use_settings`` is where
``@settings`` and ``@given`` keep them (Hypothesis 6), and a Hypothesis without it fails the
collection here rather than silently running the whole budget.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

MIN_EXAMPLES = 10
_ATTR = "_hypothesis_internal_use_settings"


def property_fraction() -> float | None:
    raw = os.environ.get("PROPERTY_FRACTION", "").strip()
    if not raw:
        return None
    fraction = float(raw)
    if not 0 < fraction <= 1:
        raise pytest.UsageError(f"PROPERTY_FRACTION={raw}: a fraction in (0, 1] is expected")
    return fraction


def scaled_examples(max_examples: int, fraction: float) -> int:
    return min(max_examples, max(MIN_EXAMPLES, round(max_examples * fraction)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    fraction = property_fraction()
    if fraction is None or fraction == 1:
        return
    here = os.path.dirname(__file__) + os.sep
    done: set[int] = set()
    for item in items:
        fn = getattr(item, "obj", None)
        fn = getattr(fn, "__func__", fn)  # a method's function
        if (fn is None or id(fn) in done or not str(item.path).startswith(here)
                or not getattr(fn, "is_hypothesis_test", False)):
            continue
        done.add(id(fn))
        current = getattr(fn, _ATTR, None)
        if not isinstance(current, settings):
            raise pytest.UsageError(
                f"{item.nodeid}: Hypothesis keeps no {_ATTR} on the test; PROPERTY_FRACTION "
                "cannot scale it (tests/unit/conftest.py)")
        setattr(fn, _ATTR, settings(
            current, max_examples=scaled_examples(current.max_examples, fraction)))
