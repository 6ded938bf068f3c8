"""Per-partition answers gathered from each partition's owner (partitioned stats on a cluster).

On one broker every partition of a partitioned topic is here. In a cluster the partitions fall
into bundles that different brokers own, and only a partition's owner has its live state (its
producers, consumers, rates) and may open its managed ledger (the fence). So, as Pulsar's
``partitioned-stats`` does through its admin client, ``gather`` asks each partition of its
owner: a partition this broker owns is answered here (``local``); any other is fetched from its
owner with ``GET`` on the same admin path for the partition (``/stats``, ``/internalStats``).

Where a request may go. The owner comes from the cluster's own lookup (``ClusterService.decide``:
the bundle's ownership record in the metadata store, or the broker the leader picks for an
unowned bundle), and every URL a request is sent to -- the first and each ``307`` hop -- must
be the web URL of a broker *registered* in the metadata store (``/loadbalance/brokers``); the
request's own input (path, query, headers) never chooses a host. A ``307`` (the bundle moved,
or an unowned bundle being assigned) is followed at most ``MAX_HOPS`` times, its
``authoritative`` flag carried as Pulsar's lookup does. The caller's ``Authorization`` header is
passed on, so the owner checks the caller's permissions again; nothing else is.

A partition that does not exist on its owner (404) is left out, as a local one is; any other
failure answers ``503`` naming the partition (the client may ask again).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs, quote, urlsplit

import aiohttp
from aiohttp import web

from ..errors import ServiceNotReady, TopicNotFound
from ..naming import TopicName
from .common import Context

#: 307 hops followed for one partition (moved bundle, then an unowned one being assigned)
MAX_HOPS = 3
#: longest wait for one partition's answer from its owner
FETCH_TIMEOUT_S = 30.0
#: partitions asked at once (a topic of hundreds of partitions does not open hundreds of sockets)
MAX_CONCURRENT = 16


def _origin(url: str) -> str:
    parts = urlsplit(str(url))
    return f"{parts.scheme}://{parts.netloc}".lower()


def _web_url(data: dict[str, Any]) -> str:
    """The plain web URL of an ownership record or a broker registration (its TLS one if none)."""
    return str(
        data.get("httpUrl")
        or data.get("webServiceUrl")
        or data.get("httpUrlTls")
        or data.get("webServiceUrlTls")
        or ""
    )


async def _registered_origins(ctx: Context, cluster: Any) -> set[str]:
    brokers = await ctx.run_blocking(cluster.membership.brokers, cluster.cluster_name)
    out = set()
    for data in brokers.values():
        for key in ("webServiceUrl", "webServiceUrlTls"):
            if data.get(key):
                out.add(_origin(data[key]))
    return out


def _admin_path(tn: TopicName, suffix: str) -> str:
    parts = (tn.domain, tn.tenant, tn.namespace, tn.local_name)
    return "/admin/v2/" + "/".join(quote(p, safe="") for p in parts) + suffix


async def _fetch(
    ctx: Context, cluster: Any, request: web.Request, tn: TopicName, suffix: str, first: Any
) -> Any:
    """The owner's JSON for ``tn`` + ``suffix``; None when the owner says the topic does not exist."""
    registered = await _registered_origins(ctx, cluster)
    base = _web_url(first.target or {})
    authoritative = first.authoritative if first.redirect else True
    headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
    timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(MAX_HOPS + 1):
            origin = _origin(base)
            if origin not in registered:
                raise ServiceNotReady(
                    f"the owner of {tn} ({origin or 'no web URL'}) is not a registered broker"
                )
            url = f"{origin}{_admin_path(tn, suffix)}"
            params = {"authoritative": "true" if authoritative else "false"}
            try:
                async with session.get(url, params=params, headers=headers, allow_redirects=False) as resp:
                    if resp.status == 200:
                        answer = await resp.json()
                        if not isinstance(answer, dict):
                            raise ServiceNotReady(f"stats of {tn} from its owner {origin}: not a JSON object")
                        return answer
                    if resp.status == 404:
                        return None
                    if resp.status != 307:
                        raise ServiceNotReady(f"stats of {tn} from its owner {origin}: HTTP {resp.status}")
                    location = resp.headers.get("Location", "")
            except aiohttp.ClientError as exc:
                raise ServiceNotReady(f"the owner of {tn} ({origin}) did not answer: {exc}") from None
            base = location  # checked against the registered brokers at the top of the loop
            flag = parse_qs(urlsplit(location).query).get("authoritative", ["false"])[0]
            authoritative = flag.lower() == "true"
    raise ServiceNotReady(f"stats of {tn}: more than {MAX_HOPS} redirects; look it up again")


async def gather(
    ctx: Context,
    request: web.Request,
    names: list[str],
    suffix: str,
    local: Callable[[str], Awaitable[Any]],
) -> dict[str, Any]:
    """``{partition: answer}`` for each of ``names`` (in order), each from its owner: ``local(name)``
    here, else ``GET`` of the partition's ``suffix`` path on the owner. Partitions that do not
    exist are left out."""
    cluster = ctx.service.cluster
    slots = asyncio.Semaphore(MAX_CONCURRENT)

    async def one(name: str) -> Any:
        tn = TopicName.parse(name)
        decision = await cluster.decide(tn, False) if cluster is not None else None
        if decision is None or decision.own or decision.target is None:
            try:
                return await local(name)
            except TopicNotFound:
                return None
        async with slots:
            return await _fetch(ctx, cluster, request, tn, suffix, decision)

    answers = await asyncio.gather(*(one(n) for n in names))
    return {name: a for name, a in zip(names, answers) if a is not None}


__all__ = ["gather"]
