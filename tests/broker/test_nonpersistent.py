"""Non-persistent topics with the official client: delivered only to the consumers connected at
the time, never stored, dropped (and counted as msgDropRate) when a consumer's queue is full;
compaction refused; regex subscriptions honouring RegexSubscriptionMode and picking up a topic
created after they subscribed."""

from __future__ import annotations

import re
import time

import pytest

pulsar = pytest.importorskip("pulsar")

from harness.broker import drain_acked  # noqa: E402

from .conftest import make_client  # noqa: E402
from .rest import cli, ok, rest, wait_until  # noqa: E402

pytestmark = pytest.mark.integration
Earliest = pulsar.InitialPosition.Earliest
Mode = pulsar.RegexSubscriptionMode


def unique(name: str) -> str:
    return f"{name}-{time.monotonic_ns()}"


def test_only_connected_consumers_get_messages_and_nothing_is_stored(broker):
    name = unique("np")
    topic = f"non-persistent://public/default/{name}"
    client = make_client(broker.url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"before anyone listened")  # acknowledged, delivered to no one
        consumer = client.subscribe(topic, "live", initial_position=Earliest)
        for i in range(5):
            producer.send(f"m{i}".encode())
        assert drain_acked(consumer, 2000) == [f"m{i}".encode() for i in range(5)]
        listed = ok(rest(broker, "GET", "/admin/v2/non-persistent/public/default"))
        assert topic in listed
        assert not [t for t in ok(rest(broker, "GET", "/admin/v2/persistent/public/default")) if name in t]
        stats = ok(rest(broker, "GET", f"/admin/v2/non-persistent/public/default/{name}/stats"))
        assert stats["msgInCounter"] == 6 and stats["subscriptions"]["live"]["msgOutCounter"] == 5
        assert stats["storageSize"] == 0 and stats["msgDropRate"] == 0

        consumer.close()
        late = client.subscribe(topic, "late", initial_position=Earliest)
        producer.send(b"after")
        assert drain_acked(late, 2000) == [b"after"]  # nothing older was kept for it
        late.close()
        producer.close()
        # unused now: no longer listed, and nothing of it is on the persistent side either
        wait_until(
            lambda: topic not in ok(rest(broker, "GET", "/admin/v2/non-persistent/public/default")),
            what="the idle non-persistent topic to go",
        )
        assert rest(broker, "GET", f"/admin/v2/non-persistent/public/default/{name}/stats")[0] == 404
    finally:
        client.close()


def test_full_receiver_queue_drops_and_counts(broker):
    name = unique("drop")
    topic = f"non-persistent://public/default/{name}"
    client = make_client(broker.url)
    try:
        consumer = client.subscribe(topic, "slow", receiver_queue_size=5)
        producer = client.create_producer(topic, batching_enabled=False)
        sent = 200
        for i in range(sent):
            producer.send(f"m{i}".encode())  # the consumer's application reads nothing meanwhile
        stats = ok(rest(broker, "GET", f"/admin/v2/non-persistent/public/default/{name}/stats"))
        sub = stats["subscriptions"]["slow"]
        assert stats["msgDropRate"] > 0 and sub["msgDropRate"] > 0 and sub["consumers"][0]["msgDropRate"] > 0
        got = drain_acked(consumer, 1000)
        assert 5 <= len(got) < sent
        assert got[:5] == [f"m{i}".encode() for i in range(5)]  # what it had room for, in order
    finally:
        client.close()


def test_compaction_of_a_non_persistent_topic_is_refused(broker):
    status, body = rest(broker, "PUT", "/admin/v2/non-persistent/public/default/anything/compaction")
    assert status == 405 and "applies only to persistent topics" in body["reason"]
    r = cli(broker, "topics", "compact", "non-persistent://public/default/anything")
    assert r.returncode == 1 and "applies only to persistent topics" in r.stderr


def _received_topics(consumer, timeout_ms: int = 500) -> set[str]:
    return set(drain_acked(consumer, timeout_ms, lambda msg: msg.topic_name()))


def test_regex_subscription_modes_and_a_topic_created_later(broker):
    ns = unique("rx")
    ok(rest(broker, "PUT", f"/admin/v2/namespaces/public/{ns}"))
    durable = f"persistent://public/{ns}/orders-a"
    volatile = f"non-persistent://public/{ns}/orders-b"
    client = make_client(broker.url)
    try:
        client.create_producer(durable).close()  # the persistent topic exists
        vp = client.create_producer(volatile, batching_enabled=False)  # in use while it has this producer
        pattern = re.compile(f"persistent://public/{ns}/orders-.*")
        consumers = {
            mode: client.subscribe(
                pattern,
                f"sub-{mode}",
                regex_subscription_mode=mode,
                initial_position=Earliest,
                pattern_auto_discovery_period=1,
            )
            for mode in (Mode.PersistentOnly, Mode.NonPersistentOnly, Mode.AllTopics)
        }
        dp = client.create_producer(durable, batching_enabled=False)
        dp.send(b"d")
        vp.send(b"v")
        expected = {
            Mode.PersistentOnly: {durable},
            Mode.NonPersistentOnly: {volatile},
            Mode.AllTopics: {durable, volatile},
        }
        for mode, consumer in consumers.items():
            assert _received_topics(consumer, 2000) == expected[mode], mode

    finally:
        client.close()


# The Python client's pattern_auto_discovery_period argument never reaches the C++ client
# (pulsar-client 3.x drops it), so a regex consumer polls GET_TOPICS_OF_NAMESPACE every 60 s.
DISCOVERY_PERIOD_SECONDS = 60


@pytest.mark.slow
def test_regex_consumer_sees_a_topic_created_after_it_subscribed(broker):
    ns = unique("rxl")
    ok(rest(broker, "PUT", f"/admin/v2/namespaces/public/{ns}"))
    client = make_client(broker.url)
    try:
        client.create_producer(f"persistent://public/{ns}/events-first").close()
        consumer = client.subscribe(
            re.compile(f"persistent://public/{ns}/events-.*"), "s", initial_position=Earliest
        )
        later = f"persistent://public/{ns}/events-later"
        client.create_producer(later, batching_enabled=False).send(b"later")
        volatile = client.create_producer(f"non-persistent://public/{ns}/events-volatile")
        volatile.send(b"not for a PersistentOnly consumer")
        seen: set[str] = set()

        def picked_up() -> bool:
            seen.update(_received_topics(consumer, 500))
            return later in seen

        wait_until(
            picked_up,
            timeout=DISCOVERY_PERIOD_SECONDS + 30,
            what="the regex consumer to pick up the new topic",
        )
        assert seen == {later}
    finally:
        client.close()


@pytest.mark.parametrize("sub_type", [pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared])
def test_shared_and_key_shared_spread_messages_over_connected_consumers(broker, sub_type):
    topic = f"non-persistent://public/default/{unique('spread')}"
    client = make_client(broker.url)
    try:
        a = client.subscribe(topic, "s", consumer_type=sub_type, consumer_name="a")
        b = client.subscribe(topic, "s", consumer_type=sub_type, consumer_name="b")
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(40):
            producer.send(f"m{i}".encode(), partition_key=f"k{i % 8}")
        got_a, got_b = drain_acked(a, 1000), drain_acked(b, 1000)
        assert sorted(got_a + got_b) == sorted(f"m{i}".encode() for i in range(40))  # each once
        assert got_a and got_b
        if sub_type == pulsar.ConsumerType.KeyShared:  # a key goes to one consumer only
            keys_a = {int(m[1:]) % 8 for m in got_a}
            keys_b = {int(m[1:]) % 8 for m in got_b}
            assert not keys_a & keys_b
    finally:
        client.close()


def test_rate_meter_counts_within_its_window():
    from compactmq.broker.nonpersistent import RateMeter

    now = [100.0]
    meter = RateMeter(window=10, clock=lambda: now[0])
    meter.add(5)
    now[0] += 3
    meter.add(15)
    assert meter.rate == 2.0 and meter.total == 20
    now[0] += 8  # the first bucket left the window
    assert meter.rate == 1.5
    now[0] += 10
    assert meter.rate == 0 and meter.total == 20


def test_a_topic_that_went_idle_is_revived_by_a_late_producer():
    """A producer that looked the topic up just before its last user left still gets it."""
    import asyncio

    from compactmq.broker.nonpersistent import NonPersistentTopics
    from compactmq.naming import TopicName

    class Service:
        config = {"allowAutoTopicCreation": True}
        shutting_down = False
        tail_cache_bytes = 1024

        def run_blocking(self, fn, *args):
            return fn(*args)

    class Manager:
        service = Service()

    class Producer:
        def __init__(self, name):
            self.name, self.serial, self.closed, self.access_mode, self.exclusive = (
                name,
                id(self),
                False,
                0,
                False,
            )
            self.messages_in = self.bytes_in = 0

    async def scenario():
        topics = NonPersistentTopics(Manager())
        tn = TopicName.parse("non-persistent://public/default/idle")
        topic = topics.get(tn, create=True)
        first = Producer("first")
        topic.add_producer(first)
        late_lookup = topics.get(tn, create=True)  # a second client looked it up ...
        topic.remove_producer(first)  # ... and then the last user left
        assert topics.names("public/default") == []
        late_lookup.add_producer(Producer("late"))
        assert topics.names("public/default") == [str(tn)] and not late_lookup.closed

    asyncio.run(scenario())
