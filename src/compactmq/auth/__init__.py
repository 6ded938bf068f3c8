"""Authentication and authorization, Pulsar's model: who a client is, then what it may do.

**Authentication turns credentials into a role.** A role is a plain string ("alice",
"billing-service"); nothing else about the client matters afterwards. Each way of proving a
role is a *provider*, chosen in ``authenticationProviders`` by Pulsar's class name and living in
its own sibling module:

=========================================================================  ========  ============
Pulsar class name (``authenticationProviders``)                            method    module
=========================================================================  ========  ============
``org.apache.pulsar.broker.authentication.AuthenticationProviderToken``    ``token``  ``token``
``org.apache.pulsar.broker.authentication.AuthenticationProviderTls``      ``tls``    ``tls_provider``
``org.apache.pulsar.broker.authentication.AuthenticationProviderBasic``    ``basic``  ``basic``
=========================================================================  ========  ============

The *method* is the name a client puts in CONNECT's ``auth_method_name`` (its credential in
``auth_data``); over HTTP the ``Authorization`` header says it (``Bearer`` is a token,
``Basic`` is basic), and a verified TLS client certificate stands for the ``tls`` method. A
provider answers a ``Principal`` (role, method, and when the credential expires) or raises
``AuthenticationFailed`` with a reason a client can act on -- never the credential itself.
A client that sends nothing gets ``anonymousUserRole`` when one is configured; so does, as on
Pulsar, a client whose CONNECT names a method the broker has no provider for (its credential is
ignored). Bad credentials of a configured method are refused, never downgraded.

``AuthenticationService`` holds the configured providers and picks one per request. It is
built once at start (``from_config``: keys are read, key files loaded, htpasswd parsed) and
afterwards does no I/O. Tokens and certificates take microseconds, so the event loop checks
them directly; a password hash is slow on purpose (``SLOW_METHODS``: bcrypt costs a quarter of
a second and more), so the broker's CONNECT and the admin's HTTP requests both check it with
``off_loop`` on a thread: a storm of wrong passwords never stalls other clients.

**Authorization checks the role's grants** (``authorization.AuthorizationService``): superusers
(``superUserRoles``) may do everything, a tenant's ``adminRoles`` administer its namespaces and
topics, and other roles need a grant of ``produce`` or ``consume`` on the namespace or topic.
Grants live in the namespace policy ``auth_policies`` in Pulsar's JSON shape.

**Policy values are checked before they are stored** (``policy_rules``): what a tenant admin may
set is bounded by the operator's configuration (export root, strategy and offload allowlists),
one rule per policy key, so no policy value reaches a path, an import or an endpoint unchecked.

With ``authenticationEnabled=false`` (the embedded default) every client is unauthenticated
(``Principal(None, "none", None)``) and, with ``authorizationEnabled=false``, may do
everything.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import PROVIDER_BASIC, PROVIDER_TLS, PROVIDER_TOKEN, config_list
from ..errors import AuthenticationFailed, InvalidConfiguration

METHOD_TOKEN, METHOD_TLS, METHOD_BASIC = "token", "tls", "basic"
METHOD_ANONYMOUS, METHOD_NONE = "anonymous", "none"

# Methods whose check is slow by design (password hashes: bcrypt, crypt, apr1): checked off the
# event loop (``off_loop``), so one login, or a stream of wrong passwords, stalls nobody else.
SLOW_METHODS = frozenset({METHOD_BASIC})

# Pulsar class name -> (module under compactmq.auth, class). Loaded only when configured.
PROVIDERS: dict[str, tuple[str, str]] = {
    PROVIDER_TOKEN: ("token_provider", "TokenAuthenticationProvider"),
    PROVIDER_TLS: ("tls_provider", "TlsAuthenticationProvider"),
    PROVIDER_BASIC: ("basic", "BasicAuthenticationProvider"),
}


@dataclass(frozen=True)
class Principal:
    """Who a connection or request is. ``role`` None means not authenticated (authentication
    is off and no anonymous role is set); ``expires_at`` is when the credential stops being
    valid (epoch seconds, a token's ``exp``), None when it does not expire."""

    role: str | None
    method: str
    expires_at: float | None = None


class AuthenticationProvider(Protocol):
    """One way of proving a role.

    ``method`` is the name on the wire (``auth_method_name``). ``authenticate`` gets CONNECT's
    ``auth_data`` (for HTTP: the token after ``Bearer``, or the decoded ``user:password`` of
    ``Basic``) and the verified client certificate in ``ssl.SSLSocket.getpeercert()`` form, or
    None. Returns the ``Principal``; raises ``AuthenticationFailed`` with a reason.
    """

    method: str

    def authenticate(self, data: bytes, peer_cert: dict | None) -> Principal: ...


def _load_provider(class_name: str, config: Mapping[str, Any], environ: Mapping[str, str]) -> Any:
    if class_name not in PROVIDERS:
        known = ", ".join(sorted(PROVIDERS))
        raise InvalidConfiguration(
            f"authenticationProviders: unknown provider {class_name!r} (known: {known})"
        )
    module_name, cls_name = PROVIDERS[class_name]
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, cls_name).from_config(config, environ)


class AuthenticationService:
    """The configured providers, and the rules for picking one (see the module docstring)."""

    def __init__(
        self,
        providers: Mapping[str, Any] | None = None,
        *,
        enabled: bool = True,
        anonymous_role: str | None = None,
        clock_skew_seconds: float = 0,
        clock: Any = time.time,
    ):
        self.providers: dict[str, Any] = dict(providers or {})
        self.enabled = enabled
        self.anonymous_role = anonymous_role or None
        self.clock_skew_seconds = clock_skew_seconds
        self._clock = clock

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> AuthenticationService:
        """Build the providers named in ``authenticationProviders`` (when authentication is
        enabled). Bad keys, unreadable key files or a bad htpasswd file raise
        ``InvalidConfiguration`` before the broker accepts anyone."""
        import os

        enabled = bool(config["authenticationEnabled"])
        anonymous = config["anonymousUserRole"] or None
        providers: dict[str, Any] = {}
        if enabled:
            for class_name in config_list(config, "authenticationProviders"):
                provider = _load_provider(class_name, config, os.environ if environ is None else environ)
                providers[provider.method] = provider
            if not providers and anonymous is None:
                raise InvalidConfiguration(
                    "authenticationEnabled=true needs authenticationProviders (or an anonymousUserRole)"
                )
        return cls(
            providers,
            enabled=enabled,
            anonymous_role=anonymous,
            clock_skew_seconds=config["tokenAllowedClockSkewSeconds"],
        )

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self.providers)

    def authenticate_connect(self, method: str, data: bytes, peer_cert: dict | None) -> Principal:
        """The principal of CONNECT's ``auth_method_name``/``auth_data`` (and the verified
        client certificate of a TLS connection)."""
        if not self.enabled:
            return Principal(None, METHOD_NONE, None)
        method = (method or "").strip()
        if method in ("", METHOD_NONE) and not data:
            if peer_cert and METHOD_TLS in self.providers:
                return self.providers[METHOD_TLS].authenticate(b"", peer_cert)
            return self._anonymous()
        provider = self.providers.get(method)
        if provider is None and self.anonymous_role is not None:
            # Pulsar's ServerCnx: a method no provider has falls back to the anonymous role
            # (its credential is not looked at), so authorization decides what it may do
            return self._anonymous()
        if provider is None:
            raise AuthenticationFailed(
                f"authentication method {method!r} is not enabled on this broker; "
                f"it accepts: {self._accepted()}"
            )
        return provider.authenticate(bytes(data or b""), peer_cert)

    def authenticate_http(self, authorization: str | None, peer_cert: dict | None) -> Principal:
        """The principal of an HTTP request: ``Authorization: Bearer <jwt>`` (token), ``Basic
        <base64 user:password>`` (basic), else the verified client certificate (tls), else the
        anonymous role."""
        if not self.enabled:
            return Principal(None, METHOD_NONE, None)
        header = (authorization or "").strip()
        if header:
            scheme, _, credentials = header.partition(" ")
            scheme = scheme.lower()
            credentials = credentials.strip()
            if scheme == "bearer":
                return self.authenticate_connect(METHOD_TOKEN, credentials.encode(), peer_cert)
            if scheme == "basic":
                return self.authenticate_connect(METHOD_BASIC, _decode_basic(credentials), peer_cert)
            raise AuthenticationFailed(
                f"unsupported Authorization scheme {scheme!r}: use Bearer <token> or Basic <credentials>"
            )
        if peer_cert and METHOD_TLS in self.providers:
            return self.providers[METHOD_TLS].authenticate(b"", peer_cert)
        return self._anonymous()

    def refresh(self, previous: Principal, method: str, data: bytes, peer_cert: dict | None) -> Principal:
        """A fresh credential for a live connection (AUTH_RESPONSE). The role may not change."""
        fresh = self.authenticate_connect(method or previous.method, data, peer_cert)
        if fresh.role != previous.role:
            raise AuthenticationFailed("the role cannot change when credentials are refreshed")
        return fresh

    def is_expired(self, principal: Principal, now: float | None = None) -> bool:
        """Whether the credential behind ``principal`` has expired (beyond the allowed skew)."""
        if principal.expires_at is None:
            return False
        now = self._clock() if now is None else now
        return now > principal.expires_at + self.clock_skew_seconds

    def _anonymous(self) -> Principal:
        if self.anonymous_role is not None:
            return Principal(self.anonymous_role, METHOD_ANONYMOUS, None)
        raise AuthenticationFailed(f"authentication required; this broker accepts: {self._accepted()}")

    def _accepted(self) -> str:
        return ", ".join(self.providers) or "no credentials (anonymous role only)"


def http_method(authorization: str | None) -> str | None:
    """The method an HTTP ``Authorization`` header names (``Bearer``: token, ``Basic``: basic),
    None without one or for another scheme (``authenticate_http`` refuses those)."""
    scheme = (authorization or "").strip().partition(" ")[0].lower()
    return {"bearer": METHOD_TOKEN, "basic": METHOD_BASIC}.get(scheme)


async def off_loop(check: Callable[[], Principal]) -> Principal:
    """Run a slow check (``SLOW_METHODS``) on the event loop's default executor: not on the
    loop, and not on storage's threads either, which password hashing must not take."""
    return await asyncio.get_running_loop().run_in_executor(None, check)


def _decode_basic(credentials: str) -> bytes:
    import base64
    import binascii

    try:
        return base64.b64decode(credentials, validate=True)
    except (binascii.Error, ValueError):
        raise AuthenticationFailed("Basic credentials are not valid base64 of user:password") from None


__all__ = [
    "PROVIDERS",
    "SLOW_METHODS",
    "AuthenticationProvider",
    "AuthenticationService",
    "Principal",
    "http_method",
    "off_loop",
]
