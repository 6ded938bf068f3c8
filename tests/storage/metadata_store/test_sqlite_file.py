"""The embedded store shares metadata.db with the old tables of an older data directory: one file,
both schemas, neither disturbs the other (what the one-time import at start stands on)."""

from __future__ import annotations

import sqlite3

from storage.old_metadata import MetadataStore as LegacyMetadataStore  # tests/ is on sys.path
from compactmq.storage.metadata_store import create_metadata_store


def test_new_tables_beside_todays_in_one_file(tmp_path):
    legacy = LegacyMetadataStore(tmp_path / "metadata.db")
    legacy.create_topic("persistent://public/default/t")
    store = create_metadata_store(None, data_dir=tmp_path)
    try:
        store.put("/managed-ledgers/public/default/persistent/t", b"{}")
        legacy.create_topic("persistent://public/default/u")  # both write the file, turn about
        store.put("/admin/policies/public", b"{}")
        assert legacy.topics() == ["persistent://public/default/t", "persistent://public/default/u"]
    finally:
        store.close()
        legacy.close()
    with sqlite3.connect(tmp_path / "metadata.db") as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"topics", "ledgers", "cursors", "store_nodes", "store_sessions", "store_changes"} <= tables
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("metadata.db")) == []
    with create_metadata_store("sqlite:metadata.db", data_dir=tmp_path) as again:
        assert again.get_children("/managed-ledgers/public/default/persistent") == ["t"]
        assert again.exists("/admin/policies/public")


def test_a_writer_holding_the_file_too_long_is_store_unavailable(tmp_path):
    import pytest

    from compactmq.storage.metadata_store import StoreUnavailable

    with create_metadata_store(None, data_dir=tmp_path, operation_timeout_s=0.3) as store:
        store.put("/a", b"1")
        other = sqlite3.connect(tmp_path / "metadata.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process in a long write transaction
        try:
            with pytest.raises(StoreUnavailable):
                store.put("/a", b"2")
            assert store.get("/a").value == b"1"  # readers are not blocked (WAL)
        finally:
            other.execute("ROLLBACK")
            other.close()
        store.put("/a", b"2")
