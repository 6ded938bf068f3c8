"""The aiohttp application of the web port: Pulsar admin v2 REST paths, the HTTP lookup path
(``/lookup/v2``), /metrics, OpenAPI.

Thin by design: each handler parses the path and body, calls the broker's services (metadata
store, storage, topic manager, compaction monitor) and returns a JSON-able body. Storage is
synchronous, so every storage call goes through ``service.run_blocking``, never on the loop.

Access, in one place (the ``admin`` dispatcher, see ``access``): every request is authenticated
first (401), then the matched route's requirement is checked for the caller's role (403); no
handler checks anything itself. ``/metrics`` authenticates when ``authenticateMetricsEndpoint``
is true, and by default whenever authentication is on (Pulsar's default is off; its metrics
name every tenant's topics).

Errors, in one place (``error_response``): a ``CompactMQError`` answers its ``http_status``
with ``{"reason": str(err)}``; an unknown path 404, a known path with another method 405; any
other exception 500 (logged with its traceback). One failing request never affects another.

Status codes follow Pulsar's admin API: 204 for a change with no body, 404 unknown topic,
namespace or tenant, 405 compaction of a non-persistent topic, 409 already exists / compaction
already running / not empty, 412 invalid name or invalid policy value, 400 a body that is not
the JSON the path expects.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import TYPE_CHECKING

from aiohttp import web

from ..auth import SLOW_METHODS, Principal, http_method, off_loop
from ..auth.tls import peer_certificate
from ..config import VERSION, metrics_need_authentication
from ..errors import AuthenticationFailed, CompactMQError
from . import (
    auto_topic_creation,
    cluster,
    http_limits,
    latest,
    lookup,
    namespaces,
    offload,
    permissions,
    schema_rest,
    topics,
)
from .access import AUTHENTICATED, www_authenticate
from .common import Context
from .metrics import TrafficSampler, render_metrics
from .router import NoRoute, Router, openapi_document

if TYPE_CHECKING:
    from ..broker.server import BrokerService

log = logging.getLogger(__name__)

JSON = "application/json"
OPENAPI_PATH = "/admin/v2/openapi.json"
CONTEXT = web.AppKey("context", Context)


def build_router() -> Router:
    router = Router()
    topics.add_routes(router)
    namespaces.add_routes(router)
    permissions.add_routes(router)
    auto_topic_creation.add_routes(router)
    lookup.add_routes(router)
    schema_rest.add_routes(router)
    offload.add_routes(router)
    cluster.add_routes(router)
    latest.add_routes(router)
    return router


#: the longest reason an error answers: a reason may quote the value it refuses, and a refused
#: value may be huge (the whole request body); the start says what was wrong
MAX_REASON = 1000


def error_response(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    if len(reason) > MAX_REASON:
        reason = reason[: MAX_REASON - 3] + "..."
    return web.json_response({"reason": reason}, status=status, headers=headers)


def build_app(service: BrokerService, sampler: TrafficSampler | None = None) -> web.Application:
    sampler = sampler or TrafficSampler(service)
    ctx = Context(service, sampler)
    router = build_router()
    openapi = openapi_document(router, "compactmq admin API", _version())

    async def admin(request: web.Request) -> web.StreamResponse:
        principal, denied = await _authenticate(ctx, request)
        if denied is not None:
            return denied
        try:
            route, captures = router.match(request.method, request.rel_url.raw_path)
        except NoRoute as e:
            if e.allowed:
                return error_response(
                    405,
                    f"method {request.method} is not allowed on this path (allowed: {', '.join(e.allowed)})",
                    {"Allow": ", ".join(e.allowed)},
                )
            return error_response(404, f"no such admin path: {request.rel_url.path}")
        try:
            await _authorize(ctx, principal, route.requires, captures)
            # in a cluster, a topic's call goes to the broker that owns it (307)
            moved = await cluster.redirect_to_owner(ctx, request, route.pattern, captures)
            if moved is not None:
                return moved
            body = await route.handler(ctx, request, **captures)
        except CompactMQError as e:
            if e.http_status >= 500:
                log.error("%s %s failed: %s", request.method, request.rel_url, e)
            return error_response(e.http_status, str(e) or type(e).__name__)
        except web.HTTPException:
            raise
        except Exception as e:  # one failing request never takes the server down
            log.exception("%s %s failed", request.method, request.rel_url)
            return error_response(500, f"internal error: {type(e).__name__}: {e}")
        if isinstance(body, web.StreamResponse):
            return body
        if body is None and request.method != "GET":
            return web.Response(status=204)  # a change with nothing to say; a GET answers null
        return web.Response(status=route.ok, text=json.dumps(body), content_type=JSON)

    async def openapi_json(request: web.Request) -> web.Response:
        return (await _authenticate(ctx, request))[1] or web.json_response(openapi)

    async def metrics(request: web.Request) -> web.Response:
        if metrics_need_authentication(service.config):
            denied = (await _authenticate(ctx, request))[1]
            if denied is not None:
                return denied
        try:
            sampler.refresh()
            text = await service.run_blocking(render_metrics, ctx)
        except Exception as e:
            log.exception("rendering /metrics failed")
            return error_response(500, f"internal error: {e}")
        return web.Response(
            text=text, content_type="text/plain", charset="utf-8", headers={"X-Prometheus-Format": "0.0.4"}
        )

    async def not_found(request: web.Request) -> web.Response:
        return error_response(404, f"no such path: {request.rel_url.path}")

    config = service.config
    app = web.Application(
        client_max_size=http_limits.max_body_size(config),
        middlewares=[http_limits.body_deadline_middleware(config, error_response)],
    )
    app[CONTEXT] = ctx
    app.router.add_get(OPENAPI_PATH, openapi_json)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/", metrics)
    app.router.add_route("*", "/admin/v2/{tail:.*}", admin)
    app.router.add_route("*", lookup.PREFIX + "/{tail:.*}", admin)  # the HTTP lookup path, same rules
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


async def _authenticate(ctx: Context, request: web.Request) -> tuple[Principal | None, web.Response | None]:
    """(the caller's principal, None), or (None, a 401 response) when its credentials are missing
    or wrong. Tokens and certificates are checked on the loop (microseconds); a password
    (``Basic``) off it, as the broker's CONNECT does (``compactmq.auth.SLOW_METHODS``), so a
    storm of wrong passwords stalls no other request. Never echoes the credentials."""
    authentication = ctx.authentication
    header = request.headers.get("Authorization")
    check = functools.partial(authentication.authenticate_http, header, _peer_certificate(request))
    try:
        if authentication.enabled and http_method(header) in SLOW_METHODS:
            return await off_loop(check), None
        return check(), None
    except AuthenticationFailed as e:
        return None, error_response(
            401, str(e) or "authentication required", {"WWW-Authenticate": www_authenticate(authentication)}
        )
    except Exception as e:  # a fault of ours: refuse (never let the request through), say so
        log.exception("authenticating %s %s failed", request.method, request.rel_url.path)
        return None, error_response(500, f"internal error while authenticating: {type(e).__name__}")


async def _authorize(ctx: Context, principal: Principal | None, requires, captures: dict[str, str]) -> None:
    """Raise ``AuthorizationFailed`` (403) unless the caller's role meets ``requires``."""
    authorization = ctx.authorization
    if not authorization.enabled or requires is AUTHENTICATED:
        return
    role = principal.role if principal is not None else None
    await ctx.run_blocking(requires, authorization, role, captures)


def _peer_certificate(request: web.Request) -> dict | None:
    """The client certificate the TLS handshake verified (None over plain HTTP or without one)."""
    return peer_certificate(request.transport)


def _version() -> str:
    return VERSION
