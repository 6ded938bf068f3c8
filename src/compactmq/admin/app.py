"""The aiohttp application of the web port: Pulsar admin v2 REST paths, /metrics, OpenAPI.

Thin by design: each handler parses the path and body, calls the broker's services (metadata
store, storage, topic manager, compaction monitor) and returns a JSON-able body. Storage is
synchronous, so every storage call goes through ``service.run_blocking``, never on the loop.

Errors, in one place (``error_response``): a ``CompactMQError`` answers its ``http_status``
with ``{"reason": str(err)}``; an unknown path 404, a known path with another method 405; any
other exception 500 (logged with its traceback). One failing request never affects another.

Status codes follow Pulsar's admin API: 204 for a change with no body, 404 unknown topic,
namespace or tenant, 405 compaction of a non-persistent topic, 409 already exists / compaction
already running / not empty, 412 invalid name or invalid policy value, 400 a body that is not
the JSON the path expects.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from ..errors import CompactMQError
from . import namespaces, schemas, topics
from .common import Context
from .metrics import TrafficSampler, render_metrics
from .router import NoRoute, Router, openapi_document

log = logging.getLogger(__name__)

JSON = "application/json"
OPENAPI_PATH = "/admin/v2/openapi.json"
_pkg = "compactmq"
CONTEXT = web.AppKey("context", Context)


def build_router() -> Router:
    router = Router()
    topics.add_routes(router)
    namespaces.add_routes(router)
    schemas.add_routes(router)
    return router


def error_response(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"reason": reason}, status=status, headers=headers)


def build_app(service: Any, sampler: TrafficSampler | None = None) -> web.Application:
    sampler = sampler or TrafficSampler(service)
    ctx = Context(service, sampler)
    router = build_router()
    openapi = openapi_document(router, "compactmq admin API", _version())

    async def admin(request: web.Request) -> web.StreamResponse:
        try:
            route, captures = router.match(request.method, request.rel_url.raw_path)
        except NoRoute as e:
            if e.allowed:
                return error_response(405, f"method {request.method} is not allowed on this path "
                                           f"(allowed: {', '.join(e.allowed)})", {"Allow": ", ".join(e.allowed)})
            return error_response(404, f"no such admin path: {request.rel_url.path}")
        try:
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
        return web.json_response(openapi)

    async def metrics(request: web.Request) -> web.Response:
        try:
            sampler.refresh()
            text = await service.run_blocking(render_metrics, ctx)
        except Exception as e:
            log.exception("rendering /metrics failed")
            return error_response(500, f"internal error: {e}")
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def not_found(request: web.Request) -> web.Response:
        return error_response(404, f"no such path: {request.rel_url.path}")

    app = web.Application(client_max_size=1024 * 1024)
    app[CONTEXT] = ctx
    app.router.add_get(OPENAPI_PATH, openapi_json)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/", metrics)
    app.router.add_route("*", "/admin/v2/{tail:.*}", admin)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


def _version() -> str:
    try:
        from importlib.metadata import version

        return version(_pkg)
    except Exception:
        return "0"
