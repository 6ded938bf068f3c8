"""Tenant and namespace paths: ``/admin/v2/tenants[/{tenant}]`` and
``/admin/v2/namespaces/{tenant}[/{namespace}[/{policy}]]``.

``public/default`` exists from the start (the metadata store bootstraps it). A namespace policy
applies to every topic of the namespace that has no topic policy of its own.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..auth.policy_rules import Target, check_policy_values
from ..config.policy_keys import DEFAULT_SETTINGS
from ..errors import AlreadyExists, Conflict, InvalidInput, NotFound
from ..naming import _NAMED_ENTITY
from ..storage import COMPACTION_THRESHOLD
from .cluster import initial_bundles
from .common import Context, PreconditionFailed, query_flag, read_json
from .permissions import grant_creation_permissions, namespace_creation_grants, tenant_info
from .policies import POLICIES, Policy, applied_values
from .router import Router
from .topics import ensure_compaction_cursors

NS = "/admin/v2/namespaces/{tenant}/{namespace}"


def add_routes(router: Router) -> None:
    router.add("GET", "/admin/v2/tenants", list_tenants, "list tenants")
    router.add("GET", "/admin/v2/tenants/{tenant}", get_tenant, "a tenant's info")
    router.add("PUT", "/admin/v2/tenants/{tenant}", create_tenant, "create a tenant", body="object", ok=204)
    router.add(
        "POST", "/admin/v2/tenants/{tenant}", update_tenant, "update a tenant's info", body="object", ok=204
    )
    router.add(
        "DELETE", "/admin/v2/tenants/{tenant}", delete_tenant, "delete a tenant with no namespaces", ok=204
    )
    router.add("GET", "/admin/v2/clusters", list_clusters, "clusters (always the one standalone cluster)")
    router.add(
        "PUT",
        "/admin/v2/clusters/{cluster}",
        create_cluster,
        "create a cluster: this broker's exists already (409), others cannot be added (412)",
        ok=204,
    )
    router.add("GET", "/admin/v2/namespaces/{tenant}", list_namespaces, "list the namespaces of a tenant")
    router.add("GET", NS, get_namespace_policies, "every policy of a namespace")
    router.add("PUT", NS, create_namespace, "create a namespace", ok=204)
    router.add("DELETE", NS, delete_namespace, "delete an empty namespace", ok=204)
    for policy in POLICIES:
        _add_policy_routes(router, policy)


def _check_name(what: str, name: str) -> None:
    if not _NAMED_ENTITY.match(name):
        raise PreconditionFailed(
            f"invalid {what} name {name!r}: only letters, digits and - _ = : . are allowed"
        )


# --- tenants --------------------------------------------------------------------------------------


async def list_clusters(ctx: Context, request: web.Request) -> Any:
    return [ctx.service.cluster_name]


async def create_cluster(ctx: Context, request: web.Request, cluster: str) -> Any:
    """Setup scripts written for Pulsar PUT the ``standalone`` cluster first (the Python client's
    CI does): it exists from the start here, so this answers Pulsar's 409 for an existing one."""
    own = ctx.service.cluster_name
    if cluster == own:
        raise AlreadyExists(f"Cluster {cluster} already exists")
    raise PreconditionFailed(f"this broker serves one cluster, {own}; cluster {cluster!r} cannot be added")


async def list_tenants(ctx: Context, request: web.Request) -> Any:
    return sorted(await ctx.run_blocking(ctx.resources.tenants.list_tenants))


async def get_tenant(ctx: Context, request: web.Request, tenant: str) -> Any:
    info = await ctx.run_blocking(ctx.resources.tenants.get, tenant)
    if info is None:
        raise NotFound(f"tenant {tenant} does not exist")
    info.setdefault("adminRoles", [])
    info.setdefault("allowedClusters", [ctx.service.cluster_name])
    return info


async def _tenant_info(request: web.Request) -> dict:
    raw = await request.read()
    if not raw.strip():
        return {}
    body = await read_json(request, "the tenant info object")
    if not isinstance(body, dict):
        raise InvalidInput("the tenant info must be a JSON object")
    return body


async def create_tenant(ctx: Context, request: web.Request, tenant: str) -> Any:
    _check_name("tenant", tenant)
    info = tenant_info(ctx, await _tenant_info(request))
    await ctx.run_blocking(ctx.resources.tenants.create, tenant, info)
    return None


async def update_tenant(ctx: Context, request: web.Request, tenant: str) -> Any:
    info = tenant_info(ctx, await _tenant_info(request))
    await ctx.run_blocking(ctx.resources.tenants.update, tenant, lambda _old: info)
    return None


async def delete_tenant(ctx: Context, request: web.Request, tenant: str) -> Any:
    await ctx.run_blocking(ctx.resources.tenants.delete, tenant)
    return None


# --- namespaces -----------------------------------------------------------------------------------


async def list_namespaces(ctx: Context, request: web.Request, tenant: str) -> Any:
    if await ctx.run_blocking(ctx.resources.tenants.get, tenant) is None:
        raise NotFound(f"tenant {tenant} does not exist")
    return sorted(await ctx.run_blocking(ctx.resources.namespaces.list_namespaces, tenant))


async def _require(ctx: Context, namespace: str) -> None:
    if not await ctx.run_blocking(ctx.resources.namespaces.exists, namespace):
        raise NotFound(f"namespace {namespace} does not exist")


async def create_namespace(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
    _check_name("namespace", namespace)
    name = f"{tenant}/{namespace}"
    if await ctx.run_blocking(ctx.resources.tenants.get, tenant) is None:
        raise NotFound(f"tenant {tenant} does not exist")
    if await ctx.run_blocking(ctx.resources.namespaces.exists, name):
        raise AlreadyExists(f"namespace {name} already exists")
    raw = await request.read()  # optional: a Pulsar Policies object
    body = await read_json(request, "the namespace policies") if raw.strip() else None
    grants = namespace_creation_grants(body)
    # the bundle split asked for (Pulsar's Policies.bundles), else fixed on first use (cluster)
    await ctx.run_blocking(ctx.resources.namespaces.create, name, initial_bundles(body))
    if grants:
        await ctx.run_blocking(grant_creation_permissions, ctx, name, grants)
    return None


async def delete_namespace(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
    name = f"{tenant}/{namespace}"
    await _require(ctx, name)
    partitioned = await ctx.run_blocking(ctx.storage.partitioned_topics, name)
    if partitioned:
        raise Conflict(f"namespace {name} still has partitioned topics: {', '.join(partitioned)}")
    await ctx.run_blocking(ctx.storage.delete_namespace, name)
    return None


async def get_namespace_policies(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
    name = f"{tenant}/{namespace}"
    await _require(ctx, name)
    own = await ctx.run_blocking(ctx.policies.get_namespace_policies, name)
    return {p.namespace_path or p.path: p.render(own) for p in POLICIES}


def _add_policy_routes(router: Router, policy: Policy) -> None:
    async def get_policy(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
        name = f"{tenant}/{namespace}"
        await _require(ctx, name)
        own = await ctx.run_blocking(ctx.policies.get_namespace_policies, name)
        if query_flag(request, "applied"):
            return policy.render(applied_values(policy, own, None, ctx.service.config))
        return policy.render(own)

    async def set_policy(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
        name = f"{tenant}/{namespace}"
        await _require(ctx, name)
        values = policy.parse(await read_json(request, policy.summary))
        # every value through its rule (auth.policy_rules), off the event loop (realpath)
        values = await ctx.run_blocking(check_policy_values, values, Target(ctx.service.config, name))
        await ctx.run_blocking(_set_namespace_policies, ctx, name, values)
        await ctx.service.topics.policies_changed(name)
        return None

    async def remove_policy(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
        name = f"{tenant}/{namespace}"
        await _require(ctx, name)
        await ctx.run_blocking(ctx.policies.set_policies, "namespace", name, {k: None for k in policy.keys})
        await ctx.service.topics.policies_changed(name)
        return None

    for fn, verb in ((get_policy, "get"), (set_policy, "set"), (remove_policy, "remove")):
        fn.__name__ = f"{verb}_namespace_{policy.path}"
    pattern = f"{NS}/{policy.namespace_path or policy.path}"
    router.add("GET", pattern, get_policy, f"namespace policy: {policy.summary}")
    router.add(
        "PUT",
        pattern,
        set_policy,
        f"set the namespace policy: {policy.summary}",
        body=policy.body_type,
        ok=204,
    )
    router.add(
        "POST",
        pattern,
        set_policy,
        f"set the namespace policy: {policy.summary}",
        body=policy.body_type,
        ok=204,
    )
    router.add("DELETE", pattern, remove_policy, f"remove the namespace policy: {policy.summary}", ok=204)


def _set_namespace_policies(ctx: Context, namespace: str, values: dict[str, Any]) -> None:
    ctx.policies.set_policies("namespace", namespace, values)
    if (values.get(COMPACTION_THRESHOLD) or 0) > 0:
        default = ctx.service.config[DEFAULT_SETTINGS[COMPACTION_THRESHOLD]]
        topics = [
            t
            for t in ctx.topic_metadata.topics(namespace)
            if (ctx.policies.effective_policy(t, COMPACTION_THRESHOLD, default) or 0) > 0
        ]
        ensure_compaction_cursors(ctx, topics)
