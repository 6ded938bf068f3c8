"""``AuthenticationProviderToken``: a JWT whose claim names the role (method ``token``).

The broker verifies with one key, as Pulsar does:

- ``tokenSecretKey`` -- a shared secret; tokens are signed with HS256 (HS384/HS512 accepted);
- otherwise ``tokenPublicKey`` -- the public half of an RSA or EC key pair, tokens signed with
  ``tokenPublicAlg`` (RS256 by default; ES256 for a P-256 key) or a sibling of the same key type.

The role is the ``tokenAuthClaim`` claim (``sub``). When ``tokenAudienceClaim`` is set, that
claim (a string or a list) must contain ``tokenAudience``. ``exp``, ``nbf`` and ``iat`` are
checked with ``tokenAllowedClockSkewSeconds`` of leeway; a token without ``exp`` never expires.

A refusal says what is wrong (malformed, signature, expired at, audience, missing role claim)
and never contains the token: tokens are bearer credentials, so one in a log is a leak.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import jwt

from ..errors import AuthenticationFailed, InvalidConfiguration, InvalidInput
from . import METHOD_TOKEN, Principal
from .tokens import (
    HMAC_ALGORITHMS,
    KEY_PAIR_ALGORITHMS,
    algorithms_for_key,
    load_public_key,
    read_key_data,
    split_token,
    verify_token,
)


class TokenAuthenticationProvider:
    method = METHOD_TOKEN

    def __init__(
        self,
        key: bytes | Any,
        *,
        algorithms: tuple[str, ...],
        role_claim: str = "sub",
        audience_claim: str | None = None,
        audience: str | None = None,
        leeway_seconds: float = 0,
    ):
        self._key = key
        self.algorithms = algorithms
        self.role_claim = role_claim or "sub"
        self.audience_claim = audience_claim or None
        self.audience = audience or None
        self.leeway_seconds = leeway_seconds
        if self.audience_claim and not self.audience:
            raise InvalidConfiguration("tokenAudienceClaim is set but tokenAudience is empty")

    def __repr__(self) -> str:  # the key stays out of reprs and logs
        return f"TokenAuthenticationProvider(algorithms={self.algorithms}, role_claim={self.role_claim!r})"

    @classmethod
    def from_config(cls, config: Mapping[str, Any], environ: Mapping[str, str] | None = None):
        options: dict[str, Any] = {
            "role_claim": config["tokenAuthClaim"],
            "audience_claim": config["tokenAudienceClaim"],
            "audience": config["tokenAudience"],
            "leeway_seconds": config["tokenAllowedClockSkewSeconds"],
        }
        if config["tokenSecretKey"]:
            secret = read_key_data(config["tokenSecretKey"], "tokenSecretKey")
            if not secret:
                raise InvalidConfiguration("tokenSecretKey: the secret key is empty")
            return cls(secret, algorithms=HMAC_ALGORITHMS, **options)
        if config["tokenPublicKey"]:
            algorithm = config["tokenPublicAlg"] or "RS256"
            if algorithm not in KEY_PAIR_ALGORITHMS:
                raise InvalidConfiguration(
                    f"tokenPublicAlg={algorithm!r}: use one of {', '.join(KEY_PAIR_ALGORITHMS)}"
                )
            key = load_public_key(read_key_data(config["tokenPublicKey"], "tokenPublicKey"), "tokenPublicKey")
            family = algorithms_for_key(key)
            if algorithm not in family:
                raise InvalidConfiguration(
                    f"tokenPublicAlg={algorithm} does not match tokenPublicKey (an "
                    f"{'RSA' if 'RS256' in family else 'EC'} key)"
                )
            return cls(key, algorithms=family, **options)
        raise InvalidConfiguration(
            "AuthenticationProviderToken needs tokenSecretKey (HS256) or tokenPublicKey (RS256/ES256)"
        )

    def authenticate(self, data: bytes, peer_cert: dict | None = None) -> Principal:
        try:
            token = bytes(data).decode("ascii").strip()
        except UnicodeDecodeError:
            raise AuthenticationFailed("malformed token: not ASCII") from None
        claims = check_token(token, self._key, self.algorithms, self.leeway_seconds)
        self._check_audience(claims)
        role = claims.get(self.role_claim)
        if not isinstance(role, str) or not role:
            raise AuthenticationFailed(f"token has no {self.role_claim!r} claim naming the role")
        exp = claims.get("exp")
        return Principal(role, self.method, float(exp) if isinstance(exp, (int, float)) else None)

    def _check_audience(self, claims: Mapping[str, Any]) -> None:
        if not self.audience_claim:
            return
        value = claims.get(self.audience_claim)
        audiences = value if isinstance(value, list) else [value]
        if self.audience not in audiences:
            raise AuthenticationFailed(
                f"token audience ({self.audience_claim!r} claim) does not include this broker's audience"
            )


def check_token(
    token: str, key: bytes | Any, algorithms: tuple[str, ...] | None = None, leeway_seconds: float = 0
) -> dict[str, Any]:
    """The verified claims of ``token``; ``AuthenticationFailed`` saying why not (never the token).
    ``key`` is a secret (bytes) or a public key; ``algorithms`` default to the key's family."""
    if not token:
        raise AuthenticationFailed("no token given")
    try:
        return verify_token(token, key, algorithms=algorithms, leeway=leeway_seconds)
    except jwt.ExpiredSignatureError:
        raise AuthenticationFailed(f"token expired{_expired_at(token)}") from None
    except jwt.ImmatureSignatureError:
        raise AuthenticationFailed("token is not valid yet (nbf/iat in the future)") from None
    except jwt.InvalidAlgorithmError:
        accepted = algorithms or (HMAC_ALGORITHMS if isinstance(key, bytes) else algorithms_for_key(key))
        raise AuthenticationFailed(
            f"token signed with {_alg(token)}; the key accepts {', '.join(accepted)}"
        ) from None
    except jwt.InvalidSignatureError:
        raise AuthenticationFailed("token signature does not verify with the key") from None
    except jwt.DecodeError:
        raise AuthenticationFailed("malformed token: not a signed JWT") from None
    except jwt.InvalidTokenError as e:
        raise AuthenticationFailed(f"invalid token: {type(e).__name__}") from None


def _expired_at(token: str) -> str:
    """`` at <UTC time>`` of a token PyJWT found expired (so its payload decodes)."""
    try:
        exp = split_token(token)[1].get("exp")
        when = dt.datetime.fromtimestamp(float(exp), dt.UTC)  # type: ignore[arg-type]
    except (InvalidInput, TypeError, ValueError, OverflowError, OSError):
        return ""
    return " at " + when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _alg(token: str) -> str:
    try:
        return str(split_token(token)[0].get("alg"))
    except InvalidInput:
        return "an unknown algorithm"
