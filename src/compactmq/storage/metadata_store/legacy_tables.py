"""Read-only access to the tables older compactmq versions kept beside the old metadata tables.

Before the metadata store, modules kept tables of their own in ``metadata.db`` (schemas, the
offload catalog), reached with SQL through the old SQLite class (``storage.metadata``). Their
content moves into the store once (``resources.legacy_moves``); the SQL that reads those tables
for that import lives here, beside the embedded store's implementation, so that nothing above it
writes SQL. A table that was never created (a data directory that never used the feature) reads
as empty. Nothing here writes.

Each reader takes the old store (anything with ``query(sql, args) -> rows``) and returns plain
Python values.
"""

from __future__ import annotations

import json
from typing import Any, Protocol


class OldTables(Protocol):
    def query(self, sql: str, args: tuple = ()) -> list[tuple]: ...


def _has_table(old: OldTables, name: str) -> bool:
    return bool(old.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)))


def schema_rows(old: OldTables) -> dict[str, list[dict[str, Any]]]:
    """``{schema id: [version, ...]}`` of the old ``schemas`` table, versions oldest first, each
    ``{"version", "type", "data" (bytes), "name", "properties", "timestamp_ms", "deleted"}``."""
    if not _has_table(old, "schemas"):
        return {}
    rows = old.query(
        "SELECT schema_id, version, type, data, name, properties, timestamp_ms, deleted FROM schemas "
        "ORDER BY schema_id, version"
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for sid, version, type_, data, name, props, ts, deleted in rows:
        out.setdefault(sid, []).append(
            {
                "version": int(version),
                "type": int(type_),
                "data": bytes(data),
                "name": name or "",
                "properties": json.loads(props or "{}"),
                "timestamp_ms": int(ts),
                "deleted": bool(deleted),
            }
        )
    return out
