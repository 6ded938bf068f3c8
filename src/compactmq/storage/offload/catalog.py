"""The offload catalog: which objects in object storage hold which ledger, in the metadata store.

One row per committed offloaded object pair (data + index). A row is written in the SAME
transaction that makes the offload count (for a ledger: after both objects are durable; for a
compacted ledger: just before the compaction commit names it), so the metadata store never names an
object that is not complete, and the object store never holds a complete object the metadata
store does not name -- except for the short window of a crash, which the sweeps close:

* an object with no row (a crash after the write, before the commit) is an *orphan*: deleted by
  ``LedgerOffloader.sweep_orphans`` at start (ledgers) or by the compaction run holding the
  topic's lock (compacted ledgers);
* a row whose ledger is gone (retention, topic deletion, a superseded compacted ledger) is
  *dead*: its objects are deleted, then the row. Deleting the ledger row first and the objects
  after is the "write, commit, delete the old" order; a crash in between leaves a dead row that
  the next sweep finishes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .blobstore import OffloadLocation

LEDGER, COMPACTED = "ledger", "compacted"

SCHEMA = """
CREATE TABLE IF NOT EXISTS offloaded_objects (
    data_key         TEXT PRIMARY KEY,      -- key of the data object (the index object: index_key)
    index_key        TEXT NOT NULL,
    kind             TEXT NOT NULL CHECK (kind IN ('ledger', 'compacted')),
    topic            TEXT NOT NULL,
    ledger_id        INTEGER NOT NULL,
    location         TEXT NOT NULL,         -- OffloadLocation as JSON (no credentials)
    data_size        INTEGER NOT NULL,
    offloaded_ms     INTEGER NOT NULL,
    local_deleted_ms INTEGER
);
CREATE INDEX IF NOT EXISTS offloaded_by_ledger ON offloaded_objects(ledger_id);
CREATE TABLE IF NOT EXISTS offload_instance (
    id TEXT NOT NULL                        -- object-key prefix of this data directory
);
"""


@dataclass(frozen=True)
class OffloadRecord:
    data_key: str
    index_key: str
    kind: str
    topic: str
    ledger_id: int
    location: OffloadLocation
    data_size: int
    offloaded_ms: int
    local_deleted_ms: int | None = None


_COLUMNS = "data_key, index_key, kind, topic, ledger_id, location, data_size, offloaded_ms, local_deleted_ms"


def _record(row) -> OffloadRecord:
    return OffloadRecord(
        row[0],
        row[1],
        row[2],
        row[3],
        int(row[4]),
        OffloadLocation.from_json(row[5]),
        int(row[6]),
        int(row[7]),
        row[8],
    )


class OffloadCatalog:
    def __init__(self, store):
        self.store = store
        with store.transaction() as db:
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    db.execute(stmt)
            if db.execute("SELECT 1 FROM offload_instance").fetchone() is None:
                db.execute(
                    "INSERT INTO offload_instance(id) VALUES (?)", (f"compactmq-{uuid.uuid4().hex[:16]}",)
                )

    def instance_id(self) -> str:
        return self.store.query("SELECT id FROM offload_instance")[0][0]

    def add(self, rec: OffloadRecord) -> None:
        """Record a committed offload (joins an enclosing transaction)."""
        with self.store.transaction() as db:
            db.execute(
                f"INSERT INTO offloaded_objects({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    rec.data_key,
                    rec.index_key,
                    rec.kind,
                    rec.topic,
                    rec.ledger_id,
                    rec.location.to_json(),
                    rec.data_size,
                    rec.offloaded_ms,
                    rec.local_deleted_ms,
                ),
            )

    def get(self, kind: str, ledger_id: int) -> OffloadRecord | None:
        rows = self.store.query(
            f"SELECT {_COLUMNS} FROM offloaded_objects WHERE kind = ? AND ledger_id = ? "
            "ORDER BY offloaded_ms DESC",
            (kind, ledger_id),
        )
        return _record(rows[0]) if rows else None

    def for_topic(self, topic: str, kind: str = LEDGER) -> dict[int, OffloadRecord]:
        rows = self.store.query(
            f"SELECT {_COLUMNS} FROM offloaded_objects WHERE topic = ? AND kind = ?", (topic, kind)
        )
        return {r.ledger_id: r for r in map(_record, rows)}

    def mark_local_deleted(self, data_key: str, when_ms: int) -> None:
        with self.store.transaction() as db:
            db.execute(
                "UPDATE offloaded_objects SET local_deleted_ms = ? WHERE data_key = ?", (when_ms, data_key)
            )

    def remove(self, data_key: str) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM offloaded_objects WHERE data_key = ?", (data_key,))

    def dead(self, topic: str | None = None) -> list[OffloadRecord]:
        """Ledger rows whose ledger no longer exists (compacted rows: see ``compacted``)."""
        where = "" if topic is None else " AND o.topic = ?"
        args = () if topic is None else (topic,)
        rows = self.store.query(
            f"SELECT {', '.join('o.' + c.strip() for c in _COLUMNS.split(','))} FROM offloaded_objects o "
            "WHERE o.kind = 'ledger' AND NOT EXISTS (SELECT 1 FROM ledgers l WHERE l.ledger_id = o.ledger_id "
            "AND l.topic = o.topic)" + where,
            args,
        )
        return [_record(r) for r in rows]

    def compacted(self, topic: str | None = None) -> list[OffloadRecord]:
        """Every compacted-ledger row (of ``topic``): the offloader asks the view pointer which
        of them are still in force (the compaction state is not in these tables)."""
        where = "" if topic is None else " AND topic = ?"
        args = () if topic is None else (topic,)
        rows = self.store.query(
            f"SELECT {_COLUMNS} FROM offloaded_objects WHERE kind = 'compacted'" + where, args
        )
        return [_record(r) for r in rows]

    def known_keys(self) -> set[str]:
        rows = self.store.query("SELECT data_key, index_key FROM offloaded_objects")
        return {k for row in rows for k in row}
