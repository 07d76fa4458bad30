"""The broker's data directory: checks, its lock and the file-descriptor limit at start-up.

``prepare_data_dir`` is called once by the broker before anything in the directory is
opened; it raises ``DataDirError`` with one clear line for a person. It takes the
directory's ``.lock`` (Kafka's log dir lock: an exclusive ``flock`` held for the broker's
lifetime), so a second broker on the same directory, in another process or in this one,
is refused before it opens any log (two brokers appending to one segment assign the same
offsets and lose acknowledged records). The kernel drops the lock when the process dies
(kill -9 included), so a crash never leaves a stale lock behind.

It also raises the soft ``RLIMIT_NOFILE`` to the hard limit (a broker keeps a few files
open per partition; ``headrace.log.index.OPEN_FILES`` caps how many segment files are open
below whatever limit results).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import resource
from pathlib import Path

from headrace.log.index import OPEN_FILES

log = logging.getLogger("headrace.log")

LOCK_FILE = ".lock"


class DataDirError(Exception):
    """The data directory cannot be used (a clear message for a person)."""


class DataDirLock:
    """The data directory's ``.lock`` held for the broker's lifetime (Kafka's log dir lock)."""

    def __init__(self, d: Path, fd: int | None = None) -> None:
        self.dir = d
        self._fd = fd

    @classmethod
    def acquire(cls, d: Path) -> DataDirLock:
        """Take the lock without waiting; ``DataDirError`` if another broker holds it."""
        path = d / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise DataDirError(f"cannot open lock file {path}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirError(
                    f"data dir {d} is in use by another broker (its {LOCK_FILE} is locked); "
                    "stop that broker or choose another --data-dir"
                ) from None
            raise DataDirError(f"cannot lock data dir {d}: {e.strerror}") from None
        return cls(d, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the lock up (on stop, or when start-up fails after taking it); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; size the open-segment-file cap from
    the result. Returns (soft, hard) as they are afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as e:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, e)
    OPEN_FILES.size_for_limit(soft)
    return soft, hard


def _first_non_directory_parent(d: Path) -> Path | None:
    for parent in reversed(d.absolute().parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def prepare_data_dir(d: Path) -> DataDirLock:
    """Check (create if needed) and lock the data directory; ``DataDirError`` if unusable."""
    bad_parent = _first_non_directory_parent(d)
    if bad_parent is not None:
        raise DataDirError(f"data dir {d}: parent {bad_parent} is not a directory")
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
    lock = DataDirLock.acquire(d)
    try:
        probe = d / ".headrace-write-probe"
        try:
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as e:
            raise DataDirError(f"data dir {d} is not writable: {e.strerror}") from None
        raise_fd_limit()
    except BaseException:
        lock.release()
        raise
    return lock
