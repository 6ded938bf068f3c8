"""Pure parts of the broker: permit window, read pausing, consumer selection, tail cache."""

import asyncio
import socket
from dataclasses import dataclass, field

import pytest

from compactmq.broker.entry_source import TailCache
from compactmq.broker.flow import MAX_PERMITS, PermitWindow, ReadPauser
from compactmq.broker.selectors import (
    FailoverSelector,
    HashRingSelector,
    RoundRobinSelector,
    StickyRangeSelector,
    key_hash,
)
from compactmq.errors import ConsumerAssignError, InvalidInput
from compactmq.storage.position import Position


@dataclass(eq=False)
class C:
    name: str
    serial: int
    priority_level: int = 0
    hash_ranges: tuple = field(default_factory=tuple)
    ok: bool = True


def test_permit_window_counts_messages_and_may_overdraw_by_one_entry():
    w = PermitWindow()
    assert not w.is_open
    w.grant(3)
    assert w.is_open
    w.consume(1)
    w.consume(10)  # a batch of 10 with 2 permits left: sent, window goes negative
    assert w.available == -8 and not w.is_open
    w.grant(10)
    assert w.available == 2
    w.restore(2)
    assert w.available == 4


def test_permit_window_rejects_negative_and_caps():
    w = PermitWindow()
    with pytest.raises(InvalidInput):
        w.grant(-1)
    w.grant(MAX_PERMITS)
    w.grant(MAX_PERMITS)
    assert w.available == MAX_PERMITS


class FakeTransport:
    def __init__(self):
        self.paused = False
        self.calls = []

    def pause_reading(self):
        self.paused = True
        self.calls.append("pause")

    def resume_reading(self):
        self.paused = False
        self.calls.append("resume")

    def is_closing(self):
        return False


def test_read_pauser_pauses_above_high_water_and_resumes_at_half():
    t = FakeTransport()
    r = ReadPauser(t, high_water=100)
    r.add(60)
    assert not t.paused
    r.add(60)
    assert t.paused
    r.add(10)
    assert t.calls == ["pause"]
    r.release(60)  # 70 pending > 50
    assert t.paused
    r.release(30)  # 40 pending
    assert not t.paused
    assert t.calls == ["pause", "resume"]


def test_failover_picks_by_priority_then_name_and_spreads_partitions():
    a, b, c = C("b", 0), C("a", 1), C("c", 2, priority_level=-1)
    assert FailoverSelector().active([a, b]) is b
    assert FailoverSelector().active([a, b, c]) is c
    sel = [FailoverSelector(i).active([a, b]) for i in range(4)]
    assert sel == [b, a, b, a]
    assert FailoverSelector().active([]) is None


def test_round_robin_skips_unavailable_and_prefers_priority():
    a, b, c = C("a", 0), C("b", 1), C("c", 2)
    rr = RoundRobinSelector()
    avail = lambda x: x.ok  # noqa: E731
    picks = [rr.select([a, b, c], avail).name for _ in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]
    b.ok = False
    picks = [rr.select([a, b, c], avail).name for _ in range(4)]
    assert "b" not in picks and set(picks) == {"a", "c"}
    hi = C("hi", 3, priority_level=-5)
    assert rr.select([a, hi, c], avail) is hi
    for x in (a, hi, c):
        x.ok = False
    assert rr.select([a, hi, c], avail) is None


def test_hash_ring_keeps_keys_on_one_consumer_and_moves_few_on_join():
    a, b = C("a", 0), C("b", 1)
    ring = HashRingSelector()
    ring.add(a)
    ring.add(b)
    keys = [f"key-{i}".encode() for i in range(2000)]
    first = {k: ring.select(k) for k in keys}
    assert all(ring.select(k) is first[k] for k in keys)  # stable
    share = sum(1 for k in keys if first[k] is a) / len(keys)
    assert 0.25 < share < 0.75
    c = C("c", 2)
    ring.add(c)
    moved = [k for k in keys if ring.select(k) is not first[k]]
    assert all(ring.select(k) is c for k in moved)  # only keys that went to the newcomer move
    ring.remove(c)
    assert all(ring.select(k) is first[k] for k in keys)


def test_sticky_ranges_route_and_refuse_overlaps():
    a = C("a", 0, hash_ranges=((0, 32767),))
    b = C("b", 1, hash_ranges=((32768, 65535),))
    sel = StickyRangeSelector()
    sel.add(a)
    sel.add(b)
    for k in (b"x", b"y", b"zz", b""):
        assert sel.select(k) is (a if key_hash(k) <= 32767 else b)
    with pytest.raises(ConsumerAssignError):
        sel.add(C("c", 2, hash_ranges=((100, 200),)))
    sel.remove(a)
    assert all(sel.select(k) in (b, None) for k in (b"x", b"y"))


def test_tail_cache_reads_from_position_and_trims_oldest():
    cache = TailCache(max_bytes=10, entry_overhead=0)  # payload bytes only: the trimming rules
    assert not cache.covers(Position(1, 0))
    for i in range(5):
        cache.append(Position(1, i), b"ab")
    assert cache.covers(Position(1, 0))
    assert [p for p, _ in cache.read(Position(1, 2), 10)] == [Position(1, 2), Position(1, 3), Position(1, 4)]
    assert cache.read(Position(1, 9), 10) == []
    cache.append(Position(2, 0), b"abcd")  # over 10 bytes: the oldest go
    assert not cache.covers(Position(1, 0))
    assert cache.first_position() > Position(1, 0)
    assert cache.get(Position(2, 0)) == b"abcd"
    assert cache.get(Position(1, 0)) is None
    for i in range(3000):
        cache.append(Position(3, i), b"x")
    assert len(cache) <= 10 and cache.get(Position(3, 2999)) == b"x"


def test_tail_caches_share_a_broker_wide_budget():
    from compactmq.broker.entry_source import CacheBudget

    budget = CacheBudget(limit=10)
    a, b = TailCache(100, budget, entry_overhead=0), TailCache(100, budget, entry_overhead=0)
    for i in range(4):
        a.append(Position(1, i), b"xx")
    assert budget.used == 8
    for i in range(3):
        b.append(Position(2, i), b"xx")  # over the shared limit: b drops its own oldest
    assert budget.used <= 10 and len(a) == 4
    a.clear()
    assert budget.used == b.size


# --- ReadPauser's hold of a busy connection's reads, on a real loop and socket transport ------


class _Sink(asyncio.Protocol):
    def data_received(self, data):
        pass


def _on_real_transport(check):
    """Run ``check(loop, transport)`` in a coroutine on a fresh event loop, with the transport of
    one end of a socket pair (``is_reading`` says whether the loop reads it)."""

    async def main():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        transport, _ = await loop.connect_accepted_socket(_Sink, a)
        try:
            await check(loop, transport)
        finally:
            transport.close()
            b.close()

    asyncio.run(main())


def test_read_pauser_holds_a_busy_connections_reads_for_the_hold_then_reads_again():
    async def check(loop, transport):
        r = ReadPauser(transport, high_water=1 << 20, loop=loop, hold_s=0.02)
        now = loop.time()
        r.after_sends(now, 1)  # the first read opens a window; nothing is known yet
        assert transport.is_reading() and not r.held
        # 600 SENDs in the next 0.051 s: ~11,800 a second, over BUSY_READ_RATE
        r.after_sends(now + 0.01, 300)
        r.after_sends(now + 0.051, 300)
        assert r.busy and r.held and r.holds == 1
        assert not transport.is_reading()
        await asyncio.sleep(0.05)
        assert not r.held and transport.is_reading()

    _on_real_transport(check)


def test_read_pauser_never_holds_below_the_busy_rate_or_without_a_hold():
    async def check(loop, transport):
        r = ReadPauser(transport, high_water=1 << 20, loop=loop, hold_s=0.02)
        now = loop.time()
        for i in range(40):  # 5,000 SENDs a second: a lone producer of the latency run
            r.after_sends(now + i * 0.01, 50)
        assert not r.busy and not r.held and r.holds == 0 and transport.is_reading()
        off = ReadPauser(transport, high_water=1 << 20, loop=loop, hold_s=0.0)
        for i in range(40):  # 100,000 a second, but the group-commit delay is 0
            off.after_sends(now + i * 0.01, 1000)
        assert not off.held and off.holds == 0 and transport.is_reading()

    _on_real_transport(check)


def test_read_pauser_resumes_only_when_neither_the_hold_nor_backpressure_stops_reading():
    async def check(loop, transport):
        r = ReadPauser(transport, high_water=100, loop=loop, hold_s=0.02)
        now = loop.time()
        r.after_sends(now, 1)
        r.after_sends(now + 0.051, 1000)  # busy: held
        r.add(150)  # and above the high water
        assert r.held and r.paused and not transport.is_reading()
        await asyncio.sleep(0.05)  # the hold ends, the backpressure stays
        assert not r.held and not transport.is_reading()
        r.release(120)  # 30 pending, under the low water
        assert transport.is_reading()
        # the other way round: backpressure ends while a hold is on
        r.after_sends(now + 0.2, 2000)  # 2,000 in 0.149 s: still busy
        assert r.held
        r.add(150)
        r.release(150)
        assert not r.paused and not transport.is_reading()
        await asyncio.sleep(0.05)
        assert transport.is_reading()

    _on_real_transport(check)
