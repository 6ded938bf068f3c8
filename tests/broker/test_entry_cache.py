"""The entry cache's eviction rules (``broker.entry_cache``): by read position, by age, by the
broker-wide bound counted with each entry's in-memory overhead, and its counters."""

from __future__ import annotations

import asyncio
import sys

from compactmq.broker.entry_cache import ENTRY_OVERHEAD, EntryCacheManager, TailCache, slowest_active_read
from compactmq.storage.position import Position


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fill(cache: TailCache, ledger: int, first: int, n: int, payload: bytes = b"p" * 100) -> None:
    cache.extend((Position(ledger, first + i), payload) for i in range(n))


def test_entry_overhead_is_what_python_spends_besides_the_payload():
    # a bytes header, a 2-tuple and an int at least: an entry costs more than its payload
    assert ENTRY_OVERHEAD >= sys.getsizeof(b"") + sys.getsizeof((1, 2)) + sys.getsizeof(1 << 20)
    manager = EntryCacheManager(limit=1 << 30)
    cache = TailCache(1 << 30, manager)
    _fill(cache, 1, 0, 10)
    assert cache.size == manager.used == 10 * (100 + ENTRY_OVERHEAD)
    assert manager.entries == manager.inserted_entries == 10


def test_extend_columns_caches_what_extend_caches():
    """A topic hands a sync's entries over as two lists (``extend_columns``): the same entries,
    sizes, counters and evictions as ``extend`` of the pairs."""
    clock = Clock()
    per_entry = 100 + ENTRY_OVERHEAD
    pairs_manager = EntryCacheManager(limit=25 * per_entry, clock=clock)
    columns_manager = EntryCacheManager(limit=25 * per_entry, clock=clock)
    by_pairs, by_columns = TailCache(1 << 30, pairs_manager), TailCache(1 << 30, columns_manager)
    for batch in range(6):
        positions = [Position(1, batch * 7 + i) for i in range(7)]
        entries = [b"e" * (90 + i * 3) for i in range(7)]
        by_pairs.extend(zip(positions, entries))
        by_columns.extend_columns(positions, entries)
        assert len(by_columns) == len(by_pairs) and by_columns.size == by_pairs.size
        for key in ("used", "entries", "inserted_entries", "evicted_entries", "evictions"):
            assert getattr(columns_manager, key) == getattr(pairs_manager, key), key
    assert by_columns.read(Position(1, 40), 10) == by_pairs.read(Position(1, 40), 10)
    by_columns.extend_columns([], [])
    assert len(by_columns) == len(by_pairs)


def test_the_broker_wide_bound_counts_overhead_across_many_topics():
    per_entry = 100 + ENTRY_OVERHEAD
    clock = Clock()
    manager = EntryCacheManager(limit=50 * per_entry, max_age_s=1.0, clock=clock)
    caches = [TailCache(1 << 30, manager) for _ in range(20)]
    for round_ in range(10):
        for i, cache in enumerate(caches):
            _fill(cache, i + 1, round_ * 5, 5)
            assert manager.used <= manager.limit
    assert manager.used == sum(c.size for c in caches)
    assert manager.entries == sum(len(c) for c in caches)
    assert manager.evicted_entries == manager.inserted_entries - manager.entries > 0
    # a busy cache recycles its own space: the full budget is held by the first topics, and a
    # newcomer gets room once their entries age out (idle topics give their memory back)
    newcomer = TailCache(1 << 30, manager)
    _fill(newcomer, 99, 0, 5)
    assert len(newcomer) == 0
    clock.now += 1.5
    manager.evict_expired()
    _fill(newcomer, 99, 5, 5)
    assert len(newcomer) == 5 and manager.used == 5 * per_entry


def test_entries_every_reader_passed_are_evicted():
    manager = EntryCacheManager(limit=1 << 30)
    cache = TailCache(1 << 30, manager)
    _fill(cache, 3, 0, 10)
    assert cache.evict_before(Position(3, 0)) == 0
    assert cache.evict_before(Position(3, 4)) == 4
    assert cache.first_position() == Position(3, 4)
    assert cache.get(Position(3, 3)) is None and cache.get(Position(3, 4)) is not None
    assert manager.evictions == 1 and manager.evicted_entries == 4
    # a read position past the end (the next entry to be written) empties it
    assert cache.evict_before(Position(3, 10)) == 6
    assert len(cache) == 0 and cache.size == 0 and manager.used == 0
    assert cache not in manager.caches


def test_entries_older_than_the_threshold_are_evicted_batch_by_batch():
    clock = Clock()
    manager = EntryCacheManager(limit=1 << 30, max_age_s=1.0, clock=clock)
    a, b = TailCache(1 << 30, manager), TailCache(1 << 30, manager)
    _fill(a, 1, 0, 3)
    clock.now += 0.6
    _fill(a, 1, 3, 2)
    _fill(b, 2, 0, 4)
    assert manager.caches == {a, b}
    clock.now += 0.5  # a's first batch is 1.1 s old, the rest 0.5 s
    assert manager.evict_expired() == 3
    assert a.first_position() == Position(1, 3) and len(b) == 4
    clock.now += 1.0
    assert manager.evict_expired() == 6
    assert manager.used == 0 and manager.entries == 0 and not manager.caches
    assert manager.evict_expired() == 0


def test_ages_stay_right_after_the_lists_are_compacted():
    clock = Clock()
    manager = EntryCacheManager(limit=1 << 30, max_age_s=1.0, clock=clock)
    cache = TailCache(1 << 30, manager)
    for k in range(5):
        _fill(cache, 1, k * 1000, 1000, b"x")
        clock.now += 0.3
    cache.evict_before(Position(1, 3000))  # compacts the lists (dead prefix >= live part)
    assert cache.first_position() == Position(1, 3000)
    clock.now += 0.45  # batch 3 (cached at 100.9) is now 1.05 s old, batch 4 0.75 s
    assert cache.evict_older_than(clock.now - 1.0) == 1000
    assert cache.first_position() == Position(1, 4000) and len(cache) == 1000
    _fill(cache, 1, 5000, 10, b"x")
    assert [p for p, _ in cache.read(Position(1, 4998), 4)] == [
        Position(1, 4998),
        Position(1, 4999),
        Position(1, 5000),
        Position(1, 5001),
    ]


def test_clear_gives_everything_back():
    manager = EntryCacheManager(limit=1 << 30)
    cache = TailCache(1 << 30, manager)
    _fill(cache, 1, 0, 7)
    cache.clear()
    assert manager.used == 0 and manager.entries == 0 and manager.evicted_entries == 7
    assert not manager.caches


def test_the_age_sweep_runs_on_a_timer_and_stops():
    async def run():
        manager = EntryCacheManager(limit=1 << 30, max_age_s=0.05)
        cache = TailCache(1 << 30, manager)
        _fill(cache, 1, 0, 3)
        tasks = []
        manager.start(lambda coro: tasks.append(asyncio.ensure_future(coro)) or tasks[-1], 0.01)
        for _ in range(100):
            if not len(cache):
                break
            await asyncio.sleep(0.01)
        await manager.close()
        return len(cache), tasks[0].done()

    left, stopped = asyncio.run(run())
    assert left == 0 and stopped


class _Dispatcher:
    def __init__(self, read_position, consumers=1, closed=False):
        self.read_position, self.consumers, self.closed = read_position, [object()] * consumers, closed


class _Sub:
    def __init__(self, dispatcher):
        self.dispatcher = dispatcher


def test_only_subscriptions_with_consumers_hold_the_cache():
    subs = [
        _Sub(_Dispatcher(Position(1, 5))),
        _Sub(_Dispatcher(Position(1, 2), consumers=0)),  # nobody attached: reads from the ledger later
        _Sub(None),
        _Sub(_Dispatcher(Position(1, 1), closed=True)),
        _Sub(_Dispatcher(Position(1, 7))),
    ]
    assert slowest_active_read(subs) == Position(1, 5)
    assert slowest_active_read(subs[1:4]) is None
