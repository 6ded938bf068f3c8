"""The one-time import of the old tables of grants, schemas and offload records.

Each old data directory is written in the test with the old API (what main wrote before the
move), then opened by today's ``Storage``."""

from __future__ import annotations

from compactmq.auth.authorization import AuthorizationService
from compactmq.config import load_config
from compactmq.storage.engine import Storage
from compactmq.storage.metadata import MetadataStore as OldMetadata
from compactmq.storage.resources.legacy_import import marker_path
from compactmq.storage.schemas import SchemaStorage, active

T = "persistent://acme/orders/events"
OLD_GRANTS = {
    "namespace_auth": {"alice": ["consume", "produce"]},
    "destination_auth": {T: {"bob": ["consume"]}},
    "subscription_auth_roles": {"billing": ["carol"]},
}


def test_grants_are_imported_once_into_the_namespace_value(tmp_path):
    old = OldMetadata(tmp_path / "metadata.db", bootstrap=True)
    old.create_tenant("acme", {"adminRoles": ["ops"]})
    old.create_namespace("acme/orders")
    old.create_namespace("acme/empty")
    old.set_namespace_policy("acme/orders", "auth_policies", OLD_GRANTS)
    old.set_namespace_policy("acme/orders", "retentionTimeInMinutes", 5)
    old.close()
    cfg = load_config(overrides={"authorizationEnabled": "true"})
    with Storage(tmp_path) as storage:
        assert storage.metadata_store.exists(marker_path("grants"))
        assert storage.resources.namespaces.get_policies("acme/orders")["auth_policies"] == OLD_GRANTS
        assert "auth_policies" not in storage.resources.namespaces.get_policies("acme/empty")
        authz = AuthorizationService(cfg, None, storage.resources)
        assert authz.can_produce("alice", T) and authz.can_consume("bob", T)
        assert not authz.can_consume("bob", T, "billing")
        authz.revoke_namespace_permission("acme/orders", "alice")
    # once: the revoked grant does not come back from the old table at the next start
    with Storage(tmp_path) as storage:
        authz = AuthorizationService(cfg, None, storage.resources)
        assert not authz.can_produce("alice", T)
        assert authz.topic_permissions(T) == {"bob": ["consume"]}


# the schema table as main created and filled it before the move (storage/schemas.py then)
OLD_SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS schemas (
    schema_id    TEXT NOT NULL,
    version      INTEGER NOT NULL,
    type         INTEGER NOT NULL,
    name         TEXT NOT NULL DEFAULT '',
    data         BLOB NOT NULL,
    properties   TEXT NOT NULL DEFAULT '{}',
    timestamp_ms INTEGER NOT NULL,
    deleted      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (schema_id, version)
)
"""


def _old_schemas(path, rows):
    old = OldMetadata(path / "metadata.db", bootstrap=True)
    with old.transaction() as db:
        db.execute(OLD_SCHEMA_TABLE)
        for row in rows:
            db.execute(
                "INSERT INTO schemas(schema_id, version, type, name, data, properties, timestamp_ms, deleted) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
    old.close()


def test_schemas_are_imported_once_with_their_history(tmp_path):
    _old_schemas(
        tmp_path,
        [
            ("public/default/a", 0, 4, "s", b'{"type":"string"}', '{"k": "v"}', 111, 0),
            ("public/default/a", 1, 0, "", b"", "{}", 222, 1),  # a deletion marker
            ("public/default/a", 2, 2, "j", b"{}", "{}", 333, 0),
            ("acme/pay ments/b", 0, 1, "", b"\x00\xff", "{}", 444, 0),
        ],
    )
    with Storage(tmp_path) as storage:
        assert storage.metadata_store.exists(marker_path("schemas"))
        schemas = SchemaStorage(storage.resources.schemas)
        a = schemas.versions("public/default/a")
        assert [(r.version, r.type, r.deleted, r.timestamp_ms) for r in a] == [
            (0, 4, False, 111),
            (1, 0, True, 222),
            (2, 2, False, 333),
        ]
        assert a[0].properties == {"k": "v"} and a[0].name == "s"
        assert [r.version for r in active(a)] == [2]
        assert [r.data for r in schemas.versions("acme/pay ments/b")] == [b"\x00\xff"]
        assert schemas.add("public/default/a", 2, b"{}") == 3  # numbering goes on
        schemas.delete("acme/pay ments/b", force=True)
    with Storage(tmp_path) as storage:  # once: a schema deleted since does not come back
        schemas = SchemaStorage(storage.resources.schemas)
        assert schemas.versions("acme/pay ments/b") == []
        assert [r.version for r in schemas.versions("public/default/a")] == [0, 1, 2, 3]


def test_a_data_directory_without_the_old_table_imports_nothing(tmp_path):
    OldMetadata(tmp_path / "metadata.db", bootstrap=True).close()
    with Storage(tmp_path) as storage:
        assert storage.metadata_store.exists(marker_path("schemas"))
        assert storage.metadata_store.get_children("/schemas") == []
