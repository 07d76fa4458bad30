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
Freezing is checked every ``CHECK_S``. Reference counting still frees frozen objects that
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
import threading
import time
from typing import Any

CHECK_S = 1.0
FREEZE_PAUSE_S = 0.1
THAW_S = 600.0


class GcPolicy:
    """Freeze the survivors of each long full collection (``install`` starts it)."""

    def __init__(self, thaw_s: float = THAW_S, freeze_pause_s: float = FREEZE_PAUSE_S
                 ) -> None:
        self.thaw_s = thaw_s
        self.freeze_pause_s = freeze_pause_s
        self._long_full = 0  # the count at the last full collection of freeze_pause_s+
        self.full_collections = 0  # full collections seen (the callback's count)
        self.frozen_after = 0  # the long full collection acted on last
        self.pause_s = [0.0, 0.0, 0.0]  # time spent collecting, per generation
        self.max_pause_s = [0.0, 0.0, 0.0]
        self._started = 0.0
        self._last_thaw: float | None = None  # the first step's time
        self._stop = threading.Event()

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = int(info.get("generation", 0))
        took = time.perf_counter() - self._started
        self.pause_s[generation] += took
        if took > self.max_pause_s[generation]:
            self.max_pause_s[generation] = took
        if generation == 2:
            self.full_collections += 1
            if took >= self.freeze_pause_s:
                self._long_full = self.full_collections

    def step(self, now: float) -> str | None:
        """One check: freeze after a full collection, thaw every ``thaw_s``. Returns what
        it did ("freeze", "thaw") or None."""
        if self._last_thaw is None:
            self._last_thaw = now
        if now - self._last_thaw >= self.thaw_s:
            self._last_thaw = now
            gc.unfreeze()  # the next full collection looks at everything once
            self.frozen_after = self._long_full
            return "thaw"
        if self._long_full > self.frozen_after:
            self.frozen_after = self._long_full
            gc.freeze()
            return "freeze"
        return None

    def install(self) -> None:
        """One full collection now (the broker just loaded its logs: frozen if it was
        long), then the check every ``CHECK_S`` from a daemon thread."""
        gc.callbacks.append(self._callback)
        gc.collect()
        self.step(time.monotonic())
        threading.Thread(target=self._run, name="gc-policy", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(CHECK_S):
            self.step(time.monotonic())

    def uninstall(self) -> None:
        self._stop.set()
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
