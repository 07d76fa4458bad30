"""TLS helpers (issue 12): the distinguished name of a peer certificate as Kafka's
``X500Principal.getName()`` gives it (RFC 2253: most specific first, "CN=alice,O=corp,C=US"),
read with the ``cryptography`` package."""

from __future__ import annotations

from cryptography import x509


def certificate_dn(der: bytes) -> str:
    """The subject of a DER certificate, RFC 4514 (RFC 2253's successor) ordering and
    escaping; ValueError for something that is not a certificate."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as e:
        raise ValueError(f"cannot read the client certificate: {e}") from None
    return cert.subject.rfc4514_string()
