"""The HTTP lookup path: ``GET /lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}``.

A client given an ``http://``/``https://`` service URL (``pulsar.Client("http://host:8080")``)
finds a topic's broker over HTTP instead of the binary LOOKUP command: this path answers
Pulsar's ``LookupData`` body with the broker's URLs (one broker: always this one), and the
client then opens its binary connection there. Its partitioned metadata comes from
``GET /admin/v2/{domain}/.../{topic}/partitions`` (``topics``).

Both need what the binary LOOKUP needs (``access.LOOKUP``): ``produce`` or ``consume`` on the
topic, or tenant admin -- a role that may not use a topic does not learn where it lives. As with
the binary command, a lookup does not create the topic; producing or subscribing does.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..naming import TopicName
from .access import LOOKUP
from .common import Context
from .router import Router

PREFIX = "/lookup/v2"


def add_routes(router: Router) -> None:
    router.add("GET", PREFIX + "/topic/{domain}/{tenant}/{namespace}/{topic}", lookup_topic,
               "the broker that serves a topic (Pulsar's LookupData)", requires=LOOKUP)


async def lookup_topic(ctx: Context, request: web.Request, domain: str, tenant: str, namespace: str,
                       topic: str) -> Any:
    TopicName.parse(f"{domain}://{tenant}/{namespace}/{topic}")  # a bad name is 412, as elsewhere
    service = ctx.service
    return {
        "brokerUrl": service.broker_url,
        "brokerUrlTls": getattr(service, "broker_url_tls", None) or "",
        "httpUrl": getattr(service, "web_url", None) or "",
        "httpUrlTls": getattr(service, "web_url_tls", None) or "",
        "nativeUrl": service.broker_url,
    }
