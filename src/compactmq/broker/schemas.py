"""Schemas of topics, for the client's GET_SCHEMA / GET_OR_CREATE_SCHEMA and for producers and
consumers that declare one (``pulsar.schema`` users).

Each topic keeps an ordered list of schema versions; a version on the wire is 8 bytes,
big-endian (as Pulsar encodes it). The list is stored in the topic's properties in the metadata
store (key ``__schemas``), so it survives restarts. The bytes schema (no schema at all) is never
stored and is always accepted.

Compatibility: a schema identical to a stored one gets that version back; a new schema of the
same type is added as the next version; a schema of another type than the latest stored one is
refused (IncompatibleSchema) - a simplification of Pulsar's per-type compatibility checks.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import TYPE_CHECKING

from ..errors import IncompatibleSchema, TopicNotFound
from ..protocol import pulsar_pb2 as pb

if TYPE_CHECKING:  # pragma: no cover
    from .server import BrokerService

PROPERTY_KEY = "__schemas"
_VERSION = struct.Struct(">q")


def encode_version(n: int) -> bytes:
    return _VERSION.pack(n)


def decode_version(b: bytes) -> int:
    return _VERSION.unpack(b)[0] if len(b) == 8 else -1


def _record(schema: pb.Schema) -> dict:
    return {
        "name": schema.name,
        "type": int(schema.type),
        "data": base64.b64encode(schema.schema_data).decode(),
        "properties": {kv.key: kv.value for kv in schema.properties},
    }


def _schema(rec: dict) -> pb.Schema:
    s = pb.Schema(name=rec["name"], type=rec["type"], schema_data=base64.b64decode(rec["data"]))
    for k, v in sorted(rec.get("properties", {}).items()):
        s.properties.add(key=k, value=v)
    return s


class SchemaRegistry:
    def __init__(self, service: "BrokerService") -> None:
        self.service = service
        self._lock = asyncio.Lock()

    @property
    def _metadata(self):
        return self.service.storage.metadata

    def _load(self, topic: str) -> list[dict]:
        try:
            return list(self._metadata.topic_properties(topic).get(PROPERTY_KEY, []))
        except TopicNotFound:
            return []

    async def get(self, topic: str, version: bytes | None) -> tuple[pb.Schema, bytes] | None:
        records = await self.service.run_blocking(self._load, topic)
        if not records:
            return None
        if version is None or len(version) != 8:
            n = len(records) - 1
        else:
            n = decode_version(version)
            if not 0 <= n < len(records):
                return None
        return _schema(records[n]), encode_version(n)

    async def get_or_create(self, topic: str, schema: pb.Schema) -> bytes:
        if schema.type == 0:  # Schema.Type None: the bytes schema
            return b""  # bytes schema: nothing to store
        async with self._lock:
            return await self.service.run_blocking(self._get_or_create_blocking, topic, schema)

    def _get_or_create_blocking(self, topic: str, schema: pb.Schema) -> bytes:
        records = self._load(topic)
        rec = _record(schema)
        for n, existing in enumerate(records):
            if existing["type"] == rec["type"] and existing["data"] == rec["data"]:
                return encode_version(n)
        if records and records[-1]["type"] != rec["type"]:
            raise IncompatibleSchema(
                f"topic {topic} has a schema of type {pb.Schema.Type.Name(records[-1]['type'])}; "
                f"a {pb.Schema.Type.Name(rec['type'])} schema is not compatible"
            )
        records.append(rec)
        props = self._metadata.topic_properties(topic)
        props[PROPERTY_KEY] = records
        self._metadata.set_topic_properties(topic, props)
        return encode_version(len(records) - 1)
