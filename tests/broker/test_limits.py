"""Pulsar's limits seen by the official client: maxUnackedMessagesPerConsumer and
maxUnackedMessagesPerSubscription stop dispatch until acknowledgements bring the count down to
half, maxProducersPerTopic and maxConsumersPerSubscription refuse with ProducerBusy /
ConsumerBusy."""

from __future__ import annotations

import time

import pytest

pulsar = pytest.importorskip("pulsar")

from .conftest import BrokerProcess, make_client  # noqa: E402
from .rest import ok, rest  # noqa: E402

pytestmark = pytest.mark.integration
Shared = pulsar.ConsumerType.Shared


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(
        tmp_path_factory.mktemp("limits") / "data",
        overrides={
            "maxUnackedMessagesPerConsumer": "10",
            "maxUnackedMessagesPerSubscription": "16",
            "maxProducersPerTopic": "2",
            "maxConsumersPerSubscription": "2",
        },
    )
    b.start()
    yield b
    b.stop()


@pytest.fixture
def client(broker):
    c = make_client(broker.url, operation_timeout_seconds=5)
    yield c
    c.close()


def publish(client, topic, n):
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(n):
        producer.send(b"%d" % i)
    producer.close()


def drain(consumers, quiet=1.0):
    """Everything the consumers receive until none gets anything for ``quiet`` seconds."""
    got = {id(c): [] for c in consumers}
    last = time.monotonic()
    while time.monotonic() - last < quiet:
        for c in consumers:
            try:
                got[id(c)].append(c.receive(100))
                last = time.monotonic()
            except pulsar.Timeout:
                pass
    return [got[id(c)] for c in consumers]


def sub_stats(broker, topic):
    return ok(rest(broker, "GET", f"/admin/v2/persistent/{topic.split('://', 1)[1]}/stats"))["subscriptions"][
        "s"
    ]


def test_consumer_stops_at_its_unacked_limit_until_acks_arrive(broker, client, topic):
    consumer = client.subscribe(topic, "s", consumer_type=Shared)
    publish(client, topic, 30)
    (first,) = drain([consumer])
    assert len(first) == 10  # the receive queue has room for 1000: the broker stopped at 10
    stats = sub_stats(broker, topic)
    assert stats["consumers"][0]["unackedMessages"] == 10
    assert stats["consumers"][0]["blockedConsumerOnUnackedMsgs"] is True
    for msg in first[:4]:
        consumer.acknowledge(msg)
    assert drain([consumer]) == [[]]  # 6 unacknowledged: still above half the limit
    consumer.acknowledge(first[4])
    (second,) = drain([consumer])
    assert len(second) == 5  # 5 left: unblocked, and stopped again at 10
    for msg in first[5:] + second:
        consumer.acknowledge(msg)
    (rest,) = drain([consumer])
    assert len(rest) == 10
    assert sorted(int(m.data()) for m in first + second + rest) == list(range(25))


def test_subscription_stops_at_its_unacked_limit(broker, client, topic):
    a = client.subscribe(topic, "s", consumer_type=Shared, consumer_name="a")
    b = client.subscribe(topic, "s", consumer_type=Shared, consumer_name="b")
    publish(client, topic, 40)
    got_a, got_b = drain([a, b])
    assert len(got_a) + len(got_b) == 16  # the subscription's limit, though each may hold 10
    assert len(got_a) < 10 and len(got_b) < 10
    stats = sub_stats(broker, topic)
    assert stats["unackedMessages"] == 16 and stats["blockedSubscriptionOnUnackedMsgs"] is True
    held = [(a, m) for m in got_a] + [(b, m) for m in got_b]
    for consumer, msg in held[:8]:  # 8 left: not below half yet
        consumer.acknowledge(msg)
    assert drain([a, b]) == [[], []]
    consumer, msg = held[8]
    consumer.acknowledge(msg)  # 7 < 8: dispatch resumes up to 16 again
    more_a, more_b = drain([a, b])
    assert len(more_a) + len(more_b) == 9


def test_max_producers_per_topic(client, topic):
    p1 = client.create_producer(topic)
    client.create_producer(topic)
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)
    p1.close()
    client.create_producer(topic).send(b"ok")


def test_max_consumers_per_subscription(client, topic):
    c1 = client.subscribe(topic, "s", consumer_type=Shared)
    client.subscribe(topic, "s", consumer_type=Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "s", consumer_type=Shared)
    client.subscribe(topic, "other", consumer_type=Shared)  # the limit is per subscription
    c1.close()
    client.subscribe(topic, "s", consumer_type=Shared)


def test_pending_acks_give_their_table_back_once_empty():
    """A subscription that had thousands of entries pending and caught up holds no big table."""
    import sys

    from compactmq.broker.limits import PendingAcks

    class Consumer:
        unacked_messages = 0
        blocked_on_unacked = False

    pending, consumer = PendingAcks(), Consumer()
    empty = sys.getsizeof(pending)
    for i in range(5000):
        pending.add(i, consumer, 3 if i % 2 else 1)
    assert pending.total == 10000 and consumer.unacked_messages == 10000
    for i in range(4999):
        pending.pop(i)
    assert sys.getsizeof(pending) > 10 * empty  # still one pending: the table stays
    del pending[4999]
    assert len(pending) == 0 and pending.total == 0 and consumer.unacked_messages == 0
    assert sys.getsizeof(pending) <= empty and not pending.counts


def test_unset_unacked_limits_read_pulsars_defaults_not_unlimited():
    """A settings mapping without the keys reads the declared defaults (Pulsar's 50,000 per
    consumer and 200,000 per subscription); the call site once read 0 (no limit) instead."""
    from compactmq.broker.limits import unacked_limits
    from compactmq.config import load_config

    assert unacked_limits({}) == (50_000, 200_000)
    assert unacked_limits(load_config()) == (50_000, 200_000)
    off = {"maxUnackedMessagesPerConsumer": 0, "maxUnackedMessagesPerSubscription": "0"}
    assert unacked_limits(off) == (0, 0)
    assert unacked_limits({"maxUnackedMessagesPerConsumer": "7"}) == (7, 200_000)
