"""The read-only reader of an older data directory's tables (``metadata_store.legacy_tables``)."""

from __future__ import annotations

import sqlite3

import pytest

from compactmq.errors import MetadataError
from compactmq.storage import Storage
from compactmq.storage.metadata_store.legacy_tables import open_legacy_tables
from compactmq.storage.position import Position
from storage.old_metadata import MetadataStore as OldMetadata  # tests/ is on sys.path

T = "persistent://public/default/t"


def _tables(path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_a_fresh_data_directory_has_no_old_tables(tmp_path):
    with Storage(tmp_path) as storage:
        storage.open_managed_ledger(T).append(b"x")
    assert open_legacy_tables(tmp_path / "metadata.db") is None
    assert not {"tenants", "topics", "ledgers", "sequences"} & _tables(tmp_path / "metadata.db")
    assert open_legacy_tables(tmp_path / "absent.db") is None
    assert not (tmp_path / "absent.db").exists()  # asking never creates a file


def test_reads_what_an_old_version_wrote_and_never_writes(tmp_path):
    old = OldMetadata(tmp_path / "metadata.db")
    old.create_topic(T, {"k": "v"})
    lid = old.add_ledger(T, created_ms=5)
    old.save_cursor(T, "sub", Position(lid, 3), b"", {"a": 1})
    old.set_namespace_policy("public/default", "retentionTimeInMinutes", 7)
    old.close()
    tables = open_legacy_tables(tmp_path / "metadata.db")
    assert tables is not None
    try:
        assert tables.topics() == [T] and tables.topic_properties(T) == {"k": "v"}
        assert [li.ledger_id for li in tables.ledgers(T)] == [lid] and tables.last_ledger_id() == lid
        (cursor,) = tables.load_cursors(T)
        assert (
            cursor.name == "sub" and cursor.mark_delete == Position(lid, 3) and cursor.properties == {"a": 1}
        )
        assert tables.get_namespace_policies("public/default") == {"retentionTimeInMinutes": 7}
        assert tables.legacy_compaction_states() == []
        with pytest.raises(MetadataError, match="readonly"):
            tables.query("DELETE FROM topics")
    finally:
        tables.close()
