"""The broker's TLS listeners: one server ``ssl.SSLContext`` built from Pulsar's ``tls*`` keys.

The same context serves the binary protocol's TLS port (``brokerServicePortTls``, URLs
``pulsar+ssl://``) and the web service's (``webServicePortTls``, ``https://``). The keys, as an
operator knows them from Pulsar's broker.conf:

``tlsCertificateFilePath`` / ``tlsKeyFilePath``
    The broker's certificate chain and its private key, PEM. The key may be PKCS#8
    (``BEGIN PRIVATE KEY``) or PKCS#1 (``BEGIN RSA PRIVATE KEY``); OpenSSL reads both. An
    encrypted key is refused (Pulsar has no key-password setting either).
``tlsTrustCertsFilePath``
    CA certificates that client certificates must chain to. When set, the broker asks clients
    for a certificate; a client that presents a trusted one gets it passed to the TLS
    authentication provider (role = its CN), a client that presents none still connects.
``tlsRequireTrustedClientCertOnConnect``
    Refuse the handshake of a client without a trusted certificate.
``tlsAllowInsecureConnection``
    Let clients whose certificate cannot be verified connect anyway. Pulsar then does not use
    such a certificate for authentication; Python's ``ssl`` cannot accept an untrusted
    certificate while still reading a trusted one, so with this key the broker does not ask
    for client certificates at all (TLS client authentication is then unavailable, which is
    logged at start).
``tlsProtocols``
    Comma list of the protocol versions to offer (``TLSv1.3,TLSv1.2``); the context allows
    the range from the lowest to the highest listed.
``tlsCiphers``
    Comma list of TLS 1.2 cipher suites, by Pulsar's (IANA/Java) names such as
    ``TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384`` or by OpenSSL's. TLS 1.3 suites
    (``TLS_AES_256_GCM_SHA384``, ...) are accepted but Python cannot narrow them: OpenSSL's
    defaults, all strong, stay on.
``tlsEnabled``
    Pulsar's deprecated switch: with it, a TLS port left empty takes Pulsar's default (6651
    for the binary protocol, 8443 for the web service).

Every problem with these keys or files is one ``InvalidConfiguration`` line at start (the
path and what is wrong with it), never a traceback or a half-started broker.
"""

from __future__ import annotations

import logging
import os
import ssl
from typing import Any, Literal, Mapping, overload

from ..errors import InvalidConfiguration

log = logging.getLogger(__name__)

# Pulsar's default TLS ports, used when the deprecated tlsEnabled=true leaves a port unset.
DEFAULT_BROKER_PORT_TLS = 6651
DEFAULT_WEB_PORT_TLS = 8443

_PROTOCOLS = {
    "TLSv1": ssl.TLSVersion.TLSv1,
    "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}
_PROTOCOL_ORDER = ["TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"]

# IANA cipher-suite name parts -> OpenSSL's spelling (TLS 1.2 and below).
_KEY_EXCHANGE = {
    "ECDHE_ECDSA": "ECDHE-ECDSA-",
    "ECDHE_RSA": "ECDHE-RSA-",
    "DHE_RSA": "DHE-RSA-",
    "RSA": "",
}
_BULK = {
    "AES_128_GCM": "AES128-GCM",
    "AES_256_GCM": "AES256-GCM",
    "AES_128_CBC": "AES128",
    "AES_256_CBC": "AES256",
    "CHACHA20_POLY1305": "CHACHA20-POLY1305",
}
# TLS 1.3 suites: the same name in both worlds, always on with TLSv1.3 (see the module notes).
_TLS13_SUITES = {
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_AES_128_CCM_SHA256",
    "TLS_AES_128_CCM_8_SHA256",
}


def _text(config: Mapping[str, Any], key: str) -> str:
    value = config.get(key)
    return "" if value is None else str(value).strip()


def _items(config: Mapping[str, Any], key: str) -> list[str]:
    return [part.strip() for part in _text(config, key).split(",") if part.strip()]


def _flag(config: Mapping[str, Any], key: str) -> bool:
    value = config.get(key)
    if isinstance(value, bool):
        return value
    return _text(config, key).lower() in ("true", "1", "yes", "on")


def _port(config: Mapping[str, Any], key: str, deprecated_default: int) -> int | None:
    text = _text(config, key)
    if not text:
        return deprecated_default if _flag(config, "tlsEnabled") else None
    try:
        port = int(text)
    except ValueError:
        raise InvalidConfiguration(f"config {key}={text!r}: expected a port number") from None
    if not 0 <= port <= 65535:
        raise InvalidConfiguration(f"config {key}={port}: not a port number")
    return port


def broker_port_tls(config: Mapping[str, Any]) -> int | None:
    """The binary protocol's TLS port (0: any free port), or None when it is off."""
    return _port(config, "brokerServicePortTls", DEFAULT_BROKER_PORT_TLS)


def web_port_tls(config: Mapping[str, Any]) -> int | None:
    """The web service's TLS port (0: any free port), or None when it is off."""
    return _port(config, "webServicePortTls", DEFAULT_WEB_PORT_TLS)


def tls_wanted(config: Mapping[str, Any]) -> bool:
    return broker_port_tls(config) is not None or web_port_tls(config) is not None


@overload
def _readable_file(config: Mapping[str, Any], key: str, *, required: Literal[True]) -> str: ...
@overload
def _readable_file(config: Mapping[str, Any], key: str, *, required: bool) -> str | None: ...


def _readable_file(config: Mapping[str, Any], key: str, *, required: bool) -> str | None:
    path = _text(config, key)
    if not path:
        if required:
            raise InvalidConfiguration(f"TLS is on (a TLS port is set) but {key} is empty")
        return None
    if not os.path.isfile(path):
        raise InvalidConfiguration(f"{key} {path}: no such file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InvalidConfiguration(f"{key} {path}: cannot read it: {e.strerror}") from None
    if b"-----BEGIN " not in data:
        raise InvalidConfiguration(f"{key} {path}: not a PEM file")
    if key == "tlsKeyFilePath":
        if b"ENCRYPTED" in data:
            raise InvalidConfiguration(f"{key} {path}: the private key is encrypted; give it unencrypted")
        if b"PRIVATE KEY-----" not in data:
            raise InvalidConfiguration(f"{key} {path}: no PEM private key in it")
    elif b"-----BEGIN CERTIFICATE-----" not in data:
        raise InvalidConfiguration(f"{key} {path}: no PEM certificate in it")
    return path


def openssl_cipher_name(name: str) -> str:
    """OpenSSL's name of a TLS 1.2 cipher suite given by its IANA name (or already OpenSSL's)."""
    if not name.startswith("TLS_") or "_WITH_" not in name:
        return name
    kx, _, rest = name[len("TLS_") :].partition("_WITH_")
    prefix = _KEY_EXCHANGE.get(kx)
    if prefix is None:
        return name
    for bulk, spelled in _BULK.items():
        if rest == bulk or rest.startswith(bulk + "_"):
            if bulk == "CHACHA20_POLY1305":  # an AEAD: OpenSSL's name has no MAC part
                return prefix + spelled
            # ECDHE-RSA-AES256-GCM-SHA384, ECDHE-RSA-AES128-SHA, AES256-SHA256
            return f"{prefix}{spelled}-{rest[len(bulk) + 1 :]}"
    return name


def _apply_protocols(ctx: ssl.SSLContext, names: list[str]) -> None:
    unknown = [n for n in names if n not in _PROTOCOLS]
    if unknown:
        raise InvalidConfiguration(
            f"tlsProtocols: unknown protocol {unknown[0]!r} (known: {', '.join(_PROTOCOL_ORDER)})"
        )
    ordered = sorted(names, key=_PROTOCOL_ORDER.index)
    try:
        ctx.minimum_version = _PROTOCOLS[ordered[0]]
        ctx.maximum_version = _PROTOCOLS[ordered[-1]]
    except (ValueError, ssl.SSLError) as e:
        raise InvalidConfiguration(f"tlsProtocols={','.join(names)}: {e}") from None


def _apply_ciphers(ctx: ssl.SSLContext, names: list[str]) -> None:
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    probe.set_ciphers("ALL")
    available = {c["name"] for c in probe.get_ciphers()}
    chosen = []
    for name in names:
        if name in _TLS13_SUITES:
            continue
        spelled = openssl_cipher_name(name)
        if spelled not in available:
            raise InvalidConfiguration(f"tlsCiphers: cipher {name!r} is unknown or not available here")
        chosen.append(spelled)
    if chosen:
        try:
            ctx.set_ciphers(":".join(chosen))
        except ssl.SSLError:
            raise InvalidConfiguration(f"tlsCiphers: none of {', '.join(names)} can be used") from None


def server_context(config: Mapping[str, Any]) -> ssl.SSLContext | None:
    """The server context for the TLS ports, or None when no TLS port is configured.

    Raises ``InvalidConfiguration`` (one line) for a missing, unreadable or unusable file or
    a bad protocol/cipher list.
    """
    if not tls_wanted(config):
        return None
    if _flag(config, "tlsEnabled"):
        log.warning("tlsEnabled is deprecated: set brokerServicePortTls / webServicePortTls instead")
    cert = _readable_file(config, "tlsCertificateFilePath", required=True)
    key = _readable_file(config, "tlsKeyFilePath", required=True)
    trust = _readable_file(config, "tlsTrustCertsFilePath", required=False)
    require_client_cert = _flag(config, "tlsRequireTrustedClientCertOnConnect")
    insecure = _flag(config, "tlsAllowInsecureConnection")
    if require_client_cert and trust is None:
        raise InvalidConfiguration(
            "tlsRequireTrustedClientCertOnConnect=true needs tlsTrustCertsFilePath (the CA clients must chain to)"
        )
    if require_client_cert and insecure:
        raise InvalidConfiguration(
            "tlsRequireTrustedClientCertOnConnect and tlsAllowInsecureConnection contradict each other"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as e:
        raise InvalidConfiguration(
            f"tlsCertificateFilePath {cert} / tlsKeyFilePath {key}: unusable ({e.reason or e}); "
            "the key must be an unencrypted PEM key (PKCS#8 or PKCS#1) matching the certificate"
        ) from None
    if trust is not None:
        try:
            ctx.load_verify_locations(cafile=trust)
        except ssl.SSLError as e:
            raise InvalidConfiguration(f"tlsTrustCertsFilePath {trust}: unusable ({e.reason or e})") from None
    if require_client_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
    elif trust is not None and not insecure:
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
        if trust is not None:
            log.warning(
                "tlsAllowInsecureConnection=true: client certificates are not requested, "
                "so TLS client authentication is unavailable"
            )
    protocols = _items(config, "tlsProtocols")
    if protocols:
        _apply_protocols(ctx, protocols)
    ciphers = _items(config, "tlsCiphers")
    if ciphers:
        _apply_ciphers(ctx, ciphers)
    return ctx


def peer_certificate(transport: Any) -> dict | None:
    """The verified client certificate of a TLS transport (``getpeercert()``), else None.

    With ``CERT_OPTIONAL``/``CERT_REQUIRED`` OpenSSL verified the chain against
    ``tlsTrustCertsFilePath`` during the handshake, so a non-empty answer is trusted.
    """
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    return cert or None
