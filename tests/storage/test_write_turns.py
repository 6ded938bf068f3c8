"""Pipelined appends (``WriteTurns``): calls write in the order their turns were taken, even
when their threads reach the ledger in another order, and each returns only once durable."""

import threading
import time

from compactmq.storage.appender import WriteTurns


def _run(target, *args) -> threading.Thread:
    t = threading.Thread(target=target, args=args)
    t.start()
    return t


def test_later_turn_waits_for_the_earlier_write(open_storage):
    ml = open_storage(managedLedgerMaxEntriesPerLedger=5).open_managed_ledger("t")
    turns = WriteTurns()
    taken = [turns.take() for _ in range(4)]
    results: dict[int, list] = {}

    def append(i: int) -> None:
        results[i] = ml.append_many([b"%d-%d" % (i, k) for k in range(3)], None, taken[i])

    # threads start in reverse order of their turns, the earliest last and late
    threads = [_run(append, i) for i in (3, 2, 1)]
    time.sleep(0.2)
    assert results == {}  # nobody wrote before turn 0
    threads.append(_run(append, 0))
    for t in threads:
        t.join(10)
    order = [p for i in range(4) for p in results[i]]
    assert order == sorted(order) and len(set(order)) == 12  # across rollovers (5 per ledger)
    read = [d for _, d in ml.read_entries(order[0], 100)]
    assert read == [b"%d-%d" % (i, k) for i in range(4) for k in range(3)]
    assert ml.last_position() == order[-1]  # durable: visible to readers


def test_a_failed_call_frees_the_next_turn(open_storage):
    ml = open_storage().open_managed_ledger("t")
    turns = WriteTurns()
    first, second = turns.take(), turns.take()
    errors: list = []

    def bad_call() -> None:
        try:
            ml.append_many([b"a"], [1, 2], first)  # two publish times for one entry
        except ValueError as e:
            errors.append(e)

    _run(bad_call).join(10)
    assert len(errors) == 1
    assert [p.entry_id for p in ml.append_many([b"b"], None, second)] == [0]


def test_abandon_frees_turns_that_never_run(open_storage):
    ml = open_storage().open_managed_ledger("t")
    turns = WriteTurns()
    turns.take()  # a call cancelled before it started: never waits, never done
    later = turns.take()
    out: list = []
    t = _run(lambda: out.extend(ml.append_many([b"x"], None, later)))
    t.join(0.3)
    assert t.is_alive() and not out
    turns.abandon()
    t.join(10)
    assert [p.entry_id for p in out] == [0]
