"""Admin paths of a cluster of brokers, and the 307 that sends a topic's admin call to its owner.

================================================================  ==============================
``GET  /admin/v2/brokers/leaderBroker``                           the leader (``brokerId``, ``serviceUrl``)
``GET  /admin/v2/brokers/{cluster}``                              live brokers, as ``host:webport``
``GET  /admin/v2/brokers/{cluster}/{broker}/ownedNamespaces``     bundles a broker owns
``GET  /admin/v2/namespaces/{t}/{ns}/bundles``                    Pulsar's ``BundlesData``
``PUT  /admin/v2/namespaces/{t}/{ns}/{bundle}/unload``            hand a bundle back (``?destinationBroker=``)
``PUT  /admin/v2/namespaces/{t}/{ns}/unload``                     every bundle, each on its owner
``PUT  /admin/v2/{domain}/{t}/{ns}/{topic}/unload``               close a topic (clients reconnect)
================================================================  ==============================

On one broker (no ``service.cluster``) these answer for the one broker: it is the only one
listed, it owns every bundle, and an unload closes the topics (the next client reloads them).

**Redirects** (``redirect_to_owner``, called by the dispatcher for every route): a call naming a
topic (``{domain}/{tenant}/{namespace}/{topic}``) that this broker does not serve answers ``307``
with ``Location`` on the owner's web URL (its ``https://`` one when the request came over TLS), the
same path and query, and ``authoritative`` as the lookup decided (Pulsar's
``validateTopicOwnership``). Partitioned-topic metadata (``.../partitions``) is served by any
broker, as in Pulsar. A bundle unload goes to the bundle's owner the same way.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from ..broker.cluster.bundles import (
    all_bundles,
    boundaries_for,
    bundle_of,
    bundles_data,
    parse_bundles_data,
    parse_range,
    stored_boundaries,
)
from ..broker.cluster.settle import settled_decision
from ..errors import NotFound, PreconditionFailed, ServiceNotReady
from ..naming import TopicName
from .common import Context

#: topic routes any broker serves (partitioned metadata lives in the shared store)
_ANY_BROKER_SUFFIXES = ("/partitions", "/partitioned-stats", "/partitioned-internalStats")
TOPIC = "/admin/v2/{domain}/{tenant}/{namespace}/{topic}"
#: longest wait for another broker to unload a bundle a namespace unload sent it
FORWARD_TIMEOUT_S = 30.0


def add_routes(router: Any) -> None:
    router.add("GET", "/admin/v2/brokers/leaderBroker", leader_broker, "the leader broker of the cluster")
    router.add(
        "GET", "/admin/v2/brokers/{cluster}", list_brokers, "the live brokers of a cluster (host:port)"
    )
    router.add(
        "GET",
        "/admin/v2/brokers/{cluster}/{broker}/ownedNamespaces",
        owned_namespaces,
        "the bundles a broker owns",
    )
    router.add(
        "GET", "/admin/v2/namespaces/{tenant}/{namespace}/bundles", get_bundles, "a namespace's bundles"
    )
    router.add(
        "PUT",
        "/admin/v2/namespaces/{tenant}/{namespace}/{bundle}/unload",
        unload_bundle,
        "unload a bundle: its owner closes its topics and gives it up (?destinationBroker=host:port)",
        ok=204,
    )
    router.add(
        "PUT",
        "/admin/v2/namespaces/{tenant}/{namespace}/unload",
        unload_namespace,
        "unload every bundle of a namespace (each on its owner)",
        ok=204,
    )
    router.add("PUT", TOPIC + "/unload", unload_topic, "unload a topic: close it on its owner", ok=204)


def initial_bundles(body: Any) -> dict[str, Any]:
    """The policies a new namespace starts with: its ``bundles`` when the creation's body (a Pulsar
    ``Policies``) gives ``{"numBundles": n}`` or ``{"boundaries": [...]}``; 412 when malformed."""
    if not isinstance(body, dict) or body.get("bundles") is None:
        return {}
    given = body["bundles"]
    if not isinstance(given, dict):
        raise PreconditionFailed("bundles must be an object: {numBundles: n} or {boundaries: [...]}")
    if given.get("boundaries"):
        boundaries = parse_bundles_data(given)
        if boundaries is None:
            raise PreconditionFailed(
                "bundles.boundaries must be ascending 0x%08x values from 0x00000000 to 0xffffffff"
            )
        return {"bundles": bundles_data(boundaries)}
    n = given.get("numBundles")
    if isinstance(n, bool) or not isinstance(n, int):
        raise PreconditionFailed(f"bundles.numBundles must be an integer, not {n!r:.40}")
    return {"bundles": bundles_data(boundaries_for(n))}


def _cluster(ctx: Context) -> Any:
    return ctx.service.cluster


def _own_id(ctx: Context) -> str:
    cluster = _cluster(ctx)
    if cluster is not None:
        return cluster.broker_id
    url = ctx.service.web_url or ctx.service.web_url_tls or ""
    return url.split("://", 1)[-1]


async def _boundaries(ctx: Context, namespace: str) -> list[int]:
    cluster = _cluster(ctx)
    if cluster is not None:
        return await cluster.boundaries(namespace)
    if not await ctx.run_blocking(ctx.resources.namespaces.exists, namespace):
        raise NotFound(f"namespace {namespace} does not exist")
    n = int(ctx.service.config.get("defaultNumberOfNamespaceBundles") or 4)
    return await ctx.run_blocking(stored_boundaries, ctx.resources.namespaces, namespace, n)


async def _brokers(ctx: Context) -> dict[str, dict[str, Any]]:
    cluster = _cluster(ctx)
    if cluster is None:
        owned: list[str] = []  # one broker: it owns every bundle, none is recorded
        return {_own_id(ctx): {"webServiceUrl": ctx.service.web_url or "", "bundles": owned}}
    return await ctx.run_blocking(cluster.membership.brokers, cluster.cluster_name)


async def leader_broker(ctx: Context, request: web.Request) -> Any:
    cluster = _cluster(ctx)
    if cluster is None:
        return {"brokerId": _own_id(ctx), "serviceUrl": ctx.service.web_url or ""}
    got = await ctx.run_blocking(cluster.resources.leader.leader)
    if got is None:
        raise NotFound("the cluster has no leader right now")
    return got[0]


async def list_brokers(ctx: Context, request: web.Request, cluster: str) -> Any:
    if cluster != ctx.service.cluster_name:
        raise NotFound(f"cluster {cluster} does not exist (this broker is in {ctx.service.cluster_name})")
    return sorted(await _brokers(ctx))


async def owned_namespaces(ctx: Context, request: web.Request, cluster: str, broker: str) -> Any:
    if cluster != ctx.service.cluster_name:
        raise NotFound(f"cluster {cluster} does not exist (this broker is in {ctx.service.cluster_name})")
    brokers = await _brokers(ctx)
    if broker not in brokers:
        raise NotFound(f"broker {broker} is not a live broker of {cluster}")
    status = {"broker_assignment": "shared", "is_controlled": False, "is_active": True}
    me = _cluster(ctx)
    names = (
        [str(b) for b in sorted(me.owned)] if me is not None and broker == me.broker_id else
        list(brokers[broker].get("bundles") or ())
    )  # fmt: skip
    return {name: dict(status) for name in names}


async def get_bundles(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
    return bundles_data(await _boundaries(ctx, f"{tenant}/{namespace}"))


async def unload_bundle(ctx: Context, request: web.Request, tenant: str, namespace: str, bundle: str) -> Any:
    ns = f"{tenant}/{namespace}"
    boundaries = await _boundaries(ctx, ns)
    target = parse_range(ns, boundaries, bundle)  # 412 unless it is one of the namespace's
    cluster = _cluster(ctx)
    if cluster is None:
        await _close_loaded(ctx, target, boundaries)
        return None
    if target in cluster.owned:
        await cluster.unload_bundle(target, request.query.get("destinationBroker") or None)
        return None
    owner = await cluster.owner_of(target)
    if owner is None:
        return None  # nobody owns it: nothing to unload (Pulsar answers the same)
    return redirect(request, owner, authoritative=True)


async def unload_namespace(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
    """Each bundle: unloaded here when owned here, else the same PUT is sent to its owner (with
    the caller's credentials, which the owner checks again)."""
    ns = f"{tenant}/{namespace}"
    boundaries = await _boundaries(ctx, ns)
    cluster = _cluster(ctx)
    for bundle in all_bundles(ns, boundaries):
        if cluster is None:
            await _close_loaded(ctx, bundle, boundaries)
        elif bundle in cluster.owned:
            await cluster.unload_bundle(bundle)
        else:
            owner = await cluster.owner_of(bundle)
            if owner is not None:
                await _forward_unload(request, owner, bundle)
    return None


async def _forward_unload(request: web.Request, owner: dict[str, Any], bundle: Any) -> None:
    base = str(owner.get("httpUrl") or owner.get("httpUrlTls") or "").rstrip("/")
    if not base:
        raise ServiceNotReady(f"the owner of {bundle} advertises no web URL")
    tenant, _, name = bundle.namespace.partition("/")
    url = f"{base}/admin/v2/namespaces/{tenant}/{name}/{bundle.range}/unload"
    headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
    timeout = aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            async with session.put(url, headers=headers, allow_redirects=False) as resp:
                if resp.status >= 400:
                    raise ServiceNotReady(f"unloading {bundle} on its owner failed: HTTP {resp.status}")
        except aiohttp.ClientError as exc:
            raise ServiceNotReady(f"the owner of {bundle} did not answer: {exc}") from None


async def _close_loaded(ctx: Context, target: Any, boundaries: list[int]) -> None:
    for name, topic in list(ctx.service.topics.loaded.items()):
        tn = topic.topic_name
        if tn.namespace_name == target.namespace and bundle_of(target.namespace, boundaries, name) == target:
            await ctx.service.topics.unload(name, close_ledger=True)


async def unload_topic(ctx: Context, request: web.Request, **path: str) -> Any:
    tn = TopicName.parse(f"{path['domain']}://{path['tenant']}/{path['namespace']}/{path['topic']}")
    if not await ctx.run_blocking(ctx.resources.namespaces.exists, tn.namespace_name):
        raise NotFound(f"namespace {tn.namespace_name} does not exist")
    await ctx.service.topics.unload(str(tn), close_ledger=True)
    return None


def redirect(request: web.Request, target: dict[str, Any], authoritative: bool) -> web.Response:
    """307 to the same path and query on ``target``'s web URL (``NamespaceEphemeralData`` or
    ``LocalBrokerData``), with ``authoritative`` set as Pulsar sets it."""
    tls = request.scheme == "https"
    plain = target.get("httpUrl") or target.get("webServiceUrl") or ""
    secure = target.get("httpUrlTls") or target.get("webServiceUrlTls") or ""
    base = (secure or plain) if tls else (plain or secure)
    if not base:
        raise NotFound("the owner of this topic advertises no web URL")
    query = [(k, v) for k, v in request.query.items() if k != "authoritative"]
    query.append(("authoritative", "true" if authoritative else "false"))
    location = f"{str(base).rstrip('/')}{request.rel_url.raw_path}?{urlencode(query)}"
    return web.Response(status=307, headers={"Location": location})


async def redirect_to_owner(ctx: Context, request: web.Request, pattern: str, captures: dict) -> Any:
    """A 307 response when the route names a topic another broker serves; None to go on here."""
    cluster = _cluster(ctx)
    if cluster is None or "topic" not in captures or "domain" not in captures:
        return None
    if not pattern.startswith("/admin/") or pattern.endswith(_ANY_BROKER_SUFFIXES):
        return None  # the lookup path decides for itself
    tn = TopicName.parse(
        f"{captures['domain']}://{captures['tenant']}/{captures['namespace']}/{captures['topic']}"
    )
    authoritative = request.query.get("authoritative", "false").lower() == "true"
    decision = await settled_decision(cluster, tn, authoritative)  # a bundle in flux: waits a little
    if decision.own or decision.target is None:
        return None
    return redirect(request, decision.target, decision.authoritative if decision.redirect else True)


__all__ = ["add_routes", "redirect", "redirect_to_owner"]
