"""Schema registry paths, as Pulsar's admin API: ``/admin/v2/schemas/{tenant}/{namespace}/{topic}/...``

=========================  ==========================================================================
GET    .../schema          the latest version (GetSchemaResponse); 404 "Schema not found"
GET    .../schema/{v}      version ``v``
GET    .../schemas         every version in force: ``{"getSchemaResponses": [...]}``
POST   .../schema          register a schema (PostSchemaPayload); 409 when incompatible
DELETE .../schema          delete the schema (``?force=true``: erase its history too)
POST   .../compatibility   test a schema: ``{"compatibility": bool, "schemaCompatibilityStrategy": s}``
POST   .../version         the version holding a schema: ``{"version": n}``; 404 when none does
=========================  ==========================================================================

Bodies are Pulsar's: PostSchemaPayload ``{"type": "AVRO", "schema": "<definition>", "properties":
{}}``; GetSchemaResponse ``{"version", "type", "timestamp", "data", "properties"}``, where ``data``
is the definition as text. Registering through this API checks the topic's compatibility
strategy as a producer would, but ignores ``isAllowAutoUpdateSchema`` (that policy exists so an
operator registers schemas here and producers may not).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..broker.schema_compat import TYPE_NAMES
from ..errors import InvalidInput
from ..naming import TopicName
from ..storage.schemas import SchemaRecord
from .access import LOOKUP
from .common import Context, query_flag, read_json
from .router import Router

BASE = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"


def add_routes(router: Router) -> None:
    # reading a schema is Pulsar's GET_METADATA topic operation: what a lookup needs
    router.add("GET", BASE + "/schema", get_schema, "the latest schema of a topic", requires=LOOKUP)
    router.add(
        "GET",
        BASE + "/schema/{version}",
        get_schema_version,
        "one version of a topic's schema",
        requires=LOOKUP,
    )
    router.add(
        "GET", BASE + "/schemas", get_all_schemas, "every schema version in force of a topic", requires=LOOKUP
    )
    router.add(
        "POST", BASE + "/schema", post_schema, "register a schema version (PostSchemaPayload)", body="object"
    )
    router.add(
        "DELETE", BASE + "/schema", delete_schema, "delete a topic's schema (?force=true erases history)"
    )
    router.add(
        "POST",
        BASE + "/version",
        get_version_by_schema,
        "the version that holds a schema (PostSchemaPayload)",
        body="object",
    )
    router.add(
        "POST",
        BASE + "/compatibility",
        test_compatibility,
        "test a schema against the topic's compatibility strategy",
        body="object",
    )


def _topic(tenant: str, namespace: str, topic: str) -> str:
    return str(TopicName.parse(f"persistent://{tenant}/{namespace}/{topic}"))


def render(rec: SchemaRecord) -> dict[str, Any]:
    return {
        "version": rec.version,
        "type": TYPE_NAMES.get(rec.type, str(rec.type)),
        "timestamp": rec.timestamp_ms,
        "data": rec.data.decode("utf-8", errors="replace"),
        "properties": dict(rec.properties),
    }


async def _payload(request: web.Request) -> tuple[str, bytes, dict[str, str]]:
    body = await read_json(request, 'a PostSchemaPayload {"type": ..., "schema": ..., "properties": {...}}')
    if not isinstance(body, dict) or not isinstance(body.get("type"), str):
        raise InvalidInput(
            'the body must be a PostSchemaPayload: {"type": "AVRO", "schema": "...", "properties": {}}'
        )
    schema = body.get("schema") or ""
    if not isinstance(schema, str):
        raise InvalidInput("PostSchemaPayload.schema must be a string (the schema definition)")
    props = body.get("properties") or {}
    if not isinstance(props, dict):
        raise InvalidInput("PostSchemaPayload.properties must be an object of strings")
    return body["type"], schema.encode("utf-8"), {str(k): str(v) for k, v in props.items()}


async def get_schema(ctx: Context, request: web.Request, tenant: str, namespace: str, topic: str) -> Any:
    rec = await ctx.run_blocking(
        ctx.service.schemas.version_for_admin, _topic(tenant, namespace, topic), None
    )
    return render(rec)


async def get_schema_version(
    ctx: Context, request: web.Request, tenant: str, namespace: str, topic: str, version: str
) -> Any:
    try:
        n = int(version)
    except ValueError:
        raise InvalidInput(f"schema version must be an integer, not {version!r}") from None
    rec = await ctx.run_blocking(ctx.service.schemas.version_for_admin, _topic(tenant, namespace, topic), n)
    return render(rec)


async def get_all_schemas(ctx: Context, request: web.Request, tenant: str, namespace: str, topic: str) -> Any:
    records = await ctx.run_blocking(ctx.service.schemas.versions_for_admin, _topic(tenant, namespace, topic))
    return {"getSchemaResponses": [render(r) for r in records]}


async def post_schema(ctx: Context, request: web.Request, tenant: str, namespace: str, topic: str) -> Any:
    type_name, data, props = await _payload(request)
    version = await ctx.run_blocking(
        ctx.service.schemas.upload, _topic(tenant, namespace, topic), type_name, data, props
    )
    return {"version": {"version": version}}


async def get_version_by_schema(
    ctx: Context, request: web.Request, tenant: str, namespace: str, topic: str
) -> Any:
    type_name, data, _ = await _payload(request)
    version = await ctx.run_blocking(
        ctx.service.schemas.version_of, _topic(tenant, namespace, topic), type_name, data
    )
    return {"version": version}


async def delete_schema(ctx: Context, request: web.Request, tenant: str, namespace: str, topic: str) -> Any:
    version = await ctx.run_blocking(
        ctx.service.schemas.delete, _topic(tenant, namespace, topic), query_flag(request, "force")
    )
    return {"version": version}


async def test_compatibility(
    ctx: Context, request: web.Request, tenant: str, namespace: str, topic: str
) -> Any:
    type_name, data, _ = await _payload(request)
    ok, strategy, reason = await ctx.run_blocking(
        ctx.service.schemas.test_compatibility, _topic(tenant, namespace, topic), type_name, data
    )
    body: dict[str, Any] = {"compatibility": ok, "schemaCompatibilityStrategy": strategy}
    if reason:
        body["reason"] = reason
    return body
