"""The orphan sweep of shared group objects (``object_group_sweep``) against SeaweedFS and a
real metadata store (SQLite), as the group-flush tests run.

Each crash the sweep is for is made by doing exactly what the crashed process had done (the
object's PUT without its commit; a release without the object's delete); time passing is the
sweep's ``now`` argument. Objects are listed with boto3, not through the code under test.
"""

from __future__ import annotations

import time

import pytest

from compactmq.storage import ledger_file as lf
from compactmq.storage.metadata_store import Delete
from compactmq.storage.object_group_flush import (
    GROUPS_PREFIX,
    RANGES_ROOT,
    GroupFlush,
    _Member,
    group_node,
    member_path,
    record_path,
)
from compactmq.storage.object_group_sweep import ORPHAN_GRACE_S, TOMBSTONE, sweep_orphan_groups
from compactmq.storage.object_ledgers import ObjectLedgerSettings, ObjectLedgerStorage
from compactmq.storage.offload.blobstore import BlobStore
from compactmq.storage.resources.fence import NO_FENCE

BUCKET = "group-sweep"
TOPIC = "persistent://public/default/sweep"


def later() -> float:
    """A moment the grace period has passed for everything written so far. Taken when the
    sweep is called, never at import: in a full run a module's tests start minutes after it was
    imported, and a fixed moment then no longer lies beyond the grace."""
    return time.time() + ORPHAN_GRACE_S + 60


@pytest.fixture
def place(seaweedfs, object_location, sqlite_meta):
    loc = object_location(BUCKET)
    return seaweedfs, loc, sqlite_meta, BlobStore(loc)


def _groups(server, loc) -> list[str]:
    return sorted(
        k.split(f"{loc.prefix}/", 1)[1] for k in server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")
    )


def _committed_ledger(store, meta, ledger_id=5):
    """A real group flush commits one ledger's record; returns (storage, group, object key, bytes)."""
    group = GroupFlush(store, meta, solo=False)  # a lone flush in a shared object too
    st = ObjectLedgerStorage(store, TOPIC, ObjectLedgerSettings(flush_interval_ms=20), epoch=2, group=group)
    w = st.create(ledger_id)
    rec = lf.encode_record_header(0, 1000, b"kept") + b"kept"
    w.write(rec, lf.FILE_HEADER_SIZE)
    w.sync()
    name = w.layout.parts[-1][2]
    w.close()
    key = name.split(":", 4)[4]
    return st, group, key, lf.encode_file_header(ledger_id) + rec


def test_an_object_whose_commit_never_happened_goes_after_the_grace_only(place):
    server, loc, meta, store = place
    dead = f"{GROUPS_PREFIX}/{7:019d}/{1:016d}"  # a process died between the PUT and its commit
    store.put(dead, [b"never committed"])
    assert sweep_orphan_groups(store, meta).deleted == []  # younger than the grace: kept
    assert _groups(server, loc) == [dead]
    result = sweep_orphan_groups(store, meta, now=later())
    assert result.deleted == [dead]
    assert _groups(server, loc) == []
    # its group node stays as a tombstone: the dead process's commit, were it to come now (a
    # broker frozen past the grace, no fence), fails instead of naming the deleted object
    assert meta.get(group_node(dead)).value == TOMBSTONE
    late = GroupFlush(store, meta, incarnation=7)
    m = _Member("persistent/public/default/sweep", 9, 0, 15, 0, b"never committed", NO_FENCE)
    assert late._commit(dead, [m], [0]) == []
    assert "swept" in str(m.error)
    assert meta.get(record_path(m.topic_path, 9, 0, 0)) is None
    # the tombstone goes one grace period after it was made
    assert sweep_orphan_groups(store, meta).nodes_removed == []
    gone = sweep_orphan_groups(store, meta, now=time.time() + ORPHAN_GRACE_S + 60)
    assert gone.nodes_removed == [group_node(dead)]
    assert not meta.exists(group_node(dead))


def test_an_object_a_range_still_names_is_never_swept(place):
    server, loc, meta, store = place
    st, _group, key, data = _committed_ledger(store, meta)
    result = sweep_orphan_groups(store, meta, now=later())
    assert result.deleted == [] and result.nodes_removed == []
    assert _groups(server, loc) == [key]
    fresh = ObjectLedgerStorage(BlobStore(loc), TOPIC, epoch=2, group=GroupFlush(BlobStore(loc), meta))
    assert fresh.read_all(5) == data


def test_a_crash_between_the_last_release_and_the_delete_is_swept(place):
    server, loc, meta, store = place
    st, _group, key, _data = _committed_ledger(store, meta)
    (start, _end, epoch, name), *_ = [r for r in st.shared_ranges(5) if r[0] > 0]
    member = int(name.split(":")[3])
    # what release_parts commits; the process dies before _drop_if_unnamed deletes the object
    meta.commit([Delete(record_path(st.topic_path, 5, start, epoch)), Delete(member_path(key, member))])
    assert meta.get_children(group_node(key)) == []
    assert sweep_orphan_groups(store, meta).deleted == []  # young: kept
    result = sweep_orphan_groups(store, meta, now=later())
    assert result.deleted == [key]
    assert result.nodes_removed == [group_node(key)]  # a real group's node: made long before
    assert _groups(server, loc) == []


def test_the_sweeping_process_never_touches_its_own_group_in_flight(place):
    server, loc, meta, store = place
    own = GroupFlush(store, meta, incarnation=11)
    own._counter = 3  # group 3 is being written now: its PUT done, its commit not yet
    in_flight = f"{GROUPS_PREFIX}/{11:019d}/{3:016d}"
    finished = f"{GROUPS_PREFIX}/{11:019d}/{2:016d}"  # an earlier group whose commit failed
    store.put(in_flight, [b"in flight"])
    store.put(finished, [b"failed commit, failed delete"])
    result = sweep_orphan_groups(store, meta, own=own, now=later())
    assert result.deleted == [finished]
    assert _groups(server, loc) == [in_flight]
    assert not meta.exists(group_node(in_flight))


def test_a_deleted_topics_empty_range_nodes_go_and_a_neighbours_stay(place):
    _server, _loc, meta, store = place
    st, group, _key, _data = _committed_ledger(store, meta)
    other = ObjectLedgerStorage(store, "persistent://public/other/kept", epoch=2, group=group)
    w = other.create(3)
    w.write(b"x" * 10, lf.FILE_HEADER_SIZE)
    w.sync()
    w.close()
    st.delete(5)  # what deleting the topic does to each ledger, then forget_topic
    ranges = f"{RANGES_ROOT}/{st.topic_path}"
    assert meta.exists(ranges)  # the topic's node was left behind before
    group.forget_topic(st.topic_path)
    assert not meta.exists(ranges)
    assert not meta.exists(f"{RANGES_ROOT}/persistent/public/default")
    assert meta.get_children(f"{RANGES_ROOT}/persistent/public") == ["other"]
    assert other.read_all(3)[lf.FILE_HEADER_SIZE :] == b"x" * 10


def test_a_broker_sweeps_from_its_maintenance_and_cleans_up_a_deleted_topic(tmp_path):
    """Storage level over file:// and the memory metadata store: maintenance sweeps an old
    orphan (its file's time set back, as a crash an hour ago would leave it) and keeps the
    groups still named; deleting a topic leaves no empty range nodes behind."""
    import os
    import uuid

    from compactmq.config import load_config
    from compactmq.storage.engine import Storage

    objects = tmp_path / "objects"
    config = load_config(
        overrides={
            "metadataStoreUrl": f"memory:s{uuid.uuid4().hex[:8]}",
            "objectLedgerStorageUrl": f"file://{objects}",
            "objectLedgerGroupFlushEnabled": True,
        }
    )
    s = Storage(tmp_path / "broker", config)
    try:
        topic = "persistent://public/default/swept"
        s._group().solo = False  # the lone append into a shared object too
        ml = s.open_managed_ledger(topic)
        ml.append(b"one")
        named = sorted(p for p in (objects / GROUPS_PREFIX).rglob("*") if p.is_file())
        assert named
        orphan = objects / GROUPS_PREFIX / f"{5:019d}" / f"{1:016d}"
        orphan.parent.mkdir(parents=True)
        orphan.write_bytes(b"died before its commit")
        hour_ago = time.time() - 3600
        for p in [orphan, *named]:
            os.utime(p, (hour_ago, hour_ago))
        s.run_maintenance()
        assert not orphan.exists()
        assert all(p.exists() for p in named)  # still named by the topic's range records
        ranges = f"{RANGES_ROOT}/persistent/public/default/swept"
        assert s.metadata_store.exists(ranges)
        s.delete_managed_ledger(topic)
        assert not s.metadata_store.exists(f"{RANGES_ROOT}/persistent/public")
    finally:
        s.close()
