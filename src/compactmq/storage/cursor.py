"""Cursors: how far a subscription has acknowledged a managed ledger.

A cursor is a *mark-delete position* (every entry at or before it is acknowledged) plus the
*individually acknowledged* entries after it, kept as ranges: acknowledging a million entries
one by one in order leaves one range (or none, once the mark-delete position catches up), so
what is persisted stays small. Positions are packed into one int64 each (``position.pack``);
consecutive entries of a ledger are consecutive integers, so a range is a pair of ints.

When the first range starts right at the entry after the mark-delete position (crossing into
the next ledger when needed), the mark-delete position moves to the end of that range.

Durable cursors are saved in the metadata store after every change (one row, one commit);
non-durable cursors (readers) live in memory only and do not hold back retention.

A cursor knows its managed ledger only as a ``CursorHost``: the few calls it makes (positions,
reads, saving and re-reading its record). ``ManagedLedger`` is one; this module imports none
of the managed ledger's modules, so there is no import loop between the two.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from typing import Any, Iterable, Mapping, Protocol

import numpy as np

from .ledger_metadata import StoredCursor
from .position import Position, pack, unpack


class CursorHost(Protocol):
    """What a cursor asks of the managed ledger it belongs to."""

    topic: str

    def next_position(self, position: Position) -> Position: ...

    def previous_position(self, position: Position) -> Position: ...

    def last_position(self) -> Position | None: ...

    def entries_after(self, position: Position) -> int: ...

    def size_after(self, position: Position) -> int: ...

    def read_entries(
        self, start: Position, max_entries: int, max_bytes: int | None = None
    ) -> list[tuple[Position, bytes]]: ...

    def save_cursor_state(self, cursor: "Cursor") -> None:
        """Persist a durable cursor's mark-delete position, acked ranges and properties."""
        ...

    def cursor_record(self, name: str) -> StoredCursor | None:
        """The cursor's record as the metadata store has it now."""
        ...


class RangeSet:
    """Disjoint, sorted, inclusive integer ranges; adjacent ranges merge."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __len__(self) -> int:
        return len(self.starts)

    def add_range(self, a: int, b: int) -> None:
        lo = bisect_left(self.ends, a - 1)  # first range ending at or after a-1
        hi = bisect_right(self.starts, b + 1)  # ranges starting at or before b+1
        if lo < hi:
            a = min(a, self.starts[lo])
            b = max(b, self.ends[hi - 1])
        self.starts[lo:hi] = [a]
        self.ends[lo:hi] = [b]

    def add_many(self, keys: Iterable[int]) -> None:
        """Add points; sorted runs of consecutive keys become one ``add_range`` each."""
        ks = sorted(set(keys))
        if not ks:
            return
        run_start = prev = ks[0]
        for k in ks[1:]:
            if k != prev + 1:
                self.add_range(run_start, prev)
                run_start = k
            prev = k
        self.add_range(run_start, prev)

    def contains(self, k: int) -> bool:
        i = bisect_right(self.starts, k) - 1
        return i >= 0 and self.ends[i] >= k

    def remove_through(self, k: int) -> None:
        """Drop every key <= k."""
        i = bisect_right(self.ends, k)
        del self.starts[:i], self.ends[:i]
        if self.starts and self.starts[0] <= k:
            self.starts[0] = k + 1

    def count(self) -> int:
        return sum(self.ends) - sum(self.starts) + len(self.starts)

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.starts, self.ends))

    def to_bytes(self) -> bytes:
        arr = np.empty(2 * len(self.starts), dtype=">i8")
        arr[0::2] = self.starts
        arr[1::2] = self.ends
        return arr.tobytes()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "RangeSet":
        rs = cls()
        if blob:
            arr = np.frombuffer(blob, dtype=">i8").astype(np.int64)
            rs.starts = arr[0::2].tolist()
            rs.ends = arr[1::2].tolist()
        return rs


class Cursor:
    """A named position in a managed ledger. Thread-safe. Obtained from
    ``ManagedLedger.open_cursor``; never built directly."""

    def __init__(
        self,
        ledger: CursorHost,
        name: str,
        durable: bool,
        mark_delete: Position,
        acked: RangeSet | None = None,
        properties: Mapping[str, Any] | None = None,
    ):
        self._ml = ledger
        self.name = name
        self.durable = durable
        self._lock = threading.RLock()
        self._mark_delete = Position(*mark_delete)
        self._acked = acked or RangeSet()
        self._properties = dict(properties or {})
        self._read_position = ledger.next_position(self._mark_delete)
        self._deleted = False

    def __repr__(self) -> str:
        return f"Cursor({self._ml.topic!r}, {self.name!r}, mark_delete={self._mark_delete})"

    # --- state ---------------------------------------------------------------------------------

    @property
    def mark_delete_position(self) -> Position:
        return self._mark_delete

    @property
    def read_position(self) -> Position:
        with self._lock:
            floor = self._ml.next_position(self._mark_delete)
            if self._read_position < floor:
                self._read_position = floor
            return self._read_position

    @property
    def properties(self) -> dict[str, Any]:
        return dict(self._properties)

    def set_properties(self, properties: Mapping[str, Any]) -> None:
        with self._lock:
            self._properties = dict(properties)
            self._persist()

    def set_property(self, key: str, value: Any) -> None:
        with self._lock:
            self._properties[key] = value
            self._persist()

    def individually_acked_ranges(self) -> list[tuple[Position, Position]]:
        """Acknowledged entries after the mark-delete position, as inclusive ranges."""
        with self._lock:
            return [(unpack(a), unpack(b)) for a, b in self._acked.pairs()]

    def is_acknowledged(self, position: Position) -> bool:
        with self._lock:
            return Position(*position) <= self._mark_delete or self._acked.contains(pack(position))

    def backlog(self) -> int:
        """Entries after the mark-delete position not yet acknowledged."""
        with self._lock:
            return max(0, self._ml.entries_after(self._mark_delete) - self._acked.count())

    def backlog_size(self) -> int:
        """Entry bytes after the mark-delete position (individual acks not subtracted, as
        Pulsar's backlogSize)."""
        return self._ml.size_after(self._mark_delete)

    # --- acknowledgement -----------------------------------------------------------------------

    def ack_individual(self, positions: Iterable[Position]) -> None:
        with self._lock:
            keys = []
            for p in positions:
                p = Position(*p)
                if p > self._mark_delete and p.entry_id >= 0:
                    keys.append(pack(p))
            if not keys:
                return
            self._acked.add_many(keys)
            self._advance()
            self._persist()

    def ack_cumulative(self, position: Position) -> None:
        """Everything up to and including ``position`` is acknowledged."""
        with self._lock:
            position = Position(*position)
            if position <= self._mark_delete:
                return
            self._mark_delete = position
            self._acked.remove_through(pack(position))
            self._advance()
            self._persist()

    def _advance(self) -> None:
        # Slide the mark-delete position over ranges that now touch it.
        while self._acked.starts:
            nxt = self._ml.next_position(self._mark_delete)
            if self._acked.starts[0] > pack(nxt):
                break
            if self._acked.starts[0] < pack(nxt):
                # acked positions that no longer exist (trimmed ledger): nothing to wait for
                self._acked.remove_through(pack(nxt) - 1)
                continue
            self._mark_delete = unpack(self._acked.ends[0])
            del self._acked.starts[0], self._acked.ends[0]
        if self._read_position < self._ml.next_position(self._mark_delete):
            self._read_position = self._ml.next_position(self._mark_delete)

    # --- moving the read position -----------------------------------------------------------

    def seek(self, position: Position) -> None:
        """Move the read position (for redelivery); never before the mark-delete position."""
        with self._lock:
            floor = self._ml.next_position(self._mark_delete)
            self._read_position = max(Position(*position), floor)

    def rewind(self) -> None:
        """Read again from the first entry after the mark-delete position."""
        with self._lock:
            self._read_position = self._ml.next_position(self._mark_delete)

    def reset(self, position: Position) -> None:
        """Reset the subscription (Pulsar's reset-cursor / seek): the next entry read is the
        first one at or after ``position``; acknowledgements after it are forgotten."""
        with self._lock:
            position = Position(*position)
            self._mark_delete = self._ml.previous_position(position)
            self._acked = RangeSet()
            self._read_position = self._ml.next_position(self._mark_delete)
            self._persist()

    def read_entries(self, max_entries: int, max_bytes: int | None = None) -> list[tuple[Position, bytes]]:
        """Entries from the read position on, skipping individually acknowledged ones; moves
        the read position past what it returns."""
        with self._lock:
            out: list[tuple[Position, bytes]] = []
            pos = self.read_position
            while len(out) < max_entries:
                batch = self._ml.read_entries(pos, max_entries - len(out), max_bytes)
                if not batch:
                    break
                for p, data in batch:
                    if not self._acked.contains(pack(p)):
                        out.append((p, data))
                last = batch[-1][0]
                pos = self._ml.next_position(last)
                self._read_position = pos
                if max_bytes is not None:
                    break
            return out

    def has_more_entries(self) -> bool:
        last = self._ml.last_position()
        return last is not None and self.read_position <= last

    # --- persistence -----------------------------------------------------------------------

    def _persist(self) -> None:
        if self.durable and not self._deleted:
            self._ml.save_cursor_state(self)

    def _snapshot(self) -> tuple[Position, bytes, dict[str, Any]]:
        with self._lock:
            return self._mark_delete, self._acked.to_bytes(), dict(self._properties)

    def reload(self) -> None:
        """Re-read a durable cursor from the metadata store (another process may have moved
        it: ``commit_compaction`` advances ``__compaction``). Positions only move forward."""
        if not self.durable:
            return
        rec = self._ml.cursor_record(self.name)
        if rec is None:
            return
        with self._lock:
            if rec.mark_delete > self._mark_delete:
                self._mark_delete = rec.mark_delete
                self._acked.remove_through(pack(rec.mark_delete))
                self._advance()
