"""The one-time import of the old metadata tables into the metadata store.

The old data directory is written in the test with the old API (``storage.old_metadata``, the
class older versions wrote it with), then opened the new way, which only reads the old tables
(``storage.metadata_store.legacy_tables``)."""

from __future__ import annotations

import pytest

from compactmq.errors import Conflict, NotFound, TopicNotFound
from compactmq.storage.engine import Storage
from compactmq.storage.metadata_store.legacy_tables import open_legacy_tables
from storage.old_metadata import MetadataStore as OldMetadata  # tests/ is on sys.path
from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.position import LedgerInfo, Position
from compactmq.storage.resources import PulsarResources
from compactmq.storage.resources.legacy_import import TENANTS_NAMESPACES, import_legacy, marker_path


def _old_data_dir(path):
    """A data directory as today's main leaves it: tenants (with info), namespaces, a topic."""
    old = OldMetadata(path / "metadata.db", bootstrap=True)
    old.create_tenant("acme", {"adminRoles": ["ops"], "allowedClusters": ["standalone"]})
    old.create_namespace("acme/orders")
    old.create_namespace("acme/pay ments")  # a name that needs encoding as a path segment
    old.create_topic("persistent://other/ns/t")  # auto-creates tenant "other" and other/ns
    old.create_partitioned_topic("persistent://acme/orders/parted", 3)
    # a topic with ledgers (one closed, one left OPEN by a crash), properties and cursors
    topic = "persistent://acme/orders/t1"
    old.create_topic(topic, {"producerEpoch": 3})
    first = old.add_ledger(topic, 1_000)
    old.add_ledger(topic, 2_000, close=LedgerInfo(first, 5, 50, 10, 20, "CLOSED", 1_000, 1_500))
    old.save_cursor(topic, "sub", Position(first, 2), b"\x01" * 16, {"a": 1})
    old.save_cursor(topic, "__compaction", Position(first, -1), b"", {})
    # policies of a namespace, of a topic, and of a namespace deleted since (not brought back)
    old.set_namespace_policy("acme/orders", "retentionTimeInMinutes", 7)
    old.set_topic_policy(topic, "compactionThreshold", 1024)
    old.set_topic_policy("persistent://acme/orders/parted", "retentionSizeInMB", 9)
    old.create_namespace("acme/gone")
    old.set_namespace_policy("acme/gone", "retentionTimeInMinutes", 1)
    old.delete_namespace("acme/gone")
    old.set_namespace_policy("acme/gone", "retentionTimeInMinutes", 2)  # no check in the old store
    old.close()


@pytest.fixture
def old_dir(tmp_path):
    _old_data_dir(tmp_path)
    return tmp_path


def test_tenants_and_namespaces_imported_once_in_the_same_file(old_dir):
    old = OldMetadata(old_dir / "metadata.db", bootstrap=False)
    store = create_metadata_store("", data_dir=old_dir)  # the embedded default: the same file
    try:
        assert import_legacy(old, store, (TENANTS_NAMESPACES,)) == ["tenants-namespaces"]
        res = PulsarResources(store)
        assert res.tenants.list_tenants() == ["acme", "other", "public"]
        assert res.tenants.get("acme") == {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}
        assert res.namespaces.list_namespaces("acme") == ["acme/orders", "acme/pay ments"]
        assert res.namespaces.exists("other/ns") and res.namespaces.exists("public/default")
        assert store.exists(marker_path("tenants-namespaces"))
        # once: a tenant deleted afterwards in the store is not brought back by a second start
        res.namespaces.delete("other/ns")
        res.tenants.delete("other")
        assert import_legacy(old, store, (TENANTS_NAMESPACES,)) == []
        assert res.tenants.get("other") is None
    finally:
        store.close()
        old.close()


def test_keys_already_in_the_store_are_kept(old_dir):
    """A tenant that already exists in the store (another importer, a bootstrap) is not overwritten."""
    old = OldMetadata(old_dir / "metadata.db", bootstrap=False)
    store = create_metadata_store("memory:", data_dir=old_dir)
    try:
        res = PulsarResources(store)
        res.tenants.create("acme", {"adminRoles": ["newer"]})
        import_legacy(old, store, (TENANTS_NAMESPACES,))
        assert res.tenants.get("acme") == {"adminRoles": ["newer"]}
        assert res.namespaces.exists("acme/orders")
    finally:
        store.close()
        old.close()


def test_storage_opens_the_store_beside_the_old_tables(old_dir):
    with Storage(old_dir) as storage:
        assert storage.configuration_store is storage.metadata_store
        assert storage.metadata_store.path == (old_dir / "metadata.db").resolve()
        # tenants and namespaces were imported at start: the resources answer for them now
        assert storage.resources.tenants.get("acme") == {
            "adminRoles": ["ops"],
            "allowedClusters": ["standalone"],
        }
        assert storage.resources.namespaces.exists("acme/pay ments")
        # so were the partitioned topics
        assert storage.partitions("persistent://acme/orders/parted") == 3
        assert storage.partitioned_topics() == {"persistent://acme/orders/parted": 3}
        assert storage.partitioned_topics("acme/orders") == {"persistent://acme/orders/parted": 3}
        assert storage.partitions("persistent://acme/orders/not-parted") is None
        storage.update_partitioned_topic("persistent://acme/orders/parted", 3)  # same number: nothing
        with pytest.raises(Conflict, match="cannot shrink"):
            storage.update_partitioned_topic("persistent://acme/orders/parted", 2)
        storage.update_partitioned_topic("persistent://acme/orders/parted", 4)
        assert storage.partitions("persistent://acme/orders/parted") == 4
        storage.delete_partitioned_topic("persistent://acme/orders/parted")
        with pytest.raises(TopicNotFound):
            storage.delete_partitioned_topic("persistent://acme/orders/parted")
        with pytest.raises(TopicNotFound):
            storage.update_partitioned_topic("persistent://acme/orders/parted", 5)
        # a topic created in a namespace nobody made creates it (and its tenant), as before
        storage.open_managed_ledger("persistent://new-tenant/new-ns/t")
        assert storage.resources.tenants.get("new-tenant") == {}
        assert storage.resources.namespaces.list_namespaces("new-tenant") == ["new-tenant/new-ns"]
    # reopens (the store's session ended cleanly, the directory lock was released)
    with Storage(old_dir) as storage:
        assert storage.topics() == [
            "persistent://acme/orders/t1",
            "persistent://new-tenant/new-ns/t",
            "persistent://other/ns/t",
        ]
        # deleting a namespace: refused while it has topics, then it goes with its policies
        storage.policies.set_namespace_policy("acme/orders", "retentionTimeInMinutes", 5)
        with pytest.raises(Conflict, match="still has topics"):
            storage.delete_namespace("other/ns")
        storage.delete_managed_ledger("persistent://acme/orders/t1")
        storage.delete_namespace("acme/orders")
        assert not storage.resources.namespaces.exists("acme/orders")
        assert storage.policies.get_namespace_policies("acme/orders") == {}
        with pytest.raises(NotFound):
            storage.delete_namespace("acme/orders")
        storage.resources.namespaces.create("acme/orders", {})  # created again: no old policies
        assert storage.policies.get_namespace_policies("acme/orders") == {}


def test_a_bad_metadata_store_url_is_one_clear_error_and_releases_the_directory(tmp_path):
    from compactmq.config import load_config
    from compactmq.errors import InvalidConfiguration

    cfg = load_config(overrides={"metadataStoreUrl": "etcd:localhost:2379"})
    with pytest.raises(InvalidConfiguration, match="unknown scheme"):
        Storage(tmp_path, cfg)
    Storage(tmp_path).close()  # the lock was released


# The compaction tables as main wrote them before the compaction service owned its state (the
# DDL of storage/metadata.py at that time, and rows as its commit_compaction left them).
_OLD_COMPACTION_TABLES = """
CREATE TABLE compaction_state (
    topic               TEXT PRIMARY KEY,
    compacted_ledger_id INTEGER,
    horizon_ledger      INTEGER,
    horizon_entry       INTEGER,
    status              TEXT NOT NULL,
    last_error          TEXT,
    started_ms          INTEGER,
    last_success_ms     INTEGER,
    last_failure_ms     INTEGER,
    last_duration_ms    INTEGER,
    removed_event_count INTEGER NOT NULL DEFAULT 0,
    version             INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE compaction_details (
    topic   TEXT PRIMARY KEY,
    view_id INTEGER,
    details TEXT NOT NULL
);
INSERT INTO compaction_state VALUES
    ('persistent://acme/orders/compacted', 42, 7, 19, 'SUCCESS', NULL, 1000, 2000, NULL, 120, 33, 4),
    ('persistent://acme/orders/failed', 43, 8, 0, 'ERROR', 'spark exploded', 3000, 2500, 3100, 80, 0, 6),
    ('persistent://other/ns/empty', NULL, NULL, NULL, 'SUCCESS', NULL, 500, 600, NULL, 1, 0, 2);
INSERT INTO compaction_details VALUES
    ('persistent://acme/orders/compacted', 42, '{"keys": 5, "phaseSeconds": {"plan": 0.5}}');
"""


def test_compaction_states_are_imported_once_into_the_local_store(old_dir):
    import sqlite3

    from compactmq.naming import TopicName

    db = sqlite3.connect(old_dir / "metadata.db")
    db.executescript(_OLD_COMPACTION_TABLES)
    db.close()
    with Storage(old_dir) as storage:
        res = storage.resources.compaction
        assert [str(t) for t in res.list_topics()] == [
            "persistent://acme/orders/compacted",
            "persistent://acme/orders/failed",
            "persistent://other/ns/empty",
        ]
        state, version = res.get(TopicName.parse("persistent://acme/orders/compacted"))
        assert version == 0  # a fresh key: the old table's version counter does not carry over
        assert state == {
            "status": "SUCCESS",
            "compactedLedgerId": 42,
            "horizon": [7, 19],
            "lastError": None,
            "startedMs": 1000,
            "lastSuccessMs": 2000,
            "lastFailureMs": None,
            "lastDurationMs": 120,
            "removedEventCount": 33,
            "detailsOf": 42,
            "details": {"keys": 5, "phaseSeconds": {"plan": 0.5}},
        }
        failed, _ = res.get(TopicName.parse("persistent://acme/orders/failed"))
        assert (failed["status"], failed["lastError"], failed["compactedLedgerId"], failed["horizon"]) == (
            "ERROR",
            "spark exploded",
            43,
            [8, 0],
        )
        empty, _ = res.get(TopicName.parse("persistent://other/ns/empty"))
        assert empty["horizon"] is None and empty["compactedLedgerId"] is None and empty["details"] == {}
        assert res.view_of(TopicName.parse("persistent://acme/orders/compacted")) == 42
        assert storage.metadata_store.exists(marker_path("compaction-state"))
        # from now on the store is the truth: a state deleted there is not imported again
        res.delete(TopicName.parse("persistent://other/ns/empty"))
    with Storage(old_dir) as storage:
        assert storage.resources.compaction.get(TopicName.parse("persistent://other/ns/empty")) is None


def test_a_read_only_opener_does_not_import_the_compaction_states(old_dir):
    import sqlite3

    from compactmq.naming import TopicName

    db = sqlite3.connect(old_dir / "metadata.db")
    db.executescript(_OLD_COMPACTION_TABLES)
    db.close()
    with Storage(old_dir, read_only=True) as job:
        assert job.resources.compaction.get(TopicName.parse("persistent://acme/orders/compacted")) is None
    with Storage(old_dir) as broker:
        assert (
            broker.resources.compaction.view_of(TopicName.parse("persistent://acme/orders/compacted")) == 42
        )


def test_topics_ledgers_cursors_and_policies_are_imported(old_dir):
    topic = "persistent://acme/orders/t1"
    with Storage(old_dir) as storage:
        assert storage.topics() == [topic, "persistent://other/ns/t"]
        tm = storage.topic_metadata
        assert tm.topic_properties(topic) == {"producerEpoch": 3}
        infos = tm.ledgers(topic)
        assert [(i.entry_count, i.size, i.state) for i in infos] == [(5, 50, "CLOSED"), (0, 0, "OPEN")]
        sub = tm.get_cursor(topic, "sub")
        assert sub is not None and sub.mark_delete == Position(infos[0].ledger_id, 2)
        assert sub.acked_ranges == b"\x01" * 16 and sub.properties == {"a": 1}
        assert {r.name for r in tm.load_cursors(topic)} == {"sub", "__compaction"}
        assert storage.policies.get_namespace_policies("acme/orders") == {"retentionTimeInMinutes": 7}
        assert storage.policies.effective_policy(topic, "retentionTimeInMinutes", 0) == 7
        assert storage.policies.effective_policy(topic, "compactionThreshold", 0) == 1024
        assert storage.policies.get_topic_policies("persistent://acme/orders/parted") == {
            "retentionSizeInMB": 9
        }
        assert not storage.resources.namespaces.exists("acme/gone")
        # new ledger ids continue above the old counter (never reusing an old id)
        old = open_legacy_tables(old_dir / "metadata.db")
        assert old is not None
        try:  # read-only: the import left the old tables as they were
            old_max = old.last_ledger_id()
            assert old.get_tenant("acme") == {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}
        finally:
            old.close()
        ml = storage.open_managed_ledger(topic)  # recovers the OPEN ledger: it was empty
        assert [i.ledger_id for i in ml.ledgers()][-1] > old_max
        assert storage.resources.ledger_ids.allocate() > old_max  # compacted ledgers share the ids
        storage.delete_managed_ledger(topic)
    with Storage(old_dir) as storage:  # imported once: a topic deleted since stays deleted
        assert storage.topics() == ["persistent://other/ns/t"]
        assert storage.policies.get_topic_policies(topic) == {}
