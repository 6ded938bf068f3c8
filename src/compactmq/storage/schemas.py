"""The schema table of the metadata store: every version of every topic's schema.

Pulsar keeps schemas apart from topics, keyed by the *schema id* ``tenant/namespace/topic``:
the topic's name without its domain and without a ``-partition-N`` suffix, so the partitions of
a topic and its persistent and non-persistent forms share one history. Versions are numbered
from 0 and never reused.

Deleting a schema does not erase its history: it appends a *deletion marker* (a version with
``deleted`` set), as Pulsar does. The versions before the newest marker no longer count (a
topic with a deleted schema behaves as one with none; the next schema starts a new history and
is checked against nothing older). ``delete(force=True)`` removes the rows for good.

The table lives in ``metadata.db`` next to the topics (one SQLite database, one transaction
per change), created on first use so that older data directories gain it on upgrade.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

_TABLE = """
CREATE TABLE IF NOT EXISTS schemas (
    schema_id    TEXT NOT NULL,
    version      INTEGER NOT NULL,
    type         INTEGER NOT NULL,
    name         TEXT NOT NULL DEFAULT '',
    data         BLOB NOT NULL,
    properties   TEXT NOT NULL DEFAULT '{}',
    timestamp_ms INTEGER NOT NULL,
    deleted      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (schema_id, version)
)
"""


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


class SchemaStorage:
    """Schema versions in the metadata store (thread-safe as the store is; call from a pool)."""

    def __init__(self, metadata: Any) -> None:
        self.metadata = metadata
        with metadata.transaction() as db:
            db.execute(_TABLE)

    def versions(self, schema_id: str) -> list[SchemaRecord]:
        """Every version of ``schema_id``, deletion markers included, oldest first."""
        with self.metadata.transaction(durable=False) as db:
            rows = db.execute(
                "SELECT version, type, data, name, properties, timestamp_ms, deleted FROM schemas "
                "WHERE schema_id = ? ORDER BY version",
                (schema_id,),
            ).fetchall()
        return [SchemaRecord(v, t, bytes(d), n, json.loads(p), ts, bool(x)) for v, t, d, n, p, ts, x in rows]

    def add(
        self,
        schema_id: str,
        type_: int,
        data: bytes,
        name: str = "",
        properties: dict[str, str] | None = None,
        deleted: bool = False,
    ) -> int:
        """Append a version (the next number) and return it."""
        with self.metadata.transaction() as db:
            row = db.execute("SELECT MAX(version) FROM schemas WHERE schema_id = ?", (schema_id,)).fetchone()
            version = 0 if row[0] is None else row[0] + 1
            db.execute(
                "INSERT INTO schemas(schema_id, version, type, name, data, properties, timestamp_ms, deleted) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    schema_id,
                    version,
                    type_,
                    name,
                    bytes(data),
                    json.dumps(dict(properties or {})),
                    self.metadata.now_ms(),
                    int(deleted),
                ),
            )
        return version

    def delete(self, schema_id: str, force: bool = False) -> int | None:
        """Delete the schema in force: a deletion marker (returned: its version), or with
        ``force`` every row of ``schema_id`` (returned: the last version there was). None when
        there was nothing to delete."""
        records = self.versions(schema_id)
        if force:
            if not records:
                return None
            with self.metadata.transaction() as db:
                db.execute("DELETE FROM schemas WHERE schema_id = ?", (schema_id,))
            return records[-1].version
        if not active(records):
            return None
        return self.add(schema_id, 0, b"", deleted=True)
