"""PROPERTY_FRACTION: the fast tier's sample of each property test's budget
(tests/property_budget.py, applied by tests/unit/conftest.py)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.property_budget import MIN_EXAMPLES, property_fraction, scaled_examples


def test_a_quarter_of_each_budget_with_a_floor_and_never_more() -> None:
    assert scaled_examples(300, 0.25) == 75
    assert scaled_examples(100, 0.25) == 25
    assert scaled_examples(20, 0.25) == MIN_EXAMPLES
    assert scaled_examples(5, 0.25) == 5  # a budget below the floor stays as it is
    assert scaled_examples(300, 1.0) == 300


def test_the_fraction_is_read_from_the_environment_and_checked() -> None:
    assert property_fraction({}) is None
    assert property_fraction({"PROPERTY_FRACTION": " "}) is None
    assert property_fraction({"PROPERTY_FRACTION": "0.25"}) == 0.25
    for bad in ("0", "1.5", "-1"):
        with pytest.raises(ValueError, match="PROPERTY_FRACTION"):
            property_fraction({"PROPERTY_FRACTION": bad})


calls: list[int] = []


@settings(max_examples=200, database=None)
@given(st.integers())
def test_a_property_test_of_200_examples(n: int) -> None:
    calls.append(n)


def test_the_property_test_above_ran_its_scaled_budget() -> None:
    """The collection hook replaced the settings of the test above: it runs 200 examples in
    the full suite, a fraction of them under PROPERTY_FRACTION (run here again, so that
    the order of the tests and the worker they run on do not matter: every worker's
    collection applied the hook to the same function)."""
    calls.clear()
    test_a_property_test_of_200_examples()
    fraction = property_fraction(dict(os.environ))
    expected = 200 if fraction is None else scaled_examples(200, fraction)
    assert len(calls) == expected
