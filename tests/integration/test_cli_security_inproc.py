"""Authentication and TLS failures in the CLI (issue 26, defect 4): a wrong SCRAM password,
a TLS/SASL listener reached without --command-config, a port where no Kafka broker
listens: one line and exit 4 (TLS/SASL) or 3 (no broker), for every command, at once
instead of the client libraries' 15 s of retries. The ``headrace`` command in this
process (click's runner) against an in-process broker with PLAINTEXT, SASL_SSL and SSL
listeners.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from headrace.admin_cli import CLIENT_CONFIG
from headrace.cli import main
from headrace.cli_support import set_verbose
from tests.inproc import InProcessBroker

pytestmark = pytest.mark.timeout(180)

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        'username="admin" password="admin-secret" user_admin="admin-secret";')

COMMANDS = [("topics", "list"), ("topics", "describe"), ("groups", "list"),
            ("groups", "describe", "g"), ("cluster", "info"), ("quotas", "describe"),
            ("produce", "t"), ("consume", "t", "-e")]


def run(*args: str) -> Result:
    try:
        return CliRunner().invoke(main, list(args), input=b"x\n", prog_name="headrace",
                                  env={"HEADRACE_BOOTSTRAP": None,
                                       "HEADRACE_COMMAND_CONFIG": None,
                                       "HEADRACE_VERBOSE": None})
    finally:
        set_verbose(False)
        CLIENT_CONFIG.clear()  # a process would forget --command-config


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[Path, dict[str, int]]]:
    base = tmp_path_factory.mktemp("secure")
    assert run("dev-certs", str(base / "certs")).exit_code == 0
    overrides = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0,SSL://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL",
        "inter.broker.listener.name": "PLAINTEXT",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(base / "certs" / "broker.pem"),
        "ssl.truststore.location": str(base / "certs" / "ca.pem"),
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
        "num.partitions": "1",
    }
    with InProcessBroker(base / "data", overrides) as b:
        line = next(x for x in b.stderr_lines if "listening on" in x)
        ports = {name: int(port) for port, name in
                 re.findall(r"127\.0\.0\.1:(\d+) \((\w+)", line)}
        assert set(ports) == {"PLAINTEXT", "SASL_SSL", "SSL"}, line
        ca = base / "certs" / "ca.pem"
        admin = base / "admin.properties"
        admin.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
                         f"sasl.jaas.config={JAAS.split(' user_')[0]};\n"
                         f"ssl.truststore.location={ca}\n")
        r = run("--command-config", str(admin), "users", "add", "alice", "--mechanism",
                "SCRAM-SHA-512", "--password", "right", "-b",
                f"127.0.0.1:{ports['SASL_SSL']}")
        assert r.exit_code == 0, r.stderr
        yield base, ports


def _check(r: Result, code: int, words: str, took: float) -> None:
    assert r.exit_code == code, (r.exit_code, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert "Traceback" not in r.stderr and "KafkaException" not in r.stderr
    assert took < 6, took  # not librdkafka's 15 s


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_wrong_scram_password_is_exit_4(secure: tuple[Path, dict[str, int]],
                                          argv: tuple[str, ...]) -> None:
    base, ports = secure
    wrong = base / "wrong.properties"
    wrong.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                     "sasl.username=alice\nsasl.password=wrong\n"
                     f"ssl.ca.location={base / 'certs' / 'ca.pem'}\n")
    started = time.monotonic()
    r = run("--command-config", str(wrong), *argv, "-b", f"127.0.0.1:{ports['SASL_SSL']}")
    _check(r, 4, "authentication", time.monotonic() - started)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_tls_listener_without_command_config_is_exit_4(
        secure: tuple[Path, dict[str, int]], argv: tuple[str, ...]) -> None:
    _, ports = secure
    started = time.monotonic()
    r = run(*argv, "-b", f"127.0.0.1:{ports['SASL_SSL']}")
    _check(r, 4, "is a TLS listener", time.monotonic() - started)


@pytest.fixture
def not_kafka() -> Iterator[int]:
    """A server that answers every connection with an HTTP error and closes it."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(5)
    srv.close()


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_port_without_kafka_is_exit_3(not_kafka: int, argv: tuple[str, ...]) -> None:
    started = time.monotonic()
    r = run(*argv, "-b", f"127.0.0.1:{not_kafka}")
    _check(r, 3, "does not answer as a Kafka broker", time.monotonic() - started)
