"""A small path router over raw (still percent-encoded) URL segments, and the OpenAPI document
built from the same route table.

Why not aiohttp's own router: topic names may contain characters that arrive percent-encoded
(``%2F`` among them); matching on raw segments and decoding each one afterwards keeps a topic
name one segment whatever it holds. A path that matches no route is 404; a path that matches
with another method is 405 with ``Allow``.

A pattern is ``/``-separated segments; ``{name}`` captures one segment. ``{domain}`` captures
only ``persistent`` or ``non-persistent``, so ``/admin/v2/namespaces/...`` never reads as a topic
path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import unquote

from ..naming import DOMAINS
from .access import default_requirement, requirement_name

Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: str
    handler: Handler
    summary: str
    body: str | None = None  # JSON schema type of the request body, for the OpenAPI document
    ok: int = 200  # the success status the handler answers
    requires: Any = None  # who may call it: an ``access.Requirement`` or a check callable

    @property
    def segments(self) -> list[str]:
        return [s for s in self.pattern.split("/") if s]


class NoRoute(Exception):
    def __init__(self, allowed: list[str]):
        super().__init__("no route")
        self.allowed = allowed


class Router:
    def __init__(self) -> None:
        self.routes: list[Route] = []
        self._segments: list[list[str]] = []  # each route's segments, split once (match is per request)

    def add(
        self,
        method: str,
        pattern: str,
        handler: Handler,
        summary: str,
        *,
        body: str | None = None,
        ok: int = 200,
        requires: Any = None,
    ) -> None:
        """``requires``: what the caller's role needs (``access``); by default it follows from the
        path (``access.default_requirement``)."""
        if requires is None:
            requires = default_requirement(method, pattern)
        self.routes.append(Route(method, pattern, handler, summary, body, ok, requires))
        self._segments.append(self.routes[-1].segments)

    def match(self, method: str, raw_path: str) -> tuple[Route, dict[str, str]]:
        """The route for ``method raw_path`` and its decoded captures; ``NoRoute`` lists the
        methods the path allows (empty: no such path)."""
        parts = [p for p in raw_path.split("/") if p != ""]
        allowed: list[str] = []
        for route, segments in zip(self.routes, self._segments):
            if len(segments) != len(parts):
                continue
            captures = _match(segments, parts)
            if captures is None:
                continue
            if route.method == method:
                return route, captures
            allowed.append(route.method)
        raise NoRoute(sorted(set(allowed)))


def _match(segments: list[str], parts: list[str]) -> dict[str, str] | None:
    if len(segments) != len(parts):
        return None
    captures: dict[str, str] = {}
    for seg, part in zip(segments, parts):
        if seg.startswith("{") and seg.endswith("}"):
            name = seg[1:-1]
            value = unquote(part)
            if name == "domain" and value not in DOMAINS:
                return None
            captures[name] = value
        elif seg != part:
            return None
    return captures


def openapi_document(router: Router, title: str, version: str) -> dict[str, Any]:
    """An OpenAPI 3.0 description of every route (errors: ``{"reason": str}``)."""
    paths: dict[str, dict[str, Any]] = {}
    error_ref = {"$ref": "#/components/responses/Error"}
    for route in router.routes:
        params = [
            {
                "name": s[1:-1],
                "in": "path",
                "required": True,
                "schema": {"type": "string", "enum": list(DOMAINS)}
                if s == "{domain}"
                else {"type": "string"},
            }
            for s in route.segments
            if s.startswith("{")
        ]
        op: dict[str, Any] = {
            "summary": route.summary,
            "operationId": f"{route.method.lower()}_{route.handler.__name__}",
            "parameters": params,
            "responses": {
                str(route.ok): {"description": "success"},
                "400": error_ref,
                "401": error_ref,
                "403": error_ref,
                "404": error_ref,
                "405": error_ref,
                "409": error_ref,
                "412": error_ref,
                "500": error_ref,
            },
            # who may call it when authorizationEnabled is true (superuser, tenant-admin, lookup)
            "x-requires": requirement_name(route.requires),
        }
        if route.body:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"type": route.body}}},
            }
        paths.setdefault(route.pattern, {})[route.method.lower()] = op
    return {
        "openapi": "3.0.3",
        "info": {
            "title": title,
            "version": version,
            "description": 'Pulsar admin v2 paths served by compactmq; errors are JSON {"reason": "..."}.',
        },
        "paths": paths,
        "components": {
            "responses": {
                "Error": {
                    "description": "the request failed; the reason says why",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"reason": {"type": "string"}},
                                "required": ["reason"],
                            }
                        }
                    },
                }
            }
        },
    }
