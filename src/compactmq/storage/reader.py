"""Reading a managed ledger: entries, positions, sizes, and the indexes that make them cheap.

Every read takes the ledger list's lock, finds the ledgers it needs and asks ``visible`` how
many of their entries a reader may see (only durable ones: see ``ledger_state``). Entry bytes
come from the ``LedgerStorage`` as one ranged read per ledger touched, then are split into
entries by ``ledger_file.split_records`` (no per-entry read).

Indexes (``IndexCache``): the current ledger's record offsets and publish times grow as it is
written (``tail_index``: spilled to a file in pieces); a sealed ledger's are opened from its
index on first use -- read piece by piece from the index file where the storage allows it
(``sealed_index``: at most 128 KiB per ledger, however long), else loaded whole (16 bytes an
entry) -- and at most ``MAX_LOADED_INDEXES`` stay open, least recently used dropped first; one
no read used for a while is dropped by ``drop_idle`` (the broker's inactive-topic sweep calls
it). A missing or damaged index is taken from the object store (an offloaded ledger) or rebuilt
by scanning the ledger (and written again).

Offloaded ledgers whose local copy is gone are read from the object store
(``offload.state``); that ranged read runs outside the lock, so appends and local reads go on
meanwhile, and ``read_entries`` ends a pass at such a ledger and continues after it.

Positions: ``next_position`` past the end is the position the next append will take, so a
cursor parked there reads new entries as they come; ``previous_position`` is its inverse.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import NotFound, StorageError
from . import ledger_file as lf
from . import sealed_index
from .ledger_state import LedgerList, LedgerState, os_errors_as_storage_errors, position
from .ledger_storage import LedgerStorage
from .position import EARLIEST, LEDGER_CLOSED, LedgerInfo, Position

if TYPE_CHECKING:  # pragma: no cover
    from .offload.state import OffloadState

# Indexes of sealed ledgers kept in memory per managed ledger, least recently used dropped first.
MAX_LOADED_INDEXES = 16


class IndexCache:
    """Which sealed ledgers have their index in memory (see the module docstring)."""

    def __init__(self, ledgers: LedgerList, storage: LedgerStorage, offloader: Any, clock=time.monotonic):
        self._ledgers = ledgers
        self._storage = storage
        self._offloader = offloader  # storage.offload.LedgerOffloader, or None
        self._clock = clock
        self._loaded: OrderedDict[int, float] = OrderedDict()  # ledger id -> last used

    def touch(self, led: LedgerState) -> None:
        """Mark a sealed ledger's in-memory index as just used; drop the least recently used
        ones past ``MAX_LOADED_INDEXES`` (they reload from their index)."""
        self._loaded[led.ledger_id] = self._clock()
        self._loaded.move_to_end(led.ledger_id)
        while len(self._loaded) > MAX_LOADED_INDEXES:
            old_id, _ = self._loaded.popitem(last=False)
            old = self._ledgers.by_id.get(old_id)
            if old is not None and old is not self._ledgers.current and old is not led:
                old.offsets = old.publish_times = None

    def drop_idle(self, idle_s: float) -> int:
        """Drop the sealed indexes no read used for ``idle_s`` seconds (caller holds the lock):
        a reader that passed a sealed ledger leaves its index behind otherwise, for as long as
        the topic is loaded (a few pieces, ``sealed_index``; 16 bytes an entry where the index
        had to be loaded whole). Returns how many were dropped."""
        deadline = self._clock() - idle_s
        dropped = 0
        while self._loaded:
            ledger_id, used = next(iter(self._loaded.items()))
            if used > deadline:
                break
            self._loaded.popitem(last=False)
            led = self._ledgers.by_id.get(ledger_id)
            if led is not None and led is not self._ledgers.current and led.offsets is not None:
                led.offsets = led.publish_times = None
                dropped += 1
        return dropped

    def ensure(self, led: LedgerState) -> None:
        """Have ``led``'s offsets and publish times in memory (caller holds the lock)."""
        if led is not self._ledgers.current:
            self.touch(led)
        if led.offsets is not None:
            return
        columns = self._sealed_columns(led)
        if columns is not None:
            led.offsets, led.publish_times, led.data_end = columns
            return
        index = self._stored_index(led)
        if index is None and led.offload is not None:
            index = self._offloader.index(led.offload).ledger_index
        if index is None:
            index = self._rebuild(led)
        led.offsets, led.publish_times, led.data_end = index.offsets, index.publish_times, index.data_end

    def _sealed_columns(self, led: LedgerState) -> tuple[Any, Any, int] | None:
        """A sealed ledger's index as ``sealed_index`` columns read from its index file, when
        the storage reads pieces of an index cheaply; None otherwise (or a missing, damaged
        index), for the whole-index load."""
        storage = self._storage
        if not storage.ranged_index_reads or led.local_gone or led is self._ledgers.current:
            return None
        ledger_id = led.ledger_id
        return sealed_index.open_columns(
            lambda offset, length: storage.read_index_range(ledger_id, offset, length),
            ledger_id,
            led.count,
        )

    def _stored_index(self, led: LedgerState) -> lf.LedgerIndex | None:
        blob = self._storage.read_index(led.ledger_id)
        if blob is None:
            return None
        try:
            index = lf.decode_index(blob)
        except StorageError:
            return None
        if index.ledger_id != led.ledger_id or len(index.offsets) != led.count:
            return None
        return index

    def _rebuild(self, led: LedgerState) -> lf.LedgerIndex:
        """Lost or damaged index: rebuild it from the ledger's records."""
        topic = self._ledgers.topic
        try:
            buf = self._storage.read_all(led.ledger_id)
        except OSError as e:
            raise StorageError(f"{topic}: ledger {led.ledger_id} unreadable: {e}") from e
        if buf is None:
            raise StorageError(f"{topic}: ledger {led.ledger_id} unreadable: it does not exist")
        scan = lf.scan_records(buf, verify_crc=True)
        if len(scan.entry_ids) < led.count:
            raise StorageError(
                f"{topic}: ledger {led.ledger_id} holds {len(scan.entry_ids)} intact entries, "
                f"the metadata store recorded {led.count}"
            )
        n = led.count
        end = int(scan.offsets[n]) if n < len(scan.offsets) else scan.valid_end
        index = lf.LedgerIndex(led.ledger_id, scan.offsets[:n], scan.publish_times[:n], end)
        if not self._ledgers.read_only:
            self._storage.write_index(led.ledger_id, lf.encode_index(*index))
        return index


class Reader:
    """Entry reads, positions and sizes of one managed ledger. Thread-safe."""

    def __init__(
        self, ledgers: LedgerList, storage: LedgerStorage, indexes: IndexCache, offload: "OffloadState"
    ):
        self.topic = ledgers.topic
        self._ledgers = ledgers
        self._lock = ledgers.lock
        self._storage = storage
        self._indexes = indexes
        self._offload = offload

    @os_errors_as_storage_errors
    def read_entry(self, position: Position) -> bytes:
        """The bytes of one entry; ``NotFound`` when there is no such (durable) entry."""
        ledger_id, entry_id = position
        with self._lock:
            led = self._ledgers.by_id.get(ledger_id)
            if led is None or entry_id < 0 or entry_id >= self._ledgers.visible(led):
                raise NotFound(f"{self.topic}: no entry at {ledger_id}:{entry_id}")
            self._indexes.ensure(led)
            lo, hi = int(led.offsets[entry_id]), led.end_of(entry_id)
            if self._offload.is_remote(led):
                blob = self._offload.read_range(led, lo, hi)
            else:
                blob = self._storage.read_range(ledger_id, lo, hi)
            return lf.split_records(blob, lo, led.offsets[entry_id : entry_id + 1], hi, entry_id)[0]

    def _locate(self, start: Position) -> tuple[int, int]:
        """(index into the ledger list, entry id) of the first place at or after ``start``."""
        ledger_id, entry_id = start
        for i, led in enumerate(self._ledgers.ledgers):
            if led.ledger_id == ledger_id:
                return i, max(entry_id, 0)
            if led.ledger_id > ledger_id:
                return i, 0
        return len(self._ledgers.ledgers), 0

    @os_errors_as_storage_errors
    def read_entries(
        self, start: Position, max_entries: int, max_bytes: int | None = None
    ) -> list[tuple[Position, bytes]]:
        """Up to ``max_entries`` entries from the first one at or after ``start``, crossing
        ledgers; stops before ``max_bytes`` of entry bytes (always returns at least one entry
        when one exists)."""
        out, cut = self._read_some(Position(*start), max_entries, max_bytes)
        # an offloaded ledger ends a pass (its ranged read runs outside the lock): go on after it
        while out and cut and len(out) < max_entries:
            used = sum(len(d) for _, d in out)
            if max_bytes is not None and used >= max_bytes:
                break
            more, cut = self._read_some(
                self.next_position(out[-1][0]),
                max_entries - len(out),
                None if max_bytes is None else max_bytes - used,
                must_fill=False,
            )
            if not more:
                break
            out.extend(more)
        return out

    def _read_some(
        self, start: Position, max_entries: int, max_bytes: int | None, must_fill: bool = True
    ) -> tuple[list[tuple[Position, bytes]], bool]:
        """One pass of ``read_entries`` under the lock; True when it stopped at an offloaded
        ledger (whose first range it fetched, after the lock, when nothing came before it)."""
        out: list[tuple[Position, bytes]] = []
        budget = max_bytes
        remote = None
        cut = False
        ledgers = self._ledgers
        with self._lock:
            i, e = self._locate(Position(*start))
            while len(out) < max_entries and i < len(ledgers.ledgers):
                led = ledgers.ledgers[i]
                avail = ledgers.visible(led)
                if e >= avail:
                    i, e = i + 1, 0
                    continue
                self._indexes.ensure(led)
                n = min(max_entries - len(out), avail - e)
                if budget is not None:
                    n, used = _fit(led, e, n, budget, bool(out) or not must_fill)
                    budget -= used
                if n == 0:
                    break
                lo = int(led.offsets[e])
                hi = led.end_of(e + n - 1)
                lid = led.ledger_id
                if self._offload.is_remote(led):
                    # an offloaded ledger: one ranged read, made outside the lock (appends and
                    # local reads go on meanwhile); what was read so far is returned first
                    if not out:
                        remote = (led, lo, hi, np.array(led.offsets[e : e + n]), e, lid)
                    cut = True
                    break
                blob = self._storage.read_range(lid, lo, hi)
                datas = lf.split_records(blob, lo, led.offsets[e : e + n], hi, e)
                out.extend(zip([position(lid, k) for k in range(e, e + n)], datas))
                if budget is not None and budget <= 0:
                    break
                i, e = i + 1, 0
        if remote is not None:
            rled, lo, hi, offsets, e, lid = remote
            blob = self._offload.read_range(rled, lo, hi)
            datas = lf.split_records(blob, lo, offsets, hi, e)
            out.extend(zip([position(lid, k) for k in range(e, e + len(datas))], datas))
        return out, cut

    # --- positions -------------------------------------------------------------------------

    def first_position(self) -> Position | None:
        with self._lock:
            for led in self._ledgers.ledgers:
                if self._ledgers.visible(led):
                    return Position(led.ledger_id, 0)
            return None

    def last_position(self) -> Position | None:
        """The last durable entry (Pulsar's last confirmed entry), or None when empty."""
        with self._lock:
            for led in reversed(self._ledgers.ledgers):
                n = self._ledgers.visible(led)
                if n:
                    return Position(led.ledger_id, n - 1)
            return None

    def next_position(self, position: Position) -> Position:
        """The first entry after ``position``; past the end, the position the next append
        will take (so a cursor parked there reads new entries as they come)."""
        ledger_id, entry_id = position
        ledgers = self._ledgers
        with self._lock:
            for led in ledgers.ledgers:
                if led.ledger_id < ledger_id:
                    continue
                e = entry_id + 1 if led.ledger_id == ledger_id else 0
                if e < ledgers.visible(led):
                    return Position(led.ledger_id, e)
            if ledgers.current is not None:
                return Position(ledgers.current.ledger_id, ledgers.visible(ledgers.current))
            if ledgers.ledgers:
                last = ledgers.ledgers[-1]
                if last.ledger_id >= ledger_id:
                    return Position(last.ledger_id, ledgers.visible(last))
            return Position(ledger_id, entry_id + 1)

    @staticmethod
    def previous_position(position: Position) -> Position:
        """A position whose ``next_position`` is the first entry at or after ``position``."""
        ledger_id, entry_id = position
        return Position(ledger_id, entry_id - 1) if entry_id > 0 else Position(ledger_id, -1)

    @os_errors_as_storage_errors
    def find_position_by_publish_time(self, ts_ms: int) -> Position:
        """The first entry published at or after ``ts_ms`` (ledgers are skipped by their last
        publish time, then searched); past the end, the next position to be written."""
        with self._lock:
            for led in self._ledgers.ledgers:
                n = self._ledgers.visible(led)
                if n == 0 or (
                    led.state == LEDGER_CLOSED
                    and led.last_pt is not None
                    and led.last_pt < ts_ms
                    and led is not self._ledgers.current
                ):
                    continue
                self._indexes.ensure(led)
                hit = _first_at_or_after(led.publish_times, n, ts_ms)
                if hit is not None:
                    return Position(led.ledger_id, hit)
            last = self.last_position()
            return self.next_position(last) if last is not None else self.next_position(EARLIEST)

    @os_errors_as_storage_errors
    def publish_time_of(self, position: Position) -> int | None:
        """Publish time (ms) the index keeps for the entry at ``position``; None when there is
        no such durable entry."""
        ledger_id, entry_id = int(position[0]), int(position[1])
        with self._lock:
            led = self._ledgers.by_id.get(ledger_id)
            if led is None or not 0 <= entry_id < self._ledgers.visible(led):
                return None
            if entry_id == 0 and led.first_pt is not None:
                return int(led.first_pt)
            self._indexes.ensure(led)
            return int(led.publish_times[entry_id])

    # --- sizes -----------------------------------------------------------------------------

    def ledgers(self) -> list[LedgerInfo]:
        with self._lock:
            return [self._ledgers.info(led, self._ledgers.visible(led)) for led in self._ledgers.ledgers]

    def entries_after(self, position: Position) -> int:
        """How many durable entries come after ``position``."""
        ledger_id, entry_id = position
        total = 0
        with self._lock:
            for led in self._ledgers.ledgers:
                n = self._ledgers.visible(led)
                if led.ledger_id > ledger_id:
                    total += n
                elif led.ledger_id == ledger_id:
                    total += max(0, n - (entry_id + 1))
        return total

    @os_errors_as_storage_errors
    def size_after(self, position: Position) -> int:
        """Entry bytes after ``position`` (the backlog size of a cursor there)."""
        ledger_id, entry_id = position
        total = 0
        with self._lock:
            for led in self._ledgers.ledgers:
                n = self._ledgers.visible(led)
                if led.ledger_id > ledger_id:
                    total += led.size if n == led.count else led.bytes_between(0, n)
                elif led.ledger_id == ledger_id and entry_id + 1 < n:
                    self._indexes.ensure(led)
                    total += led.bytes_between(max(entry_id + 1, 0), n)
        return total

    def total_size(self) -> int:
        with self._lock:
            total = 0
            for led in self._ledgers.ledgers:
                n = self._ledgers.visible(led)
                total += led.size if n == led.count else led.bytes_between(0, n)
            return total

    def entry_count(self) -> int:
        with self._lock:
            return sum(self._ledgers.visible(led) for led in self._ledgers.ledgers)


# publish times searched per step (a sealed ledger's are read piece by piece, never whole)
_SEARCH_STEP = 1 << 16


def _first_at_or_after(publish_times: Any, n: int, ts_ms: int) -> int | None:
    """The first of the ``n`` first ``publish_times`` at or after ``ts_ms``, or None."""
    if isinstance(publish_times, np.ndarray):
        hits = np.flatnonzero(publish_times[:n] >= ts_ms)
        return int(hits[0]) if len(hits) else None
    for lo in range(0, n, _SEARCH_STEP):
        pts = np.asarray(publish_times[lo : min(n, lo + _SEARCH_STEP)], dtype=np.int64)
        hits = np.flatnonzero(pts >= ts_ms)
        if len(hits):
            return lo + int(hits[0])
    return None


def _fit(led: LedgerState, e: int, n: int, budget: int, may_stop_at_zero: bool) -> tuple[int, int]:
    """How many of ``led``'s entries from ``e`` (at most ``n``) fit in ``budget`` bytes, and
    their bytes; the first always fits unless ``may_stop_at_zero``."""
    if n <= 0:
        return 0, 0
    # one slice of the index and numpy, not two index lookups per entry (a sealed ledger's
    # index is a ``sealed_index.SealedColumn``, whose lookups are Python calls)
    bounds = np.empty(n + 1, np.int64)
    bounds[:n] = led.offsets[e : e + n]
    bounds[n] = led.end_of(e + n - 1)
    used_upto = np.cumsum(np.diff(bounds) - lf.RECORD_HEADER_SIZE)
    take = int(np.searchsorted(used_upto, budget, side="right"))  # the first take fit
    if take == 0 and not may_stop_at_zero:
        take = 1
    return take, int(used_upto[take - 1]) if take else 0
