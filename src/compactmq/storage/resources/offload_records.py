"""Offload records: which objects in object storage hold which ledger (tiered storage).

::

    /compactmq/offload/instance                                {"id"}: this store's object-key prefix
    /compactmq/offload/topics/{tenant}/{ns}/{domain}/{topic}/{kind}-{ledger id:020d}   the record
    /compactmq/offload/ledgers/{kind}-{ledger id:020d}         {"topic"}: the index by ledger id

``kind`` is ``ledger`` (a sealed ledger of the topic) or ``compacted`` (a compacted ledger).
Pulsar keeps a ledger's offload context (the object's uid, driver and its metadata) inside the
managed-ledger info, beside the ledger's other facts; ours is a resource of its own, because a
compacted ledger is not in the topic's ledger list and because the ledger list moves to the
resources on its own schedule. A record names the object pair (``data_key``, ``index_key``), the
location (``OffloadLocation`` JSON: a driver, a bucket or URI, a prefix; never credentials), the
data size, when it was offloaded and when the local copy was deleted.

A record and its index entry are created together in one commit with ``NEW`` expected versions:
a ledger has at most one record, and a second offload of it (a race) fails with ``BadVersion``,
which the offloader handles by deleting the objects it just wrote. Deleting goes the same way
(both keys in one commit). ``put_ops`` hands out the two creations so that a caller can fold them
into a commit of its own (a compaction commit, once compaction state is a resource of the same
store).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from ...errors import MetadataError, NotFound
from ...naming import TopicName
from ..metadata_store import NEW, BadVersion, Delete, KeyNotFound, Put
from .base import BaseResources, Json, dumps, encode_segment

OFFLOAD_ROOT = "/compactmq/offload"
INSTANCE_PATH = f"{OFFLOAD_ROOT}/instance"
KINDS = ("ledger", "compacted")


def _name(kind: str, ledger_id: int) -> str:
    if kind not in KINDS:
        raise MetadataError(f"offload record kind {kind!r}: expected one of {', '.join(KINDS)}")
    return f"{kind}-{int(ledger_id):020d}"


def topic_dir(topic: str) -> str:
    tn = TopicName.parse(topic)
    return "/".join(
        (f"{OFFLOAD_ROOT}/topics", encode_segment(tn.tenant), encode_segment(tn.namespace), tn.domain,
         encode_segment(tn.local_name))
    )  # fmt: skip


def record_path(topic: str, kind: str, ledger_id: int) -> str:
    return f"{topic_dir(topic)}/{_name(kind, ledger_id)}"


def index_path(kind: str, ledger_id: int) -> str:
    return f"{OFFLOAD_ROOT}/ledgers/{_name(kind, ledger_id)}"


class OffloadRecordResources(BaseResources):
    """Records as JSON objects with at least ``topic``, ``kind`` and ``ledger_id``."""

    def instance_id(self, new_id: str | None = None) -> str:
        """The object-key prefix of the data kept in this store, created once (``new_id``, or a
        fresh ``compactmq-<16 hex>``) by whoever asks first."""
        for _ in range(2):
            got = self._read(INSTANCE_PATH)
            if got is not None:
                return str(got[0]["id"])
            try:
                self.store.put(
                    INSTANCE_PATH, dumps({"id": new_id or f"compactmq-{uuid.uuid4().hex[:16]}"}), NEW
                )
            except BadVersion:
                continue  # another process made it first: read theirs
        got = self._read(INSTANCE_PATH)
        if got is None:
            raise MetadataError(f"{INSTANCE_PATH} was created and deleted meanwhile")
        return str(got[0]["id"])

    def put_ops(self, record: Json) -> list[Put]:
        """The two creations of ``record`` (its key and its index entry), for one commit."""
        topic, kind, ledger_id = record["topic"], record["kind"], record["ledger_id"]
        return [
            Put(record_path(topic, kind, ledger_id), dumps(record), NEW),
            Put(index_path(kind, ledger_id), dumps({"topic": topic}), NEW),
        ]

    def add(self, record: Json) -> None:
        """Create ``record``; ``BadVersion`` when the ledger already has one."""
        self.store.commit(self.put_ops(record))

    def get(self, kind: str, ledger_id: int) -> Json | None:
        index = self._read(index_path(kind, ledger_id))
        if index is None:
            return None
        got = self._read(record_path(index[0]["topic"], kind, ledger_id))
        return None if got is None else got[0]

    def for_topic(self, topic: str, kind: str) -> list[Json]:
        prefix = _name(kind, 0)[: len(kind) + 1]
        base = topic_dir(topic)
        out = []
        for child in self.store.get_children(base):
            if child.startswith(prefix):
                got = self._read(f"{base}/{child}")
                if got is not None:
                    out.append(got[0])
        return out

    def all(self) -> Iterator[Json]:
        """Every record (through the index: one read per record)."""
        for child in self.store.get_children(f"{OFFLOAD_ROOT}/ledgers"):
            kind, _, ledger_id = child.partition("-")
            if kind in KINDS and ledger_id.isdigit():
                record = self.get(kind, int(ledger_id))
                if record is not None:
                    yield record

    def update(self, kind: str, ledger_id: int, changes: Json) -> None:
        """Set fields of an existing record (no-op when it is gone)."""
        index = self._read(index_path(kind, ledger_id))
        if index is None:
            return
        try:
            self._update(
                record_path(index[0]["topic"], kind, ledger_id), lambda r: {**r, **changes}, "record"
            )
        except NotFound:
            pass  # removed meanwhile

    def remove(self, topic: str, kind: str, ledger_id: int) -> None:
        """Delete the record and its index entry (no-op when already gone)."""
        for _ in range(2):
            paths = (record_path(topic, kind, ledger_id), index_path(kind, ledger_id))
            ops = [Delete(path) for path in paths if self.store.exists(path)]
            if not ops:
                return
            try:
                self.store.commit(ops)
                return
            except KeyNotFound:
                continue  # another process removed some of it meanwhile: look again
