"""Where a dispatcher gets its entries.

A dispatcher never reads storage directly: it asks an ``EntrySource`` for "the entries at or
after this position". That is the seam for read-compacted subscriptions: their source reads the
compacted ledger up to the compaction horizon and then continues with the topic's own source
(issue 5 builds it; it only has to implement the three methods below).

``LedgerEntrySource`` serves the live topic: recently published entries come from the topic's
``TailCache`` (``entry_cache``) without leaving the event loop (a consumer that keeps up never
touches the disk path), older ones from the managed ledger through the broker's thread pool;
each read counts as cache hits or misses for ``/metrics``.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Callable

from ..storage.position import Position
from .entry_cache import CacheBudget, EntryCacheManager, TailCache

__all__ = ["CacheBudget", "EntryCacheManager", "EntrySource", "LedgerEntrySource", "TailCache"]

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

    def reads_storage(self, start: Position) -> bool:
        """Whether a read at ``start`` leaves the event loop (a storage read in the thread pool).
        A dispatcher reads ahead only from such a source: the entries it keeps are the ones it
        read, and the next read is started before permits ask for it (``dispatchers``)."""
        return False

    def read_now(self, start: Position, max_entries: int) -> list[Entry] | None:
        """``read`` when it can be answered without waiting (from memory), else None: a
        dispatcher then sends what was just appended in the same loop turn, with no task
        (``Dispatcher.appended``). A source that cannot tell returns None."""
        return None


class LedgerEntrySource(EntrySource):
    """The live topic: tail cache first, managed ledger (in the thread pool) otherwise."""

    def __init__(self, topic: "Topic", run_blocking: Callable) -> None:
        self._topic = topic
        self._run = run_blocking

    async def read(self, start: Position, max_entries: int) -> list[Entry]:
        cache = self._topic.tail_cache
        if cache.covers(start):
            hits = cache.read(start, max_entries)
            if cache.budget is not None:
                cache.budget.hit(hits)
            return hits
        ledger = self._topic.ledger
        entries = await self._run(ledger.read_entries, start, max_entries, MAX_BYTES_PER_READ)
        out = [(Position(*p), e) for p, e in entries]
        if cache.budget is not None:
            cache.budget.miss(out)
        return out

    def read_now(self, start: Position, max_entries: int) -> list[Entry] | None:
        cache = self._topic.tail_cache
        if not cache.covers(start):
            return None
        hits = cache.read(start, max_entries)
        if cache.budget is not None:
            cache.budget.hit(hits)
        return hits

    async def read_one(self, position: Position) -> bytes | None:
        cache = self._topic.tail_cache
        entry = cache.get(position)
        if entry is not None:
            if cache.budget is not None:
                cache.budget.hits += 1
                cache.budget.hit_bytes += len(entry)
            return entry
        entries = await self.read(position, 1)
        if entries and entries[0][0] == position:
            return entries[0][1]
        return None

    def last_position(self) -> Position | None:
        return self._topic.last_position

    def reads_storage(self, start: Position) -> bool:
        return not self._topic.tail_cache.covers(start)
