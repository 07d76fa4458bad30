"""The broker's data directory: checks at start-up (and, next, its lock and clean-up).

``prepare_data_dir`` is called once by the broker before anything in the directory is
opened; it raises ``DataDirError`` with one clear line for a person.
"""

from __future__ import annotations

import os
from pathlib import Path


class DataDirError(Exception):
    """The data directory cannot be used (a clear message for a person)."""


class DataDirLock:
    """The data directory's ``.lock`` held for the broker's lifetime (Kafka's log dir lock)."""

    def __init__(self, d: Path) -> None:
        self.dir = d

    def release(self) -> None:
        """Give the lock up (on stop, or when start-up fails after taking it)."""


def prepare_data_dir(d: Path) -> DataDirLock:
    """Check (create if needed) and lock the data directory; ``DataDirError`` if unusable."""
    try:
        d.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise DataDirError(f"data dir {d} exists and is not a directory") from None
    except OSError as e:
        raise DataDirError(f"cannot create data dir {d}: {e.strerror}") from None
    if not d.is_dir():
        raise DataDirError(f"data dir {d} is not a directory")
    if not os.access(d, os.R_OK | os.W_OK | os.X_OK):
        raise DataDirError(f"data dir {d} is not readable and writable")
    probe = d / ".headrace-write-probe"
    try:
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise DataDirError(f"data dir {d} is not writable: {e.strerror}") from None
    return DataDirLock(d)
