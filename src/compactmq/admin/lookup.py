"""HTTP topic lookup, so ``pulsar.Client("http://host:8080")`` works:
``GET /lookup/v2/topic/{persistent|non-persistent}/{tenant}/{namespace}/{topic}`` answers
Pulsar's ``LookupData`` JSON (``brokerUrl``, ``brokerUrlTls``, ``httpUrl``, ``httpUrlTls``,
``nativeUrl``); the client then speaks the binary protocol to ``brokerUrl``. Its other HTTP
request, the partitioned metadata (``GET /admin/v2/{domain}/{t}/{ns}/{topic}/partitions``), is a
topic path (``topics``).

The rule is the binary LOOKUP's (``broker.lookup``): the namespace must exist, and a listener
named by the ``listenerName`` query parameter or the ``X-Pulsar-ListenerName`` header must be
one of the broker's ``advertisedListeners``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..broker.lookup import lookup_topic
from .common import Context
from .router import Router

LISTENER_HEADER = "X-Pulsar-ListenerName"


def add_routes(router: Router) -> None:
    router.add("GET", "/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}", lookup,
               "the broker serving a topic (Pulsar's LookupData)")


async def lookup(ctx: Context, request: web.Request, domain: str, tenant: str, namespace: str,
                 topic: str) -> Any:
    listener = request.query.get("listenerName") or request.headers.get(LISTENER_HEADER) or None
    answer = await lookup_topic(ctx.service, f"{domain}://{tenant}/{namespace}/{topic}", listener)
    return answer.as_lookup_data()
