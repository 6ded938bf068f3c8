import sqlite3
import threading

import pytest

from compactmq.errors import AlreadyExists, Conflict, MetadataError, NotFound, TopicNotFound
from compactmq.storage import (
    COMPACTION_THRESHOLD,
    RETENTION_TIME_MINUTES,
    MetadataStore,
    Position,
)

T = "persistent://public/default/t"


@pytest.fixture
def store(tmp_path, clock):
    s = MetadataStore(tmp_path / "metadata.db", clock=clock)
    yield s
    s.close()


def test_wal_mode_and_default_tenant(store, tmp_path):
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.tenants() == ["public"] and store.namespaces() == ["public/default"]


def test_ledger_ids_are_unique_and_survive_reopen(tmp_path, clock):
    s = MetadataStore(tmp_path / "m.db", clock=clock)
    ids = [s.allocate_ledger_id() for _ in range(5)]
    s.close()
    s = MetadataStore(tmp_path / "m.db", clock=clock)
    assert s.allocate_ledger_id() == ids[-1] + 1 and ids == sorted(set(ids))
    s.close()


def test_ledger_ids_unique_across_threads(store):
    got = []

    def grab():
        got.extend(store.allocate_ledger_id() for _ in range(50))

    ts = [threading.Thread(target=grab) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(set(got)) == 200


def test_a_failed_transaction_leaves_nothing(store):
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.create_topic(T)
            store.set_topic_policy(T, COMPACTION_THRESHOLD, 100)
            raise RuntimeError("crash in the middle")
    assert not store.topic_exists(T) and store.get_topic_policies(T) == {}


def test_rollover_is_one_transaction(store):
    from compactmq.storage import LedgerInfo

    store.create_topic(T)
    first = store.add_ledger(T, 1)
    with pytest.raises(MetadataError):  # closing an unknown ledger fails: nothing is added
        store.add_ledger(T, 2, close=LedgerInfo(9999, 1, 1, 1, 1, "CLOSED", 0, 2))
    assert [l.ledger_id for l in store.ledgers(T)] == [first]
    second = store.add_ledger(T, 2, close=LedgerInfo(first, 10, 100, 5, 6, "CLOSED", 1, 2))
    infos = store.ledgers(T)
    assert [(l.ledger_id, l.state, l.entry_count) for l in infos] == [
        (first, "CLOSED", 10),
        (second, "OPEN", 0),
    ]


def test_tenants_and_namespaces(store):
    store.create_tenant("acme", {"allowedClusters": ["standalone"]})
    with pytest.raises(AlreadyExists):
        store.create_tenant("acme")
    assert store.get_tenant("acme") == {"allowedClusters": ["standalone"]}
    with pytest.raises(NotFound):
        store.create_namespace("nobody/ns")
    store.create_namespace("acme/orders")
    assert store.namespaces("acme") == ["acme/orders"]
    with pytest.raises(Conflict):
        store.delete_tenant("acme")
    store.create_topic("persistent://acme/orders/o1")
    with pytest.raises(Conflict):
        store.delete_namespace("acme/orders")
    store.delete_topic("persistent://acme/orders/o1")
    store.delete_namespace("acme/orders")
    store.delete_tenant("acme")
    assert store.tenants() == ["public"]


def test_topic_creation_makes_its_namespace(store):
    assert store.create_topic("persistent://new/ns/t")
    assert not store.create_topic("persistent://new/ns/t")
    assert "new/ns" in store.namespaces() and store.topics("new/ns") == ["persistent://new/ns/t"]


def test_partitioned_topics(store):
    store.create_partitioned_topic(T, 3)
    with pytest.raises(AlreadyExists):
        store.create_partitioned_topic(T, 3)
    assert store.get_partitions(T) == 3 and store.get_partitions(T + "x") is None
    store.update_partitioned_topic(T, 5)
    with pytest.raises(Conflict):
        store.update_partitioned_topic(T, 2)
    assert store.partitioned_topics("public/default") == {T: 5}
    store.delete_partitioned_topic(T)
    with pytest.raises(TopicNotFound):
        store.delete_partitioned_topic(T)


def test_policies_topic_over_namespace_over_default(store):
    assert store.effective_policy(T, RETENTION_TIME_MINUTES, 7) == 7
    store.set_namespace_policy("public/default", RETENTION_TIME_MINUTES, 60)
    assert store.effective_policy(T, RETENTION_TIME_MINUTES, 7) == 60
    store.set_topic_policy(T, RETENTION_TIME_MINUTES, -1)
    assert store.effective_policy(T, RETENTION_TIME_MINUTES, 7) == -1
    store.remove_topic_policy(T, RETENTION_TIME_MINUTES)
    assert store.effective_policy(T, RETENTION_TIME_MINUTES, 7) == 60
    store.set_policies("topic", T, {"compactionStrategy": "keep-first", "retainNullKey": True})
    assert store.get_topic_policies(T) == {"compactionStrategy": "keep-first", "retainNullKey": True}
    store.set_policies("topic", T, {"retainNullKey": None})
    assert store.get_topic_policies(T) == {"compactionStrategy": "keep-first"}


def test_delete_topic_removes_everything_at_once(store):
    store.create_topic(T)
    lid = store.add_ledger(T, 1)
    store.save_cursor(T, "sub", Position(lid, 3), b"", {"a": 1})
    store.set_topic_policy(T, COMPACTION_THRESHOLD, 5)
    assert store.delete_topic(T) == [lid]
    assert store.ledgers(T) == [] and store.load_cursors(T) == [] and store.get_topic_policies(T) == {}
    # whether a topic exists is the resources' to say now: a second delete here is no error
    assert store.delete_topic(T) == []


def test_a_new_store_has_no_compaction_tables(store):
    """The compaction state is the compaction service's, in the metadata store's keys."""
    tables = {r[0] for r in store.query("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not tables & {"compaction_state", "compaction_details"}
    assert store.legacy_compaction_states() == []


def test_newer_schema_is_refused(tmp_path):
    db = sqlite3.connect(tmp_path / "m.db")
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(MetadataError):
        MetadataStore(tmp_path / "m.db")
