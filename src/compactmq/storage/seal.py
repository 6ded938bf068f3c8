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
  and waits until the broker answers (``resources.SealRequestResources``: an ephemeral sequential
  key, so a job that dies leaves no request behind). Every read-write ``Storage`` runs a
  ``SealRequestWatcher`` that watches the requests (and looks again every ``POLL_SECONDS``, in
  case a notification was lost), rolls the topic's current ledger over, and writes the answer into
  the request, which the job watches. A broker that stops before answering releases the lock,
  and closing its topics sealed their ledgers: the job notices and finishes the seal itself.
  The same works on the embedded store across processes and on ZooKeeper.

Entries appended after the seal go to the new ledger and wait for the next run; the horizon keeps
its meaning (the last position a compacted view covers). A request that is never answered (the
broker hung) makes the job give up after ``timeout`` seconds and compact the sealed ledgers only.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

from ..errors import CompactMQError, StorageError, TopicNotFound
from .metadata_store import MetadataStore, Notification, Watch
from .position import LEDGER_OPEN
from .resources.seal_requests import SealRequestResources

log = logging.getLogger(__name__)

#: how often either side looks again without a notification (watches usually answer first)
POLL_SECONDS = 0.1

# what seal_before_compaction did (the CLI reports it)
SEALED_HERE, SEALED_BY_BROKER, NOT_SEALED = "sealed by this process", "sealed by the broker", "not sealed"


def _now_ms() -> int:
    return int(time.time() * 1000)


class SealRequestWatcher:
    """The read-write side: a daemon thread answering seal requests for ``storage``."""

    def __init__(self, storage, interval: float = POLL_SECONDS):
        self.storage = storage
        self.requests = storage.resources.seal_requests
        self.interval = interval
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._watch: Watch = self.requests.watch_pending(self._notified)
        self._thread = threading.Thread(target=self._loop, name="seal-requests", daemon=True)
        self._thread.start()

    def _notified(self, _: Notification) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.answer_pending()
            except CompactMQError as e:  # the metadata store is closing, or busy: next turn
                if not self._stop.is_set():
                    log.debug("answering seal requests failed: %s", e)

    def answer_pending(self) -> int:
        """Seal the topic of every pending request and answer it; returns how many."""
        pending = self.requests.pending()
        for request in pending:
            error = code = None
            try:
                self.storage.seal_current_ledger(request.topic)
            except CompactMQError as e:
                error, code = f"{type(e).__name__}: {e}", type(e).__name__
            self.requests.answer(request, _now_ms(), error, code)
            log.info(
                "sealed the current ledger of %s for a compaction job%s",
                request.topic,
                f" (failed: {error})" if error else "",
            )
        return len(pending)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._watch.cancel()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def _open_store(data_dir, config) -> MetadataStore:
    """The local metadata store the data directory's writer uses (``metadataStoreUrl``)."""
    from .metadata_store import DEFAULT_OPERATION_TIMEOUT_S, DEFAULT_SESSION_TIMEOUT_MS, create_metadata_store

    return create_metadata_store(
        str(config.get("metadataStoreUrl") or ""),
        data_dir=data_dir,
        session_timeout_ms=int(config.get("metadataStoreSessionTimeoutMillis") or DEFAULT_SESSION_TIMEOUT_MS),
        operation_timeout_s=float(
            config.get("metadataStoreOperationTimeoutSeconds") or DEFAULT_OPERATION_TIMEOUT_S
        ),
    )


def _seal_without_broker(data_dir, config, topic: str) -> bool:
    """Seal ``topic`` in a read-write Storage of our own; False when a writer holds the directory."""
    from .engine import Storage

    try:
        storage = Storage(
            data_dir, config, bootstrap_defaults=False
        )  # the lock is free: no broker writes here
    except StorageError as e:
        if "in use" not in str(e):
            raise
        return False
    try:
        storage.seal_current_ledger(topic)
    finally:
        storage.close()  # closing the topic seals its current ledger
    return True


class _Request:
    """The job's side of one request: filed on first use, answered when the watch fires."""

    def __init__(self, data_dir, config, topic: str):
        self.topic = topic
        self.answered = threading.Event()
        self.store = _open_store(data_dir, config)
        self.requests = SealRequestResources(self.store)
        self.request_id: Optional[str] = None
        self.watch: Optional[Watch] = None

    def outcome(self) -> Optional[str]:
        """``SEALED_BY_BROKER`` once answered, None while waiting; raises the broker's error."""
        state = self.requests.get(self.request_id) if self.request_id is not None else None
        if state is None:  # not filed yet, or gone with an expired session: (re)file it
            self._file()
            return None
        if not state.answered:
            return None
        if state.error:
            if state.code == TopicNotFound.__name__:
                raise TopicNotFound(f"topic {self.topic} does not exist")
            raise StorageError(f"the broker could not seal the current ledger of {self.topic}: {state.error}")
        return SEALED_BY_BROKER

    def _file(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
        self.request_id = self.requests.file(self.topic, _now_ms())
        self.watch = self.requests.watch(self.request_id, lambda _: self.answered.set())

    def wait(self, seconds: float, sleep: Callable[[float], None]) -> None:
        if sleep is time.sleep:
            self.answered.wait(seconds)  # woken by the watch as soon as the broker answers
            self.answered.clear()
        else:
            sleep(seconds)

    def close(self) -> None:
        try:
            if self.watch is not None:
                self.watch.cancel()
            if self.request_id is not None:
                self.requests.withdraw(self.request_id)
        except CompactMQError:
            pass
        finally:
            self.store.close()  # ends the session: an ephemeral request left would go with it


def seal_before_compaction(
    data_dir, config, topic: str, timeout: float = 30.0, sleep: Callable[[float], None] = time.sleep
) -> str:
    """Make sure every entry ``topic`` holds now is in a sealed ledger (see the module notes).
    Returns ``SEALED_HERE``, ``SEALED_BY_BROKER`` or ``NOT_SEALED`` (the broker did not answer
    within ``timeout``). ``TopicNotFound`` for an unknown topic; ``StorageError`` when the broker
    answered that it could not seal."""
    deadline = time.monotonic() + timeout
    request: Optional[_Request] = None
    try:
        while True:
            if _seal_without_broker(data_dir, config, topic):
                return SEALED_HERE
            if request is None:
                request = _Request(data_dir, config, topic)
            outcome = request.outcome()
            if outcome is not None:
                return outcome
            if time.monotonic() >= deadline:
                return NOT_SEALED
            request.wait(POLL_SECONDS, sleep)
    finally:
        if request is not None:
            request.close()


def open_ledger_left(metadata, topic: str) -> bool:
    """True when the metadata store records an OPEN ledger of ``topic`` (a topic no process has
    open, after a crash)."""
    return any(info.state == LEDGER_OPEN for info in metadata.ledgers(topic))
