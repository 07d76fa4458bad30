"""Faults: what is injected, when, for how long; a schedule as text (to replay it).

A fault is ``kind:broker@at_ms+duration_ms`` (``expire:1@900+0``). Kinds:

- ``crash``: the broker stops (its unflushed records are lost) and restarts after the
  duration as a new process (new ZooKeeper session, registers once the old one expired).
- ``pause``: the broker is frozen (a GC pause, SIGSTOP); its session expires if the pause
  outlasts the session timeout; messages to it wait.
- ``expire``: ZooKeeper expires the broker's session now (it learns so when it next talks
  to ZooKeeper, re-establishes and re-reads).
- ``ctlloss``: ``expire`` on whichever broker is the controller at that moment.
- ``zkcut``: the broker is cut from ZooKeeper only; ``peercut``: from the other brokers
  only; ``isolate``: from both; ``minority``: the other brokers are cut from ZooKeeper and
  from this one (the minority holds ZooKeeper).
- ``slowdisk``: the broker's disk is slow: its follower writes take ten ticks (and, with
  a flush interval, it flushes ten times less often).
- ``leadercrash``: ``crash`` on whichever broker leads partition ``broker % partitions`` at
  that moment (a leader failure while a follower may be catching up).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headrace.simulation.world import ZK

if TYPE_CHECKING:
    from headrace.simulation.world import World

KINDS = ("crash", "pause", "expire", "ctlloss", "zkcut", "peercut", "isolate", "minority",
         "slowdisk", "leadercrash")


@dataclass(frozen=True)
class Fault:
    kind: str
    broker: int
    at_ms: int
    duration_ms: int

    def describe(self) -> str:
        return f"{self.kind}:{self.broker}@{self.at_ms}+{self.duration_ms}"

    @classmethod
    def parse(cls, text: str) -> Fault:
        kind, rest = text.split(":", 1)
        broker, rest = rest.split("@", 1)
        at, dur = rest.split("+", 1)
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r} (one of {', '.join(KINDS)})")
        return cls(kind, int(broker), int(at), int(dur))

    def _pairs(self, w: World) -> list[tuple[int, int]]:
        b = self.broker
        others = [x.id for x in w.brokers if x.id != b]
        if self.kind == "zkcut":
            return [(b, ZK)]
        if self.kind == "peercut":
            return [(b, o) for o in others]
        if self.kind == "isolate":
            return [(b, ZK)] + [(b, o) for o in others]
        if self.kind == "minority":
            return [(o, ZK) for o in others] + [(b, o) for o in others]
        return []

    def apply(self, w: World) -> None:
        b = w.brokers[self.broker]
        end = w.now + self.duration_ms
        if self.kind == "leadercrash":
            leader = w.leader_of(self.broker % w.p.partitions)
            if leader >= 0 and w.brokers[leader].up:
                w.brokers[leader].crash()
                w.at(end, self._restart_broker, w, leader)
        elif self.kind == "crash":
            if b.up:
                b.crash()
                w.at(end, self._restart, w)
        elif self.kind == "pause":
            b.paused_until = max(b.paused_until, end)
        elif self.kind == "expire":
            w.zk.expire(b.sid)
        elif self.kind == "ctlloss":
            n = w.zk.nodes.get("/controller")
            if n is not None:
                w.zk.expire(n.owner)
        elif self.kind == "slowdisk":
            b.slow_until = max(b.slow_until, end)
        else:
            for x, y in self._pairs(w):
                w.net.cut(x, y, 1)
            w.at(end, self._heal, w)

    def _restart(self, w: World) -> None:
        w.trace(f"HEAL {self.describe()}")
        w.brokers[self.broker].restart()

    def _restart_broker(self, w: World, broker: int) -> None:
        w.trace(f"HEAL {self.describe()} (broker {broker})")
        w.brokers[broker].restart()

    def _heal(self, w: World) -> None:
        w.trace(f"HEAL {self.describe()}")
        for x, y in self._pairs(w):
            w.net.cut(x, y, -1)


def schedule(rng: random.Random, brokers: int, fault_window_ms: int,
             session_timeout_ms: int) -> list[Fault]:
    """A random schedule: 1 to 6 faults starting in [400, window) ms, each lasting up to
    2.5 session timeouts; sorted by time (then kind, broker) so it prints in order."""
    out = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice(KINDS)
        at = rng.randrange(400, max(401, fault_window_ms))
        if kind in ("expire", "ctlloss"):
            dur = 0
        else:
            dur = rng.randrange(50, int(session_timeout_ms * 2.5))
        out.append(Fault(kind, rng.randrange(brokers), at, dur))
    return sorted(out, key=lambda f: (f.at_ms, f.kind, f.broker, f.duration_ms))
