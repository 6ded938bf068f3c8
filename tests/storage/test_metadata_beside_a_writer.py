"""A read-only ``Storage`` beside the writer (what a ``compact-topic`` job opens) reads the ledger
lists and cursors the writer keeps in the metadata store, on the embedded store and on ZooKeeper;
and the writer's topics, cursors and policies survive its restart."""

from __future__ import annotations

import threading
import uuid

import pytest

from compactmq.storage import COMPACTION_CURSOR, RETENTION_TIME_MINUTES, Position

T = "persistent://public/default/beside"


@pytest.fixture(params=["embedded", "zk"])
def url(request):
    if request.param == "embedded":
        return ""
    return f"zk:{request.getfixturevalue('zookeeper').hosts}/s{uuid.uuid4().hex[:12]}"


def test_a_reader_beside_the_writer_sees_its_ledgers_and_cursors(open_storage, url):
    conf = {"metadataStoreUrl": url, "managedLedgerMaxEntriesPerLedger": 3}
    writer = open_storage(**conf)
    ml = writer.open_managed_ledger(T)
    positions = [ml.append(b"%d" % i) for i in range(7)]  # ledgers of 3, 3 and the current one
    sub = ml.open_cursor("sub", True, "earliest")
    sub.ack_cumulative(positions[4])
    reader = open_storage(read_only=True, **conf)
    seen = reader.topic_metadata.ledgers(T)
    assert [i.entry_count for i in seen[:2]] == [3, 3] and seen[-1].state == "OPEN"
    # the first write of a cursor is never held back; later ones may be, until the writer closes
    assert reader.topic_metadata.get_cursor(T, "sub") is not None
    ro = reader.open_managed_ledger(T, create=False)
    assert [d for _, d in ro.read_entries(positions[0], 10)] == [b"%d" % i for i in range(7)]
    # the job holds the ledgers it reads with __compaction, written at once from a read-only process
    assert ro.hold_for_compaction()
    assert writer.topic_metadata.get_cursor(T, COMPACTION_CURSOR).mark_delete == Position(positions[0][0], -1)
    writer.policies.set_topic_policy(T, RETENTION_TIME_MINUTES, 5)
    assert reader.policies.effective_policy(T, RETENTION_TIME_MINUTES, 0) == 5
    ml.close()  # the writer closes the topic: the held-back position is written
    assert reader.topic_metadata.get_cursor(T, "sub").mark_delete == positions[4]
    writer.close()
    again = open_storage(**conf)  # the writer restarts on the same store
    ml = again.open_managed_ledger(T)
    assert ml.get_cursor("sub").mark_delete_position == positions[4]
    assert [d for _, d in ml.read_entries(positions[0], 10)] == [b"%d" % i for i in range(7)]
    assert again.policies.get_topic_policies(T) == {RETENTION_TIME_MINUTES: 5}
    assert again.topics() == [T]


def test_appends_and_acks_within_the_rate_never_reach_the_store(open_storage):
    """Publishing never writes (or reads) metadata: ledger rollover and cursor positions are off
    the per-message path, so the embedded default is no slower to publish than before."""
    # one cursor write per 1000 s: however slow this machine, the acks below share one interval
    storage = open_storage(managedLedgerSyncData=False, managedLedgerDefaultMarkDeleteRateLimit=0.001)
    ml = storage.open_managed_ledger(T)
    sub = ml.open_cursor("sub", True, "earliest")  # created: written at once
    store = storage.metadata_store
    calls = []
    # counted on this thread, the publishing path; the seal-request watcher's thread polls the
    # store every 0.1 s (storage/seal.py), which a slow machine lets fall inside the loops below
    here = threading.get_ident()

    def counted(real, name):
        def call(*a, **k):
            if threading.get_ident() == here:
                calls.append(name)
            return real(*a, **k)

        return call

    for name in ("get", "put", "commit", "delete", "exists", "get_children"):
        setattr(store, name, counted(getattr(store, name), name))
    positions = [ml.append(b"m%d" % i) for i in range(2000)]
    assert calls == []
    sub.ack_individual(positions[:1000])
    for p in positions[1000:]:
        sub.ack_individual([p])
    assert calls == []
    ml.close()  # the current ledger is sealed, and the held-back position written, now
    assert calls.count("put") == 2
    assert storage.topic_metadata.get_cursor(T, "sub").mark_delete == positions[-1]
