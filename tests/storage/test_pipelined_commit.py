"""The appender's pipelined commit: ``write_many`` writes without waiting, ``sync_written``
syncs (in a worker thread) until everything written is durable and reports each sync,
``try_write_many`` refuses rather than block. Real files; ``os.fdatasync`` wrapped to hold a
sync in flight or fail it."""

from __future__ import annotations

import os
import threading
import time

import pytest

from compactmq.errors import StorageError
from compactmq.storage import appender as appender_mod
from compactmq.storage import group_commit

TOPIC = "persistent://public/default/pipelined"


def _gated_sync(monkeypatch, fail: bool = False):
    """``os.fdatasync`` whose first call waits for the returned gate (and then fails, with
    ``fail``); later calls are real. Returns (started, gate)."""
    real = os.fdatasync
    started, gate = threading.Event(), threading.Event()
    calls = []

    def sync(fd):
        calls.append(fd)
        if len(calls) == 1:
            started.set()
            assert gate.wait(20)
            if fail:
                raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", sync)
    return started, gate


def test_written_entries_are_invisible_until_a_sync_covers_them(open_storage):
    st = open_storage(managedLedgerSyncData=True)
    ml = st.open_managed_ledger(TOPIC)
    lid, first, seq = ml.write_many([b"a", b"b"])
    assert (first, seq) == (0, 2)
    assert ml.durable_seq < seq and ml.last_position() is None  # written, not yet visible
    assert ml.sync_written() == 2
    assert [d for _, d in ml.read_entries(ml.first_position(), 10)] == [b"a", b"b"]
    assert ml.sync_written() == 2  # nothing left: returns at once


def test_writes_during_a_sync_are_covered_by_the_next_and_reported(open_storage, monkeypatch):
    st = open_storage(managedLedgerSyncData=True)
    ml = st.open_managed_ledger(TOPIC)
    started, gate = _gated_sync(monkeypatch)
    ml.write_many([b"a"])
    reported: list[int] = []
    result: list = []
    syncer = threading.Thread(target=lambda: result.append(ml.sync_written(reported.append)))
    syncer.start()
    assert started.wait(10)
    # the sync of a is in flight: the writer is not held up by it
    _, _, seq = ml.write_many([b"b", b"c"])
    assert seq == 3 and ml.durable_seq == 0
    gate.set()
    syncer.join(10)
    # a's sync left b and c behind: reported at once; the last sync's report is the result
    assert reported == [1]
    assert result == [3] and ml.durable_seq == 3


def test_a_failed_sync_fences_and_keeps_what_was_durable(open_storage, monkeypatch):
    st = open_storage(managedLedgerSyncData=True)
    ml = st.open_managed_ledger(TOPIC)
    ml.append(b"durable")
    started, gate = _gated_sync(monkeypatch, fail=True)
    ml.write_many([b"lost"])
    failed: list = []

    def sync() -> None:
        try:
            ml.sync_written()
        except StorageError as e:
            failed.append(e)

    syncer = threading.Thread(target=sync)
    syncer.start()
    assert started.wait(10)
    gate.set()
    syncer.join(10)
    assert failed and ml.fenced and ml.durable_seq == 1
    with pytest.raises(StorageError):
        ml.write_many([b"more"])
    with pytest.raises(StorageError):
        ml.sync_written()
    assert ml.try_write_many([b"more"], [None]) is None  # the blocking path says why


def test_try_write_refuses_rather_than_wait(open_storage, monkeypatch):
    st = open_storage(managedLedgerSyncData=True, managedLedgerMaxEntriesPerLedger=3)
    ml = st.open_managed_ledger(TOPIC)
    assert ml.try_write_many([b"a"], [None])[2] == 1
    # the ledger's lock held by another thread: no wait
    lock = ml._ledgers.lock
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    assert ml.try_write_many([b"b"], [None]) is None
    release.set()
    t.join()
    # more than INLINE_WRITE_MAX_BYTES: refused, nothing written
    monkeypatch.setattr(appender_mod, "INLINE_WRITE_MAX_BYTES", 100)
    assert ml.try_write_many([b"x" * 200], [None]) is None
    assert ml.try_write_many([b"b", b"c"], [5, 6])[2] == 3
    # full ledger: a rollover is due, which syncs and writes metadata -- not on the loop
    assert ml.try_write_many([b"d"], [None]) is None
    ml.sync_written()
    assert [d for _, d in ml.read_entries(ml.first_position(), 10)] == [b"a", b"b", b"c"]
    lid, first, _ = ml.write_many([b"d"])
    assert first == 0 and lid != ml.first_position().ledger_id  # rolled over in the blocking path


def test_try_write_leaves_writers_that_may_block_to_threads(open_storage):
    st = open_storage(managedLedgerSyncData=True)
    ml = st.open_managed_ledger(TOPIC)
    writer = ml._ledgers.current.writer
    assert writer.inline_writes  # a local file
    writer.inline_writes = False  # as an object-store writer says
    assert ml.try_write_many([b"a"], [None]) is None
    assert ml.write_many([b"a"])[2] == 1


def test_sync_off_makes_writes_durable_at_once(open_storage, monkeypatch):
    st = open_storage(managedLedgerSyncData=False)
    ml = st.open_managed_ledger(TOPIC)
    monkeypatch.setattr(os, "fdatasync", lambda fd: pytest.fail("no sync with managedLedgerSyncData=false"))
    _, _, seq = ml.try_write_many([b"a"], [None])
    assert ml.durable_seq == seq and ml.sync_written() == seq


def test_try_sync_written_syncs_here_unless_a_sync_runs(open_storage, monkeypatch):
    st = open_storage(managedLedgerSyncData=True)
    ml = st.open_managed_ledger(TOPIC)
    ml.write_many([b"a"])
    assert ml.try_sync_written() == 1 and ml.durable_seq == 1  # synced on this thread
    assert ml.try_sync_written() == 1  # nothing left: no sync
    started, gate = _gated_sync(monkeypatch)
    ml.write_many([b"b"])
    syncer = threading.Thread(target=ml.sync_written)
    syncer.start()
    assert started.wait(10)
    ml.write_many([b"c"])
    assert ml.try_sync_written() is None and ml.durable_seq == 1  # a sync runs: left to it
    gate.set()
    syncer.join(10)
    assert ml.durable_seq == 3


def test_a_failed_try_sync_written_fences(open_storage, monkeypatch):
    st = open_storage(managedLedgerSyncData=True)
    ml = st.open_managed_ledger(TOPIC)
    ml.write_many([b"a"])
    assert ml.try_sync_written() == 1

    def failing(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    ml.write_many([b"b"])
    with pytest.raises(StorageError):
        ml.try_sync_written()
    assert ml.fenced and ml.durable_seq == 1
    with pytest.raises(StorageError):
        ml.try_sync_written()


class _Clock:
    """A stand-in for the ``time`` module in the appender: ``monotonic()`` is what the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_busy_topic_spaces_its_syncs_and_a_quiet_one_does_not(open_storage, monkeypatch):
    """``group_commit.BUSY_SYNC_RATE``: once records arrive faster than that between syncs, a
    pipelined sync starts no sooner than ``managedLedgerGroupCommitMaxDelayMicros`` after the
    last one started (it waits that long for more to join it); once they slow down, a sync
    starts at once again, however close together the writes are."""
    st = open_storage(managedLedgerSyncData=True, managedLedgerGroupCommitMaxDelayMicros=1000)
    ml = st.open_managed_ledger(TOPIC)
    clock = _Clock()
    monkeypatch.setattr(group_commit, "time", clock)
    cond = ml._appender.sync_cond
    real_wait = cond.wait
    waits: list[float | None] = []

    def wait(timeout=None):
        waits.append(timeout)
        clock.now += timeout  # the wait runs its course on the test's clock
        return real_wait(0)

    monkeypatch.setattr(cond, "wait", wait)
    # 10 records every 0.4 ms: 25,000 a second
    for _ in range(20):
        clock.now += 0.0004
        _, _, seq = ml.write_many([b"x"] * 10)
        assert ml.sync_written() == seq and ml.durable_seq == seq
    assert len(waits) >= 12  # the moving average passes the rate within a few syncs ...
    assert waits == [pytest.approx(0.0006)] * len(waits)  # ... then each waits out its 1 ms
    # 1 record every 0.4 ms: 2,500 a second
    waits.clear()
    for i in range(20):
        clock.now += 0.0004
        _, _, seq = ml.write_many([b"y"])
        before = len(waits)
        assert ml.sync_written() == seq
        if i >= 12:  # the average has come down: no sync waits any more
            assert len(waits) == before
    assert ml.durable_seq == seq


def test_spaced_syncs_cover_more_records_each(open_storage, monkeypatch):
    """On a quick disk (a sync of ~0.1 ms here), a topic written to as fast as a thread can
    write is synced about once per ``managedLedgerGroupCommitMaxDelayMicros`` (1 ms) rather
    than back to back, and every record still ends up durable."""
    st = open_storage(managedLedgerSyncData=True, managedLedgerGroupCommitMaxDelayMicros=1000)
    ml = st.open_managed_ledger(TOPIC)
    syncs = []

    def quick_sync(fd):  # a quick disk: the sync releases the GIL as a real one does
        syncs.append(fd)
        time.sleep(0.0001)

    monkeypatch.setattr(os, "fdatasync", quick_sync)
    stop = threading.Event()
    result: list[int] = []

    def syncer():
        while not stop.is_set() or ml.durable_seq < ml._ledgers.written_seq:
            result.append(ml.sync_written())
            time.sleep(0)

    thread = threading.Thread(target=syncer)
    began = time.monotonic()
    thread.start()
    seq = 0
    for _ in range(3000):
        _, _, seq = ml.write_many([b"z"] * 5)
        time.sleep(0)
    stop.set()
    thread.join(30)
    elapsed = time.monotonic() - began
    assert ml.durable_seq == seq == 15000
    # back to back, a 0.1 ms sync would run some 10 times a millisecond
    assert len(syncs) <= elapsed / 0.001 + 5, (len(syncs), elapsed)
