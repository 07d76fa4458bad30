"""``headrace cluster stop-broker N`` / ``restart-broker N`` (issue 26 defect 5) and the
port check of ``headrace cluster`` (issue 26 item 7), fast: the control files between the
commands and a running cluster, with stand-in brokers in this process. The slow twin runs
``headrace cluster`` itself: tests/cluster/test_cluster_command.py."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from click.testing import CliRunner

from headrace.cli import main
from headrace.cluster.local import (
    STATE_FILE,
    _take_requests,
    _write_json,
    handle_request,
    running_cluster,
)


class FakeBroker:
    """What handle_request uses of a LocalBroker."""

    def __init__(self, broker_id: int) -> None:
        self.broker_id = broker_id
        self.lock = threading.Lock()
        self.running = True
        self.port = 9000 + broker_id
        self.log_path = Path(f"broker-{broker_id}.log")
        self.calls: list[str] = []

    def kill(self) -> None:
        self.calls.append("kill")
        self.running = False

    def stop(self) -> None:
        self.calls.append("stop")
        self.running = False

    def start(self) -> None:
        self.calls.append("start")
        self.running = True

    def wait_listening(self, timeout_s: float) -> bool:
        return True


def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args), env={"HEADRACE_DATA_DIR": None})
    return r.exit_code, r.stdout, r.stderr


def test_no_running_cluster_is_one_line(tmp_path: Path) -> None:
    code, _, err = _cli("cluster", "stop-broker", "2", "--data-dir", str(tmp_path))
    assert code == 1
    assert err.startswith(f"headrace: no headrace cluster is running on {tmp_path}")
    assert len(err.splitlines()) == 1
    # a state file left by a cluster that died counts as none
    _write_json(tmp_path / STATE_FILE, {"pid": 2 ** 22 + 12345, "brokers": {"1": 9092}})
    assert running_cluster(tmp_path) is None


def _serve(data_dir: Path, brokers: dict[int, FakeBroker], stop: threading.Event) -> None:
    """The running cluster's side of the control files (as run_local_cluster's loop)."""
    while not stop.wait(0.02):
        for result, doc in _take_requests(data_dir / "control"):
            ok, message = handle_request(doc, brokers)  # type: ignore[arg-type]
            _write_json(result, {"ok": ok, "message": message})


def test_restart_and_stop_reach_the_running_cluster(tmp_path: Path) -> None:
    brokers = {i: FakeBroker(i) for i in (1, 2, 3)}
    _write_json(tmp_path / STATE_FILE, {"pid": os.getpid(),
                                        "brokers": {str(i): 9000 + i for i in brokers}})
    (tmp_path / "control").mkdir()
    stop = threading.Event()
    server = threading.Thread(target=_serve, args=(tmp_path, brokers, stop))
    server.start()
    try:
        d = ["--data-dir", str(tmp_path)]
        assert _cli("cluster", "stop-broker", "2", "--kill", *d)[:2] == (
            0, "broker 2 killed (-9)\n")
        code, _, err = _cli("cluster", "stop-broker", "2", *d)
        assert (code, err) == (1, "headrace: broker 2 is not running\n")
        code, out, _ = _cli("cluster", "restart-broker", "2", *d)
        assert code == 0 and out.startswith("broker 2 listening on 127.0.0.1:9002 (")
        code, out, _ = _cli("cluster", "stop-broker", "3", *d)
        assert code == 0 and out.startswith("broker 3 stopped in ")
        # the group's --data-dir reaches the subcommand too
        code, out, _ = _cli("cluster", "--data-dir", str(tmp_path), "restart-broker", "3")
        assert code == 0 and out.startswith("broker 3 listening on 127.0.0.1:9003 (")
        code, _, err = _cli("cluster", "restart-broker", "7", *d)
        assert (code, err) == (1, f"headrace: the cluster on {tmp_path} has no broker 7 "
                                  "(its brokers: 1, 2, 3)\n")
    finally:
        stop.set()
        server.join(5)
    assert brokers[2].calls == ["kill", "stop", "start"]
    assert brokers[3].calls == ["stop", "stop", "start"]
    assert not list((tmp_path / "control").iterdir())  # every request and answer gone


def test_cluster_refuses_ports_in_use_naming_them(tmp_path: Path) -> None:
    """The quickstart's broker on 9092 (or anything on a port the cluster needs): one line
    naming the port and what to do, exit 1, before anything starts (issue 26 item 7)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = _cli("cluster", "--data-dir", str(tmp_path / "c"), "--port",
                            str(port - 1), "--zookeeper-port", str(port + 50))
    assert code == 1 and len(err.splitlines()) == 1, err
    # (another process may hold a neighbouring port too: then each is named, in one list,
    # "port 38092 (broker 1), 38093 (broker 2) ... is in use": a loaded run saw three)
    assert err.startswith("headrace: port ") and f" {port} (broker 2)" in err
    assert "in use" in err and "--port" in err
    assert not (tmp_path / "c" / "zookeeper").exists()  # nothing started
