"""Dispatchers and subscriptions with fake entries, cursor and connections (no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from compactmq.broker.entry_source import EntrySource
from compactmq.broker.subscriptions import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED, Consumer, Subscription
from compactmq.errors import ConsumerBusy
from compactmq.protocol import entry_format
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.storage.position import Position


def entry(i: int, key: str | None = None, deliver_at: int = 0) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=i, publish_time=1000 + i)
    if key is not None:
        md.partition_key = key
    if deliver_at:
        md.deliver_at_time = deliver_at
    return entry_format.build_entry(md, b"%d" % i)


class ListSource(EntrySource):
    def __init__(self, entries):
        self.entries = [(Position(1, i), e) for i, e in enumerate(entries)]

    async def read(self, start, max_entries):
        return [(p, e) for p, e in self.entries if p >= start][:max_entries]

    async def read_one(self, position):
        return next((e for p, e in self.entries if p == position), None)

    def last_position(self):
        return self.entries[-1][0] if self.entries else None


class FakeCursor:
    def __init__(self):
        self.mark_delete_position = Position(1, -1)
        self.acked: set[Position] = set()

    def is_acknowledged(self, p):
        return p <= self.mark_delete_position or p in self.acked

    def individually_acked_ranges(self):
        return [(p, p) for p in sorted(self.acked)]

    def ack_individual(self, ps):
        self.acked.update(ps)
        while Position(1, self.mark_delete_position[1] + 1) in self.acked:
            self.mark_delete_position = Position(1, self.mark_delete_position[1] + 1)
            self.acked.discard(self.mark_delete_position)

    def ack_cumulative(self, p):
        if p > self.mark_delete_position:
            self.mark_delete_position = p
        self.acked = {a for a in self.acked if a > p}

    def reset(self, p):
        self.mark_delete_position = Position(p[0], p[1] - 1)
        self.acked.clear()

    properties: dict = {}

    def set_property(self, key, value):
        self.properties = {**self.properties, key: value}


class FakeTopic:
    name = "persistent://public/default/fake"
    partition_index = -1

    def __init__(self, source):
        self.source = source
        self.tasks = []

    def spawn(self, coro):
        t = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(t)
        return t

    async def run_blocking(self, fn, *args):
        return fn(*args)

    def drop_subscription(self, sub):
        pass


class FakeConnection:
    def __init__(self):
        self.writable = True
        self.sent: list[tuple[int, Position, int, list | None]] = []
        self.active_changes: list[tuple[int, bool]] = []
        self.closed_consumers: list[int] = []

    def send_message(self, consumer_id, position, partition, redelivery_count, ack_set, data):
        self.sent.append((consumer_id, position, redelivery_count, ack_set, data))

    def send_messages(self, consumer_id, partition, items):
        for position, redelivery_count, ack_set, data in items:
            self.send_message(consumer_id, position, partition, redelivery_count, ack_set, data)

    def send_active_consumer_change(self, consumer_id, is_active):
        self.active_changes.append((consumer_id, is_active))

    def close_consumer_by_broker(self, consumer):
        self.closed_consumers.append(consumer.consumer_id)
        consumer.subscription.remove_consumer(consumer)


async def settle(topic):
    for _ in range(20):
        await asyncio.sleep(0)
        pending = [t for t in topic.tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=1)


def setup(entries, sub_type, n_consumers=1, permits=0):
    source = ListSource(entries)
    topic = FakeTopic(source)
    sub = Subscription(topic, "s", FakeCursor(), durable=True, source=source)
    conns, consumers = [], []
    for i in range(n_consumers):
        conn = FakeConnection()
        c = Consumer(sub, conn, i, f"c{i}")
        sub.add_consumer(c, sub_type)
        if permits:
            c.flow(permits)
        conns.append(conn)
        consumers.append(c)
    return topic, sub, consumers, conns


def positions(conn):
    return [s[1][1] for s in conn.sent]


def test_exclusive_gets_no_more_than_its_permits_then_more_after_flow():
    async def run():
        topic, sub, (c,), (conn,) = setup([entry(i) for i in range(10)], EXCLUSIVE, permits=3)
        await settle(topic)
        assert positions(conn) == [0, 1, 2]
        c.flow(4)
        await settle(topic)
        assert positions(conn) == list(range(7))

    asyncio.run(run())


def test_second_exclusive_consumer_is_busy():
    async def run():
        topic, sub, _, _ = setup([entry(0)], EXCLUSIVE)
        with pytest.raises(ConsumerBusy):
            sub.add_consumer(Consumer(sub, FakeConnection(), 9, "other"), EXCLUSIVE)
        with pytest.raises(ConsumerBusy):
            sub.add_consumer(Consumer(sub, FakeConnection(), 9, "other"), SHARED)

    asyncio.run(run())


def test_shared_round_robin_and_redelivery_with_count():
    async def run():
        topic, sub, (a, b), (ca, cb) = setup([entry(i) for i in range(6)], SHARED, 2, permits=2)
        await settle(topic)
        assert sorted(positions(ca) + positions(cb)) == [0, 1, 2, 3]
        assert positions(ca) and positions(cb)
        first_of_a = Position(1, positions(ca)[0])
        sub.ack_individual([(Position(1, p), None) for p in positions(cb)])
        sub.redeliver(a, [first_of_a])
        b.flow(1)
        await settle(topic)
        redelivered = [s for s in cb.sent if s[1] == first_of_a]
        assert redelivered and redelivered[0][2] == 1  # redelivery count

    asyncio.run(run())


def test_consumer_leaving_shared_hands_its_messages_to_the_others():
    async def run():
        topic, sub, (a, b), (ca, cb) = setup([entry(i) for i in range(4)], SHARED, 2, permits=2)
        await settle(topic)
        given_to_a = positions(ca)
        sub.remove_consumer(a)
        b.flow(10)
        await settle(topic)
        assert set(given_to_a) <= set(positions(cb))

    asyncio.run(run())


def test_single_active_redeliver_rewinds_to_first_unacked():
    async def run():
        topic, sub, (c,), (conn,) = setup([entry(i) for i in range(5)], EXCLUSIVE, permits=100)
        await settle(topic)
        assert positions(conn) == [0, 1, 2, 3, 4]
        sub.ack_cumulative(Position(1, 1))
        sub.ack_individual([(Position(1, 3), None)])
        await settle(topic)
        sub.redeliver(c, None)
        await settle(topic)
        assert positions(conn)[5:] == [2, 4]  # acknowledged entries are not sent again

    asyncio.run(run())


def test_failover_standby_takes_over_from_first_unacked():
    async def run():
        topic, sub, (a, b), (ca, cb) = setup([entry(i) for i in range(4)], FAILOVER, 2, permits=10)
        await settle(topic)
        assert positions(ca) == [0, 1, 2, 3] and positions(cb) == []
        assert (0, True) in ca.active_changes and (1, False) in cb.active_changes
        sub.ack_cumulative(Position(1, 1))
        sub.remove_consumer(a)
        await settle(topic)
        assert positions(cb) == [2, 3]
        assert cb.active_changes[-1] == (1, True)

    asyncio.run(run())


def test_key_shared_keeps_order_when_a_consumer_is_out_of_permits():
    async def run():
        entries = [entry(i, key=f"k{i % 4}") for i in range(16)]
        topic, sub, (a, b), (ca, cb) = setup(entries, KEY_SHARED, 2, permits=0)
        a.flow(2)
        b.flow(100)
        await settle(topic)
        sent_a = positions(ca)
        assert len(sent_a) == 2
        a.flow(100)
        await settle(topic)
        by_key: dict[str, list[int]] = {}
        owner: dict[str, set] = {}
        for conn, name in ((ca, "a"), (cb, "b")):
            for s in conn.sent:
                k = f"k{s[1][1] % 4}"
                by_key.setdefault(k, []).append(s[1][1])
                owner.setdefault(k, set()).add(name)
        assert sorted(p for v in by_key.values() for p in v) == list(range(16))
        assert all(len(o) == 1 for o in owner.values())
        # per key, the order of sending equals the order of positions
        for conn in (ca, cb):
            per_key: dict[int, list[int]] = {}
            for s in conn.sent:
                per_key.setdefault(s[1][1] % 4, []).append(s[1][1])
            assert all(v == sorted(v) for v in per_key.values())

    asyncio.run(run())


def test_seek_disconnects_consumers_and_restarts_at_the_position():
    async def run():
        topic, sub, (c,), (conn,) = setup([entry(i) for i in range(6)], EXCLUSIVE, permits=100)
        await settle(topic)
        sub.ack_cumulative(Position(1, 5))
        await settle(topic)
        await sub.seek(Position(1, 2))
        assert conn.closed_consumers == [0]
        again = Consumer(sub, conn, 0, "c0")
        sub.add_consumer(again, EXCLUSIVE)
        again.flow(100)
        await settle(topic)
        assert positions(conn)[6:] == [2, 3, 4, 5]

    asyncio.run(run())


def test_batch_index_acks_until_the_batch_is_complete():
    async def run():
        topic, sub, (c,), (conn,) = setup([entry(0)], SHARED, permits=10)
        await settle(topic)
        p = Position(1, 0)
        sub.ack_individual([(p, [0b1100])])  # messages 2 and 3 of the batch still unacked
        assert sub.ack_set_of(p) == [0b1100] and not sub.is_acknowledged(p)
        sub.ack_individual([(p, [0b0110])])
        assert sub.ack_set_of(p) == [0b0100]
        sub.redeliver(c, None)
        await settle(topic)
        assert conn.sent[-1][3] == [0b0100]  # the redelivered batch carries what is left
        sub.ack_individual([(p, [0])])
        assert sub.is_acknowledged(p)

    asyncio.run(run())


def test_key_shared_newcomer_waits_unless_it_allows_out_of_order():
    async def run():
        entries = [entry(i, key=f"k{i % 8}") for i in range(8)]
        topic, sub, (a,), (ca,) = setup(entries, KEY_SHARED, 1, permits=100)
        await settle(topic)
        assert len(ca.sent) == 8  # all pending on a
        waiting = Consumer(sub, FakeConnection(), 1, "waiting")
        sub.add_consumer(waiting, KEY_SHARED)
        eager = Consumer(sub, FakeConnection(), 2, "eager", allow_out_of_order=True)
        sub.add_consumer(eager, KEY_SHARED)
        assert waiting in sub.dispatcher.joined_at and eager not in sub.dispatcher.joined_at

    asyncio.run(run())


def test_delayed_messages_wait_on_shared_but_not_on_exclusive():
    async def run():
        now = [1_000_000]  # the dispatcher's clock (ms), moved by the test
        later = now[0] + 300
        entries = [entry(0, deliver_at=later), entry(1), entry(2)]
        topic, sub, (c,), (conn,) = setup(entries, SHARED, permits=0)
        sub.dispatcher.now_ms = lambda: now[0]
        c.flow(10)
        await settle(topic)
        assert positions(conn) == [1, 2]
        now[0] = later - 1
        sub.dispatcher.release_due()
        await settle(topic)
        assert positions(conn) == [1, 2]  # not yet
        now[0] = later
        sub.dispatcher.release_due()
        await settle(topic)
        assert positions(conn) == [1, 2, 0]
        topic2, sub2, (c2,), (conn2,) = setup(entries, EXCLUSIVE, permits=10)
        await settle(topic2)
        assert positions(conn2) == [0, 1, 2]

    asyncio.run(run())


def test_a_read_of_only_acknowledged_entries_does_not_stall_dispatch():
    async def run():
        topic, sub, (c,), (conn,) = setup([entry(i) for i in range(800)], EXCLUSIVE)
        sub.ack_individual([(Position(1, i), None) for i in range(600)])
        c.flow(1000)
        await settle(topic)
        assert positions(conn) == list(range(600, 800))

    asyncio.run(run())


class GatedSource(ListSource):
    """A source whose reads wait for ``gate``: a read in flight while consumers come and go.
    ``entered`` is set once a read waits."""

    def __init__(self, entries):
        super().__init__(entries)
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.reads = 0

    async def read(self, start, max_entries):
        self.reads += 1
        self.entered.set()
        await self.gate.wait()
        return await super().read(start, max_entries)


class ByConsumerSource(GatedSource):
    """As ``CompactedEntrySource.wanted()`` does: what a read returns depends on whether the
    active consumer (when the read starts) reads compacted."""

    def __init__(self, raw, compacted):
        super().__init__(raw)
        self.compacted = ListSource(compacted)
        self.sub = None

    async def read(self, start, max_entries):
        active = self.sub.dispatcher.active
        if active is not None and active.read_compacted:
            return await self.compacted.read(start, max_entries)
        return await super().read(start, max_entries)


def _compacted_view():
    # the "compacted view": entries 1 and 3 of the raw topic survive
    return [(Position(1, 1), entry(1)), (Position(1, 3), entry(3))]


def test_a_read_in_flight_for_a_plain_consumer_that_left_is_not_served_to_a_read_compacted_one():
    """The race of a read-compacted consumer joining an unconsumed subscription: the plain
    consumer's raw read is still in flight when it closes and the read-compacted consumer joins
    (switching the source); that read must be dropped, not delivered to the newcomer."""

    async def run():
        raw = GatedSource([entry(i) for i in range(5)])
        topic = FakeTopic(raw)
        sub = Subscription(topic, "s", FakeCursor(), durable=True, source=raw)
        plain = Consumer(sub, FakeConnection(), 0, "plain")
        sub.add_consumer(plain, EXCLUSIVE)
        plain.flow(100)
        await asyncio.wait_for(raw.entered.wait(), 5)  # the raw read is in flight
        sub.remove_consumer(plain)
        compacted = ListSource([])
        compacted.entries = _compacted_view()
        sub.source = compacted  # what compacted_source.attach does
        sub.dispatcher.set_source(compacted)
        conn = FakeConnection()
        newcomer = Consumer(sub, conn, 1, "rc", read_compacted=True)
        sub.add_consumer(newcomer, EXCLUSIVE)
        newcomer.flow(100)
        raw.gate.set()
        await settle(topic)
        assert positions(conn) == [1, 3]

    asyncio.run(run())


def test_a_read_in_flight_for_the_old_active_consumer_is_dropped_when_the_active_one_changes():
    """A subscription whose source chooses by consumer (read compacted or not): a read made for
    a plain consumer that left does not reach the read-compacted consumer that took over."""

    async def run():
        source = ByConsumerSource([entry(i) for i in range(5)], [])
        source.compacted.entries = _compacted_view()
        topic = FakeTopic(source)
        sub = Subscription(topic, "s", FakeCursor(), durable=True, source=source)
        source.sub = sub
        plain = Consumer(sub, FakeConnection(), 0, "plain")
        sub.add_consumer(plain, EXCLUSIVE)
        plain.flow(100)
        await asyncio.wait_for(source.entered.wait(), 5)
        sub.remove_consumer(plain)
        conn = FakeConnection()
        newcomer = Consumer(sub, conn, 1, "rc", read_compacted=True)
        sub.add_consumer(newcomer, EXCLUSIVE)
        newcomer.flow(100)
        source.gate.set()
        await settle(topic)
        assert positions(conn) == [1, 3]

    asyncio.run(run())


def batch_entry(i: int, n: int) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=i, publish_time=1000 + i, num_messages_in_batch=n)
    return entry_format.build_entry(md, b"%d" % i)


def test_exclusive_run_spends_permits_per_message_and_skips_acknowledged_entries():
    async def run():
        # entries 0..5 of 3 messages each; 0 and 1 acknowledged before the consumer comes
        topic, sub, (c,), (conn,) = setup([batch_entry(i, 3) for i in range(6)], EXCLUSIVE)
        sub.ack_individual([(Position(1, 0), None), (Position(1, 1), None)])
        c.flow(4)  # two batch entries: the second one opens with one permit left
        await settle(topic)
        assert positions(conn) == [2, 3]
        assert c.permits.available == -2 and c.messages_out == 6 and c.unacked_messages == 6
        assert sub.dispatcher.read_position == Position(1, 4)
        c.flow(100)
        await settle(topic)
        assert positions(conn) == [2, 3, 4, 5]
        assert c.bytes_out == sum(len(s[4]) for s in conn.sent)

    asyncio.run(run())


def test_bulk_acknowledgement_gives_messages_back_and_unblocks_once():
    from compactmq.broker.limits import PendingAcks

    woke = []
    pending = PendingAcks(per_consumer=4, on_unblock=lambda: woke.append(1))

    class C:
        unacked_messages = 0
        blocked_on_unacked = False

    a, b = C(), C()
    pending.add(Position(1, 0), a, 3)
    pending.add(Position(1, 1), a, 1)
    pending.add(Position(1, 2), b, 1)
    assert a.blocked_on_unacked and pending.total == 5
    pending.forget_many([Position(1, 0), Position(1, 1), Position(1, 9)])  # 1:9 was never sent
    assert a.unacked_messages == 0 and not a.blocked_on_unacked and woke == [1]
    assert pending.total == 1 and list(pending) == [Position(1, 2)] and not pending.counts
    pending.forget_many([Position(1, 2)])
    assert b.unacked_messages == 0 and pending.total == 0 and not pending


def test_individual_acks_of_an_ack_command_read_positions_and_ack_sets():
    from compactmq.broker.consumer_commands import _individual_acks

    cmd = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual)
    cmd.message_id.add(ledgerId=5, entryId=7)
    cmd.message_id.add(ledgerId=5, entryId=8, ack_set=[0b101, 0])
    cmd.message_id.add(ledgerId=2**64 - 1, entryId=2**64 - 1)  # -1:-1 on the wire
    cmd = pb.CommandAck.FromString(cmd.SerializeToString())
    acks = _individual_acks(cmd.message_id)
    assert acks == [(Position(5, 7), None), (Position(5, 8), [0b101, 0]), (Position(-1, -1), None)]
    assert all(type(p) is Position for p, _ in acks)


class StorageSource(ListSource):
    """A source whose reads count as storage reads (the dispatcher reads ahead of them)."""

    def __init__(self, entries):
        super().__init__(entries)
        self.reads: list[tuple[int, int]] = []

    async def read(self, start, max_entries):
        self.reads.append((start[1], max_entries))
        await asyncio.sleep(0)  # a storage read hops off the loop
        return await super().read(start, max_entries)

    def reads_storage(self, start):
        return True


def storage_setup(n, sub_type, permits):
    source = StorageSource([entry(i) for i in range(n)])
    topic = FakeTopic(source)
    sub = Subscription(topic, "s", FakeCursor(), durable=True, source=source)
    conn = FakeConnection()
    c = Consumer(sub, conn, 0, "c0")
    sub.add_consumer(c, sub_type)
    c.flow(permits)
    return source, topic, sub, c, conn


def test_exclusive_keeps_what_it_read_past_its_permits_and_reads_ahead_when_all_is_sent():
    async def run():
        source, topic, sub, c, conn = storage_setup(10, EXCLUSIVE, permits=3)
        await settle(topic)
        assert positions(conn) == [0, 1, 2]
        # a read for 3 permits, all sent: the next entries are read ahead, before any FLOW
        assert source.reads == [(0, 3), (3, 500)]
        c.flow(4)
        await settle(topic)
        assert positions(conn) == list(range(7))
        assert source.reads == [(0, 3), (3, 500)]  # served from the read-ahead, kept past permits
        c.flow(100)
        await settle(topic)
        assert positions(conn) == list(range(10))
        # the pass that finds the end reads as before; nothing is read ahead past the end
        assert source.reads == [(0, 3), (3, 500), (10, 97)]

    asyncio.run(run())


def test_a_rewind_or_acknowledgement_never_sends_read_ahead_entries_twice_or_out_of_order():
    async def run():
        source, topic, sub, c, conn = storage_setup(10, EXCLUSIVE, permits=3)
        await settle(topic)
        assert positions(conn) == [0, 1, 2]
        # entries 3 and 4 acknowledged (by another path) while they sit in the read-ahead
        sub.ack_cumulative(Position(1, 4))
        c.flow(2)
        await settle(topic)
        assert positions(conn) == [0, 1, 2, 5, 6]
        # a redelivery rewinds to the first unacknowledged entry: the kept entries are dropped
        sub.redeliver(c, None)
        c.flow(2)
        await settle(topic)
        assert positions(conn) == [0, 1, 2, 5, 6, 5, 6]
        c.flow(100)
        await settle(topic)
        assert positions(conn) == [0, 1, 2, 5, 6, 5, 6, 7, 8, 9]

    asyncio.run(run())


def test_shared_keeps_the_read_ahead_beyond_its_permits_out_of_the_replay_set():
    async def run():
        source, topic, sub, c, conn = storage_setup(10, SHARED, permits=2)
        await settle(topic)
        assert positions(conn) == [0, 1]
        c.flow(3)
        await settle(topic)
        assert positions(conn) == [0, 1, 2, 3, 4]
        assert not sub.dispatcher.replay  # entries read ahead wait in the read-ahead, not replay
        c.flow(100)
        await settle(topic)
        assert positions(conn) == list(range(10))

    asyncio.run(run())
