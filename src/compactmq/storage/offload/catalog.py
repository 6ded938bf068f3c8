"""The offload catalog: which objects in object storage hold which ledger, in the metadata store.

One record per committed offloaded object pair (data + index), kept by
``resources.OffloadRecordResources`` (``/compactmq/offload/...``, see there). The order of steps
keeps the store and the objects in agreement -- write the objects, then create the record (the
commit point), and only then delete anything -- except for the short window of a crash, which the
sweeps close:

* an object with no record (a crash after the write, before the record) is an *orphan*: deleted
  by ``LedgerOffloader.sweep_orphans`` at start (ledgers) or by the compaction run holding the
  topic's lock (compacted ledgers);
* a record whose ledger is gone (retention, topic deletion, a superseded compacted ledger, or a
  ledger deleted while its offload was being recorded) is *dead*: its objects are deleted, then
  the record. Deleting the ledger first and the objects after is the "write, commit, delete the
  old" order; a crash in between leaves a dead record that the next sweep finishes.

Whether a ledger is alive is asked of the caller (``alive``): the ledger lists and the compaction
state are not this catalog's to read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..resources.base import Json
from ..resources.offload_records import OffloadRecordResources
from .blobstore import OffloadLocation

LEDGER, COMPACTED = "ledger", "compacted"


@dataclass(frozen=True)
class OffloadRecord:
    data_key: str
    index_key: str
    kind: str
    topic: str
    ledger_id: int
    location: OffloadLocation
    data_size: int
    offloaded_ms: int
    local_deleted_ms: int | None = None


def record_value(rec: OffloadRecord) -> Json:
    value = asdict(rec)
    value["location"] = json.loads(rec.location.to_json())
    return value


def _record(value: Json) -> OffloadRecord:
    fields = dict(value)
    fields["location"] = OffloadLocation.from_json(json.dumps(fields["location"]))
    return OffloadRecord(**fields)


class OffloadCatalog:
    """Records over ``OffloadRecordResources``; ``alive(record)`` says whether its ledger still
    exists (a ledger of the topic, or the topic's compacted ledger in force)."""

    def __init__(self, records: OffloadRecordResources, alive: Callable[[OffloadRecord], bool]):
        self.records = records
        self.alive = alive

    def instance_id(self) -> str:
        return self.records.instance_id()

    def add(self, rec: OffloadRecord) -> None:
        """Record a committed offload; ``BadVersion`` when the ledger already has a record."""
        self.records.add(record_value(rec))

    def get(self, kind: str, ledger_id: int) -> OffloadRecord | None:
        value = self.records.get(kind, ledger_id)
        return None if value is None else _record(value)

    def for_topic(self, topic: str, kind: str = LEDGER) -> dict[int, OffloadRecord]:
        return {r.ledger_id: r for r in map(_record, self.records.for_topic(topic, kind))}

    def mark_local_deleted(self, rec: OffloadRecord, when_ms: int) -> None:
        self.records.update(rec.kind, rec.ledger_id, {"local_deleted_ms": when_ms})

    def remove(self, rec: OffloadRecord) -> None:
        self.records.remove(rec.topic, rec.kind, rec.ledger_id)

    def all(self) -> list[OffloadRecord]:
        return [_record(v) for v in self.records.all()]

    def dead(self, topic: str | None = None) -> list[OffloadRecord]:
        """Ledger records whose ledger no longer exists (compacted records: see ``compacted``)."""
        if topic is None:
            candidates = [r for r in self.all() if r.kind == LEDGER]
        else:
            candidates = list(self.for_topic(topic, LEDGER).values())
        return [r for r in candidates if not self.alive(r)]

    def compacted(self, topic: str | None = None) -> list[OffloadRecord]:
        """Every compacted-ledger record (of ``topic``): the offloader asks the view pointer which
        of them are still in force (the compaction state is not this catalog's to read)."""
        if topic is None:
            return [r for r in self.all() if r.kind == COMPACTED]
        return list(self.for_topic(topic, COMPACTED).values())

    def known_keys(self) -> set[str]:
        return {k for r in self.all() for k in (r.data_key, r.index_key)}

    def locations(self) -> set[OffloadLocation]:
        return {r.location for r in self.all()}
