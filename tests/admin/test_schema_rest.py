"""``GET /admin/v2/schemas/{tenant}/{namespace}/{topic}/schema``: the latest schema a producer
registered, as Pulsar's GetSchemaResponse; 404 with a reason for a topic without one."""

from __future__ import annotations

import json
import time

import pytest
from harness.broker import BrokerProcess, make_client

from .harness import Http

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("broker") / "data")
    b.start()
    yield b
    b.stop()


@pytest.fixture
def topic():
    return f"persistent://public/default/schema-{time.monotonic_ns()}"


def test_schema_of_a_topic_and_of_a_partitioned_topic(broker, topic):
    from pulsar.schema import AvroSchema, Integer, Record, String

    class Tick(Record):
        symbol = String()
        seq = Integer()

    http = Http(f"http://127.0.0.1:{broker.web_port}")
    local = topic.split("/", 2)[-1]  # public/default/<name>
    client = make_client(broker.url)
    try:
        assert "schema not found" in http.error("GET", f"/admin/v2/schemas/{local}/schema", 404).lower()
        client.create_producer(topic, schema=AvroSchema(Tick)).close()
        body = http.ok("GET", f"/admin/v2/schemas/{local}/schema")
        assert body["type"] == "AVRO" and body["version"] == 0
        assert [f["name"] for f in json.loads(body["data"])["fields"]] == ["symbol", "seq"]

        http.ok("PUT", f"/admin/v2/persistent/{local}-p/partitions", 2)
        client.create_producer(topic + "-p", schema=AvroSchema(Tick)).close()
        assert http.ok("GET", f"/admin/v2/schemas/{local}-p/schema")["type"] == "AVRO"
    finally:
        client.close()
