"""Certificates for development and tests (issue 12): a private CA, a broker certificate
and client certificates, as PEM files, made with the ``cryptography`` package.

    headrace dev-certs DIR [--host NAME ...] [--client CN ...]

writes into DIR:

- ``ca.pem`` / ``ca-key.pem``: the CA (trust it: ``ssl.truststore.location`` of the broker
  for mutual TLS, ``ssl.ca.location`` of librdkafka clients, ``cafile`` of Python's ssl);
- ``broker.pem``: the broker's private key and certificate chain in one file
  (``ssl.keystore.location`` with ``ssl.keystore.type=PEM``), valid for ``localhost``,
  ``127.0.0.1`` and each ``--host``; also ``broker-cert.pem`` / ``broker-key.pem``;
- per ``--client CN``: ``client-CN-cert.pem`` and ``client-CN-key.pem`` (subject
  ``CN=CN,OU=clients,O=headrace``; mutual TLS makes ``User:CN=CN,OU=clients,O=headrace`` the
  principal, or what ``ssl.principal.mapping.rules`` makes of it).

Not for production: keys are unencrypted and the CA lives next to them.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str, ou: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "headrace")]
    if ou:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    parts.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(parts)


def make_ca(cn: str = "headrace dev CA",
            days: int = 825) -> tuple[Issued, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    name = _name(cn)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)), key


def issue(ca: Issued, ca_key: ec.EllipticCurvePrivateKey, cn: str, *, ou: str | None = None,
          hosts: tuple[str, ...] = (), client: bool = False, days: int = 825) -> Issued:
    """A certificate signed by ``ca``: a server one for ``hosts`` (DNS names or IPs), or a
    client one."""
    key = _key()
    now = dt.datetime.now(dt.UTC)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    b = (x509.CertificateBuilder().subject_name(_name(cn, ou)).issuer_name(ca_cert.subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5))
         .not_valid_after(now + dt.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage(
             [ExtendedKeyUsageOID.CLIENT_AUTH] if client
             else [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
             critical=False))
    if hosts:
        names: list[x509.GeneralName] = []
        for h in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                names.append(x509.DNSName(h))
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = b.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def write_dev_certs(directory: Path, hosts: tuple[str, ...] = (),
                    clients: tuple[str, ...] = ()) -> dict[str, Path]:
    """Write the files described in the module docstring; returns name -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = make_ca()
    broker = issue(ca, ca_key, "localhost", ou="brokers",
                   hosts=("localhost", "127.0.0.1", *hosts))
    out: dict[str, Path] = {}

    def put(name: str, data: bytes, private: bool = False) -> None:
        path = directory / name
        path.write_bytes(data)
        if private:
            path.chmod(0o600)
        out[name] = path

    put("ca.pem", ca.cert_pem)
    put("ca-key.pem", ca.key_pem, private=True)
    put("broker.pem", broker.key_pem + broker.cert_pem + ca.cert_pem, private=True)
    put("broker-cert.pem", broker.cert_pem + ca.cert_pem)
    put("broker-key.pem", broker.key_pem, private=True)
    for cn in clients:
        c = issue(ca, ca_key, cn, ou="clients", client=True)
        put(f"client-{cn}-cert.pem", c.cert_pem)
        put(f"client-{cn}-key.pem", c.key_pem, private=True)
    return out
