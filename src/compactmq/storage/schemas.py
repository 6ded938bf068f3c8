"""Schema versions in the metadata store: every version of every topic's schema.

Pulsar keeps schemas apart from topics, keyed by the *schema id* ``tenant/namespace/topic``:
the topic's name without its domain and without a ``-partition-N`` suffix, so the partitions of
a topic and its persistent and non-persistent forms share one history. Versions are numbered
from 0 and never reused.

Deleting a schema does not erase its history: it appends a *deletion marker* (a version with
``deleted`` set), as Pulsar does. The versions before the newest marker no longer count (a
topic with a deleted schema behaves as one with none; the next schema starts a new history and
is checked against nothing older). ``delete(force=True)`` removes every version for good.

Versions live in the metadata store (``resources.SchemaResources``, one key per version under
``/schemas/{tenant}/{namespace}/{topic}``); a version's value is a JSON object (``type``, ``data``
in base64, ``name``, ``properties``, ``timestamp_ms``, ``deleted``). Adding a version is a
compare-and-set on the locator: ``add(..., expected_latest=n)`` fails with ``BadVersion`` when
another broker added a version after the caller looked at version ``n`` (it then checks
compatibility again against the newer history).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import MetadataError
from ..naming import TopicName
from .metadata_store import BadVersion
from .resources.base import Json
from .resources.schema_keys import SchemaResources

#: appends lost to concurrent writers before ``add`` without an expectation gives up
APPEND_ATTEMPTS = 16
#: ``expected_latest`` meaning "whatever the latest is" (an append that checks nothing)
ANY = object()


@dataclass(frozen=True)
class SchemaRecord:
    """One stored version. ``type`` is the wire number of ``Schema.Type`` (Avro 4, Json 2...)."""

    version: int
    type: int
    data: bytes
    name: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    timestamp_ms: int = 0
    deleted: bool = False


def active(records: list[SchemaRecord]) -> list[SchemaRecord]:
    """The versions in force: those after the newest deletion marker."""
    for i in range(len(records) - 1, -1, -1):
        if records[i].deleted:
            return records[i + 1 :]
    return list(records)


def schema_topic(schema_id: str) -> TopicName:
    """``tenant/namespace/topic`` as the topic name the resources key schemas by."""
    tenant, namespace, local = (schema_id.split("/", 2) + ["", ""])[:3]
    if not tenant or not namespace or not local:
        raise MetadataError(f"schema id {schema_id!r} is not tenant/namespace/topic")
    return TopicName("persistent", tenant, namespace, local)


def record_value(rec: SchemaRecord) -> Json:
    return {
        "type": rec.type,
        "data": base64.b64encode(rec.data).decode("ascii"),
        "name": rec.name,
        "properties": dict(rec.properties),
        "timestamp_ms": rec.timestamp_ms,
        "deleted": rec.deleted,
    }


def _record(version: int, value: Json) -> SchemaRecord:
    return SchemaRecord(
        version,
        int(value["type"]),
        base64.b64decode(value.get("data") or ""),
        str(value.get("name") or ""),
        dict(value.get("properties") or {}),
        int(value.get("timestamp_ms") or 0),
        bool(value.get("deleted")),
    )


class SchemaStorage:
    """Schema versions in the metadata store (thread-safe as the store is; call from a pool)."""

    def __init__(self, resources: SchemaResources, clock: Callable[[], int] | None = None) -> None:
        self.resources = resources
        self._clock = clock or (lambda: int(time.time() * 1000))

    def versions(self, schema_id: str) -> list[SchemaRecord]:
        """Every version of ``schema_id``, deletion markers included, oldest first."""
        return [_record(v, value) for v, value in self.resources.history(schema_topic(schema_id))]

    def add(
        self,
        schema_id: str,
        type_: int,
        data: bytes,
        name: str = "",
        properties: dict[str, str] | None = None,
        deleted: bool = False,
        expected_latest: object = ANY,
    ) -> int:
        """Append a version (the next number) and return it.

        ``expected_latest``: the newest version (deletion markers count; None: no version) the
        caller decided on; ``BadVersion`` when another was added since. By default (``ANY``) the
        version is appended after whatever is there.
        """
        topic = schema_topic(schema_id)
        rec = SchemaRecord(0, type_, bytes(data), name, dict(properties or {}), self._clock(), deleted)
        value = record_value(rec)
        if expected_latest is not ANY:
            return self.resources.add(topic, value, expected_latest)  # type: ignore[arg-type]
        for _ in range(APPEND_ATTEMPTS):
            try:
                return self.resources.add(topic, value, self.resources.latest(topic))
            except BadVersion:
                continue  # another version landed between the read and the write: append after it
        raise BadVersion(f"schema {schema_id}: still contended after {APPEND_ATTEMPTS} attempts")

    def delete(self, schema_id: str, force: bool = False) -> int | None:
        """Delete the schema in force: a deletion marker (returned: its version), or with
        ``force`` every version of ``schema_id`` (returned: the last version there was). None when
        there was nothing to delete."""
        records = self.versions(schema_id)
        if force:
            if not records:
                return None
            self.resources.delete(schema_topic(schema_id))
            return records[-1].version
        if not active(records):
            return None
        return self.add(schema_id, 0, b"", deleted=True)
