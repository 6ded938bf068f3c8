"""What a topic appends goes to a consumer that keeps up in the same loop turn as the receipts,
with no dispatcher task (``Dispatcher.appended``, ``_pass_now``, ``EntrySource.read_now``), and
the task still does what needs a wait (replay, storage reads), in order, nothing lost.

The in-process broker (``harness.fixtures.broker``), the official client, real sockets. The
count of dispatcher tasks is read by wrapping ``Dispatcher._run`` (the coroutine each task
runs) in this process; the broker runs on a thread of it.
"""

from __future__ import annotations

import pulsar
import pytest

from compactmq.broker import dispatchers


@pytest.fixture
def task_runs(monkeypatch):
    """How many dispatcher tasks started (``Dispatcher._run`` calls), per subscription name."""
    runs: dict[str, int] = {}
    real = dispatchers.Dispatcher._run

    def counting(self):
        name = self.subscription.name
        runs[name] = runs.get(name, 0) + 1
        return real(self)

    monkeypatch.setattr(dispatchers.Dispatcher, "_run", counting)
    return runs


@pytest.mark.parametrize("sub_type", [pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Shared])
def test_a_consumer_keeping_up_gets_each_message_without_a_dispatcher_task(
    client, topic, task_runs, sub_type
):
    consumer = client.subscribe(topic, "now", consumer_type=sub_type, receiver_queue_size=1000)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"first")  # the FLOW of the new consumer may have started a task: settle
    assert consumer.receive(10_000).data() == b"first"
    before = task_runs.get("now", 0)
    for i in range(200):  # one at a time: each append is dispatched on its own
        producer.send(b"m%d" % i)
        msg = consumer.receive(10_000)
        assert msg.data() == b"m%d" % i
        consumer.acknowledge(msg)
    # the old path started a task for every append (200 of them); a FLOW can still start one
    assert task_runs.get("now", 0) - before <= 2
    producer.close()
    consumer.close()


def test_a_burst_arrives_in_order_and_whole(client, topic, task_runs):
    consumer = client.subscribe(topic, "burst", receiver_queue_size=50)  # FLOWs mid-burst
    producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=5000)
    n = 3000
    for i in range(n):
        producer.send_async(b"%d" % i, None)
    producer.flush()
    got = []
    for _ in range(n):
        msg = consumer.receive(10_000)
        got.append(int(msg.data()))
        consumer.acknowledge(msg)
    assert got == list(range(n))
    with pytest.raises(pulsar.Timeout):
        consumer.receive(300)
    producer.close()
    consumer.close()


def test_shared_messages_of_a_consumer_that_left_are_replayed_and_none_lost(client, topic, task_runs):
    """A Shared consumer that closes with messages unacknowledged: they go to the replay set,
    which the dispatcher task sends to the other consumer; new appends keep coming the
    immediate way meanwhile."""
    leaving = client.subscribe(
        topic, "shared", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=20
    )
    staying = client.subscribe(
        topic, "shared", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=20
    )
    producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=1000)
    n = 200
    for i in range(n):
        producer.send_async(b"%d" % i, None)
    producer.flush()
    got: list[int] = []
    first = leaving.receive(10_000)  # taken, never acknowledged
    leaving.close()  # what it held unacknowledged is delivered again
    for i in range(n, n + 50):  # and appends go on meanwhile
        producer.send_async(b"%d" % i, None)
    producer.flush()
    while True:
        try:
            msg = staying.receive(2_000)
        except pulsar.Timeout:
            break
        got.append(int(msg.data()))
        staying.acknowledge(msg)
    assert int(first.data()) in got
    assert sorted(set(got)) == list(range(n + 50))
    producer.close()
    staying.close()


def test_a_consumer_catching_up_from_storage_while_appends_go_on_gets_all_in_order(client, topic, task_runs):
    """Entries not in the tail cache (published before anyone read) come through the task's
    storage reads; appends meanwhile find the dispatcher behind the cache and leave the pass
    to the task (``read_now`` None), so the order holds across the switch to the tail."""
    producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=5000)
    old = 2000
    for i in range(old):
        producer.send_async(b"%d" % i, None)
    producer.flush()
    consumer = client.subscribe(
        topic, "catch-up", receiver_queue_size=100, initial_position=pulsar.InitialPosition.Earliest
    )
    total = old + 1000
    got: list[int] = []
    sent = old
    while len(got) < total:
        if sent < total:  # one new message for each one read: appends during the catch-up
            producer.send_async(b"%d" % sent, None)
            sent += 1
        msg = consumer.receive(10_000)
        got.append(int(msg.data()))
        consumer.acknowledge(msg)
    assert got == list(range(total))
    producer.close()
    consumer.close()


def test_a_failing_immediate_pass_spoils_nothing_else(client, topic, monkeypatch):
    """An error in the pass run from the topic's release is logged, as the task's would be:
    the other subscriptions of the topic still get their messages, and the failing one gets
    them through its task's ordinary pass."""
    real = dispatchers.Dispatcher._pass_now

    def failing_for_a(self):
        if self.subscription.name == "a":
            raise RuntimeError("dispatch broke")
        return real(self)

    monkeypatch.setattr(dispatchers.Dispatcher, "_pass_now", failing_for_a)
    a = client.subscribe(topic, "a")  # first in the topic's subscriptions
    b = client.subscribe(topic, "b")
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(b"%d" % i)
    for consumer in (b, a):
        got = []
        for _ in range(20):
            msg = consumer.receive(5_000)
            got.append(int(msg.data()))
            consumer.acknowledge(msg)
        assert got == list(range(20))
    producer.close()
    a.close()
    b.close()
