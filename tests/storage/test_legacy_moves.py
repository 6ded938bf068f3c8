"""The one-time import of the old tables of grants, schemas and offload records.

Each old data directory is written in the test with the old API (what main wrote before the
move), then opened by today's ``Storage``."""

from __future__ import annotations

from compactmq.auth.authorization import AuthorizationService
from compactmq.config import load_config
from compactmq.storage.engine import Storage
from storage.old_metadata import MetadataStore as OldMetadata  # tests/ is on sys.path
from compactmq.storage.resources.legacy_import import marker_path
from compactmq.storage.offload import LEDGER, OffloadLocation, open_store
from compactmq.storage.position import LedgerInfo
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
        authz = AuthorizationService(cfg, storage.resources)
        assert authz.can_produce("alice", T) and authz.can_consume("bob", T)
        assert not authz.can_consume("bob", T, "billing")
        authz.revoke_namespace_permission("acme/orders", "alice")
    # once: the revoked grant does not come back from the old table at the next start
    with Storage(tmp_path) as storage:
        authz = AuthorizationService(cfg, storage.resources)
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


# the offload catalog's tables as main created them before the move (storage/offload/catalog.py)
OLD_OFFLOAD_TABLES = [
    """CREATE TABLE IF NOT EXISTS offloaded_objects (
    data_key TEXT PRIMARY KEY, index_key TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('ledger', 'compacted')), topic TEXT NOT NULL,
    ledger_id INTEGER NOT NULL, location TEXT NOT NULL, data_size INTEGER NOT NULL,
    offloaded_ms INTEGER NOT NULL, local_deleted_ms INTEGER)""",
    "CREATE INDEX IF NOT EXISTS offloaded_by_ledger ON offloaded_objects(ledger_id)",
    "CREATE TABLE IF NOT EXISTS offload_instance (id TEXT NOT NULL)",
]
INSTANCE = "compactmq-00000000deadbeef"
TOPIC = "persistent://public/default/tiered"


def test_offload_records_are_imported_so_their_objects_are_no_orphans(tmp_path):
    """An old data directory with an offloaded ledger: after the import the records name its
    objects (the orphan sweep at start keeps them), under the old instance's prefix."""
    data = tmp_path / "data"
    data.mkdir()
    conf = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": f"file://{tmp_path}/offload"}
    loc = OffloadLocation("filesystem", f"file://{tmp_path}/offload", prefix=INSTANCE)
    old = OldMetadata(data / "metadata.db", bootstrap=True)
    old.create_topic(TOPIC)
    lid = old.add_ledger(TOPIC, 1000)
    old.add_ledger(TOPIC, 2000, close=LedgerInfo(lid, 3, 30, 1000, 1001, "CLOSED", 1000, 2000))
    rows = [  # an older object of the same ledger (superseded: the newest one counts), then the newest
        (f"ledgers/t/{lid:012d}-old.data", f"ledgers/t/{lid:012d}-old.index", 5000, None),
        (f"ledgers/t/{lid:012d}-new.data", f"ledgers/t/{lid:012d}-new.index", 6000, 7000),
    ]
    store = open_store(loc)
    with old.transaction() as db:
        for ddl in OLD_OFFLOAD_TABLES:
            db.execute(ddl)
        db.execute("INSERT INTO offload_instance(id) VALUES (?)", (INSTANCE,))
        for data_key, index_key, offloaded_ms, deleted_ms in rows:
            db.execute(
                "INSERT INTO offloaded_objects VALUES (?, ?, 'ledger', ?, ?, ?, 30, ?, ?)",
                (data_key, index_key, TOPIC, lid, loc.to_json(), offloaded_ms, deleted_ms),
            )
            store.put(data_key, [b"d"])
            store.put(index_key, [b"i"])
    old.close()
    with Storage(data, load_config(overrides=conf)) as storage:
        assert storage.metadata_store.exists(marker_path("offload-records"))
        assert storage.offloader.instance == INSTANCE
        rec = storage.offloader.catalog.get(LEDGER, lid)
        assert (rec.data_key, rec.topic, rec.location, rec.offloaded_ms, rec.local_deleted_ms) == (
            rows[1][0],
            TOPIC,
            loc,
            6000,
            7000,
        )
        assert storage.offloader.catalog.for_topic(TOPIC) == {lid: rec}
        # swept at start: the superseded object, which no record names any more; the named pair stays
        assert set(store.list("ledgers")) == {rows[1][0], rows[1][1]}
