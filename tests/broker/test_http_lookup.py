"""HTTP lookup: the official client given the web service URL (``http://``) looks topics up over
HTTP (``/lookup/v2/topic/...`` and ``.../partitions``), then produces and consumes over the
binary protocol; the lookup body is Pulsar's LookupData."""

from __future__ import annotations

import time

import pytest

pulsar = pytest.importorskip("pulsar")

from .conftest import make_client  # noqa: E402
from .rest import ok, rest, web  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture
def http_client(broker):
    c = make_client(web(broker), operation_timeout_seconds=5)
    yield c
    c.close()


def test_http_service_url_produces_and_consumes(broker, http_client, topic):
    consumer = http_client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = http_client.create_producer(topic)
    for i in range(20):
        producer.send(b"m%d" % i)
    got = [consumer.receive(10000).data() for _ in range(20)]
    assert got == [b"m%d" % i for i in range(20)]
    reader = http_client.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.read_next(10000).data() == b"m0"


def test_http_client_on_a_partitioned_topic(broker, http_client):
    topic = f"persistent://public/default/http-parts-{time.monotonic_ns()}"
    ok(rest(broker, "PUT", f"/admin/v2/persistent/{topic.split('://')[1]}/partitions", 3))
    consumer = http_client.subscribe(topic, "s")
    producer = http_client.create_producer(topic)
    for i in range(9):
        producer.send(b"%d" % i, partition_key=f"k{i}")
    got = sorted(consumer.receive(10000).data() for _ in range(9))
    assert got == sorted(b"%d" % i for i in range(9))
    assert ok(rest(broker, "GET", f"/admin/v2/persistent/{topic.split('://')[1]}/partitions")) == {
        "partitions": 3
    }


def test_lookup_answers_lookup_data(broker, topic):
    local = topic.split("://", 1)[1]
    data = ok(rest(broker, "GET", f"/lookup/v2/topic/persistent/{local}"))
    assert data["brokerUrl"] == broker.url
    assert data["nativeUrl"] == broker.url
    assert data["httpUrl"] == web(broker)
    assert data["brokerUrlTls"] == "" and data["httpUrlTls"] == ""
    # a new topic's partitioned metadata, as the client's HTTP lookup asks it
    path = f"/admin/v2/persistent/{local}/partitions"
    assert ok(rest(broker, "GET", path + "?checkAllowAutoCreation=true")) == {"partitions": 0}
    status, body = rest(broker, "GET", "/lookup/v2/topic/persistent/nosuch-tenant/ns/t")
    assert status == 404 and "Namespace not found" in body["reason"]
    path = "/admin/v2/persistent/nosuch-tenant/ns/t/partitions?checkAllowAutoCreation=true"
    assert rest(broker, "GET", path)[0] == 404


def test_http_client_refused_for_an_unknown_namespace(http_client):
    with pytest.raises(pulsar.PulsarException):
        http_client.create_producer("persistent://nosuch-tenant/ns/t")
