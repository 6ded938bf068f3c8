"""Test-only: the SQLite metadata class of older compactmq versions, to write a data directory
as they left it (``metadata.db`` with the old tables) for the legacy-import tests.

Copied from ``storage/metadata.py`` before it was removed (the broker now only reads these tables,
through ``storage.metadata_store.legacy_tables``); the schema, the rows and the WAL mode are what
older versions wrote. Not used by the broker.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from compactmq.errors import AlreadyExists, Conflict, MetadataError, NotFound, TopicNotFound
from compactmq.naming import TopicName
from compactmq.storage.modes import create_private_file
from compactmq.storage.position import LEDGER_CLOSED, LEDGER_OPEN, LedgerInfo, Position

SCHEMA_VERSION = 1


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sequences (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tenants (
    name       TEXT PRIMARY KEY,
    info       TEXT NOT NULL DEFAULT '{}',
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS namespaces (
    name       TEXT PRIMARY KEY,              -- tenant/namespace
    tenant     TEXT NOT NULL REFERENCES tenants(name),
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS topics (
    name       TEXT PRIMARY KEY,              -- persistent://tenant/ns/topic
    namespace  TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    properties TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS ledgers (
    ledger_id        INTEGER PRIMARY KEY,
    topic            TEXT NOT NULL,
    entry_count      INTEGER NOT NULL DEFAULT 0,
    size             INTEGER NOT NULL DEFAULT 0,
    first_publish_ms INTEGER,
    last_publish_ms  INTEGER,
    state            TEXT NOT NULL,           -- OPEN | CLOSED
    created_ms       INTEGER NOT NULL,
    closed_ms        INTEGER
);
CREATE INDEX IF NOT EXISTS ledgers_by_topic ON ledgers(topic, ledger_id);
CREATE TABLE IF NOT EXISTS cursors (
    topic              TEXT NOT NULL,
    name               TEXT NOT NULL,
    mark_delete_ledger INTEGER NOT NULL,
    mark_delete_entry  INTEGER NOT NULL,
    acked_ranges       BLOB NOT NULL DEFAULT x'',   -- int64 pairs, see cursor.py
    properties         TEXT NOT NULL DEFAULT '{}',
    created_ms         INTEGER NOT NULL,
    PRIMARY KEY (topic, name)
);
CREATE TABLE IF NOT EXISTS partitioned_topics (
    name       TEXT PRIMARY KEY,
    partitions INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS policies (
    scope TEXT NOT NULL CHECK (scope IN ('topic', 'namespace')),
    name  TEXT NOT NULL,
    key   TEXT NOT NULL,
    value TEXT NOT NULL,                      -- JSON
    PRIMARY KEY (scope, name, key)
);
"""


@dataclass(frozen=True)
class CursorRecord:
    """A durable cursor as stored; ``Cursor`` is the live object built from it."""

    topic: str
    name: str
    mark_delete: Position
    acked_ranges: bytes
    properties: dict[str, Any]
    created_ms: int


def _namespace_of(topic: str) -> str:
    return TopicName.parse(topic).namespace_name


class MetadataStore:
    """SQLite-backed metadata. ``clock`` returns milliseconds since the epoch."""

    def __init__(self, path: str | Path, clock: Callable[[], int] | None = None, *, bootstrap: bool = True):
        """``bootstrap``: create the ``public`` tenant and ``public/default`` namespace when
        missing (what embedded uses and tests expect). The standalone broker passes False and
        creates them itself, under Pulsar's rule (``broker.default_namespace``); other processes
        opening a broker's data directory (``compact-topic``) pass False and never create them."""
        self.path = str(path)
        self._bootstrap_defaults = bootstrap
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._lock = threading.RLock()
        self._depth = 0
        self._listeners: list[Callable[[str, str], None]] = []
        self._pending_events: list[tuple[str, str]] = []
        self._allocate: Callable[[], int] | None = None
        try:
            if self.path != ":memory:":
                create_private_file(self.path)  # 0600; SQLite gives its -wal/-shm the same mode
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA busy_timeout=30000")
            self._db.execute("PRAGMA synchronous=FULL")
            with self.transaction():
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        self._db.execute(stmt)
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise MetadataError(
                        f"{self.path} has schema version {version}; this compactmq knows {SCHEMA_VERSION}"
                    )
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                self._bootstrap()
        except sqlite3.Error as e:
            raise MetadataError(f"cannot open metadata store {self.path}: {e}") from e

    # --- plumbing ---------------------------------------------------------------------------

    def now_ms(self) -> int:
        return self._clock()

    @contextmanager
    def transaction(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``); nested calls join the outer one.

        ``durable=False`` commits without waiting for the WAL fsync (cursor updates).
        """
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self._db
                finally:
                    self._depth -= 1
                return
            try:
                if not durable:
                    self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise MetadataError(f"metadata store: cannot begin a transaction: {e}") from e
            self._depth = 1
            ok = False
            try:
                yield self._db
                ok = True
            except sqlite3.Error as e:
                raise MetadataError(f"metadata store: {e}") from e
            finally:
                self._depth = 0
                try:
                    self._db.execute("COMMIT" if ok else "ROLLBACK")
                except sqlite3.Error as e:
                    if ok:
                        try:
                            self._db.execute("ROLLBACK")
                        except sqlite3.Error:
                            pass
                        raise MetadataError(f"metadata store: commit failed: {e}") from e
                finally:
                    if not durable:
                        self._db.execute("PRAGMA synchronous=FULL")
                events, self._pending_events = self._pending_events, []
        # listeners run outside the lock: they may take locks of their own (a managed ledger's)
        if ok:
            for event, topic in events:
                for listener in list(self._listeners):
                    listener(event, topic)

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as e:
                raise MetadataError(f"metadata store: {e}") from e

    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        """A read-only query, for modules that keep tables of their own here (the offload catalog)."""
        return self._query(sql, args)

    def add_listener(self, callback: Callable[[str, str], None]) -> None:
        """``callback(event, topic)`` after a transaction that changed something others cache
        commits (no table left here raises one today: the compaction service's state moved to
        the metadata store, whose watches say when it changes)."""
        self._listeners.append(callback)

    def close(self) -> None:
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error:
                pass

    def _bootstrap(self) -> None:
        self._db.execute("INSERT OR IGNORE INTO sequences(name, value) VALUES ('ledger_id', 0)")
        if not self._bootstrap_defaults:
            return
        # Like a Pulsar standalone without security: the default tenant and namespace exist.
        now = self.now_ms()
        self._db.execute(
            "INSERT OR IGNORE INTO tenants(name, info, created_ms) VALUES ('public', '{}', ?)", (now,)
        )
        self._db.execute(
            "INSERT OR IGNORE INTO namespaces(name, tenant, created_ms) VALUES ('public/default', 'public', ?)",
            (now,),
        )

    # --- ids ---------------------------------------------------------------------------------

    def use_ledger_ids(self, allocate: Callable[[], int]) -> None:
        """Hand out ledger ids from ``allocate`` (``LedgerIdResources``, which managed ledgers use)
        from now on, so that compacted ledgers share the one id space."""
        self._allocate = allocate

    def last_ledger_id(self) -> int:
        """The last id this table's counter handed out (the import lifts the store's counter above it)."""
        return int(self._query("SELECT value FROM sequences WHERE name = 'ledger_id'")[0][0])

    def allocate_ledger_id(self) -> int:
        """A new ledger id, unique across this data directory (ledgers and compacted ledgers)."""
        if self._allocate is not None:
            return self._allocate()
        with self.transaction() as db:
            db.execute("UPDATE sequences SET value = value + 1 WHERE name = 'ledger_id'")
            return db.execute("SELECT value FROM sequences WHERE name = 'ledger_id'").fetchone()[0]

    # --- tenants and namespaces --------------------------------------------------------------

    def create_tenant(self, name: str, info: Mapping[str, Any] | None = None) -> None:
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM tenants WHERE name = ?", (name,)).fetchone():
                raise AlreadyExists(f"tenant {name!r} already exists")
            db.execute(
                "INSERT INTO tenants(name, info, created_ms) VALUES (?, ?, ?)",
                (name, json.dumps(dict(info or {})), self.now_ms()),
            )

    def update_tenant(self, name: str, info: Mapping[str, Any]) -> None:
        with self.transaction() as db:
            cur = db.execute("UPDATE tenants SET info = ? WHERE name = ?", (json.dumps(dict(info)), name))
            if cur.rowcount == 0:
                raise NotFound(f"tenant {name!r} does not exist")

    def get_tenant(self, name: str) -> dict[str, Any] | None:
        rows = self._query("SELECT info FROM tenants WHERE name = ?", (name,))
        return json.loads(rows[0][0]) if rows else None

    def tenants(self) -> list[str]:
        return [r[0] for r in self._query("SELECT name FROM tenants ORDER BY name")]

    def delete_tenant(self, name: str) -> None:
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM namespaces WHERE tenant = ?", (name,)).fetchone():
                raise Conflict(f"tenant {name!r} still has namespaces")
            if db.execute("DELETE FROM tenants WHERE name = ?", (name,)).rowcount == 0:
                raise NotFound(f"tenant {name!r} does not exist")

    def create_namespace(self, namespace: str) -> None:
        """``namespace`` is ``tenant/ns``; the tenant must exist."""
        tenant, _, local = namespace.partition("/")
        if not tenant or not local or "/" in local:
            raise NotFound(f"invalid namespace {namespace!r}: expected tenant/namespace")
        with self.transaction() as db:
            if not db.execute("SELECT 1 FROM tenants WHERE name = ?", (tenant,)).fetchone():
                raise NotFound(f"tenant {tenant!r} does not exist")
            if db.execute("SELECT 1 FROM namespaces WHERE name = ?", (namespace,)).fetchone():
                raise AlreadyExists(f"namespace {namespace!r} already exists")
            db.execute(
                "INSERT INTO namespaces(name, tenant, created_ms) VALUES (?, ?, ?)",
                (namespace, tenant, self.now_ms()),
            )

    def namespace_exists(self, namespace: str) -> bool:
        return bool(self._query("SELECT 1 FROM namespaces WHERE name = ?", (namespace,)))

    def namespaces(self, tenant: str | None = None) -> list[str]:
        if tenant is None:
            return [r[0] for r in self._query("SELECT name FROM namespaces ORDER BY name")]
        return [
            r[0] for r in self._query("SELECT name FROM namespaces WHERE tenant = ? ORDER BY name", (tenant,))
        ]

    def delete_namespace(self, namespace: str) -> None:
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM topics WHERE namespace = ?", (namespace,)).fetchone():
                raise Conflict(f"namespace {namespace!r} still has topics")
            if db.execute("DELETE FROM namespaces WHERE name = ?", (namespace,)).rowcount == 0:
                raise NotFound(f"namespace {namespace!r} does not exist")
            db.execute("DELETE FROM policies WHERE scope = 'namespace' AND name = ?", (namespace,))

    # --- topics and ledgers ------------------------------------------------------------------

    def topic_exists(self, topic: str) -> bool:
        return bool(self._query("SELECT 1 FROM topics WHERE name = ?", (topic,)))

    def topics(self, namespace: str | None = None) -> list[str]:
        if namespace is None:
            return [r[0] for r in self._query("SELECT name FROM topics ORDER BY name")]
        return [
            r[0]
            for r in self._query("SELECT name FROM topics WHERE namespace = ? ORDER BY name", (namespace,))
        ]

    def create_topic(self, topic: str, properties: Mapping[str, Any] | None = None) -> bool:
        """Record a topic (idempotent); True when it was new. Its namespace is created if
        missing, as auto-created topics do in a standalone broker."""
        ns = _namespace_of(topic)
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM topics WHERE name = ?", (topic,)).fetchone():
                return False
            now = self.now_ms()
            tenant = ns.split("/", 1)[0]
            db.execute(
                "INSERT OR IGNORE INTO tenants(name, info, created_ms) VALUES (?, '{}', ?)", (tenant, now)
            )
            db.execute(
                "INSERT OR IGNORE INTO namespaces(name, tenant, created_ms) VALUES (?, ?, ?)",
                (ns, tenant, now),
            )
            db.execute(
                "INSERT INTO topics(name, namespace, created_ms, properties) VALUES (?, ?, ?, ?)",
                (topic, ns, now, json.dumps(dict(properties or {}))),
            )
            return True

    def topic_properties(self, topic: str) -> dict[str, Any]:
        rows = self._query("SELECT properties FROM topics WHERE name = ?", (topic,))
        if not rows:
            raise TopicNotFound(f"topic {topic} does not exist")
        return json.loads(rows[0][0])

    def set_topic_properties(self, topic: str, properties: Mapping[str, Any]) -> None:
        with self.transaction() as db:
            if (
                db.execute(
                    "UPDATE topics SET properties = ? WHERE name = ?", (json.dumps(dict(properties)), topic)
                ).rowcount
                == 0
            ):
                raise TopicNotFound(f"topic {topic} does not exist")

    def delete_topic(self, topic: str) -> list[int]:
        """Forget what these tables hold of a topic (rows of the kinds the resources hold now are
        left from before the import) in one transaction. Whether the topic exists is the
        resources' to say: a topic unknown here is no error.

        Returns the ledger ids whose files the caller deletes next.
        """
        with self.transaction() as db:
            ledger_ids = [r[0] for r in db.execute("SELECT ledger_id FROM ledgers WHERE topic = ?", (topic,))]
            db.execute("DELETE FROM topics WHERE name = ?", (topic,))
            db.execute("DELETE FROM ledgers WHERE topic = ?", (topic,))
            db.execute("DELETE FROM cursors WHERE topic = ?", (topic,))
            db.execute("DELETE FROM policies WHERE scope = 'topic' AND name = ?", (topic,))
            return ledger_ids

    def ledgers(self, topic: str) -> list[LedgerInfo]:
        rows = self._query(
            "SELECT ledger_id, entry_count, size, first_publish_ms, last_publish_ms, state, created_ms, closed_ms "
            "FROM ledgers WHERE topic = ? ORDER BY ledger_id",
            (topic,),
        )
        return [LedgerInfo(*r) for r in rows]

    def ledger_topic(self, ledger_id: int) -> str | None:
        rows = self._query("SELECT topic FROM ledgers WHERE ledger_id = ?", (ledger_id,))
        return rows[0][0] if rows else None

    def add_ledger(self, topic: str, created_ms: int, close: LedgerInfo | None = None) -> int:
        """Allocate a ledger id and record it OPEN for ``topic``; when ``close`` is given, that
        ledger is recorded CLOSED with its final numbers in the same transaction (rollover)."""
        with self.transaction() as db:
            if close is not None:
                self._close_ledger(db, close)
            db.execute("UPDATE sequences SET value = value + 1 WHERE name = 'ledger_id'")
            ledger_id = db.execute("SELECT value FROM sequences WHERE name = 'ledger_id'").fetchone()[0]
            db.execute(
                "INSERT INTO ledgers(ledger_id, topic, state, created_ms) VALUES (?, ?, ?, ?)",
                (ledger_id, topic, LEDGER_OPEN, created_ms),
            )
            return ledger_id

    def close_ledger(self, info: LedgerInfo) -> None:
        with self.transaction() as db:
            self._close_ledger(db, info)

    @staticmethod
    def _close_ledger(db: sqlite3.Connection, info: LedgerInfo) -> None:
        cur = db.execute(
            "UPDATE ledgers SET entry_count = ?, size = ?, first_publish_ms = ?, last_publish_ms = ?, "
            "state = ?, closed_ms = ? WHERE ledger_id = ?",
            (
                info.entry_count,
                info.size,
                info.first_publish_ms,
                info.last_publish_ms,
                LEDGER_CLOSED,
                info.closed_ms,
                info.ledger_id,
            ),
        )
        if cur.rowcount == 0:
            raise MetadataError(f"ledger {info.ledger_id} is not in the metadata store")

    def delete_ledgers(self, topic: str, ledger_ids: list[int]) -> None:
        with self.transaction() as db:
            db.executemany(
                "DELETE FROM ledgers WHERE topic = ? AND ledger_id = ?", [(topic, i) for i in ledger_ids]
            )

    # --- cursors -----------------------------------------------------------------------------

    def load_cursors(self, topic: str) -> list[CursorRecord]:
        rows = self._query(
            "SELECT topic, name, mark_delete_ledger, mark_delete_entry, acked_ranges, properties, created_ms "
            "FROM cursors WHERE topic = ? ORDER BY name",
            (topic,),
        )
        return [
            CursorRecord(r[0], r[1], Position(r[2], r[3]), bytes(r[4]), json.loads(r[5]), r[6]) for r in rows
        ]

    def get_cursor(self, topic: str, name: str) -> CursorRecord | None:
        for rec in self.load_cursors(topic):
            if rec.name == name:
                return rec
        return None

    def save_cursor(
        self,
        topic: str,
        name: str,
        mark_delete: Position,
        acked_ranges: bytes,
        properties: Mapping[str, Any] | None = None,
        durable_commit: bool = False,
    ) -> None:
        """Insert or update a durable cursor (``durable_commit``: wait for the WAL fsync)."""
        props = json.dumps(dict(properties or {}))
        with self.transaction(durable=durable_commit) as db:
            db.execute(
                "INSERT INTO cursors(topic, name, mark_delete_ledger, mark_delete_entry, acked_ranges, "
                "properties, created_ms) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(topic, name) DO UPDATE SET mark_delete_ledger = excluded.mark_delete_ledger, "
                "mark_delete_entry = excluded.mark_delete_entry, acked_ranges = excluded.acked_ranges, "
                "properties = excluded.properties",
                (topic, name, mark_delete[0], mark_delete[1], acked_ranges, props, self.now_ms()),
            )

    def delete_cursor(self, topic: str, name: str) -> bool:
        with self.transaction() as db:
            return db.execute("DELETE FROM cursors WHERE topic = ? AND name = ?", (topic, name)).rowcount > 0

    # --- partitioned topics ------------------------------------------------------------------

    def create_partitioned_topic(self, topic: str, partitions: int) -> None:
        if partitions < 1:
            raise Conflict(f"a partitioned topic needs at least one partition, not {partitions}")
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM partitioned_topics WHERE name = ?", (topic,)).fetchone():
                raise AlreadyExists(f"partitioned topic {topic} already exists")
            db.execute(
                "INSERT INTO partitioned_topics(name, partitions, created_ms) VALUES (?, ?, ?)",
                (topic, partitions, self.now_ms()),
            )

    def get_partitions(self, topic: str) -> int | None:
        """Number of partitions of a partitioned topic, None when ``topic`` is not one."""
        rows = self._query("SELECT partitions FROM partitioned_topics WHERE name = ?", (topic,))
        return rows[0][0] if rows else None

    def update_partitioned_topic(self, topic: str, partitions: int) -> None:
        """Partitions can only be added (as in Pulsar)."""
        with self.transaction() as db:
            row = db.execute("SELECT partitions FROM partitioned_topics WHERE name = ?", (topic,)).fetchone()
            if row is None:
                raise TopicNotFound(f"partitioned topic {topic} does not exist")
            if partitions < row[0]:
                raise Conflict(f"cannot shrink {topic} from {row[0]} to {partitions} partitions")
            db.execute("UPDATE partitioned_topics SET partitions = ? WHERE name = ?", (partitions, topic))

    def delete_partitioned_topic(self, topic: str) -> None:
        with self.transaction() as db:
            if db.execute("DELETE FROM partitioned_topics WHERE name = ?", (topic,)).rowcount == 0:
                raise TopicNotFound(f"partitioned topic {topic} does not exist")

    def partitioned_topics(self, namespace: str | None = None) -> dict[str, int]:
        rows = self._query("SELECT name, partitions FROM partitioned_topics ORDER BY name")
        return {n: p for n, p in rows if namespace is None or _namespace_of(n) == namespace}

    # --- policies ----------------------------------------------------------------------------

    def set_topic_policy(self, topic: str, key: str, value: Any) -> None:
        self._set_policy("topic", topic, key, value)

    def remove_topic_policy(self, topic: str, key: str) -> None:
        self._remove_policy("topic", topic, key)

    def get_topic_policies(self, topic: str) -> dict[str, Any]:
        return self._get_policies("topic", topic)

    def set_namespace_policy(self, namespace: str, key: str, value: Any) -> None:
        self._set_policy("namespace", namespace, key, value)

    def remove_namespace_policy(self, namespace: str, key: str) -> None:
        self._remove_policy("namespace", namespace, key)

    def get_namespace_policies(self, namespace: str) -> dict[str, Any]:
        return self._get_policies("namespace", namespace)

    def set_policies(self, scope: str, name: str, values: Mapping[str, Any]) -> None:
        """Set several policies of one topic or namespace in one transaction (``None`` removes)."""
        with self.transaction():
            for key, value in values.items():
                if value is None:
                    self._remove_policy(scope, name, key)
                else:
                    self._set_policy(scope, name, key, value)

    def effective_policy(self, topic: str, key: str, default: Any = None) -> Any:
        """The topic's policy, else its namespace's, else ``default`` (the broker config)."""
        rows = self._query(
            "SELECT scope, value FROM policies WHERE key = ? AND "
            "((scope = 'topic' AND name = ?) OR (scope = 'namespace' AND name = ?))",
            (key, topic, _namespace_of(topic)),
        )
        found = {scope: json.loads(value) for scope, value in rows}
        if "topic" in found:
            return found["topic"]
        if "namespace" in found:
            return found["namespace"]
        return default

    def _set_policy(self, scope: str, name: str, key: str, value: Any) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO policies(scope, name, key, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(scope, name, key) DO UPDATE SET value = excluded.value",
                (scope, name, key, json.dumps(value)),
            )

    def _remove_policy(self, scope: str, name: str, key: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM policies WHERE scope = ? AND name = ? AND key = ?", (scope, name, key))

    def policy_names(self, scope: str) -> list[str]:
        """The topics (``scope="topic"``) or namespaces that have policies here."""
        return [
            r[0]
            for r in self._query("SELECT DISTINCT name FROM policies WHERE scope = ? ORDER BY name", (scope,))
        ]

    def _get_policies(self, scope: str, name: str) -> dict[str, Any]:
        rows = self._query("SELECT key, value FROM policies WHERE scope = ? AND name = ?", (scope, name))
        return {k: json.loads(v) for k, v in rows}

    # --- the old compaction tables (read once, by the legacy import) ----------------------------

    def legacy_compaction_states(self) -> list[dict[str, Any]]:
        """The rows of the ``compaction_state`` table a data directory written before the
        compaction service owned its state still has (with its ``compaction_details``), as dicts
        of column values; empty when the tables do not exist. The compaction state itself lives
        in the metadata store (``resources.CompactionStateResources``)."""
        tables = {r[0] for r in self._query("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "compaction_state" not in tables:
            return []
        columns = (
            "topic, compacted_ledger_id, horizon_ledger, horizon_entry, status, last_error, started_ms, "
            "last_success_ms, last_failure_ms, last_duration_ms, removed_event_count"
        )
        names = [c.strip() for c in columns.split(",")]
        rows = [
            dict(zip(names, r)) for r in self._query(f"SELECT {columns} FROM compaction_state ORDER BY topic")
        ]
        if "compaction_details" in tables:
            details = {
                r[0]: (r[1], r[2])
                for r in self._query("SELECT topic, view_id, details FROM compaction_details")
            }
            for row in rows:
                view_id, raw = details.get(row["topic"], (None, None))
                row["details_view_id"] = view_id
                try:
                    row["details"] = dict(json.loads(raw)) if raw else {}
                except (ValueError, TypeError):
                    row["details"] = {}
        return rows
