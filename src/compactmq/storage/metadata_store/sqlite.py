"""``sqlite:<path>`` -- the embedded metadata store: one SQLite file in the data directory.

The default when ``metadataStoreUrl`` is empty, so a one-machine broker needs no other service.
Its tables sit beside today's in ``data_dir/metadata.db`` (prefixed ``store_``), so the data
directory stays one metadata file and the migration of the old tables can be one transaction.

Tables
------
``store_nodes``     one row per key: value, version, times, the owning session of an ephemeral key
                    (NULL: persistent), the next counter of sequential children; ``/`` is a row
``store_sessions``  one row per open store (any process): its heartbeat and timeout
``store_changes``   what each transaction did (path, notification type, writing session), so that
                    watches see changes made by other processes; rows older than a minute go

Durability: a transaction that touches a persistent key commits with ``synchronous=FULL`` (the WAL
is fsynced before ``put`` returns: a structural change is never lost once acknowledged); one that
only touches ephemeral keys, heartbeats or change rows commits with ``NORMAL`` (they die with the
session anyway).

Sessions, as ZooKeeper's: a background thread writes this store's heartbeat every third of
``metadataStoreSessionTimeoutMillis``. Any store that sees another session silent for longer than
its timeout (the process died, or hung) expires it: deletes its ephemeral keys and its row. A store
that finds its own row gone was expired by someone else: it reports ``SessionLost``, starts a new
session and reports ``SessionReestablished``, as a ZooKeeper client does. The same thread polls
``store_changes`` (every ``POLL_INTERVAL_S`` while watches exist) for other processes' changes.
Several processes may open the file (WAL: readers beside one writer; writers wait for each other
up to ``metadataStoreOperationTimeoutSeconds``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...errors import InvalidConfiguration
from . import Notification, NotificationType, SessionEvent, StoreUnavailable
from ..modes import create_private_file
from ._local import LocalMetadataStore, Node, NodeTable, now_ms

#: how often the background thread looks for other processes' changes while watches exist
POLL_INTERVAL_S = 0.05
#: change rows are kept this long: a watcher that has not polled for that long misses changes
CHANGE_RETENTION_MS = 60_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS store_nodes (
    path        TEXT PRIMARY KEY,
    parent      TEXT NOT NULL,
    name        TEXT NOT NULL,
    value       BLOB NOT NULL,
    version     INTEGER NOT NULL,
    created_ms  INTEGER NOT NULL,
    modified_ms INTEGER NOT NULL,
    session     INTEGER,                -- owning session of an ephemeral key; NULL: persistent
    next_seq    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS store_nodes_by_parent ON store_nodes(parent);
CREATE INDEX IF NOT EXISTS store_nodes_by_session ON store_nodes(session) WHERE session IS NOT NULL;
CREATE TABLE IF NOT EXISTS store_sessions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    heartbeat_ms INTEGER NOT NULL,
    timeout_ms   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS store_changes (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    session INTEGER NOT NULL,
    type    TEXT NOT NULL,
    path    TEXT NOT NULL,
    at_ms   INTEGER NOT NULL
);
INSERT OR IGNORE INTO store_nodes (path, parent, name, value, version, created_ms, modified_ms)
    VALUES ('/', '', '', x'', 0, 0, 0);
"""

log = logging.getLogger(__name__)

_COLUMNS = "value, version, created_ms, modified_ms, session, next_seq"


class _SqliteTable(NodeTable):
    def __init__(self, db: sqlite3.Connection):
        super().__init__()
        self._db = db

    def get(self, path: str) -> Node | None:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM store_nodes WHERE path = ?", (path,)).fetchone()
        return None if row is None else Node(bytes(row[0]), *row[1:])

    def children(self, path: str) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT name FROM store_nodes WHERE parent = ?", (path,))]

    def write(self, path: str, node: Node, parent: str) -> None:
        self._db.execute(
            f"INSERT OR REPLACE INTO store_nodes (path, parent, name, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (path, parent, path.rsplit("/", 1)[1], node.value, node.version, node.created_ms, node.modified_ms,
             node.session, node.next_seq),
        )  # fmt: skip

    def remove(self, path: str) -> None:
        self._db.execute("DELETE FROM store_nodes WHERE path = ?", (path,))

    def owned_by(self, session: int) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT path FROM store_nodes WHERE session = ?", (session,))]


class SqliteMetadataStore(LocalMetadataStore):
    def __init__(
        self, path: str | Path, *, session_timeout_ms: int = 30_000, operation_timeout_s: float = 30
    ):
        super().__init__(f"sqlite:{path}")
        self.path = Path(path)
        self._timeout_ms = int(session_timeout_ms)
        self._lock = threading.RLock()
        self._synchronous = ""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # 0600 before SQLite opens it by name (it gives its -wal/-shm the same mode)
            create_private_file(self.path)
            self._db = sqlite3.connect(
                self.path, timeout=operation_timeout_s, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"cannot open the metadata store {self.path}: {exc}") from exc
        self._sessions_of_mine: set[int] = set()
        self._session = self._new_session()
        self._last_change = self._db.execute("SELECT coalesce(max(seq), 0) FROM store_changes").fetchone()[0]
        self._expire_others()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._background, name=f"metadata-sqlite-{self._session}", daemon=True
        )
        self._thread.start()

    @classmethod
    def from_url(cls, rest: str, *, data_dir: Path, session_timeout_ms: int, operation_timeout_s: float):
        return cls(
            resolve_sqlite_path(rest, data_dir),
            session_timeout_ms=session_timeout_ms,
            operation_timeout_s=operation_timeout_s,
        )

    @property
    def session(self) -> int:
        return self._session

    # --- transactions ------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, durable: bool) -> Iterator[NodeTable]:
        with self._lock:
            if self._closed:
                raise StoreUnavailable("the metadata store is closed")
            self._set_synchronous("FULL" if durable else "NORMAL")
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:  # another process held the write lock too long
                raise StoreUnavailable(f"metadata store {self.path}: {exc}") from exc
            table = _SqliteTable(self._db)
            try:
                yield table
                self._record_changes(table.notifications)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    @contextmanager
    def _read(self) -> Iterator[NodeTable]:
        with self._lock:
            if self._closed:
                raise StoreUnavailable("the metadata store is closed")
            yield _SqliteTable(self._db)

    def _set_synchronous(self, mode: str) -> None:
        if mode != self._synchronous:
            self._db.execute(f"PRAGMA synchronous={mode}")
            self._synchronous = mode

    def _record_changes(self, notifications: list[Notification]) -> None:
        if notifications:
            now = now_ms()
            self._db.executemany(
                "INSERT INTO store_changes (session, type, path, at_ms) VALUES (?, ?, ?, ?)",
                [(self._session, n.type.value, n.path, now) for n in notifications],
            )

    # --- sessions ----------------------------------------------------------------------------

    def _new_session(self) -> int:
        with self._lock:
            self._set_synchronous("NORMAL")
            cur = self._db.execute(
                "INSERT INTO store_sessions (heartbeat_ms, timeout_ms) VALUES (?, ?)",
                (now_ms(), self._timeout_ms),
            )
            session = int(cur.lastrowid or 0)
            self._sessions_of_mine.add(session)
            return session

    def _heartbeat(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._set_synchronous("NORMAL")
            cur = self._db.execute(
                "UPDATE store_sessions SET heartbeat_ms = ? WHERE id = ?", (now_ms(), self._session)
            )
            lost = cur.rowcount == 0
            if lost:
                self._session = self._new_session()
        if lost:  # another store expired us: our ephemeral keys are gone
            self._notifier.publish_session(SessionEvent.SESSION_LOST)
            self._notifier.publish_session(SessionEvent.SESSION_REESTABLISHED)

    def _expire_others(self) -> None:
        """Delete the ephemeral keys and rows of sessions silent for longer than their timeout."""
        now = now_ms()
        with self._lock:
            stale = [
                r[0]
                for r in self._db.execute(
                    "SELECT id FROM store_sessions WHERE id != ? AND heartbeat_ms + timeout_ms < ?",
                    (self._session, now),
                )
            ]
        for session in stale:
            with self._mutate(durable=False) as nodes:
                self._end_session(nodes, session)
                self._db.execute("DELETE FROM store_sessions WHERE id = ?", (session,))
        with self._lock:
            self._db.execute("DELETE FROM store_changes WHERE at_ms < ?", (now - CHANGE_RETENTION_MS,))

    def _poll_changes(self) -> None:
        with self._lock:
            if self._closed:
                return
            rows = self._db.execute(
                "SELECT seq, session, type, path FROM store_changes WHERE seq > ? ORDER BY seq",
                (self._last_change,),
            ).fetchall()
        if rows:
            self._last_change = rows[-1][0]
            self._notifier.publish(
                [
                    Notification(NotificationType(t), p)
                    for _, s, t, p in rows
                    if s not in self._sessions_of_mine
                ]
            )

    def _background(self) -> None:
        heartbeat_every = self._timeout_ms / 3000
        next_heartbeat = 0.0
        elapsed = 0.0
        while not self._stop.wait(POLL_INTERVAL_S):
            elapsed += POLL_INTERVAL_S
            try:
                if self._notifier.has_watches():
                    self._poll_changes()
                if elapsed >= next_heartbeat:
                    next_heartbeat = elapsed + heartbeat_every
                    self._heartbeat()
                    self._expire_others()
            except (StoreUnavailable, sqlite3.Error) as exc:
                if self._closed:
                    return
                # busy beyond the timeout, or a disk error: the next round tries again (a session
                # that cannot heartbeat for a whole timeout is expired by the others, as it should)
                log.warning("metadata store %s: background round failed: %s", self.path, exc)

    def close(self) -> None:
        if self._closed:
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        try:
            with self._mutate(durable=False) as nodes:
                self._end_session(nodes, self._session)
                self._db.execute("DELETE FROM store_sessions WHERE id = ?", (self._session,))
        finally:
            with self._lock:
                self._closed = True
                self._db.close()
            self._notifier.close()


def resolve_sqlite_path(rest: str, data_dir: Path) -> Path:
    """The file a ``sqlite:`` URL names: relative paths resolve in the data directory, and the
    result must stay inside it (the data directory is the one place the broker writes)."""
    rest = rest.removeprefix("//")
    if not rest or "\x00" in rest:
        raise InvalidConfiguration("metadataStoreUrl sqlite: needs a file name, e.g. sqlite:metadata.db")
    root = Path(data_dir).resolve()
    path = (root / rest).resolve()
    if path != root and root not in path.parents:
        raise InvalidConfiguration(
            f"metadataStoreUrl sqlite:{rest}: the file must be inside dataDir ({root})"
        )
    if path == root or path.is_dir():
        raise InvalidConfiguration(f"metadataStoreUrl sqlite:{rest}: names a directory, not a file")
    return path
