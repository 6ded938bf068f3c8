"""What an inactive topic leaves in memory once the sweep has unloaded it: nothing of its own.

Topics kept by a subscription are unloaded (not deleted) by the inactive-topic sweep; after
that no ``Topic``, ``ManagedLedger``, ``Subscription`` or open-ledger index column
(``SpillingColumn``) of theirs may stay reachable, or a broker that serves a stream of new
topics grows round after round (the memory goal of issue 28). In-process broker (the
standalone wiring), a one-second sweep, the official client; objects counted with ``gc``."""

from __future__ import annotations

import gc
import time

import pulsar
import pytest

from compactmq.broker.subscriptions import Subscription
from compactmq.broker.topics import Topic
from compactmq.storage.managed_ledger import ManagedLedger
from compactmq.storage.tail_index import SpillingColumn
from harness.broker import InProcessBroker, make_client
from harness.wait import wait_until

SWEEP = {
    "brokerDeleteInactiveTopicsFrequencySeconds": "1",
    "brokerDeleteInactiveTopicsMaxInactiveDurationSeconds": "1",
}
TOPICS = 6


@pytest.fixture
def broker(tmp_path):
    b = InProcessBroker(tmp_path / "data", SWEEP)
    b.start()
    yield b
    b.stop()


def _live(kind: type) -> list:
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is kind]


def _named(kind: type, names: set[str]) -> list:
    def name(o) -> str:
        if isinstance(o, Subscription):
            return o.topic.name
        return o.name if isinstance(o, Topic) else o.topic

    return [o for o in _live(kind) if name(o) in names]


def test_unloaded_topics_leave_no_per_topic_objects(broker):
    service = broker.server.service
    columns_before = len(_live(SpillingColumn))
    names = {f"persistent://public/default/kept-{i}-{time.monotonic_ns()}" for i in range(TOPICS)}
    client = make_client(broker.url)
    try:
        for topic in sorted(names):
            consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
            producer = client.create_producer(topic, batching_enabled=False)
            for i in range(50):
                producer.send_async(f"m{i}".encode(), None)
            producer.flush()
            for _ in range(50):
                consumer.acknowledge(consumer.receive(10_000))
            producer.close()
            consumer.close()
        assert len(_named(Topic, names)) == TOPICS  # the count sees them while they are loaded
        assert len(_named(ManagedLedger, names)) == TOPICS
        wait_until(
            lambda: not names & set(service.topics.loaded),
            timeout=20,
            what="the sweep to unload the topics",
        )
    finally:
        client.close()
    # kept by their subscription, so unloaded, not deleted (the count moves once a topic's close
    # has ended, after the topic left ``loaded``)
    wait_until(lambda: service.inactive_topics.unloaded >= TOPICS, timeout=10, what="six topics unloaded")
    assert set(service.storage.topic_metadata.topics()) >= names
    wait_until(lambda: not _named(Topic, names), timeout=10, what="no Topic object left")
    assert not _named(ManagedLedger, names)
    assert not _named(Subscription, names)
    assert len(_live(SpillingColumn)) <= columns_before
