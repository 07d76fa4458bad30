"""SCRAM credentials (RFC 5802, RFC 7677; Kafka's ``ScramCredential``). PURE.

A credential is what the server keeps instead of a password: salt, StoredKey = H(HMAC(
SaltedPassword, "Client Key")), ServerKey = HMAC(SaltedPassword, "Server Key") and the
iteration count. Kafka stores it per user and mechanism (ZooKeeper ``/config/users/<user>``,
``"SCRAM-SHA-512": "salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=4096"``);
``format_credential`` / ``parse_credential`` are that text. AlterUserScramCredentials sends
the salt and the salted password (the client derived it), from which ``from_salted_password``
derives the keys; ``from_password`` is for the CLI and tests. The exchange itself runs on
``scramp`` (``headrace.security.sasl``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
"""Kafka's SCRAM mechanisms -> hashlib names."""
MECHANISM_TYPES = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
"""ScramMechanism codes of AlterUserScramCredentials / DescribeUserScramCredentials."""
MIN_ITERATIONS = 4096  # Kafka's ScramMechanism.minIterations
MAX_ITERATIONS = 16384  # Kafka's maxIterations (AlterUserScramCredentials refuses more)


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def from_salted_password(mechanism: str, salt: bytes, salted_password: bytes,
                         iterations: int) -> ScramCredential:
    algo = MECHANISMS[mechanism]
    client_key = hmac.digest(salted_password, b"Client Key", algo)
    return ScramCredential(salt, hashlib.new(algo, client_key).digest(),
                           hmac.digest(salted_password, b"Server Key", algo), iterations)


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(Normalize(password), salt, i) (RFC 5802; SASLprep is the identity for the ASCII
    passwords Kafka's tools accept)."""
    return hashlib.pbkdf2_hmac(MECHANISMS[mechanism], password.encode(), salt, iterations)


def from_password(mechanism: str, password: str, iterations: int = MIN_ITERATIONS,
                  salt: bytes | None = None) -> ScramCredential:
    salt = salt if salt is not None else os.urandom(32)
    return from_salted_password(mechanism, salt,
                                salted_password(mechanism, password, salt, iterations),
                                iterations)


def format_credential(c: ScramCredential) -> str:
    b64 = base64.b64encode
    return (f"salt={b64(c.salt).decode()},stored_key={b64(c.stored_key).decode()},"
            f"server_key={b64(c.server_key).decode()},iterations={c.iterations}")


def parse_credential(text: str) -> ScramCredential:
    """ValueError if a field is missing or malformed."""
    fields = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
    try:
        return ScramCredential(base64.b64decode(fields["salt"], validate=True),
                               base64.b64decode(fields["stored_key"], validate=True),
                               base64.b64decode(fields["server_key"], validate=True),
                               int(fields["iterations"]))
    except (KeyError, ValueError) as e:
        raise ValueError(f"not a SCRAM credential: {e}") from e
