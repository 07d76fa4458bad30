"""A pytest plugin for tests/unit/test_fast_twins.py: after collection (and after
tests/conftest.py has marked the slow tier), write every collected test's node id and
whether it is slow, as JSON, to the file named by ``$HEADRACE_TWINS_DUMP``.

Loaded with ``-p tests.twins_collect``; without the variable it does nothing.
"""

from __future__ import annotations

import json
import os

import pytest

DUMP_VARIABLE = "HEADRACE_TWINS_DUMP"


def pytest_collection_finish(session: pytest.Session) -> None:
    path = os.environ.get(DUMP_VARIABLE)
    if not path:
        return
    tests = {item.nodeid: item.get_closest_marker("slow") is not None for item in session.items}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tests, f)
