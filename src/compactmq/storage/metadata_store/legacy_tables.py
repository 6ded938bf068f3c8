"""Read-only access to the tables of a data directory written by an older compactmq.

Before the metadata store, ``data_dir/metadata.db`` held plain SQLite tables (tenants,
namespaces, topics, ledgers, cursors, partitioned topics, policies, sequences, and the tables
modules kept of their own: compaction state, schemas, the offload catalog). Their content moves
into the store once, at start (``resources.legacy_import`` and ``resources.legacy_moves``); the
SQL that reads them lives here, beside the embedded store's implementation, so that nothing above
it writes SQL.

``open_legacy_tables(path)`` returns a ``LegacyTables`` only when the file has the old tables (a
data directory created since has none: the embedded store's own tables are ``store_*``), else
None. The connection is ``query_only``: nothing here writes, creates a table or bootstraps a
row. A table that was never created (a data directory that never used the feature) reads as
empty.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ...errors import MetadataError
from ...naming import TopicName
from ..position import LedgerInfo, Position


class OldTables(Protocol):
    """Anything with ``query(sql, args) -> rows`` over the old tables (``LegacyTables``)."""

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


#: the tables every old data directory has (the old class created them all at its first open)
OLD_CORE_TABLES = frozenset(
    {"sequences", "tenants", "namespaces", "topics", "ledgers", "cursors", "partitioned_topics", "policies"}
)


@dataclass(frozen=True)
class LegacyCursor:
    """A durable cursor as an old data directory stored it."""

    topic: str
    name: str
    mark_delete: Position
    acked_ranges: bytes
    properties: dict[str, Any]
    created_ms: int


def open_legacy_tables(path: str | Path) -> LegacyTables | None:
    """The old tables of ``path`` read-only, or None when the file does not exist or has none."""
    if not Path(path).is_file():
        return None
    tables = LegacyTables(path)
    if not OLD_CORE_TABLES <= tables.table_names():
        tables.close()
        return None
    return tables


class LegacyTables:
    """The old tables of one ``metadata.db``, read-only (the calls the legacy import makes)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout=30000")
            self._db.execute("PRAGMA query_only=ON")
        except sqlite3.Error as e:
            raise MetadataError(f"cannot read the old tables of {self.path}: {e}") from e

    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as e:
                raise MetadataError(f"old metadata tables of {self.path}: {e}") from e

    def close(self) -> None:
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error:
                pass

    def table_names(self) -> set[str]:
        return {r[0] for r in self.query("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def last_ledger_id(self) -> int:
        """The last id the old counter handed out (the import lifts the store's counter above it)."""
        rows = self.query("SELECT value FROM sequences WHERE name = 'ledger_id'")
        return int(rows[0][0]) if rows else 0

    # --- tenants, namespaces, topics -------------------------------------------------------------

    def tenants(self) -> list[str]:
        return [r[0] for r in self.query("SELECT name FROM tenants ORDER BY name")]

    def get_tenant(self, name: str) -> dict[str, Any] | None:
        rows = self.query("SELECT info FROM tenants WHERE name = ?", (name,))
        return json.loads(rows[0][0]) if rows else None

    def namespaces(self, tenant: str | None = None) -> list[str]:
        if tenant is None:
            return [r[0] for r in self.query("SELECT name FROM namespaces ORDER BY name")]
        return [
            r[0] for r in self.query("SELECT name FROM namespaces WHERE tenant = ? ORDER BY name", (tenant,))
        ]

    def partitioned_topics(self, namespace: str | None = None) -> dict[str, int]:
        rows = self.query("SELECT name, partitions FROM partitioned_topics ORDER BY name")
        return {n: p for n, p in rows if namespace is None or _namespace_of(n) == namespace}

    def topics(self, namespace: str | None = None) -> list[str]:
        if namespace is None:
            return [r[0] for r in self.query("SELECT name FROM topics ORDER BY name")]
        return [
            r[0]
            for r in self.query("SELECT name FROM topics WHERE namespace = ? ORDER BY name", (namespace,))
        ]

    def topic_properties(self, topic: str) -> dict[str, Any]:
        rows = self.query("SELECT properties FROM topics WHERE name = ?", (topic,))
        return json.loads(rows[0][0]) if rows else {}

    def ledgers(self, topic: str) -> list[LedgerInfo]:
        rows = self.query(
            "SELECT ledger_id, entry_count, size, first_publish_ms, last_publish_ms, state, created_ms, closed_ms "
            "FROM ledgers WHERE topic = ? ORDER BY ledger_id",
            (topic,),
        )
        return [LedgerInfo(*r) for r in rows]

    def load_cursors(self, topic: str) -> list[LegacyCursor]:
        rows = self.query(
            "SELECT topic, name, mark_delete_ledger, mark_delete_entry, acked_ranges, properties, created_ms "
            "FROM cursors WHERE topic = ? ORDER BY name",
            (topic,),
        )
        return [
            LegacyCursor(r[0], r[1], Position(r[2], r[3]), bytes(r[4]), json.loads(r[5]), r[6]) for r in rows
        ]

    # --- policies --------------------------------------------------------------------------------

    def policy_names(self, scope: str) -> list[str]:
        """The topics (``scope="topic"``) or namespaces that have policies."""
        rows = self.query("SELECT DISTINCT name FROM policies WHERE scope = ? ORDER BY name", (scope,))
        return [r[0] for r in rows]

    def get_namespace_policies(self, namespace: str) -> dict[str, Any]:
        return self._policies("namespace", namespace)

    def get_topic_policies(self, topic: str) -> dict[str, Any]:
        return self._policies("topic", topic)

    def _policies(self, scope: str, name: str) -> dict[str, Any]:
        rows = self.query("SELECT key, value FROM policies WHERE scope = ? AND name = ?", (scope, name))
        return {k: json.loads(v) for k, v in rows}

    # --- compaction state ------------------------------------------------------------------------

    def legacy_compaction_states(self) -> list[dict[str, Any]]:
        """The rows of the old ``compaction_state`` table (with its ``compaction_details``), as
        dicts of column values; empty when the tables do not exist."""
        tables = self.table_names()
        if "compaction_state" not in tables:
            return []
        names = list(_COMPACTION_COLUMNS)
        rows = [
            dict(zip(names, r))
            for r in self.query(f"SELECT {', '.join(names)} FROM compaction_state ORDER BY topic")
        ]
        if "compaction_details" in tables:
            details = {
                r[0]: (r[1], r[2])
                for r in self.query("SELECT topic, view_id, details FROM compaction_details")
            }
            for row in rows:
                view_id, raw = details.get(row["topic"], (None, None))
                row["details_view_id"] = view_id
                try:
                    row["details"] = dict(json.loads(raw)) if raw else {}
                except (ValueError, TypeError):
                    row["details"] = {}
        return rows


_COMPACTION_COLUMNS = (
    "topic",
    "compacted_ledger_id",
    "horizon_ledger",
    "horizon_entry",
    "status",
    "last_error",
    "started_ms",
    "last_success_ms",
    "last_failure_ms",
    "last_duration_ms",
    "removed_event_count",
)


def _namespace_of(topic: str) -> str:
    return TopicName.parse(topic).namespace_name
