"""Two brokers registering schemas on one topic at once: the loser's write fails its
compare-and-set, and its compatibility check runs again against the winner's version (the
embedded store; the resources' own tests cover ZooKeeper)."""

from __future__ import annotations

import json

import pytest

from compactmq.broker.schema_registry import SchemaRegistry
from compactmq.errors import IncompatibleSchema
from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.resources import PulsarResources
from compactmq.storage.resources.topic_metadata import TopicMetadata

T = "persistent://public/default/raced"


def avro(*fields) -> bytes:
    return json.dumps({"type": "record", "name": "R", "fields": list(fields)}).encode()


A = {"name": "a", "type": "string"}


class _Storage:
    """What the registry reads of a ``Storage``: the resources over one broker's store."""

    def __init__(self, kv):
        self.resources = res = PulsarResources(kv)
        self.policies = res.policies
        self.topic_metadata = TopicMetadata(
            res.managed_ledgers, res.ledger_ids, res.tenants, res.namespaces, res.policies
        )


class _Service:
    def __init__(self, kv):
        self.storage = _Storage(kv)
        self.config = {
            "schemaCompatibilityStrategy": "FULL",
            "isAllowAutoUpdateSchemaEnabled": True,
            "isSchemaValidationEnforced": False,
        }


@pytest.fixture
def brokers(tmp_path):
    stores = [create_metadata_store("", data_dir=tmp_path) for _ in range(2)]
    yield [SchemaRegistry(_Service(kv)) for kv in stores]
    for kv in stores:
        kv.close()


def _lose_the_race_to(loser: SchemaRegistry, winner: SchemaRegistry, schema: bytes) -> None:
    """The winner stores ``schema`` between the loser's check and the loser's write."""
    real_add = loser.storage.add

    def add(*args, **kwargs):
        loser.storage.add = real_add  # once
        winner.upload(T, "AVRO", schema, {})
        return real_add(*args, **kwargs)

    loser.storage.add = add


def test_the_loser_checks_again_against_the_winners_version(brokers):
    one, two = brokers
    assert one.upload(T, "AVRO", avro(A), {}) == 0
    b_int = avro(A, {"name": "b", "type": "int", "default": 0})
    b_str = avro(A, {"name": "b", "type": "string", "default": ""})
    _lose_the_race_to(one, two, b_str)
    # compatible with version 0 (what it checked first), not with the winner's version 1
    with pytest.raises(IncompatibleSchema):
        one.upload(T, "AVRO", b_int, {})
    assert [r.version for r in one.versions_for_admin(T)] == [0, 1]
    assert one.version_of(T, "AVRO", b_str) == 1


def test_the_same_schema_raced_in_is_found_not_stored_twice(brokers):
    one, two = brokers
    one.upload(T, "AVRO", avro(A), {})
    same = avro(A, {"name": "c", "type": "long", "default": 0})
    _lose_the_race_to(one, two, same)
    assert one.upload(T, "AVRO", same, {}) == 1
    assert [r.version for r in two.versions_for_admin(T)] == [0, 1]
