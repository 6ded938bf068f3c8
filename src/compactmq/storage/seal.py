"""Sealing a topic's current ledger on behalf of another process (a ``compact-topic`` job).

A compaction run reads only sealed, immutable ledgers (DESIGN §3): those may live in the object
store and be read by Spark executors on other machines, and no append can change them under a
run. The ledger a topic is writing is sealed by a *rollover*, which only the data directory's one
read-write ``Storage`` (the broker) may do. A ``compact-topic`` job opens the directory read-only,
so before it plans it asks for a seal (``seal_before_compaction``):

* **no broker runs** (the data directory's ``LOCK`` is free): the job opens the directory
  read-write for a moment, opens the topic -- recovery seals a ledger a crash left open -- and
  closes it again, which seals the current ledger; the lock is then released, so a broker can
  start while the run goes on;
* **a broker runs** (the lock is held): the job files a *seal request* in the metadata store --
  the channel it already commits through, so it needs no network address and no credentials --
  and waits until the broker answers. Every read-write ``Storage`` runs a ``SealRequestWatcher``
  that polls the table (a query of a few rows every ``POLL_SECONDS``), rolls the topic's current
  ledger over, and stamps the request answered. A broker that stops before answering releases
  the lock, and closing its topics sealed their ledgers: the job notices and finishes the seal
  itself.

Entries appended after the seal go to the new ledger and wait for the next run; the horizon keeps
its meaning (the last position a compacted view covers). A request that is never answered (the
broker hung) makes the job give up after ``timeout`` seconds and compact the sealed ledgers only.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import CompactMQError, StorageError, TopicNotFound
from .position import LEDGER_OPEN

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS seal_requests (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    topic        TEXT NOT NULL,
    requested_ms INTEGER NOT NULL,
    answered_ms  INTEGER,              -- set by the read-write Storage once the topic is sealed
    error        TEXT                  -- why it could not be sealed (NULL when it was)
)
"""
POLL_SECONDS = 0.1

# what seal_before_compaction did (the CLI reports it)
SEALED_HERE, SEALED_BY_BROKER, NOT_SEALED = "sealed by this process", "sealed by the broker", "not sealed"


def ensure_schema(metadata) -> None:
    with metadata.transaction() as db:
        db.execute(SCHEMA)


def file_request(metadata, topic: str) -> int:
    """Ask the read-write Storage of this data directory to seal ``topic``; returns the request id."""
    ensure_schema(metadata)
    with metadata.transaction() as db:
        cur = db.execute(
            "INSERT INTO seal_requests(topic, requested_ms) VALUES (?, ?)", (topic, metadata.now_ms())
        )
        return int(cur.lastrowid)


def request_state(metadata, request_id: int) -> Optional[tuple[bool, Optional[str]]]:
    """``(answered, error)`` of a request; None when it is gone."""
    rows = metadata.query("SELECT answered_ms, error FROM seal_requests WHERE id = ?", (request_id,))
    if not rows:
        return None
    return rows[0][0] is not None, rows[0][1]


def forget_request(metadata, request_id: int) -> None:
    with metadata.transaction() as db:
        db.execute("DELETE FROM seal_requests WHERE id = ?", (request_id,))


class SealRequestWatcher:
    """The read-write side: a daemon thread answering seal requests for ``storage``."""

    def __init__(self, storage, interval: float = POLL_SECONDS):
        self.storage = storage
        self.interval = interval
        self._stop = threading.Event()
        ensure_schema(storage.metadata)
        self._thread = threading.Thread(target=self._loop, name="seal-requests", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.answer_pending()
            except CompactMQError as e:  # the metadata store is closing, or busy: next turn
                if not self._stop.is_set():
                    log.debug("answering seal requests failed: %s", e)

    def answer_pending(self) -> int:
        """Seal the topic of every pending request and stamp it answered; returns how many."""
        meta = self.storage.metadata
        rows = meta.query("SELECT id, topic FROM seal_requests WHERE answered_ms IS NULL ORDER BY id")
        for request_id, topic in rows:
            error = None
            try:
                self.storage.seal_current_ledger(topic)
            except CompactMQError as e:
                error = f"{type(e).__name__}: {e}"
            with meta.transaction() as db:
                db.execute(
                    "UPDATE seal_requests SET answered_ms = ?, error = ? WHERE id = ?",
                    (meta.now_ms(), error, request_id),
                )
            log.info(
                "sealed the current ledger of %s for a compaction job%s",
                topic,
                f" (failed: {error})" if error else "",
            )
        return len(rows)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def seal_before_compaction(
    data_dir, config, topic: str, timeout: float = 30.0, sleep: Callable[[float], None] = time.sleep
) -> str:
    """Make sure every entry ``topic`` holds now is in a sealed ledger (see the module notes).
    Returns ``SEALED_HERE``, ``SEALED_BY_BROKER`` or ``NOT_SEALED`` (the broker did not answer
    within ``timeout``). ``TopicNotFound`` for an unknown topic; ``StorageError`` when the broker
    answered that it could not seal."""
    from .engine import METADATA_FILE, Storage
    from .metadata import MetadataStore

    deadline = time.monotonic() + timeout
    meta: Any = None
    request_id: Optional[int] = None
    try:
        while True:
            try:
                storage = Storage(
                    data_dir, config, bootstrap_defaults=False
                )  # the lock is free: no broker writes here
            except StorageError as e:
                if "in use" not in str(e):
                    raise
            else:
                try:
                    storage.seal_current_ledger(topic)
                finally:
                    storage.close()  # closing the topic seals its current ledger
                return SEALED_HERE
            if meta is None:
                meta = MetadataStore(Path(data_dir) / METADATA_FILE, bootstrap=False)
                if not _topic_exists(data_dir, config, topic):
                    raise TopicNotFound(f"topic {topic} does not exist")
                request_id = file_request(meta, topic)
            state = request_state(meta, request_id) if request_id is not None else None
            if state is not None and state[0]:
                if state[1]:
                    raise StorageError(f"the broker could not seal the current ledger of {topic}: {state[1]}")
                return SEALED_BY_BROKER
            if time.monotonic() >= deadline:
                return NOT_SEALED
            sleep(POLL_SECONDS)
    finally:
        if meta is not None:
            if request_id is not None:
                try:
                    forget_request(meta, request_id)
                except CompactMQError:
                    pass
            meta.close()


def _topic_exists(data_dir, config, topic: str) -> bool:
    """Whether the metadata store (``metadataStoreUrl``) has ``topic`` (asked beside a broker)."""
    from ..naming import TopicName
    from .metadata_store import create_metadata_store
    from .resources import ManagedLedgerResources

    store = create_metadata_store(str(config.get("metadataStoreUrl") or ""), data_dir=Path(data_dir))
    try:
        tn = TopicName.parse(topic)
        return tn.persistent and ManagedLedgerResources(store).exists(tn)
    finally:
        store.close()


def open_ledger_left(metadata, topic: str) -> bool:
    """True when the metadata store records an OPEN ledger of ``topic`` (a topic no process has
    open, after a crash)."""
    return any(info.state == LEDGER_OPEN for info in metadata.ledgers(topic))
