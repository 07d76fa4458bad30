"""The admin commands' own Kafka-protocol connection (for the APIs confluent-kafka's
AdminClient lacks: client quotas, transactions, reassignments, log dirs), with the
security of ``headrace --command-config``: TLS (``ssl`` with the configured CA, client
certificate and key) and SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (scramp's client).

The settings are librdkafka's names (``admin_cli.client_config`` translates Kafka's):
``security.protocol``, ``ssl.ca.location``, ``ssl.certificate.location``,
``ssl.key.location``, ``ssl.key.password``, ``ssl.endpoint.identification.algorithm``,
``sasl.mechanism`` (or ``sasl.mechanisms``), ``sasl.username``, ``sasl.password``.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

from headrace.spark.wire import Connection

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class SecurityError(Exception):
    """TLS or SASL failed: a bad certificate, a refused password, an unsupported setting."""


def ssl_context(config: dict[str, str]) -> ssl.SSLContext:
    ca = config.get("ssl.ca.location")
    ctx = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    cert = config.get("ssl.certificate.location")
    if cert:
        ctx.load_cert_chain(cert, config.get("ssl.key.location") or cert,
                            config.get("ssl.key.password"))
    if config.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        ctx.check_hostname = False
    return ctx


class AdminConnection(Connection):
    """A :class:`headrace.spark.wire.Connection` over TLS and/or SASL as ``config`` says.

    Raises OSError when the broker cannot be reached and SecurityError when TLS or SASL
    fails."""

    def __init__(self, host: str, port: int, timeout_s: float,
                 config: dict[str, str] | None = None) -> None:
        config = dict(config or {})
        protocol = config.get("security.protocol", "PLAINTEXT").upper()
        if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise SecurityError(f"security.protocol {protocol} is not one of PLAINTEXT, SSL, "
                                "SASL_PLAINTEXT, SASL_SSL")
        self.address = (host, port)
        self.correlation_id = 0
        sock = socket.create_connection((host, port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if protocol in ("SSL", "SASL_SSL"):
            try:
                sock = ssl_context(config).wrap_socket(sock, server_hostname=host)
            except (ssl.SSLError, ssl.CertificateError) as e:
                sock.close()
                raise SecurityError(f"TLS with {host}:{port} failed: "
                                    f"{getattr(e, 'reason', None) or e}") from None
            except OSError as e:  # unreadable CA or certificate files
                sock.close()
                if e.filename is None and e.strerror is None:
                    raise
                raise SecurityError(f"TLS settings: {e}") from None
        self.sock = sock
        if protocol.startswith("SASL_"):
            try:
                self._authenticate(config)
            except BaseException:
                self.close()
                raise

    def _authenticate(self, config: dict[str, str]) -> None:
        mechanism = (config.get("sasl.mechanism") or config.get("sasl.mechanisms")
                     or "GSSAPI").upper()
        if mechanism not in SASL_MECHANISMS:
            raise SecurityError(f"sasl.mechanism {mechanism} is not supported by these "
                                f"commands (only {', '.join(SASL_MECHANISMS)})")
        user, password = config.get("sasl.username"), config.get("sasl.password")
        if user is None or password is None:
            raise SecurityError("SASL needs sasl.username and sasl.password (or "
                                "sasl.jaas.config) in the --command-config file")
        host, port = self.address
        resp = self.request(17, 1, {"mechanism": mechanism})
        if resp.error_code != 0:
            raise SecurityError(f"{host}:{port} does not accept SASL mechanism {mechanism} "
                                f"(it offers {', '.join(resp.mechanisms) or 'none'})")
        if mechanism == "PLAIN":
            self._sasl_step(f"\0{user}\0{password}".encode())
            return
        from scramp import ScramClient

        client: Any = ScramClient([mechanism], user, password)
        first = self._sasl_step(client.get_client_first().encode())
        try:
            client.set_server_first(first.decode())
            final = self._sasl_step(client.get_client_final().encode())
            client.set_server_final(final.decode())
        except SecurityError:
            raise
        except Exception as e:  # scramp's ScramException: the server is not genuine
            raise SecurityError(f"SCRAM with {host}:{port} failed: {e}") from None

    def _sasl_step(self, token: bytes) -> bytes:
        resp = self.request(36, 2, {"auth_bytes": token})
        if resp.error_code != 0:
            host, port = self.address
            raise SecurityError(f"authentication to {host}:{port} failed: "
                                f"{resp.error_message or resp.error_code}")
        return bytes(resp.auth_bytes)


def list_offsets(conn: Any, tps: list[tuple[str, int]]
                 ) -> dict[tuple[str, int], tuple[int, int]]:
    """ListOffsets v4 twice (earliest, latest) for partitions this broker leads; a
    partition it refuses (no longer its leader) is left out."""
    by_topic: dict[str, list[int]] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append(p)
    found: dict[tuple[str, int], list[int]] = {}
    for i, timestamp in enumerate((-2, -1)):
        resp = conn.request(2, 4, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": t, "partitions": [{"partition_index": p, "current_leader_epoch": -1,
                                        "timestamp": timestamp} for p in ps]}
            for t, ps in by_topic.items()]})
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code == 0:
                    found.setdefault((t.name, p.partition_index), [-1, -1])[i] = int(p.offset)
    return {tp: (v[0], v[1]) for tp, v in found.items() if v[1] >= 0}


def partition_sizes(conn: Any, parts: dict[str, list[int]]) -> dict[tuple[str, int], int]:
    """DescribeLogDirs v1 for ``parts`` (topic -> partitions): each replica's size in bytes
    on this broker (one entry per partition; with several log dirs, the dir holding it)."""
    resp = conn.request(35, 1, {"topics": [{"topic": n, "partitions": ps}
                                           for n, ps in parts.items()]})
    sizes: dict[tuple[str, int], int] = {}
    for result in resp.results:
        for t in result.topics:
            for p in t.partitions:
                sizes[(str(t.name), int(p.partition_index))] = int(p.partition_size)
    return sizes
