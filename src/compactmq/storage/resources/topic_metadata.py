"""Topics, their ledger lists and their cursors over the resources: what a managed ledger asks of
its metadata.

::

    /managed-ledgers/{tenant}/{ns}/persistent/{topic}            the topic's ManagedLedgerInfo
    /managed-ledgers/{tenant}/{ns}/persistent/{topic}/{cursor}   one durable cursor
    /ledgers/next-id                                             the ledger id counter

A topic exists when its managed-ledger key does (Pulsar's rule). Its value holds the ledger list
and the topic's properties, as Pulsar's ``ManagedLedgerInfo`` does::

    {"ledgerInfo": [{"ledgerId", "entries", "size", "firstPublishMs", "lastPublishMs", "state",
                     "createdMs", "closedMs"}, ...],
     "properties": {...}, "createdMs": n}

A cursor's value is ``{"markDeleteLedgerId", "markDeleteEntryId", "individualDeletedMessages"
(the acked ranges, base64 of ``cursor.RangeSet`` bytes), "properties", "createdMs"}``.

``TopicMetadata`` is the object a ``ManagedLedger`` holds as its metadata store; it speaks the
managed ledger's words (``ledgers``, ``add_ledger``, ``close_ledger``, ``delete_ledgers``, cursor
records, ``effective_policy``, ``transaction``) and the topic words of the callers above storage.

Ledger-list changes are pure functions of the list, applied by read-modify-write with
compare-and-set (``BaseResources._update``): a lost race re-reads and re-applies, so a topic
property written by another thread (the producer epoch) and a rollover never undo each other.
``with transaction():`` collects the changes of the calling thread and writes each topic's info
ONCE on exit (the managed ledger's recovery: close what was open, drop what was empty, open a new
ledger, in one write). An id handed out inside a transaction that then fails is never used.
In a cluster every commit of a topic's info and every cursor write carries the topic's
ownership fence (``fence``: ``fence_for(topic)``, set by the storage): a broker that lost the
topic gets ``Fenced`` and writes nothing.

Cursors: an acknowledgement moves a mark-delete position, and writing the store per ack would
cost ZooKeeper a write per message. In the process that owns the topics (not read-only) each
cursor writes through a ``CursorWriter`` at most ``managedLedgerDefaultMarkDeleteRateLimit``
times a second (Pulsar's default 1.0; 0: no limit); the newest position waits in memory and is
written by a background flush every ``managedLedgerCursorPositionFlushSeconds`` (Pulsar's
default 60), when the managed ledger closes (``flush_cursors``: unload, broker shutdown) and at
``close``. A cursor's first write (a new subscription) is never delayed, and deleting a cursor
is immediate. After a crash a cursor may step back by what was pending: redelivery, never loss.
A read-only process (a ``compact-topic`` job) writes at once: it may exit any time.

Another process may move a cursor (a compaction commit moves ``__compaction``): a write that
finds the version moved re-reads, and keeps whichever position is further ahead.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Mapping

from ...errors import AlreadyExists, MetadataError, NotFound, TopicNotFound
from ...naming import TopicName
from ..metadata_store import NEW, BadVersion, Put, StoreUnavailable
from ..position import LEDGER_CLOSED, LEDGER_OPEN, LedgerInfo, Position
from .base import Json, dumps
from .close_batch import BatchItem, apply_ledger_ops, write_ledger_changes
from .cursor_writer import DEFAULT_RATE_PER_S, CursorWriter
from .fence import NO_FENCE, Fence, Fenced, fenced_update
from .ledger_ids import LedgerIdResources
from .managed_ledgers import ManagedLedgerResources, managed_ledger_path
from .policies import PolicyResources
from .tenants import NamespaceResources, TenantResources

log = logging.getLogger(__name__)

#: Pulsar's default managedLedgerCursorPositionFlushSeconds
DEFAULT_FLUSH_INTERVAL_S = 60.0
#: Pulsar's default managedLedgerMaxUnackedRangesToPersist: acked ranges past it stay in memory
#: only (redelivered after a crash), so a cursor's value stays far below the store's size limit
DEFAULT_MAX_RANGES = 10_000
#: bytes of one acked range (two int64, see ``cursor.RangeSet``)
RANGE_BYTES = 16

Op = Callable[[list[Json]], list[Json]]


@dataclass(frozen=True)
class CursorRecord:
    """A durable cursor as stored; ``Cursor`` is the live object built from it."""

    topic: str
    name: str
    mark_delete: Position
    acked_ranges: bytes
    properties: dict[str, Any]
    created_ms: int


def ledger_json(li: LedgerInfo) -> Json:
    return {
        "ledgerId": li.ledger_id,
        "entries": li.entry_count,
        "size": li.size,
        "firstPublishMs": li.first_publish_ms,
        "lastPublishMs": li.last_publish_ms,
        "state": li.state,
        "createdMs": li.created_ms,
        "closedMs": li.closed_ms,
    }


def ledger_info(j: Json) -> LedgerInfo:
    return LedgerInfo(
        int(j["ledgerId"]), int(j["entries"]), int(j["size"]), j.get("firstPublishMs"),
        j.get("lastPublishMs"), str(j["state"]), int(j.get("createdMs") or 0), j.get("closedMs"),
    )  # fmt: skip


def cursor_json(
    mark_delete: Position,
    acked: bytes,
    props: Mapping[str, Any],
    created_ms: int,
    max_ranges: int = DEFAULT_MAX_RANGES,
) -> Json:
    """A cursor's value; only the first ``max_ranges`` acked ranges are kept (Pulsar's rule)."""
    return {
        "markDeleteLedgerId": int(mark_delete[0]),
        "markDeleteEntryId": int(mark_delete[1]),
        "individualDeletedMessages": base64.b64encode(bytes(acked[: max_ranges * RANGE_BYTES])).decode(),
        "properties": dict(props),
        "createdMs": created_ms,
    }


def cursor_record(topic: str, name: str, j: Json) -> CursorRecord:
    return CursorRecord(
        topic, name, Position(int(j["markDeleteLedgerId"]), int(j["markDeleteEntryId"])),
        base64.b64decode(j.get("individualDeletedMessages") or ""), dict(j.get("properties") or {}),
        int(j.get("createdMs") or 0),
    )  # fmt: skip


def _mark_delete(j: Json) -> Position:
    return Position(int(j["markDeleteLedgerId"]), int(j["markDeleteEntryId"]))


class TopicMetadata:
    def __init__(
        self,
        managed_ledgers: ManagedLedgerResources,
        ledger_ids: LedgerIdResources,
        tenants: TenantResources,
        namespaces: NamespaceResources,
        policies: PolicyResources,
        *,
        read_only: bool = False,
        mark_delete_rate: float = DEFAULT_RATE_PER_S,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        max_ranges: int = DEFAULT_MAX_RANGES,
        clock: Callable[[], int] | None = None,
        cursor_clock: Callable[[], float] = time.monotonic,
    ):
        """``cursor_clock`` (seconds) paces cursor writes (tests pass a fake one)."""
        self._ml = managed_ledgers
        self._ids = ledger_ids
        self._tenants = tenants
        self._namespaces = namespaces
        self.policies = policies
        self._read_only = read_only
        self._rate = 0.0 if read_only else float(mark_delete_rate)
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._max_ranges = max(0, int(max_ranges))
        self._cursor_clock = cursor_clock
        self._lock = threading.Lock()
        self._ledger_topic: dict[int, str] = {}
        self._writers: dict[tuple[str, str], CursorWriter] = {}
        self._local = threading.local()
        #: the changes of every thread while ``shared_batch`` is open (guarded by ``_lock``)
        self._shared: dict[str, list[Op]] | None = None
        self._shared_writers: list[CursorWriter] = []
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        #: topic -> the fence its commits carry (``Storage`` sets it; single node: none)
        self.fence_for: Callable[[str], Fence] = lambda topic: NO_FENCE
        if not read_only and self._rate > 0 and flush_interval_s > 0:
            self._flusher = threading.Thread(
                target=self._flush_loop, args=(flush_interval_s,), name="cursor-flush", daemon=True
            )
            self._flusher.start()

    # --- topics ------------------------------------------------------------------------------

    def topic_exists(self, topic: str) -> bool:
        tn = TopicName.parse(topic)
        return tn.persistent and self._ml.exists(tn)

    def topics(self, namespace: str | None = None) -> list[str]:
        """The persistent topics of ``namespace`` (None: of every namespace), sorted."""
        if namespace is None:
            spaces = [ns for t in self._tenants.list_tenants() for ns in self._namespaces.list_namespaces(t)]
        else:
            spaces = [namespace]
        return sorted(str(tn) for ns in spaces for tn in self._ml.list_topics(ns))

    def create_topic(self, topic: str, properties: Mapping[str, Any] | None = None) -> bool:
        """Create the topic's managed-ledger info; False when it exists already."""
        value = {"ledgerInfo": [], "properties": dict(properties or {}), "createdMs": self._clock()}
        try:
            self._ml.create(TopicName.parse(topic), value)
            return True
        except AlreadyExists:
            return False

    def delete_topic(self, topic: str) -> list[int]:
        """Delete the topic, its cursors and its policies; returns the ids of its ledgers."""
        tn = TopicName.parse(topic)
        got = self._ml.get(tn) if tn.persistent else None
        if got is None:
            raise TopicNotFound(f"topic {topic} does not exist")
        with self._lock:
            for key in [k for k in self._writers if k[0] == topic]:
                self._writers.pop(key).discard()
        try:
            self._ml.delete(tn)
        except NotFound:
            raise TopicNotFound(f"topic {topic} does not exist") from None
        self.policies.delete_topic_policies(topic)
        ids = [int(j["ledgerId"]) for j in got[0].get("ledgerInfo", [])]
        with self._lock:
            for i in ids:
                self._ledger_topic.pop(i, None)
        return ids

    def topic_properties(self, topic: str) -> dict[str, Any]:
        got = self._ml.get(TopicName.parse(topic))
        if got is None:
            raise TopicNotFound(f"topic {topic} does not exist")
        return dict(got[0].get("properties") or {})

    def set_topic_properties(self, topic: str, properties: Mapping[str, Any]) -> None:
        props = dict(properties)
        self._update_info(topic, lambda info: {**info, "properties": props})

    def update_topic_properties(
        self, topic: str, fn: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Read-modify-write of the topic's properties (``fn`` is re-applied if another writer won)."""
        info = self._update_info(
            topic, lambda info: {**info, "properties": fn(dict(info.get("properties") or {}))}
        )
        return dict(info["properties"])

    def effective_policy(self, topic: str, key: str, default: Any = None) -> Any:
        return self.policies.effective_policy(topic, key, default)

    # --- the ledger list ---------------------------------------------------------------------

    def ledgers(self, topic: str) -> list[LedgerInfo]:
        got = self._ml.get(TopicName.parse(topic))
        infos = [] if got is None else [ledger_info(j) for j in got[0].get("ledgerInfo", [])]
        with self._lock:
            for li in infos:
                self._ledger_topic[li.ledger_id] = topic
        return infos

    def add_ledger(self, topic: str, created_ms: int, close: LedgerInfo | None = None) -> int:
        """A new ledger id recorded OPEN for ``topic``; ``close`` is recorded CLOSED in the same write."""
        ledger_id = self._ids.allocate()
        new = ledger_json(LedgerInfo(ledger_id, 0, 0, None, None, LEDGER_OPEN, created_ms))
        with self._lock:
            self._ledger_topic[ledger_id] = topic
        with self.transaction():
            if close is not None:
                self.close_ledger(close)
            self._change(topic, lambda ledgers: [*ledgers, new])
        return ledger_id

    def close_ledger(self, info: LedgerInfo) -> None:
        with self._lock:
            topic = self._ledger_topic.get(info.ledger_id)
        if topic is None:
            raise MetadataError(f"ledger {info.ledger_id} is not in the metadata store")
        closed = ledger_json(info._replace(state=LEDGER_CLOSED))

        def close(ledgers: list[Json]) -> list[Json]:
            if not any(j["ledgerId"] == info.ledger_id for j in ledgers):
                raise MetadataError(f"ledger {info.ledger_id} is not in the metadata store")
            return [{**j, **closed, "createdMs": j.get("createdMs")} if j["ledgerId"] == info.ledger_id else j
                    for j in ledgers]  # fmt: skip

        self._change(topic, close)

    def delete_ledgers(self, topic: str, ledger_ids: list[int]) -> None:
        gone = set(ledger_ids)
        self._change(topic, lambda ledgers: [j for j in ledgers if j["ledgerId"] not in gone])
        with self._lock:
            for i in gone:
                self._ledger_topic.pop(i, None)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Collect this thread's ledger-list changes; write each topic's info once on exit."""
        batch: dict[str, list[Op]] | None = getattr(self._local, "batch", None)
        if batch is not None:  # nested: joins the outer one
            yield
            return
        self._local.batch = batch = {}
        try:
            yield
        finally:
            self._local.batch = None
        for topic, ops in batch.items():
            self._write_ledgers(topic, ops)

    @contextmanager
    def shared_batch(self) -> Iterator[int]:
        """Closing many topics at once: the ledger-list changes of EVERY thread (outside a
        ``transaction``) are held until exit, then written in a few multi-key commits
        (``close_batch``). Yields nothing useful; ``last_batch_commits`` tells how many commits
        the last batch made. Until exit a change is not in the store: use it only where a
        crash meanwhile is harmless (a ledger left OPEN is recovered at the next open)."""
        with self._lock:
            if self._shared is not None:
                raise RuntimeError("a shared batch is already open")
            self._shared = {}
            self._shared_writers = []
        try:
            yield 0
        finally:
            with self._lock:
                changes, self._shared = self._shared, None
                writers, self._shared_writers = self._shared_writers, []
            cursors = [item for item in map(self._cursor_item, writers) if item is not None]
            self.last_batch_commits = write_ledger_changes(
                self._ml.store, changes or {}, self._write_ledgers, self._fenced, cursors
            )

    def _cursor_item(self, writer: CursorWriter) -> BatchItem | None:
        """A cursor's pending position as a batch write; None when it has none, or when it
        must be written alone (now): a new cursor, or one under an ownership fence."""
        got = writer.pending_write()
        if got is None:
            return None
        fence = writer.fence()
        if got[1] == NEW or fence.checks or fence.lost:
            self._guarded(writer, writer.flush)
            return None
        info, version = got
        path = self._ml._cursor_path(writer.topic, writer.cursor)
        return BatchItem(
            Put(path, dumps(info), version),
            lambda stat: writer.written(info, stat.version),
            lambda: self._guarded(writer, writer.flush),
        )

    last_batch_commits = 0

    def _fenced(self, topic: str) -> bool:
        fence = self.fence_for(topic)
        return bool(fence.checks or fence.lost)

    def _change(self, topic: str, op: Op) -> None:
        batch = getattr(self._local, "batch", None)
        if batch is not None:
            batch.setdefault(topic, []).append(op)
            return
        with self._lock:
            shared = self._shared
            if shared is not None:
                shared.setdefault(topic, []).append(op)
                return
        self._write_ledgers(topic, [op])

    def _write_ledgers(self, topic: str, ops: list[Op]) -> None:
        self._update_info(topic, lambda info: apply_ledger_ops(info, ops))

    def _update_info(self, topic: str, fn: Callable[[Json], Json]) -> Json:
        path = managed_ledger_path(TopicName.parse(topic))
        fence = self.fence_for(topic)
        try:
            if fence.checks or fence.lost:
                return fenced_update(self._ml.store, path, fn, f"topic {topic}", fence)
            return self._ml._update(path, fn, f"topic {topic}")
        except NotFound:
            raise TopicNotFound(f"topic {topic} does not exist") from None

    # --- cursors -----------------------------------------------------------------------------

    def load_cursors(self, topic: str) -> list[CursorRecord]:
        tn = TopicName.parse(topic)
        found = (self.get_cursor(topic, name) for name in self._ml.list_cursors(tn))
        return [rec for rec in found if rec is not None]

    def get_cursor(self, topic: str, name: str) -> CursorRecord | None:
        """The cursor as stored, or as this process last saved it when that is further ahead."""
        got = self._ml.get_cursor(TopicName.parse(topic), name)
        stored = None if got is None else got[0]
        with self._lock:
            writer = self._writers.get((topic, name))
        pending = writer.pending_info if writer is not None else None
        if pending is not None and (stored is None or _mark_delete(pending) >= _mark_delete(stored)):
            stored = pending
        return None if stored is None else cursor_record(topic, name, stored)

    def save_cursor(
        self,
        topic: str,
        name: str,
        mark_delete: Position,
        acked_ranges: bytes,
        properties: Mapping[str, Any] | None = None,
        durable_commit: bool = False,
    ) -> None:
        """Record the cursor's state; written now or within the rate (see the module docstring).
        ``durable_commit``: write now, whatever the rate."""
        writer = self._writer(topic, name)
        info = cursor_json(mark_delete, acked_ranges, properties or {}, writer.created_ms, self._max_ranges)
        self._guarded(writer, lambda: writer.update(info))
        if durable_commit:
            self._guarded(writer, writer.flush)

    def delete_cursor(self, topic: str, name: str) -> bool:
        with self._lock:
            writer = self._writers.pop((topic, name), None)
        if writer is not None:
            writer.discard()
        try:
            self._ml.delete_cursor(TopicName.parse(topic), name)
            return True
        except NotFound:
            return False

    def advance_cursor(self, topic: str, name: str, position: Position) -> None:
        """Move a cursor forward to ``position`` (its acked ranges cleared), creating it when
        missing; never backward (a compaction commit moving ``__compaction``)."""
        tn = TopicName.parse(topic)
        for _ in range(16):
            got = self._ml.get_cursor(tn, name)
            if got is not None and _mark_delete(got[0]) >= position:
                return
            created = self._clock() if got is None else int(got[0].get("createdMs") or 0)
            props = {} if got is None else got[0].get("properties") or {}
            try:
                self._ml.put_cursor(
                    tn,
                    name,
                    cursor_json(position, b"", props, created),
                    NEW if got is None else got[1],
                    self.fence_for(topic),
                )
                return
            except BadVersion:
                continue
        raise BadVersion(f"cursor {name} of {topic}: still contended")

    def flush_cursors(self, topic: str | None = None) -> None:
        """Write every pending cursor position of ``topic`` (None: of all topics) now."""
        with self._lock:
            writers = [w for (t, _), w in self._writers.items() if topic is None or t == topic]
            if topic is not None:  # the managed ledger closed: its writers go with it
                for key in [k for k in self._writers if k[0] == topic]:
                    del self._writers[key]
            if self._shared is not None:  # many topics closing: written with the batch
                self._shared_writers.extend(writers)
                return
        for writer in writers:
            self._guarded(writer, writer.flush)

    def close(self) -> None:
        self._stop.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join(timeout=10)
        self.flush_cursors()

    def _writer(self, topic: str, name: str) -> CursorWriter:
        key = (topic, name)
        with self._lock:
            writer = self._writers.get(key)
        if writer is not None:
            return writer
        got = self._ml.get_cursor(TopicName.parse(topic), name)
        version = NEW if got is None else got[1]
        writer = CursorWriter(self._ml, TopicName.parse(topic), name, version, self._rate, self._cursor_clock)
        writer.fence = lambda: self.fence_for(topic)
        writer.created_ms = self._clock() if got is None else int(got[0].get("createdMs") or 0)
        with self._lock:
            return self._writers.setdefault(key, writer)

    def _guarded(self, writer: CursorWriter, write: Callable[[], bool]) -> None:
        """Run a write of ``writer``; on a lost race keep the further-ahead position (see above)."""
        try:
            write()
            return
        except NotFound:  # the topic was deleted: nothing to keep
            writer.discard()
            return
        except Fenced as exc:  # another broker owns the topic now: its position stands
            writer.discard()
            log.warning("cursor %s of %s not written: %s", writer.cursor, writer.topic, exc)
            return
        except BadVersion:
            pass
        except StoreUnavailable as exc:
            if writer.version == NEW:  # a new cursor must exist before its subscription does
                raise
            # a position update: it stays pending (the writer keeps it) and the next ack, the
            # periodic flush or the close writes it once the store answers again
            log.warning("cursor %s of %s not written yet: %s", writer.cursor, writer.topic, exc)
            return
        got = self._ml.get_cursor(writer.topic, writer.cursor)
        pending = writer.pending_info
        if got is None or pending is None or _mark_delete(got[0]) > _mark_delete(pending):
            writer.discard()  # deleted elsewhere, or the other writer is ahead: its state stands
            if got is not None:
                writer.version = got[1]
            return
        writer.version = got[1]
        try:
            writer.flush()
        except (BadVersion, NotFound) as exc:
            log.warning(
                "cursor %s of %s not written (moved elsewhere meanwhile): %s",
                writer.cursor,
                writer.topic,
                exc,
            )

    def _flush_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            with self._lock:
                writers = list(self._writers.values())
            for writer in writers:
                if writer.pending:
                    try:
                        self._guarded(writer, writer.flush_if_due)
                    except Exception as exc:  # the store is away: the next round tries again
                        log.warning("cursor flush of %s failed: %s", writer.topic, exc)
