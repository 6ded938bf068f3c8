"""The schemas of each topic, one key per version::

    /schemas/{tenant}/{namespace}/{topic}              {"latest": n}: the locator
    /schemas/{tenant}/{namespace}/{topic}/{n:010d}     schema version n (type, data, properties)

Pulsar keys schemas by the topic's base name (all partitions share one history) and keeps a
locator in the metadata store; it keeps the schema bytes in BookKeeper, we keep them in the
version's key (a schema is small; the store caps values at ``MAX_VALUE_SIZE``). Adding a version
writes the locator (compare-and-set on its version) and the new version's key in one commit, so
two brokers adding a schema at once cannot both get version n.

What a version's value holds (its type, bytes, deletion markers) is the schema registry's
business (``storage.schemas``); here a version is a JSON object.
"""

from __future__ import annotations

from ...naming import TopicName
from ..metadata_store import NEW, BadVersion, Delete, Put
from .base import BaseResources, Json, dumps, encode_segment

SCHEMAS_ROOT = "/schemas"


def schema_path(topic: TopicName) -> str:
    """The locator's path (a partition's is its partitioned topic's)."""
    return _schema_path(topic)


def version_path(topic: TopicName, version: int) -> str:
    return f"{_schema_path(topic)}/{version:010d}"


def _schema_path(topic: TopicName) -> str:
    base = topic.partitioned_base
    return "/".join(
        (
            SCHEMAS_ROOT,
            encode_segment(base.tenant),
            encode_segment(base.namespace),
            encode_segment(base.local_name),
        )
    )


class SchemaResources(BaseResources):
    def add(self, topic: TopicName, schema: Json, expected_latest: int | None) -> int:
        """Store ``schema`` as the next version; returns its number (0 for the first).

        Args:
            expected_latest: the latest version the caller checked compatibility against (None:
                the topic has no schema yet).
        Raises:
            BadVersion: another version was added meanwhile; check compatibility again.
        """
        path = _schema_path(topic)
        current = self._read(path)
        latest = None if current is None else current[0]["latest"]
        if latest != expected_latest:
            raise BadVersion(f"schema of {topic}: latest version is {latest}, not {expected_latest}")
        version = 0 if latest is None else latest + 1
        locator_version = NEW if current is None else current[1]
        self.store.commit(
            [
                Put(path, dumps({"latest": version}), locator_version),
                Put(f"{path}/{version:010d}", dumps(schema), NEW),
            ]
        )
        return version

    def get(self, topic: TopicName, version: int | None = None) -> tuple[int, Json] | None:
        """Schema ``version`` (default: the latest) and its number, or None."""
        path = _schema_path(topic)
        if version is None:
            current = self._read(path)
            if current is None:
                return None
            version = current[0]["latest"]
        got = self._read(f"{path}/{version:010d}")
        return None if got is None else (version, got[0])

    def latest(self, topic: TopicName) -> int | None:
        """The newest version's number (None: the topic has no schema)."""
        current = self._read(_schema_path(topic))
        return None if current is None else int(current[0]["latest"])

    def history(self, topic: TopicName) -> list[tuple[int, Json]]:
        """Every version, oldest first (a version deleted meanwhile is left out)."""
        out = []
        for version in self.versions(topic):
            got = self._read(version_path(topic, version))
            if got is not None:
                out.append((version, got[0]))
        return out

    def versions(self, topic: TopicName) -> list[int]:
        return [int(v) for v in self.store.get_children(_schema_path(topic))]

    def delete(self, topic: TopicName) -> None:
        """Delete every version and the locator in one commit (no-op when there is none)."""
        path = _schema_path(topic)
        children = self.store.get_children(path)
        if children or self.store.exists(path):
            self.store.commit([Delete(f"{path}/{c}") for c in children] + [Delete(path)])
