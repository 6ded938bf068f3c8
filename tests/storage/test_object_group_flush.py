"""The group flush (``object_group_flush``) against SeaweedFS and a real metadata store (SQLite).

Many topics' flushes in one interval are ONE object PUT (counted by the process's blob-store
counter, ``compactmq_object_store_puts_total``) and read back through their range records by a
new process's view; a member whose ownership fence fails is refused while the others commit;
a seal merges a ledger's ranges into its own object and the shared object goes once no ledger
names it. Objects are listed with boto3, not through the code under test.
"""

from __future__ import annotations

import threading

import pytest

from compactmq.storage import ledger_file as lf
from compactmq.storage import object_group_flush, object_ledger_writer
from compactmq.storage.metadata_store import Check, create_metadata_store
from compactmq.storage.object_group_flush import GROUPS_PREFIX, GROUPS_ROOT, RANGES_ROOT, GroupFlush
from compactmq.storage.object_ledgers import ObjectLedgerSettings, ObjectLedgerStorage
from compactmq.storage.offload.blobstore import OBJECT_COUNTERS, BlobStore, OffloadLocation
from compactmq.storage.resources.fence import Fence, Fenced

from harness.wait import wait_until

BUCKET = "group-flush"
TOPICS = [f"persistent://public/default/group-{i}" for i in range(8)]


@pytest.fixture
def place(seaweedfs, tmp_path):
    loc = OffloadLocation(
        "s3", seaweedfs.create_bucket(BUCKET), "us-east-1", seaweedfs.endpoint, tmp_path.name
    )
    meta = create_metadata_store(f"sqlite:{tmp_path / 'meta.db'}", data_dir=tmp_path)
    yield seaweedfs, loc, meta
    meta.close()


def _storages(loc, meta, topics, interval_ms=300, fences=None):
    """A storage per topic, all over one client and one group flush (as in one broker)."""
    store = BlobStore(loc)
    group = GroupFlush(store, meta, interval_ms=interval_ms)
    settings = ObjectLedgerSettings(flush_interval_ms=interval_ms)
    fences = fences or {}
    out = []
    for t in topics:
        st = ObjectLedgerStorage(store, t, settings, epoch=3, group=group)
        if t in fences:
            st.fence = fences[t]
        out.append(st)
    return group, out


def _record(entry_id: int, data: bytes) -> bytes:
    return lf.encode_record_header(entry_id, 1000 + entry_id, data) + data


def _write_and_sync_all(storages, ledger_id: int) -> tuple[list, list[bytes], dict[int, BaseException]]:
    """Each storage creates ``ledger_id``, writes one record, and all sync at once (threads)."""
    writers = [st.create(ledger_id) for st in storages]
    datas = []
    for i, w in enumerate(writers):
        rec = _record(0, b"topic-%d" % i)
        w.write(rec, lf.FILE_HEADER_SIZE)
        datas.append(rec)
    errors: dict[int, BaseException] = {}

    def sync(i: int) -> None:
        try:
            writers[i].sync()
        except BaseException as e:
            errors[i] = e

    before = OBJECT_COUNTERS.snapshot()["puts"]
    threads = [threading.Thread(target=sync, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return writers, datas, errors | {-1: OBJECT_COUNTERS.snapshot()["puts"] - before}  # type: ignore[dict-item]


def test_flushes_of_many_topics_in_one_interval_are_one_object_put(place):
    server, loc, meta = place
    group, storages = _storages(loc, meta, TOPICS)
    writers, datas, errors = _write_and_sync_all(storages, 5)
    puts = errors.pop(-1)
    assert errors == {}
    assert puts == 1, f"{len(TOPICS)} topics' syncs made {puts} object writes"
    assert group.groups_written == 1
    shared = server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")
    assert len(shared) == 1
    # a new process's view (new client, new group over the same metadata store) reads every
    # topic's bytes through its range record
    _, fresh = _storages(loc, meta, TOPICS)
    for st, data in zip(fresh, datas):
        assert st.read_all(5)[lf.FILE_HEADER_SIZE :] == data
        assert st.read_range(5, lf.FILE_HEADER_SIZE + 2, lf.FILE_HEADER_SIZE + 9) == data[2:9]
    assert len(meta.get_children(f"{RANGES_ROOT}/{storages[0].topic_path}/000000000005")) == 1
    for w in writers:
        w.close()


def test_a_member_whose_fence_failed_is_refused_and_the_others_commit(place):
    server, loc, meta = place
    meta.put("/fence-a", b"")
    meta.put("/fence-b", b"")
    fence_a = Fence(checks=(Check("/fence-a", 0),), epoch=3, what="bundle a")
    fence_b = Fence(checks=(Check("/fence-b", 0),), epoch=3, what="bundle b")
    fences = {TOPICS[0]: fence_a, TOPICS[1]: fence_b, TOPICS[2]: fence_b}
    _, storages = _storages(loc, meta, TOPICS[:3], fences=fences)
    meta.put("/fence-a", b"taken")  # another broker took bundle a: version 1
    writers, datas, errors = _write_and_sync_all(storages, 6)
    errors.pop(-1)
    assert set(errors) == {0}
    assert "epoch 3 is over" in str(errors[0]) or isinstance(errors[0].__cause__, Fenced)
    _, fresh = _storages(loc, meta, TOPICS[:3])
    assert fresh[0].read_all(6) == lf.encode_file_header(6)  # the zombie's bytes: not visible
    for st, data in zip(fresh[1:], datas[1:]):
        assert st.read_all(6)[lf.FILE_HEADER_SIZE :] == data
    for w in writers[1:]:
        w.close()


def test_a_seal_merges_the_ranges_and_the_shared_object_goes_with_the_last(place):
    server, loc, meta = place
    group, storages = _storages(loc, meta, TOPICS[:2], interval_ms=100)
    writers, datas, errors = _write_and_sync_all(storages, 7)
    errors.pop(-1)
    assert errors == {}
    assert len(server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")) == 1
    for n, (st, w) in enumerate(zip(storages, writers)):
        w.close()
        buf = st.read_all(7)
        scan = lf.scan_records(buf, verify_crc=True)
        st.write_index(7, lf.encode_index(7, scan.offsets, scan.publish_times, scan.valid_end))
        assert st.wait_merged(timeout=30)
        assert meta.get_children(f"{RANGES_ROOT}/{st.topic_path}/000000000007") == []
        left = server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")
        assert len(left) == (1 if n == 0 else 0)  # the other ledger still names it, then none
        assert st.read_all(7) == buf
    _, fresh = _storages(loc, meta, TOPICS[:2])
    for st, data in zip(fresh, datas):
        assert st.read_all(7)[lf.FILE_HEADER_SIZE :] == data


def test_a_ledger_being_written_folds_its_ranges_so_few_records_stay(place, monkeypatch):
    server, loc, meta = place
    monkeypatch.setattr(object_ledger_writer, "FOLD_RANGES", 4)
    _, (st,) = _storages(loc, meta, TOPICS[:1], interval_ms=0)
    w = st.create(8)
    end, recs = lf.FILE_HEADER_SIZE, []
    for i in range(10):  # ten syncs, each its own group: folds after the 4th and the 8th
        rec = _record(i, b"entry-%d" % i)
        w.write(rec, end)
        end += len(rec)
        recs.append(rec)
        w.sync()
    # With a zero interval the background flusher races the syncs: a fold it made is released
    # (records dropped, then unnamed groups deleted) after the sync it overtook has returned.
    wait_until(
        lambda: len(meta.get_children(f"{RANGES_ROOT}/{st.topic_path}/000000000008")) == 2,
        what="only the range records of syncs 9 and 10 left (the others folded and dropped)",
    )
    own = [k.rsplit("/", 1)[1] for k in server.keys(BUCKET, f"{loc.prefix}/{st.prefix}/000000000008/")]
    assert len(own) == 3 and all(n.startswith("f-") for n in own)  # the header and two folds
    wait_until(
        lambda: len(server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")) == 2,
        what="the folded groups deleted, the two unfolded ones kept",
    )
    _, (fresh,) = _storages(loc, meta, TOPICS[:1])
    assert fresh.read_all(8) == lf.encode_file_header(8) + b"".join(recs)
    assert st.read_all(8) == fresh.read_all(8)
    lo = lf.FILE_HEADER_SIZE + sum(len(r) for r in recs[:3])
    assert fresh.read_range(8, lo, lo + len(recs[3]) + len(recs[4])) == recs[3] + recs[4]
    w.close()


def test_a_new_process_deletes_the_shared_object_once_its_merges_left_it_unnamed(place):
    """After a failover the new owner merges ledgers another process wrote: the reference
    count lives in the metadata store, so the shared object still goes with the last range."""
    server, loc, meta = place
    _, storages = _storages(loc, meta, TOPICS[:2], interval_ms=100)
    writers, datas, errors = _write_and_sync_all(storages, 9)
    errors.pop(-1)
    assert errors == {}
    assert meta.get_children(GROUPS_ROOT) != []
    _, fresh = _storages(loc, meta, TOPICS[:2])  # the writers' process is gone (never closed)
    for n, st in enumerate(fresh):
        buf = st.read_all(9)
        scan = lf.scan_records(buf, verify_crc=True)
        st.write_index(9, lf.encode_index(9, scan.offsets, scan.publish_times, scan.valid_end))
        assert st.wait_merged(timeout=30)
        assert len(server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")) == (1 if n == 0 else 0)
        assert st.read_all(9)[lf.FILE_HEADER_SIZE :] == datas[n]
    assert meta.get_children(GROUPS_ROOT) == []


def test_a_group_holds_at_most_max_group_members_the_rest_go_in_the_next(place, monkeypatch):
    """A group's commit must stay below the metadata store's size limit: more members than
    MAX_GROUP_MEMBERS wait for the next group (written at once), none is lost or refused."""
    server, loc, meta = place
    monkeypatch.setattr(object_group_flush, "MAX_GROUP_MEMBERS", 3)
    group, storages = _storages(loc, meta, TOPICS)
    writers, datas, errors = _write_and_sync_all(storages, 10)
    puts = errors.pop(-1)
    assert errors == {}
    assert puts == group.groups_written >= 3  # 8 members: 3 + 3 + 2 when all came at once
    sizes = [len(meta.get_children(f"{GROUPS_ROOT}/{g}")) for g in meta.get_children(GROUPS_ROOT)]
    assert sum(sizes) == len(TOPICS) and max(sizes) == 3
    _, fresh = _storages(loc, meta, TOPICS)
    for st, data in zip(fresh, datas):
        assert st.read_all(10)[lf.FILE_HEADER_SIZE :] == data
    for w in writers:
        w.close()
