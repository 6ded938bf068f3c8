"""Token keys and tokens: what ``compactmq tokens`` and the token provider share.

Pulsar's conventions, which existing keys and tokens follow:

- A **secret key** (HS256/HS384/HS512) is raw random bytes in a file, or inline as
  ``data:;base64,<bytes in base64>``.
- A **key pair** (RS256... with RSA, ES256... with elliptic curves) is written in DER: the
  private key as PKCS#8, the public key as X.509 SubjectPublicKeyInfo. PEM is read too.
- A key is named by a URL: ``file:///path``, ``data:;base64,...``; a bare value is a path when
  such a file exists, else base64 (``read_key_data``; ``basicAuthConf`` follows the same rule).
- A token is a JWT whose ``sub`` claim (or the configured claim) is the role; it may carry
  ``exp``; tokens without it never expire.

The signing library is PyJWT on top of ``cryptography``. Algorithm lists are always explicit
when verifying, so a token cannot choose a weaker algorithm (``none``, or HS256 keyed with a
public key).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import time
import urllib.parse
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ..errors import InvalidConfiguration, InvalidInput

HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS = ("ES256", "ES384", "ES512")
KEY_PAIR_ALGORITHMS = RSA_ALGORITHMS + EC_ALGORITHMS

# Secret sizes per HMAC algorithm: the hash's output size, as RFC 7518 §3.2 asks at least.
_SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
_EC_CURVES: dict[str, type[ec.EllipticCurve]] = {
    "ES256": ec.SECP256R1,
    "ES384": ec.SECP384R1,
    "ES512": ec.SECP521R1,
}
RSA_KEY_BITS = 2048

# Relative times as Pulsar's tools write them: 30s, 10m, 1h, 7d, 2w, 1y.
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_RELATIVE_TIME = re.compile(r"^\s*(\d+)\s*([smhdwy]?)\s*$")


# --- reading keys ---------------------------------------------------------------------------


def read_key_data(spec: str, what: str = "key") -> bytes:
    """The bytes named by ``spec``: ``file://`` or ``data:`` URL, an existing path, or base64.

    Raises ``InvalidConfiguration`` naming ``what`` (e.g. ``tokenSecretKey``); the key's bytes
    never appear in a message.
    """
    spec = (spec or "").strip()
    if not spec:
        raise InvalidConfiguration(f"{what} is empty")
    if spec.startswith("data:"):
        return _read_data_url(spec, what)
    if spec.startswith("file:"):
        return _read_file(_file_url_path(spec), what)
    if os.path.isfile(spec):
        return _read_file(spec, what)
    try:
        return base64.b64decode(spec, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidConfiguration(
            f"{what}: not a file:// or data: URL, not an existing file, and not base64"
        ) from None


def _file_url_path(url: str) -> str:
    parsed = urllib.parse.urlparse(url)
    path = urllib.parse.unquote(parsed.path)
    if parsed.netloc and parsed.netloc != "localhost":  # file://relative/path
        path = parsed.netloc + path
    return path


def _read_file(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise InvalidConfiguration(f"{what}: cannot read {path}: {e.strerror}") from None


def _read_data_url(url: str, what: str) -> bytes:
    meta, sep, payload = url[len("data:") :].partition(",")
    if not sep:
        raise InvalidConfiguration(f"{what}: a data: URL needs a ',' before its payload")
    if meta.endswith("base64"):  # "data:;base64," and the older "data:base64,"
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidConfiguration(f"{what}: the data: URL payload is not valid base64") from None
    return urllib.parse.unquote_to_bytes(payload)


def load_public_key(data: bytes, what: str = "public key") -> Any:
    """An RSA or EC public key from DER (Pulsar's files) or PEM."""
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_der_public_key(data)
    except (ValueError, TypeError):
        raise InvalidConfiguration(f"{what}: not a DER or PEM public key") from None
    if not isinstance(key, (rsa.RSAPublicKey, ec.EllipticCurvePublicKey)):
        raise InvalidConfiguration(f"{what}: only RSA and EC public keys are supported")
    return key


def load_private_key(data: bytes, what: str = "private key") -> Any:
    """An RSA or EC private key from DER (PKCS#8, as Pulsar writes it) or PEM (PKCS#8/PKCS#1)."""
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_private_key(data, password=None)
        else:
            key = serialization.load_der_private_key(data, password=None)
    except (ValueError, TypeError):
        raise InvalidConfiguration(f"{what}: not an unencrypted DER or PEM private key") from None
    if not isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
        raise InvalidConfiguration(f"{what}: only RSA and EC private keys are supported")
    return key


def algorithms_for_key(key: Any) -> tuple[str, ...]:
    """The signature algorithms a key pair's key can verify or sign."""
    if isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        return RSA_ALGORITHMS
    return EC_ALGORITHMS


def default_algorithm_for_key(key: Any) -> str:
    """RS256 for RSA keys; ES256/ES384/ES512 after the curve of an EC key."""
    if isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        return "RS256"
    for algorithm, curve in _EC_CURVES.items():
        if isinstance(key.curve, curve):
            return algorithm
    raise InvalidConfiguration(f"unsupported elliptic curve {key.curve.name}")


# --- making keys ----------------------------------------------------------------------------


def create_secret_key(algorithm: str = "HS256") -> bytes:
    """Random bytes for an HMAC algorithm."""
    if algorithm not in _SECRET_BYTES:
        raise InvalidInput(
            f"unknown secret key algorithm {algorithm!r}: use one of {', '.join(HMAC_ALGORITHMS)}"
        )
    return os.urandom(_SECRET_BYTES[algorithm])


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """A new key pair for ``algorithm`` as ``(private PKCS#8 DER, public X.509 DER)``."""
    if algorithm in RSA_ALGORITHMS:
        private: Any = rsa.generate_private_key(public_exponent=65537, key_size=RSA_KEY_BITS)
    elif algorithm in _EC_CURVES:
        private = ec.generate_private_key(_EC_CURVES[algorithm]())
    else:
        raise InvalidInput(
            f"unknown signature algorithm {algorithm!r}: use one of {', '.join(KEY_PAIR_ALGORITHMS)}"
        )
    private_der = private.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_der = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_der, public_der


# --- tokens ---------------------------------------------------------------------------------


def parse_relative_time(text: str) -> int:
    """Seconds in ``30s``, ``10m``, ``1h``, ``7d``, ``2w``, ``1y`` (a bare number is seconds)."""
    m = _RELATIVE_TIME.match(text or "")
    if not m:
        raise InvalidInput(f"invalid time {text!r}: use a number with s, m, h, d, w or y (e.g. 1h, 7d, 1y)")
    return int(m.group(1)) * _UNIT_SECONDS[m.group(2) or "s"]


def create_token(
    subject: str,
    key: bytes | Any,
    *,
    algorithm: str | None = None,
    expires_in: int | None = None,
    headers: dict[str, Any] | None = None,
    subject_claim: str = "sub",
    now: float | None = None,
) -> str:
    """Sign a token for ``subject``. ``key`` is a secret (bytes, HMAC) or a private key object."""
    payload: dict[str, Any] = {subject_claim: subject}
    if expires_in is not None:
        payload["exp"] = int((time.time() if now is None else now) + expires_in)
    if isinstance(key, (bytes, bytearray)):
        algorithm = algorithm or "HS256"
        if algorithm not in HMAC_ALGORITHMS:
            raise InvalidInput(f"a secret key signs with {', '.join(HMAC_ALGORITHMS)}, not {algorithm}")
        return jwt.encode(payload, bytes(key), algorithm=algorithm, headers=headers)
    algorithm = algorithm or default_algorithm_for_key(key)
    if algorithm not in algorithms_for_key(key):
        raise InvalidInput(f"this private key cannot sign {algorithm}: use {default_algorithm_for_key(key)}")
    return jwt.encode(payload, key, algorithm=algorithm, headers=headers)


def split_token(token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """``(header, payload, signature)`` of a JWT, without verifying it (``tokens show``)."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise InvalidInput("not a JWT: expected three base64url parts separated by '.'")
    try:
        header, payload = (json.loads(_b64url(part)) for part in parts[:2])
    except (ValueError, binascii.Error):
        raise InvalidInput("not a JWT: the header or payload is not base64url-encoded JSON") from None
    if not isinstance(header, dict) or not isinstance(payload, dict):
        raise InvalidInput("not a JWT: the header and payload must be JSON objects")
    return header, payload, parts[2]


def _b64url(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def verify_token(
    token: str, key: bytes | Any, *, algorithms: tuple[str, ...] | None = None, leeway: float = 0
) -> dict[str, Any]:
    """The verified payload; PyJWT's exceptions propagate (the provider words them)."""
    if isinstance(key, (bytes, bytearray)):
        key, allowed = bytes(key), algorithms or HMAC_ALGORITHMS
    else:
        allowed = algorithms or algorithms_for_key(key)
    return jwt.decode(
        token,
        key,
        algorithms=list(allowed),
        leeway=leeway,
        options={"verify_aud": False, "verify_iss": False, "require": []},
    )
