"""The one-time import of the old tables of grants, schemas and offload records.

``legacy_import`` brings tenants, namespaces and partitioned topics over from the old SQLite
tables; this module adds the kinds whose callers moved to the resources after them, with the same
rules (a marker key per kind under ``/compactmq/legacy-import``, written in the commit of the
kind's last keys; keys already in the store are never overwritten; a concurrent importer makes
ours lose with ``BadVersion`` and look again):

``grants``           the namespace policy ``auth_policies`` of the old ``policies`` table, merged
                     into the namespace's Policies value (configuration store) unless that value
                     already has grants of its own;
``schemas``          every version of the old ``schemas`` table, deletion markers included, as
                     ``SchemaResources`` keys (local store);
``offload-records``  the rows of the old ``offloaded_objects`` table and the ``offload_instance``
                     id, as ``OffloadRecordResources`` keys (local store).

Seal requests are not imported: a request lives only while the job that filed it waits for an
answer, and a job started before the upgrade polls the old table; it gives up after its timeout
and compacts the sealed ledgers only, as it would with a broker that hung.

The old tables are read through ``metadata_store.legacy_tables`` (the SQL stays beside the
embedded store's implementation) and through the old store's public methods; they are never
written.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Protocol

from ...errors import MetadataError
from ..metadata_store import MAX_VALUE_SIZE, NEW, BadVersion, MetadataStore, Put, legacy_tables
from .base import Json, dumps, loads
from .grants import AUTH_POLICIES, normalized
from .legacy_import import ATTEMPTS, Kind, _batches, import_legacy, marker_path
from .offload_records import INSTANCE_PATH, KINDS, index_path, record_path
from .schema_keys import schema_path, version_path
from .tenants import namespace_path

log = logging.getLogger(__name__)

GRANTS = "grants"


class LegacyPolicies(Protocol):
    """What the grants' import reads of the old tables (``metadata_store.legacy_tables.LegacyTables``)."""

    def namespaces(self, tenant: str | None = None) -> list[str]: ...
    def get_namespace_policies(self, namespace: str) -> dict[str, Any]: ...


def import_moved(old: Any, local: MetadataStore, configuration: MetadataStore) -> list[str]:
    """Import every moved kind not imported yet; returns the names of those imported now."""
    done = []
    if _import_grants(old, configuration):
        done.append(GRANTS)
    done += import_legacy(old, local, LOCAL_KINDS)
    return done


def _schemas(old: Any) -> Iterator[tuple[str, Json]]:
    from ..schemas import SchemaRecord, record_value, schema_topic

    for sid, versions in legacy_tables.schema_rows(old).items():
        try:
            topic = schema_topic(sid)
        except MetadataError as e:  # never written by compactmq: say so, import the others
            log.error("not importing the schemas of %r: %s", sid, e)
            continue
        yield schema_path(topic), {"latest": versions[-1]["version"]}  # the locator before its children
        for v in versions:
            value = record_value(SchemaRecord(**v))
            if len(dumps(value)) > MAX_VALUE_SIZE:  # the store refuses it: a start must not fail
                log.error(
                    "not importing version %d of schema %s: over %d bytes", v["version"], sid, MAX_VALUE_SIZE
                )
                continue
            yield version_path(topic, v["version"]), value


def _offload_records(old: Any) -> Iterator[tuple[str, Json]]:
    instance = legacy_tables.offload_instance_id(old)
    if instance is not None:  # the prefix the old objects were written under, before anything new
        yield INSTANCE_PATH, {"id": instance}
    newest: dict[tuple[str, int], Json] = {}
    for row in legacy_tables.offload_rows(old):  # oldest first: a ledger keeps its newest object
        if row["kind"] in KINDS:
            newest[(row["kind"], row["ledger_id"])] = row
    for (kind, ledger_id), row in sorted(newest.items()):
        yield record_path(row["topic"], kind, ledger_id), row
        yield index_path(kind, ledger_id), {"topic": row["topic"]}


SCHEMAS = Kind("schemas", _schemas)
OFFLOAD_RECORDS = Kind("offload-records", _offload_records)
#: the kinds kept in the local metadata store, in import order
LOCAL_KINDS: tuple[Kind, ...] = (SCHEMAS, OFFLOAD_RECORDS)


def _grant_puts(old: LegacyPolicies, store: MetadataStore) -> list[Put]:
    """Puts (compare-and-set on the namespace value's version) adding the old grants."""
    puts = []
    for namespace in old.namespaces():
        grants = (old.get_namespace_policies(namespace) or {}).get(AUTH_POLICIES)
        if not grants:
            continue
        path = namespace_path(namespace)
        got = store.get(path)
        if got is None:  # deleted in the store since the namespaces were imported
            continue
        value = loads(got.value, path)
        if AUTH_POLICIES in value:  # the store's own grants win
            continue
        value[AUTH_POLICIES] = normalized(grants)
        puts.append(Put(path, dumps(value), got.stat.version))
    return puts


def _import_grants(old: LegacyPolicies, store: MetadataStore) -> bool:
    marker = marker_path(GRANTS)
    for _ in range(ATTEMPTS):
        if store.exists(marker):
            return False
        puts = _grant_puts(old, store)
        count = len(puts)
        puts.append(Put(marker, dumps({"imported": count}), NEW))
        try:
            for batch in _batches(puts):
                store.commit(batch)
        except BadVersion:
            continue  # a namespace changed or another process imported meanwhile: look again
        if count:
            log.info("imported the grants of %d namespaces from the old metadata tables", count)
        return True
    raise BadVersion(f"legacy import of {GRANTS}: still contended after {ATTEMPTS} attempts")
