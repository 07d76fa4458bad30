"""Applies ``PROPERTY_FRACTION`` (``tests/property_budget.py``) to the property tests here.

A test's Hypothesis settings are looked up on the test function when it is called, so the
scaled settings replace them at collection. ``_hypothesis_internal_use_settings`` is where
``@settings`` and ``@given`` keep them (Hypothesis 6); a Hypothesis without it fails the
collection here rather than silently running the whole budget.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings
from tests.property_budget import property_fraction, scaled_examples

_ATTR = "_hypothesis_internal_use_settings"
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        fraction = property_fraction()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    if fraction is None or fraction == 1:
        return
    done: set[int] = set()
    for item in items:
        fn = getattr(item, "obj", None)
        fn = getattr(fn, "__func__", fn)  # a method's function
        if (fn is None or id(fn) in done or not str(item.path).startswith(_HERE)
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
