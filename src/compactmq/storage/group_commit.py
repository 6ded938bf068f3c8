"""Group commit and syncing for a managed ledger's writer: the sync side of ``Appender``.

``GroupCommit`` is the ``Appender``'s base class (``appender`` holds the writes, rollover and
sealing); it owns the sync bookkeeping under ``sync_cond``, and the Appender's write paths
count themselves in it. Durable means: the sync returned after the record was written
(``managedLedgerSyncData=true``, fdatasync for local files), else written (to the page cache:
survives a process crash, not a power cut).

* Group commit (``append``/``append_many`` then ``_make_durable``): an appender whose record no
  running sync covers starts one (if fewer than ``MAX_CONCURRENT_SYNCS`` run), after waiting at
  most ``managedLedgerGroupCommitMaxDelayMicros`` for appenders that are part-way through
  writing; one sync then covers every record written before it started, and every appender
  waiting on those records returns with it.
* Pipelined commit (the broker's path): ``Appender.write_many`` writes and returns the records'
  ``seq`` without waiting; ``sync_written``, in a worker thread, syncs until every record
  written is durable -- the caller goes on writing meanwhile, and each sync covers all written
  before it started -- and reports ``durable_seq`` after each sync. ``try_sync_written`` is one
  such sync on an event loop, when nothing makes it wait. A busy topic's pipelined syncs are
  spaced ``managedLedgerGroupCommitMaxDelayMicros`` apart (``BUSY_SYNC_RATE``), so that each
  covers more records.

A sync that fails *fences* the managed ledger (``fence``): appends refuse (reads go on) until
it is reopened.

An appender that is part-way through writing counts itself in ``_writers_in_flight`` (when
syncs are on and the group delay is not 0: ``_track``), so that a sync leader can wait for it;
leaving that count is written out in both of the Appender's append paths rather than in a
helper, which keeps one Python call out of every append (the sync goes through
``LedgerWriter.sync``, which is one in).

Locks: ``sync_cond`` (group-commit bookkeeping) is never held while waiting for the ledger
list's lock; the sync itself runs holding neither, so appends and reads go on during a sync.
The writer of a ledger is closed only after the last sync running on it (``sync_users``).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable

from ..errors import StorageError
from .ledger_state import LedgerList, LedgerState

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config

# Syncs allowed at once per managed ledger. Each covers every record written before it
# started; letting a second start while one runs keeps the disk busy (filesystems merge
# concurrent syncs of one file into one journal commit), and the limit keeps a crowd of
# appenders from issuing a sync each.
MAX_CONCURRENT_SYNCS = 2

# A topic whose appends arrive faster than this (entries a second, averaged over its recent
# syncs: ``_sync_rate``) has its pipelined syncs (``sync_written``) start at most once every
# ``managedLedgerGroupCommitMaxDelayMicros``. An fdatasync costs the kernel some 50 us of CPU on
# the project's machine whatever it covers, and a quick disk (0.15-0.3 ms a sync) run back to
# back covered 3-6 entries a sync at 19 k msg/s: most of the broker's CPU per message. Spaced
# 1 ms apart, each covers ~20. Below this rate a sync starts as soon as the last one ends (the
# latency of a modest rate is what counts there, and its syncs cost little CPU in all); a sync
# slower than the spacing is never held back.
BUSY_SYNC_RATE = 10_000.0
_SYNC_RATE_WEIGHT = 0.125  # of the newest sync's rate in the moving average (~the last 8)


def group_delay_seconds(config: "Config") -> float:
    """``managedLedgerGroupCommitMaxDelayMicros`` in seconds (a negative value counts as 0)."""
    return max(0, int(config["managedLedgerGroupCommitMaxDelayMicros"])) / 1e6


class GroupCommit:
    """The sync side of one managed ledger's writer (see the module docstring); the
    ``Appender`` is built on it. Thread-safe."""

    def __init__(self, ledgers: LedgerList, config: "Config"):
        self.topic = ledgers.topic
        self._ledgers = ledgers
        self._lock = ledgers.lock
        self._sync_data = bool(config["managedLedgerSyncData"])
        self._group_delay_s = group_delay_seconds(config)
        # appenders count themselves in _writers_in_flight (group commit waits for them)
        self._track = self._sync_data and self._group_delay_s > 0
        self.sync_cond = threading.Condition()  # group commit bookkeeping below
        self._syncs_in_flight = 0
        self._sync_target = 0  # highest record a running or finished sync covers
        self._writers_in_flight = 0
        # sync pacing (BUSY_SYNC_RATE): when the last sync started, the moving average of the
        # rate at which records arrived between syncs (records a second), and the spacing it
        # asks of the pipelined syncs (0: none)
        self._last_sync_start = 0.0
        self._sync_rate = 0.0
        self._sync_spacing_s = 0.0

    # --- pipelined commit: sync in a worker --------------------------------------------------

    @property
    def durable_seq(self) -> int:
        """Records known durable (``write_many``'s ``seq`` is durable once this reaches it)."""
        return self._ledgers.durable_seq

    def sync_written(self, on_durable: Callable[[int], None] | None = None) -> int:
        """Make every record written so far durable, and go on syncing while more is written
        (the pipelined commit: the caller goes on writing while this runs in a worker thread,
        and each sync covers everything written before it started). After a sync it led that
        left records behind, ``on_durable(durable_seq)`` (outside every lock); returns the
        durable seq once nothing written is left unsynced -- the last sync's report, which the
        caller hands on as promptly (the broker: one thread hop per sync, the receipts then
        leave). ``StorageError`` when a sync
        failed (the managed ledger is fenced: nothing written after ``durable_seq`` will ever
        be durable in it) or the ledger is fenced or closed."""
        cond = self.sync_cond
        s = self._ledgers
        with cond:
            while True:
                if s.fenced is not None:
                    raise StorageError(f"{self.topic}: sync failed, entries not durable: {s.fenced}")
                seq = s.written_seq
                if s.durable_seq >= seq:
                    return s.durable_seq
                if seq <= self._sync_target or self._syncs_in_flight >= MAX_CONCURRENT_SYNCS:
                    cond.wait()  # a running sync covers it, or enough are running
                    continue
                if self._sync_spacing_s:  # a busy topic (BUSY_SYNC_RATE)
                    wait = self._last_sync_start + self._sync_spacing_s - time.monotonic()
                    if wait > 0:
                        cond.wait(wait)  # records written meanwhile join this sync
                        continue
                self._lead_sync_locked()
                if on_durable is not None and s.fenced is None and s.durable_seq < s.written_seq:
                    durable = s.durable_seq
                    cond.release()
                    try:
                        on_durable(durable)
                    finally:
                        cond.acquire()

    def try_sync_written(self) -> int | None:
        """One sync of everything written, on the calling thread, only if nothing makes it
        wait: no sync running (a running sync's thread covers what follows), no appender
        part-way through writing (group commit would wait for it), both locks free now, and a
        current ledger whose sync is a local fdatasync (``LedgerWriter.inline_syncs``). For an
        event loop with a lone small write to make durable: the sync costs what a worker's
        would, without the two thread hops. Returns the durable seq (all written is durable),
        or None with nothing done (sync in a worker, ``sync_written``). ``StorageError`` as
        ``sync_written`` when the sync failed or the ledger is fenced."""
        cond = self.sync_cond
        if not cond.acquire(False):
            return None
        try:
            s = self._ledgers
            if s.fenced is not None:
                raise StorageError(f"{self.topic}: sync failed, entries not durable: {s.fenced}")
            if s.durable_seq >= s.written_seq:
                return s.durable_seq
            led = s.current
            if (
                self._syncs_in_flight
                or self._writers_in_flight
                or led is None
                or not getattr(led.writer, "inline_syncs", False)
                or not _free_now(self._lock)
            ):
                return None
            self._lead_sync_locked()
            if s.fenced is not None:
                raise StorageError(f"{self.topic}: sync failed, entries not durable: {s.fenced}")
            return s.durable_seq
        finally:
            cond.release()

    def fence(self, err: BaseException) -> None:
        """Refuse appends from now on (a write or sync failed); wake appenders waiting."""
        self._ledgers.fenced = err
        with self.sync_cond:
            self.sync_cond.notify_all()

    # --- group commit ----------------------------------------------------------------------

    def _make_durable(self, seq: int) -> None:
        """Return once record ``seq`` is durable (group commit; see the module docstring)."""
        cond = self.sync_cond
        s = self._ledgers
        with cond:
            while s.durable_seq < seq:
                if s.fenced is not None:
                    raise StorageError(f"{self.topic}: sync failed, entry not durable: {s.fenced}")
                if seq <= self._sync_target or self._syncs_in_flight >= MAX_CONCURRENT_SYNCS:
                    cond.wait()  # a running sync covers us, or enough are running
                    continue
                self._lead_sync_locked()

    def _lead_sync_locked(self) -> None:
        """Run one sync as its leader (``sync_cond`` held on entry and on return, released
        during the sync). Takes the slot first (others may run while we wait), then lets
        appenders that are mid-write join this sync (bounded wait). A failed sync fences."""
        cond = self.sync_cond
        s = self._ledgers
        self._syncs_in_flight += 1
        if self._group_delay_s > 0 and self._writers_in_flight:
            deadline = time.monotonic() + self._group_delay_s
            while self._writers_in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                cond.wait(remaining)
        # Everything written up to here is covered: records before `target` are in the
        # ledger current below, or in one sealed (fully synced) before it became current.
        target = s.written_seq
        self._pace_locked(target - self._sync_target)
        self._sync_target = max(self._sync_target, target)
        ok = False
        cond.release()
        try:
            ok = self._sync_current()
        except OSError as e:
            s.fenced = e
        finally:
            cond.acquire()
            self._syncs_in_flight -= 1
            if ok and target > s.durable_seq:
                s.durable_seq = target
            cond.notify_all()

    def _pace_locked(self, records: int) -> None:
        """A sync starts now, covering ``records`` written since the last one started: the
        moving average of the arrival rate, and the spacing of pipelined syncs it asks for
        (``BUSY_SYNC_RATE``). Called with ``sync_cond`` held."""
        now = time.monotonic()
        elapsed = now - self._last_sync_start
        self._last_sync_start = now
        if elapsed <= 0:
            return
        rate = self._sync_rate + (max(records, 0) / elapsed - self._sync_rate) * _SYNC_RATE_WEIGHT
        self._sync_rate = rate
        self._sync_spacing_s = self._group_delay_s if rate >= BUSY_SYNC_RATE else 0.0

    def _sync_current(self) -> bool:
        """Sync the current ledger; False when it cannot be trusted (fenced)."""
        with self._lock:
            led = self._ledgers.current
            if led is None or led.writer is None:
                # sealed (and synced) by close(), or fenced by a failed rollover
                return self._ledgers.fenced is None
            writer = led.writer
            led.sync_users += 1
        try:
            writer.sync()
        finally:
            with self._lock:
                led.sync_users -= 1
                if led.writer is None and led.sync_users == 0 and led.writer_to_close is not None:
                    led.writer_to_close.close()
                    led.writer_to_close = None
        return True

    def release_writer_locked(self, led: LedgerState) -> None:
        """Close a ledger's writer now, or when the last sync using it finishes."""
        writer, led.writer = led.writer, None
        if writer is None:
            return
        if led.sync_users:
            led.writer_to_close = writer
        else:
            writer.close()


def _free_now(lock) -> bool:
    """Nobody holds ``lock`` right now (an ``RLock`` has no ``locked()`` before Python 3.14)."""
    if not lock.acquire(False):
        return False
    lock.release()
    return True
