"""Inactive topics are deleted per Pulsar's keys (``brokerDeleteInactiveTopics*``) or, when kept,
unloaded from memory; a topic in use is left alone. Official client, real brokers with a
one-second sweep."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from broker.conftest import BrokerProcess, make_client

SWEEP = {
    "brokerDeleteInactiveTopicsFrequencySeconds": "1",
    "brokerDeleteInactiveTopicsMaxInactiveDurationSeconds": "1",
}


def _start(tmp_path_factory, **overrides) -> BrokerProcess:
    b = BrokerProcess(tmp_path_factory.mktemp("inactive") / "data", {**SWEEP, **overrides})
    b.start()
    return b


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = _start(tmp_path_factory)
    yield b
    b.stop()


@pytest.fixture(scope="module")
def caught_up_broker(tmp_path_factory):
    b = _start(tmp_path_factory, brokerDeleteInactiveTopicsMode="delete_when_subscriptions_caught_up")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def keeping_broker(tmp_path_factory):
    b = _start(tmp_path_factory, brokerDeleteInactiveTopicsEnabled="false")
    yield b
    b.stop()


def _get(b: BrokerProcess, path: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{b.web_port}{path}", timeout=10) as r:
        body = r.read().decode()
    return json.loads(body) if path.startswith("/admin") else body


def _topics(b: BrokerProcess) -> list[str]:
    return _get(b, "/admin/v2/persistent/public/default")


def _open_ledgers(b: BrokerProcess) -> int:
    """``pulsar_ml_count``: managed ledgers open in the broker."""
    for line in _get(b, "/metrics").splitlines():
        if line.startswith("pulsar_ml_count{"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("pulsar_ml_count missing from /metrics")


def _wait(predicate, timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _publish(client, topic: str, n: int) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(n):
        producer.send(f"m{i}".encode())
    producer.close()


def _name(request, kind: str) -> str:
    return f"persistent://public/default/{kind}-{request.node.name}-{time.monotonic_ns()}"


def test_a_topic_with_no_subscription_is_deleted_once_inactive(broker, request):
    topic = _name(request, "gone")
    client = make_client(broker.url)
    try:
        _publish(client, topic, 5)
        assert topic in _topics(broker)
        _wait(lambda: topic not in _topics(broker), what=f"{topic} to be deleted")
        # a new producer creates it afresh: nothing of the old one is left
        reader = client.create_reader(topic, _earliest())
        _publish(client, topic, 1)
        assert reader.read_next(timeout_millis=5000).data() == b"m0"
        assert not reader.has_message_available()
        reader.close()
    finally:
        client.close()


def test_a_topic_in_use_stays(broker, request):
    topic = _name(request, "busy")
    client = make_client(broker.url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"x")
        time.sleep(3.5)  # three sweeps with a producer attached (idle, but connected)
        assert topic in _topics(broker)
        producer.send(b"y")
        producer.close()
    finally:
        client.close()


def test_a_subscription_keeps_the_topic_which_is_unloaded_and_reloads_intact(broker, request):
    topic = _name(request, "kept")
    client = make_client(broker.url)
    try:
        consumer = client.subscribe(topic, "sub")
        _publish(client, topic, 6)
        for _ in range(3):
            consumer.acknowledge(consumer.receive(timeout_millis=5000))
        consumer.close()
        before = _open_ledgers(broker)
        _wait(lambda: _open_ledgers(broker) < before, what=f"{topic} to be unloaded")
        assert topic in _topics(broker)  # kept: it has a subscription
        consumer = client.subscribe(topic, "sub")
        got = [consumer.receive(timeout_millis=5000).data() for _ in range(3)]
        assert got == [b"m3", b"m4", b"m5"]  # the acknowledgements survived the unload
        consumer.close()
    finally:
        client.close()


def test_caught_up_mode_deletes_acknowledged_topics_and_keeps_backlogged_ones(caught_up_broker, request):
    b = caught_up_broker
    done, behind = _name(request, "done"), _name(request, "behind")
    client = make_client(b.url)
    try:
        for topic, acked in ((done, 4), (behind, 2)):
            consumer = client.subscribe(topic, "sub")
            _publish(client, topic, 4)
            for _ in range(acked):
                consumer.acknowledge(consumer.receive(timeout_millis=5000))
            consumer.close()
        _wait(lambda: done not in _topics(b), what=f"{done} (caught up) to be deleted")
        time.sleep(2.5)
        assert behind in _topics(b)  # its subscription has a backlog
        consumer = client.subscribe(behind, "sub")
        assert [consumer.receive(timeout_millis=5000).data() for _ in range(2)] == [b"m2", b"m3"]
        consumer.close()
    finally:
        client.close()


def test_with_deletion_off_inactive_topics_are_only_unloaded(keeping_broker, request):
    b = keeping_broker
    topic = _name(request, "idle")
    client = make_client(b.url)
    try:
        _publish(client, topic, 3)
        assert _open_ledgers(b) >= 1
        _wait(lambda: _open_ledgers(b) == 0, what="every inactive topic to be unloaded")
        assert topic in _topics(b)
        reader = client.create_reader(topic, _earliest())
        assert [reader.read_next(timeout_millis=5000).data() for _ in range(3)] == [b"m0", b"m1", b"m2"]
        reader.close()
    finally:
        client.close()


def _earliest():
    import pulsar

    return pulsar.MessageId.earliest
