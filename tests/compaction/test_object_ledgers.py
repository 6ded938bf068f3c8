"""Compaction of topics whose ledgers live in the object store (``objectLedgerStorageUrl``).

The plan names each sealed ledger by where another process reads it (``ManagedLedger.ledger_url``:
``ObjectLedgerStorage.location``, the URI of the ledger's merged object), and phase one and two
read it through ``pyarrow.fs`` as they read an offloaded ledger. The merged object holds the
ledger's bytes exactly as a local ledger file does (header, records), so the tasks' reader
(``tasks.load_live``, a scan when the index is not a local file) needs no other format: shown
here on ``file://`` (default run) and on SeaweedFS; the whole Spark run over SeaweedFS is
``spark``.
"""

from __future__ import annotations

import pytest

from compactmq.compaction import tasks
from compactmq.compaction.plan import LIVE, Segment
from compactmq.config import load_config
from compactmq.storage import Storage

from . import entries as E

TOPIC = "persistent://public/default/object-ledgers"
SMALL = {"managedLedgerSyncData": False, "managedLedgerMaxEntriesPerLedger": 15}


def _store_url(request, tmp_path) -> str:
    if request.param == "file":
        return f"file://{tmp_path}/objects"
    seaweedfs = request.getfixturevalue("seaweedfs")
    bucket = seaweedfs.create_bucket("compaction-object-ledgers")
    return f"s3://{bucket}/{tmp_path.name}?region=us-east-1&endpoint={seaweedfs.endpoint}"


@pytest.fixture(params=["file", pytest.param("seaweedfs", marks=pytest.mark.integration)])
def store_url(request, tmp_path):
    return _store_url(request, tmp_path)


def _history(n: int) -> list[bytes]:
    return [E.single(f"k{i % 7}", b"v%d" % i) for i in range(n)] + [E.single("k0", b"")]


def test_the_tasks_read_a_sealed_object_ledger_by_its_uri(tmp_path, store_url):
    config = load_config(overrides={**SMALL, "objectLedgerStorageUrl": store_url})
    with Storage(tmp_path / "data", config) as st:
        ml = st.open_managed_ledger(TOPIC)
        history = _history(40)
        for at in range(0, len(history), 15):  # three sealed ledgers
            ml.append_many(history[at : at + 15])
            ml.rollover()
        sealed = [info for info in ml.ledgers() if info.entry_count > 0]
        assert len(sealed) >= 3
        for info in sealed:
            url = ml.ledger_url(info.ledger_id)
            assert "://" in url and "/m-" in url  # the merged object, not a local path
            seg = Segment(0, info.ledger_id, LIVE, url, None, 0, info.entry_count - 1, info.entry_count)
            buf, ids, offs, lens = tasks.load_live(seg)
            got = [bytes(buf[o : o + n]) for o, n in zip(offs, lens)]
            want = [e for _, e in ml.read_entries((info.ledger_id, 0), info.entry_count)]
            assert list(ids) == list(range(info.entry_count)) and got == want


@pytest.mark.spark
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_a_spark_run_compacts_object_ledgers_on_seaweedfs(tmp_path, seaweedfs, spark):
    from compactmq.compaction.jobs import SparkCompactionService

    bucket = seaweedfs.create_bucket("compaction-object-ledgers-spark")
    url = f"s3://{bucket}/{tmp_path.name}?region=us-east-1&endpoint={seaweedfs.endpoint}"
    config = load_config(overrides={**SMALL, "objectLedgerStorageUrl": url, "compactionDirectIO": False})
    with Storage(tmp_path / "data", config) as st:
        ml = st.open_managed_ledger(TOPIC)
        history = _history(50)
        for at in range(0, len(history), 15):
            ml.append_many(history[at : at + 15])
            ml.rollover()
        service = SparkCompactionService(st, TOPIC, st.config)
        assert service.compact().horizon is not None
        got = dict(E.decode(b)[1][0][1:3] for _, b in service.read_compacted_entries((0, 0), 1000))
        # keep-latest of k{i % 7} = v{i} for i < 50, then k0's tombstone
        assert got == {f"k{k}": b"v%d" % max(i for i in range(50) if i % 7 == k) for k in range(1, 7)}


def test_the_view_lives_beside_the_ledgers_and_the_next_owner_finds_it(tmp_path):
    """With ledgers in the object store the run writes its view there too (a manifest and its
    parts, named by a catalog row in the metadata store): another broker's storage -- another
    data directory, the same metadata and object store -- reads it by URI and its next run
    replaces it, deleting the previous view's objects."""
    import os

    from compactmq.compaction import tiered
    from compactmq.compaction.compacted_ledger import compacted_ledger_path
    from compactmq.compaction.runner import CompactionRunner
    from compactmq.compaction.state import states_of
    from compactmq.storage.offload import open_store

    from .test_state import DeposingEngine

    store = tmp_path / "objects"
    config = load_config(
        overrides={
            **SMALL,
            "objectLedgerStorageUrl": f"file://{store}",
            "metadataStoreUrl": f"memory:{tmp_path.name}",
            "compactionDirectIO": False,
        }
    )
    with Storage(tmp_path / "a", config) as first:
        ml = first.open_managed_ledger(TOPIC)
        ml.append_many(_history(20))
        old = CompactionRunner(first, TOPIC, config, DeposingEngine()).run().compacted_ledger_id
        assert not os.path.exists(compacted_ledger_path(first.data_dir, TOPIC, old))
        where = tiered.compacted_location(first, TOPIC, old)
        rec = first.offloader.compacted_record(old)
        assert "://" in where and rec is not None and rec.location == first.object_store.location
    with Storage(tmp_path / "b", config) as second:  # the next owner
        assert tiered.compacted_location(second, TOPIC, old) == where
        second.open_managed_ledger(TOPIC).append_many(_history(3))
        new = CompactionRunner(second, TOPIC, config, DeposingEngine()).run().compacted_ledger_id
        assert states_of(second).get(TOPIC).compacted_ledger_id == new != old
        keys = open_store(second.object_store.location).list("compacted")
        assert keys and not [k for k in keys if k.startswith(rec.index_key)]  # the old view's objects
        assert second.offloader.compacted_record(old) is None


def test_only_the_owner_judges_a_view_row_not_committed_yet(tmp_path):
    """Cluster mode: a run adds its view's catalog row just before its commit, holding a lock
    local to its own data directory. Another broker's clean-up (``delete_dead`` at its start)
    must not take that row for dead and delete the objects the commit is about to name: a
    broker judges view rows of the topics it owns only."""
    from compactmq.compaction import tiered
    from compactmq.compaction.runner import CompactionRunner
    from compactmq.storage.resources.fence import lost_fence

    from .test_state import DeposingEngine

    config = load_config(
        overrides={
            **SMALL,
            "objectLedgerStorageUrl": f"file://{tmp_path}/objects",
            "metadataStoreUrl": f"memory:{tmp_path.name}",
        }
    )
    with Storage(tmp_path / "owner", config) as owner:
        tiered.attach(owner)
        owner.open_managed_ledger(TOPIC).append_many(_history(5))
        CompactionRunner(owner, TOPIC, config, DeposingEngine()).run()
        # the owner's next run, between its upload and its commit: its row names view 999
        loc = tiered.store_location(owner, TOPIC)
        prefix = tiered.new_view_prefix(TOPIC, 999)
        record, _ = tiered.write_view_manifest(owner, TOPIC, loc, prefix, 999, [])
        owner.offloader.catalog.add(record)
        with Storage(tmp_path / "other", config) as other:
            other.fence_provider = lambda topic: lost_fence(topic)  # not its topic
            tiered.attach(other)
            other.offloader.delete_dead()
            assert tiered.sweep_all_view_orphans(other) == []
            assert other.offloader.compacted_record(999) is not None
        assert owner.offloader.compacted_record(999) is not None
        owner.offloader.delete_dead()  # the owner (single node here: it owns every topic) may
        assert owner.offloader.compacted_record(999) is None
