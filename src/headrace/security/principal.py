"""Kafka principals (``KafkaPrincipal``): "<type>:<name>", "User:alice". PURE.

An unauthenticated PLAINTEXT or SSL-without-client-certificate connection is
``User:ANONYMOUS``, as in Kafka; SASL gives ``User:<authorization id>``; mutual TLS gives
``User:<distinguished name>`` after ``ssl.principal.mapping.rules``.
"""

from __future__ import annotations

from dataclasses import dataclass

USER_TYPE = "User"


@dataclass(frozen=True, slots=True)
class Principal:
    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Principal:
        """"User:alice" (the name may itself contain ':'); ValueError without a type."""
        kind, sep, name = text.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"not a principal (TYPE:NAME): {text!r}")
        return cls(kind, name)


ANONYMOUS = Principal(USER_TYPE, "ANONYMOUS")


def user(name: str) -> Principal:
    return Principal(USER_TYPE, name)
