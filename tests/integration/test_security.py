"""Encrypted and authenticated listeners (issue 12, items 1-2) with real clients over TCP
against one broker process serving six listeners at once:

    PLAINTEXT, SSL (server certificate only), MTLS (SSL with ssl.client.auth=required),
    SASL_PLAINTEXT (PLAIN), SASL_SSL (PLAIN), OAUTH (SASL_SSL with OAUTHBEARER, JWTs checked
    against a JWKS file, connections.max.reauth.ms set)

confluent-kafka, kafka-python, aiokafka and Debian's kcat produce and consume over them;
wrong passwords, unknown users, expired or wrongly signed tokens and untrusted certificates
are refused (SASL_AUTHENTICATION_FAILED or a TLS failure) and the connection closed; the
wire-level rules of the exchange (what may come before authentication, its size limit,
KIP-368's session lifetime) are checked with a raw client; Metadata answers each listener
with its own endpoints. Certificates come from ``headrace dev-certs``' code.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import shutil
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from cryptography.hazmat.primitives.asymmetric import rsa
from kio.schema.errors import ErrorCode

from headrace.security.devcerts import write_dev_certs
from tests.brokerproc import BrokerProcess, wait_until
from tests.inproc import InProcessBroker
from tests.kafka_wire import WireClient
from tests.security_helpers import listener_ports, pem_keystore, plain_jaas, scram_user

pytestmark = pytest.mark.timeout(180)

PLAIN_USERS = {"admin": "admin-secret", "alice": "alice-secret"}
JAAS = plain_jaas(PLAIN_USERS)
ISSUER, AUDIENCE = "https://issuer.test", "headrace"
META = {"topics": None, "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False}


@dataclass
class Env:
    broker: BrokerProcess | InProcessBroker
    ports: dict[str, int]
    certs: dict[str, Path]
    untrusted: dict[str, Path]
    signing_key: Any
    other_key: Any

    def bootstrap(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def token(self, sub: str = "svc-1", *, ttl_s: int = 300, key: Any = None,
              aud: str = AUDIENCE, kid: str = "k1") -> str:
        now = int(time.time())
        return jwt.encode({"sub": sub, "iss": ISSUER, "aud": aud, "iat": now,
                           "exp": now + ttl_s}, key or self.signing_key, algorithm="RS256",
                          headers={"kid": kid})


def lifetime_ms(r: Any) -> int:
    """SaslAuthenticate's session_lifetime_ms (kio gives it as a timedelta)."""
    return int(r.session_lifetime.total_seconds() * 1000)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("security")
    certs = write_dev_certs(base / "certs", clients=("alice",))
    # a second CA nobody trusts, and a client certificate it signed
    stranger = write_dev_certs(base / "stranger", clients=("mallory",))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update(kid="k1", use="sig", alg="RS256")
    (base / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    # the same JWKS over HTTP (sasl.oauthbearer.jwks.endpoint.url as an identity
    # provider serves it; fetched off the broker's event loop, then cached)
    class IdentityProvider(http.server.SimpleHTTPRequestHandler):
        """Serves the JWKS, as an identity provider does."""

        def log_message(self, *args: Any) -> None:
            pass

    handler = functools.partial(IdentityProvider, directory=str(base))
    jwks_http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=jwks_http.serve_forever, daemon=True).start()
    listeners = ("PLAINTEXT", "SSL", "MTLS", "SASL_PLAINTEXT", "SASL_SSL", "OAUTH", "OAUTHURL",
                 "OAUTHDEV")
    overrides = {
        "listeners": ",".join(f"{n}://127.0.0.1:0" for n in listeners),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,"
                                          "SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,"
                                          "OAUTH:SASL_SSL,OAUTHURL:SASL_SSL,"
                                          "OAUTHDEV:SASL_PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        **pem_keystore(certs),
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
        "listener.name.oauth.sasl.enabled.mechanisms": "OAUTHBEARER",
        "listener.name.oauth.sasl.oauthbearer.jwks.endpoint.url":
            f"file://{base / 'jwks.json'}",
        "listener.name.oauth.sasl.oauthbearer.expected.audience": AUDIENCE,
        "listener.name.oauth.sasl.oauthbearer.expected.issuer": ISSUER,
        "listener.name.oauth.connections.max.reauth.ms": "3000",
        "listener.name.oauthurl.sasl.enabled.mechanisms": "OAUTHBEARER",
        # no JWKS: Kafka's unsecured development mode (unsigned tokens), the only
        # OAUTHBEARER Debian's kcat can do (its librdkafka has no OIDC)
        "listener.name.oauthdev.sasl.enabled.mechanisms": "OAUTHBEARER",
        "listener.name.oauthurl.sasl.oauthbearer.jwks.endpoint.url":
            f"http://127.0.0.1:{jwks_http.server_address[1]}/jwks.json",
        "num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",  # every client joins a group of one
    }
    with InProcessBroker(base / "data", overrides) as b:  # nothing here kills it
        ports = listener_ports(b)
        assert set(ports) == set(listeners), ports
        # a SCRAM-SHA-512 user for the client matrix
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{ports['PLAINTEXT']}"})
        for fut in admin.alter_user_scram_credentials(
                [scram_user("matrix", "matrix-pw")]).values():
            fut.result(15)
        yield Env(b, ports, certs, stranger, key, other)
        text = "".join(b.stderr_lines)
        assert "Traceback" not in text, text[-3000:]
    jwks_http.shutdown()


# ----------------------------------------------------------------------- client configs


def confluent_conf(env: Env, listener: str, **extra: Any) -> dict[str, Any]:
    c = env.certs
    conf: dict[str, Any] = {"bootstrap.servers": env.bootstrap(listener)}
    if listener in ("SSL", "MTLS", "SASL_SSL", "OAUTH"):
        conf["ssl.ca.location"] = str(c["ca.pem"])
    if listener == "SSL":
        conf["security.protocol"] = "SSL"
    if listener == "MTLS":
        conf.update({"security.protocol": "SSL",
                     "ssl.certificate.location": str(c["client-alice-cert.pem"]),
                     "ssl.key.location": str(c["client-alice-key.pem"])})
    if listener in ("SASL_PLAINTEXT", "SASL_SSL"):
        conf.update({"security.protocol": listener, "sasl.mechanism": "PLAIN",
                     "sasl.username": "alice", "sasl.password": "alice-secret"})
    if listener == "OAUTH":
        conf.update({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                     "oauth_cb": lambda _cfg: (env.token(), time.time() + 300)})
    conf.update(extra)
    return conf


def roundtrip_confluent(conf: dict[str, Any], n: int = 20) -> list[bytes]:
    """Create a topic, produce ``n`` records and consume them back over ``conf``."""
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    p = Producer({**conf, "message.timeout.ms": 15000})
    errors: list[Any] = []
    for i in range(n):
        p.produce(topic, b"r%d" % i, on_delivery=lambda e, _m: errors.append(e) if e else None)
    assert p.flush(30) == 0 and not errors, errors
    c = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
    finally:
        c.close()
    return got


@pytest.mark.parametrize("listener", ["SSL", "MTLS", "SASL_PLAINTEXT", "SASL_SSL", "OAUTH"])
def test_confluent_kafka_produces_and_consumes(env: Env, listener: str) -> None:
    got = roundtrip_confluent(confluent_conf(env, listener))
    assert sorted(got) == sorted(b"r%d" % i for i in range(20))


@pytest.mark.slow
def test_oauthbearer_with_the_jwks_fetched_over_http(env: Env) -> None:
    conf = confluent_conf(env, "OAUTH", **{"bootstrap.servers": env.bootstrap("OAUTHURL")})
    assert sorted(roundtrip_confluent(conf, 5)) == [b"r%d" % i for i in range(5)]
    refused({**conf, "oauth_cb": lambda _c: (env.token(key=env.other_key),
                                             time.time() + 300)})


@pytest.mark.slow
def test_unsecured_oauthbearer_takes_unsigned_tokens_only(env: Env) -> None:
    """Kafka's development mode (no JWKS): librdkafka's unsigned token gets in; a signed
    one is refused (and on the JWKS listeners an unsigned one is)."""
    base = {"bootstrap.servers": env.bootstrap("OAUTHDEV"),
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"}
    unsigned = {"sasl.oauthbearer.config": "principal=dev",
                "enable.sasl.oauthbearer.unsecure.jwt": True}
    assert roundtrip_confluent({**base, **unsigned}, 3)
    refused({**base, "oauth_cb": lambda _c: (env.token(), time.time() + 300)})
    secured = confluent_conf(env, "OAUTH", **unsigned)
    del secured["oauth_cb"]
    refused(secured)


def test_sasl_handshake_v0_then_bare_tokens(env: Env) -> None:
    """SaslHandshake v0 (Kafka's original form, still advertised as librdkafka 2.0 needs):
    the tokens follow as bare size-prefixed frames, then requests as usual; a bad token
    closes the connection (v0 has no error field)."""
    with WireClient.to(env.bootstrap("SASL_PLAINTEXT")) as w:
        assert w.request(17, 0, {"mechanism": "PLAIN"}).error_code == 0
        w.send_raw(len(b"\0alice\0alice-secret").to_bytes(4, "big") + b"\0alice\0alice-secret")
        assert w.recv_frame() == b""
        assert w.request(3, 12, META).brokers
    with WireClient.to(env.bootstrap("SASL_PLAINTEXT")) as w:
        assert w.request(17, 0, {"mechanism": "PLAIN"}).error_code == 0
        w.send_raw((12).to_bytes(4, "big") + b"\0alice\0wrong")
        assert w.is_closed_by_peer()


def test_metadata_answers_each_listener_with_its_own_endpoints(env: Env) -> None:
    for listener in ("PLAINTEXT", "SSL", "SASL_SSL"):
        md = AdminClient(confluent_conf(env, listener)).list_topics(timeout=15)
        assert [(b.host, b.port) for b in md.brokers.values()] == [
            ("127.0.0.1", env.ports[listener])], listener


@pytest.mark.slow
def test_kafka_python_over_ssl_mtls_and_sasl(env: Env) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    c = env.certs
    for listener, extra in [
        ("SSL", {"security_protocol": "SSL", "ssl_cafile": str(c["ca.pem"])}),
        ("MTLS", {"security_protocol": "SSL", "ssl_cafile": str(c["ca.pem"]),
                  "ssl_certfile": str(c["client-alice-cert.pem"]),
                  "ssl_keyfile": str(c["client-alice-key.pem"])}),
        ("SASL_SSL", {"security_protocol": "SASL_SSL", "ssl_cafile": str(c["ca.pem"]),
                      "sasl_mechanism": "PLAIN", "sasl_plain_username": "alice",
                      "sasl_plain_password": "alice-secret"}),
    ]:
        topic = f"kp-{uuid.uuid4().hex[:8]}"
        p = KafkaProducer(bootstrap_servers=env.bootstrap(listener), **extra)
        for i in range(5):
            p.send(topic, b"k%d" % i).get(timeout=30)
        p.close()
        cons = KafkaConsumer(topic, bootstrap_servers=env.bootstrap(listener),
                             auto_offset_reset="earliest", consumer_timeout_ms=10000,
                             group_id=f"g-{topic}", **extra)
        got = kafka_python_take(cons, 5)
        cons.close()
        assert sorted(got) == [b"k%d" % i for i in range(5)], listener


def test_aiokafka_over_sasl_ssl_and_oauthbearer(env: Env) -> None:
    from aiokafka.abc import AbstractTokenProvider
    from aiokafka.helpers import create_ssl_context

    class Tokens(AbstractTokenProvider):
        async def token(self) -> str:
            return env.token("svc-aio")

    async def run(listener: str, extra: dict[str, Any]) -> list[bytes]:
        ctx = create_ssl_context(cafile=str(env.certs["ca.pem"]))
        return await aio_roundtrip(f"aio-{uuid.uuid4().hex[:8]}", [b"a%d" % i for i in range(5)],
                                   bootstrap_servers=env.bootstrap(listener), ssl_context=ctx,
                                   security_protocol="SASL_SSL", **extra)

    assert sorted(asyncio.run(run("SASL_SSL", {
        "sasl_mechanism": "PLAIN", "sasl_plain_username": "alice",
        "sasl_plain_password": "alice-secret"}))) == [b"a%d" % i for i in range(5)]
    assert sorted(asyncio.run(run("OAUTH", {
        "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": Tokens()}))) == [
        b"a%d" % i for i in range(5)]


def test_kcat_over_sasl_ssl(env: Env) -> None:
    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed (scripts/test.sh installs it)")
    topic = f"kc-{uuid.uuid4().hex[:8]}"
    opts = ["-b", env.bootstrap("SASL_SSL"), "-X", "security.protocol=SASL_SSL",
            "-X", f"ssl.ca.location={env.certs['ca.pem']}", "-X", "sasl.mechanisms=PLAIN",
            "-X", "sasl.username=alice", "-X", "sasl.password=alice-secret"]
    subprocess.run(["kcat", *opts, "-P", "-t", topic], input="x1\nx2\nx3\n", text=True,
                   check=True, timeout=60)
    out = subprocess.run(["kcat", *opts, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["x1", "x2", "x3"]


# ------------------------------------------------- every client over every mode

MODES = ["SSL", "MTLS", "SASL_PLAINTEXT/PLAIN", "SASL_SSL/SCRAM-SHA-512", "OAUTHBEARER"]
CLIENTS = ["confluent", "kafka-python", "aiokafka", "kcat"]


def librdkafka_conf(env: Env, mode: str, kcat: bool = False) -> dict[str, Any]:
    """librdkafka's settings for a mode (confluent-kafka and kcat); confluent-kafka gets
    signed OAUTHBEARER tokens from a callback, kcat (no callbacks, and Debian's librdkafka
    has no OIDC) makes its own unsigned one for the listener in Kafka's unsecured mode."""
    c = env.certs
    ca = {"ssl.ca.location": str(c["ca.pem"])}
    if mode == "SSL":
        return {"bootstrap.servers": env.bootstrap("SSL"), "security.protocol": "SSL", **ca}
    if mode == "MTLS":
        return {"bootstrap.servers": env.bootstrap("MTLS"), "security.protocol": "SSL", **ca,
                "ssl.certificate.location": str(c["client-alice-cert.pem"]),
                "ssl.key.location": str(c["client-alice-key.pem"])}
    if mode == "SASL_PLAINTEXT/PLAIN":
        return {"bootstrap.servers": env.bootstrap("SASL_PLAINTEXT"),
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": "alice", "sasl.password": "alice-secret"}
    if mode == "SASL_SSL/SCRAM-SHA-512":
        return {"bootstrap.servers": env.bootstrap("SASL_SSL"), "security.protocol": "SASL_SSL",
                **ca, "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "matrix",
                "sasl.password": "matrix-pw"}
    conf: dict[str, Any] = {"bootstrap.servers": env.bootstrap("OAUTHURL"),
                            "security.protocol": "SASL_SSL", **ca,
                            "sasl.mechanism": "OAUTHBEARER"}
    if kcat:
        # Debian's librdkafka has no OIDC (no libcurl): its own unsigned token, on the
        # listener in Kafka's unsecured development mode
        conf = {"bootstrap.servers": env.bootstrap("OAUTHDEV"),
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                "sasl.oauthbearer.config": "principal=svc-kcat",
                "enable.sasl.oauthbearer.unsecure.jwt": "true"}
    else:
        conf["oauth_cb"] = lambda _cfg: (env.token("svc-ck"), time.time() + 300)
    return conf


def python_kwargs(env: Env, mode: str, aio: bool) -> dict[str, Any]:
    """kafka-python's / aiokafka's settings for a mode."""
    c = env.certs
    tls: dict[str, Any]
    cert = (str(c["client-alice-cert.pem"]), str(c["client-alice-key.pem"]))
    if aio:
        from aiokafka.helpers import create_ssl_context

        tls = {"ssl_context": create_ssl_context(
            cafile=str(c["ca.pem"]), certfile=cert[0] if mode == "MTLS" else None,
            keyfile=cert[1] if mode == "MTLS" else None)}
    else:
        tls = {"ssl_cafile": str(c["ca.pem"])}
        if mode == "MTLS":
            tls.update(ssl_certfile=cert[0], ssl_keyfile=cert[1])
    if mode in ("SSL", "MTLS"):
        return {"bootstrap_servers": env.bootstrap(mode), "security_protocol": "SSL", **tls}
    if mode == "SASL_PLAINTEXT/PLAIN":
        return {"bootstrap_servers": env.bootstrap("SASL_PLAINTEXT"),
                "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                "sasl_plain_username": "alice", "sasl_plain_password": "alice-secret"}
    if mode == "SASL_SSL/SCRAM-SHA-512":
        return {"bootstrap_servers": env.bootstrap("SASL_SSL"), "security_protocol": "SASL_SSL",
                **tls, "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "matrix",
                "sasl_plain_password": "matrix-pw"}
    if aio:
        from aiokafka.abc import AbstractTokenProvider as AioProvider

        class AioTokens(AioProvider):
            async def token(self) -> str:
                return env.token("svc-aio")

        provider: Any = AioTokens()
    else:
        from kafka.net.sasl.oauth import AbstractTokenProvider

        class Tokens(AbstractTokenProvider):
            def token(self) -> str:
                return env.token("svc-kp")

        provider = Tokens()
    return {"bootstrap_servers": env.bootstrap("OAUTHURL"), "security_protocol": "SASL_SSL",
            **tls, "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": provider}


def kafka_python_take(cons: Any, n: int) -> list[bytes]:
    """The values a kafka-python consumer iterator yields until it has ``n`` (its
    consumer_timeout_ms bounds the wait for each), then whatever one more short poll brings:
    a record too many still fails the caller's comparison, without waiting out the timeout."""
    got: list[bytes] = []
    for m in cons:
        got.append(m.value)
        if len(got) >= n:
            break
    got += [m.value for msgs in cons.poll(timeout_ms=300).values() for m in msgs]
    return got


def roundtrip(env: Env, client: str, mode: str) -> list[bytes]:
    """Produce three records with ``client`` over ``mode`` and consume them back."""
    topic = f"mx-{uuid.uuid4().hex[:8]}"
    want = [b"m1", b"m2", b"m3"]
    if client == "confluent":
        return roundtrip_confluent(librdkafka_conf(env, mode), 3)
    if client == "kcat":
        if shutil.which("kcat") is None:
            pytest.fail("kcat is not installed (scripts/test.sh installs it)")
        opts = [a for k, v in librdkafka_conf(env, mode, kcat=True).items()
                if k != "bootstrap.servers" for a in ("-X", f"{k}={v}")]
        opts = ["-b", librdkafka_conf(env, mode, kcat=True)["bootstrap.servers"], *opts]
        put = subprocess.run(["kcat", *opts, "-P", "-t", topic], input="m1\nm2\nm3\n",
                             text=True, timeout=60, capture_output=True)
        assert put.returncode == 0, put.stderr[-2000:]
        out = subprocess.run(["kcat", *opts, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        return [x.encode() for x in out.stdout.split()]
    if client == "kafka-python":
        from kafka import KafkaConsumer, KafkaProducer

        kw = python_kwargs(env, mode, aio=False)
        p = KafkaProducer(**kw)
        for v in want:
            p.send(topic, v).get(timeout=30)
        p.close()
        cons = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=10000,
                             group_id=f"g-{topic}", **kw)
        got = kafka_python_take(cons, len(want))
        cons.close()
        return got

    return asyncio.run(aio_roundtrip(topic, want, **python_kwargs(env, mode, aio=True)))


async def aio_roundtrip(topic: str, values: list[bytes], **kw: Any) -> list[bytes]:
    """Produce ``values`` to ``topic`` with aiokafka and consume them back (group
    ``g-<topic>``), both with the settings ``kw``."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    prod = AIOKafkaProducer(**kw)
    await prod.start()
    try:
        for v in values:
            await prod.send_and_wait(topic, v)
    finally:
        await prod.stop()
    cons = AIOKafkaConsumer(topic, auto_offset_reset="earliest", group_id=f"g-{topic}", **kw)
    await cons.start()
    got: list[bytes] = []
    try:
        while len(got) < len(values):
            batch = await asyncio.wait_for(cons.getmany(timeout_ms=1000), 30)
            got += [m.value for msgs in batch.values() for m in msgs if m.value]
    finally:
        await cons.stop()
    return got


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("client", CLIENTS)
def test_every_client_produces_and_consumes_over_every_mode(env: Env, client: str,
                                                            mode: str) -> None:
    """The issue's matrix: confluent-kafka, kafka-python, aiokafka and Debian's kcat over
    SSL, mutual TLS, SASL_PLAINTEXT/PLAIN, SASL_SSL/SCRAM-SHA-512 and OAUTHBEARER."""
    got = roundtrip(env, client, mode)
    expected = [b"m1", b"m2", b"m3"] if client != "confluent" else [b"r0", b"r1", b"r2"]
    assert sorted(got) == expected


# ----------------------------------------------------------------------- SCRAM


@pytest.mark.slow
def test_scram_users_created_through_the_admin_api_authenticate(env: Env) -> None:
    """SCRAM-SHA-512 and -256 (RFC 5802/7677): credentials made with
    AlterUserScramCredentials (salted; the broker keeps StoredKey and ServerKey, never the
    password) let confluent-kafka, kafka-python and aiokafka in over SASL_SSL; a wrong
    password, a mechanism the user has no credential for and an unknown user are refused."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )
    from kafka import KafkaProducer

    admin = AdminClient({"bootstrap.servers": env.bootstrap("PLAINTEXT")})
    results = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("sam", ScramCredentialInfo(
            ScramMechanism.SCRAM_SHA_512, 8192), b"sam-pw"),
        UserScramCredentialUpsertion("tia", ScramCredentialInfo(
            ScramMechanism.SCRAM_SHA_256, 4096), b"tia-pw")])
    for fut in results.values():
        fut.result(15)
    scram = {"security.protocol": "SASL_SSL", "ssl.ca.location": str(env.certs["ca.pem"]),
             "bootstrap.servers": env.bootstrap("SASL_SSL")}
    got = roundtrip_confluent({**scram, "sasl.mechanism": "SCRAM-SHA-512",
                               "sasl.username": "sam", "sasl.password": "sam-pw"})
    assert sorted(got) == sorted(b"r%d" % i for i in range(20))
    for mech, user, password in (("SCRAM-SHA-512", "sam", "wrong"),
                                 ("SCRAM-SHA-256", "sam", "sam-pw"),
                                 ("SCRAM-SHA-512", "nobody", "x")):
        refused({**scram, "sasl.mechanism": mech, "sasl.username": user,
                 "sasl.password": password})
    topic = f"scram-{uuid.uuid4().hex[:8]}"
    p = KafkaProducer(bootstrap_servers=env.bootstrap("SASL_SSL"),
                      security_protocol="SASL_SSL", ssl_cafile=str(env.certs["ca.pem"]),
                      sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="sam",
                      sasl_plain_password="sam-pw")
    assert p.send(topic, b"kp").get(timeout=30).offset == 0
    p.close()

    async def aio() -> int:
        prod = AIOKafkaProducer(
            bootstrap_servers=env.bootstrap("SASL_SSL"), security_protocol="SASL_SSL",
            ssl_context=create_ssl_context(cafile=str(env.certs["ca.pem"])),
            sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="tia",
            sasl_plain_password="tia-pw")
        await prod.start()
        try:
            return (await prod.send_and_wait(topic, b"aio")).offset
        finally:
            await prod.stop()

    assert asyncio.run(aio()) == 1


# ----------------------------------------------------------------------- refusals


def refused(conf: dict[str, Any]) -> str:
    """A metadata request over ``conf`` fails; the error text."""
    admin = AdminClient({**conf, "socket.timeout.ms": 5000})
    with pytest.raises(KafkaException) as info:
        admin.list_topics(timeout=6)
    return str(info.value)


@pytest.mark.slow
def test_wrong_password_and_unknown_user_are_refused(env: Env) -> None:
    for user, password in (("alice", "wrong"), ("nobody", "x")):
        refused(confluent_conf(env, "SASL_PLAINTEXT", **{"sasl.username": user,
                                                        "sasl.password": password}))
    # on the wire: SASL_AUTHENTICATION_FAILED, then the broker closes the connection
    with WireClient.to(env.bootstrap("SASL_PLAINTEXT")) as w:
        hs = w.request(17, 1, {"mechanism": "PLAIN"})
        assert hs.error_code == ErrorCode.none and list(hs.mechanisms) == ["PLAIN"]
        r = w.request(36, 2, {"auth_bytes": b"\0alice\0wrong"})
        assert r.error_code == ErrorCode.sasl_authentication_failed
        assert "Invalid username or password" in r.error_message
        assert w.is_closed_by_peer()


def test_a_wrong_password_or_unknown_user_fails_on_the_wire_and_closes(env: Env) -> None:
    """Fast twin of test_wrong_password_and_unknown_user_are_refused (which waits out
    librdkafka's retries): each gets SASL_AUTHENTICATION_FAILED and a closed connection."""
    for user, password in (("alice", "wrong"), ("nobody", "x"), ("alice", "")):
        with WireClient.to(env.bootstrap("SASL_PLAINTEXT")) as w:
            assert w.request(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.none
            r = w.request(36, 2, {"auth_bytes": f"\0{user}\0{password}".encode()})
            assert r.error_code == ErrorCode.sasl_authentication_failed, user
            assert w.is_closed_by_peer()
    with WireClient.to(env.bootstrap("SASL_PLAINTEXT")) as w:  # the right one gets in
        assert w.request(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.none
        r = w.request(36, 2, {"auth_bytes": b"\0alice\0alice-secret"})
        assert r.error_code == ErrorCode.none
        assert w.request(3, 12, META).brokers


def _mtls_api_versions(env: Env, cert: Path | None, key: Path | None) -> bool:
    """Whether an ApiVersions over the mutual-TLS listener is answered with this client
    certificate (TLS 1.3 refuses a client certificate after the handshake: at the read)."""
    ctx = ssl.create_default_context(cafile=str(env.certs["ca.pem"]))
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key))
    try:
        with WireClient.to(env.bootstrap("MTLS"), timeout_s=5) as w:
            w.sock = ctx.wrap_socket(w.sock, server_hostname="localhost")
            return w.request(18, 3, {"client_software_name": "x",
                                     "client_software_version": "1"}).error_code == 0
    except (ssl.SSLError, ConnectionError, OSError):
        return False


def test_mutual_tls_answers_only_a_certificate_of_the_trusted_ca(env: Env) -> None:
    """Fast twin of test_untrusted_or_missing_client_certificates_are_refused (which waits
    out librdkafka's retries): no certificate, or one of another CA, gets no answer."""
    c, u = env.certs, env.untrusted
    assert _mtls_api_versions(env, c["client-alice-cert.pem"], c["client-alice-key.pem"])
    assert not _mtls_api_versions(env, None, None)
    assert not _mtls_api_versions(env, u["client-mallory-cert.pem"], u["client-mallory-key.pem"])


def test_expired_and_foreign_tokens_are_refused(env: Env) -> None:
    bad = [env.token(ttl_s=-120), env.token(key=env.other_key), env.token(aud="other")]
    for token in bad:
        gs2 = f"n,,\x01auth=Bearer {token}\x01\x01".encode()
        with WireClient.to(env.bootstrap("OAUTH")) as w:
            w.sock = ssl.create_default_context(cafile=str(env.certs["ca.pem"])).wrap_socket(
                w.sock, server_hostname="localhost")
            assert w.request(17, 1, {"mechanism": "OAUTHBEARER"}).error_code == 0
            r = w.request(36, 2, {"auth_bytes": gs2})
            assert r.error_code == ErrorCode.sasl_authentication_failed, token
            assert w.is_closed_by_peer()


@pytest.mark.slow
def test_untrusted_or_missing_client_certificates_are_refused(env: Env) -> None:
    # mutual TLS: no certificate, or one signed by a CA the broker does not trust
    refused(confluent_conf(env, "SSL", **{"bootstrap.servers": env.bootstrap("MTLS")}))
    refused(confluent_conf(env, "MTLS", **{
        "ssl.certificate.location": str(env.untrusted["client-mallory-cert.pem"]),
        "ssl.key.location": str(env.untrusted["client-mallory-key.pem"])}))
    # a client that does not trust the broker's CA gives up on it
    refused(confluent_conf(env, "SSL", **{"ssl.ca.location": str(env.untrusted["ca.pem"])}))
    # and a plaintext client on a TLS port gets nothing
    with WireClient.to(env.bootstrap("SSL"), timeout_s=5) as w:
        w.send_raw(w.encode(18, 3, {"client_software_name": "x",
                                    "client_software_version": "1"}))
        with pytest.raises((ConnectionError, TimeoutError, OSError)):
            w.recv_frame()


def test_requests_before_authentication_close_the_connection(env: Env) -> None:
    with WireClient.to(env.bootstrap("SASL_PLAINTEXT")) as w:
        # ApiVersions is allowed first (clients ask before the handshake) ...
        assert w.request(18, 3, {"client_software_name": "x",
                                 "client_software_version": "1"}).error_code == 0
        # ... Metadata is not
        w.send_raw(w.encode(3, 12, META))
        assert w.is_closed_by_peer()
    # an unknown mechanism: UNSUPPORTED_SASL_MECHANISM with the enabled ones
    with WireClient.to(env.bootstrap("SASL_PLAINTEXT")) as w:
        r = w.request(17, 1, {"mechanism": "GSSAPI"})
        assert r.error_code == ErrorCode.unsupported_sasl_mechanism
        assert list(r.mechanisms) == ["PLAIN"]
    # before authentication a frame may not exceed sasl.server.max.receive.size (512 KiB)
    with WireClient.to(env.bootstrap("SASL_PLAINTEXT")) as w:
        w.send_raw((600_000).to_bytes(4, "big") + b"\0" * 1024)
        assert w.is_closed_by_peer()
    # a SASL request on a PLAINTEXT listener: ILLEGAL_SASL_STATE, as Kafka answers
    with WireClient.to(env.bootstrap("PLAINTEXT")) as w:
        assert w.request(17, 1, {"mechanism": "PLAIN"}).error_code == \
            ErrorCode.illegal_sasl_state


def test_session_lifetime_and_reauthentication(env: Env) -> None:
    """KIP-368: with connections.max.reauth.ms (3 s on OAUTH) the broker tells the client
    its session lifetime (capped by the token's expiry); re-authenticating on the same
    connection extends it; a request after the session ended closes the connection."""
    def connect() -> WireClient:
        w = WireClient.to(env.bootstrap("OAUTH"))
        w.sock = ssl.create_default_context(cafile=str(env.certs["ca.pem"])).wrap_socket(
            w.sock, server_hostname="localhost")
        return w

    def authenticate(w: WireClient, ttl_s: int, sub: str = "svc-1") -> Any:
        assert w.request(17, 1, {"mechanism": "OAUTHBEARER"}).error_code == 0
        gs2 = f"n,,\x01auth=Bearer {env.token(sub, ttl_s=ttl_s)}\x01\x01".encode()
        return w.request(36, 2, {"auth_bytes": gs2})

    with connect() as w:
        r = authenticate(w, ttl_s=300)
        assert r.error_code == 0 and 2500 <= lifetime_ms(r) <= 3000
        start = time.monotonic()
        assert w.request(3, 12, META).brokers
        # re-authenticate half-way through the session: it goes on past the first one's end
        wait_until(lambda: time.monotonic() - start > 1.5, 10, 0.05, "half the session")
        r = authenticate(w, ttl_s=300)
        assert r.error_code == 0 and lifetime_ms(r) > 0
        wait_until(lambda: time.monotonic() - start > 3.4, 10, 0.05, "the first session's end")
        assert w.request(3, 12, META).brokers
        # a different principal may not take over the connection
        assert authenticate(w, ttl_s=300, sub="svc-2").error_code == \
            ErrorCode.sasl_authentication_failed
    with connect() as w:
        # a token that expires before connections.max.reauth.ms caps the session
        r = authenticate(w, ttl_s=2)
        assert r.error_code == 0 and lifetime_ms(r) <= 2000
        ended = time.monotonic() + lifetime_ms(r) / 1000
        wait_until(lambda: time.monotonic() > ended + 0.2, 10, 0.1, "the session's end")
        w.send_raw(w.encode(3, 12, META))
        assert w.is_closed_by_peer()


@pytest.mark.slow
def test_confluent_kafka_reauthenticates_and_keeps_consuming(env: Env) -> None:
    """librdkafka re-authenticates before the 3 s session ends (KIP-368): a consumer
    polling for 8 s keeps its connection and gets records produced throughout."""
    conf = confluent_conf(env, "OAUTH")
    expired_before = "".join(env.broker.stderr_lines).count("session expired")
    topic = f"reauth-{uuid.uuid4().hex[:8]}"
    p = Producer(conf)
    c = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    sent, got = 0, 0
    end = time.monotonic() + 8
    try:
        while time.monotonic() < end:
            p.produce(topic, b"x")
            p.poll(0)
            sent += 1
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got += 1
        assert p.flush(30) == 0
        deadline = time.monotonic() + 20
        while got < sent and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got += 1
    finally:
        c.close()
    assert got == sent > 10
    assert "".join(env.broker.stderr_lines).count("session expired") == expired_before


def test_a_tls_listener_with_no_certificate_refuses_to_start(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "d", {"listeners": "SSL://127.0.0.1:0"})
    with pytest.raises(RuntimeError, match=r"ssl\.keystore\.location"):
        b.start(timeout_s=20)
    b.kill()
