"""The official Python client's CI setup, unchanged, leaves compactmq as it leaves Pulsar.

Pulsar's standalone creates ``public``/``public/default`` through its own admin client; with
upstream's configuration (authorization on, no broker-client credentials, ``anonymous`` not a
superuser) that client is refused, so nothing is created and the setup script's PUTs create
them -- ``public`` with ``anonymous`` as its admin, ``public/default`` with ``anonymous`` granted
produce and consume. Had the broker created them first, the PUTs would answer 409 and every
anonymous test of the client's suite would fail with AuthorizationError.
"""

from __future__ import annotations

import pytest
from broker.conftest import make_client  # tests/ is on sys.path

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ci_ready(upstream_ci):
    """(the tenants before the script, the script's statuses), once per module."""
    before = upstream_ci.admin().ok("GET", "/admin/v2/tenants")
    return before, upstream_ci.run_setup_script()


def test_setup_script_creates_and_grants_the_default_namespace(upstream_ci, ci_ready):
    before, statuses = ci_ready
    assert "public" not in before  # the broker's own admin client could not create it
    assert statuses["clusters/standalone"] == 409  # compactmq's one cluster exists from the start
    assert statuses["tenants/public"] == 204
    assert statuses["namespaces/public/default"] == 204
    assert statuses["namespaces/public/default-2"] == 204
    assert statuses["tenants/private"] == 204 and statuses["namespaces/private/auth"] == 204
    admin = upstream_ci.admin()
    assert admin.ok("GET", "/admin/v2/tenants/public")["adminRoles"] == ["anonymous"]
    assert admin.ok("GET", "/admin/v2/namespaces/public/default/permissions") == {
        "anonymous": ["consume", "produce"]
    }
    log = upstream_ci.log_path.read_text()
    assert "public/default not created" in log and "not a superuser" in log


def test_anonymous_client_produces_and_consumes_on_public_default(upstream_ci, ci_ready):
    client = make_client(upstream_ci.service_url)
    try:
        consumer = client.subscribe("anonymous-round-trip", "s")
        client.create_producer("anonymous-round-trip").send(b"hi")
        assert consumer.receive(10_000).data() == b"hi"
    finally:
        client.close()


# --- the last failures of the client's suite, reproduced ----------------------------------------


def basic_round_trip(url: str, auth, topic: str) -> None:
    """Upstream's ``_test_basic_auth``: subscribe, produce, receive on ``private/auth``."""
    client = make_client(url, authentication=auth)
    try:
        consumer = client.subscribe(topic, "my-sub", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic)
        producer.send(b"hello")
        assert consumer.receive(10_000).data() == b"hello"
    finally:
        client.close()


def test_basic_auth_method_unknown_falls_back_to_anonymous(upstream_ci, ci_ready):
    """pulsar_test.py::test_basic_auth_method: a client announcing a method the broker has no
    provider for gets the anonymous role (Pulsar's ServerCnx), which has no grant on private/auth:
    AuthorizationError, not an authentication failure."""
    topic = "persistent://private/auth/my-python-topic-basic-auth-"
    basic = pulsar.AuthenticationBasic("admin", "123456", "basic")
    basic_round_trip(upstream_ci.service_url, basic, topic + "2")
    with pytest.raises(pulsar.AuthorizationError):
        basic_round_trip(
            upstream_ci.service_url, pulsar.AuthenticationBasic("admin", "123456", "unknown"), topic + "3"
        )
    params = '{{"username": "admin","password": "123456", "method": "{}"}}'
    basic_round_trip(
        upstream_ci.service_url,
        pulsar.AuthenticationBasic(auth_params_string=params.format("basic")),
        topic + "4",
    )
    with pytest.raises(pulsar.AuthorizationError):
        basic_round_trip(
            upstream_ci.service_url,
            pulsar.AuthenticationBasic(auth_params_string=params.format("unknown")),
            topic + "5",
        )


def test_create_producer_in_a_tenant_that_does_not_exist_is_topic_not_found(upstream_ci, ci_ready):
    """asyncio_test.py::test_create_producer_failure, with authentication and authorization on."""
    import asyncio

    from pulsar.asyncio import Client as AsyncClient, PulsarException

    async def attempt():
        client = AsyncClient(upstream_ci.service_url, operation_timeout_seconds=5)
        try:
            await client.create_producer("tenant/ns/asyncio-test-send-failure")
        finally:
            await client.close()

    with pytest.raises(PulsarException) as raised:
        asyncio.run(attempt())
    assert raised.value.error() == pulsar.Result.TopicNotFound
    # the synchronous client too
    client = make_client(upstream_ci.service_url, operation_timeout_seconds=5)
    try:
        with pytest.raises(pulsar.TopicNotFound):
            client.create_producer("persistent://no-such-tenant/ns/t")
    finally:
        client.close()


def test_batch_index_ack_redelivery_skips_acknowledged_messages(upstream_ci, ci_ready):
    """pulsar_test.py::test_batch_index_ack (acknowledgmentAtBatchIndexLevelEnabled=true in the
    file; compactmq always keeps batch-index acknowledgements, PIP-54): two of a five-message
    batch acknowledged, the consumer closed and subscribed again gets the other three only."""
    topic = "test-batch-index-ack-3"
    client = make_client(upstream_ci.service_url)
    try:
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=100, batching_max_publish_delay_ms=10000
        )
        consumer = client.subscribe(topic, "test-batch-index-ack", batch_index_ack_enabled=True)
        for i in range(5):
            producer.send_async(b"hello-%d" % i, callback=None)
        producer.flush()
        results = [consumer.receive(10_000) for _ in range(5)]
        assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in results}) == 1
        for msg in results[:2]:
            consumer.acknowledge(msg)
        consumer.close()  # flushes the grouped acknowledgements
        consumer = client.subscribe(topic, "test-batch-index-ack", batch_index_ack_enabled=True)
        again = [consumer.receive(10_000).data() for _ in range(3)]
        assert again == [b"hello-2", b"hello-3", b"hello-4"]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1000)
    finally:
        client.close()


# --- schema_test.py: Avro compatibility as Pulsar checks it ---------------------------------------


def test_avro_required_default(upstream_ci, ci_ready):
    """schema_test.py::test_avro_required_default: a record class with the same fields, defaults
    added and another name is compatible under the default strategy (FULL): Pulsar resolves
    records by their fields, not their names."""
    from pulsar.schema import (
        Array,
        AvroSchema,
        Boolean,
        Bytes,
        Double,
        Float,
        Integer,
        Long,
        Map,
        Record,
        String,
    )

    class MySubRecord(Record):
        _sorted_fields = True
        x = Integer()
        y = Long()
        z = String()

    class Example(Record):
        a = Integer()
        b = Boolean(required=True)
        c = Long()
        d = Float()
        e = Double()
        f = String()
        g = Bytes()
        h = Array(String())
        i = Map(String())
        j = MySubRecord()

    class ExampleRequiredDefault(Record):
        _sorted_fields = True
        a = Integer(required_default=True)
        b = Boolean(required=True, required_default=True)
        c = Long(required_default=True)
        d = Float(required_default=True)
        e = Double(required_default=True)
        f = String(required_default=True)
        g = Bytes(required_default=True)
        h = Array(String(), required_default=True)
        i = Map(String(), required_default=True)
        j = MySubRecord(required_default=True)

    client = make_client(upstream_ci.service_url)
    try:
        topic = "my-avro-python-default-topic"
        producer = client.create_producer(topic, schema=AvroSchema(Example))
        producer_default = client.create_producer(topic, schema=AvroSchema(ExampleRequiredDefault))
        producer.close()
        producer_default.close()

        # an incompatible change is still refused: a field's type that does not resolve
        class Incompatible(Record):
            a = String()

        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(topic, schema=AvroSchema(Incompatible))
    finally:
        client.close()


def test_schema_evolve(upstream_ci, ci_ready):
    """schema_test.py::test_schema_evolve: FORWARD set on public/default by ``anonymous`` (its
    tenant's admin after the setup script); a producer of ``User2`` (age required) joins one of
    ``User1``; a consumer and a reader of ``User1`` read both producers' messages."""
    from pulsar.schema import AvroSchema, Integer, Record, String

    class User1(Record):
        name = String()
        age = Integer()

    class User2(Record):
        _sorted_fields = True
        name = String()
        age = Integer(required=True)

    status, body, _ = upstream_ci.admin(None).call(
        "PUT", "/admin/v2/namespaces/public/default/schemaCompatibilityStrategy", "FORWARD"
    )
    assert status == 204, body
    client = make_client(upstream_ci.service_url)
    try:
        topic = "schema-test-schema-evolve-2"
        producer1 = client.create_producer(topic, schema=AvroSchema(User1))
        consumer = client.subscribe(topic, "sub", schema=AvroSchema(User1))
        reader = client.create_reader(
            topic, schema=AvroSchema(User1), start_message_id=pulsar.MessageId.earliest
        )
        producer2 = client.create_producer(topic, schema=AvroSchema(User2))
        for i in range(10):
            producer1.send(User1(age=i + 100, name=f"User1 {i}"))
            producer2.send(User2(age=i + 200, name=f"User2 {i}"))
        for received in (
            [consumer.receive(10_000) for _ in range(20)],
            [reader.read_next(10_000) for _ in range(20)],
        ):
            for i, msg in enumerate(received):
                value, index = msg.value(), i // 2
                if i % 2 == 0:
                    assert (value.age, value.name) == (index + 100, f"User1 {index}")
                else:
                    assert (value.age, value.name) == (index + 200, f"User2 {index}")
    finally:
        client.close()
