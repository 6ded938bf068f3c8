"""The admin's per-topic traffic counters (``TrafficSampler``) follow the topics that exist: a
topic the inactive-topic sweep deletes leaves nothing behind in them, so a broker whose topics
come and go keeps no memory per topic it ever served. In-process broker (the standalone wiring)
with a one-second sweep, official client."""

from __future__ import annotations

import time

import pytest

from harness.broker import InProcessBroker, make_client
from harness.wait import wait_until

SWEEP = {
    "brokerDeleteInactiveTopicsFrequencySeconds": "1",
    "brokerDeleteInactiveTopicsMaxInactiveDurationSeconds": "1",
}


@pytest.fixture
def broker(tmp_path):
    b = InProcessBroker(tmp_path / "data", SWEEP)
    b.start()
    yield b
    b.stop()


def test_deleted_inactive_topics_leave_no_traffic_counters(broker):
    sampler = broker.server._web.sampler
    service = broker.server.service
    topics = [f"persistent://public/default/gone-{i}-{time.monotonic_ns()}" for i in range(5)]
    client = make_client(broker.url)
    try:
        for topic in topics:
            producer = client.create_producer(topic, batching_enabled=False)
            producer.send(b"x")
            sampler.refresh()  # what /metrics and the 2 s rate sampler do while it is loaded
            producer.close()
        assert set(topics) <= set(sampler.topics())
        wait_until(
            lambda: not set(topics) & set(service.topics.loaded),
            timeout=20,
            what="the sweep to delete the topics",
        )
        wait_until(lambda: service.inactive_topics.deleted >= len(topics), timeout=10, what="deletions")
    finally:
        client.close()
    assert not set(topics) & set(sampler.topics())
