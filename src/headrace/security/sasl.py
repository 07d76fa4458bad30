"""SASL server mechanisms (issue 12, item 2): PLAIN (RFC 4616), SCRAM-SHA-256/512 (RFC 5802,
RFC 7677) and OAUTHBEARER (RFC 7628, JWTs checked with ``PyJWT`` against a
JWKS). Sans-IO: ``step`` takes the client's token and returns the server's; the broker's
connection carries the tokens in SaslAuthenticate requests.

Each ``Authenticator`` raises ``SaslFailure`` (the connection answers
SASL_AUTHENTICATION_FAILED with its message and closes) or, once ``complete``, has the
authenticated ``principal`` and, for OAUTHBEARER, ``expires_ms`` (the token's ``exp``).
Messages say what failed without saying whether the user exists.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from headrace.security.principal import Principal, user
from headrace.security.scram import MECHANISMS, ScramCredential

log = logging.getLogger("headrace.security")


class SaslFailure(Exception):
    """Authentication failed; the message goes to the client."""


class Authenticator(Protocol):
    mechanism: str
    complete: bool
    principal: Principal | None
    expires_ms: int | None

    def step(self, token: bytes) -> bytes: ...


BAD_CREDENTIALS = "Authentication failed: Invalid username or password"


class PlainServer:
    """RFC 4616: one message ``[authzid] NUL authcid NUL passwd``; users and passwords from
    the listener's JAAS ``user_<name>="<password>"`` options (Kafka's
    PlainServerCallbackHandler)."""

    mechanism = "PLAIN"

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = users
        self.complete = False
        self.principal: Principal | None = None
        self.expires_ms: int | None = None

    def step(self, token: bytes) -> bytes:
        if self.complete:
            raise SaslFailure("PLAIN takes one message")
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslFailure("Invalid SASL/PLAIN response: expected 3 tokens")
        authzid, authcid, password = (p.decode("utf-8", "replace") for p in parts)
        if not authcid:
            raise SaslFailure("Authentication failed: username not specified")
        if authzid and authzid != authcid:
            raise SaslFailure("Authentication failed: Client requested an authorization id "
                              "that is different from username")
        expected = self.users.get(authcid)
        # compare in constant time whether or not the user exists
        ok = hmac.compare_digest((expected or "\0" + password).encode(), password.encode())
        if expected is None or not ok:
            raise SaslFailure(BAD_CREDENTIALS)
        self.complete = True
        self.principal = user(authcid)
        return b""


def _unescape_saslname(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


def _attributes(message: str) -> list[tuple[str, str]]:
    out = []
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise SaslFailure(f"malformed SCRAM message: {message!r}")
        out.append((key, value))
    return out


class ScramServer:
    """RFC 5802's server in two round trips; credentials (salt, StoredKey, ServerKey,
    iterations) from ``lookup(mechanism, user)``, never passwords. Written out rather than
    taken from ``scramp`` for one reason: Kafka 3.8.1-3.9 accept a client-final nonce that
    ENDS with the server's nonce (``ScramSaslServer``'s ``endsWith``), because librdkafka
    before 2.6.1 (Debian's kcat) repeats its own nonce in front of it, and such clients
    must work here as they do against Kafka 3.9. The proof is still checked over the
    messages as sent, so only a client that knows the password gets in. An unknown user
    gets a made-up salt and fails at the proof, like a wrong password (RFC 5802, section
    9: nothing tells whether the user exists)."""

    def __init__(self, mechanism: str,
                 lookup: Callable[[str, str], ScramCredential | None]) -> None:
        if mechanism not in MECHANISMS:
            raise ValueError(mechanism)
        self.mechanism = mechanism
        self.algo = MECHANISMS[mechanism]
        self.lookup = lookup
        self.complete = False
        self.principal: Principal | None = None
        self.expires_ms: int | None = None
        self._round = 0
        self._user = ""
        self._cred: ScramCredential | None = None
        self._gs2 = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def _failure(self) -> SaslFailure:
        return SaslFailure(f"Authentication failed during authentication due to invalid "
                           f"credentials with SASL mechanism {self.mechanism}")

    def step(self, token: bytes) -> bytes:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailure("SCRAM messages must be UTF-8") from None
        if self._round == 0:
            self._round = 1
            return self._first(text).encode()
        if self._round == 1:
            self._round = 2
            return self._final(text).encode()
        raise SaslFailure("SCRAM exchange already complete")

    def _first(self, text: str) -> str:
        flag, sep1, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not (sep1 and sep2) or flag not in ("n", "y"):
            raise SaslFailure("SCRAM: channel binding is not supported" if flag.startswith("p=")
                              else f"malformed SCRAM client-first message: {text!r}")
        attrs = _attributes(bare)
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise SaslFailure(f"malformed SCRAM client-first message: {text!r}")
        self._user = _unescape_saslname(attrs[0][1])
        if authzid and authzid[2:] != self._user:
            raise SaslFailure("Authentication failed: Client requested an authorization id "
                              "that is different from username")
        self._gs2 = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._cred = self.lookup(self.mechanism, self._user)
        salt = self._cred.salt if self._cred else hashlib.sha256(
            b"headrace-unknown-user:" + self._user.encode()).digest()
        iterations = self._cred.iterations if self._cred else 4096
        self._nonce = attrs[1][1] + base64.b64encode(os.urandom(24)).decode()
        self._server_first = (f"r={self._nonce},s={base64.b64encode(salt).decode()},"
                              f"i={iterations}")
        return self._server_first

    def _final(self, text: str) -> str:
        without_proof, sep, proof_attr = text.rpartition(",")
        if not sep or not proof_attr.startswith("p="):
            raise SaslFailure("malformed SCRAM client-final message")
        attrs = dict(_attributes(without_proof))
        if attrs.get("c") != base64.b64encode(self._gs2.encode()).decode():
            raise SaslFailure("SCRAM: the channel binding does not match")
        if not attrs.get("r", "").endswith(self._nonce):  # Kafka 3.9's rule, see above
            raise SaslFailure("Invalid client nonce in the final client message.")
        cred = self._cred
        try:
            proof = base64.b64decode(proof_attr[2:], validate=True)
        except ValueError:
            raise SaslFailure("malformed SCRAM client proof") from None
        auth_message = ",".join((self._client_first_bare, self._server_first,
                                 without_proof)).encode()
        if cred is None:
            raise self._failure()
        signature = hmac.digest(cred.stored_key, auth_message, self.algo)
        if len(proof) != len(signature):
            raise self._failure()
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self.algo, client_key).digest(),
                                   cred.stored_key):
            raise self._failure()
        self.complete = True
        self.principal = user(self._user)
        server_signature = hmac.digest(cred.server_key, auth_message, self.algo)
        return f"v={base64.b64encode(server_signature).decode()}"


@dataclass(frozen=True)
class OAuthSettings:
    jwks_url: str
    expected_audience: tuple[str, ...] = ()
    expected_issuer: str = ""
    sub_claim: str = "sub"
    clock_skew_s: int = 30


class JwksKeys:
    """The keys that sign tokens: a JWKS document from a ``file:`` path (read once) or an
    http(s) URL (fetched with PyJWT's ``PyJWKClient`` off the event loop, since ``step``
    runs in a worker thread). A URL's keys are fetched again after ``refresh_s``, or when a
    token names a key id not in them, but never more than once per ``min_refetch_s``: an
    unauthenticated client sending made-up key ids cannot make the broker fetch per
    connection (Kafka's ``RefreshingHttpsJwks`` has the same floor)."""

    def __init__(self, url: str, refresh_s: float = 3600.0, min_refetch_s: float = 10.0,
                 now: Callable[[], float] = time.monotonic) -> None:
        import jwt

        self.url = url
        self.refresh_s = refresh_s
        self.min_refetch_s = min_refetch_s
        self.now = now
        self._client: Any = None
        self._set: Any = None
        self._fetched = -float("inf")
        self._lock = threading.Lock()
        if url.startswith("file:"):
            path = url[len("file:"):]
            while path.startswith("//"):
                path = path[1:]
            with open(path) as f:
                self._set = jwt.PyJWKSet.from_dict(json.load(f))
        else:
            self._client = jwt.PyJWKClient(url, cache_jwk_set=False, cache_keys=False,
                                           timeout=10)

    def _keys(self, kid: str | None) -> list[Any]:
        return [k for k in (self._set.keys if self._set is not None else [])
                if kid is None or k.key_id == kid]

    def key_for(self, token: str) -> Any:
        import jwt

        kid = jwt.get_unverified_header(token).get("kid")
        if self._client is not None:
            with self._lock:
                age = self.now() - self._fetched
                if age >= self.refresh_s or (not self._keys(kid)
                                             and age >= self.min_refetch_s):
                    self._fetched = self.now()
                    try:
                        self._set = jwt.PyJWKSet.from_dict(self._client.fetch_data())
                    except Exception as e:  # the identity provider is down: keep the old
                        log.warning("cannot fetch the JWKS at %s: %s", self.url, e)
        keys = self._keys(kid)
        if not keys:
            raise SaslFailure(f"no key in the JWKS matches the token's kid {kid!r}")
        return keys[0].key


class OAuthBearerServer:
    """RFC 7628: one client message ``gs2-header \\x01 auth=Bearer <jwt> \\x01 ... \\x01``;
    the JWT must be signed by a JWKS key (RS/ES/PS algorithms only: no ``none``, no HMAC
    with a public key), unexpired, and carry the expected audience and issuer when those
    are configured; the principal is its ``sub_claim`` (Kafka's
    OAuthBearerValidatorCallbackHandler).

    ``keys`` None is Kafka's default when no JWKS is configured, its development-only
    OAuthBearerUnsecuredValidatorCallbackHandler: an UNSIGNED token (``alg: none``, as
    librdkafka's ``sasl.oauthbearer.config`` builds them) with an unexpired ``exp`` and
    the principal claim is accepted as it says. The broker warns at start-up."""

    mechanism = "OAUTHBEARER"
    ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384",
                  "PS512")

    def __init__(self, settings: OAuthSettings, keys: JwksKeys | None,
                 now: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.keys = keys
        self.now = now
        self.complete = False
        self.principal: Principal | None = None
        self.expires_ms: int | None = None

    def step(self, token: bytes) -> bytes:
        import jwt

        if self.complete:
            raise SaslFailure("OAUTHBEARER takes one message")
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailure("OAUTHBEARER message must be UTF-8") from None
        header, sep, rest = text.partition("\x01")
        if not sep or not header.startswith(("n,", "y,")):
            raise SaslFailure("Invalid OAUTHBEARER client first message")
        fields = dict(kv.split("=", 1) for kv in rest.split("\x01") if "=" in kv)
        auth = fields.get("auth", "")
        scheme, _, jwt_text = auth.partition(" ")
        if scheme.lower() != "bearer" or not jwt_text:
            raise SaslFailure("Invalid OAUTHBEARER client first message: no bearer token")
        s = self.settings
        try:
            if self.keys is None:
                claims = self._unsecured(jwt_text)
            else:
                claims = jwt.decode(
                    jwt_text, self.keys.key_for(jwt_text), algorithms=list(self.ALGORITHMS),
                    audience=list(s.expected_audience) or None,
                    issuer=s.expected_issuer or None, leeway=s.clock_skew_s,
                    options={"require": ["exp"], "verify_aud": bool(s.expected_audience)})
        except SaslFailure:
            raise
        except Exception as e:  # PyJWT's errors, a JWKS fetch failure
            raise SaslFailure(f"invalid token: {e}") from None
        subject = claims.get(s.sub_claim)
        if not isinstance(subject, str) or not subject:
            raise SaslFailure(f"invalid token: no {s.sub_claim!r} claim")
        authzid = header.split(",")[1]
        if authzid.startswith("a=") and authzid[2:] and authzid[2:] != subject:
            raise SaslFailure("Authentication failed: the authorization id is not the "
                              "token's subject")
        self.complete = True
        self.principal = user(subject)
        self.expires_ms = int(claims["exp"]) * 1000
        return b""

    def _unsecured(self, jwt_text: str) -> dict[str, Any]:
        import jwt

        if jwt.get_unverified_header(jwt_text).get("alg") != "none":
            raise SaslFailure("invalid token: this listener takes unsecured tokens "
                              "(alg none) only, as it has no JWKS to verify signatures")
        claims: dict[str, Any] = jwt.decode(jwt_text, options={"verify_signature": False})
        exp = claims.get("exp")
        if not isinstance(exp, int | float):
            raise SaslFailure("invalid token: no exp claim")
        if exp + self.settings.clock_skew_s < self.now():
            raise SaslFailure("invalid token: expired")
        return claims
