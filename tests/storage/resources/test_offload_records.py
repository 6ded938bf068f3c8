"""Offload records over every store (the real ZooKeeper included): one record per ledger and
kind, found by ledger id and by topic, created and removed with their index entry."""

from __future__ import annotations

import pytest

from compactmq.storage.metadata_store import BadVersion
from compactmq.storage.offload import COMPACTED, LEDGER, OffloadCatalog, OffloadLocation, OffloadRecord

T = "persistent://acme/pay:ments/orders"
LOC = OffloadLocation("filesystem", "file:///tmp/offload", prefix="compactmq-0123456789abcdef")


def rec(kind: str, ledger_id: int, topic: str = T, key: str | None = None) -> OffloadRecord:
    key = key or f"ledgers/{ledger_id:012d}-x.data"
    return OffloadRecord(
        key, key.replace(".data", ".index"), kind, topic, ledger_id, LOC, 100 + ledger_id, 1000
    )


def test_records_by_ledger_and_by_topic(resources, store):
    alive: set[tuple[str, int]] = set()
    catalog = OffloadCatalog(resources.offload_records, lambda r: (r.kind, r.ledger_id) in alive)
    a, b, c = rec(LEDGER, 7), rec(LEDGER, 9), rec(COMPACTED, 8, key="compacted/v8.compacted")
    other = rec(LEDGER, 11, topic="persistent://acme/other/t")
    for r in (a, b, c, other):
        catalog.add(r)
    with pytest.raises(BadVersion):  # a ledger has one record
        catalog.add(rec(LEDGER, 7, key="ledgers/again.data"))
    assert catalog.get(LEDGER, 7) == a and catalog.get(COMPACTED, 8) == c and catalog.get(LEDGER, 8) is None
    assert catalog.for_topic(T) == {7: a, 9: b} and catalog.for_topic(T, COMPACTED) == {8: c}
    assert store.exists("/compactmq/offload/ledgers/ledger-00000000000000000007")
    assert store.get_children("/compactmq/offload/topics/acme") == ["other", "pay%3Aments"]
    assert catalog.known_keys() == {k for r in (a, b, c, other) for k in (r.data_key, r.index_key)}
    assert catalog.locations() == {LOC}
    catalog.mark_local_deleted(a, 5000)
    assert catalog.get(LEDGER, 7).local_deleted_ms == 5000
    alive.update({(LEDGER, 9), (COMPACTED, 8)})
    assert sorted(r.ledger_id for r in catalog.dead()) == [7, 11]
    assert [r.ledger_id for r in catalog.dead(T)] == [7]
    catalog.remove(catalog.get(LEDGER, 7))
    catalog.remove(a)  # twice is fine
    assert catalog.get(LEDGER, 7) is None and 7 not in catalog.for_topic(T)
    assert not store.exists("/compactmq/offload/ledgers/ledger-00000000000000000007")


def test_the_instance_id_is_made_once(resources):
    first = resources.offload_records.instance_id()
    assert first.startswith("compactmq-") and len(first) == len("compactmq-") + 16
    assert resources.offload_records.instance_id("compactmq-other") == first
