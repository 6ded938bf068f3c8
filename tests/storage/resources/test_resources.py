"""Typed resources over every store: Pulsar's paths, names that cannot escape their subtree,
read-modify-write, fenced ledger lists, schema versions, compaction commits that cannot go back."""

from __future__ import annotations

import threading

import pytest

from compactmq.errors import AlreadyExists, Conflict, InvalidInput, NotFound
from compactmq.naming import TopicName
from compactmq.storage.metadata_store import NEW, BadVersion
from compactmq.storage.resources import StaleCompaction, decode_segment, encode_segment

T = TopicName.parse("persistent://public/default/orders")


def test_tenants_and_namespaces_at_pulsars_paths(resources, store):
    resources.tenants.create("public", {"adminRoles": ["admin"], "allowedClusters": ["standalone"]})
    with pytest.raises(AlreadyExists):
        resources.tenants.create("public", {})
    resources.namespaces.create("public/default", {"retention_policies": None})
    with pytest.raises(NotFound):
        resources.namespaces.create("nobody/ns", {})
    assert store.exists("/admin/policies/public/default")
    assert resources.tenants.list_tenants() == ["public"]
    assert resources.namespaces.list_namespaces("public") == ["public/default"]
    assert resources.tenants.get("public")["adminRoles"] == ["admin"]
    with pytest.raises(Conflict):
        resources.tenants.delete("public")  # it still has a namespace
    resources.namespaces.delete("public/default")
    resources.tenants.delete("public")
    assert resources.tenants.get("public") is None
    with pytest.raises(NotFound):
        resources.namespaces.delete("public/default")


def test_policies_read_modify_write_loses_no_update(resources):
    resources.tenants.create("t", {})
    resources.namespaces.create("t/ns", {"counter": 0})

    def bump():
        for _ in range(10):
            resources.namespaces.set_policies("t/ns", lambda p: {**p, "counter": p["counter"] + 1})

    threads = [threading.Thread(target=bump) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert resources.namespaces.get_policies("t/ns")["counter"] == 30
    with pytest.raises(NotFound):
        resources.namespaces.set_policies("t/none", lambda p: p)


def test_partitioned_topics(resources, store):
    resources.partitioned_topics.create(T, 4)
    assert store.exists("/admin/partitioned-topics/public/default/persistent/orders")
    assert resources.partitioned_topics.get(T) == {"partitions": 4}
    with pytest.raises(InvalidInput):
        resources.partitioned_topics.update_partitions(T, 3)  # partitions only grow
    resources.partitioned_topics.update_partitions(T, 6)
    assert resources.partitioned_topics.list_topics("public/default") == [T]
    with pytest.raises(InvalidInput):
        resources.partitioned_topics.create(TopicName.parse("x"), 0)


def test_managed_ledger_info_is_fenced_by_version(resources, store):
    v0 = resources.managed_ledgers.create(T, {"ledgers": []})
    assert store.exists("/managed-ledgers/public/default/persistent/orders")
    v1 = resources.managed_ledgers.put(T, {"ledgers": [{"ledgerId": 1}]}, v0)
    with pytest.raises(BadVersion):  # a deposed owner still holding v0 cannot write
        resources.managed_ledgers.put(T, {"ledgers": []}, v0)
    assert resources.managed_ledgers.get(T) == ({"ledgers": [{"ledgerId": 1}]}, v1)
    assert resources.managed_ledgers.list_topics("public/default") == [T]


def test_cursors_live_under_their_topic_and_go_with_it(resources, store):
    with pytest.raises(NotFound):
        resources.managed_ledgers.put_cursor(T, "sub", {"markDelete": [1, 0]})
    resources.managed_ledgers.create(T, {"ledgers": []})
    v = resources.managed_ledgers.put_cursor(T, "sub/a b", {"markDelete": [1, 0]}, NEW)
    resources.managed_ledgers.put_cursor(T, "__compaction", {"markDelete": [0, 0]})
    assert store.exists("/managed-ledgers/public/default/persistent/orders/sub%2Fa+b")
    assert resources.managed_ledgers.list_cursors(T) == ["__compaction", "sub/a b"]
    resources.managed_ledgers.put_cursor(T, "sub/a b", {"markDelete": [1, 5]}, v)
    assert resources.managed_ledgers.get_cursor(T, "sub/a b")[0] == {"markDelete": [1, 5]}
    resources.managed_ledgers.delete(T)  # cursors and ledger list in one commit
    assert not store.exists("/managed-ledgers/public/default/persistent/orders")
    assert resources.managed_ledgers.get_cursor(T, "sub/a b") is None
    with pytest.raises(NotFound):
        resources.managed_ledgers.delete(T)


@pytest.mark.parametrize("name", ["a/../../admin", "..", ".", "%2F", "caf\u00e9 \u4e3b", "x~y*z", "a+b"])
def test_topic_names_stay_one_segment(resources, store, name):
    topic = TopicName("persistent", "public", "default", name)
    resources.managed_ledgers.create(topic, {"ledgers": []})
    assert resources.managed_ledgers.list_topics("public/default") == [topic]
    assert decode_segment(encode_segment(name)) == name
    assert store.get_children("/") == ["managed-ledgers"]  # nothing escaped the subtree


def test_schema_versions(resources, store):
    part = TopicName.parse("persistent://public/default/orders-partition-2")
    assert resources.schemas.get(T) is None
    assert resources.schemas.add(T, {"type": "AVRO", "data": "v0"}, None) == 0
    with pytest.raises(BadVersion):  # another broker added version 0 meanwhile
        resources.schemas.add(part, {"type": "AVRO", "data": "other"}, None)
    assert resources.schemas.add(part, {"type": "AVRO", "data": "v1"}, 0) == 1  # partitions share
    assert resources.schemas.get(T) == (1, {"type": "AVRO", "data": "v1"})
    assert resources.schemas.get(T, 0) == (0, {"type": "AVRO", "data": "v0"})
    assert resources.schemas.versions(T) == [0, 1]
    assert store.exists("/schemas/public/default/orders/0000000001")
    resources.schemas.delete(T)
    assert resources.schemas.get(T) is None and not store.exists("/schemas/public/default/orders")


def test_compaction_commits_are_compare_and_set_and_never_go_back(resources):
    c = resources.compaction
    assert c.get(T) is None
    v = c.put(T, {"status": "RUNNING", "horizon": None}, NEW)
    # two jobs start from the same state
    job_a = job_b = v
    v = c.commit_view(T, {"status": "SUCCESS", "horizon": [5, 9], "compactedLedgerId": 40}, job_a)
    with pytest.raises(BadVersion):  # the stale job cannot overwrite the newer view
        c.commit_view(T, {"status": "SUCCESS", "horizon": [7, 0], "compactedLedgerId": 41}, job_b)
    with pytest.raises(StaleCompaction):  # even with the right version, the view never moves back
        c.commit_view(T, {"status": "SUCCESS", "horizon": [5, 3], "compactedLedgerId": 42}, v)
    with pytest.raises(StaleCompaction):
        c.commit_view(T, {"status": "SUCCESS", "horizon": None}, v)
    v = c.commit_view(T, {"status": "SUCCESS", "horizon": [6, 0], "compactedLedgerId": 43}, v)
    assert c.get(T) == ({"status": "SUCCESS", "horizon": [6, 0], "compactedLedgerId": 43}, v)
    c.delete(T)
    assert c.get(T) is None


def test_configuration_store_can_be_separate(tmp_path):
    from compactmq.storage.metadata_store import create_metadata_store
    from compactmq.storage.resources import PulsarResources

    with (
        create_metadata_store("memory:", data_dir=tmp_path) as local,
        create_metadata_store("memory:", data_dir=tmp_path) as config,
    ):
        resources = PulsarResources(local, config)
        resources.tenants.create("t", {})
        resources.managed_ledgers.create(T, {})
        assert config.exists("/admin/policies/t") and not local.exists("/admin/policies/t")
        assert local.exists("/managed-ledgers/public/default/persistent/orders")
