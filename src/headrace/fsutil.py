"""File-system helpers shared by the log, the metadata store and the Spark warehouse."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """fsync a directory, so that files created, renamed or deleted in it stay so."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> bool:
    """fsync a file; False (nothing done) if it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def write_atomically(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Write a temporary file next to ``path``, fsync it (unless told not to) and rename it
    over ``path``: a reader sees the old content or the new, never a torn file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
