"""A topic whose write failed leaves the broker by itself (``topic_ownership``): its managed ledger
refuses appends after a failed sync, so the topic is unloaded once, and the next lookup loads it
again from disk with nothing lost and appends accepted.

In process, with real parts: a ``Storage`` in a temporary directory with fsync on, the broker's
``BrokerService`` and ``TopicManager``; the failed sync is ``os.fdatasync`` raising EIO, as a
disk error does.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from compactmq.errors import StorageError
from tests.harness.service import close_service, make_service

TOPIC = "persistent://public/default/ownership-failed-write"


@pytest.fixture
def service(tmp_path):
    service, storage = make_service(tmp_path / "data")
    yield service
    close_service(service, storage)


def _publish(topic, payload: bytes) -> asyncio.Future:
    fut = asyncio.get_running_loop().create_future()

    def done(pos, err) -> None:
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(pos)

    topic.publish(payload, 1, done)
    return fut


async def _wait(predicate, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "topic was not unloaded"
        await asyncio.sleep(0.02)


def test_a_failed_write_unloads_the_topic_and_the_next_load_recovers(service, monkeypatch):
    async def scenario() -> None:
        topics = service.topics
        first = await topics.get_topic(TOPIC)
        good = await _publish(first, b"good")

        def broken(fd):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", broken)
        with pytest.raises(StorageError):
            await _publish(first, b"unsure")
        monkeypatch.undo()
        assert first.ledger.fenced
        await _wait(lambda: topics.loaded.get(TOPIC) is not first and first.closed)
        assert first.unload_requested
        topics.unload_after_failed_write(first)  # asked again: nothing more happens
        second = await topics.get_topic(TOPIC)
        assert second is not first and not second.ledger.fenced
        again = await _publish(second, b"again")
        assert again > good
        read = await service.run_blocking(second.ledger.read_entry, good)
        assert read == b"good"
        await topics.close_all()

    asyncio.run(scenario())


def test_a_topic_whose_ledger_still_takes_appends_stays(service):
    async def scenario() -> None:
        topics = service.topics
        topic = await topics.get_topic(TOPIC)
        await _publish(topic, b"one")
        topics.unload_after_failed_write(topic)  # a failure that did not fence the ledger
        await asyncio.sleep(0.1)
        assert topics.loaded.get(TOPIC) is topic and not topic.closed and not topic.unload_requested
        await topics.close_all()

    asyncio.run(scenario())
