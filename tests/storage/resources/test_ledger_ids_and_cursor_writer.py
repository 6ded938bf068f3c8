"""Ledger ids increase across brokers; cursor positions are written at a bounded rate, fenced."""

from __future__ import annotations

import threading

import pytest

from compactmq.naming import TopicName
from compactmq.storage.metadata_store import NEW, BadVersion
from compactmq.storage.resources import CursorWriter, LedgerIdResources

T = TopicName.parse("persistent://public/default/orders")


def test_ledger_ids_are_unique_and_increasing_across_writers(resources, store):
    other = LedgerIdResources(store)  # a second broker on the same store
    got: list[list[int]] = [[], []]

    def allocate(ids, k):
        for _ in range(15):
            ids[k].append((resources.ledger_ids if k == 0 else other).allocate())

    threads = [threading.Thread(target=allocate, args=(got, k)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = got[0] + got[1]
    assert sorted(everything) == list(range(1, 31))  # unique, no block left unused
    assert got[0] == sorted(got[0]) and got[1] == sorted(got[1])  # each writer's ids increase
    resources.ledger_ids.ensure_above(100)
    assert resources.ledger_ids.allocate() == 101
    resources.ledger_ids.ensure_above(50)  # never moves the counter back
    assert other.allocate() == 102


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_cursor_writer_bounds_the_rate_and_flushes_on_close(resources):
    resources.managed_ledgers.create(T, {"ledgers": []})
    version = resources.managed_ledgers.put_cursor(T, "sub", {"markDelete": [1, 0]}, NEW)
    clock = Clock()
    writer = CursorWriter(resources.managed_ledgers, T, "sub", version, rate_per_s=2.0, clock=clock)
    assert writer.update({"markDelete": [1, 1]})  # the first write goes through
    for entry in range(2, 50):  # a burst of acks within the same half second
        assert not writer.update({"markDelete": [1, entry]})
    assert resources.managed_ledgers.get_cursor(T, "sub")[0] == {"markDelete": [1, 1]}
    assert writer.pending and not writer.flush_if_due()
    clock.now += 0.5
    assert writer.flush_if_due()  # the periodic task writes the newest once the rate allows
    assert resources.managed_ledgers.get_cursor(T, "sub")[0] == {"markDelete": [1, 49]}
    writer.update({"markDelete": [1, 50]})
    assert writer.flush() and not writer.pending  # close: written whatever the rate
    assert resources.managed_ledgers.get_cursor(T, "sub")[0] == {"markDelete": [1, 50]}
    assert writer.writes == 3


def test_cursor_writer_of_a_deposed_owner_is_fenced(resources):
    resources.managed_ledgers.create(T, {"ledgers": []})
    version = resources.managed_ledgers.put_cursor(T, "sub", {"markDelete": [1, 0]}, NEW)
    old_owner = CursorWriter(resources.managed_ledgers, T, "sub", version, rate_per_s=0)
    new_owner = CursorWriter(resources.managed_ledgers, T, "sub", version, rate_per_s=0)
    assert new_owner.update({"markDelete": [2, 0]})
    with pytest.raises(BadVersion):
        old_owner.update({"markDelete": [1, 5]})
    assert resources.managed_ledgers.get_cursor(T, "sub")[0] == {"markDelete": [2, 0]}
    assert old_owner.pending  # kept, never silently dropped
