"""Grants and tenant roles over REST, with Pulsar's paths and bodies:

* ``GET  /admin/v2/namespaces/{tenant}/{namespace}/permissions`` -- ``{role: [actions]}``;
* ``POST /admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}`` -- body: a JSON list of
  actions (``produce``, ``consume``, ``functions``, ``packages``, ``sinks``, ``sources``); it
  replaces the role's namespace grant;
* ``DELETE .../permissions/{role}`` -- removes it;
* the same three on a topic, ``/admin/v2/{domain}/{tenant}/{namespace}/{topic}/permissions[/{role}]``;
  a topic's ``GET`` answers the namespace grants merged with the topic's own, as Pulsar does, and
  revoking a role that has no grant on the topic itself is 412.

All of them are tenant administration (the tenant's ``adminRoles`` or a superuser). The grants
themselves live in the namespace policy ``auth_policies`` and are read by
``compactmq.auth.authorization``, which this module only calls.

Also here, because they decide who may do what: the tenant info body (``adminRoles``,
``allowedClusters``, which must name clusters that exist: 412 otherwise) and the namespace
creation body, whose ``auth_policies.namespace_auth`` grants are stored with the new namespace.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..auth.authorization import ACTIONS
from ..errors import InvalidInput, NotFound
from ..naming import TopicName
from .access import TENANT_ADMIN
from .common import Context, PreconditionFailed, read_json
from .router import Router

NS = "/admin/v2/namespaces/{tenant}/{namespace}"
TOPIC = "/admin/v2/{domain}/{tenant}/{namespace}/{topic}"


def add_routes(router: Router) -> None:
    router.add(
        "GET",
        NS + "/permissions",
        get_namespace_permissions,
        "the grants of a namespace: {role: [actions]}",
        requires=TENANT_ADMIN,
    )
    router.add(
        "POST",
        NS + "/permissions/{role}",
        grant_namespace_permission,
        "grant a role actions on every topic of a namespace",
        body="array",
        ok=204,
        requires=TENANT_ADMIN,
    )
    router.add(
        "DELETE",
        NS + "/permissions/{role}",
        revoke_namespace_permission,
        "revoke a role's namespace grant",
        ok=204,
        requires=TENANT_ADMIN,
    )
    router.add(
        "GET",
        TOPIC + "/permissions",
        get_topic_permissions,
        "the grants that apply to a topic (namespace grants and its own)",
        requires=TENANT_ADMIN,
    )
    router.add(
        "POST",
        TOPIC + "/permissions/{role}",
        grant_topic_permission,
        "grant a role actions on one topic",
        body="array",
        ok=204,
        requires=TENANT_ADMIN,
    )
    router.add(
        "DELETE",
        TOPIC + "/permissions/{role}",
        revoke_topic_permission,
        "revoke a role's grant on one topic (412 when it has none there)",
        ok=204,
        requires=TENANT_ADMIN,
    )


# --- bodies ---------------------------------------------------------------------------------------


def parse_actions(body: Any) -> list[str]:
    """A JSON list of Pulsar auth actions (400 otherwise: Pulsar fails to read such a body)."""
    if not isinstance(body, list) or not all(isinstance(a, str) for a in body):
        raise InvalidInput(f"the permissions must be a JSON list of actions ({', '.join(ACTIONS)})")
    # Pulsar's AuthAction values; only produce and consume mean something to compactmq, the others
    # are stored so that a Pulsar operator's grants survive a round trip
    unknown = sorted({a for a in body if a not in ACTIONS})
    if unknown:
        raise InvalidInput(f"unknown action(s) {', '.join(unknown)}: expected {', '.join(ACTIONS)}")
    return sorted(set(body))


def namespace_creation_grants(body: Any) -> dict[str, list[str]]:
    """The ``auth_policies.namespace_auth`` grants of a namespace creation body (a Pulsar
    ``Policies`` object; its other fields are not compactmq's business and are ignored)."""
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise InvalidInput("the namespace policies must be a JSON object")
    auth = body.get("auth_policies") or {}
    if not isinstance(auth, dict):
        raise InvalidInput("auth_policies must be a JSON object")
    grants = auth.get("namespace_auth") or {}
    if not isinstance(grants, dict):
        raise InvalidInput("auth_policies.namespace_auth must be a JSON object {role: [actions]}")
    return {str(role): parse_actions(actions) for role, actions in grants.items()}


def tenant_info(ctx: Context, body: Any) -> dict[str, Any]:
    """Pulsar's ``TenantInfo``: ``{"adminRoles": [...], "allowedClusters": [...]}``, validated.
    No ``allowedClusters`` means this broker's cluster (what pulsar-admin sends by default)."""
    if not isinstance(body, dict):
        raise InvalidInput("the tenant info must be a JSON object")
    cluster = ctx.service.cluster_name
    info = dict(body)
    for key in ("adminRoles", "allowedClusters"):
        value = info.get(key)
        if value is None:
            info[key] = []
        elif not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidInput(f"{key} must be a JSON list of strings")
    info["adminRoles"] = sorted({r.strip() for r in info["adminRoles"] if r.strip()})
    if any(not c.strip() for c in info["allowedClusters"]):
        raise PreconditionFailed("Clusters can not be empty")
    clusters = info["allowedClusters"] or [cluster]
    missing = sorted(set(clusters) - {cluster})
    if missing:
        raise PreconditionFailed(
            f"Clusters do not exist: {', '.join(missing)} (this broker's cluster is {cluster})"
        )
    info["allowedClusters"] = sorted(set(clusters))
    return info


# --- namespace grants -----------------------------------------------------------------------------


async def _namespace(ctx: Context, tenant: str, namespace: str) -> str:
    name = f"{tenant}/{namespace}"
    if not await ctx.run_blocking(ctx.resources.namespaces.exists, name):
        raise NotFound(f"namespace {name} does not exist")
    return name


async def get_namespace_permissions(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
    name = await _namespace(ctx, tenant, namespace)
    return await ctx.run_blocking(ctx.authorization.namespace_permissions, name)


async def grant_namespace_permission(
    ctx: Context, request: web.Request, tenant: str, namespace: str, role: str
) -> Any:
    name = await _namespace(ctx, tenant, namespace)
    actions = parse_actions(await read_json(request, "a JSON list of actions"))
    await ctx.run_blocking(ctx.authorization.grant_namespace_permission, name, role, actions)
    return None


async def revoke_namespace_permission(
    ctx: Context, request: web.Request, tenant: str, namespace: str, role: str
) -> Any:
    name = await _namespace(ctx, tenant, namespace)
    await ctx.run_blocking(ctx.authorization.revoke_namespace_permission, name, role)
    return None


def grant_creation_permissions(ctx: Context, namespace: str, grants: dict[str, list[str]]) -> None:
    """Store a new namespace's ``namespace_auth`` grants (blocking: called through run_blocking)."""
    for role, actions in grants.items():
        ctx.authorization.grant_namespace_permission(namespace, role, actions)


# --- topic grants ---------------------------------------------------------------------------------


async def _topic(ctx: Context, domain: str, tenant: str, namespace: str, topic: str) -> str:
    await _namespace(ctx, tenant, namespace)
    return str(TopicName.parse(f"{domain}://{tenant}/{namespace}/{topic}"))


async def get_topic_permissions(ctx: Context, request: web.Request, **path: str) -> Any:
    topic = await _topic(ctx, **path)
    return await ctx.run_blocking(ctx.authorization.topic_permissions, topic)


async def grant_topic_permission(ctx: Context, request: web.Request, role: str, **path: str) -> Any:
    topic = await _topic(ctx, **path)
    actions = parse_actions(await read_json(request, "a JSON list of actions"))
    await ctx.run_blocking(ctx.authorization.grant_topic_permission, topic, role, actions)
    return None


async def revoke_topic_permission(ctx: Context, request: web.Request, role: str, **path: str) -> Any:
    topic = await _topic(ctx, **path)
    await ctx.run_blocking(_revoke_topic, ctx, topic, role)
    return None


def _revoke_topic(ctx: Context, topic: str, role: str) -> None:
    authorization = ctx.authorization
    if role not in authorization.topic_permissions(topic, include_namespace=False):
        raise PreconditionFailed("Permissions are not set at the topic level")  # Pulsar's answer
    authorization.revoke_topic_permission(topic, role)
