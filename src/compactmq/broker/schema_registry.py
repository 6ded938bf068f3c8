"""The schema registry: what producers, consumers and the admin API ask about topic schemas.

Versions are stored in the metadata store (``storage.schemas`` over ``SchemaResources``), keyed by the
schema id ``tenant/namespace/topic`` (partitions and both domains share it, as in Pulsar). A
version on the wire is 8 bytes, big-endian. The bytes schema (no schema at all) is never stored.

What a client with a schema gets (Pulsar's rules, with its policy names):

* a schema identical to a version in force: that version;
* otherwise, if the topic has no schema yet: stored as the first version;
* otherwise a *producer*'s schema becomes the next version if ``isAllowAutoUpdateSchema`` and
  the compatibility strategy (``schema_compat``) accept it, else ``IncompatibleSchema``;
* a *consumer*'s schema must be compatible too, but is not stored;
* with ``schemaValidationEnforced``, a producer without a schema is refused on a topic that has
  one (IncompatibleSchema).

Each policy is looked up on the topic, then its namespace, then the broker configuration.
Topics created before the schema table kept their schemas in the topic's properties (key
``__schemas``); they are moved to the store the first time the topic's schema is read.

A new version is a compare-and-set on the newest version the compatibility check saw: when another
broker added one meanwhile, the check runs again against the longer history (``ADD_ATTEMPTS``).
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import TYPE_CHECKING, Any

from ..errors import IncompatibleSchema, InvalidConfiguration, NotFound, TopicNotFound
from ..naming import TopicName
from ..protocol import pulsar_pb2 as pb
from ..storage.metadata_store import BadVersion
from ..storage.schemas import SchemaRecord, SchemaStorage, active
from . import schema_compat
from .schema_compat import AUTO_UPDATE_KEY, CONFIG_KEYS, STRATEGY_KEY, UNDEFINED, VALIDATION_KEY

if TYPE_CHECKING:  # pragma: no cover
    from .server import BrokerService

LEGACY_PROPERTY_KEY = "__schemas"
#: compatibility checks run again after losing a race to another broker's new version
ADD_ATTEMPTS = 8
_VERSION = struct.Struct(">q")


def encode_version(n: int) -> bytes:
    return _VERSION.pack(n)


def decode_version(b: bytes) -> int:
    return _VERSION.unpack(b)[0] if len(b) == 8 else -1


def schema_id(topic: str) -> str:
    """``tenant/namespace/topic`` of a topic name (no domain, no partition suffix)."""
    tn = TopicName.parse(topic).partitioned_base
    return f"{tn.tenant}/{tn.namespace}/{tn.local_name}"


def to_wire(rec: SchemaRecord) -> pb.Schema:
    s = pb.Schema(name=rec.name, type=rec.type, schema_data=rec.data)
    for k, v in sorted(rec.properties.items()):
        s.properties.add(key=k, value=v)
    return s


class SchemaRegistry:
    def __init__(self, service: "BrokerService") -> None:
        self.service = service
        self._lock = asyncio.Lock()
        self._storage: SchemaStorage | None = None

    @property
    def storage(self) -> SchemaStorage:
        if self._storage is None:
            self._storage = SchemaStorage(self.service.storage.resources.schemas)
        return self._storage

    # --- reads (thread pool) -----------------------------------------------------------------

    def _versions(self, topic: str) -> list[SchemaRecord]:
        sid = schema_id(topic)
        records = self.storage.versions(sid)
        if not records:
            records = self._migrate(topic, sid)
        return records

    def _migrate(self, topic: str, sid: str) -> list[SchemaRecord]:
        tn = TopicName.parse(topic)
        name = str(TopicName("persistent", tn.tenant, tn.namespace, tn.partitioned_base.local_name))
        try:
            props = self.service.storage.topic_metadata.topic_properties(name)
        except TopicNotFound:
            return []
        legacy = props.pop(LEGACY_PROPERTY_KEY, None)
        if not legacy:
            return []
        # the versions first, then the properties without them: a crash in between leaves both,
        # and the next read finds the versions (it never comes here again)
        for rec in legacy:
            self.storage.add(
                sid,
                rec["type"],
                base64.b64decode(rec["data"]),
                rec.get("name", ""),
                rec.get("properties", {}),
            )
        self.service.storage.topic_metadata.set_topic_properties(name, props)
        return self.storage.versions(sid)

    def policy(self, topic: str, key: str) -> Any:
        """The policy ``key`` in force for ``topic``: topic, namespace, then broker config."""
        base = str(TopicName.parse(topic).partitioned_base)
        value = self.service.storage.policies.effective_policy(base, key, None)
        if value is None or value == UNDEFINED:
            ns = TopicName.parse(topic).namespace_name
            value = self.service.storage.policies.get_namespace_policies(ns).get(key)
        if value is None or value == UNDEFINED:
            value = self.service.config[CONFIG_KEYS[key]]
        return value

    def strategy(self, topic: str) -> str:
        value = self.policy(topic, STRATEGY_KEY)
        try:
            return schema_compat.check_strategy(value)
        except ValueError as e:
            raise InvalidConfiguration(f"schemaCompatibilityStrategy: {e}") from None

    # --- the wire (GET_SCHEMA, PRODUCER, SUBSCRIBE, GET_OR_CREATE_SCHEMA) ---------------------

    async def get(self, topic: str, version: bytes | None) -> tuple[pb.Schema, bytes] | None:
        rec = await self.service.run_blocking(
            self._get_blocking, topic, decode_version(version) if version else None
        )
        return None if rec is None else (to_wire(rec), encode_version(rec.version))

    def _get_blocking(self, topic: str, version: int | None) -> SchemaRecord | None:
        records = self._versions(topic)
        if version is None or version < 0:
            live = active(records)
            return live[-1] if live else None
        found = next((r for r in records if r.version == version), None)
        return None if found is None or found.deleted else found

    async def get_or_create(self, topic: str, schema: pb.Schema | None, consumer: bool = False) -> bytes:
        """The version for a producer's (or, ``consumer``, a consumer's) schema; b"" for none."""
        if schema is None or schema.type == 0:  # reads only: no need to queue behind registrations
            return await self.service.run_blocking(self._get_or_create_blocking, topic, None, consumer)
        async with self._lock:
            return await self.service.run_blocking(self._get_or_create_blocking, topic, schema, consumer)

    def _get_or_create_blocking(self, topic: str, schema: pb.Schema | None, consumer: bool) -> bytes:
        if schema is None or schema.type == 0:  # the bytes schema
            if not consumer and self.policy(topic, VALIDATION_KEY) and active(self._versions(topic)):
                raise IncompatibleSchema(
                    f"topic {topic} has a schema and schemaValidationEnforced is on: "
                    "producers without a schema are refused"
                )
            return b""
        version = self._add(
            topic,
            int(schema.type),
            bytes(schema.schema_data),
            schema.name,
            {kv.key: kv.value for kv in schema.properties},
            consumer=consumer,
        )
        return encode_version(version) if version >= 0 else b""

    def _add(
        self,
        topic: str,
        type_: int,
        data: bytes,
        name: str,
        properties: dict[str, str],
        consumer: bool = False,
        admin: bool = False,
    ) -> int:
        schema_compat.validate(type_, data)
        for _ in range(ADD_ATTEMPTS - 1):
            try:
                return self._add_once(topic, type_, data, name, properties, consumer, admin)
            except BadVersion:
                continue  # another broker added a version: check against the new history
        return self._add_once(topic, type_, data, name, properties, consumer, admin)

    def _add_once(
        self,
        topic: str,
        type_: int,
        data: bytes,
        name: str,
        properties: dict[str, str],
        consumer: bool,
        admin: bool,
    ) -> int:
        records = self._versions(topic)
        live = active(records)
        for rec in live:
            if rec.type == type_ and schema_compat.same(type_, rec.data, data):
                return rec.version
        strategy = self.strategy(topic)
        if not admin and (not consumer or not live) and not self.policy(topic, AUTO_UPDATE_KEY):
            # Pulsar's words; only the admin API registers schemas then
            raise IncompatibleSchema(f"topic {topic}: Schema not found and schema auto updating is disabled.")
        if live:
            schema_compat.check(strategy, [(r.type, r.data) for r in live], (type_, data), topic)
            if consumer:
                return -1  # a compatible reader: nothing to store
        latest = records[-1].version if records else None
        return self.storage.add(schema_id(topic), type_, data, name, properties, expected_latest=latest)

    # --- the admin API (runs in the thread pool, under no lock: admin changes are rare) -------

    def versions_for_admin(self, topic: str) -> list[SchemaRecord]:
        """The versions in force, oldest first (empty: no schema)."""
        return active(self._versions(topic))

    def version_for_admin(self, topic: str, version: int | None) -> SchemaRecord:
        rec = self._get_blocking(topic, version)
        if rec is None:
            raise NotFound("Schema not found" if version is None else f"Schema version {version} not found")
        return rec

    def upload(self, topic: str, type_name: str, data: bytes, properties: dict[str, str]) -> int:
        return self._add(topic, _type_number(type_name), data, "", properties, admin=True)

    def version_of(self, topic: str, type_name: str, data: bytes) -> int:
        """The version in force that holds this schema (NotFound when none does)."""
        type_ = _type_number(type_name)
        for rec in active(self._versions(topic)):
            if rec.type == type_ and schema_compat.same(type_, rec.data, data):
                return rec.version
        raise NotFound("Schema not found")

    def test_compatibility(self, topic: str, type_name: str, data: bytes) -> tuple[bool, str, str]:
        """(compatible, strategy, reason) of a schema against the versions in force."""
        type_ = _type_number(type_name)
        strategy = self.strategy(topic)
        try:
            schema_compat.validate(type_, data)
            live = active(self._versions(topic))
            if not any(r.type == type_ and schema_compat.same(type_, r.data, data) for r in live):
                schema_compat.check(strategy, [(r.type, r.data) for r in live], (type_, data), topic)
        except IncompatibleSchema as e:
            return False, strategy, str(e)
        return True, strategy, ""

    def topic_deleted(self, topic: str) -> None:
        """A topic was deleted: its schema goes with it (a deletion marker), as on Pulsar, so a
        topic created again under that name starts with no schema."""
        self._versions(topic)
        self.storage.delete(schema_id(topic))

    def delete(self, topic: str, force: bool = False) -> int:
        self._versions(topic)  # moves a legacy schema into the table first
        version = self.storage.delete(schema_id(topic), force)
        if version is None:
            raise NotFound("Schema not found")
        return version


def _type_number(name: str) -> int:
    n = schema_compat.TYPE_NUMBERS.get(str(name).upper())
    if n is None or n == 0:
        raise schema_compat.InvalidSchemaData(
            f"schema type {name!r} cannot be registered: use one of "
            f"{', '.join(t for t in schema_compat.TYPE_NUMBERS if t != 'NONE')}"
        )
    return n
