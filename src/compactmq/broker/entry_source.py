"""Where a dispatcher gets its entries.

A dispatcher never reads storage directly: it asks an ``EntrySource`` for "the entries at or
after this position". That is the seam for read-compacted subscriptions: their source reads the
compacted ledger up to the compaction horizon and then continues with the topic's own source
(issue 5 builds it; it only has to implement the three methods below).

``LedgerEntrySource`` serves the live topic: recently published entries come from the topic's
``TailCache`` without leaving the event loop (a consumer that keeps up never touches the disk
path), older ones from the managed ledger through the broker's thread pool.
"""

from __future__ import annotations

import abc
import bisect
from typing import TYPE_CHECKING, Callable

from ..storage.position import Position

if TYPE_CHECKING:  # pragma: no cover
    from .topics import Topic

Entry = tuple[Position, bytes]

# Per storage read: enough entries to amortise the thread hop, few enough to bound memory.
MAX_ENTRIES_PER_READ = 500
MAX_BYTES_PER_READ = 8 * 1024 * 1024


class EntrySource(abc.ABC):
    """Entries of one topic as a subscription may see them, in position order.

    All methods run on the event loop; implementations hop to the executor for blocking I/O.
    """

    @abc.abstractmethod
    async def read(self, start: Position, max_entries: int) -> list[Entry]:
        """Up to ``max_entries`` entries with position >= ``start``, in order ([] at the end)."""

    @abc.abstractmethod
    async def read_one(self, position: Position) -> bytes | None:
        """The entry at exactly ``position`` (for redelivery); None when it is gone."""

    @abc.abstractmethod
    def last_position(self) -> Position | None:
        """Position of the last entry this source can deliver, None when there is none."""


class CacheBudget:
    """Bytes all tail caches of a broker may hold together (so a thousand partitions do not
    mean a thousand full caches). A cache that appends while the broker is over budget drops
    its own oldest entries: busy topics recycle their space, nothing is ever read from disk
    that a consumer keeping up would need."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


class TailCache:
    """The most recently appended entries of a topic, bounded in bytes (pure, no I/O)."""

    def __init__(self, max_bytes: int = 32 * 1024 * 1024, budget: CacheBudget | None = None) -> None:
        self.max_bytes = max_bytes
        self.budget = budget
        self._positions: list[Position] = []
        self._entries: list[bytes] = []
        self._head = 0  # index of the oldest live element (trimmed lazily)
        self.size = 0

    def __len__(self) -> int:
        return len(self._positions) - self._head

    def append(self, position: Position, entry: bytes) -> None:
        self._positions.append(position)
        self._entries.append(entry)
        self.size += len(entry)
        budget = self.budget
        if budget is not None:
            budget.used += len(entry)
        while self._head < len(self._positions) and (
            self.size > self.max_bytes or (budget is not None and budget.used > budget.limit)
        ):
            n = len(self._entries[self._head])
            self.size -= n
            if budget is not None:
                budget.used -= n
            self._entries[self._head] = b""
            self._head += 1
        # Compact the lists once the dead prefix is as large as the live part.
        if self._head > 1024 and self._head * 2 > len(self._positions):
            del self._positions[: self._head]
            del self._entries[: self._head]
            self._head = 0

    def first_position(self) -> Position | None:
        return self._positions[self._head] if len(self) else None

    def covers(self, start: Position) -> bool:
        """True when every entry >= ``start`` that exists is in the cache."""
        first = self.first_position()
        return first is not None and start >= first

    def read(self, start: Position, max_entries: int) -> list[Entry]:
        at = bisect.bisect_left(self._positions, start, lo=self._head)
        end = min(at + max_entries, len(self._positions))
        return list(zip(self._positions[at:end], self._entries[at:end]))

    def get(self, position: Position) -> bytes | None:
        at = bisect.bisect_left(self._positions, position, lo=self._head)
        if at < len(self._positions) and self._positions[at] == position:
            return self._entries[at]
        return None

    def clear(self) -> None:
        if self.budget is not None:
            self.budget.used -= self.size
        self._positions.clear()
        self._entries.clear()
        self._head = 0
        self.size = 0


class LedgerEntrySource(EntrySource):
    """The live topic: tail cache first, managed ledger (in the thread pool) otherwise."""

    def __init__(self, topic: "Topic", run_blocking: Callable) -> None:
        self._topic = topic
        self._run = run_blocking

    async def read(self, start: Position, max_entries: int) -> list[Entry]:
        cache = self._topic.tail_cache
        if cache.covers(start):
            return cache.read(start, max_entries)
        ledger = self._topic.ledger
        entries = await self._run(ledger.read_entries, start, max_entries, MAX_BYTES_PER_READ)
        return [(Position(*p), e) for p, e in entries]

    async def read_one(self, position: Position) -> bytes | None:
        entry = self._topic.tail_cache.get(position)
        if entry is not None:
            return entry
        entries = await self.read(position, 1)
        if entries and entries[0][0] == position:
            return entries[0][1]
        return None

    def last_position(self) -> Position | None:
        return self._topic.last_position
