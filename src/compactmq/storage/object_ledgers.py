"""Ledgers written straight to an object store: ``ObjectLedgerStorage``, a ``LedgerStorage``.

The second implementation of ``ledger_storage.LedgerStorage`` (the contract:
``tests/storage/test_ledger_storage_contract.py``), for brokers whose entries are durable only
once they are in an S3-compatible object store (cluster mode, a later step). The appender and
the reader do not change: they write records at byte offsets, sync, seal and read ranges as
with local files; this module maps those calls onto immutable objects through the project's
``offload.blobstore.BlobStore`` (``pyarrow.fs``: one S3 client for tiered storage and this).

Writing (``ObjectLedgerWriter``, in ``object_ledger_writer`` with its background flusher):
``write`` appends to an in-memory buffer; a *flush* writes
every byte not yet flushed as ONE new object and returns once the PUT completed (durable).
``sync`` is a flush that first waits up to ``objectLedgerFlushIntervalMillis`` after the oldest
unflushed byte (or until ``objectLedgerFlushMaxBytes`` wait), so appends arriving meanwhile
share the object write; flushes of one ledger run one at a time, so under load everything
written during one PUT goes into the next (the group commit grows with the store's latency).
A background thread flushes what nobody syncs (``managedLedgerSyncData=false``) after the same
interval, or as soon as ``objectLedgerFlushMaxBytes`` wait, so memory per ledger stays bounded.
``close`` writes what is still buffered (as a file's page cache would reach the disk), no more.

With a group flush (``object_group_flush``, ``objectLedgerGroupFlushEnabled``; the storage's
``group``), a flush joins the process's next group -- ONE shared object for every ledger (of
every topic) with bytes waiting while the previous group was written, their ranges then
committed in the metadata store under each topic's ownership fence, in one commit; a flush
that finds nothing else waiting is written at once as the ledger's own flush object, as
without a group (``_write_own_flush``), so a lone producer pays no metadata-store write. The
layout then names ranges of shared objects too (``object_layout.shared_part``), read by ranged
GETs; the merge on seal copies them into the ledger's merged object and drops the records.

Reading: bytes of the ledger being written stay in memory from the last
``objectLedgerTailCacheBytes`` on (and every unflushed byte), so readers that keep up never
reach the store; older bytes are read by ranged GETs of the objects that hold them.

Sealing: ``write_index`` (the appender's last step of a seal; recovery's too) writes the index,
then a background thread (one per process) *merges* the ledger's flush objects into one object
holding the whole ledger; the flush objects are deleted only once the merged object is durable.
So a sealed ledger ends as two objects and a read as one ranged GET, whatever the flush count
was. Reads during a merge use the flush objects; one that finds them gone lists the ledger
again. The merges and the ownership fence checked after each flush live in
``object_ledger_upkeep`` (``ObjectLedgerUpkeep``, which this storage inherits).

Object keys (under the store's prefix), from the encoded topic name and integers only::

    ledgers/<persistent>/<tenant>/<namespace>/<topic>/<ledger_id:012d>/
        f-<start:016d>-<end:016d>-e<epoch:010d>   a flush object: ledger bytes [start, end)
        m-<size:016d>-e<epoch:010d>               the merged ledger: bytes [0, size)
        index                                     the ledger's index (replaced whole)

(each name part percent-encoded as for the local directories: ``topic_paths.topic_relpath``). A
flush object's key names its range, so one writer never writes a key twice (offsets only grow)
and an object whose size disagrees with its key (an upload cut short and completed anyway) is
ignored and later removed. The ``epoch`` is the owner's epoch (0 until cluster mode passes the
ownership record's version): two owners of a topic never share a key, so a zombie writer can
add objects but never replace the new owner's, and which epoch's objects count is for the
metadata store to say (fencing, a later step). pyarrow's S3 client cannot send ``If-None-Match``
on a PUT, so no write here is a conditional one; keys that never repeat take its place.

Reading the layout back: a ledger's objects are listed once (one LIST) and cached; a merged
object, when there is one, is the ledger (the highest epoch, then the smallest: ``cut`` only
shortens); else flush objects are chained from offset 0, the first gap ending the ledger.

Thread safety as in ``ledger_storage``: ``write``/``truncate`` from one thread at a time,
``sync`` beside them; reads from any thread; a storage's maps are guarded by one lock.
"""

from __future__ import annotations

import bisect
import logging
import math
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import CompactMQError, StorageError
from . import ledger_file as lf
from .ledger_storage import LedgerStorage
from .object_group_flush import GroupFlush
from .object_layout import INDEX_NAME, Layout, covered_unused, resolve_layout, shared_part
from .object_ledger_upkeep import ObjectLedgerUpkeep
from .object_ledger_writer import ObjectLedgerWriter
from .offload.blobstore import BlobStore
from .resources.fence import NO_FENCE, Fence
from .topic_paths import topic_relpath

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config

log = logging.getLogger(__name__)


#: how long ``location`` waits for the writer of a ledger sealed during a sync to close
SEALED_WRITER_WAIT_S = 30.0


@dataclass(frozen=True)
class ObjectLedgerSettings:
    """The three ``objectLedger*`` settings (``config/keys.py`` says what each does)."""

    flush_interval_ms: int = 5
    flush_max_bytes: int = 4 * 1024 * 1024
    tail_cache_bytes: int = 1024 * 1024

    @classmethod
    def from_config(cls, config: "Config") -> "ObjectLedgerSettings":
        return cls(
            max(0, int(config["objectLedgerFlushIntervalMillis"])),
            max(1, int(config["objectLedgerFlushMaxBytes"])),
            max(0, int(config["objectLedgerTailCacheBytes"])),
        )


def ledgers_prefix(topic: str) -> str:
    """The key prefix of a topic's ledgers: its encoded name, never the name as given."""
    return "ledgers/" + topic_relpath(topic).replace("\\", "/")


class ObjectLedgerStorage(ObjectLedgerUpkeep, LedgerStorage):
    """One topic's ledgers as objects in ``store`` (see the module docstring)."""

    def __init__(
        self,
        store: BlobStore,
        topic: str,
        settings: ObjectLedgerSettings | None = None,
        epoch: int = 0,
        group: GroupFlush | None = None,
        fence: Fence = NO_FENCE,
    ):
        self.store = store
        #: flushes join the process's group flush (``object_group_flush``) when set; its commit
        #: checks ``fence`` (the ownership this storage writes under) instead of ``ownership_check``
        self.group = group
        self.fence = fence
        self.topic = topic
        self.settings = settings or ObjectLedgerSettings()
        self.epoch = int(epoch)
        self.prefix = ledgers_prefix(topic)
        self.topic_path = self.prefix.split("/", 1)[1]  # the encoded name (range records' paths)
        self._lock = threading.Lock()
        self._writers: dict[int, ObjectLedgerWriter] = {}
        self._layouts: dict[int, Layout] = {}  # ledgers nobody writes here, as last listed
        # sealed (index written) while their writer stays open for a sync still in flight (the
        # appender closes it when that sync ends): merged then; ``location`` waits for it
        self._sealed_open: set[int] = set()
        self._writer_gone = threading.Condition(self._lock)
        self._init_upkeep()  # the fence check and the merges (object_ledger_upkeep)

    # --- keys and objects ----------------------------------------------------------------

    def ledger_prefix(self, ledger_id: int) -> str:
        return f"{self.prefix}/{int(ledger_id):012d}"

    def flush_key(self, ledger_id: int, start: int, end: int) -> str:
        return f"{self.ledger_prefix(ledger_id)}/f-{start:016d}-{end:016d}-e{self.epoch:010d}"

    def write_flush(self, ledger_id: int, start: int, end: int, data: bytes) -> str:
        """Make ledger bytes ``[start, end)`` durable and visible; returns the layout's part
        name: a flush object of the ledger's own, or (group flush) a range of a shared one."""
        if self.group is not None:
            return self.group.flush(
                self.topic_path,
                ledger_id,
                start,
                end,
                self.epoch,
                data,
                self.fence,
                lambda: self._write_own_flush(ledger_id, start, end, data),
            )
        return self._write_own_flush(ledger_id, start, end, data)

    def _write_own_flush(self, ledger_id: int, start: int, end: int, data: bytes) -> str:
        """Bytes ``[start, end)`` as a flush object of the ledger's own, acknowledged only while
        this process still owns the topic: the fence's lease (``ownership_check``), else -- a
        storage given only a fence -- the fence itself, asked of the group's store."""
        key = self.flush_key(ledger_id, start, end)
        self.put_object(key, data)
        if self.ownership_check is not None or self.group is None:
            self.check_owned()  # a zombie's bytes are never acknowledged (fence)
        else:
            self.fence.verify(self.group.metadata)
        return key.rsplit("/", 1)[1]

    def part_location(self, ledger_id: int, name: str) -> tuple[str, int]:
        """The key of the object holding a layout part, and the part's offset in it."""
        shared = shared_part(name)
        return shared if shared is not None else (f"{self.ledger_prefix(ledger_id)}/{name}", 0)

    def read_part(self, ledger_id: int, part: tuple[int, int, str]) -> bytes:
        """A whole layout part: a GET of the ledger's object, a ranged GET of a shared one."""
        start, end, name = part
        key, base = self.part_location(ledger_id, name)
        if base == 0 and shared_part(name) is None:
            return bytes(self.store.read_all(key))
        return bytes(self.store.read_range(key, base, end - start))

    def shared_ranges(self, ledger_id: int) -> list[tuple[int, int, int, str]]:
        return self.group.ranges(self.topic_path, ledger_id) if self.group is not None else []

    def release_parts(self, ledger_id: int, parts: list[tuple[int, str]]) -> None:
        """Drop the range records of ``(start, part name)`` (their bytes are in another object
        now); a failure leaves them, superseded, for the seal's merge to drop."""
        if self.group is None or not parts:
            return
        try:
            self.group.release_parts(self.topic_path, ledger_id, parts, self.fence)
        except (OSError, CompactMQError) as e:
            log.warning(
                "%s: dropping ranges of ledger %d failed (dropped at the merge): %s", self.topic, ledger_id, e
            )

    def release_shared(self, ledger_id: int, upto: int | None = None) -> None:
        """Forget the ledger's ranges in shared objects: those ending by ``upto`` (held by a
        merged object that long), or all of them (None: cut or deleted), under the ownership
        fence -- a broker that lost the topic drops no record (``Fenced``)."""
        if self.group is not None:
            self.group.release(self.topic_path, ledger_id, self.fence, upto)

    def verify_owned(self) -> None:
        """``Fenced`` unless this process owns the topic now: the fence asked of the metadata
        store (a commit of its checks, linearizable) -- before anything that supersedes landed
        bytes (a merged object); without a group, the ownership lease."""
        if self.group is not None:
            self.fence.verify(self.group.metadata)
        else:
            self.check_owned()

    def put_object(self, key: str, data: bytes | bytearray) -> None:
        """One object write, durable when it returns (a module function, so a crash test can
        stop a process in the middle of one)."""
        put_object(self.store, key, data)

    def _objects(self, ledger_id: int) -> dict[str, int]:
        """Names (relative to the ledger's prefix) and sizes of a ledger's objects: one LIST."""
        from pyarrow import fs

        base = self.store.path(self.ledger_prefix(ledger_id))
        try:
            infos = self.store.fs.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True))
        except Exception as e:
            raise StorageError(f"{self.topic}: listing ledger {ledger_id} failed: {e}") from e
        cut = len(base) + 1
        return {i.path[cut:]: int(i.size) for i in infos if i.type == fs.FileType.File}

    def _listing(self, ledger_id: int) -> tuple[dict[str, int], list[tuple[int, int, int, str]]]:
        """A ledger's range records, THEN its objects (one LIST): a consistent view, since every
        writer makes an object durable before it drops the records whose bytes it holds (a fold,
        a merge). Read the other way round, a fold or merge landing between the LIST and the
        records' read hides both the new object and the records: the ledger looks cut at the
        first range -- recovery would record fewer entries than were acknowledged, and
        ``discard_partial_writes`` deleted the live objects "after the gap" (issue 26's chaos
        test: 'holds no bytes [24, ...)')."""
        shared = self.shared_ranges(ledger_id)
        return self._objects(ledger_id), shared

    def _layout(self, ledger_id: int, refresh: bool = False) -> Layout:
        with self._lock:
            w = self._writers.get(ledger_id)
            cached = self._layouts.get(ledger_id)
        if w is not None:
            return w.layout
        if cached is not None and not refresh:
            return cached
        layout, _ = resolve_layout(*self._listing(ledger_id))
        with self._lock:
            if layout.parts:
                self._layouts[ledger_id] = layout
            else:
                self._layouts.pop(ledger_id, None)
        return layout

    def writer_closed(self, writer: ObjectLedgerWriter) -> None:
        merge = False
        with self._lock:
            if self._writers.get(writer.ledger_id) is writer:
                del self._writers[writer.ledger_id]
                self._layouts[writer.ledger_id] = writer.layout
                merge = writer.ledger_id in self._sealed_open
                self._sealed_open.discard(writer.ledger_id)
                self._writer_gone.notify_all()
        if merge:  # sealed while a sync still used the writer: its merge was left for now
            self.schedule_merge(writer.ledger_id)

    # --- LedgerStorage ---------------------------------------------------------------------

    def claim(self, topic: str) -> None:
        """Nothing to take here: who writes a topic is the metadata store's to say (the owner's
        epoch, in cluster mode); keys are per epoch, so owners never write the same object."""

    def create(self, ledger_id: int) -> ObjectLedgerWriter:
        if self._objects(ledger_id):
            raise StorageError(f"{self.topic}: ledger {ledger_id} already has objects; not overwriting")
        header = lf.encode_file_header(ledger_id)
        key = self.flush_key(ledger_id, 0, len(header))
        self.put_object(key, header)
        writer = ObjectLedgerWriter(self, ledger_id, Layout([(0, len(header), key.rsplit("/", 1)[1])]))
        with self._lock:
            self._writers[ledger_id] = writer
            self._layouts.pop(ledger_id, None)
        return writer

    def read_all(self, ledger_id: int) -> bytes | None:
        with self._lock:
            w = self._writers.get(ledger_id)
        layout, tail = w.snapshot() if w is not None else (self._layout(ledger_id, refresh=True), b"")
        if not layout.parts:
            return None
        return b"".join(self.read_part(ledger_id, part) for part in layout.parts) + tail

    def read_range(self, ledger_id: int, lo: int, hi: int) -> bytes:
        with self._lock:
            w = self._writers.get(ledger_id)
        split = w.split_read(lo, hi) if w is not None else None
        if split is not None:
            layout, mid, tail = split
            return (self._read_objects(ledger_id, layout, lo, mid) if mid > lo else b"") + tail
        try:
            return self._read_objects(ledger_id, self._layout(ledger_id), lo, hi)
        except StorageError:
            # merged or cut meanwhile (objects replaced), or written by another process since
            # this layout was listed: list again, once
            return self._read_objects(ledger_id, self._layout(ledger_id, refresh=True), lo, hi)

    def _read_objects(self, ledger_id: int, layout: Layout, lo: int, hi: int) -> bytes:
        if not layout.parts or hi > layout.end or lo < 0 or lo > hi:
            raise StorageError(f"{self.topic}: ledger {ledger_id} holds no bytes [{lo}, {hi})")
        out = []
        parts = layout.parts
        i = max(0, bisect.bisect_right(parts, (lo, math.inf)) - 1)  # the part holding lo
        for k in range(i, len(parts)):
            start, end, name = parts[k]
            if start >= hi:
                break
            if end <= lo:
                continue
            a, b = max(lo, start), min(hi, end)
            key, base = self.part_location(ledger_id, name)
            out.append(self.store.read_range(key, base + a - start, b - a))  # one ranged GET
        return b"".join(out)

    def write_index(self, ledger_id: int, data: bytes | bytearray, durable: bool = True) -> None:
        """Seal: write the index (an object write replaces the old index whole: a crash
        leaves one or the other; always durable), then have the flush objects merged in the
        background -- the seal runs under the managed ledger's lock, a merge reads and writes
        the whole ledger. Reads meanwhile use the flush objects, then the merged object.

        Under the ownership fence: the index replaces the ledger's whole, and a broker whose
        ownership ended (a topic unloaded after its session was lost seals before its ledger-list
        commit fails) would replace the next owner's recovered index with its own view."""
        self.verify_owned()
        self.put_object(f"{self.ledger_prefix(ledger_id)}/{INDEX_NAME}", data)
        with self._lock:
            layout = self._layouts.get(ledger_id)
            sealed = ledger_id not in self._writers
            if not sealed:  # a sync still uses the writer: merged when it closes (writer_closed)
                self._sealed_open.add(ledger_id)
        if sealed and (layout is None or not layout.merged):
            self.schedule_merge(ledger_id)

    def read_index(self, ledger_id: int) -> bytes | None:
        key = f"{self.ledger_prefix(ledger_id)}/{INDEX_NAME}"
        try:
            return bytes(self.store.read_all(key))  # one GET; a missing index is an error here
        except (OSError, StorageError):
            return None

    def exists(self, ledger_id: int) -> bool:
        return bool(self._layout(ledger_id).parts)

    def list(self) -> set[int]:
        ids = set()
        for key in self.store.list(self.prefix):
            head = key[len(self.prefix) + 1 :].split("/", 1)[0]
            if head.isdigit():
                ids.add(int(head))
        return ids

    def delete(self, ledger_id: int, durable: bool = False) -> None:
        """Every object of the ledger goes (each delete is durable when it returns)."""
        caller = sys._getframe(1).f_code
        reason = f"ledger deleted by {caller.co_filename.rsplit('/', 1)[-1]}:{caller.co_name}"
        with self._lock:
            w = self._writers.pop(ledger_id, None)
            self._sealed_open.discard(ledger_id)
            self._writer_gone.notify_all()
        if w is not None:
            w.abandon()
        with self._merge_lock:
            for name in self._objects(ledger_id):
                self.delete_key(ledger_id, name, reason)
            self.release_shared(ledger_id)
            # forgotten only now, under the merge lock: a merge that was running when the delete
            # began has cached its merged layout by the time it releases the lock
            with self._lock:
                self._layouts.pop(ledger_id, None)

    def discard_partial_writes(self) -> None:
        """Remove objects no layout uses: flush objects a merge superseded (a crash between
        the merged write and the deletes), damaged objects, merged ones a cut replaced; and
        schedule the merge of sealed ledgers (an index, no merged object) left unmerged.
        Only objects another one provably holds go (``object_layout.covered_unused``); recovery
        calls this only after its fenced commit, so a broker that lost the topic deletes
        nothing here."""
        for ledger_id in self.list():
            with self._lock:
                if ledger_id in self._writers:
                    continue
            with self._merge_lock:
                objects, shared = self._listing(ledger_id)
                layout, unused = resolve_layout(objects, shared)
                for name in covered_unused(layout, unused):
                    self.delete_key(ledger_id, name, "discard_partial_writes: superseded or damaged")
                if layout.merged and any(shared_part(n) for n in unused):
                    # stopped between the merge and the release: the records the merged object
                    # holds go (one past it stays: a commit that landed late, never superseded)
                    self.release_shared(ledger_id, layout.end)
                elif any(shared_part(n) for n in unused):  # stopped between a fold and its release
                    superseded = [
                        (start, n) for start, _e, _ep, n in self.shared_ranges(ledger_id) if n in unused
                    ]
                    self.release_parts(ledger_id, superseded)
            if INDEX_NAME in objects and layout.parts and not layout.merged:
                self.schedule_merge(ledger_id)  # sealed, and the process stopped before merging

    def location(self, ledger_id: int) -> str:
        """The URI of a sealed ledger's merged object -- merged now when the merger has not
        got to it, since another process (a Spark task) reads the ledger as one object by URI;
        for a ledger still being written, the URI of its key prefix (no single object).

        A ledger sealed here while a sync still used its writer (the appender closes the writer
        when that sync ends) is waited for, up to ``SEALED_WRITER_WAIT_S``: its key prefix went
        to a compaction run's Spark task, which failed on FileNotFoundError (the chaos test)."""
        with self._lock:
            if ledger_id in self._sealed_open and not self._writer_gone.wait_for(
                lambda: ledger_id not in self._sealed_open, SEALED_WRITER_WAIT_S
            ):
                raise StorageError(f"{self.topic}: ledger {ledger_id} is sealed, its last sync still running")
        layout = self._layout(ledger_id)
        if layout.parts and not layout.merged:
            # merged now, or by the background merger meanwhile (merge() then says False):
            # either way the layout to answer from is the store's, not the cached one
            self.merge(ledger_id)
            layout = self._layout(ledger_id, refresh=True)
        if not layout.parts:
            layout = self._layout(ledger_id, refresh=True)
        if not layout.parts:
            # no object at all: deleted (a trim, or a new owner's recovery) since the caller
            # listed it. Said here, once, rather than as a Spark task's FileNotFoundError on the
            # key prefix: a compaction run planned on that list fails and is tried again
            raise StorageError(f"{self.topic}: ledger {ledger_id} has no objects (deleted meanwhile?)")
        key = self.ledger_prefix(ledger_id)
        if layout.merged:
            key = f"{key}/{layout.parts[0][2]}"
        return self.store.location.url(key)

    def close(self) -> None:
        """Forget cached layouts and the store's open handles of this topic's objects."""
        with self._lock:
            self._layouts.clear()


def put_object(store: BlobStore, key: str, data: bytes | bytearray) -> None:
    """Write ``data`` as the object ``key``: one upload, published only when complete."""
    store.put(key, [memoryview(data)])
