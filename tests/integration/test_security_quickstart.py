"""The README's security quickstart, run as written (issue 12, item 5): its certificate
command, its two properties files and its commands, in a fresh directory (the port made
free), then the user it creates as a client: `alice` reads `orders` in group `orders-app`
and is refused everything else."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import wait_until
from tests.ports import reserve_port
from tests.readme import readme_block

pytestmark = pytest.mark.timeout(180)

README = Path(__file__).resolve().parents[2] / "README.md"
PORT = "9093"


def quickstart_blocks() -> list[tuple[str, str]]:
    return [(kind, readme_block(name)) for kind, name in (
        ("sh", "security-dev-certs"), ("properties", "security-broker-properties"),
        ("properties", "security-admin-properties"), ("sh", "security-commands"))]


def headrace_argv(line: str) -> list[str]:
    argv = shlex.split(line)
    assert argv[0] == ".venv/bin/headrace", line
    return [sys.executable, "-m", "headrace.cli", *argv[1:]]


def free_port() -> int:
    return reserve_port()  # outside the ephemeral range (tests/ports.py)


def start_broker(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start the README's broker and wait for its listening line."""
    broker = subprocess.Popen(argv, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
    assert broker.stderr is not None
    stderr = broker.stderr

    def listening() -> bool:
        if broker.poll() is not None:
            raise AssertionError("broker exited: " + stderr.read())
        return "listening on" in stderr.readline()

    wait_until(listening, 30, 0, "the secured broker")
    return broker


def test_readme_security_quickstart(tmp_path: Path) -> None:
    blocks = quickstart_blocks()
    assert [kind for kind, _ in blocks] == ["sh", "properties", "properties", "sh"]
    port = str(free_port())
    (certs_cmd,) = blocks[0][1].strip().splitlines()
    subprocess.run(headrace_argv(certs_cmd), cwd=tmp_path, check=True, timeout=60,
                   capture_output=True)
    assert (tmp_path / "certs" / "broker.pem").is_file()
    (tmp_path / "secure.properties").write_text(blocks[1][1].replace(PORT, port))
    (tmp_path / "admin.properties").write_text(blocks[2][1])
    env = dict(os.environ)
    broker: subprocess.Popen[str] | None = None
    bootstrap = f"127.0.0.1:{port}"
    try:
        for line in blocks[3][1].strip().splitlines():
            line = line.replace(PORT, port)
            if line.startswith("export "):
                key, _, value = line[len("export "):].partition("=")
                env[key] = value
                continue
            if line.endswith("&"):
                broker = start_broker(headrace_argv(line[:-1]), tmp_path, env)
                continue
            done = subprocess.run(headrace_argv(line), cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, (line, done.stdout, done.stderr)
        assert broker is not None
        listed = done.stdout
        assert "User:alice" in listed and "orders-app" in listed

        tls = {"security.protocol": "SASL_SSL", "ssl.ca.location":
               str(tmp_path / "certs" / "ca.pem"), "bootstrap.servers": bootstrap}
        admin = {**tls, "sasl.mechanism": "PLAIN", "sasl.username": "admin",
                 "sasl.password": "admin-secret"}
        alice = {**tls, "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
                 "sasl.password": "alice-secret"}
        other = f"other-{uuid.uuid4().hex[:6]}"
        admin_client = AdminClient(admin)
        admin_client.create_topics([NewTopic(other, 1, 1)])[other].result(30)
        p = Producer(admin)
        for i in range(10):
            p.produce("orders", b"o%d" % i, partition=i % 3)
            p.produce(other, b"x")
        assert p.flush(30) == 0

        def consume(conf: dict[str, str], topic: str, group: str) -> tuple[int, int | None]:
            c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
            c.subscribe([topic])
            got, err = 0, None
            deadline = time.monotonic() + 20
            try:
                while got < 10 and err is None and time.monotonic() < deadline:
                    m = c.poll(0.5)
                    if m is None:
                        continue
                    if m.error() is not None:
                        err = m.error().code()
                    else:
                        got += 1
            finally:
                c.close()
            return got, err

        assert consume(alice, "orders", "orders-app") == (10, None)
        assert consume(alice, other, "orders-app")[1] == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert consume(alice, "orders", "someone-else")[1] == \
            KafkaError.GROUP_AUTHORIZATION_FAILED
        writer = Producer({**alice, "message.timeout.ms": 5000})
        errors: list[KafkaError] = []
        writer.produce("orders", b"nope", on_delivery=lambda e, _m: errors.append(e))
        writer.flush(10)
        assert errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        alice_admin = AdminClient(alice)
        with pytest.raises(KafkaException) as info:
            alice_admin.create_topics([NewTopic("alices", 1, 1)])["alices"].result(30)
        assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        if broker is not None:
            broker.terminate()
            broker.wait(30)
