"""Producer access modes as Pulsar answers them (PIP-68), seen by the official client: a second
Exclusive producer is fenced, ExclusiveWithFencing takes the topic over and the old producer's
sends fail with ProducerFenced, and the topic epoch grows with each takeover (and survives a
restart)."""

from __future__ import annotations

import pytest

pulsar = pytest.importorskip("pulsar")

from .conftest import make_client  # noqa: E402
from .rest import ok, rest, wait_until  # noqa: E402

pytestmark = pytest.mark.integration
Mode = pulsar.ProducerAccessMode


def epoch(broker, topic):
    local = topic.split("://", 1)[1]
    return ok(rest(broker, "GET", f"/admin/v2/persistent/{local}/stats"))["topicEpoch"]


def test_second_exclusive_producer_is_fenced(client, topic):
    first = client.create_producer(topic, access_mode=Mode.Exclusive)
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=Mode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):  # a shared one is busy, as on Pulsar
        client.create_producer(topic)
    first.close()
    shared = client.create_producer(topic)
    with pytest.raises(pulsar.ProducerFenced):  # "Topic has existing shared producers"
        client.create_producer(topic, access_mode=Mode.Exclusive)
    shared.close()
    client.create_producer(topic, access_mode=Mode.Exclusive).send(b"mine")


def test_exclusive_with_fencing_takes_over(broker, topic):
    old_client = make_client(broker.url)
    new_client = make_client(broker.url)
    try:
        old = old_client.create_producer(topic, access_mode=Mode.Exclusive, send_timeout_millis=5000)
        old.send(b"before")
        e1 = epoch(broker, topic)
        assert e1 is not None and e1 >= 0
        new = new_client.create_producer(topic, access_mode=Mode.ExclusiveWithFencing)
        new.send(b"after")
        e2 = epoch(broker, topic)
        assert e2 > e1

        def old_is_fenced():
            try:
                old.send(b"stale")
            except pulsar.ProducerFenced:
                return True
            except pulsar.Timeout:
                return False
            raise AssertionError("the fenced producer's send succeeded")

        wait_until(old_is_fenced, 30, "the old producer to be fenced")
        with pytest.raises(pulsar.ProducerFenced):
            old.send(b"still stale")
        newer = old_client.create_producer(topic, access_mode=Mode.ExclusiveWithFencing)
        assert epoch(broker, topic) > e2
        newer.send(b"newest")
        consumer = new_client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
        got = []
        while True:
            try:
                got.append(consumer.receive(1500).data())
            except pulsar.Timeout:
                break
        assert got == [b"before", b"after", b"newest"]
        last = epoch(broker, topic)
    finally:
        old_client.close()
        new_client.close()
    broker.restart()
    c = make_client(broker.url)
    try:
        c.create_producer(topic, access_mode=Mode.Exclusive).send(b"x")
        assert epoch(broker, topic) > last  # epochs only grow, across restarts too
    finally:
        c.close()
