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


def offload_instance_id(old: OldTables) -> str | None:
    """The object-key prefix of the old ``offload_instance`` table (None: never made)."""
    if not _has_table(old, "offload_instance"):
        return None
    rows = old.query("SELECT id FROM offload_instance")
    return str(rows[0][0]) if rows else None


def offload_rows(old: OldTables) -> list[dict[str, Any]]:
    """The rows of the old ``offloaded_objects`` table, oldest offload first, each with the
    columns as keys and ``location`` parsed from its JSON."""
    if not _has_table(old, "offloaded_objects"):
        return []
    columns = (
        "data_key",
        "index_key",
        "kind",
        "topic",
        "ledger_id",
        "location",
        "data_size",
        "offloaded_ms",
        "local_deleted_ms",
    )
    rows = old.query(f"SELECT {', '.join(columns)} FROM offloaded_objects ORDER BY offloaded_ms, data_key")
    out = []
    for row in rows:
        value = dict(zip(columns, row))
        value["location"] = json.loads(value["location"])
        value["ledger_id"], value["data_size"] = int(value["ledger_id"]), int(value["data_size"])
        out.append(value)
    return out
