"""Test material for the security tests: certificates, token keys and tokens, htpasswd files.

Everything is generated on the spot with the ``cryptography`` package (no files checked in, no
network), so each test run has its own authority and secrets:

- ``CertificateAuthority`` signs a server certificate for 127.0.0.1/localhost and client
  certificates with a given common name (the role TLS authentication derives). A second,
  unrelated authority stands in for "untrusted". Private keys are written as PKCS#8 (what
  ``openssl genpkey`` writes) or PKCS#1 (``BEGIN RSA PRIVATE KEY``), both of which Pulsar's
  ``tlsKeyFilePath`` accepts.
- Token keys as ``bin/pulsar tokens`` makes them: a raw HS256 secret, RS256/ES256 key pairs in
  DER; ``mint_token`` signs tokens with any claims, expiry and headers.
- ``write_htpasswd`` writes the entries ``htpasswd`` would: bcrypt (``-B``, ``$2y$``), Apache
  MD5 (``-m``, ``$apr1$``, made by ``openssl passwd -apr1`` when openssl is installed, so the
  broker's verifier is checked against another implementation) and classic DES crypt (``-d``).

``make_pki(directory)`` bundles the usual set; ``tests/security/conftest.py`` offers it as the
session fixture ``pki``.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_PKCS8 = "pkcs8"
KEY_PKCS1 = "pkcs1"
SERVER_HOSTS = ("127.0.0.1", "localhost")

# --- certificates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CertFiles:
    """A PEM certificate and its PEM private key on disk."""

    cert: Path
    key: Path
    common_name: str


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write_key(path: Path, key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, key_format: str) -> None:
    if key_format == KEY_PKCS1 and not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError("PKCS#1 is an RSA key format")
    fmt = (
        serialization.PrivateFormat.TraditionalOpenSSL
        if key_format == KEY_PKCS1
        else serialization.PrivateFormat.PKCS8
    )
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption()))
    path.chmod(0o600)


def _rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class CertificateAuthority:
    """A self-signed CA in ``directory``; ``cert_path`` is what ``tlsTrustCertsFilePath`` names."""

    def __init__(self, directory: str | os.PathLike, name: str = "compactmq-test-ca"):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._key = _rsa_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(hours=1))
            .not_valid_after(_now() + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = self.directory / f"{name}.cert.pem"
        self.cert_path.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        common_name: str,
        *,
        hosts: tuple[str, ...] = (),
        server: bool = False,
        key_format: str = KEY_PKCS8,
        stem: str | None = None,
        valid_days: float = 10,
    ) -> CertFiles:
        """A certificate for ``common_name`` signed by this CA, with ``hosts`` as subject
        alternative names (IP addresses or DNS names)."""
        key = _rsa_key()
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(hours=1))
            .not_valid_after(_now() + dt.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        stem = stem or f"{self.name}.{common_name}.{key_format}"
        files = CertFiles(
            self.directory / f"{stem}.cert.pem", self.directory / f"{stem}.key.pem", common_name
        )
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(files.key, key, key_format)
        return files

    def server_cert(
        self, hosts: tuple[str, ...] = SERVER_HOSTS, key_format: str = KEY_PKCS8, name: str = "broker"
    ) -> CertFiles:
        return self.issue(name, hosts=hosts, server=True, key_format=key_format)

    def client_cert(self, common_name: str, key_format: str = KEY_PKCS8) -> CertFiles:
        return self.issue(common_name, key_format=key_format)


@dataclass
class Pki:
    """The usual set: a trusted CA with a server certificate (PKCS#8 and PKCS#1 keys), and an
    untrusted CA. ``client(cn)`` issues (once) a client certificate from the trusted CA,
    ``untrusted_client(cn)`` one from the untrusted CA."""

    directory: Path
    ca: CertificateAuthority
    untrusted_ca: CertificateAuthority
    server: CertFiles
    server_pkcs1: CertFiles
    _clients: dict[tuple[str, str], CertFiles] = field(default_factory=dict)

    def client(self, common_name: str, key_format: str = KEY_PKCS8) -> CertFiles:
        return self._issue(self.ca, common_name, key_format)

    def untrusted_client(self, common_name: str) -> CertFiles:
        return self._issue(self.untrusted_ca, common_name, KEY_PKCS8)

    def _issue(self, ca: CertificateAuthority, cn: str, key_format: str) -> CertFiles:
        key = (ca.name, f"{cn}/{key_format}")
        if key not in self._clients:
            self._clients[key] = ca.client_cert(cn, key_format)
        return self._clients[key]


def make_pki(directory: str | os.PathLike) -> Pki:
    directory = Path(directory)
    ca = CertificateAuthority(directory, "test-ca")
    untrusted = CertificateAuthority(directory, "untrusted-ca")
    return Pki(
        directory=directory,
        ca=ca,
        untrusted_ca=untrusted,
        server=ca.server_cert(),
        server_pkcs1=ca.server_cert(key_format=KEY_PKCS1, name="broker-pkcs1"),
    )


# --- token keys and tokens ------------------------------------------------------------------


def secret_key(size: int = 32) -> bytes:
    """A random HS256 secret (raw bytes, as ``tokens create-secret-key`` writes)."""
    return os.urandom(size)


def data_url(raw: bytes) -> str:
    """``data:;base64,...`` -- the inline form of tokenSecretKey/tokenPublicKey."""
    return "data:;base64," + base64.b64encode(raw).decode()


def file_url(path: str | os.PathLike) -> str:
    return "file://" + str(Path(path).resolve())


@dataclass(frozen=True)
class KeyPair:
    """An RS256 or ES256 signing key pair."""

    algorithm: str
    private_key: Any

    @property
    def public_key(self) -> Any:
        return self.private_key.public_key()

    @property
    def private_der(self) -> bytes:
        return self.private_key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @property
    def public_der(self) -> bytes:
        return self.public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    @property
    def private_pem(self) -> bytes:
        return self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @property
    def public_pem(self) -> bytes:
        return self.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def write(self, directory: str | os.PathLike, stem: str = "my", pem: bool = False) -> tuple[Path, Path]:
        """Write ``{stem}-private.key`` and ``{stem}-public.key`` (DER, as Pulsar's tool does, or
        PEM); returns their paths."""
        directory = Path(directory)
        private, public = directory / f"{stem}-private.key", directory / f"{stem}-public.key"
        private.write_bytes(self.private_pem if pem else self.private_der)
        private.chmod(0o600)
        public.write_bytes(self.public_pem if pem else self.public_der)
        return private, public


def rsa_key_pair() -> KeyPair:
    return KeyPair("RS256", _rsa_key())


def ec_key_pair() -> KeyPair:
    return KeyPair("ES256", ec.generate_private_key(ec.SECP256R1()))


def mint_token(
    subject: str | None,
    key: bytes | KeyPair,
    *,
    algorithm: str | None = None,
    expires_in: float | None = None,
    claims: dict[str, Any] | None = None,
    headers: dict[str, Any] | None = None,
    subject_claim: str = "sub",
) -> str:
    """A signed JWT. ``key`` is an HS256 secret or a ``KeyPair``; ``expires_in`` seconds from now
    (negative for an expired token); ``claims`` are added as given (e.g. ``{"aud": "broker"}``)."""
    payload: dict[str, Any] = {}
    if subject is not None:
        payload[subject_claim] = subject
    if expires_in is not None:
        payload["exp"] = int(time.time() + expires_in)
    payload.update(claims or {})
    if isinstance(key, KeyPair):
        return jwt.encode(payload, key.private_key, algorithm=algorithm or key.algorithm, headers=headers)
    return jwt.encode(payload, key, algorithm=algorithm or "HS256", headers=headers)


# --- htpasswd -------------------------------------------------------------------------------

BCRYPT, APR1, CRYPT = "bcrypt", "apr1", "crypt"


def htpasswd_hash(password: str, scheme: str = BCRYPT) -> str:
    """The hash ``htpasswd`` writes for ``password``: bcrypt ``$2y$``, ``$apr1$`` or DES crypt."""
    if scheme == BCRYPT:
        # rounds=4: the minimum, tests stay fast; $2y$ is the prefix htpasswd -B writes
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        return "$2y$" + hashed[4:]
    if scheme == APR1:
        openssl = shutil.which("openssl")
        if openssl:
            out = subprocess.run(
                [openssl, "passwd", "-apr1", "-stdin"],
                input=password,
                capture_output=True,
                text=True,
                check=True,
            )
            return out.stdout.strip()
        from passlib.hash import apr_md5_crypt

        return apr_md5_crypt.hash(password)
    if scheme == CRYPT:
        from passlib.hash import des_crypt

        return des_crypt.hash(password)
    raise ValueError(f"unknown htpasswd scheme {scheme!r}")


def write_htpasswd(
    path: str | os.PathLike, users: dict[str, str] | dict[str, tuple[str, str]], scheme: str = BCRYPT
) -> Path:
    """Write an htpasswd file. ``users`` maps a user to a password (hashed with ``scheme``) or
    to ``(password, scheme)``."""
    lines = []
    for user, value in users.items():
        password, user_scheme = value if isinstance(value, tuple) else (value, scheme)
        lines.append(f"{user}:{htpasswd_hash(password, user_scheme)}")
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path


def htpasswd_base64(path: str | os.PathLike) -> str:
    """The file's content in base64: the inline form of ``basicAuthConf``."""
    return base64.b64encode(Path(path).read_bytes()).decode()


#: authentication by token, basic and TLS client certificate, in the order a broker tries them
EVERY_PROVIDER = ",".join(
    f"org.apache.pulsar.broker.authentication.AuthenticationProvider{p}" for p in ("Token", "Basic", "Tls")
)


def every_provider_settings(
    secret_path: Path, secret: bytes, htpasswd: Path, pki: Pki, tls_port: int
) -> dict:
    """A broker's settings with authentication by every provider and authorization on: ``admin``
    the superuser, tokens signed with ``secret`` (stored at ``secret_path``), basic users from
    ``htpasswd``, TLS on the binary port ``tls_port`` with ``pki``'s server certificate."""
    return {
        "authenticationEnabled": "true",
        "authorizationEnabled": "true",
        "authenticationProviders": EVERY_PROVIDER,
        "superUserRoles": "admin",
        "tokenSecretKey": file_url(secret_path),
        # the broker's own admin client is a superuser: it creates public/default (as on Pulsar)
        "brokerClientAuthenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
        "brokerClientAuthenticationParameters": "token:" + mint_token("admin", secret),
        "basicAuthConf": str(htpasswd),
        "brokerServicePortTls": str(tls_port),
        "tlsCertificateFilePath": str(pki.server.cert),
        "tlsKeyFilePath": str(pki.server.key),
        "tlsTrustCertsFilePath": str(pki.ca.cert_path),
    }
