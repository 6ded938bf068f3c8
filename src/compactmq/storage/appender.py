"""Writing a managed ledger: appends, writes, rollover and sealing.

One writer per topic per data directory (the Storage holds a lock file). Making what is written
durable -- group commit, the pipelined syncs, their pacing, and the locks between syncs and
appends -- is the ``Appender``'s base class, ``GroupCommit`` (``group_commit``; read its
docstring first). ``MAX_CONCURRENT_SYNCS`` and ``BUSY_SYNC_RATE`` live there and are imported
here too.

* ``append``/``append_many`` write their records into the current ledger with one write
  under the ledger list's lock, then wait until they are durable (``_make_durable``: group
  commit). ``ledger_file.frame_records`` frames a batch in one call (headers with their
  CRC32C, offsets, publish times; in C when ``_wire`` is built), and the parts go out joined
  (``LedgerWriter.write``) or, for large entries, as they are (``write_parts``: pwritev, no
  copy of the payload); see ``VECTORED_WRITE_MIN_BYTES``.
* Pipelined commit (the broker's path): ``write_many`` writes and returns the records' ``seq``
  without waiting; ``sync_written`` (``group_commit``) makes them durable in a worker thread.
  ``try_write_many`` is ``write_many`` for an event loop: it returns None instead of waiting
  for the lock, rolling over, or writing more than ``INLINE_WRITE_MAX_BYTES`` or to a writer
  whose writes may block.
* Both append paths count themselves in ``_writers_in_flight`` while part-way through writing
  (a sync leader waits for them), written out inline: one Python call less per append.
* Readers see an entry only once it is durable (``LedgerList.visible``).
* Rollover, checked before each append and on the broker's timer, by Pulsar's rule
  (``ManagedLedgerImpl.currentLedgerIsFull``): the ledger is full when it holds
  ``managedLedgerMaxEntriesPerLedger`` entries or ``managedLedgerMaxSizePerLedgerMbytes``, or is
  ``managedLedgerMaxLedgerRolloverTimeMinutes`` old; a full ledger rolls only once it is older
  than ``managedLedgerMinLedgerRolloverTimeMinutes`` (0: at once). So a burst of 200 k messages
  stays in one young ledger instead of four, which retention cannot delete under a reader.
  Rolling: sync the ledger fully, write its index, then in ONE metadata change record it CLOSED
  and the next ledger OPEN (``add_ledger(..., close=info)``); then create the new ledger
  (durable before it is used).

A write or sync that fails *fences* the managed ledger (``fence``): appends refuse (reads go on)
until it is reopened, which recovers the ledger; ``Storage.open_managed_ledger`` does that.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..errors import InvalidInput, NotAllowed, StorageError
from . import ledger_file as lf
from .group_commit import BUSY_SYNC_RATE, MAX_CONCURRENT_SYNCS, GroupCommit  # noqa: F401 (importable here)
from .ledger_file import RECORD_HEADER_SIZE, encode_record_header, frame_records  # the hot path
from .ledger_metadata import LedgerMetadata
from .ledger_state import MiB, LedgerList, LedgerState, os_errors_as_storage_errors
from .ledger_storage import LedgerStorage
from .position import LEDGER_CLOSED, LEDGER_OPEN, LedgerInfo, Position
from .tail_index import SpillingColumn, column_pair

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config
    from .reader import IndexCache

_new_tuple = tuple.__new__
_from_bytes = int.from_bytes
_BYTEORDER = sys.byteorder  # frame_records gives publish times as native int64 bytes

# Entries at least this large (on average, for a batch) go to the ledger as separate header and
# entry buffers (``LedgerWriter.write_parts``: pwritev, no copy); smaller ones are joined into
# one buffer first. Measured in CPU time on Linux (2026-11): for 100 B entries one pwrite of
# the joined bytes costs 20-40 % less than pwritev of the parts (the kernel and os.pwritev pay
# per buffer), the two are even near 4-8 KiB, and from 64 KiB on pwritev saves 25-40 %.
VECTORED_WRITE_MIN_BYTES = 8192

# The most a write on the broker's event loop may carry (``try_write_many``): a pwrite of this
# much into the page cache takes tens of microseconds; larger batches go to a worker thread.
INLINE_WRITE_MAX_BYTES = 256 * 1024


class Appender(GroupCommit):
    """The write side of one managed ledger (see the module docstring). Thread-safe."""

    def __init__(
        self,
        ledgers: LedgerList,
        storage: LedgerStorage,
        metadata: LedgerMetadata,
        indexes: "IndexCache",
        config: "Config",
        clock: Callable[[], int],
    ):
        super().__init__(ledgers, config)  # the sync bookkeeping (group_commit)
        self._storage = storage
        self._store = metadata
        self._indexes = indexes
        self._clock = clock
        self._max_entries = max(1, int(config["managedLedgerMaxEntriesPerLedger"]))
        self._max_bytes = max(1, int(config["managedLedgerMaxSizePerLedgerMbytes"])) * MiB
        self._max_age_ms = int(config["managedLedgerMaxLedgerRolloverTimeMinutes"]) * 60_000
        self._min_age_ms = max(0, int(config["managedLedgerMinLedgerRolloverTimeMinutes"])) * 60_000
        self.on_rollover: Callable[[], None] | None = None  # after a rollover, under the lock

    # --- appending -------------------------------------------------------------------------

    def append(self, data: bytes, publish_time_ms: int | None = None) -> Position:
        """Append one entry; returns once it is durable. ``publish_time_ms`` defaults to now.

        The same steps as ``append_many`` for one entry, without its lists (this is the
        broker's hot path: measured about 2x less Python per call)."""
        if len(data) > lf.MAX_ENTRY_SIZE:
            return self._append([data], [publish_time_ms])[0]  # raises
        track = self._track
        if track:
            with self.sync_cond:
                self._writers_in_flight += 1
        s = self._ledgers
        try:
            with self._lock:
                if s.fenced is not None or s.closed or s.read_only:
                    self.check_writable()
                now = self._clock()
                self._maybe_rollover_locked(now)
                led = s.current
                entry_id = led.count
                pt = now if publish_time_ms is None else int(publish_time_ms)
                start = led.data_end
                n = len(data)
                try:
                    if n < VECTORED_WRITE_MIN_BYTES:
                        led.writer.write(encode_record_header(entry_id, pt, data) + data, start)
                    else:
                        head = encode_record_header(entry_id, pt, data)
                        led.writer.write_parts((head, data), start, RECORD_HEADER_SIZE + n)
                except OSError as e:
                    self._undo_write_locked(led, entry_id, start)
                    raise StorageError(f"{self.topic}: append to ledger {led.ledger_id} failed: {e}") from e
                led.offsets.append(start)
                led.publish_times.append(pt)
                led.data_end = start + RECORD_HEADER_SIZE + n
                if entry_id == 0:
                    led.first_pt = pt
                led.last_pt = pt
                led.count = entry_id + 1
                led.size += n
                seq = s.written_seq + 1
                s.written_seq = seq
                lid = led.ledger_id
                if not self._sync_data:  # nothing to wait for: visible as soon as written
                    s.durable_seq = seq
        finally:
            if track:  # inlined _writer_left(): one Python call less per append
                with self.sync_cond:
                    self._writers_in_flight -= 1
                    if self._writers_in_flight == 0:
                        self.sync_cond.notify_all()
        if self._sync_data:
            self._make_durable(seq)
        return _new_tuple(Position, (lid, entry_id))

    def append_many(
        self, entries: Sequence[bytes], publish_times_ms: Sequence[int | None] | None = None
    ) -> list[Position]:
        """Append entries in order with one write and one sync; all land in one ledger."""
        if not entries:
            return []
        if publish_times_ms is None:
            publish_times_ms = [None] * len(entries)
        elif len(publish_times_ms) != len(entries):
            raise ValueError("append_many: one publish time per entry")
        return self._append(list(entries), list(publish_times_ms))

    def _append(self, datas: list[bytes], pts: list[int | None]) -> list[Position]:
        lid, first, seq = self._write(datas, pts)
        if self._sync_data:
            self._make_durable(seq)
        return [_new_tuple(Position, (lid, e)) for e in range(first, first + len(datas))]  # no call per entry

    # --- pipelined commit: write now, sync in a worker ---------------------------------------

    def write_many(
        self, entries: Sequence[bytes], publish_times_ms: Sequence[int | None] | None = None
    ) -> tuple[int, int, int]:
        """Write entries in order with one write, without waiting for a sync: ``(ledger_id,
        first_entry_id, seq)``. They are durable (and visible) once ``durable_seq >= seq``;
        ``sync_written`` gets them there."""
        if publish_times_ms is None:
            publish_times_ms = [None] * len(entries)
        elif len(publish_times_ms) != len(entries):
            raise ValueError("write_many: one publish time per entry")
        return self._write(list(entries), list(publish_times_ms))

    def try_write_many(self, entries: list[bytes], publish_times_ms: list[int | None]):
        """``write_many`` only if it cannot block for long, else None (nothing written): the
        ledger's lock is free now, its writer takes quick writes (``LedgerWriter.inline_writes``:
        a local file, whose pwrite lands in the page cache), no rollover is due, and the batch
        is at most ``INLINE_WRITE_MAX_BYTES``. The broker's event loop calls this, and hands
        the batch to a worker thread (``write_many``) when it says None. Errors as
        ``write_many``. Not counted in ``_writers_in_flight``: it never waits, so a sync leader
        has nothing to wait for."""
        lock = self._lock
        if not lock.acquire(False):
            return None
        try:
            s = self._ledgers
            led = s.current
            if led is None or s.fenced is not None or s.closed or s.read_only:
                return None  # the blocking path says why
            writer = led.writer
            now = self._clock()
            if not writer.inline_writes or (led.count and self._is_full(led, now)):
                return None
            return self._write_locked(s, led, entries, publish_times_ms, now, INLINE_WRITE_MAX_BYTES)
        finally:
            lock.release()

    def _write(self, datas: list[bytes], pts: list[int | None]) -> tuple[int, int, int]:
        track = self._track
        if track:  # lets a sync leader wait for appenders that are mid-write (group commit)
            with self.sync_cond:
                self._writers_in_flight += 1
        s = self._ledgers
        try:
            with self._lock:
                if s.fenced is not None or s.closed or s.read_only:
                    self.check_writable()
                now = self._clock()
                self._maybe_rollover_locked(now)
                led = s.current
                assert led is not None
                return self._write_locked(s, led, datas, pts, now, None)  # type: ignore[return-value]
        finally:
            if track:  # inlined _writer_left(): one Python call less per append
                with self.sync_cond:
                    self._writers_in_flight -= 1
                    if self._writers_in_flight == 0:
                        self.sync_cond.notify_all()

    def _write_locked(
        self,
        s: LedgerList,
        led: LedgerState,
        datas: list[bytes],
        pts: list[int | None],
        now: int,
        max_bytes: int | None,
    ) -> tuple[int, int, int] | None:
        """Frame and write ``datas`` at the end of ``led`` (the lock held); None, with nothing
        written, when they come to more than ``max_bytes``."""
        first = led.count
        start = led.data_end
        # one call frames every record: headers (CRC32C), offsets, publish times
        framed = frame_records(datas, pts, now, first, start, lf.MAX_ENTRY_SIZE)
        if framed is None:
            self._refuse_oversized(datas)
        parts, offsets, times, end = framed
        if max_bytes is not None and end - start > max_bytes:
            return None
        n = len(datas)
        try:
            if end - start < VECTORED_WRITE_MIN_BYTES * n:
                led.writer.write(b"".join(parts), start)
            else:
                led.writer.write_parts(parts, start, end - start)
        except OSError as e:
            self._undo_write_locked(led, first, start)
            raise StorageError(f"{self.topic}: append to ledger {led.ledger_id} failed: {e}") from e
        led.offsets.frombytes(offsets)
        led.publish_times.frombytes(times)
        led.data_end = end
        if first == 0:  # from the framed bytes: no Python call into the column
            led.first_pt = _from_bytes(times[:8], _BYTEORDER, signed=True)
        led.last_pt = _from_bytes(times[-8:], _BYTEORDER, signed=True)
        led.count = first + n
        led.size += end - start - RECORD_HEADER_SIZE * n
        seq = s.written_seq + n
        s.written_seq = seq
        if not self._sync_data:  # nothing to wait for: visible as soon as written
            s.durable_seq = seq
        return led.ledger_id, first, seq

    def _refuse_oversized(self, datas: list[bytes]) -> None:
        for data in datas:
            if len(data) > lf.MAX_ENTRY_SIZE:
                raise InvalidInput(
                    f"{self.topic}: entry of {len(data)} bytes is larger than the "
                    f"{lf.MAX_ENTRY_SIZE} bytes a ledger record may hold"
                )
        raise AssertionError("frame_records refused entries of allowed sizes")

    def _undo_write_locked(self, led: LedgerState, first: int, start: int) -> None:
        """A write failed part-way: cut the ledger back so no partial record stays."""
        del led.offsets[first:], led.publish_times[first:]
        try:
            led.writer.truncate(start)
        except OSError as e:
            self.fence(e)

    def check_writable(self) -> None:
        s = self._ledgers
        if s.read_only:
            raise NotAllowed(f"{self.topic} is open read-only in this process")
        if s.closed:
            raise StorageError(f"managed ledger {self.topic} is closed")
        if s.fenced is not None:
            raise StorageError(f"managed ledger {self.topic} failed earlier and must be reopened: {s.fenced}")

    # --- rollover --------------------------------------------------------------------------

    def start_ledger(self, ledger_id: int, now: int) -> None:
        """Create a ledger already recorded OPEN, and make it current."""
        writer = self._storage.create(ledger_id)
        led = LedgerState(ledger_id, LEDGER_OPEN, now)
        spill_dir = getattr(self._storage, "directory", None)  # beside the ledgers (tail_index)
        led.offsets, led.publish_times = column_pair(spill_dir)  # one spill file between them
        led.writer = writer
        led.seq_base = self._ledgers.written_seq
        self._ledgers.add(led)
        self._ledgers.current = led

    def _maybe_rollover_locked(self, now: int) -> None:
        led = self._ledgers.current
        if led is None or led.count == 0:
            return
        if self._is_full(led, now):
            self._rollover_locked(now)

    def _is_full(self, led: LedgerState, now: int) -> bool:
        """Pulsar's ``currentLedgerIsFull``: a size or age limit reached, and (when a minimum
        is set) the ledger older than the minimum rollover time, however full it is."""
        age = now - led.created_ms
        space_reached = led.count >= self._max_entries or led.size >= self._max_bytes
        if not (space_reached or age >= self._max_age_ms):
            return False
        return age > self._min_age_ms if self._min_age_ms > 0 else True

    @os_errors_as_storage_errors
    def maybe_rollover(self) -> bool:
        """Roll the current ledger if it is past a limit (the broker calls this on a timer so
        that an idle topic's ledger still closes by age). True when it rolled."""
        with self._lock:
            self.check_writable()
            before = self._ledgers.current
            self._maybe_rollover_locked(self._clock())
            return self._ledgers.current is not before

    @os_errors_as_storage_errors
    def rollover(self) -> bool:
        """Seal the current ledger now if it holds entries (a compaction run seals before it
        plans, so it reads only sealed, immutable ledgers -- which may live in the object
        store). True when it rolled."""
        with self._lock:
            self.check_writable()
            if self._ledgers.current is None or self._ledgers.current.count == 0:
                return False
            self._rollover_locked(self._clock())
            return True

    def seal_locked(self, now: int) -> LedgerInfo:
        """Sync + close the current ledger and write its index (not yet in metadata)."""
        led = self._ledgers.current
        assert led is not None
        try:
            led.writer.sync_all()
        finally:
            self.release_writer_locked(led)
        s = self._ledgers
        with self.sync_cond:
            s.durable_seq = max(s.durable_seq, s.written_seq)
            self.sync_cond.notify_all()
        if led.count:
            # written piece by piece from the columns (most of them in their spill file): a
            # local ledger's seal holds no copy of its index (a whole copy was 16 bytes an
            # entry, ~15 MiB for a 10-minute ledger of a busy topic, and every busy topic rolls
            # at about the same time: the 10-minute soak's RSS jumped by half at that moment)
            self._storage.write_index_columns(led.ledger_id, led.offsets, led.publish_times, led.data_end)
            _release(led.offsets)
            _release(led.publish_times)
            # the index leaves memory with the seal; a reader of the sealed ledger reads it
            # from the file just written (IndexCache.ensure, sealed_index), as after a restart
            led.offsets = led.publish_times = None
        else:
            led.offsets, led.publish_times = _frozen(led.offsets), _frozen(led.publish_times)
        led.state = LEDGER_CLOSED
        led.closed_ms = now
        s.current = None
        return s.info(led, led.count)

    def _rollover_locked(self, now: int) -> None:
        try:
            info = self.seal_locked(now)
            new_id = self._store.add_ledger(self.topic, now, close=info)
            self.start_ledger(new_id, now)
            if self.on_rollover is not None:  # Pulsar checks its offload threshold on rollover
                self.on_rollover()
        except BaseException as e:
            self.fence(e)
            if isinstance(e, (OSError,)):
                raise StorageError(f"{self.topic}: ledger rollover failed: {e}") from e
            raise

    @os_errors_as_storage_errors
    def close(self) -> None:
        """Seal the current ledger (so the next open needs no recovery), or drop it when it
        is empty; a fenced or read-only ledger only releases its writer."""
        s = self._ledgers
        led = s.current
        try:
            if led is not None and s.fenced is None and not s.read_only:
                now = self._clock()
                if led.count == 0:
                    self.release_writer_locked(led)
                    s.current = None
                    self._store.delete_ledgers(self.topic, [led.ledger_id])
                    s.remove(led)
                    self._storage.delete(led.ledger_id)
                else:
                    self._store.close_ledger(self.seal_locked(now))
            elif led is not None:
                self.release_writer_locked(led)
        except BaseException as e:
            # the final sync may not have happened: appenders still waiting must not be
            # told their entries are durable
            self.fence(e)
            raise


def _release(values) -> None:
    """Close a sealed ledger's growing column (a ``SpillingColumn`` lets its spill file go)."""
    if isinstance(values, SpillingColumn):
        values.close()


def _frozen(values) -> np.ndarray:
    """A sealed ledger's growing column (``SpillingColumn``, or an ``array('q')``) as one
    int64 numpy array; a column's spill file is released."""
    if isinstance(values, SpillingColumn):
        out = values.to_numpy()
        values.close()
        return out
    return np.frombuffer(values, dtype=np.int64).copy() if len(values) else np.zeros(0, np.int64)
