"""The data directory's lock and start-up checks without a broker process (issue 8 items 3,
4 and 13; R-LOG-4): fast twins of tests/fault/test_data_dir_lock.py and the topic-id rule of
tests/fault/test_delete_crash.py.

A process killed with kill -9 has its file descriptors closed by the kernel; closing the
lock's descriptor without unlocking is that, in this process.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from tests.batches import simple_batch

from headrace.clock import ManualClock
from headrace.config import LogConfig
from headrace.log.log_dir import LOCK_FILE, DataDirError, DataDirLock, prepare_data_dir
from headrace.log.partition_log import PartitionLog


def test_a_second_lock_on_a_locked_dir_is_refused_and_a_release_frees_it(tmp_path: Path) -> None:
    first = prepare_data_dir(tmp_path / "d")
    try:
        with pytest.raises(DataDirError, match="in use by another broker"):
            prepare_data_dir(tmp_path / "d")
        with pytest.raises(DataDirError, match="in use by another broker"):
            DataDirLock.acquire(tmp_path / "d")
    finally:
        first.release()
    again = prepare_data_dir(tmp_path / "d")
    assert again.held
    again.release()
    again.release()  # idempotent
    assert not again.held


def test_a_lock_whose_holder_died_is_no_stale_lock(tmp_path: Path) -> None:
    """The kernel drops an flock when its descriptor closes (as at kill -9): the lock file
    stays, yet the next broker takes the lock, and then refuses a further one."""
    d = tmp_path / "d"
    dead = prepare_data_dir(d)
    assert dead._fd is not None
    os.close(dead._fd)  # the process's death: no unlock, no cleanup
    dead._fd = None
    assert (d / LOCK_FILE).exists()
    nxt = prepare_data_dir(d)
    try:
        with pytest.raises(DataDirError, match="in use by another broker"):
            prepare_data_dir(d)
    finally:
        nxt.release()


def test_a_data_dir_whose_parent_is_a_file_says_so(tmp_path: Path) -> None:
    parent = tmp_path / "afile"
    parent.write_text("x")
    with pytest.raises(DataDirError) as e:
        prepare_data_dir(parent / "data")
    assert f"parent {parent} is not a directory" in str(e.value)
    assert "exists and is not a directory" not in str(e.value)
    with pytest.raises(DataDirError, match="exists and is not a directory"):
        prepare_data_dir(parent)


def test_a_directory_of_another_topic_id_is_not_adopted(tmp_path: Path) -> None:
    """A partition directory left by a deleted topic of the same name (another topic id)
    opens empty; one without partition.metadata is adopted."""
    clock = ManualClock(wall_ms=1_700_000_000_000)
    old, new = uuid.uuid4(), uuid.uuid4()
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, LogConfig(), clock, topic_id=old)
    log.append_as_leader(simple_batch(5), 0)
    log.close()
    log = PartitionLog.open(d, LogConfig(), clock, topic_id=old)
    assert log.log_end_offset == 5
    log.close()
    log = PartitionLog.open(d, LogConfig(), clock, topic_id=new)
    assert log.log_end_offset == 0
    log.append_as_leader(simple_batch(2), 0)
    log.close()
    (d / "partition.metadata").unlink()
    log = PartitionLog.open(d, LogConfig(), clock, topic_id=old)
    assert log.log_end_offset == 2
    log.close()
