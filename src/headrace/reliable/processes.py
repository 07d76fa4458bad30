"""Process lanes: a first stage whose handler runs in worker processes (CPU-bound Python).

``Topology().process_bolt(name, fn, parallelism=n)`` runs ``fn(record)`` in ``n`` worker
processes, one per lane. Each lane is a thread of the consumer process that owns one worker:
it ships a whole batch (the records of one partition of one poll, as plain tuples) over a
pipe, waits for the batch's results (the wait releases the GIL), and settles the batch
through the spout like a thread lane. Per record, ``fn`` returns ``None`` (nothing to emit)
or an iterable of value tuples, emitted anchored to the record to the next stage (run in the
consumer process); an exception fails that record (retry, dead letter).

The guarantee is the thread lanes': a worker that dies (kill -9, a segfault, the OOM
killer) fails the roots of the batch it held, so they are retried by the spout's seek; the
lane starts a new worker. Nothing is committed past a record whose tree was not acked, so a
crash can only cause replays. ``fn`` must be picklable (a module-level function, or a
``functools.partial`` of one); workers are started with the ``spawn`` method (the consumer
process has librdkafka's threads, so ``fork`` is unsafe).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from headrace.reliable.topology import ProcessHandler, Record

# per record: None (no emits), a list of value tuples to emit, or an error message
Result = list[tuple[Any, ...]] | str | None

_READY = "ready"


class WorkerDied(Exception):
    """The worker process exited or its pipe broke while it held a batch."""


def _worker_main(conn: Connection, fn: ProcessHandler) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the consumer process decides when to stop
    conn.send(_READY)
    while True:
        try:
            batch = conn.recv()
        except EOFError:
            return
        if batch is None:
            return
        out: list[Result] = []
        for fields in batch:
            try:
                emitted = fn(Record(*fields))
                out.append(None if emitted is None else [tuple(v) for v in emitted])
            except Exception as exc:
                out.append(f"{type(exc).__name__}: {exc}")
        conn.send(out)


class ProcessWorker:
    """One worker process and the parent's end of its pipe. Not thread-safe: one lane
    thread uses it."""

    def __init__(self, fn: ProcessHandler, name: str, start_timeout_s: float = 60.0) -> None:
        self.fn = fn
        self.name = name
        self.start_timeout_s = start_timeout_s
        self.conn: Connection | None = None
        self.process: BaseProcess | None = None
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_worker_main, args=(child, self.fn), name=self.name,
                              daemon=True)
        process.start()
        child.close()  # only the worker holds it: its death is EOF here
        if not parent.poll(self.start_timeout_s) or parent.recv() != _READY:
            process.kill()
            raise WorkerDied(f"worker {self.name} did not start")
        self.conn, self.process = parent, process

    def call(self, records: list[tuple[Any, ...]]) -> list[Result]:
        """The results of ``fn`` for each record; ``WorkerDied`` if the worker is gone."""
        if self.conn is None:
            raise WorkerDied("no worker")
        try:
            self.conn.send(records)
            results: list[Result] = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise WorkerDied(f"worker {self.name} (pid {self.pid}) died: "
                             f"{type(exc).__name__}") from exc
        if len(results) != len(records):
            raise WorkerDied(f"worker {self.name} answered {len(results)} results for "
                             f"{len(records)} records")
        return results

    def restart(self) -> None:
        self.stop(0.0)
        self.restarts += 1
        self.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        conn, process = self.conn, self.process
        self.conn = self.process = None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(None)  # a clean exit; a dead worker's pipe is simply closed
            conn.close()
        if process is not None:
            process.join(timeout_s)
            if process.is_alive():
                process.kill()
                process.join(5)


def record_fields(record: Record) -> tuple[Any, ...]:
    """A ``Record`` as the plain tuple shipped to workers (``Record(*fields)`` there)."""
    return (record.topic, record.partition, record.offset, record.key, record.value,
            record.headers, record.timestamp_ms, record.delivery_count)
