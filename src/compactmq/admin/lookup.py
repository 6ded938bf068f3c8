"""The HTTP lookup path: ``GET /lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}``.

A client given an ``http://``/``https://`` service URL (``pulsar.Client("http://host:8080")``)
finds a topic's broker over HTTP instead of the binary LOOKUP command: this path answers
Pulsar's ``LookupData`` body with the broker's URLs (one broker: always this one; in a cluster
the bundle owner's, or a 307 to the broker where the bundle's assignment goes on), and the
client then opens its binary connection there. Its partitioned metadata comes from
``GET /admin/v2/{domain}/.../{topic}/partitions`` (``topics``), and a pattern (regex)
subscription lists a namespace's topics with ``GET /admin/v2/namespaces/{tenant}/{namespace}/topics``
(``?mode=PERSISTENT``, ``NON_PERSISTENT`` or ``ALL``; also ``pulsar-admin namespaces topics``).

They need what the binary commands need: a lookup ``produce`` or ``consume`` on the topic, or
tenant admin (``access.LOOKUP``) -- a role that may not use a topic does not learn where it lives;
then the binary LOOKUP's own rule (``broker.lookup``): the namespace must exist, and a listener
named by the ``listenerName`` query parameter or the ``X-Pulsar-ListenerName`` header must be one
of the broker's ``advertisedListeners``;
the topic list a namespace grant or tenant admin (``access.NAMESPACE_LOOKUP``, as
GET_TOPICS_OF_NAMESPACE). As with the binary command, a lookup does not create the topic;
producing or subscribing does.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..broker.lookup import lookup_topic as broker_lookup
from ..errors import InvalidInput, NotFound
from . import nonpersistent
from .access import LOOKUP, NAMESPACE_LOOKUP
from .cluster import redirect as cluster_redirect
from .common import Context
from .router import Router

PREFIX = "/lookup/v2"
LISTENER_HEADER = "X-Pulsar-ListenerName"
# Pulsar's CommandGetTopicsOfNamespace.Mode names -> the topic name prefixes they select
MODES = {
    "PERSISTENT": ("persistent://",),
    "NON_PERSISTENT": ("non-persistent://",),
    "ALL": ("persistent://", "non-persistent://"),
}


def add_routes(router: Router) -> None:
    router.add(
        "GET",
        PREFIX + "/topic/{domain}/{tenant}/{namespace}/{topic}",
        lookup_topic,
        "the broker that serves a topic (Pulsar's LookupData)",
        requires=LOOKUP,
    )
    router.add(
        "GET",
        "/admin/v2/namespaces/{tenant}/{namespace}/topics",
        namespace_topics,
        "the topics of a namespace, partitions included (?mode=PERSISTENT|NON_PERSISTENT|ALL)",
        requires=NAMESPACE_LOOKUP,
    )


async def lookup_topic(
    ctx: Context, request: web.Request, domain: str, tenant: str, namespace: str, topic: str
) -> Any:
    listener = request.query.get("listenerName") or request.headers.get(LISTENER_HEADER) or None
    authoritative = request.query.get("authoritative", "false").lower() == "true"
    answer = await broker_lookup(
        ctx.service, f"{domain}://{tenant}/{namespace}/{topic}", listener, authoritative
    )
    if answer.redirect:  # a cluster's assignment goes on at another broker (Pulsar answers 307)
        target = {"httpUrl": answer.http_url, "httpUrlTls": answer.http_url_tls}
        return cluster_redirect(request, target, answer.authoritative)
    return answer.as_lookup_data()


async def namespace_topics(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
    mode = request.query.get("mode", "PERSISTENT").strip().upper()
    if mode not in MODES:
        raise InvalidInput(f"unknown mode {mode!r}: expected {', '.join(MODES)}")
    ns = f"{tenant}/{namespace}"
    if not await ctx.run_blocking(ctx.resources.namespaces.exists, ns):
        raise NotFound(f"namespace {ns} does not exist")
    names = await ctx.run_blocking(ctx.topic_metadata.topics, ns)
    names = list(names) + nonpersistent.names(ctx, ns)  # the non-persistent ones in use
    return [n for n in names if n.startswith(MODES[mode])]
