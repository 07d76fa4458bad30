"""The broker process's garbage collection: long-lived objects out of the full collections.

CPython's cyclic collector runs a full (generation 2) collection over every tracked object
whenever enough new objects have survived; it stops the whole process while it runs. A
broker's long-lived state grows with its partitions (logs, segments, indexes, replica and
fetch-session state): at 30,000 partitions a full collection took 1.0-1.6 s, and the three
brokers of ``bench/cluster_bench.py --scale 30000`` ran 25-53 of them in five minutes
(43 s of one broker's event loop, stalled for everyone: fetches, produces, ZooKeeper
watches). It is the JVM's problem too, which Kafka answers with G1's short pauses.

The policy (Instagram's, with ``gc.freeze``): what survives a full collection that took
``FREEZE_PAUSE_S`` or more is long-lived, so it is moved to the permanent generation, which
collections never scan; the next full collection looks only at what is newer. A broker whose
full collections stay short (up to a few thousand partitions) never freezes anything.
Reference counting still frees frozen objects that
become garbage; only garbage in reference cycles among frozen objects (a connection open at
the freeze and closed later, say) stays, so every ``THAW_S`` the permanent generation is put
back (``gc.unfreeze``): the next full collection reclaims such cycles, and its survivors
are frozen again. At 30,000 partitions that is one long pause per ``THAW_S`` instead of one
every few seconds.

Only for a process that is a broker (``headrace broker``): a broker embedded in a user's
process (tests, ``headrace.testing``) leaves that process's collector alone.
"""

from __future__ import annotations

import gc
import time
from typing import Any

FREEZE_PAUSE_S = 0.1
THAW_S = 600.0


class GcPolicy:
    """Freeze the survivors of each long full collection (``install`` starts it).

    All of it runs in the collector's callback, on the thread whose allocation set off the
    collection: the freeze at the end of a long full collection (the collection is over, so
    its lists are whole), the thaw at the start of the first full collection ``thaw_s``
    after the last one (that collection then looks at everything). No thread of its own,
    and nothing frozen while a collection is halfway."""

    def __init__(self, thaw_s: float = THAW_S, freeze_pause_s: float = FREEZE_PAUSE_S,
                 clock: Any = time.monotonic) -> None:
        self.thaw_s = thaw_s
        self.freeze_pause_s = freeze_pause_s
        self.clock = clock
        self.full_collections = 0  # full collections seen
        self.freezes = 0
        self.thaws = 0
        self.pause_s = [0.0, 0.0, 0.0]  # time spent collecting, per generation
        self.max_pause_s = [0.0, 0.0, 0.0]
        self._started = 0.0
        self._last_thaw: float | None = None  # the first full collection's time

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        generation = int(info.get("generation", 0))
        if phase == "start":
            if generation == 2:
                now = self.clock()
                if self._last_thaw is None:
                    self._last_thaw = now
                elif now - self._last_thaw >= self.thaw_s:
                    self._last_thaw = now
                    if gc.get_freeze_count():
                        gc.unfreeze()  # this collection looks at everything once
                        self.thaws += 1
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.pause_s[generation] += took
        if took > self.max_pause_s[generation]:
            self.max_pause_s[generation] = took
        if generation == 2:
            self.full_collections += 1
            if took >= self.freeze_pause_s:
                gc.freeze()  # its survivors are long-lived: out of the next ones
                self.freezes += 1

    def install(self) -> None:
        """From now on (the broker just loaded its logs: one full collection at once)."""
        gc.callbacks.append(self._callback)
        gc.collect()

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
