"""Kafka's offset checkpoint files (``replication-offset-checkpoint`` and friends).

Format (Kafka's ``CheckpointFile``): a version line ``0``, the entry count, then one
``<topic> <partition> <offset>`` line per entry. Written atomically (temporary file,
fsync, rename, directory fsync). A missing file reads as empty; a malformed one as empty
with one warning line (the values are rebuilt or re-learnt from the leader), never a crash.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from headrace.fsutil import write_atomically

log = logging.getLogger("headrace.log")

VERSION = 0


def read_offset_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        log.warning("cannot read %s (%s); ignoring it", path, e)
        return {}
    lines = text.splitlines()
    try:
        if int(lines[0]) != VERSION:
            raise ValueError(f"version {lines[0]}")
        count = int(lines[1])
        entries = {}
        for line in lines[2:2 + count]:
            topic, partition, offset = line.split(" ")
            entries[(topic, int(partition))] = int(offset)
        if len(entries) != count or len(lines) != 2 + count:
            raise ValueError(f"{count} entries announced, {len(lines) - 2} lines")
        return entries
    except (ValueError, IndexError) as e:
        log.warning("malformed checkpoint %s (%s); ignoring it", path, e)
        return {}


def write_offset_checkpoint(path: Path, entries: Mapping[tuple[str, int], int]) -> None:
    lines = [str(VERSION), str(len(entries))]
    lines += [f"{t} {p} {o}" for (t, p), o in sorted(entries.items())]
    write_atomically(path, ("\n".join(lines) + "\n").encode())
