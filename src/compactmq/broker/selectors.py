"""Which consumer gets an entry: the delivery rules of each subscription type, as pure classes.

No I/O and no asyncio here, so the rules are unit-tested with plain objects. A "consumer" is
anything with the attributes the selector reads (``priority_level``, ``name``, ``serial`` and,
for Key_Shared sticky mode, ``hash_ranges``) and an ``available`` predicate passed in by the
dispatcher (permits left and socket writable).

- Exclusive: one consumer; a second one is refused (ConsumerBusy) before it gets here.
- Failover: one *active* consumer at a time. Consumers are ordered by priority level (lower
  value first, as in Pulsar) then by name then by arrival; a non-partitioned topic uses the
  first, partition ``i`` of a partitioned topic uses consumer ``i mod n`` so partitions spread
  over the consumers.
- Shared: round robin over the consumers that can take a message, highest priority first.
- Key_Shared: a key always maps to one consumer, through its *slot*, computed as Pulsar does
  so a key lands in the same slot as on a Pulsar broker: Murmur3 32-bit (x86 variant, seed 0)
  of the sticky key, sign bit cleared, modulo 65,536, slot 0 moved to 1 (Pulsar reserves 0).
  AUTO_SPLIT mode places every consumer at 100 points of a ring of slots (consistent hashing,
  Pulsar's default): the point of ``name\0index\0i`` is its slot, ``index`` telling consumers
  of the same name apart; a key goes to the first point at or after its slot, wrapping around,
  and a later point that collides replaces the earlier one, as on Pulsar. A joining or leaving
  consumer moves only the keys next to its points. STICKY mode uses the hash ranges the
  consumers declared, which must not overlap.
"""

from __future__ import annotations

import bisect
from typing import Callable, Generic, Iterable, Sequence, TypeVar

import mmh3

from ..errors import ConsumerAssignError

C = TypeVar("C")

# Pulsar's Key_Shared hash space: ranges are declared over [0, 65535].
HASH_RANGE_SIZE = 1 << 16
# Points per consumer on the AUTO_SPLIT ring (Pulsar's subscriptionKeySharedConsistentHashingReplicaPoints).
RING_POINTS_PER_CONSUMER = 100


def sort_key(consumer) -> tuple:
    return (consumer.priority_level, consumer.name, consumer.serial)


def key_hash(key: bytes) -> int:
    """The Key_Shared slot of a sticky key, in [1, 65535], as Pulsar computes it."""
    slot = (mmh3.hash(key, 0, signed=False) & 0x7FFFFFFF) % HASH_RANGE_SIZE
    return slot or 1


class FailoverSelector(Generic[C]):
    def __init__(self, partition_index: int = -1) -> None:
        self.partition_index = partition_index

    def active(self, consumers: Iterable[C]) -> C | None:
        ordered = sorted(consumers, key=sort_key)
        if not ordered:
            return None
        if self.partition_index < 0:
            return ordered[0]
        return ordered[self.partition_index % len(ordered)]


class RoundRobinSelector(Generic[C]):
    """Shared subscriptions: the next consumer, in priority order, that can take a message."""

    def __init__(self) -> None:
        self._next = 0

    def select(self, consumers: Sequence[C], available: Callable[[C], bool]) -> C | None:
        if not consumers:
            return None
        best_priority = None
        n = len(consumers)
        chosen = None
        for step in range(n):
            c = consumers[(self._next + step) % n]
            if not available(c):
                continue
            if best_priority is None or c.priority_level < best_priority:
                best_priority = c.priority_level
                chosen = (self._next + step) % n
        if chosen is None:
            return None
        self._next = (chosen + 1) % n
        return consumers[chosen]


class HashRingSelector(Generic[C]):
    """Key_Shared AUTO_SPLIT: consistent hashing of key slots onto consumers (see above)."""

    def __init__(self, points_per_consumer: int = RING_POINTS_PER_CONSUMER) -> None:
        self._points_per_consumer = points_per_consumer
        self._ring: list[int] = []  # sorted slots
        self._owners: list[C] = []  # the consumer of each slot
        self._name_index: dict[C, int] = {}

    def _points(self, consumer: C, index: int) -> list[int]:
        name = consumer.name  # type: ignore[attr-defined]
        return [key_hash(f"{name}\0{index}\0{i}".encode()) for i in range(self._points_per_consumer)]

    def add(self, consumer: C) -> None:
        used = {i for c, i in self._name_index.items() if c.name == consumer.name}  # type: ignore[attr-defined]
        index = next(i for i in range(len(used) + 1) if i not in used)
        self._name_index[consumer] = index
        for point in self._points(consumer, index):
            at = bisect.bisect_left(self._ring, point)
            if at < len(self._ring) and self._ring[at] == point:
                self._owners[at] = consumer  # a collision: the newcomer takes the point
            else:
                self._ring.insert(at, point)
                self._owners.insert(at, consumer)

    def remove(self, consumer: C) -> None:
        self._name_index.pop(consumer, None)
        keep = [(p, c) for p, c in zip(self._ring, self._owners) if c is not consumer]
        self._ring = [p for p, _ in keep]
        self._owners = [c for _, c in keep]

    def select(self, key: bytes) -> C | None:
        return self.select_slot(key_hash(key))

    def select_slot(self, slot: int) -> C | None:
        if not self._ring:
            return None
        at = bisect.bisect_left(self._ring, slot)
        return self._owners[at % len(self._ring)]


class StickyRangeSelector(Generic[C]):
    """Key_Shared STICKY: each consumer owns the hash ranges it declared (inclusive ends)."""

    def __init__(self) -> None:
        self._ranges: list[tuple[int, int, C]] = []

    def add(self, consumer: C) -> None:
        ranges = list(consumer.hash_ranges)
        if not ranges:
            raise ConsumerAssignError("Key_Shared STICKY consumer declared no hash ranges")
        for start, end in ranges:
            if not 0 <= start <= end < HASH_RANGE_SIZE:
                raise ConsumerAssignError(f"hash range [{start}, {end}] is outside [0, 65535]")
            for s, e, other in self._ranges:
                if start <= e and s <= end:
                    raise ConsumerAssignError(
                        f"hash range [{start}, {end}] overlaps [{s}, {e}] of consumer {other.name}"
                    )
        for start, end in ranges:
            bisect.insort(self._ranges, (start, end, consumer), key=lambda r: r[0])

    def remove(self, consumer: C) -> None:
        self._ranges = [r for r in self._ranges if r[2] is not consumer]

    def select(self, key: bytes) -> C | None:
        h = key_hash(key)
        at = bisect.bisect_right([r[0] for r in self._ranges], h) - 1
        if at >= 0:
            start, end, consumer = self._ranges[at]
            if start <= h <= end:
                return consumer
        return None
