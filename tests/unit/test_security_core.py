"""The pure parts of TLS and SASL (issue 12): Kafka's ssl.principal.mapping.rules, JAAS
options, listener parsing and the SASL server mechanisms driven by real client
implementations (scramp's SCRAM client, PyJWT tokens)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from scramp import ScramClient

from headrace.config import ConfigError
from headrace.security.listeners import (
    jaas_options,
    map_principal,
    parse_listeners,
    parse_principal_rules,
)
from headrace.security.principal import Principal
from headrace.security.sasl import (
    JwksKeys,
    OAuthBearerServer,
    OAuthSettings,
    PlainServer,
    SaslFailure,
    ScramServer,
)
from headrace.security.scram import format_credential, from_password, parse_credential


@pytest.mark.parametrize(("rules", "dn", "expected"), [
    # Kafka's documented examples (SslPrincipalMapperTest)
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT", "CN=kafka1,OU=ServiceUsers,O=Org",
     "kafka1"),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT", "CN=bob,OU=People,O=Org",
     "CN=bob,OU=People,O=Org"),
    ("RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,DEFAULT",
     "CN=Duke,OU=JavaSoft,O=Sun Microsystems,L=Palo Alto,ST=CA,C=US", "duke@javasoft"),
    ("RULE:^CN=(.*?),OU=(.*?)$/$1/U", "CN=alice,OU=x", "ALICE"),
    ("", "CN=x", "CN=x"),
])
def test_principal_mapping_rules(rules: str, dn: str, expected: str) -> None:
    assert map_principal(parse_principal_rules(rules), dn) == expected


def test_principal_mapping_without_a_match_fails() -> None:
    with pytest.raises(ValueError):
        map_principal(parse_principal_rules("RULE:^CN=(.*)$/$1/"), "OU=nobody")
    with pytest.raises(ConfigError):
        parse_principal_rules("RULE:^CN=(.*$/$1/")


def test_jaas_options() -> None:
    opts = jaas_options('org.apache.kafka.common.security.plain.PlainLoginModule required '
                        'username="admin" password="a\\"b" user_alice="s=3;x";')
    assert opts == {"username": "admin", "password": 'a"b', "user_alice": "s=3;x"}


def test_listeners_and_the_inter_broker_one() -> None:
    raw = {"listeners": "INTERNAL://:0,EXTERNAL://:0", "listener.security.protocol.map":
           "INTERNAL:SASL_PLAINTEXT,EXTERNAL:PLAINTEXT",
           "security.inter.broker.protocol": "SASL_PLAINTEXT",
           "sasl.mechanism.inter.broker.protocol": "PLAIN",
           "listener.name.internal.plain.sasl.jaas.config":
               'x required username="b" password="p" user_b="p";'}
    listeners, inter = parse_listeners(raw, "127.0.0.1", 0, "", 0)
    assert [(x.name, x.protocol) for x in listeners] == [
        ("INTERNAL", "SASL_PLAINTEXT"), ("EXTERNAL", "PLAINTEXT")]
    assert (inter.listener, inter.mechanism, inter.username, inter.password) == (
        "INTERNAL", "PLAIN", "b", "p")
    assert listeners[0].sasl is not None and listeners[0].sasl.plain_users == {"b": "p"}
    with pytest.raises(ConfigError, match="username"):
        parse_listeners({**raw, "listener.name.internal.plain.sasl.jaas.config": "x;"},
                        "127.0.0.1", 0, "", 0)


def test_plain() -> None:
    s = PlainServer({"alice": "pw"})
    assert s.step(b"\0alice\0pw") == b"" and s.complete
    assert s.principal == Principal("User", "alice")
    for token in (b"\0alice\0nope", b"\0bob\0pw", b"bob\0alice\0pw", b"alice\0pw"):
        with pytest.raises(SaslFailure):
            PlainServer({"alice": "pw"}).step(token)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_with_scramps_client(mechanism: str) -> None:
    cred = from_password(mechanism, "s3cret", 4096)
    assert parse_credential(format_credential(cred)) == cred
    store = {("alice", mechanism): cred}

    def exchange(user: str, password: str) -> Principal | None:
        server = ScramServer(mechanism, lambda m, u: store.get((u, m)))
        client = ScramClient([mechanism], user, password)
        client.set_server_first(server.step(client.get_client_first().encode()).decode())
        client.set_server_final(server.step(client.get_client_final().encode()).decode())
        return server.principal

    assert exchange("alice", "s3cret") == Principal("User", "alice")
    with pytest.raises(SaslFailure):
        exchange("alice", "wrong")
    with pytest.raises(SaslFailure):
        exchange("nobody", "s3cret")


def test_oauthbearer(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk["kid"] = "k"
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    keys = JwksKeys(f"file://{tmp_path / 'jwks.json'}")
    settings = OAuthSettings("x", ("kafka",), "iss", "sub", 0)

    def token(**claims: object) -> bytes:
        now = int(time.time())
        body = {"sub": "svc", "aud": "kafka", "iss": "iss", "exp": now + 60, **claims}
        t = jwt.encode(body, key, algorithm="RS256", headers={"kid": "k"})
        return f"n,,\x01auth=Bearer {t}\x01\x01".encode()

    s = OAuthBearerServer(settings, keys)
    s.step(token())
    assert s.complete and s.principal == Principal("User", "svc") and s.expires_ms
    for bad in (token(exp=int(time.time()) - 5), token(aud="other"), token(iss="x"),
                token(sub=""), b"n,,\x01auth=Basic abc\x01\x01"):
        with pytest.raises(SaslFailure):
            OAuthBearerServer(settings, keys).step(bad)
    # alg "none" is never accepted
    unsigned = jwt.encode({"sub": "svc", "aud": "kafka", "iss": "iss",
                           "exp": int(time.time()) + 60}, None, algorithm="none")
    with pytest.raises(SaslFailure):
        OAuthBearerServer(settings, keys).step(f"n,,\x01auth=Bearer {unsigned}\x01\x01".encode())


def test_scram_accepts_librdkafkas_repeated_nonce_as_kafka_3_9_does() -> None:
    """librdkafka before 2.6.1 (Debian's kcat) sends r=<client nonce><server nonce>, its own
    nonce twice; Kafka 3.8.1-3.9 accept a nonce ending with the server's, and the proof is
    still checked over the message as sent. A nonce that does not end with it fails."""
    import base64
    import hashlib
    import hmac

    from headrace.security.scram import salted_password

    mech, algo = "SCRAM-SHA-512", "sha512"
    cred = from_password(mech, "pw", 4096)

    def run(make_nonce: object) -> Principal | None:
        server = ScramServer(mech, lambda m, u: cred if u == "kc" else None)
        cnonce = "abc123"
        first_bare = f"n=kc,r={cnonce}"
        sfirst = server.step(f"n,,{first_bare}".encode()).decode()
        full = dict(kv.split("=", 1) for kv in sfirst.split(","))["r"]
        nonce = make_nonce(cnonce, full)  # type: ignore[operator]
        without_proof = f"c=biws,r={nonce}"
        auth = f"{first_bare},{sfirst},{without_proof}".encode()
        salted = salted_password(mech, "pw", cred.salt, 4096)
        ckey = hmac.digest(salted, b"Client Key", algo)
        sig = hmac.digest(hashlib.new(algo, ckey).digest(), auth, algo)
        proof = base64.b64encode(bytes(a ^ b for a, b in zip(ckey, sig, strict=True)))
        server.step(f"{without_proof},p={proof.decode()}".encode())
        return server.principal

    assert run(lambda c, full: full) == Principal("User", "kc")
    assert run(lambda c, full: c + full) == Principal("User", "kc")
    with pytest.raises(SaslFailure, match="nonce"):
        run(lambda c, full: full + "x")


def test_made_up_key_ids_do_not_make_the_broker_fetch_the_jwks_each_time(
    tmp_path: Path,
) -> None:
    """An unauthenticated client sending tokens with unknown key ids: the JWKS URL is
    fetched at most once per min_refetch_s, not per attempt; a known kid needs no fetch."""
    import http.server
    import threading

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk["kid"] = "k"
    body = json.dumps({"keys": [jwk]}).encode()
    fetches = []

    class Jwks(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fetches.append(1)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    clock = [0.0]
    try:
        keys = JwksKeys(f"http://127.0.0.1:{server.server_address[1]}/jwks",
                        min_refetch_s=10, now=lambda: clock[0])
        now = int(time.time())
        good = jwt.encode({"sub": "s", "exp": now + 60}, key, algorithm="RS256",
                          headers={"kid": "k"})
        assert keys.key_for(good) is not None and len(fetches) == 1
        for i in range(20):
            bad = jwt.encode({"sub": "s", "exp": now + 60}, key, algorithm="RS256",
                             headers={"kid": f"made-up-{i}"})
            with pytest.raises(SaslFailure):
                keys.key_for(bad)
        assert len(fetches) == 1
        clock[0] = 11.0
        with pytest.raises(SaslFailure):
            keys.key_for(bad)
        assert len(fetches) == 2  # a key rotation is picked up after the floor
        assert keys.key_for(good) is not None and len(fetches) == 2
    finally:
        server.shutdown()
