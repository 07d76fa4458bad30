"""``headrace._speedups``, the C walks over records bytes, where it was built.

``native`` is the extension module, or None where it was not built (a machine without a C
compiler: ``setup.py`` makes it optional) or where ``HEADRACE_NO_SPEEDUPS=1`` is set (to
compare, and to test the Python paths alone). Every caller has a Python path that does the
same work and words the errors; the C functions only answer "these bytes are fine, here is
what they hold" or "not so", never more leniently than the Python path.
"""

from __future__ import annotations

import os
from types import ModuleType

ENV = "HEADRACE_NO_SPEEDUPS"

native: ModuleType | None
try:
    from headrace import _speedups as native
except ImportError:  # built without a C compiler: the Python paths alone
    native = None
if os.environ.get(ENV) == "1":
    native = None
