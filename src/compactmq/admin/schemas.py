"""Schema registry REST (read side): ``GET /admin/v2/schemas/{tenant}/{namespace}/{topic}/schema``.

The broker keeps each topic's schema versions in its topic properties (``broker.schemas``); this
returns the latest as Pulsar's ``GetSchemaResponse`` (``version``, ``type`` by name, ``timestamp``,
``data`` as text: the Avro record definition for AVRO and JSON, ``properties``). A partitioned topic
answers with the schema its partitions registered (they share one). A topic without a schema (the
bytes schema is never stored) is 404, as in Pulsar. Clients such as the Spark source use it to
decode values into typed columns.
"""

from __future__ import annotations

import base64
from typing import Any

from aiohttp import web

from ..errors import NotFound, TopicNotFound
from ..naming import TopicName
from ..protocol import pulsar_pb2 as pb
from .common import Context
from .router import Router

SCHEMA = "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema"
PROPERTY_KEY = "__schemas"  # where broker.schemas stores the versions


def add_routes(router: Router) -> None:
    router.add("GET", SCHEMA, get_schema, "the latest schema of a topic (GetSchemaResponse)")


def _records(ctx: Context, topic: str) -> list:
    meta = ctx.metadata
    names = [topic]
    n = meta.get_partitions(topic)
    if n:
        names = [f"{topic}-partition-{i}" for i in range(n)]
    for name in names:
        try:
            records = meta.topic_properties(name).get(PROPERTY_KEY) or []
        except TopicNotFound:
            continue
        if records:
            return records
    return []


async def get_schema(ctx: Context, request: web.Request, **path: str) -> Any:
    topic = str(TopicName.parse(f"persistent://{path['tenant']}/{path['namespace']}/{path['topic']}"))
    records = await ctx.run_blocking(_records, ctx, topic)
    if not records:
        raise NotFound(f"topic {topic} has no schema")
    rec = records[-1]
    data = base64.b64decode(rec.get("data") or "")
    return {
        "version": len(records) - 1,
        "type": pb.Schema.Type.Name(int(rec["type"])).upper(),
        "timestamp": 0,
        "data": data.decode("utf-8", "replace"),
        "properties": dict(rec.get("properties") or {}),
    }
