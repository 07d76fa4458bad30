"""An exactly-once Parquet table fed by ``foreachBatch``: one directory per micro-batch.

Layout (Hive-style, so ``spark.read.parquet(table)`` sees a ``batch_id`` column)::

    <table>/batch_id=<N>/part-*.parquet      a committed batch
    <table>/_staging/batch_id=<N>.<uuid>/    a batch being written (ignored by readers:
                                             Spark skips paths starting with ``_``)

``write_batch`` writes the batch's rows into a fresh staging directory and renames it to
``batch_id=<N>`` (one ``rename``, atomic on a local file system). A batch id whose directory
exists is already committed: a replay of it (Spark replays the last uncommitted batch with the
same id and the same offsets after a crash) writes nothing. So every batch lands exactly once,
whatever happens to the driver, as long as the batch's content is a function of its offsets.

Crash behaviour: a crash before the rename leaves a staging directory, removed the next time
that batch id is written; after it, the batch is committed. Thread-safety: one writer per
table (one streaming query), as Spark runs a query's batches one at a time.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from headrace.fsutil import fsync_dir


def batch_dir(table: Path | str, batch_id: int) -> Path:
    return Path(table) / f"batch_id={batch_id}"


def is_committed(table: Path | str, batch_id: int) -> bool:
    return batch_dir(table, batch_id).is_dir()


def write_batch(df: Any, batch_id: int, table: Path | str) -> bool:
    """Write ``df`` as batch ``batch_id`` of ``table``; False if the batch was already there."""
    final = batch_dir(table, batch_id)
    if final.is_dir():
        return False
    staging_root = Path(table) / "_staging"
    staging_root.mkdir(parents=True, exist_ok=True)
    for stale in staging_root.glob(f"batch_id={batch_id}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = staging_root / f"batch_id={batch_id}.{uuid.uuid4().hex}"
    df.write.mode("errorifexists").parquet(str(staging))
    fsync_dir(staging)
    os.rename(staging, final)
    fsync_dir(final.parent)
    return True




def read_table(spark: Any, table: Path | str) -> Any:
    """The table as a DataFrame (with its ``batch_id`` column); empty if nothing committed."""
    if not any(Path(table).glob("batch_id=*")):
        return None
    return spark.read.parquet(str(table))
