"""The cursors of one managed ledger: opening, looking up, deleting, persisting.

A cursor (``cursor.Cursor``) is a subscription's place in the log. This registry owns the
live cursor objects of one managed ledger, by name, and their durable records in the metadata
store: every durable cursor is loaded when the managed ledger opens, saved after each change
(``save``), deleted with its record. Non-durable cursors (readers) live here only while open.

A cursor another process moves in the metadata store (a ``compact-topic`` job committing its
horizon, a retention hold) is re-read with ``refresh``: created here when it appeared, dropped
when it was removed, moved forward (never back) otherwise.

Cursors call back into their host (``cursor.CursorHost``, the ``ManagedLedger``) for
positions and reads; this module only builds them, so neither imports the other's module.
"""

from __future__ import annotations

from .cursor import Cursor, CursorHost, RangeSet
from .ledger_metadata import LedgerMetadata, StoredCursor
from .ledger_state import LedgerList
from .position import EARLIEST, Position


class CursorRegistry:
    """Live cursors of one managed ledger, by name. Thread-safe (the ledger list's lock)."""

    def __init__(self, host: CursorHost, ledgers: LedgerList, metadata: LedgerMetadata):
        self.topic = ledgers.topic
        self._host = host
        self._ledgers = ledgers
        self._lock = ledgers.lock
        self._store = metadata
        self._cursors: dict[str, Cursor] = {}

    def load(self) -> None:
        """Every durable cursor of the topic, as the metadata store has it (at open)."""
        for rec in self._store.load_cursors(self.topic):
            self._cursors[rec.name] = self._durable_cursor(rec)

    def _durable_cursor(self, rec: StoredCursor) -> Cursor:
        """The in-memory cursor of a durable cursor record of the metadata store."""
        return Cursor(
            self._host,
            rec.name,
            True,
            rec.mark_delete,
            RangeSet.from_bytes(rec.acked_ranges),
            rec.properties,
        )

    def open(self, name: str, durable: bool = True, initial_position: str | Position = "earliest") -> Cursor:
        """Open (or create) a cursor. A durable cursor that exists keeps its position;
        a new one starts before the first entry ("earliest"), after the last ("latest"), or
        at a given position (the next entry it reads is the first at or after it)."""
        with self._lock:
            existing = self._cursors.get(name)
            if existing is not None:
                return existing
            mark_delete = self._initial_mark_delete(initial_position)
            cursor = Cursor(self._host, name, durable, mark_delete)
            if durable:
                self.save(cursor)
            self._cursors[name] = cursor
            return cursor

    def _initial_mark_delete(self, initial_position: str | Position) -> Position:
        host = self._host
        if not isinstance(initial_position, str):
            return host.previous_position(Position(*initial_position))
        where = initial_position.lower()
        if where == "earliest":
            return self.earliest_mark_delete()
        if where == "latest":
            last = host.last_position()
            return last if last is not None else host.previous_position(host.next_position(EARLIEST))
        raise ValueError(f"initial_position must be 'earliest', 'latest' or a Position, not {where!r}")

    def earliest_mark_delete(self) -> Position:
        """The mark-delete position of a cursor before the first entry."""
        first = self._ledgers.ledgers[0].ledger_id if self._ledgers.ledgers else -1
        return Position(first, -1)

    def get(self, name: str) -> Cursor | None:
        with self._lock:
            return self._cursors.get(name)

    def all(self) -> list[Cursor]:
        with self._lock:
            return list(self._cursors.values())

    def delete(self, name: str) -> None:
        """Forget a cursor here and in the metadata store."""
        with self._lock:
            self._drop(name)
            self._store.delete_cursor(self.topic, name)

    def _drop(self, name: str) -> None:
        cursor = self._cursors.pop(name, None)
        if cursor is not None:
            cursor._deleted = True

    def save(self, cursor: Cursor) -> None:
        mark_delete, blob, props = cursor._snapshot()
        self._store.save_cursor(self.topic, cursor.name, mark_delete, blob, props)

    def record(self, name: str) -> StoredCursor | None:
        return self._store.get_cursor(self.topic, name)

    def refresh(self, name: str) -> None:
        """Take cursor ``name`` as the metadata store has it now (another process may have
        created, moved or removed it)."""
        rec = self._store.get_cursor(self.topic, name)
        with self._lock:
            cursor = self._cursors.get(name)
            if rec is None:
                if cursor is not None:  # removed in the store
                    self._drop(name)
                return
            if cursor is None:
                self._cursors[name] = self._durable_cursor(rec)
                return
        cursor.reload()

    def has_durable(self) -> bool:
        """Caller holds the lock."""
        return any(c.durable for c in self._cursors.values())

    def slowest_mark_delete(self) -> Position:
        """The lowest mark-delete position of every cursor (caller holds the lock; one exists)."""
        return min(c.mark_delete_position for c in self._cursors.values())
