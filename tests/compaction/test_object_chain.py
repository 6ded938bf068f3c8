"""Chained compacted views in the object store (``compaction.object_chain``), on SeaweedFS with a
SQLite metadata store shared by two storages (two brokers' data directories).

A run of a topic whose ledgers live in the object store writes its view there as a chain: an
incremental run uploads only its new segment, its new sidecar rows and a small manifest, not the
whole view again. Readers see the reference compaction's rows after incremental runs, after a
merge, and on another broker that took the topic over (and extends the chain); a run whose
commit is refused leaves nothing referenced and its uploads are gone; a run that lost its
ownership fence mid-run commits nothing. Runs use the in-process engine (no JVM).
"""

from __future__ import annotations

import uuid

import pytest

from compactmq.compaction import chain, load_factory, object_chain, tiered
from compactmq.compaction.compacted_ledger import CompactedLedgerReader
from compactmq.compaction.entry_scan import hash_key_py
from compactmq.compaction.runner import CompactionRunner
from compactmq.compaction.jobs.inprocess import InProcessEngine
from compactmq.compaction.state import states_of
from compactmq.config import load_config
from compactmq.storage.resources.compaction_state import StaleCompaction
from compactmq.storage import Storage
from compactmq.storage.offload import open_store
from compactmq.storage.offload.blocks import shared_cache
from compactmq.storage.metadata_store import Check
from compactmq.storage.resources.fence import Fence, Fenced

from storage.metadata_store.zk_server import zookeeper  # noqa: F401  (tests/ is on sys.path)

from . import entries as E

pytestmark = pytest.mark.integration

TOPIC = "persistent://public/default/object-chain"
KEYS = 2000
VALUE = 200


def _config(tmp_path, seaweedfs, metadata="sqlite:metadata.db", **extra):
    """Ledgers and views in SeaweedFS; metadata in the data directory's SQLite file, or the
    ``metadata`` store (ZooKeeper) two brokers share."""
    bucket = seaweedfs.create_bucket("object-chain")
    url = f"s3://{bucket}/{tmp_path.name}?region=us-east-1&endpoint={seaweedfs.endpoint}"
    overrides = {
        "managedLedgerSyncData": False,
        "objectLedgerStorageUrl": url,
        "metadataStoreUrl": metadata,
        "compactionDirectIO": False,
        **extra,
    }
    return load_config(overrides=overrides)


class Writer:
    """Publishes ``k<i>`` keys with ``VALUE``-byte values and keeps what keep-latest leaves."""

    def __init__(self) -> None:
        self.latest: dict[str, bytes] = {}
        self.n = 0

    def publish(self, storage, keys) -> None:
        batch = []
        for k in keys:
            value = (b"%d:" % self.n).ljust(VALUE, b"x")
            self.n += 1
            batch.append(E.single(f"k{k}", value))
            self.latest[f"k{k}"] = value
        ml = storage.open_managed_ledger(TOPIC)
        ml.append_many(batch)
        ml.rollover()


def _compact(storage, config, engine=None):
    return CompactionRunner(storage, TOPIC, config, engine or InProcessEngine()).run()


def _rows(storage, config) -> dict:
    factory = load_factory(config, storage)
    service = factory.new_service(TOPIC)
    try:
        out = {}
        for _, entry in service.read_compacted_entries((-1, -1), 10**9):
            for _, key, payload, *_ in E.decode(entry)[1]:
                out[key] = payload
        return out
    finally:
        service.close()
        factory.close()


def _key_index(storage, config):
    """The latest-value / TableView lookup index of the view in force: where it came from, and
    the key hashes of its live keys."""
    factory = load_factory(config, storage)
    service = factory.new_service(TOPIC)
    try:
        index = service.open_view().key_index()
        return index.source, len(index), [index.find(*hash_key_py(k.encode())) for k in ("k0", "k150")]
    finally:
        service.close()
        factory.close()


def _objects(storage) -> dict[str, int]:
    store = open_store(storage.object_store.location)
    return {k: store.size(k) for k in store.list(tiered.STORE_ROOT)}


def _written(before: dict, after: dict) -> int:
    return sum(size for key, size in after.items() if key not in before)


def _view_record(storage):
    view = states_of(storage).get(TOPIC).compacted_ledger_id
    return storage.offloader.compacted_record(view)


def test_incremental_runs_upload_only_what_is_new_and_readers_see_the_reference(tmp_path, seaweedfs):
    config = _config(tmp_path, seaweedfs, compactionChainMaxRuns=4)
    writer = Writer()
    with Storage(tmp_path / "a", config) as st:
        tiered.attach(st)
        writer.publish(st, range(KEYS))
        before = _objects(st)
        first = _compact(st, config)
        first_bytes = _written(before, _objects(st))
        assert first_bytes > KEYS * VALUE
        rec = _view_record(st)
        assert object_chain.is_chain_record(rec)
        chain_prefix = object_chain.chain_prefix(rec)
        assert _rows(st, config) == writer.latest
        for i in range(2):  # incremental (delta) runs: bytes follow the 100 new messages
            writer.publish(st, range(i * 100, i * 100 + 100))
            before = _objects(st)
            engine = Recording()
            _compact(st, config, engine)
            assert engine.deltas == [True]  # only the new messages went through the engine
            after = _objects(st)
            assert _written(before, after) < first_bytes // 10, (i, _written(before, after), first_bytes)
            rec = _view_record(st)
            assert object_chain.chain_prefix(rec) == chain_prefix  # the same chain, extended
            manifest = object_chain.read_manifest(open_store(rec.location), rec.data_key)
            assert manifest.runs == i + 2
            assert _rows(st, config) == writer.latest
            # key lookups read the chained sidecar (files of several runs) from the store
            source, keys, found = _key_index(st, config)
            assert (source, keys) == ("sidecar", KEYS) and None not in found
        # the replaced views' manifests are gone, their segments are still named
        store = open_store(rec.location)
        manifests = [k for k in store.list(chain_prefix) if k.endswith(object_chain.MANIFEST_SUFFIX)]
        assert manifests == [rec.data_key]
        assert first.compacted_ledger_id is not None


def test_a_merge_writes_a_fresh_chain_and_the_old_one_goes_at_the_next_run(tmp_path, seaweedfs):
    config = _config(tmp_path, seaweedfs, compactionChainMaxRuns=2)
    writer = Writer()
    with Storage(tmp_path / "a", config) as st:
        tiered.attach(st)
        writer.publish(st, range(300))
        _compact(st, config)
        old_prefix = object_chain.chain_prefix(_view_record(st))
        writer.publish(st, range(20))
        _compact(st, config)  # run 2 of the chain
        assert object_chain.chain_prefix(_view_record(st)) == old_prefix
        writer.publish(st, range(10, 40))
        before_merge = _rows(st, config)
        pinned = CompactedLedgerReader(tiered.compacted_location(st, TOPIC, _view_record(st).ledger_id))
        _compact(st, config)  # the merge policy: a fresh chain
        new_prefix = object_chain.chain_prefix(_view_record(st))
        assert new_prefix != old_prefix
        assert _rows(st, config) == writer.latest
        store = open_store(st.object_store.location)
        # left for one run (a reader that opened the previous view keeps reading), not named
        assert store.list(old_prefix)
        shared_cache().clear()  # (its bytes come from the store, not from the read cache)
        pinned_rows = {}
        for _, entry in pinned:
            for _, key, payload, *_ in E.decode(bytes(entry))[1]:
                pinned_rows[key] = payload
        assert pinned_rows == before_merge
        writer.publish(st, range(5))
        _compact(st, config)
        assert store.list(old_prefix) == []
        assert _rows(st, config) == writer.latest
        rec = _view_record(st)
        manifest = object_chain.read_manifest(store, rec.data_key)
        for name in manifest.names():  # the view in force names nothing deleted
            assert store.exists(f"{new_prefix}/{name}")


def test_a_new_owner_reads_the_chain_and_extends_it(tmp_path, seaweedfs, zookeeper):
    config = _config(tmp_path, seaweedfs, f"zk:{zookeeper.hosts}/c{uuid.uuid4().hex[:12]}")
    writer = Writer()
    with Storage(tmp_path / "a", config) as first:
        tiered.attach(first)
        writer.publish(first, range(KEYS))
        _compact(first, config)
        writer.publish(first, range(50))
        _compact(first, config)
        prefix = object_chain.chain_prefix(_view_record(first))
    with Storage(tmp_path / "b", config) as second:  # the topic's next owner
        tiered.attach(second)
        assert _rows(second, config) == writer.latest
        writer.publish(second, range(25, 75))
        before = _objects(second)
        view_size = _view_record(second).data_size
        result = _compact(second, config)
        assert _written(before, _objects(second)) < view_size // 10
        rec = _view_record(second)
        assert rec.ledger_id == result.compacted_ledger_id
        assert object_chain.chain_prefix(rec) == prefix
        assert _rows(second, config) == writer.latest


class Recording(InProcessEngine):
    """The in-process engine, remembering whether each run was a lookup run."""

    def __init__(self) -> None:
        super().__init__()
        self.deltas: list[bool] = []

    def run(self, plan, strategy, report):
        self.deltas.append(bool(plan.is_lookup_run))
        return super().run(plan, strategy, report)


class Refused(InProcessEngine):
    """The in-process engine; once its parts are written, ``during()`` runs (a newer owner's
    commit, or the loss of this broker's ownership)."""

    def __init__(self, during) -> None:
        super().__init__()
        self.during = during

    def run(self, plan, strategy, report):
        parts = super().run(plan, strategy, report)
        self.during()
        return parts


def test_a_run_that_loses_its_fence_mid_run_commits_nothing_and_leaves_no_objects(tmp_path, seaweedfs):
    config = _config(tmp_path, seaweedfs)
    writer = Writer()
    with Storage(tmp_path / "a", config) as st:
        st.metadata_store.put("/fence-chain", b"")
        fence = Fence(checks=(Check("/fence-chain", 0),), epoch=2, what="the topic's bundle")
        st.fence_provider = lambda topic: fence  # this broker owns the topic under epoch 2
        tiered.attach(st)
        writer.publish(st, range(300))
        _compact(st, config)
        state = states_of(st).get(TOPIC)
        view = _rows(st, config)
        objects = _objects(st)
        writer.publish(st, range(40))

        def lose():  # another broker takes the bundle while the run is between upload and commit
            st.metadata_store.put("/fence-chain", b"taken")

        with pytest.raises(Fenced):
            _compact(st, config, Refused(lose))
        after = states_of(st).get(TOPIC)
        assert (after.compacted_ledger_id, after.horizon) == (state.compacted_ledger_id, state.horizon)
        assert _objects(st) == objects  # what it uploaded is gone; the view in force is whole
        assert [r.ledger_id for r in st.offloader.catalog.compacted(TOPIC)] == [state.compacted_ledger_id]
        assert _rows(st, config) == view


def test_orphans_of_a_refused_commit_are_not_referenced_and_get_swept(tmp_path, seaweedfs):
    config = _config(tmp_path, seaweedfs)
    writer = Writer()
    with Storage(tmp_path / "a", config) as st:
        tiered.attach(st)
        writer.publish(st, range(300))
        _compact(st, config)
        view = _rows(st, config)
        writer.publish(st, range(40))
        store = open_store(st.object_store.location)
        prefix = object_chain.chain_prefix(_view_record(st))
        leftovers = [
            f"{prefix}/{chain.segment_name(10**9, 0)}",
            f"{prefix}/{object_chain.keys_dir(10**9)}/keys-000000.parquet",
        ]

        def refused():  # a crashed run's uploads, then the state moves on: this commit is refused
            for key in leftovers:
                store.put(key, [b"left by a run that died before its commit"])
            states = states_of(st)
            running = states.get(TOPIC)
            states.record_failure(TOPIC, "interrupted: the owner changed", expected_version=running.version)

        with pytest.raises(StaleCompaction):
            _compact(st, config, Refused(refused))
        rec = _view_record(st)
        named = {f"{prefix}/{n}" for n in object_chain.read_manifest(store, rec.data_key).names()}
        assert not set(leftovers) & named
        assert [k for k in leftovers if store.exists(k)] == leftovers  # not the refused run's own
        assert [r.ledger_id for r in st.offloader.catalog.compacted(TOPIC)] == [rec.ledger_id]
        assert _rows(st, config) == view
        tiered.sweep_view_orphans(st, TOPIC)  # what the owner's next run does first
        assert [k for k in leftovers if store.exists(k)] == []
        _compact(st, config)
        assert _rows(st, config) == writer.latest
