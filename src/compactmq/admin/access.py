"""Who may call which admin path: authentication of each request and the requirement each route
declares, checked in one place (the dispatcher in ``app``), never inside a handler.

Authentication turns the request's credentials into a role: the ``Authorization`` header
(``Bearer <jwt>`` or ``Basic <base64>``) or, on the TLS web port, the verified client
certificate. ``compactmq.auth`` does the work; a failure answers 401 with ``{"reason"}`` and a
``WWW-Authenticate`` header. When ``authenticationEnabled`` is false every request passes with no
role, exactly as before security existed.

Authorization follows Pulsar's rules for the admin API:

* tenant and cluster operations need a superuser (``superUserRoles``);
* namespace and topic administration -- policies, compaction trigger and status, permissions,
  creating and deleting -- needs an admin role of the tenant (``adminRoles``) or a superuser;
* a topic's partitioned metadata (``GET .../partitions``, the HTTP side of a lookup), its
  schemas (``GET``, Pulsar's GET_METADATA topic operation: any consumer receives the schema on
  the wire anyway) and its stats (``stats``, ``partitioned-stats``, ``internalStats``: Pulsar's
  GET_STATS topic operation, which the Spark source plans its splits with) need what a lookup
  needs: ``produce`` or ``consume`` on the topic, or tenant admin; listing a namespace's
  topics needs a namespace grant of ``produce`` or ``consume``, or tenant admin.

A route states its requirement with ``Router.add(..., requires=...)``; a route that does not is
given one by ``default_requirement`` from its path: a path under ``/admin/v2/tenants`` or
``/admin/v2/clusters`` needs a superuser, any other path that names a tenant needs its admin, and
anything else needs a superuser (so a route added without thought is closed, not open). A
requirement is a ``Requirement`` or any callable ``(authorization, role, captures) -> None`` that
raises ``AuthorizationFailed``; the checks read SQLite, so the dispatcher runs them through
``run_blocking``. When ``authorizationEnabled`` is false no check runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..naming import TopicName

if TYPE_CHECKING:
    from ..auth import AuthenticationService

Check = Callable[[Any, "str | None", Mapping[str, str]], None]


@dataclass(frozen=True)
class Requirement:
    """A named authorization check on a route (the name shows in the OpenAPI document)."""

    name: str
    check: Check

    def __call__(self, authorization: Any, role: str | None, captures: Mapping[str, str]) -> None:
        self.check(authorization, role, captures)


def _topic(captures: Mapping[str, str]) -> str:
    domain = captures.get("domain", "persistent")  # schema paths name no domain
    return str(
        TopicName.parse(f"{domain}://{captures['tenant']}/{captures['namespace']}/{captures['topic']}")
    )


def _lookup(authorization: Any, role: str | None, captures: Mapping[str, str]) -> None:
    authorization.check_lookup(role, _topic(captures))


def _consume(authorization: Any, role: str | None, captures: Mapping[str, str]) -> None:
    authorization.check_consume(role, _topic(captures))


def _namespace_lookup(authorization: Any, role: str | None, captures: Mapping[str, str]) -> None:
    authorization.check_namespace_lookup(role, f"{captures['tenant']}/{captures['namespace']}")


AUTHENTICATED = Requirement("authenticated", lambda authorization, role, captures: None)
SUPERUSER = Requirement(
    "superuser", lambda authorization, role, captures: authorization.check_superuser(role)
)
TENANT_ADMIN = Requirement(
    "tenant-admin",
    lambda authorization, role, captures: authorization.check_tenant_admin(role, captures["tenant"]),
)
LOOKUP = Requirement("lookup", _lookup)
# reading a message as a consumer would receive it (a key's latest value): consume on the topic
CONSUME = Requirement("consume", _consume)
NAMESPACE_LOOKUP = Requirement("namespace-lookup", _namespace_lookup)

_SUPERUSER_PREFIXES = ("/admin/v2/tenants", "/admin/v2/clusters")


def default_requirement(method: str, pattern: str) -> Requirement:
    """The requirement of a route that declares none (see the module notes)."""
    if pattern.startswith(_SUPERUSER_PREFIXES):
        return SUPERUSER
    if "{tenant}" in pattern.split("/"):
        return TENANT_ADMIN
    return SUPERUSER


def requirement_name(requires: Any) -> str:
    """The name the OpenAPI document shows: a ``Requirement``'s, else the function's (a route
    may state any callable, see the module notes, so both are looked for)."""
    return str(getattr(requires, "name", None) or getattr(requires, "__name__", "custom"))


def www_authenticate(authentication: AuthenticationService) -> str:
    """The ``WWW-Authenticate`` value of a 401: the HTTP schemes the broker accepts."""
    methods = set(authentication.methods or ("token",))
    schemes = []
    if "token" in methods or not methods - {"tls"}:
        schemes.append('Bearer realm="pulsar"')
    if "basic" in methods:
        schemes.append('Basic realm="pulsar"')
    return ", ".join(schemes)
