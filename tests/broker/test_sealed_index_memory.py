"""A loaded topic does not keep the indexes of sealed ledgers its readers have passed.

Reading a sealed ledger loaded its whole index (16 bytes an entry); the 10-minute soak of issue
28 gained ~67 MiB at its first rollover that way (10 topics of ~450 k entries) and kept it
while the topics stayed loaded. A read now keeps a few pieces of it (``storage.sealed_index``,
tested in tests/storage/test_sealed_index.py), and the inactive-topic sweep drops, in the
topics it keeps, every sealed index no read used since the previous sweep. In-process broker, a one-second
sweep, ledgers of 20 entries, the official client; the topic stays active (its producer stays)."""

from __future__ import annotations

import pulsar
import pytest

from harness.broker import InProcessBroker, make_client
from harness.wait import wait_until

SETTINGS = {
    "brokerDeleteInactiveTopicsFrequencySeconds": "1",
    "brokerDeleteInactiveTopicsMaxInactiveDurationSeconds": "1",
    "managedLedgerMaxEntriesPerLedger": "20",
    "managedLedgerMinLedgerRolloverTimeMinutes": "0",
}


@pytest.fixture
def broker(tmp_path):
    b = InProcessBroker(tmp_path / "data", SETTINGS)
    b.start()
    yield b
    b.stop()


def _loaded_sealed_indexes(ml) -> int:
    state = ml._ledgers
    with state.lock:
        return sum(1 for led in state.by_id.values() if led is not state.current and led.offsets is not None)


def test_the_sweep_drops_sealed_indexes_nobody_reads(broker):
    service = broker.server.service
    topic = "persistent://public/default/sealed-index-memory"
    client = make_client(broker.url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(100):
            producer.send(b"m%d" % i)
        ml = service.topics.loaded[topic].ledger
        assert len(ml.ledgers()) >= 5  # rolled over: sealed ledgers behind the open one
        consumer = client.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Earliest)
        got = []
        for _ in range(100):
            msg = consumer.receive(10_000)
            got.append(msg.data())
            consumer.acknowledge(msg)
        assert got == [b"m%d" % i for i in range(100)]  # read from the sealed ledgers
        assert _loaded_sealed_indexes(ml) >= 1  # their indexes were loaded for it
        wait_until(lambda: _loaded_sealed_indexes(ml) == 0, timeout=20, what="the sweep to drop them")
        assert topic in service.topics.loaded  # the topic itself stays (its producer is there)
        producer.send(b"after")
        assert consumer.receive(10_000).data() == b"after"
    finally:
        client.close()
