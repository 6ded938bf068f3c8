"""Schema registry with the official client and the admin API: the REST paths and bodies,
compatibility strategies per namespace and per topic (evolution allowed under BACKWARD, refused
under FULL), isAllowAutoUpdateSchema, schemaValidationEnforced, the CLI, and a restart."""

from __future__ import annotations

import json
import time

import pytest

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("fastavro")  # pulsar.schema.AvroSchema needs it

from pulsar.schema import AvroSchema, Integer, Record, String  # noqa: E402

from .conftest import make_client  # noqa: E402
from .rest import cli, ok, rest  # noqa: E402

pytestmark = pytest.mark.integration


class V1(Record):
    _sorted_fields = True
    a = String(required=True)
    b = Integer(required=True)


class V2(Record):  # V1 without b: a reader of V2 reads V1 data, a V1 reader cannot read V2 data
    a = String(required=True)


V1.__name__ = V2.__name__ = "Reading"  # one Avro record name, as an evolving schema keeps


def avro(fields: list) -> str:
    return json.dumps({"type": "record", "name": "R", "fields": fields})


S1 = avro([{"name": "a", "type": "string"}])
S_ADD_DEFAULT = avro([{"name": "a", "type": "string"}, {"name": "c", "type": "int", "default": 0}])
S_ADD_REQUIRED = avro([{"name": "a", "type": "string"}, {"name": "c", "type": "int"}])


def unique(name: str) -> str:
    return f"{name}-{time.monotonic_ns()}"


def schema_url(topic: str) -> str:
    return f"/admin/v2/schemas/{topic.replace('persistent://', '')}"


def new_namespace(broker, strategy: str | None = None) -> str:
    ns = unique("sch")
    ok(rest(broker, "PUT", f"/admin/v2/namespaces/public/{ns}"))
    if strategy:
        ok(rest(broker, "PUT", f"/admin/v2/namespaces/public/{ns}/schemaCompatibilityStrategy", strategy))
    return ns


def test_rest_paths_and_bodies(broker):
    topic = f"persistent://public/default/{unique('rest')}"
    url = schema_url(topic)
    status, body = rest(broker, "GET", url + "/schema")
    assert status == 404 and body["reason"] == "Schema not found"

    assert ok(
        rest(broker, "POST", url + "/schema", {"type": "AVRO", "schema": S1, "properties": {"owner": "ops"}})
    ) == {"version": {"version": 0}}
    got = ok(rest(broker, "GET", url + "/schema"))
    assert got["version"] == 0 and got["type"] == "AVRO" and got["data"] == S1
    assert got["properties"] == {"owner": "ops"} and got["timestamp"] > 0
    # the same schema again: the same version
    assert (
        ok(rest(broker, "POST", url + "/schema", {"type": "AVRO", "schema": S1}))["version"]["version"] == 0
    )

    # FULL is the default: a required field added is refused, one with a default accepted
    test = ok(rest(broker, "POST", url + "/compatibility", {"type": "AVRO", "schema": S_ADD_REQUIRED}))
    assert test["compatibility"] is False and test["schemaCompatibilityStrategy"] == "FULL"
    test = ok(rest(broker, "POST", url + "/compatibility", {"type": "AVRO", "schema": S_ADD_DEFAULT}))
    assert test["compatibility"] is True
    status, body = rest(broker, "POST", url + "/schema", {"type": "AVRO", "schema": S_ADD_REQUIRED})
    assert status == 409 and "FULL" in body["reason"]
    status, body = rest(broker, "POST", url + "/schema", {"type": "AVRO", "schema": "{not avro"})
    assert status == 422, body
    status, _ = rest(broker, "POST", url + "/schema", {"type": "STRING", "schema": ""})
    assert status == 409  # another type
    assert (
        ok(rest(broker, "POST", url + "/schema", {"type": "AVRO", "schema": S_ADD_DEFAULT}))["version"][
            "version"
        ]
        == 1
    )

    versions = ok(rest(broker, "GET", url + "/schemas"))["getSchemaResponses"]
    assert [v["version"] for v in versions] == [0, 1] and versions[1]["data"] == S_ADD_DEFAULT
    assert ok(rest(broker, "GET", url + "/schema/0"))["data"] == S1
    assert rest(broker, "GET", url + "/schema/7")[0] == 404
    spaced = json.dumps(json.loads(S_ADD_DEFAULT), indent=2)  # the same schema, spelt otherwise
    assert ok(rest(broker, "POST", url + "/version", {"type": "AVRO", "schema": spaced})) == {"version": 1}
    assert rest(broker, "POST", url + "/version", {"type": "AVRO", "schema": S_ADD_REQUIRED})[0] == 404

    # delete: nothing in force, and the next schema starts a new history
    assert ok(rest(broker, "DELETE", url + "/schema")) == {"version": 2}
    assert rest(broker, "GET", url + "/schema")[0] == 404
    assert ok(rest(broker, "GET", url + "/schemas"))["getSchemaResponses"] == []
    assert (
        ok(rest(broker, "POST", url + "/schema", {"type": "STRING", "schema": ""}))["version"]["version"] == 3
    )
    assert rest(broker, "DELETE", url + "/schema", raw=None)[0] == 200
    assert rest(broker, "DELETE", url + "/schema")[0] == 404


def test_evolution_allowed_under_backward_refused_under_full(broker):
    backward = new_namespace(broker, "BACKWARD")
    assert (
        ok(rest(broker, "GET", f"/admin/v2/namespaces/public/{backward}/schemaCompatibilityStrategy"))
        == "BACKWARD"
    )
    full = new_namespace(broker)  # no policy: the broker's default, FULL
    client = make_client(broker.url)
    try:
        t1 = f"persistent://public/{backward}/readings"
        p1 = client.create_producer(t1, schema=AvroSchema(V1))
        p1.send(V1(a="x", b=1))
        p2 = client.create_producer(t1, schema=AvroSchema(V2))  # field removed: BACKWARD accepts it
        p2.send(V2(a="y"))
        assert len(ok(rest(broker, "GET", schema_url(t1) + "/schemas"))["getSchemaResponses"]) == 2

        t2 = f"persistent://public/{full}/readings"
        q1 = client.create_producer(t2, schema=AvroSchema(V1))
        q1.send(V1(a="x", b=1))
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(t2, schema=AvroSchema(V2))
        assert len(ok(rest(broker, "GET", schema_url(t2) + "/schemas"))["getSchemaResponses"]) == 1
        # a consumer whose schema cannot be reconciled is refused as well
        with pytest.raises(pulsar.IncompatibleSchema):
            client.subscribe(t2, "s", schema=AvroSchema(V2))

        # a topic policy overrides the namespace's
        ok(
            rest(
                broker,
                "PUT",
                f"/admin/v2/persistent/public/{full}/readings/schemaCompatibilityStrategy",
                "BACKWARD",
            )
        )
        assert (
            ok(
                rest(
                    broker, "GET", f"/admin/v2/persistent/public/{full}/readings/schemaCompatibilityStrategy"
                )
            )
            == "BACKWARD"
        )
        client.create_producer(t2, schema=AvroSchema(V2)).send(V2(a="z"))
        status, body = rest(
            broker, "PUT", f"/admin/v2/namespaces/public/{full}/schemaCompatibilityStrategy", "SOMETIMES"
        )
        assert status == 412 and "BACKWARD_TRANSITIVE" in body["reason"]
    finally:
        client.close()


def test_auto_update_off_and_validation_enforced(broker):
    ns = new_namespace(broker)
    ok(rest(broker, "POST", f"/admin/v2/namespaces/public/{ns}/isAllowAutoUpdateSchema", False))
    ok(rest(broker, "POST", f"/admin/v2/namespaces/public/{ns}/schemaValidationEnforced", True))
    topic = f"persistent://public/{ns}/t"
    client = make_client(broker.url)
    try:
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(topic, schema=AvroSchema(V1))  # producers may not register it
        ok(
            rest(
                broker,
                "POST",
                schema_url(topic) + "/schema",
                {"type": "AVRO", "schema": json.dumps(V1.schema())},
            )
        )  # the operator may
        producer = client.create_producer(topic, schema=AvroSchema(V1))
        producer.send(V1(a="a", b=2))
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(topic)  # no schema on a topic with one, validation enforced
        ok(rest(broker, "POST", f"/admin/v2/namespaces/public/{ns}/schemaValidationEnforced", False))
        client.create_producer(topic).send(b"raw bytes")  # allowed again
        consumer = client.subscribe(
            topic, "s", schema=AvroSchema(V1), initial_position=pulsar.InitialPosition.Earliest
        )
        msg = consumer.receive(10000)
        assert msg.value().a == "a" and msg.value().b == 2
    finally:
        client.close()


def test_cli_and_restart(broker, tmp_path):
    topic = f"persistent://public/default/{unique('cli')}"
    payload = tmp_path / "schema.json"
    payload.write_text(json.dumps({"type": "AVRO", "schema": S1, "properties": {"k": "v"}}))
    r = cli(broker, "schemas", "upload", topic, "--filename", str(payload))
    assert r.returncode == 0, r.stderr
    r = cli(broker, "--output", "json", "schemas", "get", topic)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["data"] == S1
    incompatible = tmp_path / "bad.json"
    incompatible.write_text(json.dumps({"type": "AVRO", "schema": S_ADD_REQUIRED}))
    r = cli(broker, "schemas", "compatibility", topic, "--filename", str(incompatible))
    assert r.returncode == 1 and "incompatible" in r.stdout
    r = cli(
        broker,
        "namespaces",
        "set-schema-compatibility-strategy",
        "public/default",
        "--compatibility",
        "forward",
    )
    assert r.returncode == 0, r.stderr
    try:
        r = cli(broker, "schemas", "upload", topic, "-f", str(incompatible))  # FORWARD accepts it
        assert r.returncode == 0, r.stderr
    finally:
        assert (
            cli(broker, "namespaces", "remove-schema-compatibility-strategy", "public/default").returncode
            == 0
        )

    ns = new_namespace(broker)
    for command, flag in (
        ("set-is-allow-auto-update-schema", "--disable"),
        ("set-schema-validation-enforce", "--enable"),
    ):
        assert cli(broker, "namespaces", command, f"public/{ns}", flag).returncode == 0
    policies = ok(rest(broker, "GET", f"/admin/v2/namespaces/public/{ns}"))
    assert policies["isAllowAutoUpdateSchema"] is False and policies["schemaValidationEnforced"] is True
    r = cli(broker, "namespaces", "get-is-allow-auto-update-schema", f"public/{ns}")
    assert r.returncode == 0 and r.stdout.strip() == "false"

    broker.restart()  # the versions are in the metadata store
    r = cli(broker, "--output", "json", "schemas", "get", topic, "--all-version")
    assert [v["version"] for v in json.loads(r.stdout)["getSchemaResponses"]] == [0, 1]
    r = cli(broker, "--output", "json", "schemas", "get", topic, "--version", "0")
    assert json.loads(r.stdout)["properties"] == {"k": "v"}
    assert cli(broker, "schemas", "delete", topic).returncode == 0
    r = cli(broker, "schemas", "get", topic)
    assert r.returncode == 1 and "Schema not found" in r.stderr


def test_deleting_a_topic_deletes_its_schema(broker):
    topic = f"persistent://public/default/{unique('del')}"
    client = make_client(broker.url)
    try:
        client.create_producer(topic, schema=AvroSchema(V1)).close()
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(topic, schema=AvroSchema(V2))
        ok(rest(broker, "DELETE", "/admin/v2/" + topic.replace("://", "/")))
        assert rest(broker, "GET", schema_url(topic) + "/schema")[0] == 404
        client.create_producer(topic, schema=AvroSchema(V2)).send(V2(a="fresh"))  # a new topic, a new history
        assert (
            ok(rest(broker, "GET", schema_url(topic) + "/schema"))["data"]
            == AvroSchema(V2).schema_info().schema()
        )
    finally:
        client.close()
