"""The topic's pipelined commit (``topics``): SENDs arriving while a sync runs are written at
once, their receipts wait for a sync that started after they were written, receipts go out in
order, and a failed sync fails exactly what it did not make durable, the broker staying up.

In process, with real parts: a ``Storage`` with fsync on, the broker's ``BrokerService`` and
``TopicManager``; the disk is ``os.fdatasync`` wrapped so that a test can hold a sync in
flight (a gate) or fail one with EIO, as a disk error does.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from compactmq.errors import StorageError
from tests.harness.service import close_service, make_service

TOPIC = "persistent://public/default/pipelined-commit"


@pytest.fixture
def service(tmp_path):
    service, storage = make_service(tmp_path / "data")
    # these tests hold syncs in flight in a sync thread: no sync on the loop itself (the
    # inline path has its own tests, test_inline_sync)
    service.sync_threads.inline = False
    yield service
    close_service(service, storage)


class Disk:
    """``os.fdatasync`` with a gate per call number (the call waits until the test opens it)
    and calls that fail; counts the syncs that finished."""

    def __init__(self, monkeypatch) -> None:
        self._real = os.fdatasync
        self.gates: dict[int, threading.Event] = {}
        self.failing: set[int] = set()
        self.started = 0
        self.finished = 0
        self._lock = threading.Lock()
        monkeypatch.setattr(os, "fdatasync", self.fdatasync)

    def hold(self, call: int) -> threading.Event:
        self.gates[call] = threading.Event()
        return self.gates[call]

    def fdatasync(self, fd: int) -> None:
        with self._lock:
            self.started += 1
            call = self.started
        gate = self.gates.get(call)
        if gate is not None:
            assert gate.wait(20), f"sync {call} was never released"
        if call in self.failing:
            raise OSError(5, "Input/output error")
        self._real(fd)
        with self._lock:
            self.finished += 1


def _publish(topic, payload: bytes, answers: list) -> asyncio.Future:
    """Publish; the answer (position or error) lands in ``answers`` in the order given, with
    how many syncs had finished by then."""
    fut = asyncio.get_running_loop().create_future()

    def done(pos, err) -> None:
        answers.append((payload, pos, err, topic.disk.finished))
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(pos)

    topic.publish(payload, 1, done)
    return fut


async def _until(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def test_sends_during_a_sync_are_written_at_once_and_answered_in_order_after_their_sync(service, monkeypatch):
    async def scenario() -> None:
        topic = await service.topics.get_topic(TOPIC)
        topic.disk = disk = Disk(monkeypatch)
        first_sync = disk.hold(1)
        answers: list = []
        a = _publish(topic, b"a", answers)
        await _until(lambda: disk.started == 1, what="the first sync")
        # the first sync (covering a) is in flight: b and c are written now, not after it
        b = _publish(topic, b"b", answers)
        await asyncio.sleep(0.01)
        c = _publish(topic, b"c", answers)
        await _until(lambda: topic.ledger._ledgers.written_seq == 3, what="b and c written")
        await asyncio.sleep(0.05)
        assert answers == [] and topic.ledger.durable_seq == 0  # nothing durable, no receipt
        first_sync.set()
        positions = await asyncio.gather(a, b, c)
        assert positions == sorted(positions) and len(set(positions)) == 3
        assert [payload for payload, *_ in answers] == [b"a", b"b", b"c"]  # receipts in order
        syncs_done = {payload: finished for payload, _, _, finished in answers}
        assert syncs_done[b"a"] >= 1
        # b and c were written after the first sync started: a later sync covered them
        assert syncs_done[b"b"] >= 2 and syncs_done[b"c"] >= 2
        assert not topic.publishing
        for payload, pos in zip((b"a", b"b", b"c"), positions):
            assert await service.run_blocking(topic.ledger.read_entry, pos) == payload
        await service.topics.close_all()

    asyncio.run(scenario())


def test_a_failed_sync_fails_what_it_covered_and_keeps_earlier_receipts(service, monkeypatch):
    async def scenario() -> None:
        topics = service.topics
        first = await topics.get_topic(TOPIC)
        first.disk = disk = Disk(monkeypatch)
        first_sync = disk.hold(1)
        second_sync = disk.hold(2)
        disk.failing.add(2)
        answers: list = []
        a = _publish(first, b"a", answers)
        await _until(lambda: disk.started == 1, what="the first sync")
        b = _publish(first, b"b", answers)  # written during the first sync, covered by the second
        await _until(lambda: first.ledger._ledgers.written_seq == 2, what="b written")
        first_sync.set()
        good = await a
        await _until(lambda: disk.started == 2, what="the second sync")
        c = _publish(first, b"c", answers)  # written during the failing sync
        await _until(lambda: first.ledger._ledgers.written_seq == 3, what="c written")
        second_sync.set()
        with pytest.raises(StorageError):
            await b
        with pytest.raises(StorageError):
            await c  # the ledger is fenced: nothing after the failure is ever made durable
        assert [(payload, pos is not None) for payload, pos, _, _ in answers] == [
            (b"a", True),
            (b"b", False),
            (b"c", False),
        ]
        # the broker stays up: the topic is reloaded, the receipted entry is there, appends go on
        monkeypatch.undo()
        await _until(lambda: topics.loaded.get(TOPIC) is not first and first.closed, what="unload")
        second = await topics.get_topic(TOPIC)
        assert not second.ledger.fenced
        second.disk = Disk(monkeypatch)
        again = await _publish(second, b"again", [])
        assert again > good
        assert await service.run_blocking(second.ledger.read_entry, good) == b"a"
        await topics.close_all()

    asyncio.run(scenario())


def test_a_failed_write_is_answered_in_its_place(service, monkeypatch):
    """A batch whose write fails (not fenced: the write was undone) gets its error after the
    receipts of batches written before it, which are still waiting for their sync."""

    async def scenario() -> None:
        topic = await service.topics.get_topic(TOPIC)
        topic.disk = disk = Disk(monkeypatch)
        first_sync = disk.hold(1)
        answers: list = []
        a = _publish(topic, b"a", answers)
        await _until(lambda: disk.started == 1, what="the first sync")
        real_pwrite = os.pwrite
        monkeypatch.setattr(
            os, "pwrite", lambda fd, data, off: (_ for _ in ()).throw(OSError(28, "No space"))
        )
        b = _publish(topic, b"b", answers)
        await _until(lambda: not topic._queue, what="b taken")
        await asyncio.sleep(0.02)
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        assert answers == []  # b's error waits for a's receipt
        first_sync.set()
        await a
        with pytest.raises(StorageError):
            await b
        assert [(payload, pos is not None) for payload, pos, _, _ in answers] == [(b"a", True), (b"b", False)]
        assert not topic.ledger.fenced
        c = await _publish(topic, b"c", answers)
        assert c > (await a)
        await service.topics.close_all()

    asyncio.run(scenario())


def test_a_batch_the_loop_cannot_write_at_once_goes_to_the_pool_in_order(service, monkeypatch):
    """While another thread holds the ledger's lock the loop does not wait for it: the batch
    is written by a pool thread and later SENDs queue behind it, keeping arrival order."""

    async def scenario() -> None:
        topic = await service.topics.get_topic(TOPIC)
        topic.disk = Disk(monkeypatch)
        lock = topic.ledger._ledgers.lock
        held = threading.Event()
        release = threading.Event()

        def holder() -> None:
            with lock:
                held.set()
                release.wait(20)

        threading.Thread(target=holder, daemon=True).start()
        assert held.wait(10)
        answers: list = []
        futs = [_publish(topic, b"m%d" % i, answers) for i in range(3)]
        await asyncio.sleep(0)
        await asyncio.sleep(0.02)
        assert topic._writing  # in the pool, waiting for the lock
        futs += [_publish(topic, b"m%d" % i, answers) for i in range(3, 6)]
        await asyncio.sleep(0.02)
        assert len(topic._queue) == 3  # behind the pool write
        release.set()
        positions = await asyncio.gather(*futs)
        assert positions == sorted(positions)
        assert [payload for payload, *_ in answers] == [b"m%d" % i for i in range(6)]
        await service.topics.close_all()

    asyncio.run(scenario())


def test_publishing_looks_its_event_loop_up_once(service, monkeypatch):
    """``asyncio.get_running_loop()`` makes a getpid system call each time (its fork check);
    a topic asked it once a socket read (``_schedule_write``) and once a sync. It keeps its
    loop instead."""
    from compactmq.broker import topics as topics_mod

    real = asyncio.get_running_loop
    calls: list[int] = []

    class CountingAsyncio:
        def __getattr__(self, name):
            return getattr(asyncio, name)

        @staticmethod
        def get_running_loop():
            calls.append(1)
            return real()

    monkeypatch.setattr(topics_mod, "asyncio", CountingAsyncio())

    async def scenario() -> None:
        topic = await service.topics.get_topic(TOPIC)
        calls.clear()
        for i in range(20):  # each SEND in a loop turn of its own, each with its own sync
            fut = real().create_future()
            topic.publish(b"m%d" % i, 1, lambda pos, err, fut=fut: fut.set_result(pos))
            await fut
        assert len(calls) <= 1
        await service.topics.close_all()

    asyncio.run(scenario())
