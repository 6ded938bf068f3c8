"""The entry cache: recently published entries kept in memory for consumers that keep up
(Pulsar's managed-ledger cache), bounded broker-wide and emptied as soon as nobody needs it.

Each topic has a ``TailCache``: its newest entries, in position order, in two parallel lists
(positions, entries). A dispatcher whose read position is inside the cache reads from it
without leaving the event loop; anything older comes from the managed ledger in the thread
pool (``entry_source.LedgerEntrySource``).

What an entry costs. The bound counts what an entry really holds in memory, not only its
payload: the ``bytes`` object's header, its ``Position`` tuple and entry-id int, and the two
list slots (``ENTRY_OVERHEAD``, measured with ``sys.getsizeof`` at import). A 100-byte message
costs about twice its payload, so a bound on payload bytes alone let the cache hold twice what
``managedLedgerCacheSizeMB`` says.

When entries leave (each is an *eviction*, counted for ``/metrics``):

1. Read by every subscription that has consumers (``evict_before`` with the slowest read
   position of the topic's active dispatchers), after every append: a consumer that keeps up
   never needs an entry twice, and one that falls behind reads from the ledger. A topic with
   no active subscription caches nothing (Pulsar inserts only when a cursor is active).
   Redeliveries of entries already evicted are read from the ledger: correct, only slower.
2. Older than ``managedLedgerCacheEvictionTimeThresholdMillis`` (``evict_older_than``): the
   broker's ``EntryCacheManager.evict_expired`` runs every
   ``managedLedgerCacheEvictionIntervalMs`` over the caches that hold anything, so a topic
   that went idle gives its memory back within the threshold.
3. Over a bound: the topic's own ``max_bytes``, or the broker-wide ``managedLedgerCacheSizeMB``
   (``EntryCacheManager.limit``, shared by every topic); the appending cache then drops its own
   oldest entries, so a busy topic recycles its space and never pushes out a quieter one's.

Entry ages are kept per append batch (``_stamps``: absolute index just past the batch, and
the monotonic time it was cached), not per entry: one small tuple per group commit.
"""

from __future__ import annotations

import asyncio
import bisect
import sys
import time
from typing import Any, Callable, Iterable

from ..storage.position import Position
from .background import stop_task

Entry = tuple[Position, bytes]

# Memory one cached entry costs besides its payload: the bytes header, the Position tuple and
# its entry-id int (the ledger-id int is shared), two list slots.
ENTRY_OVERHEAD = sys.getsizeof(b"") + sys.getsizeof(Position(1 << 40, 1 << 20)) + sys.getsizeof(1 << 20) + 16


class EntryCacheManager:
    """What all tail caches of a broker share: the byte limit (``managedLedgerCacheSizeMB``),
    the age limit (``managedLedgerCacheEvictionTimeThresholdMillis``; 0: no age limit), the
    caches that hold anything (for the age sweep) and the counters ``/metrics`` exports."""

    def __init__(
        self, limit: int, max_age_s: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.max_age_s = max_age_s
        self.clock = clock
        self.used = 0  # bytes (payload + ENTRY_OVERHEAD) held by every cache
        self.entries = 0
        self.inserted_entries = 0
        self.evicted_entries = 0
        self.evictions = 0  # eviction operations that dropped at least one entry
        self.hits = 0
        self.hit_bytes = 0
        self.misses = 0
        self.miss_bytes = 0
        self.caches: set[TailCache] = set()  # the non-empty ones
        self._task: Any = None

    def hit(self, entries: list[Entry]) -> None:
        self.hits += len(entries)
        self.hit_bytes += sum(len(e) for _, e in entries)

    def miss(self, entries: list[Entry]) -> None:
        self.misses += len(entries)
        self.miss_bytes += sum(len(e) for _, e in entries)

    async def evict_periodically(self, interval_s: float) -> None:
        """The age sweep, every ``managedLedgerCacheEvictionIntervalMs`` (runs until cancelled)."""
        while True:
            await asyncio.sleep(interval_s)
            self.evict_expired()

    def start(self, spawn: Callable[[Any], Any], interval_s: float) -> None:
        if self.max_age_s > 0 and self._task is None:
            self._task = spawn(self.evict_periodically(interval_s))

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)

    def evict_expired(self) -> int:
        """Drop every entry cached longer ago than the age limit; returns how many."""
        if self.max_age_s <= 0 or not self.caches:
            return 0
        deadline = self.clock() - self.max_age_s
        return sum(cache.evict_older_than(deadline) for cache in list(self.caches))


# Kept for callers of the first version (one shared byte budget).
CacheBudget = EntryCacheManager


class TailCache:
    """The most recently appended entries of a topic, bounded in bytes (pure, no I/O)."""

    def __init__(
        self,
        max_bytes: int = 32 * 1024 * 1024,
        budget: EntryCacheManager | None = None,
        entry_overhead: int = ENTRY_OVERHEAD,
    ) -> None:
        self.max_bytes = max_bytes
        self.budget = budget
        self.overhead = entry_overhead
        self._positions: list[Position] = []
        self._entries: list[bytes] = []
        self._head = 0  # index of the oldest live element (trimmed lazily)
        self._base = 0  # elements deleted from the front of the lists so far
        self._stamps: list[tuple[int, float]] = []  # (absolute end index of a batch, time cached)
        self.size = 0

    def __len__(self) -> int:
        return len(self._positions) - self._head

    def append(self, position: Position, entry: bytes) -> None:
        self.extend([(position, entry)])

    def extend(self, items: Iterable[Entry]) -> None:
        """Cache a batch of appended entries (in position order), then apply the bounds."""
        positions: list[Position] = []
        entries: list[bytes] = []
        for position, entry in items:
            positions.append(position)
            entries.append(entry)
        self.extend_columns(positions, entries)

    def extend_columns(self, positions: list[Position], entries: list[bytes]) -> None:
        """``extend`` for the positions and the entries as two lists of one length (what a
        topic has after a sync): no Python work per entry."""
        n = len(positions)
        if not n:
            return
        self._positions += positions
        self._entries += entries
        added = sum(map(len, entries)) + n * self.overhead
        budget = self.budget
        self.size += added
        if budget is not None:
            budget.used += added
            budget.entries += n
            budget.inserted_entries += n
            budget.caches.add(self)
            now = budget.clock()
        else:
            now = time.monotonic()
        self._stamps.append((self._base + len(self._positions), now))
        over = self.size > self.max_bytes or (budget is not None and budget.used > budget.limit)
        if over:
            self._evict_while_over()

    def _evict_while_over(self) -> None:
        budget = self.budget
        end = self._head
        size = self.size
        used = budget.used if budget is not None else 0
        freed = 0
        while end < len(self._positions) and (
            size - freed > self.max_bytes or (budget is not None and used - freed > budget.limit)
        ):
            freed += len(self._entries[end]) + self.overhead
            end += 1
        self._drop_to(end)

    def _drop_to(self, end: int) -> int:
        """Evict the live elements before list index ``end``; returns how many went."""
        head = self._head
        if end <= head:
            return 0
        entries = self._entries
        freed = 0
        for i in range(head, end):
            freed += len(entries[i])
            entries[i] = b""
        n = end - head
        freed += n * self.overhead
        self._head = end
        self.size -= freed
        budget = self.budget
        if budget is not None:
            budget.used -= freed
            budget.entries -= n
            budget.evicted_entries += n
            budget.evictions += 1
        stamps = self._stamps
        absolute = self._base + end
        drop = 0
        while drop < len(stamps) and stamps[drop][0] <= absolute:
            drop += 1
        if drop:
            del stamps[:drop]
        if self._head >= len(self._positions):
            self._reset()
        elif self._head > 1024 and self._head * 2 > len(self._positions):
            # compact the lists once the dead prefix is as large as the live part
            del self._positions[: self._head]
            del self._entries[: self._head]
            self._base += self._head
            self._head = 0
        return n

    def _reset(self) -> None:
        self._base += len(self._positions)
        self._positions.clear()
        self._entries.clear()
        self._stamps.clear()
        self._head = 0
        self.size = 0
        if self.budget is not None:
            self.budget.caches.discard(self)

    def evict_before(self, position: Position) -> int:
        """Drop every entry before ``position`` (all readers are past them); how many went."""
        if not len(self) or self._positions[self._head] >= position:
            return 0
        return self._drop_to(bisect.bisect_left(self._positions, position, lo=self._head))

    def evict_older_than(self, deadline: float) -> int:
        """Drop every batch cached at or before ``deadline`` (monotonic seconds)."""
        stamps = self._stamps
        end = None
        for absolute, cached_at in stamps:
            if cached_at > deadline:
                break
            end = absolute
        if end is None:
            return 0
        return self._drop_to(min(end - self._base, len(self._positions)))

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
        """Forget everything (the topic closes, or nobody reads it): the bytes go back to the
        broker-wide limit."""
        if self.budget is not None and len(self):
            self.budget.used -= self.size
            self.budget.entries -= len(self)
            self.budget.evicted_entries += len(self)
            self.budget.evictions += 1
        self._reset()


def slowest_active_read(subscriptions: Iterable[Any]) -> Position | None:
    """The lowest read position of the dispatchers that have consumers; None when no
    subscription has one (then nobody reads from the cache)."""
    lowest = None
    for sub in subscriptions:
        d = sub.dispatcher
        if d is None or d.closed or not d.consumers:
            continue
        pos = d.read_position
        if lowest is None or pos < lowest:
            lowest = pos
    return lowest
