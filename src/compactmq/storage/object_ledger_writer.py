"""The write side of an object ledger: ``ObjectLedgerWriter`` and its background flusher.

``object_ledgers.ObjectLedgerStorage`` maps a topic's ledgers onto objects; this module holds
what one ledger being written keeps in memory and how it becomes durable, so the storage module
stays about keys, layouts and reads. ``ObjectLedgerStorage.create`` makes a writer; the writer
calls back into its storage for every object write (``write_flush``, ``put_object``,
``flush_key``) and for dropping range records (``release_parts``), so keys are named in one
place.

Buffering. ``write`` appends to ``buf`` (ledger bytes ``[mem_start, written_end)``); a *flush*
writes every byte after ``durable_end`` as one object (or, with a group flush and other
ledgers' flushes waiting, one range of the process's next shared object) and returns once it is
durable. ``sync`` first lingers up to
``objectLedgerFlushIntervalMillis`` after the oldest unflushed byte (or until
``objectLedgerFlushMaxBytes`` wait), so appends meanwhile share the write; flushes of one ledger
run one at a time under ``_flush_lock``, so everything written during one PUT goes into the
next. Flushed bytes stay in memory from the last ``objectLedgerTailCacheBytes`` on, so readers
that keep up (``split_read``, ``snapshot``) never reach the store.

``_Flusher``: ONE daemon thread per process flushes writers whose oldest unflushed byte waited
the interval, or whose buffer is full, when no sync came for them (``managedLedgerSyncData``
off), so memory per ledger stays bounded.

Folding (group flush only): every ``FOLD_RANGES`` ranges in shared objects (or ``FOLD_BYTES``),
the writer rewrites them (still in memory) as one object of the ledger's own and has their
range records dropped, so a ledger being written names few records in the metadata store. The
drop runs on ``_Releaser``'s thread, never in the sync that folded (its round trips held that
topic's receipts).

Thread safety: ``write``/``truncate`` from one thread at a time, ``sync`` beside them, reads
from any thread; the fields are guarded by ``_cond``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

from ..errors import CompactMQError, StorageError
from .ledger_storage import LedgerWriter
from .object_layout import Layout, shared_part

if TYPE_CHECKING:  # pragma: no cover
    from .object_ledgers import ObjectLedgerStorage

log = logging.getLogger(__name__)

# Group flush: a ledger being written folds its ranges in shared objects into an object of its
# own once this many have accumulated, or this many bytes (kept in memory until then), so that
# its range records in the metadata store stay few (``ObjectLedgerWriter._fold``).
FOLD_RANGES = 64
FOLD_BYTES = 1024 * 1024


class ObjectLedgerWriter(LedgerWriter):
    """Appends to one ledger as flush objects (see the module docstring)."""

    #: ``write`` only appends to ``buf`` (under ``_cond``, never held across a PUT), so the
    #: broker's event loop writes SENDs here at once (``Appender.try_write_many``) while a
    #: flush is in flight. Without it every batch waited for a storage thread, and those were
    #: all held by syncs waiting on their PUTs: the writes of the next flush came late and
    #: flushes carried fewer entries (bench/cluster_many_ab.py: 30 topics, 24 -> 38 messages
    #: per object write, group flush off; 57 -> 81 on). Durability is unchanged: an entry is
    #: acknowledged only after a sync that started after its write has flushed it.
    inline_writes = True

    def __init__(self, storage: "ObjectLedgerStorage", ledger_id: int, layout: Layout):
        self._storage = storage
        self.ledger_id = ledger_id
        self._settings = storage.settings
        self._cond = threading.Condition()  # guards the fields below
        self._flush_lock = threading.Lock()  # one flush (PUT) at a time per ledger
        self.layout = layout
        self.mem_start = self.durable_end = self.written_end = layout.end
        self.buf = bytearray()  # ledger bytes [mem_start, written_end)
        self._flushing_end = 0  # end of the bytes the running flush writes
        self._oldest_unflushed = 0.0  # monotonic time of the first byte after durable_end
        self._fold_start: int | None = None  # group flush: the first range not yet folded
        self._unfolded = 0  # ranges in shared objects since the last fold
        self.error: OSError | None = None  # a background flush failed: syncs fail from now on
        self.closed = False

    # --- the LedgerWriter calls ----------------------------------------------------------

    def write(self, data: bytes, offset: int) -> None:
        with self._cond:
            if offset != self.written_end or self.closed:
                raise OSError(f"ledger {self.ledger_id}: write at {offset}, end is {self.written_end}")
            if self.written_end == self.durable_end:
                self._oldest_unflushed = time.monotonic()
                _FLUSHER.schedule(self, self._oldest_unflushed + self._settings.flush_interval_ms / 1000)
            self.buf += data
            self.written_end += len(data)
            if self.written_end - self.durable_end >= self._settings.flush_max_bytes:
                self._cond.notify_all()  # a lingering sync writes now
                _FLUSHER.schedule(self, 0.0)

    def truncate(self, offset: int) -> None:
        with self._cond:
            if offset < max(self.durable_end, self._flushing_end):
                raise OSError(f"ledger {self.ledger_id}: bytes before {offset} are durable or being flushed")
            del self.buf[offset - self.mem_start :]
            self.written_end = min(self.written_end, offset)

    def sync(self) -> None:
        with self._cond:
            target = self.written_end
            self._linger(target)
        self.flush(target)

    def sync_all(self) -> None:
        self.sync()

    def close(self) -> None:
        """Write what is still buffered (best effort, like a page cache), then stop; nothing
        when the ledger was deleted meanwhile (its objects would be orphans)."""
        try:
            if self.error is None and not self.closed:
                self.flush(self.written_end)
        except OSError as e:
            log.warning("ledger %d: final flush on close failed: %s", self.ledger_id, e)
        finally:
            with self._cond:
                self.closed = True
            _FLUSHER.cancel(self)
            self._storage.writer_closed(self)

    def abandon(self) -> None:
        """The ledger is being deleted: write nothing more, buffered bytes included."""
        with self._cond:
            self.closed = True
        _FLUSHER.cancel(self)

    # --- flushing --------------------------------------------------------------------------

    def _linger(self, target: int) -> None:
        """Wait (holding ``_cond``) until the flush interval has passed since the oldest
        unflushed byte, enough bytes wait, or another flush covered ``target``."""
        s = self._settings
        deadline = self._oldest_unflushed + s.flush_interval_ms / 1000
        while self.durable_end < target and self.error is None:
            if self.written_end - self.durable_end >= s.flush_max_bytes:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._cond.wait(remaining)

    def flush(self, target: int) -> None:
        """Return once bytes up to ``target`` are durable, writing one object if needed."""
        folded = self._flush_locked(target)
        if folded:  # records of ranges now in a fold object: dropped by the releaser thread
            _RELEASER.submit(self._storage, self.ledger_id, folded)

    def _flush_locked(self, target: int) -> list[tuple[int, str]]:
        with self._flush_lock:
            with self._cond:
                if self.error is not None:
                    raise OSError(f"ledger {self.ledger_id}: an earlier flush failed: {self.error}")
                if self.durable_end >= target:
                    return []
                start, end = self.durable_end, self.written_end
                data = bytes(self.buf[start - self.mem_start : end - self.mem_start])
                self._flushing_end = end
            try:
                name = self._storage.write_flush(self.ledger_id, start, end, data)
            except (OSError, StorageError, CompactMQError) as e:
                with self._cond:
                    self.error = OSError(str(e))
                    self._cond.notify_all()
                raise self.error from e
            with self._cond:
                # appended in place (readers holding the list see it only grow)
                self.layout.parts.append((start, end, name))
                self.durable_end = end
                if shared_part(name) is not None:
                    self._fold_start = start if self._fold_start is None else self._fold_start
                    self._unfolded += 1
                if self.written_end > end:  # written during this flush: due one interval on
                    self._oldest_unflushed = time.monotonic()
                    _FLUSHER.schedule(self, self._oldest_unflushed + self._settings.flush_interval_ms / 1000)
                self._trim_tail()
                self._cond.notify_all()
                fold = self._fold_start is not None and (
                    self._unfolded >= FOLD_RANGES or self.durable_end - self._fold_start >= FOLD_BYTES
                )
            return self._fold() if fold else []

    def _fold(self) -> list[tuple[int, str]]:
        """Group flush: write the ledger's ranges since the last fold (still in memory) as one
        object of its own, then drop their range records -- so a ledger being written names at
        most ``FOLD_RANGES`` records in the metadata store, whatever its length. Called holding
        ``_flush_lock`` (no flush runs meanwhile); a failure leaves the records, still the
        ledger (correct, only more records until the seal's merge). Returns the ``(start, part
        name)`` of the ranges folded, whose records the caller drops."""
        with self._cond:
            a, b = self._fold_start, self.durable_end
            assert a is not None
            data = bytes(self.buf[a - self.mem_start : b - self.mem_start])
            folded = [p for p in self.layout.parts if p[0] >= a]
            self._fold_start, self._unfolded = None, 0
        key = self._storage.flush_key(self.ledger_id, a, b)
        try:
            self._storage.put_object(key, data)
        except (OSError, StorageError, CompactMQError) as e:
            log.warning("ledger %d: folding bytes [%d, %d) failed (ranges kept): %s", self.ledger_id, a, b, e)
            with self._cond:
                self._trim_tail()
            return []
        with self._cond:
            # a new list: a reader holding the old one reads the shared objects, or (released
            # meanwhile) fails and reads again with this layout
            kept = [p for p in self.layout.parts if p[1] <= a]
            self.layout = Layout([*kept, (a, b, key.rsplit("/", 1)[1])])
            self._trim_tail()
        return [(s, n) for s, _e, n in folded if shared_part(n)]

    def _trim_tail(self) -> None:
        """Drop flushed bytes older than the tail cache keeps (unflushed ones always stay, and
        the bytes a fold is still to write)."""
        keep_from = min(self.durable_end, self.written_end - self._settings.tail_cache_bytes)
        if self._fold_start is not None:
            keep_from = min(keep_from, self._fold_start)
        if keep_from > self.mem_start:
            del self.buf[: keep_from - self.mem_start]
            self.mem_start = keep_from

    def background_flush(self) -> None:
        """The background thread's flush (errors are kept for the next sync)."""
        with self._cond:
            if self.closed or self.error is not None:
                return
            target = self.written_end
        try:
            self.flush(target)
        except OSError as e:
            log.warning("ledger %d: background flush failed: %s", self.ledger_id, e)

    # --- reads -----------------------------------------------------------------------------

    def split_read(self, lo: int, hi: int) -> tuple[Layout, int, bytes] | None:
        """For a read of ``[lo, hi)``: the durable layout, where memory takes over (``mid``:
        bytes ``[lo, mid)`` come from objects) and the bytes ``[mid, hi)`` from memory; None
        when ``hi`` is past what was written. Memory always holds every unflushed byte, so
        ``mid`` never passes the layout's end."""
        with self._cond:
            if hi > self.written_end:
                return None
            mid = min(max(lo, self.mem_start), hi)
            return self.layout, mid, bytes(self.buf[mid - self.mem_start : hi - self.mem_start])

    def snapshot(self) -> tuple[Layout, bytes]:
        """The durable layout and the bytes written after it (for ``read_all``)."""
        with self._cond:
            return self.layout, bytes(self.buf[self.durable_end - self.mem_start :])


class _Flusher:
    """One daemon thread that flushes writers whose bytes waited the flush interval, or whose
    buffer is full, when no sync came for them (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[ObjectLedgerWriter, float] = {}
        self._thread: threading.Thread | None = None

    def schedule(self, writer: ObjectLedgerWriter, at: float) -> None:
        with self._cond:
            if at < self._due.get(writer, float("inf")):
                self._due[writer] = at
                self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="object-ledger-flusher", daemon=True)
                self._thread.start()

    def cancel(self, writer: ObjectLedgerWriter) -> None:
        with self._cond:
            self._due.pop(writer, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    ready = [w for w, at in self._due.items() if at <= now]
                    if ready:
                        break
                    self._cond.wait(min(self._due.values(), default=now + 1.0) - now)
                for w in ready:
                    del self._due[w]
            for w in ready:
                w.background_flush()


_FLUSHER = _Flusher()


class _Releaser:
    """One daemon thread that drops the range records a fold superseded (``release_parts``: a
    fenced commit, then per shared object a look at its remaining references and maybe its
    delete). Done in the sync that folded, those round trips held that topic's receipt for
    ~64 ZooKeeper reads every 64 flushes, and with many topics publishing some topic was always
    held: 30 topics made 2.4x / 1.6x the messages with folds out of reach (bench/results/
    cluster_many_ab_fix_nofold_clusterperf.json). A record left a little longer is harmless:
    the fold object covers the same bytes (readers take either), a merge releases what is left,
    and a crash in between is ``discard_partial_writes``' "stopped between a fold and its
    release"."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, storage: "ObjectLedgerStorage", ledger_id: int, parts: list[tuple[int, str]]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="object-ledger-releaser", daemon=True)
                self._thread.start()
        self._queue.put((storage, ledger_id, parts))

    def _run(self) -> None:
        while True:
            storage, ledger_id, parts = self._queue.get()
            try:
                storage.release_parts(ledger_id, parts)  # logs and keeps the records on failure
            except Exception as e:  # noqa: BLE001 - the thread must live on
                log.warning("ledger %d: dropping folded range records failed: %s", ledger_id, e)


_RELEASER = _Releaser()
