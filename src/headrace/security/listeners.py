"""Listeners as Kafka configures them (issue 12, item 1): names, security protocols, TLS
and SASL settings, from a broker's configuration.

``listeners=PLAINTEXT://:9092,SASL_SSL://:9093`` with ``listener.security.protocol.map``
(Kafka's default maps each protocol name to itself), ``advertised.listeners``, and
``inter.broker.listener.name`` or ``security.inter.broker.protocol`` for the listener other
brokers use. Per-listener settings are Kafka's ``listener.name.<name lower>.<key>``, over
the global ``<key>``:

- TLS (SSL, SASL_SSL): ``ssl.keystore.type=PEM``, ``ssl.keystore.location`` (the private
  key and certificate chain in one PEM file) and ``ssl.key.password`` (an encrypted key), or
  ``ssl.keystore.key`` / ``ssl.keystore.certificate.chain`` inline;
  ``ssl.truststore.location`` (PEM CA certificates) or ``ssl.truststore.certificates``;
  ``ssl.client.auth=none|requested|required``; ``ssl.principal.mapping.rules`` (Kafka's
  ``RULE:pattern/replacement/[LU]`` list ending in ``DEFAULT``); ``ssl.enabled.protocols``.
- SASL (SASL_PLAINTEXT, SASL_SSL): ``sasl.enabled.mechanisms`` (PLAIN, SCRAM-SHA-256,
  SCRAM-SHA-512, OAUTHBEARER); PLAIN's users from
  ``listener.name.<l>.plain.sasl.jaas.config`` (``user_<name>="<password>"`` options of
  Kafka's PlainLoginModule); SCRAM's from the metadata store; OAUTHBEARER's tokens checked
  against ``sasl.oauthbearer.jwks.endpoint.url`` (a ``file:`` path or an http(s) URL),
  ``sasl.oauthbearer.expected.audience`` / ``.expected.issuer``, the principal from
  ``sasl.oauthbearer.sub.claim.name`` (default ``sub``); without a JWKS URL, Kafka's
  unsecured development mode (unsigned tokens taken as they are); ``connections.max.reauth.ms``
  (KIP-368). The inter-broker client authenticates with
  ``sasl.mechanism.inter.broker.protocol`` and the ``username`` / ``password`` options of
  that mechanism's JAAS entry on the inter-broker listener.

``parse_listeners`` is pure apart from reading the PEM files a TLS context loads.
"""

from __future__ import annotations

import re
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace.config import (
    DEFAULT_PROTOCOL_MAP,
    ConfigError,
)
from headrace.config import _listeners as split_listeners
from headrace.config import _protocol_map as protocol_map
from headrace.security.sasl import OAuthSettings

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SECURITY_PREFIXES = ("ssl.", "sasl.", "listener.name.")
"""Keys that ``parse_listeners`` reads (kept out of the ordinary config validation)."""


@dataclass(frozen=True)
class SaslSettings:
    mechanisms: tuple[str, ...]
    plain_users: Mapping[str, str] = field(default_factory=dict)
    oauth: OAuthSettings | None = None


@dataclass(frozen=True)
class Listener:
    name: str
    protocol: str
    host: str  # bind address ("" or 0.0.0.0: every interface)
    port: int  # 0: any free port
    advertised_host: str = ""  # "" : the bind host
    advertised_port: int = 0  # 0: the bound port
    ssl_context: ssl.SSLContext | None = None
    client_auth: str = "none"
    principal_rules: tuple[PrincipalRule, ...] = ()
    sasl: SaslSettings | None = None
    max_reauth_ms: int = 0

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True)
class InterBrokerClient:
    """How this broker connects to the others (replica fetchers, markers, controller)."""

    listener: str
    protocol: str
    ssl_context: ssl.SSLContext | None = None
    mechanism: str = ""
    username: str = ""
    password: str = ""


# ----------------------------------------------------------------------------- parsing


def _get(raw: Mapping[str, Any], listener: str, key: str, default: str = "") -> str:
    prefixed = f"listener.name.{listener.lower()}.{key}"
    if prefixed in raw:
        return str(raw[prefixed]).strip()
    return str(raw.get(key, default)).strip()


_JAAS_OPTION = re.compile(r'([A-Za-z0-9_.\-]+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def jaas_options(text: str) -> dict[str, str]:
    """The ``key="value"`` options of a JAAS entry (``Module required k="v" ...;``)."""
    return {m.group(1): m.group(2).replace('\\"', '"').replace("\\\\", "\\")
            for m in _JAAS_OPTION.finditer(text)}


def jaas(raw: Mapping[str, Any], listener: str, mechanism: str) -> dict[str, str]:
    """Kafka's ``listener.name.<l>.<mechanism lower>.sasl.jaas.config`` (or the global
    ``sasl.jaas.config``) as options."""
    key = f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"
    text = raw.get(key) or raw.get(f"listener.name.{listener.lower()}.sasl.jaas.config") \
        or raw.get("sasl.jaas.config") or ""
    return jaas_options(str(text))


# ------------------------------------------------------------------- principal mapping


@dataclass(frozen=True)
class PrincipalRule:
    """One of Kafka's ``ssl.principal.mapping.rules``: ``RULE:pattern/replacement/[LU]`` or
    ``DEFAULT`` (the distinguished name as it is)."""

    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "L", "U" or ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        m = self.pattern.fullmatch(dn)
        if m is None:
            return None
        # Java's $1 references -> Python's; a literal $ stays
        out = m.expand(re.sub(r"\$(\d)", r"\\g<\1>", self.replacement.replace("\\", "\\\\")))
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


_RULE = re.compile(r"RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?)|(DEFAULT)")


def parse_principal_rules(text: str) -> tuple[PrincipalRule, ...]:
    """Kafka's SslPrincipalMapper syntax; an empty text is ``DEFAULT``."""
    if not text.strip():
        return (PrincipalRule(None),)
    rules: list[PrincipalRule] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _RULE.match(text, pos)
        if m is None:
            raise ConfigError("ssl.principal.mapping.rules",
                              f"cannot parse the rules at {text[pos:]!r}")
        if m.group(4):
            rules.append(PrincipalRule(None))
        else:
            try:
                pattern = re.compile(m.group(1).replace("\\/", "/"))
            except re.error as e:
                raise ConfigError("ssl.principal.mapping.rules", f"bad pattern: {e}") from e
            rules.append(PrincipalRule(pattern, m.group(2).replace("\\/", "/"), m.group(3)))
        pos = m.end()
        while pos < len(text) and text[pos] in ", \n\t":
            pos += 1
    return tuple(rules)


def map_principal(rules: tuple[PrincipalRule, ...], dn: str) -> str:
    """The principal name for a certificate's distinguished name: the first rule that
    matches; Kafka fails the connection when none does (here: the DN itself)."""
    for rule in rules:
        out = rule.apply(dn)
        if out is not None:
            return out
    raise ValueError(f"no ssl.principal.mapping.rules entry matches {dn!r}")


# --------------------------------------------------------------------------- TLS


def _pem_file(data: str, what: str) -> str:
    """Inline PEM (``ssl.keystore.key`` and friends) as a private temporary file: Python's
    ssl module loads keys and certificates from files."""
    with tempfile.NamedTemporaryFile("w", prefix=f"headrace-{what}-", suffix=".pem",
                                     delete=False) as f:
        f.write(data.replace("\\n", "\n"))
    Path(f.name).chmod(0o600)
    return f.name


def _tls_versions(ctx: ssl.SSLContext, raw: Mapping[str, Any], listener: str) -> None:
    enabled = [p.strip() for p in _get(raw, listener, "ssl.enabled.protocols",
                                       "TLSv1.2,TLSv1.3").split(",") if p.strip()]
    versions = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
    chosen = [versions[p] for p in enabled if p in versions]
    if not chosen:
        raise ConfigError("ssl.enabled.protocols", f"none of {enabled} is TLSv1.2 or TLSv1.3")
    ctx.minimum_version = min(chosen)
    ctx.maximum_version = max(chosen)


def _load_trust(ctx: ssl.SSLContext, raw: Mapping[str, Any], listener: str) -> bool:
    location = _get(raw, listener, "ssl.truststore.location")
    inline = _get(raw, listener, "ssl.truststore.certificates")
    try:
        if location:
            ctx.load_verify_locations(cafile=location)
        elif inline:
            ctx.load_verify_locations(cadata=inline.replace("\\n", "\n"))
        else:
            return False
    except (OSError, ssl.SSLError) as e:
        raise ConfigError("ssl.truststore.location", f"cannot load CA certificates: {e}") from e
    return True


def server_context(raw: Mapping[str, Any], listener: str) -> tuple[ssl.SSLContext, str]:
    """The TLS context of a listener and its ``ssl.client.auth``."""
    kind = _get(raw, listener, "ssl.keystore.type", "PEM").upper()
    if kind != "PEM":
        raise ConfigError("ssl.keystore.type", f"{kind} keystores are not supported; use PEM")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _tls_versions(ctx, raw, listener)
    location = _get(raw, listener, "ssl.keystore.location")
    key_inline = _get(raw, listener, "ssl.keystore.key")
    chain_inline = _get(raw, listener, "ssl.keystore.certificate.chain")
    password = _get(raw, listener, "ssl.key.password") or None
    try:
        if location:
            ctx.load_cert_chain(location, password=password)
        elif key_inline and chain_inline:
            ctx.load_cert_chain(_pem_file(chain_inline, "chain"),
                                _pem_file(key_inline, "key"), password=password)
        else:
            raise ConfigError(f"listener.name.{listener.lower()}.ssl.keystore.location",
                              f"listener {listener} uses TLS: give ssl.keystore.location "
                              "(a PEM file with the key and certificate chain)")
    except (OSError, ssl.SSLError) as e:
        raise ConfigError("ssl.keystore.location",
                          f"cannot load the key and certificate: {e}") from e
    auth = _get(raw, listener, "ssl.client.auth", "none").lower()
    if auth not in ("none", "requested", "required"):
        raise ConfigError("ssl.client.auth", f"{auth!r} is not none, requested or required")
    has_trust = _load_trust(ctx, raw, listener)
    if auth != "none" and not has_trust:
        raise ConfigError("ssl.truststore.location",
                          f"ssl.client.auth={auth} needs the CA certificates that sign clients")
    ctx.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                       "required": ssl.CERT_REQUIRED}[auth]
    return ctx, auth


def client_context(raw: Mapping[str, Any], listener: str) -> ssl.SSLContext:
    """The inter-broker client's TLS context: trusts the listener's truststore (or the
    system's), presents the broker's own certificate (mutual TLS), and checks host names
    unless ``ssl.endpoint.identification.algorithm`` is empty."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _tls_versions(ctx, raw, listener)
    if not _load_trust(ctx, raw, listener):
        ctx.load_default_certs()
    ctx.check_hostname = bool(_get(raw, listener, "ssl.endpoint.identification.algorithm",
                                   "https"))
    location = _get(raw, listener, "ssl.keystore.location")
    if location:
        ctx.load_cert_chain(location, password=_get(raw, listener, "ssl.key.password") or None)
    return ctx


# ------------------------------------------------------------------------ listeners


def _sasl(raw: Mapping[str, Any], listener: str) -> SaslSettings:
    mechs = tuple(m.strip().upper() for m in _get(raw, listener, "sasl.enabled.mechanisms",
                                                   "PLAIN").split(",") if m.strip())
    unknown = [m for m in mechs if m not in SASL_MECHANISMS]
    if unknown:
        raise ConfigError("sasl.enabled.mechanisms",
                          f"{', '.join(unknown)} not supported (supported: "
                          f"{', '.join(SASL_MECHANISMS)})")
    users: dict[str, str] = {}
    if "PLAIN" in mechs:
        users = {k[len("user_"):]: v for k, v in jaas(raw, listener, "PLAIN").items()
                 if k.startswith("user_")}
    # without a JWKS, OAUTHBEARER is Kafka's unsecured development mode (see sasl.py)
    jwks = _get(raw, listener, "sasl.oauthbearer.jwks.endpoint.url")
    oauth = None
    if "OAUTHBEARER" in mechs:
        audience = tuple(a.strip() for a in _get(
            raw, listener, "sasl.oauthbearer.expected.audience").split(",") if a.strip())
        oauth = OAuthSettings(
            jwks, audience, _get(raw, listener, "sasl.oauthbearer.expected.issuer"),
            _get(raw, listener, "sasl.oauthbearer.sub.claim.name", "sub") or "sub",
            int(_get(raw, listener, "sasl.oauthbearer.clock.skew.seconds", "30") or 30))
    return SaslSettings(mechs, users, oauth)


def parse_listeners(raw: Mapping[str, Any], host: str, port: int, advertised_host: str,
                    advertised_port: int, max_reauth_ms: int = 0,
                    ) -> tuple[list[Listener], InterBrokerClient]:
    """Every listener this broker serves and how it reaches other brokers, from the raw
    configuration (Kafka's names). Without ``listeners``, one PLAINTEXT listener on
    ``host``:``port``. ``host``/``port`` (the ``--host``/``--port`` flags, or the
    ``listeners`` entry they came from) bind the inter-broker listener; the others bind
    where their entries say. Raises ``ConfigError``."""
    protocols = protocol_map(str(raw.get("listener.security.protocol.map",
                                         DEFAULT_PROTOCOL_MAP)))
    controllers = {n.strip().upper() for n in str(raw.get("controller.listener.names", ""))
                   .split(",") if n.strip()}
    entries = [e for e in split_listeners("listeners", str(raw.get("listeners", "")))
               if e[0] not in controllers]
    if not entries:
        entries = [("PLAINTEXT", host, port)]
        protocols.setdefault("PLAINTEXT", "PLAINTEXT")
    advertised = {n: (h, p) for n, h, p in split_listeners(
        "advertised.listeners", str(raw.get("advertised.listeners", "")))}
    inter = str(raw.get("inter.broker.listener.name", "")).strip().upper()
    if not inter and raw.get("security.inter.broker.protocol"):
        wanted = str(raw["security.inter.broker.protocol"]).strip().upper()
        inter = next((n for n, _, _ in entries if protocols.get(n) == wanted), "")
        if not inter:
            raise ConfigError("security.inter.broker.protocol",
                              f"no listener uses {wanted}")
    if not inter:
        inter = entries[0][0]
    if inter not in {n for n, _, _ in entries}:
        raise ConfigError("inter.broker.listener.name", f"{inter} is not among the listeners")
    out: list[Listener] = []
    ports: set[int] = set()
    for name, h, p in entries:
        protocol = protocols.get(name)
        if protocol is None:
            raise ConfigError("listeners", f"no security protocol for listener {name} in "
                                           "listener.security.protocol.map")
        if name == inter:
            h, p = host, port
        if p and p in ports:
            raise ConfigError("listeners", f"port {p} is used by two listeners")
        ports.add(p)
        adv_h, adv_p = advertised.get(name, ("", 0))
        if name == inter:
            adv_h, adv_p = advertised_host or adv_h, advertised_port or adv_p
        ctx, auth = None, "none"
        rules: tuple[PrincipalRule, ...] = (PrincipalRule(None),)
        if protocol in ("SSL", "SASL_SSL"):
            ctx, auth = server_context(raw, name)
            rules = parse_principal_rules(_get(raw, name, "ssl.principal.mapping.rules"))
        sasl = _sasl(raw, name) if protocol in ("SASL_PLAINTEXT", "SASL_SSL") else None
        reauth = int(_get(raw, name, "connections.max.reauth.ms", str(max_reauth_ms)) or 0)
        out.append(Listener(name, protocol, h, p, adv_h, adv_p, ctx, auth, rules, sasl,
                            reauth))
    inter_listener = next(x for x in out if x.name == inter)
    client = InterBrokerClient(inter, inter_listener.protocol)
    if inter_listener.uses_tls:
        client = InterBrokerClient(inter, inter_listener.protocol,
                                   client_context(raw, inter))
    if inter_listener.uses_sasl:
        mech = str(raw.get("sasl.mechanism.inter.broker.protocol", "PLAIN")).strip().upper()
        if mech not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise ConfigError("sasl.mechanism.inter.broker.protocol",
                              f"{mech}: brokers authenticate to each other with PLAIN or SCRAM")
        opts = jaas(raw, inter, mech)
        if not opts.get("username"):
            raise ConfigError(f"listener.name.{inter.lower()}.{mech.lower()}.sasl.jaas.config",
                              "the inter-broker listener needs username= and password= for "
                              "brokers to authenticate to each other")
        client = InterBrokerClient(inter, inter_listener.protocol, client.ssl_context, mech,
                                   opts["username"], opts.get("password", ""))
    return out, client
