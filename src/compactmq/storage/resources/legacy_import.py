"""One-time import of the metadata a data directory kept in the old SQLite tables into the resources.

Until this issue, ``metadata.db`` held tenants, namespaces, policies and the rest in tables of its
own. The metadata store now keeps them as versioned keys; this module copies what the old tables
hold into the store once, when a broker starts, so a data directory written by an older compactmq
opens with everything it had. The old tables are only read (``metadata_store.legacy_tables``,
which ``Storage`` opens only when ``metadata.db`` has them; a fresh data directory has none).

The import goes by *kind* (tenants and namespaces, partitioned topics, policies, then topics with
their ledger lists and cursors, and the compaction state of each topic; the rest as their callers
move to the resources). ``CONFIGURATION_KINDS`` go to the configuration store, ``LOCAL_KINDS`` to
the local one. Each kind has a marker key, ``/compactmq/legacy-import/<kind>``. A kind whose
marker exists was imported (or the store was born with it); from then on the store is the only
truth for that kind and the old tables are never read for it again. Each kind is written in one
``commit`` together with its marker, so a crash leaves all of it or none of it. A commit has a size
limit (``MAX_VALUE_SIZE``): a kind too large for one commit is written in several, the marker in
the last; a rerun after a crash between them skips keys already there, so nothing is written twice.

Keys that already exist in the store are never overwritten (``NEW`` expected versions), except by
a *merging* kind: namespace policies become fields of the namespace's existing Policies value,
the fields already there winning, written with the version read. When two processes import at once (brokers sharing ZooKeeper, each with an old data directory), the loser
gets ``BadVersion``, reads the marker again and finds the winner's import.

The old store is read through its public methods only (no SQL here): it is the source, never
written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ..metadata_store import MAX_VALUE_SIZE, NEW, BadVersion, MetadataStore, Put
from ...errors import InvalidTopicName
from ...naming import TopicName
from ..position import LedgerInfo
from .base import Json, dumps, encode_segment, loads
from .compaction_state import compaction_state_path, legacy_state
from .managed_ledgers import managed_ledger_path
from .policies import topic_policies_path
from .tenants import namespace_path, partitioned_topic_path, tenant_path
from .topic_metadata import cursor_json, ledger_json

log = logging.getLogger(__name__)

MARKER_ROOT = "/compactmq/legacy-import"
#: commits lost to a concurrent importer before giving up (each loss means another process wrote)
ATTEMPTS = 5


class LegacyMetadata(Protocol):
    """What the import reads of the old tables (``metadata_store.legacy_tables.LegacyTables``)."""

    def tenants(self) -> list[str]: ...
    def get_tenant(self, name: str) -> dict[str, Any] | None: ...
    def namespaces(self, tenant: str | None = None) -> list[str]: ...
    def partitioned_topics(self, namespace: str | None = None) -> dict[str, int]: ...
    def legacy_compaction_states(self) -> list[dict[str, Any]]: ...
    def get_namespace_policies(self, namespace: str) -> dict[str, Any]: ...
    def get_topic_policies(self, topic: str) -> dict[str, Any]: ...
    def policy_names(self, scope: str) -> list[str]: ...
    def topics(self, namespace: str | None = None) -> list[str]: ...
    def topic_properties(self, topic: str) -> dict[str, Any]: ...
    def ledgers(self, topic: str) -> list[LedgerInfo]: ...
    def load_cursors(self, topic: str) -> list[Any]: ...


@dataclass(frozen=True)
class Kind:
    """One kind of metadata: its name (the marker's) and what it reads from the old tables,
    as ``(path, value)`` pairs in the order they must be created (parents first)."""

    name: str
    read: Callable[[LegacyMetadata], Iterator[tuple[str, Json]]]
    #: merge each value into the key's existing value (existing fields win) instead of skipping it
    merge: bool = False


def _tenants_and_namespaces(old: LegacyMetadata) -> Iterator[tuple[str, Json]]:
    for tenant in old.tenants():
        yield tenant_path(tenant), dict(old.get_tenant(tenant) or {})
    for namespace in old.namespaces():
        # the policies follow with their own kind; a namespace starts with none
        yield namespace_path(namespace), {}


def _partitioned_topics(old: LegacyMetadata) -> Iterator[tuple[str, Json]]:
    for topic, partitions in old.partitioned_topics().items():
        yield partitioned_topic_path(TopicName.parse(topic)), {"partitions": partitions}


def _compaction_states(old: LegacyMetadata) -> Iterator[tuple[str, Json]]:
    for row in old.legacy_compaction_states():
        try:
            topic = TopicName.parse(row["topic"])
        except InvalidTopicName:  # cannot have been compacted by this broker: nothing to keep
            log.warning("not importing the compaction state of %r: not a topic name", row["topic"])
            continue
        if topic.persistent:
            yield compaction_state_path(topic), legacy_state(row)


def _namespace_policies(old: LegacyMetadata) -> Iterator[tuple[str, Json]]:
    for namespace in old.policy_names("namespace"):
        policies = old.get_namespace_policies(namespace)
        if policies:
            yield namespace_path(namespace), dict(policies)


def _topic_policies(old: LegacyMetadata) -> Iterator[tuple[str, Json]]:
    for topic in old.policy_names("topic"):
        policies = old.get_topic_policies(topic)
        if policies:
            yield topic_policies_path(TopicName.parse(topic)), dict(policies)


def _topics(old: LegacyMetadata) -> Iterator[tuple[str, Json]]:
    """Each topic's managed-ledger info (ledgers, properties), then its cursors."""
    for topic in old.topics():
        tn = TopicName.parse(topic)
        if not tn.persistent:
            continue
        ledgers = [ledger_json(li) for li in old.ledgers(topic)]
        yield managed_ledger_path(tn), {"ledgerInfo": ledgers, "properties": old.topic_properties(topic)}
        for rec in old.load_cursors(topic):
            value = cursor_json(rec.mark_delete, rec.acked_ranges, rec.properties, rec.created_ms)
            yield f"{managed_ledger_path(tn)}/{encode_segment(rec.name)}", value


TENANTS_NAMESPACES = Kind("tenants-namespaces", _tenants_and_namespaces)
PARTITIONED_TOPICS = Kind("partitioned-topics", _partitioned_topics)
#: the compaction state of each topic (status, horizon, view pointer, the last run's details):
#: into the LOCAL store, where ``CompactionStateResources`` keeps it
COMPACTION_STATES = Kind("compaction-state", _compaction_states)
NAMESPACE_POLICIES = Kind("namespace-policies", _namespace_policies, merge=True)
TOPIC_POLICIES = Kind("topic-policies", _topic_policies)
TOPICS = Kind("topics-ledgers-cursors", _topics)

#: the kinds whose callers use the resources today (a kind is imported only once its callers
#: moved: until then the old tables stay its truth), in import order
KINDS: tuple[Kind, ...] = (
    TENANTS_NAMESPACES,
    PARTITIONED_TOPICS,
    NAMESPACE_POLICIES,
    TOPIC_POLICIES,
    TOPICS,
    COMPACTION_STATES,
)
#: those of the configuration store (``configurationMetadataStoreUrl``), and of the local one
CONFIGURATION_KINDS = (TENANTS_NAMESPACES, PARTITIONED_TOPICS, NAMESPACE_POLICIES)
LOCAL_KINDS = (TOPIC_POLICIES, TOPICS, COMPACTION_STATES)


def marker_path(kind: str) -> str:
    return f"{MARKER_ROOT}/{kind}"


def import_legacy(old: LegacyMetadata, store: MetadataStore, kinds: tuple[Kind, ...] = KINDS) -> list[str]:
    """Import every kind of ``kinds`` not imported yet; returns the names of those imported now."""
    done = []
    for kind in kinds:
        if _import_kind(old, store, kind):
            done.append(kind.name)
    return done


def _import_kind(old: LegacyMetadata, store: MetadataStore, kind: Kind) -> bool:
    marker = marker_path(kind.name)
    for _ in range(ATTEMPTS):
        if store.exists(marker):
            return False
        puts = _puts(store, kind, kind.read(old))
        count = len(puts)
        puts.append(Put(marker, dumps({"imported": count}), NEW))  # last: in the last commit
        try:
            for batch in _batches(puts):
                store.commit(batch)
        except BadVersion:
            continue  # another process imported (some of) it meanwhile: look again
        if count:
            log.info("imported %d %s keys from the old metadata tables", count, kind.name)
        return True
    raise BadVersion(f"legacy import of {kind.name}: still contended after {ATTEMPTS} attempts")


def _puts(store: MetadataStore, kind: Kind, pairs: Iterator[tuple[str, Json]]) -> list[Put]:
    """The writes that import ``pairs``: new keys created; with ``merge``, existing keys (only
    those: a namespace deleted since is not brought back) get the fields they lack."""
    puts = []
    for path, value in pairs:
        got = store.get(path)
        if not kind.merge:
            if got is None:
                puts.append(Put(path, dumps(value), NEW))
            continue
        if got is None:
            continue
        current = loads(got.value, path)
        merged = {**value, **current}
        if merged != current:
            puts.append(Put(path, dumps(merged), got.stat.version))
    return puts


def _batches(puts: list[Put]) -> Iterator[list[Put]]:
    """``puts`` in commits under the store's size limit (one commit for a usual data directory)."""
    batch: list[Put] = []
    size = 0
    for put in puts:
        if batch and size + len(put.value) > MAX_VALUE_SIZE // 2:
            yield batch
            batch, size = [], 0
        batch.append(put)
        size += len(put.value)
    if batch:
        yield batch
