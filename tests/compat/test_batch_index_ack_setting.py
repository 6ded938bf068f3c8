"""``acknowledgmentAtBatchIndexLevelEnabled``: compactmq keeps batch-index acknowledgements
(PIP-54) unless it is false, Pulsar's default, when acknowledgements of single messages of a batch
are ignored until the whole batch is acknowledged -- redelivery then sends the whole batch."""

from __future__ import annotations

import pytest
from broker.conftest import BrokerProcess, make_client, wait_unacked  # tests/ is on sys.path

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("enabled", ["true", "false"])
def test_redelivery_skips_acknowledged_messages_only_when_enabled(tmp_path, enabled):
    broker = BrokerProcess(tmp_path / "data", {"acknowledgmentAtBatchIndexLevelEnabled": enabled})
    broker.start()
    client = make_client(broker.url)
    try:
        topic = "persistent://public/default/batch-index-setting"
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=100, batching_max_publish_delay_ms=10000
        )
        consumer = client.subscribe(
            topic, "s", consumer_type=pulsar.ConsumerType.Shared, batch_index_ack_enabled=True
        )
        for i in range(5):
            producer.send_async(b"hello-%d" % i, callback=None)
        producer.flush()
        first = [consumer.receive(10_000) for _ in range(5)]
        for msg in first[:2]:
            consumer.acknowledge(msg)
        wait_unacked(broker, topic, "s", 3 if enabled == "true" else 5)
        consumer.redeliver_unacknowledged_messages()
        again = []
        while True:
            try:
                again.append(consumer.receive(1500).data())
            except pulsar.Timeout:
                break
        expected = range(2, 5) if enabled == "true" else range(5)
        assert sorted(again) == [b"hello-%d" % i for i in expected]
    finally:
        client.close()
        broker.stop()
