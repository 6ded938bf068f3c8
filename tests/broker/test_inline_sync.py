"""A topic's sync on the event loop itself (``Topic._sync``, ``Appender.try_sync_written``,
``SyncThreads.claim_inline``): a lone small write is synced on the loop and answered only
after that sync; more records, a second topic in the same loop turn, or a busy sync thread
send the sync to a thread; a failed inline sync fails the SEND and fences the ledger, and the
broker goes on (the topic is reloaded, the receipted entries stay).

In process, with real parts: a ``Storage`` with fsync on and the broker's ``BrokerService``;
``os.fdatasync`` is wrapped to record which thread ran each sync, or to fail one with EIO.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from compactmq.broker.sync_threads import SyncThreads
from compactmq.broker.topics import INLINE_SYNC_MAX_RECORDS
from compactmq.errors import StorageError
from tests.harness.service import close_service, make_service

TOPIC = "persistent://public/default/inline-sync"


@pytest.fixture
def service(tmp_path, monkeypatch):
    from compactmq.broker import sync_threads

    # a loaded test machine has slow fdatasyncs: they must not pause the inline path here
    # (the pause has its own test below)
    monkeypatch.setattr(sync_threads, "INLINE_SYNC_SLOW_S", 3600.0)
    service, storage = make_service(tmp_path / "data")
    yield service
    close_service(service, storage)


class Disk:
    """``os.fdatasync`` that records the thread of each call, and fails the calls listed."""

    def __init__(self, monkeypatch) -> None:
        self._real = os.fdatasync
        self.threads: list[threading.Thread] = []
        self.failing: set[int] = set()
        monkeypatch.setattr(os, "fdatasync", self.fdatasync)

    def fdatasync(self, fd: int) -> None:
        self.threads.append(threading.current_thread())
        if len(self.threads) in self.failing:
            raise OSError(5, "Input/output error")
        self._real(fd)


def _answer(answers: list, disk: Disk):
    """A publish callback: the answer, with how many syncs had run by then, in ``answers``."""
    fut = asyncio.get_running_loop().create_future()

    def done(pos, err) -> None:
        answers.append((pos, err, len(disk.threads)))
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(pos)

    return fut, done


def test_a_lone_send_is_synced_on_the_loop_and_answered_after_the_sync(service, monkeypatch):
    async def scenario() -> None:
        topic = await service.topics.get_topic(TOPIC)
        disk = Disk(monkeypatch)
        loop_thread = threading.current_thread()
        answers: list = []
        for i in range(3):  # one after the other: each its own write and sync
            fut, done = _answer(answers, disk)
            topic.publish(b"m%d" % i, 1, done)
            await fut
        assert disk.threads == [loop_thread] * 3  # no thread hop
        assert [syncs for _, _, syncs in answers] == [1, 2, 3]  # each answered after its sync
        assert not topic.publishing and not topic._syncing
        for i, (pos, _, _) in enumerate(answers):
            assert await service.run_blocking(topic.ledger.read_entry, pos) == b"m%d" % i
        await service.topics.close_all()

    asyncio.run(scenario())


def test_more_records_or_a_second_topic_in_the_same_turn_sync_in_a_thread(service, monkeypatch):
    async def scenario() -> None:
        first = await service.topics.get_topic(TOPIC)
        second = await service.topics.get_topic(TOPIC + "-2")
        disk = Disk(monkeypatch)
        loop_thread = threading.current_thread()
        answers: list = []
        # a run of more records than an inline sync takes: a sync thread syncs it
        fut, done = _answer(answers, disk)
        n = INLINE_SYNC_MAX_RECORDS + 1
        first.publish_run([b"r%d" % i for i in range(n)], [1] * n, done)
        await fut
        assert len(disk.threads) == 1 and disk.threads[0] is not loop_thread
        threads = service.sync_threads
        await _until(lambda: threads._finished_seen == threads._submitted)  # its job is done
        # two topics written in one loop turn: the first syncs on the loop, the second in a thread
        del disk.threads[:]
        fut1, done1 = _answer(answers, disk)
        fut2, done2 = _answer(answers, disk)
        first.publish(b"a", 1, done1)
        second.publish(b"b", 1, done2)
        await asyncio.gather(fut1, fut2)
        assert sorted(t is loop_thread for t in disk.threads) == [False, True]
        await service.topics.close_all()

    asyncio.run(scenario())


def test_a_failed_inline_sync_fails_the_send_and_the_topic_is_reloaded(service, monkeypatch):
    async def scenario() -> None:
        topics = service.topics
        first = await topics.get_topic(TOPIC)
        disk = Disk(monkeypatch)
        disk.failing.add(2)
        answers: list = []
        fut, done = _answer(answers, disk)
        first.publish(b"good", 1, done)
        good = await fut
        fut, done = _answer(answers, disk)
        first.publish(b"lost", 1, done)
        with pytest.raises(StorageError):
            await fut
        assert disk.threads == [threading.current_thread()] * 2  # both synced on the loop
        assert first.ledger.fenced  # nothing written after the failure will be called durable
        monkeypatch.setattr(os, "fdatasync", disk._real)  # the disk is well again
        await _until(lambda: topics.loaded.get(TOPIC) is not first and first.closed)
        second = await topics.get_topic(TOPIC)
        fut, done = _answer([], disk)
        second.publish(b"again", 1, done)
        assert await fut > good
        assert await service.run_blocking(second.ledger.read_entry, good) == b"good"
        await topics.close_all()

    asyncio.run(scenario())


def test_claim_inline_once_a_turn_and_never_while_a_sync_thread_is_busy():
    pool = SyncThreads(2)
    gate = threading.Event()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        assert pool.claim_inline(loop)
        assert not pool.claim_inline(loop)  # once a loop turn
        await asyncio.sleep(0)
        assert pool.claim_inline(loop)
        await asyncio.sleep(0)
        pool.submit(lambda _: gate.wait(20), None)
        assert not pool.claim_inline(loop)  # a sync thread is busy: the broker is
        gate.set()
        await _until(lambda: pool.claim_inline(loop))
        await asyncio.sleep(0)
        pool.inline = False
        assert not pool.claim_inline(loop)

    try:
        asyncio.run(scenario())
    finally:
        gate.set()
        pool.shutdown(10)


async def _until(predicate, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_slow_inline_syncs_pause_inline_syncs_a_lone_slow_one_does_not(monkeypatch):
    from compactmq.broker import sync_threads

    pool = SyncThreads(1)
    slow = sync_threads.INLINE_SYNC_SLOW_S

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(20):
            pool.inline_took(slow / 4)  # quick: inline syncs go on
        pool.inline_took(slow * 4)  # one slow sync among quick ones: they still go on
        assert pool.claim_inline(loop)
        await asyncio.sleep(0)
        for _ in range(20):  # the disk stays slow: paused
            pool.inline_took(slow * 2)
        assert not pool.claim_inline(loop)
        monkeypatch.setattr(sync_threads, "INLINE_SYNC_PAUSE_S", 0.0)
        for _ in range(20):
            pool.inline_took(slow * 2)
        await asyncio.sleep(0.01)
        assert pool.claim_inline(loop)  # the pause is over

    try:
        asyncio.run(scenario())
    finally:
        pool.shutdown(10)


def test_publishing_asks_asyncio_for_the_loop_once_per_topic(service, monkeypatch):
    """``asyncio.get_running_loop`` makes a getpid system call each time; the publish path
    (``_schedule_write``, ``_sync``, ``_start_sync``) asked up to 3 times a message. The topic
    keeps the loop once it has it (``Topic._bind_loop``)."""
    import types

    from compactmq.broker import topics

    calls = []

    def counting():
        calls.append(1)
        return asyncio.get_running_loop()

    proxy = types.SimpleNamespace(**{k: getattr(asyncio, k) for k in dir(asyncio) if not k.startswith("__")})
    proxy.get_running_loop = counting

    async def scenario() -> None:
        topic = await service.topics.get_topic(TOPIC)
        monkeypatch.setattr(topics, "asyncio", proxy)
        disk = Disk(monkeypatch)
        answers: list = []
        for i in range(5):
            fut, done = _answer(answers, disk)
            topic.publish(b"m%d" % i, 1, done)
            await fut
        assert len(answers) == 5
        assert len(calls) <= 1

    asyncio.run(scenario())
