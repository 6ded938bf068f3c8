"""Upkeep of an object ledger beside its write path: the ownership fence and the merges.

``object_ledgers.ObjectLedgerStorage`` writes and reads a topic's ledgers as objects; this
module holds the two things it does *around* those writes, so that the storage module stays
about bytes and keys. ``ObjectLedgerStorage`` inherits ``ObjectLedgerUpkeep`` (a mixin: the
methods below work on the storage's own store, lock and cached layouts).

The ownership fence. ``ownership_check`` is a callable that raises while this process no longer
owns the topic; cluster mode sets it (``storage.engine`` passes a ``resources.fence.FenceLease``
of the bundle's fence), a single node leaves it None. A writer calls ``check_owned`` after each
flush object is durable and before its entries count as written: a broker that lost the topic
(a zombie, paused or partitioned) can still add objects under its own epoch, but never
acknowledges them, and the next owner's sweep removes them.

Merges. Sealing a ledger (``write_index``) asks for its flush objects to be merged into one
object holding the whole ledger: ``schedule_merge`` queues the ledger (once, however often
asked) on ONE daemon thread per process (``_Merger``), so the merge's reads and write never hold
up the topic's appends (a seal runs under the managed ledger's lock). ``merge`` writes the
merged object and deletes the flush objects only once it is durable; a merge that fails or is
cut by a crash leaves the flush objects, still the ledger, and the next open's
``discard_partial_writes`` schedules it again. ``cut`` (recovery shortening a ledger) writes a
shorter merged object the same way. Merge, cut and delete of one topic's ledgers run one at a
time under ``_merge_lock``, so a merge never writes a merged object after the ledger was deleted
nor deletes what a cut wrote. ``wait_merged`` waits for one storage's merges,
``wait_merges`` for every merge of the process (a topic's deletion waits, for the same reason).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Iterable

from ..errors import StorageError
from .object_layout import INDEX_NAME, Layout, delete_log, delete_object, merged_epoch
from .offload.blobstore import BlobStore

log = logging.getLogger(__name__)


class _Merger:
    """One daemon thread that merges sealed ledgers, one at a time, off the appender's path."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple["ObjectLedgerUpkeep", int]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0

    def submit(self, storage: "ObjectLedgerUpkeep", ledger_id: int) -> None:
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="object-ledger-merger", daemon=True)
                self._thread.start()
        self._queue.put((storage, ledger_id))

    def _run(self) -> None:
        while True:
            storage, ledger_id = self._queue.get()
            try:
                storage.run_merge(ledger_id)
            finally:
                with self._lock:
                    self._pending -= 1
                    self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no merge is queued or running (any topic's); False on timeout."""
        with self._lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)


def wait_merges(timeout: float = 30.0) -> bool:
    """Wait for every queued merge of this process (a topic's deletion does, so that no merge
    writes a merged object after the ledger's objects were deleted)."""
    return _MERGER.wait_idle(timeout)


_MERGER = _Merger()


class ObjectLedgerUpkeep:
    """The fence check and the merges of one topic's object ledgers (see the module docstring).
    The storage provides the attributes declared here, ``ledger_prefix``, ``_objects``,
    ``_layout`` and ``read_all``, and calls ``_init_upkeep`` from its constructor."""

    store: BlobStore
    topic: str
    epoch: int
    _lock: threading.Lock
    _writers: dict[int, Any]
    _layouts: dict[int, Layout]

    def _init_upkeep(self) -> None:
        #: raises while this process no longer owns the topic (cluster mode sets it: the ownership
        #: fence, checked after each flush object is durable and before its entries count as
        #: written -- a broker that lost the topic never acknowledges what it wrote after)
        self.ownership_check: Callable[[], None] | None = None
        # merge, cut and delete of this topic's ledgers one at a time (a merge never writes a
        # merged object after the ledger was deleted, nor deletes what a cut wrote)
        self._merge_lock = threading.RLock()
        self._merging: set[int] = set()  # merges queued or running
        self._merges_done = threading.Condition(self._lock)

    # --- provided by the storage -----------------------------------------------------------

    def ledger_prefix(self, ledger_id: int) -> str:
        raise NotImplementedError

    def _objects(self, ledger_id: int) -> dict[str, int]:
        raise NotImplementedError

    def _layout(self, ledger_id: int, refresh: bool = False) -> Layout:
        raise NotImplementedError

    def read_all(self, ledger_id: int) -> bytes | None:
        raise NotImplementedError

    def read_part(self, ledger_id: int, part: tuple[int, int, str]) -> bytes:
        raise NotImplementedError

    def release_shared(self, ledger_id: int, upto: int | None = None) -> None:
        raise NotImplementedError

    def shared_ranges(self, ledger_id: int) -> list[tuple[int, int, int, str]]:
        raise NotImplementedError

    def verify_owned(self) -> None:
        raise NotImplementedError

    # --- the ownership fence ---------------------------------------------------------------

    def delete_key(self, ledger_id: int, name: str, reason: str) -> None:
        """Delete one object of a ledger (``name`` under its prefix), logged with why."""
        key = f"{self.ledger_prefix(ledger_id)}/{name}"
        delete_object(self.store, key, reason, self.topic, ledger_id, self.epoch)

    def check_owned(self) -> None:
        if self.ownership_check is not None:
            self.ownership_check()

    # --- merges ----------------------------------------------------------------------------

    def _merged_key(self, ledger_id: int, size: int) -> str:
        return f"{self.ledger_prefix(ledger_id)}/m-{size:016d}-e{self.epoch:010d}"

    def cut(self, ledger_id: int, end: int) -> None:
        """Shorten a ledger nobody writes: its first ``end`` bytes become one merged object.
        Under the ownership fence (recovery cuts before its fenced commit: a broker that lost
        the topic must not supersede the next owner's ledger with its own shorter view)."""
        with self._merge_lock:
            buf = self.read_all(ledger_id)
            if buf is None or len(buf) <= end:
                return
            self._replace_with_merged(ledger_id, end, [buf[:end]], cut=True)

    def _replace_with_merged(self, ledger_id: int, size: int, chunks: Iterable, cut: bool = False) -> bool:
        """Write ``chunks`` (``size`` bytes) as the ledger's merged object, then delete every
        other data object; False (nothing written or deleted) when a merged object of a newer
        epoch exists, or (a merge) when a range record past ``size`` appeared meanwhile.
        Streamed: an upload cut short but completed anyway is no merged object (its size
        disagrees with its key), so the flush objects stay the ledger.

        A merged object IS the ledger for every reader, so it supersedes every range record: it
        is written only while this storage's ownership fence holds (``verify_owned``), and after
        the write the ledger's records are read again -- a group commit whose outcome was
        unknown (ZooKeeper's ConnectionLoss) may land after the layout was read, naming bytes
        past ``size`` that an entry may count on; a merge then takes its object back and leaves
        everything as it was (merged again at the next open, with those bytes). Only records the
        merged object holds are released, under the fence (a cut, which decides the ledger's
        end, releases them all) -- never, as once, every record of the ledger unfenced: a merge
        of a view that missed one removed the bytes ``[24, 1730)`` of a ledger recovery had
        recorded (issue 26's chaos test)."""
        objects = self._objects(ledger_id)
        key = self._merged_key(ledger_id, size)
        name = key.rsplit("/", 1)[1]
        if any((merged_epoch(n) or 0) > self.epoch for n in objects):
            # a newer owner merged or cut this ledger: its object is the ledger, and this
            # storage's ownership is over (a zombie's merge) -- write nothing, delete nothing
            log.warning("%s: ledger %d has a newer owner's merged object; not merging", self.topic, ledger_id)
            return False
        self.verify_owned()  # a broker that lost the topic writes no merged object
        wrote = objects.get(name) != size
        if wrote:
            delete_log.debug(
                "merged object write: key=%s epoch=%d replaces=%s", key, self.epoch, sorted(objects)
            )
            written = self.store.put(key, chunks)
            if written != size:
                raise StorageError(f"{self.topic}: merging ledger {ledger_id}: {written} of {size} bytes")
        if not cut and self._landed_past(ledger_id, size, name if wrote else None):
            log.warning(
                "%s: ledger %d has a range record past %d bytes that landed during its merge "
                "(a commit whose outcome was unknown); not merging now",
                self.topic,
                ledger_id,
                size,
            )
            if wrote:
                self.delete_key(ledger_id, name, "merge found a range record landed past it")
            return False
        layout = Layout([(0, size, name)], True)
        with self._lock:
            self._layouts[ledger_id] = layout
        for other in objects:
            if other not in (name, INDEX_NAME):
                self.delete_key(ledger_id, other, f"superseded by merged {name}")
        # ranges in shared objects (group flush): the records this object holds go, fenced
        self.release_shared(ledger_id, None if cut else size)
        return True

    def _landed_past(self, ledger_id: int, size: int, written: str | None) -> bool:
        """Whether a range record now chains past a merged object of ``size`` bytes (read
        again after its write). When the records cannot be read, the object just written
        (``written``) is taken back before the error goes up: unchecked, it must not stay the
        ledger."""
        try:
            return any(start <= size < end for start, end, _ep, _n in self.shared_ranges(ledger_id))
        except BaseException:
            if written is not None:
                self.delete_key(ledger_id, written, "merge could not read the range records again")
            raise

    def merge(self, ledger_id: int) -> bool:
        """Merge a sealed ledger's flush objects into one object (durable before the flush
        objects go). True when it merged; False when already merged or being written."""
        with self._merge_lock:
            with self._lock:
                if ledger_id in self._writers:
                    return False
            layout = self._layout(ledger_id, refresh=True)
            if layout.merged or not layout.parts:
                return False
            chunks = (self.read_part(ledger_id, part) for part in layout.parts)
            return self._replace_with_merged(ledger_id, layout.end, chunks)

    def schedule_merge(self, ledger_id: int) -> None:
        """Have the background merger merge a sealed ledger (once, however often asked)."""
        with self._lock:
            if ledger_id in self._merging:
                return
            self._merging.add(ledger_id)
        _MERGER.submit(self, ledger_id)

    def run_merge(self, ledger_id: int) -> None:
        """The merger thread's call: a failed merge leaves the flush objects, which stay the
        ledger (correct, only more objects); the next open's ``discard_partial_writes``
        schedules it again."""
        try:
            self.merge(ledger_id)
        except Exception as e:
            log.warning(
                "%s: merging ledger %d failed (retried at the next open): %s", self.topic, ledger_id, e
            )
        finally:
            with self._lock:
                self._merging.discard(ledger_id)
                self._merges_done.notify_all()

    def wait_merged(self, timeout: float | None = None) -> bool:
        """Wait until no merge of this storage is queued or running; False on timeout."""
        with self._lock:
            return self._merges_done.wait_for(lambda: not self._merging, timeout)
