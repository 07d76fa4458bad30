"""``headrace cluster``: a ZooKeeper and N brokers on loopback, for development.

Each broker is its own ``headrace broker`` process (ids 1..N, ports PORT..PORT+N-1, data
dirs ``DIR/broker-<id>``), on a ZooKeeper from Debian's package (``DIR/zookeeper``) with a
chroot of its own. It prints the bootstrap list, restarts nothing by itself, and on Ctrl-C
(or SIGTERM) stops the brokers with SIGTERM (each moves its leadership away first) and then
ZooKeeper. Started again on the same directory, it is the same cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import click

STOP_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0
CHROOT = "/headrace"
_LISTENING = re.compile(r"listening on [^ ]+:(\d+)")


class LocalBroker:
    def __init__(self, broker_id: int, port: int, data_dir: Path, zk: str,
                 overrides: list[str], log_level: str) -> None:
        self.broker_id = broker_id
        self.port = port
        self.data_dir = data_dir
        self.zk = zk
        self.overrides = overrides
        self.log_level = log_level
        self.proc: subprocess.Popen[str] | None = None
        self.listening = threading.Event()
        self.log_path = data_dir.parent / f"broker-{broker_id}.log"
        self.lock = threading.Lock()  # held while a request stops or restarts this broker
        self.closing = False  # the whole cluster is stopping: start nothing

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.closing:
            raise RuntimeError(f"broker {self.broker_id}: the cluster is stopping")
        self.listening.clear()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "headrace.cli", "broker", "--data-dir", str(self.data_dir),
                "--port", str(self.port), "--broker-id", str(self.broker_id),
                "--zookeeper", self.zk, "--log-level", self.log_level]
        for o in self.overrides:
            args += ["-o", o]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                     start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with open(self.log_path, "a") as out:
            for line in self.proc.stderr:
                out.write(line)
                out.flush()
                if "listening on" in line:
                    m = _LISTENING.search(line)
                    if m:
                        self.port = int(m.group(1))
                    self.listening.set()
                elif " ERROR " in line or "cannot start" in line:
                    click.echo(f"broker {self.broker_id}: {line.rstrip()}", err=True)

    def kill(self) -> None:
        """kill -9 (fault injection)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        self.listening.clear()

    def wait_listening(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.listening.wait(0.2):
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                return False
        return True

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self.proc = None
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            click.echo(f"broker {self.broker_id} did not stop in {STOP_TIMEOUT_S:.0f} s; "
                       "killing it", err=True)
            proc.kill()
            proc.wait(5)
        self.proc = None
        self.listening.clear()


class LocalCluster:
    """A ZooKeeper and ``brokers`` broker processes under ``data_dir`` (the demo's
    ``--cluster``); ``port`` 0 lets every broker pick a free port (kept on restarts)."""

    def __init__(self, data_dir: Path, brokers: int = 3, port: int = 0, zk_port: int = 0,
                 overrides: list[str] | None = None, log_level: str = "INFO") -> None:
        from headrace.cluster.zookeeper_server import ZooKeeperServer

        self.data_dir = data_dir
        self.zk = ZooKeeperServer(data_dir / "zookeeper", port=zk_port)
        self.connect = self.zk.connect_string + CHROOT
        self.brokers = {i: LocalBroker(i, port + i - 1 if port else 0, data_dir / f"broker-{i}",
                                       self.connect, list(overrides or []), log_level)
                        for i in range(1, brokers + 1)}

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers.values())

    def start(self) -> str:
        self.zk.start(timeout_s=START_TIMEOUT_S)
        for b in self.brokers.values():
            b.start()
        for b in self.brokers.values():
            if not b.wait_listening(START_TIMEOUT_S):
                self.stop()
                raise RuntimeError(f"broker {b.broker_id} did not start; see {b.log_path}")
        return self.bootstrap

    def restart(self, broker_id: int) -> None:
        b = self.brokers[broker_id]
        b.start()
        if not b.wait_listening(START_TIMEOUT_S):
            raise RuntimeError(f"broker {broker_id} did not restart; see {b.log_path}")

    def stop(self) -> None:
        threads = [threading.Thread(target=b.stop) for b in self.brokers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(STOP_TIMEOUT_S + 10)
        with contextlib.suppress(Exception):
            self.zk.stop()


# ---------------------------------------------------------------- the control files
#
# ``headrace cluster restart-broker N`` / ``stop-broker N [--kill]`` talk to the running
# ``headrace cluster`` through its data dir: it writes ``DIR/cluster.json`` (its pid and
# brokers) while it runs; a request is ``DIR/control/<id>.json`` ({"action", "broker"}),
# answered by ``DIR/control/<id>.result`` ({"ok", "message"}), each written whole (a
# temporary file renamed). Files, not a socket: nothing to listen on, and any user who can
# read the data dir can see what the cluster runs.

STATE_FILE = "cluster.json"
CONTROL_DIR = "control"
ACTIONS = ("restart", "stop", "kill")
REQUEST_TIMEOUT_S = STOP_TIMEOUT_S + START_TIMEOUT_S + 10


class ControlError(Exception):
    """A control request that cannot be made (no cluster running, no such broker)."""


def _write_json(path: Path, doc: dict[str, object]) -> None:
    import json

    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def running_cluster(data_dir: Path) -> dict[str, object] | None:
    """The state of the ``headrace cluster`` running on ``data_dir``, or None."""
    import json

    try:
        doc = json.loads((data_dir / STATE_FILE).read_text())
        os.kill(int(doc["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return doc if isinstance(doc, dict) else None


def send_request(data_dir: Path, action: str, broker_id: int,
                 timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[bool, str]:
    """Ask the cluster running on ``data_dir``; (done, what it says). Raises ControlError
    when no cluster runs there or it has no such broker."""
    import json
    import uuid

    state = running_cluster(data_dir)
    if state is None:
        raise ControlError(f"no headrace cluster is running on {data_dir} (start one with "
                           f"'headrace cluster --data-dir {data_dir}', or give its --data-dir)")
    brokers = state.get("brokers")
    if not isinstance(brokers, dict) or str(broker_id) not in brokers:
        ids = ", ".join(sorted(brokers)) if isinstance(brokers, dict) else "none"
        raise ControlError(f"the cluster on {data_dir} has no broker {broker_id} "
                           f"(its brokers: {ids})")
    control = data_dir / CONTROL_DIR
    control.mkdir(exist_ok=True)
    rid = uuid.uuid4().hex
    _write_json(control / f"{rid}.json", {"action": action, "broker": broker_id})
    result = control / f"{rid}.result"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            doc = json.loads(result.read_text())
        except (OSError, ValueError):
            if running_cluster(data_dir) is None:
                raise ControlError(f"the cluster on {data_dir} stopped") from None
            time.sleep(0.1)
            continue
        with contextlib.suppress(OSError):
            result.unlink()
        return bool(doc.get("ok")), str(doc.get("message", ""))
    with contextlib.suppress(OSError):
        (control / f"{rid}.json").unlink()
    return False, f"no answer from the cluster within {timeout_s:.0f} s"


def _take_requests(control: Path) -> list[tuple[Path, dict[str, object]]]:
    """The waiting requests (oldest first), each removed as it is taken."""
    import json

    out = []
    try:
        paths = sorted(control.glob("*.json"), key=lambda q: q.stat().st_mtime)
    except OSError:
        return []
    for path in paths:
        try:
            doc = json.loads(path.read_text())
            path.unlink()
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            out.append((path.with_suffix(".result"), doc))
    return out


def handle_request(doc: dict[str, object], brokers: dict[int, LocalBroker]
                   ) -> tuple[bool, str]:
    """Do one request: (done, one line saying what happened)."""
    action, raw_id = doc.get("action"), doc.get("broker")
    if action not in ACTIONS or not isinstance(raw_id, int) or raw_id not in brokers:
        return False, f"not a request this cluster knows: {doc}"
    b = brokers[raw_id]
    with b.lock:
        if action == "kill":
            if not b.running:
                return False, f"broker {raw_id} is not running"
            b.kill()
            return True, f"broker {raw_id} killed (-9)"
        if action == "stop":
            if not b.running:
                return False, f"broker {raw_id} is not running"
            started = time.monotonic()
            b.stop()
            return True, f"broker {raw_id} stopped in {time.monotonic() - started:.1f} s"
        started = time.monotonic()
        b.stop()
        b.start()
        if not b.wait_listening(START_TIMEOUT_S):
            return False, f"broker {raw_id} did not start; see {b.log_path}"
        return True, (f"broker {raw_id} listening on 127.0.0.1:{b.port} "
                      f"({time.monotonic() - started:.1f} s)")


def ports_in_use(ports: dict[int, str]) -> list[str]:
    """What is already listening on 127.0.0.1 among ``ports`` (port -> whose)."""
    import socket

    taken = []
    for port, whose in ports.items():
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                taken.append(f"{port} ({whose})")
    return taken


def run_local_cluster(brokers: int, data_dir: Path, port: int, zk_port: int,
                      overrides: list[str], log_level: str) -> int:
    from headrace.cluster.zookeeper_server import ZooKeeperServer, ZooKeeperUnavailable

    data_dir.mkdir(parents=True, exist_ok=True)
    if running_cluster(data_dir) is not None:
        click.echo(f"headrace: a headrace cluster is already running on {data_dir}", err=True)
        return 1
    taken = ports_in_use({**{port + i - 1: f"broker {i}" for i in range(1, brokers + 1)},
                          zk_port: "ZooKeeper"})
    if taken:
        click.echo(f"headrace: port {', '.join(taken)} is in use on 127.0.0.1 (a broker "
                   "of the quickstart listens on 9092, the security example on 9093): stop "
                   "what listens there, or give free ports, e.g. 'headrace cluster --port "
                   "19092 --zookeeper-port 12181'", err=True)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    zk = ZooKeeperServer(data_dir / "zookeeper", port=zk_port)
    click.echo(f"starting ZooKeeper in {data_dir / 'zookeeper'} ...", err=True)
    try:
        zk.start(timeout_s=START_TIMEOUT_S)
    except ZooKeeperUnavailable as e:
        click.echo(f"headrace: {e}", err=True)
        return 1
    connect = zk.connect_string + CHROOT
    nodes = {i: LocalBroker(i, port + i - 1, data_dir / f"broker-{i}", connect, overrides,
                            log_level) for i in range(1, brokers + 1)}
    control = data_dir / CONTROL_DIR
    state = data_dir / STATE_FILE
    workers: list[threading.Thread] = []
    try:
        for b in nodes.values():
            b.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        for b in nodes.values():
            while not b.listening.wait(0.2):
                if stop.is_set():
                    return 130
                if b.proc is not None and b.proc.poll() is not None:
                    click.echo(f"headrace: broker {b.broker_id} exited; see {b.log_path}",
                               err=True)
                    return 1
                if time.monotonic() > deadline:
                    click.echo(f"headrace: broker {b.broker_id} did not start in "
                               f"{START_TIMEOUT_S:.0f} s; see {b.log_path}", err=True)
                    return 1
        bootstrap = ",".join(f"127.0.0.1:{b.port}" for b in nodes.values())
        control.mkdir(exist_ok=True)
        for stale in control.iterdir():  # requests to a cluster that is gone
            with contextlib.suppress(OSError):
                stale.unlink()
        _write_json(state, {"pid": os.getpid(), "zookeeper": connect,
                            "brokers": {str(i): b.port for i, b in nodes.items()}})
        click.echo(f"headrace cluster: {brokers} brokers, ZooKeeper {connect}")
        click.echo(f"bootstrap servers: {bootstrap}")
        click.echo(f"logs: {data_dir}/broker-N.log; 'headrace cluster restart-broker N' and "
                   "'stop-broker N' restart and stop one; Ctrl-C stops everything", err=True)

        def serve(result: Path, doc: dict[str, object]) -> None:
            try:
                ok, message = handle_request(doc, nodes)
            except Exception as e:  # a broker that cannot be started, say
                ok, message = False, f"{type(e).__name__}: {e}"
            click.echo(message, err=True)
            with contextlib.suppress(OSError):
                _write_json(result, {"ok": ok, "message": message})

        while not stop.wait(0.2):
            for result, doc in _take_requests(control):
                t = threading.Thread(target=serve, args=(result, doc), daemon=True)
                workers.append(t)
                t.start()
            for b in nodes.values():
                if b.lock.locked():
                    continue  # being stopped or restarted on request
                if b.proc is not None and b.proc.poll() is not None:
                    click.echo(f"broker {b.broker_id} exited (code {b.proc.returncode}); see "
                               f"{b.log_path}; 'headrace cluster restart-broker "
                               f"{b.broker_id}' starts it again", err=True)
                    b.proc = None
        return 0
    finally:
        click.echo("stopping the brokers ...", err=True)
        with contextlib.suppress(OSError):
            state.unlink()
        for b in nodes.values():
            b.closing = True  # a restart in progress starts nothing more
        threads = [threading.Thread(target=b.stop) for b in nodes.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(STOP_TIMEOUT_S + 10)
        for t in workers:
            t.join(5)
        for b in nodes.values():  # a broker a restart started meanwhile
            b.stop()
        with contextlib.suppress(Exception):
            zk.stop()
        click.echo("stopped", err=True)
