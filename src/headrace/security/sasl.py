"""SASL server mechanisms (issue 12, item 2): PLAIN (RFC 4616), SCRAM-SHA-256/512 (RFC 5802,
RFC 7677, on ``scramp``) and OAUTHBEARER (RFC 7628, JWTs checked with ``PyJWT`` against a
JWKS). Sans-IO: ``step`` takes the client's token and returns the server's; the broker's
connection carries the tokens in SaslAuthenticate requests.

Each ``Authenticator`` raises ``SaslFailure`` (the connection answers
SASL_AUTHENTICATION_FAILED with its message and closes) or, once ``complete``, has the
authenticated ``principal`` and, for OAUTHBEARER, ``expires_ms`` (the token's ``exp``).
Messages say what failed without saying whether the user exists.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from headrace.security.principal import Principal, user
from headrace.security.scram import MECHANISMS, ScramCredential


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


class ScramServer:
    """RFC 5802 in two round trips on ``scramp``'s server; credentials from
    ``lookup(user)`` (the metadata store's, never passwords). An unknown user fails the
    same way as a wrong password (Kafka's message)."""

    def __init__(self, mechanism: str,
                 lookup: Callable[[str, str], ScramCredential | None]) -> None:
        from scramp import ScramMechanism

        if mechanism not in MECHANISMS:
            raise ValueError(mechanism)
        self.mechanism = mechanism
        self.lookup = lookup
        self.complete = False
        self.principal: Principal | None = None
        self.expires_ms: int | None = None
        self._user = ""
        self._unknown = False
        self._server = ScramMechanism(mechanism).make_server(self._auth_info)
        self._round = 0

    def _auth_info(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        name = _unescape_saslname(username)
        self._user = name
        cred = self.lookup(self.mechanism, name)
        if cred is None:
            # go on with a made-up credential so that the client learns nothing before
            # its proof fails (RFC 5802 section 9: do not reveal whether users exist)
            self._unknown = True
            return b"\0" * 16, b"\0" * 32, b"\0" * 32, 4096
        return cred.salt, cred.stored_key, cred.server_key, cred.iterations

    def step(self, token: bytes) -> bytes:
        from scramp import ScramException

        failure = (f"Authentication failed during authentication due to invalid credentials "
                   f"with SASL mechanism {self.mechanism}")
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailure("SCRAM messages must be UTF-8") from None
        try:
            if self._round == 0:
                self._round = 1
                self._server.set_client_first(text)
                return str(self._server.get_server_first()).encode()
            if self._round == 1:
                self._round = 2
                self._server.set_client_final(text)
                if self._unknown:
                    raise SaslFailure(failure)
                final = str(self._server.get_server_final()).encode()
                self.complete = True
                self.principal = user(self._user)
                return final
        except ScramException as e:
            raise SaslFailure(failure if "proof" in str(e).lower() or "verif" in
                              str(e).lower() else f"SCRAM: {e}") from None
        raise SaslFailure("SCRAM exchange already complete")


@dataclass(frozen=True)
class OAuthSettings:
    jwks_url: str
    expected_audience: tuple[str, ...] = ()
    expected_issuer: str = ""
    sub_claim: str = "sub"
    clock_skew_s: int = 30


class JwksKeys:
    """The keys that sign tokens: a JWKS document from a ``file:`` path (read once) or an
    http(s) URL (PyJWT's ``PyJWKClient``, cached; fetched off the event loop since
    ``step`` runs in a worker thread)."""

    def __init__(self, url: str) -> None:
        import jwt

        self.url = url
        self._client: Any = None
        self._set: Any = None
        if url.startswith("file:"):
            path = url[len("file:"):]
            while path.startswith("//"):
                path = path[1:]
            with open(path) as f:
                self._set = jwt.PyJWKSet.from_dict(json.load(f))
        else:
            self._client = jwt.PyJWKClient(url, cache_keys=True, lifespan=3600, timeout=10)

    def key_for(self, token: str) -> Any:
        import jwt

        if self._client is not None:
            return self._client.get_signing_key_from_jwt(token).key
        kid = jwt.get_unverified_header(token).get("kid")
        keys = [k for k in self._set.keys if kid is None or k.key_id == kid]
        if not keys:
            raise SaslFailure(f"no key in the JWKS matches the token's kid {kid!r}")
        return keys[0].key


class OAuthBearerServer:
    """RFC 7628: one client message ``gs2-header \\x01 auth=Bearer <jwt> \\x01 ... \\x01``;
    the JWT must be signed by a JWKS key (RS/ES/PS algorithms only: no ``none``, no HMAC
    with a public key), unexpired, and carry the expected audience and issuer when those
    are configured; the principal is its ``sub_claim`` (Kafka's
    OAuthBearerValidatorCallbackHandler)."""

    mechanism = "OAUTHBEARER"
    ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384",
                  "PS512")

    def __init__(self, settings: OAuthSettings, keys: JwksKeys,
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
            claims = jwt.decode(
                jwt_text, self.keys.key_for(jwt_text), algorithms=list(self.ALGORITHMS),
                audience=list(s.expected_audience) or None, issuer=s.expected_issuer or None,
                leeway=s.clock_skew_s,
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
