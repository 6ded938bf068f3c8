"""The compatibility strategies over Apache Avro's resolution check, and the schema table
(deletion markers, the move of schemas kept in topic properties by older versions)."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from compactmq.broker import schema_compat
from compactmq.broker.schema_registry import SchemaRegistry, schema_id
from compactmq.errors import IncompatibleSchema
from compactmq.storage.engine import Storage
from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.resources import SchemaResources
from compactmq.storage.schemas import SchemaStorage, active


def rec(*fields) -> tuple[int, bytes]:
    return 4, json.dumps({"type": "record", "name": "R", "fields": list(fields)}).encode()


A = {"name": "a", "type": "string"}
B_REQ = {"name": "b", "type": "int"}
B_DEF = {"name": "b", "type": "int", "default": 0}


@pytest.mark.parametrize(
    "strategy,old,new,ok",
    [
        ("BACKWARD", rec(A), rec(A, B_REQ), False),  # the new reader has no value for b
        ("BACKWARD", rec(A, B_REQ), rec(A), True),
        ("FORWARD", rec(A), rec(A, B_REQ), True),
        ("FORWARD", rec(A, B_REQ), rec(A), False),
        ("FULL", rec(A, B_REQ), rec(A), False),
        ("FULL", rec(A), rec(A, B_DEF), True),
        ("ALWAYS_COMPATIBLE", rec(A), (1, b""), True),
        ("ALWAYS_INCOMPATIBLE", rec(A), rec(A, B_DEF), False),
        ("FULL", rec(A), (1, b""), False),  # another type
        ("FULL", (2, b"{}"), (2, b'{"x": 1}'), True),  # JSON that is not Avro: compared by type only
    ],
)
def test_strategies(strategy, old, new, ok):
    if ok:
        schema_compat.check(strategy, [old], new)
    else:
        with pytest.raises(IncompatibleSchema):
            schema_compat.check(strategy, [old], new)


def named(name: str, *fields, nested: dict | None = None) -> tuple[int, bytes]:
    body = {"type": "record", "name": name, "fields": list(fields) + ([nested] if nested else [])}
    return 4, json.dumps(body).encode()


def test_records_resolve_by_fields_whatever_their_names():
    """Pulsar's check (Avro's resolving grammar) matches records by fields, not names: a renamed
    record class is compatible, nested records too; enums and fixed types keep their names."""
    for strategy in ("BACKWARD", "FORWARD", "FULL", "FULL_TRANSITIVE"):
        schema_compat.check(strategy, [named("User1", A)], named("User2", A))
        sub = {"name": "j", "type": {"type": "record", "name": "Sub1", "fields": [A]}}
        renamed = {"name": "j", "type": {"type": "record", "name": "Sub2", "fields": [A]}}
        schema_compat.check(strategy, [named("R", A, nested=sub)], named("R", A, nested=renamed))
    with pytest.raises(IncompatibleSchema):  # the fields still have to resolve
        schema_compat.check("FULL", [named("User1", A)], named("User2", {"name": "a", "type": "int"}))
    enum1 = {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED"]}}
    enum2 = {"name": "e", "type": {"type": "enum", "name": "Colour", "symbols": ["RED"]}}
    with pytest.raises(IncompatibleSchema):
        schema_compat.check("FULL", [named("R", enum1)], named("R", enum2))


def test_transitive_checks_every_version_in_force():
    v1, v2 = rec(A, B_REQ), rec(A)
    v3 = rec(A, {"name": "b", "type": "string", "default": ""})  # reads v2 data, not v1's int b
    schema_compat.check("BACKWARD", [v1, v2], v3)  # against the latest only
    with pytest.raises(IncompatibleSchema):
        schema_compat.check("BACKWARD_TRANSITIVE", [v1, v2], v3)
    schema_compat.check("BACKWARD_TRANSITIVE", [v2], v3)


def test_same_schema_whatever_the_spelling():
    a = json.dumps({"type": "record", "name": "R", "fields": [A]}).encode()
    b = json.dumps({"name": "R", "fields": [A], "type": "record"}, indent=2).encode()
    assert schema_compat.same(4, a, b)
    assert not schema_compat.same(4, a, rec(A, B_DEF)[1])


def test_storage_deletion_markers(tmp_path):
    store = SchemaStorage(SchemaResources(create_metadata_store("memory:", data_dir=tmp_path)))
    assert store.add("t/n/x", 1, b"") == 0
    assert store.add("t/n/x", 1, b"s") == 1
    assert store.delete("t/n/x") == 2
    assert active(store.versions("t/n/x")) == []
    assert store.delete("t/n/x") is None
    assert store.add("t/n/x", 1, b"") == 3
    assert [r.version for r in active(store.versions("t/n/x"))] == [3]
    assert store.delete("t/n/x", force=True) == 3 and store.versions("t/n/x") == []


class _Service:
    def __init__(self, storage):
        self.storage = storage
        self.config = {
            "schemaCompatibilityStrategy": "FULL",
            "isAllowAutoUpdateSchemaEnabled": True,
            "isSchemaValidationEnforced": False,
        }

    async def run_blocking(self, fn, *args):
        return fn(*args)


def test_schemas_kept_in_topic_properties_move_to_the_table(tmp_path):
    with Storage(tmp_path) as storage:
        _schemas_move(storage)


def _schemas_move(storage):
    topic = "persistent://public/default/old"
    storage.topic_metadata.create_topic(
        topic,
        {
            "__schemas": [
                {"name": "s", "type": 1, "data": base64.b64encode(b"").decode(), "properties": {"k": "v"}}
            ],
            "other": 1,
        },
    )
    registry = SchemaRegistry(_Service(storage))
    found = asyncio.run(registry.get(topic + "-partition-0", None))
    assert found is not None and found[0].type == 1 and found[1] == (0).to_bytes(8, "big")
    assert storage.topic_metadata.topic_properties(topic) == {"other": 1}
    assert [r.properties for r in registry.storage.versions(schema_id(topic))] == [{"k": "v"}]
