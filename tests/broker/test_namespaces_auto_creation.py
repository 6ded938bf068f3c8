"""Tenants, namespaces and automatic topic creation as Pulsar rules them, seen by the official
client: a topic of an unknown namespace is TopicNotFound (and no tenant appears), public/default
and the standalone cluster exist from the start, and the broker settings and the namespace policy
``autoTopicCreation`` (REST and CLI) decide whether and how a topic is created by using it."""

from __future__ import annotations

import time

import pytest

pulsar = pytest.importorskip("pulsar")

from .conftest import BrokerProcess, make_client  # noqa: E402
from .rest import cli, ok, rest  # noqa: E402

pytestmark = pytest.mark.integration
NS = "/admin/v2/namespaces"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    # the broker default is partitioned with 2 partitions, so a namespace override is visible
    b = BrokerProcess(
        tmp_path_factory.mktemp("autocreate") / "data",
        overrides={"allowAutoTopicCreationType": "partitioned", "defaultNumPartitions": "2"},
    )
    b.start()
    yield b
    b.stop()


@pytest.fixture
def client(broker):
    c = make_client(broker.url, operation_timeout_seconds=5)
    yield c
    c.close()


def unique(name):
    return f"{name}-{time.monotonic_ns()}"


def partitions(broker, topic):
    status, body = rest(broker, "GET", f"/admin/v2/persistent/{topic.split('://', 1)[1]}/partitions")
    return body["partitions"] if status == 200 else status


def test_defaults_exist_from_the_start(broker):
    assert "public" in ok(rest(broker, "GET", "/admin/v2/tenants"))
    assert "public/default" in ok(rest(broker, "GET", f"{NS}/public"))
    assert ok(rest(broker, "GET", "/admin/v2/clusters")) == ["standalone"]
    assert ok(rest(broker, "GET", f"{NS}/public/default/autoTopicCreation")) is None


def test_unknown_tenant_or_namespace_is_topic_not_found(broker, client):
    tenant = unique("nosuch")
    with pytest.raises(pulsar.TopicNotFound):
        client.create_producer(f"persistent://{tenant}/ns/t")
    with pytest.raises(pulsar.TopicNotFound):
        client.subscribe(f"persistent://{tenant}/ns/t", "s")
    with pytest.raises(pulsar.TopicNotFound):
        client.create_producer(f"persistent://public/{unique('nons')}/t")
    # nothing was created on the way
    assert tenant not in ok(rest(broker, "GET", "/admin/v2/tenants"))
    assert rest(broker, "GET", f"{NS}/{tenant}")[0] == 404
    # once an operator creates them, the same client works
    ok(
        rest(
            broker,
            "PUT",
            f"/admin/v2/tenants/{tenant}",
            {"adminRoles": [], "allowedClusters": ["standalone"]},
        )
    )
    ok(rest(broker, "PUT", f"{NS}/{tenant}/ns"))
    topic = f"persistent://{tenant}/ns/t"
    consumer = client.subscribe(topic, "s")
    client.create_producer(topic).send(b"hello")
    assert consumer.receive(10000).data() == b"hello"


def test_broker_settings_apply_without_a_policy(broker, client):
    topic = f"persistent://public/default/{unique('bydefault')}"
    producer = client.create_producer(topic)
    producer.send(b"x")
    assert partitions(broker, topic) == 2  # allowAutoTopicCreationType=partitioned, defaultNumPartitions=2


def test_namespace_policy_overrides_the_broker_settings(broker, client):
    ns = f"public/{unique('atc')}"
    ok(rest(broker, "PUT", f"{NS}/{ns}"))
    path = f"{NS}/{ns}/autoTopicCreation"

    ok(rest(broker, "POST", path, {"allowAutoTopicCreation": False}))
    assert ok(rest(broker, "GET", path)) == {"allowAutoTopicCreation": False}
    with pytest.raises(pulsar.TopicNotFound):
        client.create_producer(f"persistent://{ns}/off")
    assert partitions(broker, f"persistent://{ns}/off") == 404
    ok(rest(broker, "PUT", f"/admin/v2/persistent/{ns}/made-by-admin"))  # an existing topic still works
    client.create_producer(f"persistent://{ns}/made-by-admin").send(b"ok")

    ok(rest(broker, "POST", path, {"allowAutoTopicCreation": True, "topicType": "non-partitioned"}))
    client.create_producer(f"persistent://{ns}/plain").send(b"x")
    assert partitions(broker, f"persistent://{ns}/plain") == 0

    ok(
        rest(
            broker,
            "POST",
            path,
            {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3},
        )
    )
    producer = client.create_producer(f"persistent://{ns}/three")
    for i in range(6):
        producer.send(b"%d" % i, partition_key=str(i))
    assert partitions(broker, f"persistent://{ns}/three") == 3

    ok(rest(broker, "DELETE", path))  # back to the broker settings
    assert ok(rest(broker, "GET", path)) is None
    client.create_producer(f"persistent://{ns}/two").send(b"x")
    assert partitions(broker, f"persistent://{ns}/two") == 2


@pytest.mark.parametrize(
    "body, status",
    [
        ({"allowAutoTopicCreation": True, "topicType": "partitioned"}, 412),
        ({"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 0}, 412),
        ({"allowAutoTopicCreation": True, "topicType": "non-partitioned", "defaultNumPartitions": 2}, 412),
        ({"allowAutoTopicCreation": True, "topicType": "sharded"}, 412),
        ({"topicType": "partitioned"}, 400),
        ("yes", 400),
    ],
)
def test_invalid_policy_bodies_are_refused(broker, body, status):
    got, answer = rest(broker, "POST", f"{NS}/public/default/autoTopicCreation", body)
    assert got == status and answer["reason"]
    assert ok(rest(broker, "GET", f"{NS}/public/default/autoTopicCreation")) is None
    assert (
        rest(
            broker,
            "POST",
            f"{NS}/public/{unique('none')}/autoTopicCreation",
            {"allowAutoTopicCreation": False},
        )[0]
        == 404
    )


def test_cli_sets_gets_and_removes_the_policy(broker, client):
    ns = f"public/{unique('cliatc')}"
    assert cli(broker, "namespaces", "create", ns).returncode == 0
    done = cli(
        broker,
        "namespaces",
        "set-auto-topic-creation",
        ns,
        "--enable",
        "--type",
        "partitioned",
        "--num-partitions",
        "4",
    )
    assert done.returncode == 0, done.stderr
    shown = cli(broker, "namespaces", "get-auto-topic-creation", ns)
    assert shown.returncode == 0 and "partitioned, 4 partitions" in shown.stdout
    client.create_producer(f"persistent://{ns}/four").send(b"x")
    assert partitions(broker, f"persistent://{ns}/four") == 4
    assert cli(broker, "namespaces", "set-auto-topic-creation", ns).returncode == 0  # no --enable: off
    with pytest.raises(pulsar.TopicNotFound):
        client.create_producer(f"persistent://{ns}/refused")
    refused = cli(broker, "namespaces", "set-auto-topic-creation", ns, "--enable", "--type", "partitioned")
    assert refused.returncode == 1 and "defaultNumPartitions" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert cli(broker, "namespaces", "remove-auto-topic-creation", ns).returncode == 0
    assert "not set" in cli(broker, "namespaces", "get-auto-topic-creation", ns).stdout
